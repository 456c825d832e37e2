//! APIServices (`apiregistration.k8s.io/v1`): upstream's `ValidateAPIService` and
//! `ValidateAPIServiceStatus`, with their messages.

use serde_json::{json, Value};
use setpoint_api::{names, Cause};

use super::fields::{arr, at, index, int, s};

/// The condition statuses an APIService's status may carry.
const CONDITION_STATUSES: &[&str] = &["True", "False", "Unknown"];

pub(super) fn api_service(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    let (group, version) = (s(spec, "group"), s(spec, "version"));
    let name = s(at(obj, "metadata"), "name");
    // The generic check already reported a name that is no path segment; only a valid segment
    // is then held to `<version>.<group>`.
    let required = format!("{version}.{group}");
    if !name.is_empty() && names::path_segment_name(name).is_ok() && name != required {
        e.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            &format!(
                "must be `spec.version+\".\"+spec.group`: {}",
                setpoint_api::strconv::quote(&required)
            ),
        ));
    }
    if group.is_empty() && version != "v1" {
        e.push(Cause::required(
            "spec.group",
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for msg in names::is_dns1123_subdomain(group).err().unwrap_or_default() {
            e.push(Cause::invalid("spec.group", &json!(group), &msg));
        }
    }
    for msg in names::is_dns1035_label(version).err().unwrap_or_default() {
        e.push(Cause::invalid("spec.version", &json!(version), &msg));
    }
    let group_priority = int(spec, "groupPriorityMinimum").unwrap_or(0);
    if !(1..=20000).contains(&group_priority) {
        e.push(Cause::invalid(
            "spec.groupPriorityMinimum",
            &json!(group_priority),
            "must be positive and less than 20000",
        ));
    }
    let version_priority = int(spec, "versionPriority").unwrap_or(0);
    if !(1..=1000).contains(&version_priority) {
        e.push(Cause::invalid(
            "spec.versionPriority",
            &json!(version_priority),
            "must be positive and less than 1000",
        ));
    }
    let ca_bundle = s(spec, "caBundle");
    let insecure = at(spec, "insecureSkipTLSVerify").as_bool().unwrap_or(false);
    let service = at(spec, "service");
    if service.is_null() {
        if !ca_bundle.is_empty() {
            e.push(Cause::invalid(
                "spec.caBundle",
                &json!(format!("{} bytes", decoded_len(ca_bundle))),
                "local APIServices may not have a caBundle",
            ));
        }
        if insecure {
            e.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "local APIServices may not have insecureSkipTLSVerify",
            ));
        }
    } else {
        if s(service, "namespace").is_empty() {
            e.push(Cause::required("spec.service.namespace", ""));
        }
        if s(service, "name").is_empty() {
            e.push(Cause::required("spec.service.name", ""));
        }
        let port = int(service, "port").unwrap_or(443);
        if !(1..=65535).contains(&port) {
            e.push(Cause::invalid(
                "spec.service.port",
                &json!(port),
                &format!(
                    "port is not valid: {}",
                    names::inclusive_range_error(1, 65535)
                ),
            ));
        }
        if insecure && !ca_bundle.is_empty() {
            e.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "may not be true if caBundle is present",
            ));
        }
    }
    for (i, condition) in arr(at(obj, "status"), "conditions").iter().enumerate() {
        let status = s(condition, "status");
        if !CONDITION_STATUSES.contains(&status) {
            e.push(Cause::not_supported(
                format!("{}.status", index("status.conditions", i)),
                &json!(status),
                CONDITION_STATUSES,
            ));
        }
    }
}

/// The length of a base64 `[]byte` field once decoded, as upstream's message counts bytes.
fn decoded_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4) * 3 - padding.min(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(obj: Value) -> Vec<(String, String)> {
        let mut e = vec![];
        api_service(&mut e, &obj);
        e.into_iter().map(|c| (c.field, c.message)).collect()
    }

    fn service(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec})
    }

    #[test]
    fn a_valid_service_backed_api_service_passes() {
        let ok = service(
            "v1beta1.metrics.k8s.io",
            json!({"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                   "versionPriority": 100, "insecureSkipTLSVerify": true,
                   "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443}}),
        );
        assert_eq!(check(ok), vec![]);
        let core = service(
            "v1.",
            json!({"version": "v1", "groupPriorityMinimum": 18000, "versionPriority": 1}),
        );
        assert_eq!(check(core), vec![]);
    }

    #[test]
    fn names_priorities_and_tls_read_as_upstream() {
        let bad = service(
            "v1.wrong",
            json!({"group": "example.com", "version": "v1", "caBundle": "YWJj",
                   "insecureSkipTLSVerify": true, "service": {"namespace": "", "name": "x", "port": 0}}),
        );
        let errs = check(bad);
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.groupPriorityMinimum",
                "spec.versionPriority",
                "spec.service.namespace",
                "spec.service.port",
                "spec.insecureSkipTLSVerify"
            ]
        );
        assert_eq!(
            errs[0].1,
            "Invalid value: \"v1.wrong\": must be `spec.version+\".\"+spec.group`: \"v1.example.com\""
        );
        assert_eq!(
            errs[1].1,
            "Invalid value: 0: must be positive and less than 20000"
        );
        assert_eq!(
            errs[4].1,
            "Invalid value: 0: port is not valid: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            errs[5].1,
            "Invalid value: true: may not be true if caBundle is present"
        );
    }

    #[test]
    fn local_api_services_take_no_tls_settings() {
        let local = service(
            "v2.example.com",
            json!({"group": "example.com", "version": "v2", "groupPriorityMinimum": 1,
                   "versionPriority": 1, "caBundle": "YWJj"}),
        );
        assert_eq!(
            check(local),
            vec![(
                "spec.caBundle".to_string(),
                "Invalid value: \"3 bytes\": local APIServices may not have a caBundle".to_string()
            )]
        );
        let empty_group = service(
            "v2.",
            json!({"version": "v2", "groupPriorityMinimum": 1, "versionPriority": 1}),
        );
        assert_eq!(
            check(empty_group)[0].1,
            "Required value: only v1 may have an empty group and it better be legacy kube"
        );
    }
}
