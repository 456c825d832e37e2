//! The order discovery lists groups and versions in, as kube-aggregator orders its
//! APIServices: groups by `groupPriorityMinimum` (highest first), versions inside a group by
//! `versionPriority` (highest first) and then by kube-aware version order, so that a group's
//! first version is its preferred one.
//!
//! The two documents break ties differently upstream, and so do they here: the legacy
//! `APIGroupList` (`/apis`) sorts the APIServices themselves by priority and then by their
//! name (`v1.bar` before `v1.foo`) and lists each group where its first APIService falls;
//! aggregated discovery (`apidiscovery.k8s.io/v2`) gives a group the highest priority of its
//! versions and breaks ties by the group's name.

use std::cmp::Ordering;

/// A served group/version with the priorities of its APIService.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ranked {
    pub group: String,
    pub version: String,
    /// `spec.groupPriorityMinimum`.
    pub group_priority: i64,
    /// `spec.versionPriority`.
    pub version_priority: i64,
}

impl Ranked {
    /// The APIService's name, `<version>.<group>`.
    fn name(&self) -> String {
        format!("{}.{}", self.version, self.group)
    }
}

/// A version's stability in a kube-like version string; later is more stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stability {
    Alpha,
    Beta,
    Ga,
}

/// `v<major>[(alpha|beta)<minor>]` as (stability, major, minor); `None` for other strings.
fn parse_kube_version(v: &str) -> Option<(Stability, u64, u64)> {
    let rest = v.strip_prefix('v')?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let major: u64 = rest[..digits].parse().ok()?;
    let rest = &rest[digits..];
    if rest.is_empty() {
        return Some((Stability::Ga, major, 0));
    }
    let (stability, minor) = if let Some(m) = rest.strip_prefix("alpha") {
        (Stability::Alpha, m)
    } else if let Some(m) = rest.strip_prefix("beta") {
        (Stability::Beta, m)
    } else {
        return None;
    };
    if minor.is_empty() || !minor.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stability, major, minor.parse().ok()?))
}

/// Upstream's `CompareKubeAwareVersionStrings`: `Greater` when `a` sorts before `b` (is the
/// more preferred). Kube-like versions come before others; among them GA before beta before
/// alpha, then the higher major, then the higher minor (`v2, v1, v1beta2, v1beta1, v1alpha1`);
/// other strings in alphabetical order after them (`foo1, foo10`).
pub(crate) fn compare_kube_aware(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    match (parse_kube_version(a), parse_kube_version(b)) {
        (None, None) => b.cmp(a),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => x.cmp(&y),
    }
}

/// Versions of one group, most preferred first.
fn sort_versions(versions: &mut [Ranked]) {
    versions.sort_by(|a, b| {
        b.version_priority
            .cmp(&a.version_priority)
            .then_with(|| compare_kube_aware(&b.version, &a.version))
    });
}

/// The groups and their versions in the order of the legacy `/apis` (`APIGroupList`) and
/// `/apis/<group>` documents (upstream's `SortedByGroupAndVersion`).
pub(crate) fn group_list(mut served: Vec<Ranked>) -> Vec<(String, Vec<String>)> {
    served.sort_by(|a, b| {
        b.group_priority
            .cmp(&a.group_priority)
            .then_with(|| a.name().cmp(&b.name()))
    });
    bucket(served)
}

/// The groups and their versions in the order of aggregated discovery
/// (`apidiscovery.k8s.io/v2`).
pub(crate) fn aggregated(served: Vec<Ranked>) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<(i64, Vec<Ranked>)> = vec![];
    for r in served {
        match groups.iter_mut().find(|(_, vs)| vs[0].group == r.group) {
            Some((priority, vs)) => {
                *priority = (*priority).max(r.group_priority);
                vs.push(r);
            }
            None => groups.push((r.group_priority, vec![r])),
        }
    }
    groups.sort_by(|(pa, a), (pb, b)| pb.cmp(pa).then_with(|| a[0].group.cmp(&b[0].group)));
    bucket(groups.into_iter().flat_map(|(_, vs)| vs).collect())
}

/// Groups in the order their first entry comes, each group's versions sorted.
fn bucket(ordered: Vec<Ranked>) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<Vec<Ranked>> = vec![];
    for r in ordered {
        match groups.iter_mut().find(|vs| vs[0].group == r.group) {
            Some(vs) => vs.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups
        .into_iter()
        .map(|mut vs| {
            sort_versions(&mut vs);
            let group = vs[0].group.clone();
            (group, vs.into_iter().map(|r| r.version).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(group: &str, version: &str, group_priority: i64, version_priority: i64) -> Ranked {
        Ranked {
            group: group.into(),
            version: version.into(),
            group_priority,
            version_priority,
        }
    }

    #[test]
    fn kube_aware_order_is_upstreams_example() {
        // The example of the APIService API's documentation, most preferred first.
        let expected = [
            "v10",
            "v2",
            "v1",
            "v11beta2",
            "v10beta3",
            "v3beta1",
            "v12alpha1",
            "v11alpha2",
            "foo1",
            "foo10",
        ];
        let mut versions = expected.to_vec();
        versions.reverse();
        versions.sort_by(|a, b| compare_kube_aware(b, a));
        assert_eq!(versions, expected);
        for odd in ["v", "v1gamma1", "v1beta", "V1", "v1beta1x", "vbeta1", "v-1"] {
            assert_eq!(parse_kube_version(odd), None, "{odd}");
        }
        assert_eq!(compare_kube_aware("v1", "v1"), Ordering::Equal);
    }

    #[test]
    fn versions_go_by_priority_then_kube_aware_order() {
        let served = vec![
            ranked("example.com", "v1", 1000, 100),
            ranked("example.com", "v2beta1", 1000, 100),
            ranked("example.com", "v2", 1000, 100),
            ranked("example.com", "v1alpha1", 1000, 200),
        ];
        let expected = vec![(
            "example.com".to_string(),
            vec![
                "v1alpha1".to_string(),
                "v2".into(),
                "v1".into(),
                "v2beta1".into(),
            ],
        )];
        assert_eq!(group_list(served.clone()), expected);
        assert_eq!(aggregated(served), expected);
    }

    #[test]
    fn groups_go_by_priority_then_name() {
        let served = vec![
            ranked("zeta.io", "v1", 100, 1),
            ranked("apps", "v1", 17800, 15),
            ranked("batch", "v1", 17400, 15),
            ranked("alpha.io", "v1", 100, 1),
            ranked("wardle.example.com", "v1alpha1", 1000, 15),
        ];
        let names = |order: Vec<(String, Vec<String>)>| -> Vec<String> {
            order.into_iter().map(|(g, _)| g).collect()
        };
        let expected = ["apps", "batch", "wardle.example.com", "alpha.io", "zeta.io"];
        assert_eq!(names(group_list(served.clone())), expected);
        assert_eq!(names(aggregated(served)), expected);
    }

    #[test]
    fn a_group_ranks_by_its_highest_priority_and_ties_differ_by_document() {
        // b.com's v1 outranks a.com; a.com and c.com tie at 1000.
        let served = vec![
            ranked("a.com", "v2", 1000, 1),
            ranked("b.com", "v1beta1", 10, 1),
            ranked("b.com", "v1", 5000, 1),
            ranked("c.com", "v1", 1000, 1),
        ];
        let names = |order: Vec<(String, Vec<String>)>| -> Vec<String> {
            order.into_iter().map(|(g, _)| g).collect()
        };
        // The legacy list sorts APIService names: `v1.c.com` before `v2.a.com`.
        assert_eq!(
            names(group_list(served.clone())),
            ["b.com", "c.com", "a.com"]
        );
        // Aggregated discovery sorts group names.
        assert_eq!(
            names(aggregated(served.clone())),
            ["b.com", "a.com", "c.com"]
        );
        assert_eq!(group_list(served)[0].1, ["v1", "v1beta1"]);
    }
}
