//! Indexed Jobs: the completion index a pod carries, the pod the Job creates for an index,
//! and the compressed interval lists (`"1,3-5"`) that `status.completedIndexes`,
//! `status.failedIndexes` and `successPolicy.rules[].succeededIndexes` are written in.

use std::fmt;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec};

/// The annotation (and label) holding a pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The annotation counting the failures of the pod's index before it was created (set when
/// the Job has `backoffLimitPerIndex`).
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
/// The environment variable every container of an Indexed Job's pod gets its index in.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// The longest `generateName` prefix the API server keeps whole (63 less the 5 random
/// characters it appends).
const MAX_GENERATED_NAME_LENGTH: usize = 58;

/// A set of indexes kept as sorted, disjoint intervals `(first, last)`, both inclusive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Intervals(Vec<(i32, i32)>);

impl Intervals {
    /// The set of `indexes` (any order, duplicates allowed).
    pub fn from_indexes(indexes: impl IntoIterator<Item = i32>) -> Intervals {
        let mut all: Vec<i32> = indexes.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut out: Vec<(i32, i32)> = Vec::new();
        for i in all {
            match out.last_mut() {
                Some((_, last)) if *last + 1 == i => *last = i,
                _ => out.push((i, i)),
            }
        }
        Intervals(out)
    }

    /// Parses a list such as `"1,3-5"`, keeping only indexes below `completions`. Malformed
    /// parts are skipped, as upstream's controller skips them (validation refuses them in a
    /// spec; a status written by someone else is read as far as it makes sense).
    pub fn parse(s: &str, completions: i32) -> Intervals {
        let mut indexes = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (a.parse::<i32>(), b.parse::<i32>()),
                None => (part.parse::<i32>(), part.parse::<i32>()),
            };
            let (Ok(first), Ok(last)) = (first, last) else {
                continue;
            };
            if first < 0 || last < first {
                continue;
            }
            indexes.extend(first..=last.min(completions - 1));
        }
        Intervals::from_indexes(indexes)
    }

    /// How many indexes the set holds.
    pub fn total(&self) -> i32 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }

    /// Whether `i` is in the set.
    pub fn contains(&self, i: i32) -> bool {
        self.0.iter().any(|&(a, b)| a <= i && i <= b)
    }

    /// How many indexes of `self` are also in `other`.
    pub fn overlap(&self, other: &Intervals) -> i32 {
        let mut n = 0;
        for &(a, b) in &self.0 {
            for &(c, d) in &other.0 {
                n += (b.min(d) - a.max(c) + 1).max(0);
            }
        }
        n
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The indexes in either set.
    pub fn union(&self, other: &Intervals) -> Intervals {
        let mut all: Vec<(i32, i32)> = self.0.iter().chain(&other.0).copied().collect();
        all.sort_unstable();
        let mut out: Vec<(i32, i32)> = Vec::new();
        for (first, last) in all {
            match out.last_mut() {
                Some((_, end)) if first <= end.saturating_add(1) => *end = (*end).max(last),
                _ => out.push((first, last)),
            }
        }
        Intervals(out)
    }
}

/// Written as upstream writes it: an interval of two indexes is `"1,2"`, of more `"3-5"`.
impl fmt::Display for Intervals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, &(first, last)) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{first}")?;
            if last == first + 1 {
                write!(f, ",{last}")?;
            } else if last > first {
                write!(f, "-{last}")?;
            }
        }
        Ok(())
    }
}

/// The completion index of a pod of an Indexed Job: its annotation, else its label; `None`
/// when neither holds a non-negative number.
pub fn completion_index(pod: &Pod) -> Option<i32> {
    let from = |m: Option<&std::collections::BTreeMap<String, String>>| {
        m.and_then(|m| m.get(COMPLETION_INDEX))
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|i| *i >= 0)
    };
    from(pod.metadata.annotations.as_ref()).or_else(|| from(pod.metadata.labels.as_ref()))
}

/// The failures of the pod's index before it was created (its
/// [`INDEX_FAILURE_COUNT`] annotation), 0 when it has none.
pub fn failure_count(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(INDEX_FAILURE_COUNT))
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0)
        .max(0)
}

/// The `generateName` of a pod for `index`: `<job>-<index>-`, the job name cut so the prefix
/// stays whole.
pub fn generate_name(job: &str, index: i32) -> String {
    let suffix = format!("-{index}-");
    let keep = MAX_GENERATED_NAME_LENGTH.saturating_sub(suffix.len());
    let cut = job
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(job.len()))
        .take_while(|&i| i <= keep)
        .last()
        .unwrap_or(0);
    format!("{}{suffix}", &job[..cut])
}

/// Turns a pod made from the Job's template into the pod for `index`: the index in the
/// annotation and label, `JOB_COMPLETION_INDEX` in every container (a reference to the
/// annotation, unless the container sets it itself), `hostname` `<job>-<index>` (the
/// template's `subdomain` is kept), the `<job>-<index>-` name prefix and, with
/// `backoffLimitPerIndex`, the index's failure count so far.
pub fn for_index(pod: &mut Pod, job: &str, index: i32, failures: Option<i32>) {
    let value = index.to_string();
    let meta = &mut pod.metadata;
    meta.generate_name = Some(generate_name(job, index));
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(COMPLETION_INDEX.into(), value.clone());
    if let Some(n) = failures {
        meta.annotations
            .get_or_insert_with(Default::default)
            .insert(INDEX_FAILURE_COUNT.into(), n.to_string());
    }
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(COMPLETION_INDEX.into(), value);
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.hostname = Some(format!("{job}-{index}"));
    let env = EnvVar {
        name: COMPLETION_INDEX_ENV.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
            }),
            ..Default::default()
        }),
    };
    let init = spec.init_containers.iter_mut().flatten();
    for c in init.chain(spec.containers.iter_mut()) {
        let vars = c.env.get_or_insert_with(Vec::new);
        if !vars.iter().any(|v| v.name == COMPLETION_INDEX_ENV) {
            vars.push(env.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Container;

    #[test]
    fn intervals_are_written_as_upstream_writes_them() {
        let s = Intervals::from_indexes([5, 1, 3, 4, 1, 7, 8]);
        assert_eq!(s.to_string(), "1,3-5,7,8");
        assert_eq!(s.total(), 6);
        assert!(s.contains(4) && !s.contains(2) && !s.contains(6));
        assert_eq!(Intervals::default().to_string(), "");
        assert_eq!(Intervals::parse("1,3-5,7,8", 10), s);
        // Indexes at or past completions, and malformed parts, are left out.
        assert_eq!(
            Intervals::parse("0-2,x,5-3,8-20", 10).to_string(),
            "0-2,8,9"
        );
        let rule = Intervals::parse("0-4", 10);
        assert_eq!(rule.overlap(&s), 3);
        assert_eq!(rule.union(&s).to_string(), "0-5,7,8");
        assert_eq!(s.union(&Intervals::default()), s);
    }

    #[test]
    fn a_pod_gets_its_index_everywhere_upstream_puts_it() {
        let mut pod = Pod {
            spec: Some(PodSpec {
                subdomain: Some("svc".into()),
                containers: vec![
                    Container {
                        name: "a".into(),
                        ..Default::default()
                    },
                    Container {
                        name: "b".into(),
                        env: Some(vec![EnvVar {
                            name: COMPLETION_INDEX_ENV.into(),
                            value: Some("mine".into()),
                            value_from: None,
                        }]),
                        ..Default::default()
                    },
                ],
                init_containers: Some(vec![Container {
                    name: "i".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        for_index(&mut pod, "sim", 3, Some(2));
        assert_eq!(completion_index(&pod), Some(3));
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("sim-3-"));
        assert_eq!(pod.metadata.labels.as_ref().unwrap()[COMPLETION_INDEX], "3");
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[INDEX_FAILURE_COUNT],
            "2"
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("sim-3"));
        assert_eq!(spec.subdomain.as_deref(), Some("svc"));
        let env_of = |c: &Container| c.env.clone().unwrap();
        let a = env_of(&spec.containers[0]);
        assert_eq!(
            a[0].value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
        assert_eq!(env_of(&spec.containers[1]).len(), 1, "its own value stays");
        assert_eq!(env_of(&spec.init_containers.unwrap()[0]).len(), 1);
    }

    #[test]
    fn long_job_names_are_cut_to_keep_the_index() {
        let long = "j".repeat(70);
        let name = generate_name(&long, 12);
        assert_eq!(name.len(), MAX_GENERATED_NAME_LENGTH);
        assert!(name.ends_with("-12-"));
    }
}
