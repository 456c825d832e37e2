//! The printer for `apiregistration.k8s.io` APIServices: where the API is served and whether
//! it is available, as kube-aggregator's table convertor shows them.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, col, name_cell, str_at, Column, AGE, NAME};

/// APIService.
pub(super) const API_SERVICE: &[Column] = &[
    NAME,
    col(
        "Service",
        "string",
        "The reference to the service that hosts this API endpoint.",
    ),
    col("Available", "string", "Whether this service is available."),
    AGE,
];

pub(super) fn api_service(a: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let service = match a.pointer("/spec/service").filter(|s| !s.is_null()) {
        Some(s) => format!("{}/{}", str_at(s, "namespace"), str_at(s, "name")),
        None => "Local".to_string(),
    };
    let available = arr_at(a, "status.conditions")
        .iter()
        .find(|c| str_at(c, "type") == "Available")
        .map_or("Unknown".to_string(), |c| {
            let (status, reason) = (str_at(c, "status"), str_at(c, "reason"));
            if status == "True" || reason.is_empty() {
                status.to_string()
            } else {
                format!("{status} ({reason})")
            }
        });
    vec![
        name_cell(a),
        Value::from(service),
        Value::from(available),
        age(a, now),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_and_service_backed_rows() {
        let now = Utc::now();
        let local = json!({"metadata": {"name": "v1.apps"}, "spec": {"group": "apps"},
            "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Local"}]}});
        let row = api_service(&local, now);
        assert_eq!(
            (row[1].as_str(), row[2].as_str()),
            (Some("Local"), Some("True"))
        );
        let down = json!({"metadata": {"name": "v1.x.io"},
            "spec": {"service": {"namespace": "ns", "name": "api"}},
            "status": {"conditions": [{"type": "Available", "status": "False", "reason": "MissingEndpoints"}]}});
        let row = api_service(&down, now);
        assert_eq!(
            (row[1].as_str(), row[2].as_str()),
            (Some("ns/api"), Some("False (MissingEndpoints)"))
        );
        let fresh = json!({"metadata": {"name": "v1.y.io"}, "spec": {}});
        assert_eq!(api_service(&fresh, now)[2], "Unknown");
    }
}
