//! Services: type, ports, cluster IPs, selectors and what an update may change.

use serde_json::{json, Value};
use setpoint_api::names;
use setpoint_api::Cause;
use std::collections::HashSet;

use super::fields::{
    arr, at, child, dns_label, dns_subdomain, enum_field, index, int, not_supported, optional_enum,
    s,
};
use super::meta::labels;

pub(super) fn service(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let ty = s(spec, "type");
    enum_field(
        e,
        ty,
        "spec.type",
        &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
    );
    let ports = arr(spec, "ports");
    if ty == "ExternalName" {
        let ext = s(spec, "externalName");
        if ext.is_empty() {
            e.push(Cause::required("spec.externalName", ""));
        } else {
            dns_subdomain(e, ext.trim_end_matches('.'), "spec.externalName");
        }
    } else if ports.is_empty() {
        e.push(Cause::required("spec.ports", ""));
    }
    let mut port_names = HashSet::new();
    let mut port_keys = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = index("spec.ports", i);
        let name = s(port, "name");
        if ports.len() > 1 && name.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !name.is_empty() {
            dns_label(e, name, &child(&p, "name"));
            if !port_names.insert(name.to_string()) {
                e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
            }
        }
        let number = int(port, "port").unwrap_or(0);
        for msg in names::is_valid_port_num(number).err().unwrap_or_default() {
            e.push(Cause::invalid(child(&p, "port"), &json!(number), &msg));
        }
        let protocol = s(port, "protocol");
        enum_field(e, protocol, &child(&p, "protocol"), &["SCTP", "TCP", "UDP"]);
        match at(port, "targetPort") {
            Value::String(tp) => {
                for msg in names::is_valid_port_name(tp).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "targetPort"), &json!(tp), &msg));
                }
            }
            Value::Null => {}
            other => {
                if let Some(n) = other.as_i64() {
                    for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                        e.push(Cause::invalid(child(&p, "targetPort"), other, &msg));
                    }
                }
            }
        }
        if let Some(np) = int(port, "nodePort").filter(|n| *n != 0) {
            if ty == "ClusterIP" || ty == "ExternalName" {
                e.push(Cause::forbidden(
                    child(&p, "nodePort"),
                    &format!("may not be used when `type` is '{ty}'"),
                ));
            } else {
                for msg in names::is_valid_port_num(np).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "nodePort"), &json!(np), &msg));
                }
            }
        }
        if !port_keys.insert((number, protocol.to_string())) {
            e.push(Cause::duplicate(
                &p,
                &json!({"port": number, "protocol": protocol}),
            ));
        }
    }
    enum_field(
        e,
        s(spec, "sessionAffinity"),
        "spec.sessionAffinity",
        &["ClientIP", "None"],
    );
    labels(e, at(spec, "selector"), "spec.selector");
    let cluster_ip = s(spec, "clusterIP");
    if !cluster_ip.is_empty()
        && cluster_ip != "None"
        && cluster_ip.parse::<std::net::IpAddr>().is_err()
    {
        e.push(Cause::invalid(
            "spec.clusterIPs[0]",
            &json!(cluster_ip),
            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
        ));
    }
    optional_enum(
        e,
        spec,
        "externalTrafficPolicy",
        "spec.externalTrafficPolicy",
        &["Cluster", "Local"],
    );
    optional_enum(
        e,
        spec,
        "internalTrafficPolicy",
        "spec.internalTrafficPolicy",
        &["Cluster", "Local"],
    );
    optional_enum(
        e,
        spec,
        "ipFamilyPolicy",
        "spec.ipFamilyPolicy",
        &["SingleStack", "PreferDualStack", "RequireDualStack"],
    );
    for (i, fam) in arr(spec, "ipFamilies").iter().enumerate() {
        let fam = fam.as_str().unwrap_or("");
        if fam != "IPv4" && fam != "IPv6" {
            not_supported(e, index("spec.ipFamilies", i), fam, &["IPv4", "IPv6"]);
        }
    }
    if let Some(old) = old {
        let old_spec = at(old, "spec");
        let old_ip = s(old_spec, "clusterIP");
        let external = ty == "ExternalName" || s(old_spec, "type") == "ExternalName";
        if !external && !old_ip.is_empty() && !cluster_ip.is_empty() && old_ip != cluster_ip {
            e.push(Cause::invalid(
                "spec.clusterIPs[0]",
                &json!([cluster_ip]),
                "may not change once set",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, check_update, find};

    #[test]
    fn services() {
        assert_eq!(
            check(
                "",
                "v1",
                "Service",
                json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
            ),
            vec![]
        );
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {}}),
        );
        assert_eq!(find(&causes, "spec.ports").message, "Required value");
        assert_eq!(
            check(
                "",
                "v1",
                "Service",
                json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName", "externalName": "example.com"}})
            ),
            vec![]
        );
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {"type": "Magic", "clusterIP": "x.y", "ports": [{"port": 0}, {"port": 80, "targetPort": "Bad_Name", "nodePort": 30000}]}}),
        );
        find(&causes, "spec.type");
        assert_eq!(
            find(&causes, "spec.ports[0].name").message,
            "Required value"
        );
        assert_eq!(
            find(&causes, "spec.ports[0].port").message,
            "Invalid value: 0: must be between 1 and 65535, inclusive"
        );
        find(&causes, "spec.ports[1].targetPort");
        find(&causes, "spec.clusterIPs[0]");
        let causes = check(
            "",
            "v1",
            "Service",
            json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80, "name": "a", "nodePort": 30001}, {"port": 80, "name": "a"}]}}),
        );
        assert_eq!(
            find(&causes, "spec.ports[0].nodePort").message,
            "Forbidden: may not be used when `type` is 'ClusterIP'"
        );
        find(&causes, "spec.ports[1].name");
        find(&causes, "spec.ports[1]");
        let old = json!({"metadata": {"name": "web"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}});
        let mut new = old.clone();
        new["spec"]["clusterIP"] = json!("10.0.0.2");
        find(
            &check_update("", "v1", "Service", old, new),
            "spec.clusterIPs[0]",
        );
    }
}
