//! Which autoscalers control a pod: upstream keeps every autoscaler's last-read target
//! selector and refuses to scale (`ScalingActive` False, `AmbiguousSelector`) when the pods
//! under one autoscaler's selector are also selected by another's, since two autoscalers
//! sizing the same pods would fight. Pure: the controller feeds it selectors and pods.

use std::collections::{BTreeSet, HashMap};

use setpoint_api::selector::LabelSelector;

/// The `ScalingActive` reason (and Event reason) when several autoscalers select the pods.
pub const AMBIGUOUS_SELECTOR: &str = "AmbiguousSelector";

/// Every autoscaler's selector as last read from its target's `scale`, by `namespace/name`.
#[derive(Debug, Default)]
pub struct SelectorIndex {
    by_hpa: HashMap<String, (String, LabelSelector)>,
}

impl SelectorIndex {
    /// Records (or replaces) the selector of the autoscaler `namespace/name`.
    pub fn put(&mut self, namespace: &str, name: &str, selector: LabelSelector) {
        self.by_hpa.insert(
            format!("{namespace}/{name}"),
            (namespace.to_string(), selector),
        );
    }

    /// Forgets a deleted autoscaler (`namespace/name`).
    pub fn remove(&mut self, key: &str) {
        self.by_hpa.remove(key);
    }

    /// The autoscalers (`namespace/name`, sorted) whose selector picks at least one of the
    /// pods of `namespace` given by their labels, as upstream's
    /// `hpasControllingPodsUnderSelector`. An autoscaler only selects pods of its namespace.
    pub fn controlling<'a, L>(
        &self,
        namespace: &str,
        pods: impl IntoIterator<Item = L>,
    ) -> Vec<String>
    where
        L: Fn(&str) -> Option<&'a str>,
    {
        let mut found = BTreeSet::new();
        let candidates: Vec<(&String, &LabelSelector)> = self
            .by_hpa
            .iter()
            .filter(|(_, (ns, _))| ns == namespace)
            .map(|(k, (_, s))| (k, s))
            .collect();
        for labels in pods {
            for (key, selector) in &candidates {
                if !found.contains(*key) && selector.matches(&labels) {
                    found.insert((*key).clone());
                }
            }
            if found.len() == candidates.len() {
                break;
            }
        }
        found.into_iter().collect()
    }
}

/// Upstream's message when the pods of `selector` are controlled by several autoscalers:
/// Go prints the list of keys as `[ns/a ns/b]`.
pub fn ambiguous_message(selector: &str, hpas: &[String]) -> String {
    format!(
        "pods by selector {selector} are controlled by multiple HPAs: [{}]",
        hpas.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn controlling(
        index: &SelectorIndex,
        ns: &str,
        pods: &[BTreeMap<String, String>],
    ) -> Vec<String> {
        index.controlling(
            ns,
            pods.iter()
                .map(|l| move |k: &str| l.get(k).map(String::as_str)),
        )
    }

    #[test]
    fn one_autoscaler_per_pod_is_not_ambiguous() {
        let mut index = SelectorIndex::default();
        index.put("default", "web", sel("app=web"));
        index.put("default", "api", sel("app=api"));
        let pods = [labels(&[("app", "web")]), labels(&[("app", "web")])];
        assert_eq!(controlling(&index, "default", &pods), vec!["default/web"]);
    }

    #[test]
    fn overlapping_selectors_name_every_autoscaler_sorted() {
        // A canary's pods carry the stable Deployment's label too: the stable autoscaler's
        // broader selector picks them as well.
        let mut index = SelectorIndex::default();
        index.put("prod", "web", sel("app=web"));
        index.put("prod", "web-canary", sel("app=web,track=canary"));
        let pods = [labels(&[("app", "web"), ("track", "canary")])];
        let hpas = controlling(&index, "prod", &pods);
        assert_eq!(hpas, vec!["prod/web", "prod/web-canary"]);
        assert_eq!(
            ambiguous_message("app=web,track=canary", &hpas),
            "pods by selector app=web,track=canary are controlled by multiple HPAs: \
             [prod/web prod/web-canary]"
        );
        // The stable autoscaler's own pods without the canary label are its alone... but
        // its selector's pod list holds the canary pods too, so it is ambiguous as well.
        let stable = [
            labels(&[("app", "web")]),
            labels(&[("app", "web"), ("track", "canary")]),
        ];
        assert_eq!(controlling(&index, "prod", &stable).len(), 2);
        assert_eq!(
            controlling(&index, "prod", &[labels(&[("app", "web")])]),
            vec!["prod/web"]
        );
    }

    #[test]
    fn other_namespaces_and_removed_autoscalers_do_not_count() {
        let mut index = SelectorIndex::default();
        index.put("a", "web", sel("app=web"));
        index.put("b", "web", sel("app=web"));
        index.put("a", "web2", sel("app=web"));
        let pods = [labels(&[("app", "web")])];
        assert_eq!(controlling(&index, "a", &pods), vec!["a/web", "a/web2"]);
        index.remove("a/web2");
        assert_eq!(controlling(&index, "a", &pods), vec!["a/web"]);
        // A new selector replaces the old one.
        index.put("a", "web", sel("app=other"));
        assert!(controlling(&index, "a", &pods).is_empty());
    }
}
