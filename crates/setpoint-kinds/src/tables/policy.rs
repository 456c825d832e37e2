//! `policy/v1`: PodDisruptionBudgets, as upstream's `printPodDisruptionBudget` prints them.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, at, col, int_at, name_cell, scalar_string, Column, AGE, NAME};

pub(super) const POD_DISRUPTION_BUDGET: &[Column] = &[
    NAME,
    col(
        "Min Available",
        "string",
        "The minimum number or percentage of pods that must remain available.",
    ),
    col(
        "Max Unavailable",
        "string",
        "The maximum number or percentage of pods that can be unavailable.",
    ),
    col(
        "Allowed Disruptions",
        "integer",
        "Calculated number of pods that can be disrupted at this time.",
    ),
    AGE,
];

/// An int-or-string as Go's `IntOrString.String()` prints it, `N/A` when unset.
fn int_or_percent(pdb: &Value, field: &str) -> Value {
    match at(pdb, field) {
        None | Some(Value::Null) => Value::from("N/A"),
        Some(v) => Value::from(scalar_string(v)),
    }
}

pub(super) fn pdb(pdb: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(pdb),
        int_or_percent(pdb, "spec.minAvailable"),
        int_or_percent(pdb, "spec.maxUnavailable"),
        Value::from(int_at(pdb, "status.disruptionsAllowed")),
        age(pdb, now),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::tables::{cells, columns};

    #[test]
    fn columns_and_cells_as_upstream() {
        let names: Vec<_> = columns("policy", "PodDisruptionBudget")
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Min Available",
                "Max Unavailable",
                "Allowed Disruptions",
                "Age"
            ]
        );
        let now = chrono::Utc::now();
        let pdb = json!({"metadata": {"name": "web", "creationTimestamp": (now - chrono::Duration::minutes(5)).to_rfc3339()},
            "spec": {"minAvailable": 2}, "status": {"disruptionsAllowed": 1}});
        assert_eq!(
            cells("policy", "PodDisruptionBudget", &pdb, now),
            vec![
                json!("web"),
                json!("2"),
                json!("N/A"),
                json!(1),
                json!("5m")
            ]
        );
        let pct = json!({"metadata": {"name": "db"}, "spec": {"maxUnavailable": "25%"}});
        assert_eq!(
            cells("policy", "PodDisruptionBudget", &pct, now)[1..4],
            [json!("N/A"), json!("25%"), json!(0)]
        );
    }
}
