//! `discovery.k8s.io/v1` EndpointSlices: the essentials of upstream's `ValidateEndpointSlice`
//! and `ValidateEndpointSliceUpdate`, with their messages.

use serde_json::{json, Value};
use setpoint_api::Cause;

use super::fields::{arr, at, dns_label, s};

/// The address types a slice may carry.
const ADDRESS_TYPES: &[&str] = &["IPv4", "IPv6", "FQDN"];
/// The protocols a port may name.
const PROTOCOLS: &[&str] = &["SCTP", "TCP", "UDP"];
/// Upstream's bounds on one slice.
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_PORTS: usize = 20000;

fn too_many(e: &mut Vec<Cause>, path: &str, n: usize, max: usize) {
    e.push(Cause::new(
        "FieldValueTooMany",
        path,
        format!("Too many: {n}: must have at most {max} items"),
    ));
}

/// Validates an EndpointSlice (`old` on update: `addressType` cannot change).
pub(super) fn endpoint_slice(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let address_type = s(obj, "addressType");
    if address_type.is_empty() {
        e.push(Cause::required("addressType", ""));
    } else if !ADDRESS_TYPES.contains(&address_type) {
        e.push(Cause::not_supported(
            "addressType",
            &json!(address_type),
            ADDRESS_TYPES,
        ));
    }
    let endpoints = arr(obj, "endpoints");
    if endpoints.len() > MAX_ENDPOINTS {
        too_many(e, "endpoints", endpoints.len(), MAX_ENDPOINTS);
    }
    for (i, ep) in endpoints.iter().enumerate() {
        let path = format!("endpoints[{i}]");
        let addresses = arr(ep, "addresses");
        if addresses.is_empty() {
            e.push(Cause::required(
                format!("{path}.addresses"),
                "must contain at least 1 address",
            ));
        } else if addresses.len() > MAX_ADDRESSES {
            too_many(
                e,
                &format!("{path}.addresses"),
                addresses.len(),
                MAX_ADDRESSES,
            );
        }
        for (j, a) in addresses.iter().enumerate() {
            address(
                e,
                a.as_str().unwrap_or_default(),
                address_type,
                &format!("{path}.addresses[{j}]"),
            );
        }
        if let Some(h) = at(ep, "hostname").as_str() {
            dns_label(e, h, &format!("{path}.hostname"));
        }
    }
    let ports = arr(obj, "ports");
    if ports.len() > MAX_PORTS {
        too_many(e, "ports", ports.len(), MAX_PORTS);
    }
    let mut names = std::collections::HashSet::new();
    for (i, p) in ports.iter().enumerate() {
        let path = format!("ports[{i}]");
        let name = s(p, "name");
        if !name.is_empty() {
            dns_label(e, name, &format!("{path}.name"));
        }
        if !names.insert(name.to_string()) {
            e.push(Cause::duplicate(format!("{path}.name"), &json!(name)));
        }
        if let Some(proto) = at(p, "protocol").as_str() {
            if !PROTOCOLS.contains(&proto) {
                e.push(Cause::not_supported(
                    format!("{path}.protocol"),
                    &json!(proto),
                    PROTOCOLS,
                ));
            }
        }
        if let Some(port) = at(p, "port").as_i64() {
            if !(1..=65535).contains(&port) {
                e.push(Cause::invalid(
                    format!("{path}.port"),
                    &json!(port),
                    "must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
    if let Some(old) = old {
        let before = s(old, "addressType");
        if !before.is_empty() && before != address_type {
            e.push(Cause::immutable("addressType", &json!(address_type)));
        }
    }
}

/// One address, checked against the slice's address type.
fn address(e: &mut Vec<Cause>, a: &str, address_type: &str, path: &str) {
    let detail = match address_type {
        "IPv4" if a.parse::<std::net::Ipv4Addr>().is_err() => "must be a valid IPv4 address",
        "IPv6" if a.parse::<std::net::Ipv6Addr>().is_err() => "must be a valid IPv6 address",
        "FQDN" if setpoint_api::names::is_dns1123_subdomain(a).is_err() => {
            "must be a valid DNS subdomain"
        }
        _ => return,
    };
    e.push(Cause::invalid(path, &json!(a), detail));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(obj: Value, old: Option<Value>) -> Vec<String> {
        let mut e = Vec::new();
        endpoint_slice(&mut e, &obj, old.as_ref());
        e.into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_controller_slice_is_valid() {
        let ok = json!({"addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "hostname": "web-0"}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
        assert_eq!(check(ok.clone(), Some(ok)), Vec::<String>::new());
    }

    #[test]
    fn bad_slices_get_upstreams_messages() {
        let errs = check(
            json!({"addressType": "IPv5",
                "endpoints": [{"addresses": []}, {"addresses": ["300.1.1.1"]}],
                "ports": [{"name": "a", "port": 0}, {"name": "a", "protocol": "ICMP"}]}),
            None,
        );
        assert!(errs.contains(&"addressType: Unsupported value: \"IPv5\": supported values: \"IPv4\", \"IPv6\", \"FQDN\"".to_string()), "{errs:?}");
        assert!(errs.contains(
            &"endpoints[0].addresses: Required value: must contain at least 1 address".to_string()
        ));
        assert!(errs.contains(
            &"ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive".to_string()
        ));
        assert!(errs.contains(&"ports[1].name: Duplicate value: \"a\"".to_string()));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("ports[1].protocol: Unsupported value")));
        let v4 = check(
            json!({"addressType": "IPv4", "endpoints": [{"addresses": ["300.1.1.1"]}]}),
            None,
        );
        assert_eq!(v4, vec!["endpoints[0].addresses[0]: Invalid value: \"300.1.1.1\": must be a valid IPv4 address".to_string()]);
    }

    #[test]
    fn the_address_type_is_immutable() {
        let errs = check(
            json!({"addressType": "IPv6"}),
            Some(json!({"addressType": "IPv4"})),
        );
        assert_eq!(
            errs,
            vec!["addressType: Invalid value: \"IPv6\": field is immutable".to_string()]
        );
    }
}
