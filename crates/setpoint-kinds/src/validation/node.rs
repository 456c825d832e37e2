//! Nodes: their pod ranges (`spec.podCIDRs`) are valid CIDRs, at most one per IP family,
//! and once set they never change (the node IPAM controller sets them once).

use serde_json::Value;
use setpoint_api::cidr::Cidr;
use setpoint_api::Cause;

use super::fields::{arr, at, index};

const NOT_CHANGED: &str = "node updates may not change podCIDR except from \"\" to valid";

pub(super) fn node(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let cidrs = arr(at(obj, "spec"), "podCIDRs");
    let mut families = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        match c.as_str().unwrap_or("").parse::<Cidr>() {
            Ok(cidr) => families.push(cidr.is_ipv4()),
            Err(_) => e.push(Cause::invalid(
                index("spec.podCIDRs", i),
                c,
                "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
            )),
        }
    }
    let dual = families.len() == 2 && families[0] != families[1];
    if cidrs.len() > 2 || (cidrs.len() == 2 && families.len() == 2 && !dual) {
        e.push(Cause::invalid(
            "spec.podCIDRs",
            &Value::Array(cidrs.to_vec()),
            "may specify no more than one CIDR for each IP family",
        ));
    }
    // The node IPAM controller may give a node ranges it has none of; nobody may change
    // them afterwards.
    if let Some(old) = old {
        let before = arr(at(old, "spec"), "podCIDRs");
        if !before.is_empty() && before != cidrs {
            e.push(Cause::forbidden("spec.podCIDRs", NOT_CHANGED));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(obj: Value, old: Option<Value>) -> Vec<String> {
        let mut e = Vec::new();
        node(&mut e, &obj, old.as_ref());
        e.into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    fn with(cidrs: &[&str]) -> Value {
        json!({"spec": {"podCIDR": cidrs.first(), "podCIDRs": cidrs}})
    }

    #[test]
    fn ranges_are_valid_cidrs_one_per_family() {
        assert!(errors(with(&["10.244.1.0/24"]), None).is_empty());
        assert!(errors(with(&["10.244.1.0/24", "fd00::/64"]), None).is_empty());
        assert!(errors(json!({"spec": {}}), None).is_empty());
        let bad = errors(with(&["10.244.1.0/33"]), None);
        assert_eq!(bad.len(), 1);
        assert!(
            bad[0].starts_with("spec.podCIDRs[0]: Invalid value"),
            "{bad:?}"
        );
        let two = errors(with(&["10.244.1.0/24", "10.244.2.0/24"]), None);
        assert_eq!(two.len(), 1);
        assert!(two[0].ends_with("may specify no more than one CIDR for each IP family"));
    }

    #[test]
    fn ranges_are_set_once() {
        assert!(errors(with(&["10.244.1.0/24"]), Some(with(&[]))).is_empty());
        assert!(errors(with(&["10.244.1.0/24"]), Some(json!({}))).is_empty());
        assert!(errors(with(&["10.244.1.0/24"]), Some(with(&["10.244.1.0/24"]))).is_empty());
        let changed = errors(with(&["10.244.2.0/24"]), Some(with(&["10.244.1.0/24"])));
        assert_eq!(
            changed,
            ["spec.podCIDRs: Forbidden: node updates may not change podCIDR except from \"\" to valid"]
        );
        let dropped = errors(with(&[]), Some(with(&["10.244.1.0/24"])));
        assert_eq!(dropped.len(), 1);
    }
}
