//! Resource quantities (`100m`, `1.5Gi`, `2e3`): their value and Kubernetes' format error.

use serde_json::Value;
use setpoint_api::quantity::Quantity;

/// The value of a resource quantity (`100m`, `1.5Gi`, `2e3`, or a JSON number), or `None` when
/// it does not match Kubernetes' quantity grammar. Exact, and compared by value
/// ([`setpoint_api::quantity`], the parser every component shares).
pub fn parse_quantity(v: &Value) -> Option<Quantity> {
    match v {
        Value::Number(n) => Quantity::parse(&n.to_string()).ok(),
        Value::String(s) => Quantity::parse(s).ok(),
        _ => None,
    }
}

pub(super) fn quantity_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) const QUANTITY_FORMAT_ERROR: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
