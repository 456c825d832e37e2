//! A pod's quality-of-service class (`status.qosClass`): one rule for the API server, which
//! sets it when a pod is created, and the node agent, which reports it.
//!
//! Kubernetes' rule: only CPU and memory count, and only quantities above zero. A pod whose
//! containers (init containers included) request and limit neither is `BestEffort`. It is
//! `Guaranteed` when every container limits both CPU and memory and the pod's total requests
//! equal its total limits, resource by resource; otherwise it is `Burstable`. A request left
//! out defaults to its limit (API defaulting does this for stored pods), so limits alone make
//! a pod `Guaranteed`.

use std::collections::BTreeMap;

use crate::quantity::Quantity;

/// The resources the class is computed from.
const COMPUTE: [&str; 2] = ["cpu", "memory"];

/// One container's `resources`, as (resource name, quantity text) pairs.
#[derive(Clone, Debug, Default)]
pub struct Resources<'a> {
    /// `resources.requests`.
    pub requests: Vec<(&'a str, &'a str)>,
    /// `resources.limits`.
    pub limits: Vec<(&'a str, &'a str)>,
}

/// The QoS class of a pod whose containers and init containers have `containers`' resources:
/// `"Guaranteed"`, `"Burstable"` or `"BestEffort"`.
pub fn class<'a>(containers: impl IntoIterator<Item = Resources<'a>>) -> &'static str {
    let mut requests: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut limits: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut guaranteed = true;
    let positive = |pairs: &[(&'a str, &'a str)]| -> Vec<(&'a str, Quantity)> {
        pairs
            .iter()
            .filter(|(name, _)| COMPUTE.contains(name))
            .filter_map(|(name, q)| Some((*name, Quantity::parse(q).ok()?)))
            .filter(|(_, q)| q.is_positive())
            .collect()
    };
    let add = |total: &mut BTreeMap<&'a str, Quantity>, name: &'a str, q: Quantity| {
        let sum = match total.get(name) {
            Some(t) => (*t + q).unwrap_or(q),
            None => q,
        };
        total.insert(name, sum);
    };
    for c in containers {
        let lims = positive(&c.limits);
        let mut reqs = positive(&c.requests);
        // A request left out is its limit (API defaulting).
        for (name, q) in &lims {
            if !c.requests.iter().any(|(n, _)| n == name) {
                reqs.push((name, *q));
            }
        }
        for (name, q) in reqs {
            add(&mut requests, name, q);
        }
        if !COMPUTE.iter().all(|r| lims.iter().any(|(n, _)| n == r)) {
            guaranteed = false;
        }
        for (name, q) in lims {
            add(&mut limits, name, q);
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests.iter().all(|(n, r)| limits.get(n) == Some(r))
    {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The QoS class of a pod given as JSON: its containers' and init containers'
/// `resources.requests` and `resources.limits`, by [`class`].
pub fn of_pod(pod: &serde_json::Value) -> &'static str {
    fn pairs<'a>(c: &'a serde_json::Value, field: &str) -> Vec<(&'a str, &'a str)> {
        c.pointer(&format!("/resources/{field}"))
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
            .collect()
    }
    let containers = ["containers", "initContainers"]
        .iter()
        .filter_map(|f| {
            pod.pointer(&format!("/spec/{f}"))
                .and_then(serde_json::Value::as_array)
        })
        .flatten()
        .map(|c| Resources {
            requests: pairs(c, "requests"),
            limits: pairs(c, "limits"),
        });
    class(containers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c<'a>(requests: &[(&'a str, &'a str)], limits: &[(&'a str, &'a str)]) -> Resources<'a> {
        Resources {
            requests: requests.to_vec(),
            limits: limits.to_vec(),
        }
    }

    #[test]
    fn upstream_answers() {
        // Nothing, or only resources that do not count, or only zeros: BestEffort.
        assert_eq!(class([c(&[], &[])]), "BestEffort");
        assert_eq!(class(Vec::<Resources>::new()), "BestEffort");
        assert_eq!(
            class([c(&[("ephemeral-storage", "1Gi")], &[])]),
            "BestEffort"
        );
        assert_eq!(
            class([c(
                &[("ephemeral-storage", "1Gi")],
                &[("ephemeral-storage", "2Gi")]
            )]),
            "BestEffort"
        );
        assert_eq!(class([c(&[("cpu", "0")], &[])]), "BestEffort");
        // Limits without requests: the requests default to them.
        assert_eq!(
            class([c(&[], &[("cpu", "1"), ("memory", "1Gi")])]),
            "Guaranteed"
        );
        // Equal by value, not by text.
        assert_eq!(
            class([c(
                &[("cpu", "1000m"), ("memory", "1024Mi")],
                &[("cpu", "1"), ("memory", "1Gi")]
            )]),
            "Guaranteed"
        );
        // Extra resources do not stop a pod from being Guaranteed.
        assert_eq!(
            class([c(
                &[
                    ("cpu", "1"),
                    ("memory", "1Gi"),
                    ("ephemeral-storage", "1Gi")
                ],
                &[("cpu", "1"), ("memory", "1Gi")]
            )]),
            "Guaranteed"
        );
        // Only one of the two limited, requests below limits, or a request alone: Burstable.
        assert_eq!(class([c(&[], &[("cpu", "1")])]), "Burstable");
        assert_eq!(
            class([c(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")]
            )]),
            "Burstable"
        );
        assert_eq!(class([c(&[("memory", "1Gi")], &[])]), "Burstable");
        // Every container must limit both: one BestEffort container makes the pod Burstable.
        assert_eq!(
            class([c(&[], &[("cpu", "1"), ("memory", "1Gi")]), c(&[], &[])]),
            "Burstable"
        );
        // Init containers count.
        assert_eq!(
            class([
                c(&[], &[("cpu", "1"), ("memory", "1Gi")]),
                c(&[], &[("cpu", "1")])
            ]),
            "Burstable"
        );
    }
}
