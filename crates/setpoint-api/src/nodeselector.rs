//! Node selectors against a node: upstream's `NodeSelector` rule (terms ORed, a term's
//! expressions and fields ANDed), which required node affinity, a PersistentVolume's node
//! affinity and the scheduler's preferred terms all use. One definition for the scheduler
//! and the volume binder.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// One requirement against a value (`None`: the label is absent). `Gt` and `Lt` need exactly
/// one integer bound and an integer value; anything else is an invalid selector, which
/// matches nothing (as upstream's conversion to a label selector fails).
pub fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or(&[]);
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else {
                return false;
            };
            match (bound.parse::<i64>(), value.map(str::parse::<i64>)) {
                (Ok(b), Some(Ok(v))) => {
                    if op == "Gt" {
                        v > b
                    } else {
                        v < b
                    }
                }
                _ => false,
            }
        }
        _ => false,
    }
}

/// One term: its expressions (on labels) and fields (only `metadata.name`, with `In` or
/// `NotIn`) all match. An empty term matches nothing.
pub fn term_matches(
    term: &NodeSelectorTerm,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            r.key == "metadata.name"
                && matches!(r.operator.as_str(), "In" | "NotIn")
                && requirement_matches(r, Some(name))
        })
}

/// Whether a node selector (its terms ORed) matches the node `name` with `labels`.
pub fn node_selector_matches(
    selector: &NodeSelector,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, name, labels))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn operators() {
        assert!(requirement_matches(&req("k", "In", &["a", "b"]), Some("b")));
        assert!(!requirement_matches(&req("k", "In", &["a"]), None));
        assert!(requirement_matches(&req("k", "NotIn", &["a"]), None));
        assert!(!requirement_matches(&req("k", "NotIn", &["a"]), Some("a")));
        assert!(requirement_matches(&req("k", "Exists", &[]), Some("")));
        assert!(requirement_matches(&req("k", "DoesNotExist", &[]), None));
        assert!(requirement_matches(&req("k", "Gt", &["3"]), Some("4")));
        assert!(!requirement_matches(&req("k", "Gt", &["3"]), Some("3")));
        assert!(requirement_matches(&req("k", "Lt", &["3"]), Some("-1")));
        // Invalid bounds and values match nothing.
        assert!(!requirement_matches(
            &req("k", "Gt", &["3", "4"]),
            Some("9")
        ));
        assert!(!requirement_matches(&req("k", "Gt", &["x"]), Some("9")));
        assert!(!requirement_matches(&req("k", "Lt", &["3"]), Some("two")));
        assert!(!requirement_matches(&req("k", "Near", &["a"]), Some("a")));
    }

    #[test]
    fn terms_are_ored_and_their_requirements_anded() {
        let node = labels(&[("zone", "a"), ("disk", "ssd")]);
        let term = |exprs: Vec<NodeSelectorRequirement>, fields: Vec<NodeSelectorRequirement>| {
            NodeSelectorTerm {
                match_expressions: Some(exprs),
                match_fields: Some(fields),
            }
        };
        let both = term(
            vec![req("zone", "In", &["a"]), req("disk", "In", &["ssd"])],
            vec![],
        );
        assert!(term_matches(&both, "n1", &node));
        let one_wrong = term(
            vec![req("zone", "In", &["a"]), req("disk", "In", &["hdd"])],
            vec![],
        );
        assert!(!term_matches(&one_wrong, "n1", &node));
        assert!(!term_matches(&term(vec![], vec![]), "n1", &node));
        let by_name = term(vec![], vec![req("metadata.name", "In", &["n1"])]);
        assert!(term_matches(&by_name, "n1", &node));
        assert!(!term_matches(&by_name, "n2", &node));
        // Fields allow only metadata.name with In or NotIn.
        let exists = term(vec![], vec![req("metadata.name", "Exists", &[])]);
        assert!(!term_matches(&exists, "n1", &node));
        let selector = NodeSelector {
            node_selector_terms: vec![one_wrong, by_name],
        };
        assert!(node_selector_matches(&selector, "n1", &node));
        assert!(!node_selector_matches(&selector, "n2", &node));
    }
}
