//! The printer for `discovery.k8s.io/v1` EndpointSlices.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{age, arr_at, col, name_cell, str_at, Column, AGE, NAME};

/// How many ports or addresses a cell lists before it says how many more there are.
const MAX_LISTED: usize = 3;

pub(super) const ENDPOINT_SLICE: &[Column] = &[
    NAME,
    col(
        "AddressType",
        "string",
        "The type of address carried by this EndpointSlice: IPv4, IPv6 or FQDN.",
    ),
    col(
        "Ports",
        "string",
        "The network ports exposed by each endpoint in this slice.",
    ),
    col(
        "Endpoints",
        "string",
        "A list of unique endpoints in this slice.",
    ),
    AGE,
];

pub(super) fn endpoint_slice(slice: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(slice),
        Value::from(str_at(slice, "addressType")),
        Value::from(format_ports(arr_at(slice, "ports"))),
        Value::from(format_endpoints(arr_at(slice, "endpoints"))),
        age(slice, now),
    ]
}

/// A port's number, its name when it has none, `*` for neither (upstream's
/// `formatDiscoveryPorts`).
fn format_ports(ports: &[Value]) -> String {
    let listed = ports
        .iter()
        .map(|p| match p.get("port").and_then(Value::as_i64) {
            Some(n) => n.to_string(),
            None => match p.get("name").and_then(Value::as_str) {
                Some(name) => name.to_string(),
                None => "*".to_string(),
            },
        });
    list_with_more(listed, ports.len())
}

/// Every address of every endpoint, the first few listed.
fn format_endpoints(endpoints: &[Value]) -> String {
    let addresses = endpoints.iter().flat_map(|e| {
        arr_at(e, "addresses")
            .iter()
            .map(|a| a.as_str().unwrap_or_default().to_string())
    });
    let count = endpoints.iter().map(|e| arr_at(e, "addresses").len()).sum();
    list_with_more(addresses, count)
}

/// The first [`MAX_LISTED`] items joined by commas, `+ N more...` after them, `<unset>` for
/// none.
fn list_with_more(items: impl Iterator<Item = String>, count: usize) -> String {
    let listed: Vec<String> = items.take(MAX_LISTED).collect();
    if count > MAX_LISTED {
        format!("{} + {} more...", listed.join(","), count - MAX_LISTED)
    } else if listed.is_empty() {
        "<unset>".to_string()
    } else {
        listed.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cells(slice: Value) -> Vec<Value> {
        endpoint_slice(&slice, Utc::now())
    }

    #[test]
    fn lists_ports_and_addresses_like_upstream() {
        let row = cells(json!({
            "metadata": {"name": "web-abc12"},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "named"}, {}],
            "endpoints": [
                {"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]},
                {"addresses": ["10.0.0.3"]}, {"addresses": ["10.0.0.4"]},
                {"addresses": ["10.0.0.5"]},
            ],
        }));
        assert_eq!(row[0], json!("web-abc12"));
        assert_eq!(row[1], json!("IPv4"));
        assert_eq!(row[2], json!("8080,named,*"));
        assert_eq!(row[3], json!("10.0.0.1,10.0.0.2,10.0.0.3 + 2 more..."));
    }

    #[test]
    fn empty_slices_print_unset() {
        let row = cells(json!({"metadata": {"name": "s"}, "addressType": "IPv4"}));
        assert_eq!(row[2], json!("<unset>"));
        assert_eq!(row[3], json!("<unset>"));
        let four = cells(json!({"metadata": {"name": "s"}, "addressType": "IPv4",
            "ports": [{"port": 1}, {"port": 2}, {"port": 3}, {"port": 4}]}));
        assert_eq!(four[2], json!("1,2,3 + 1 more..."));
    }
}
