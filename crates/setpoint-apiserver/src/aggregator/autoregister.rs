//! Local APIServices for the group/versions Setpoint serves itself, as kube-apiserver's
//! autoregister and CRD registration controllers create them: `v1.` for the core group,
//! `v1.apps`, … and `v1beta1.metrics.k8s.io`, labelled
//! `kube-aggregator.kubernetes.io/automanaged` (`onstart` for built-in ones, `true` for those
//! of custom resources, which go when their group/version does). An existing APIService is
//! never overwritten: one a user pointed at a Service (metrics-server for
//! `v1beta1.metrics.k8s.io`) stays so.

use serde_json::{json, Value};

use crate::objects::{DeleteOptions, WriteOptions};
use crate::state::ApiServer;

/// The label upstream's controllers mark what they manage with.
pub(crate) const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

/// `groupPriorityMinimum` and `versionPriority` of a built-in group/version, upstream's table;
/// others (custom resources) get what upstream gives CRD groups.
pub(crate) fn priority(group: &str, version: &str) -> (i64, i64) {
    match (group, version) {
        ("", _) => (18000, 1),
        ("apiregistration.k8s.io", _) => (18000, 15),
        ("apps", _) => (17800, 15),
        ("events.k8s.io", _) => (17750, 15),
        ("authentication.k8s.io", _) => (17700, 15),
        ("authorization.k8s.io", _) => (17600, 15),
        ("autoscaling", "v2") => (17500, 30),
        ("autoscaling", _) => (17500, 15),
        ("batch", _) => (17400, 15),
        ("certificates.k8s.io", _) => (17300, 15),
        ("networking.k8s.io", _) => (17200, 15),
        ("policy", _) => (17100, 15),
        ("rbac.authorization.k8s.io", _) => (17000, 15),
        ("storage.k8s.io", _) => (16800, 15),
        ("apiextensions.k8s.io", _) | ("admissionregistration.k8s.io", _) => (16700, 15),
        ("scheduling.k8s.io", _) => (16600, 15),
        ("coordination.k8s.io", _) => (16500, 15),
        ("node.k8s.io", _) => (16300, 15),
        ("discovery.k8s.io", _) => (16200, 15),
        ("flowcontrol.apiserver.k8s.io", _) => (16100, 21),
        // metrics-server registers its group with these.
        ("metrics.k8s.io", _) => (100, 100),
        _ => (1000, 100),
    }
}

/// A local APIService for `group`/`version`.
pub(crate) fn local(group: &str, version: &str, managed: &str) -> Value {
    let (group_priority, version_priority) = priority(group, version);
    json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": format!("{version}.{group}"), "labels": {AUTOMANAGED: managed}},
        "spec": {"group": group, "version": version,
                 "groupPriorityMinimum": group_priority, "versionPriority": version_priority},
    })
}

/// The local APIServices Setpoint's served set calls for, with their `automanaged` value.
fn wanted(server: &ApiServer) -> Vec<(String, String, &'static str)> {
    let mut out = vec![];
    for (group, versions) in server.registry().groups() {
        for version in versions {
            let builtin = setpoint_kinds::BUILTIN
                .iter()
                .any(|k| k.group == group && k.version == version);
            let managed = if builtin { "onstart" } else { "true" };
            out.push((group.clone(), version, managed));
        }
    }
    use crate::resourcemetrics::{GROUP, VERSION};
    out.push((GROUP.to_string(), VERSION.to_string(), "onstart"));
    out
}

/// Creates the missing local APIServices and deletes the `true`-managed local ones whose
/// group/version is no longer served.
pub(crate) async fn sync(server: &ApiServer) {
    let Some(def) = super::api_services_def(server) else {
        return;
    };
    let existing = super::api_services(server);
    let wanted = wanted(server);
    for (group, version, managed) in &wanted {
        let name = format!("{version}.{group}");
        if existing.iter().any(|a| setpoint_api::meta::name(a) == name) {
            continue;
        }
        match server
            .create(
                &def,
                "",
                local(group, version, managed),
                &WriteOptions::default(),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.reason == "AlreadyExists" => {}
            Err(e) => {
                tracing::warn!(apiservice = %name, error = %e.message, "registering a local APIService")
            }
        }
    }
    for a in existing.iter().filter(|a| super::is_local(a)) {
        let name = setpoint_api::meta::name(a);
        let managed = a
            .pointer("/metadata/labels")
            .and_then(|l| l.get(AUTOMANAGED))
            .and_then(Value::as_str);
        let served = wanted.iter().any(|(g, v, _)| format!("{v}.{g}") == name);
        if managed == Some("true") && !served {
            if let Err(e) = server
                .delete(&def, "", name, &DeleteOptions::default())
                .await
            {
                if e.code != 404 {
                    tracing::warn!(apiservice = %name, error = %e.message, "removing a local APIService");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_api_services_are_named_version_dot_group_and_valid() {
        for (group, version) in [("", "v1"), ("apps", "v1"), ("metrics.k8s.io", "v1beta1")] {
            let a = local(group, version, "onstart");
            let errs = setpoint_kinds::validation::validate(
                "apiregistration.k8s.io",
                "v1",
                "APIService",
                &a,
                None,
            );
            assert!(errs.is_empty(), "{group}/{version}: {errs:?}");
        }
        assert_eq!(local("", "v1", "onstart")["metadata"]["name"], "v1.");
        assert_eq!(
            local("apps", "v1", "onstart")["spec"]["groupPriorityMinimum"],
            17800
        );
    }
}
