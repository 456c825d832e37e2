use serde_json::json;

use super::{supported, supported_fields, unsupported_message, value, value_sources};

#[test]
fn metadata_fields_everywhere_namespace_only_when_namespaced() {
    // Reviews are never listed, so no field selects them.
    for k in crate::BUILTIN.iter().filter(|k| !k.create_only) {
        assert!(supported(k.group, k.kind, "metadata.name"), "{}", k.kind);
        assert_eq!(
            supported(k.group, k.kind, "metadata.namespace"),
            k.namespaced,
            "{}",
            k.kind
        );
        assert!(!supported(k.group, k.kind, "metadata.uid"), "{}", k.kind);
        assert!(!supported(k.group, k.kind, "spec"), "{}", k.kind);
        let obj = json!({"metadata": {"name": "n1", "namespace": "ns1"}});
        assert_eq!(value(k.group, k.kind, &obj, "metadata.name"), "n1");
        let ns = if k.namespaced { "ns1" } else { "" };
        assert_eq!(value(k.group, k.kind, &obj, "metadata.namespace"), ns);
    }
    // Custom resources and other unknown kinds: metadata only.
    assert_eq!(
        supported_fields("example.com", "Widget"),
        ["metadata.name", "metadata.namespace"]
    );
    assert!(!supported("example.com", "Widget", "spec.size"));
}

#[test]
fn pod_fields() {
    let pod = json!({
        "metadata": {"name": "web-1", "namespace": "default"},
        "spec": {"nodeName": "node-1", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                 "serviceAccountName": "default", "hostNetwork": true, "containers": []},
        "status": {"phase": "Running", "podIP": "10.244.0.7", "podIPs": [{"ip": "10.244.0.7"}, {"ip": "fd00::7"}],
                   "nominatedNodeName": "node-2"},
    });
    let cases = [
        ("spec.nodeName", "node-1"),
        ("spec.host", "node-1"),
        ("spec.restartPolicy", "Always"),
        ("spec.schedulerName", "default-scheduler"),
        ("spec.serviceAccountName", "default"),
        ("spec.hostNetwork", "true"),
        ("status.phase", "Running"),
        ("status.podIP", "10.244.0.7"),
        ("status.podIPs", ""),
        ("status.nominatedNodeName", "node-2"),
    ];
    for (field, expected) in cases {
        assert!(supported("", "Pod", field), "{field}");
        assert_eq!(value("", "Pod", &pod, field), expected, "{field}");
    }
    assert!(!supported("", "Pod", "spec.containers"));
    assert!(!supported("", "Pod", "status.hostIP"));

    // Unset fields: empty strings, and false for the boolean.
    let bare = json!({"metadata": {"name": "p"}});
    for (field, _) in cases {
        let expected = if field == "spec.hostNetwork" {
            "false"
        } else {
            ""
        };
        assert_eq!(value("", "Pod", &bare, field), expected, "{field}");
    }
    // Only the singular IP set.
    let old = json!({"status": {"podIP": "10.0.0.1"}});
    assert_eq!(value("", "Pod", &old, "status.podIP"), "10.0.0.1");
}

#[test]
fn core_event_fields() {
    let ev = json!({
        "apiVersion": "v1",
        "metadata": {"name": "web-1.17a", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1", "uid": "3f2a",
                           "apiVersion": "v1", "resourceVersion": "512", "fieldPath": "spec.containers{main}"},
        "reason": "Pulled",
        "source": {"component": "kubelet", "host": "node-1"},
        "type": "Normal",
        "reportingComponent": "kubelet-rc",
    });
    let cases = [
        ("involvedObject.kind", "Pod"),
        ("involvedObject.namespace", "default"),
        ("involvedObject.name", "web-1"),
        ("involvedObject.uid", "3f2a"),
        ("involvedObject.apiVersion", "v1"),
        ("involvedObject.resourceVersion", "512"),
        ("involvedObject.fieldPath", "spec.containers{main}"),
        ("reason", "Pulled"),
        ("reportingComponent", "kubelet-rc"),
        ("source", "kubelet"),
        ("type", "Normal"),
    ];
    for (field, expected) in cases {
        assert!(supported("", "Event", field), "{field}");
        assert_eq!(value("", "Event", &ev, field), expected, "{field}");
    }
    // Without a source component, `source` falls back to the reporting component.
    let new_style = json!({"involvedObject": {"kind": "Node", "name": "node-1", "namespace": ""},
                           "source": {}, "reportingComponent": "default-scheduler"});
    assert_eq!(
        value("", "Event", &new_style, "source"),
        "default-scheduler"
    );
    assert_eq!(
        value("", "Event", &new_style, "involvedObject.namespace"),
        ""
    );
    // The events.k8s.io names are not core field labels.
    assert!(!supported("", "Event", "regarding.name"));
    assert!(!supported("", "Event", "reportingController"));
    assert!(!supported("", "Event", "message"));
}

#[test]
fn events_k8s_io_event_fields() {
    let ev = json!({
        "apiVersion": "events.k8s.io/v1",
        "metadata": {"name": "web.17a3", "namespace": "default"},
        "regarding": {"kind": "Deployment", "namespace": "default", "name": "web", "uid": "9c1e",
                      "apiVersion": "apps/v1", "resourceVersion": "77", "fieldPath": ""},
        "reason": "ScalingReplicaSet",
        "reportingController": "deployment-controller",
        "type": "Normal",
        "deprecatedSource": {"component": "deployment-controller"},
    });
    let cases = [
        ("regarding.kind", "Deployment"),
        ("regarding.namespace", "default"),
        ("regarding.name", "web"),
        ("regarding.uid", "9c1e"),
        ("regarding.apiVersion", "apps/v1"),
        ("regarding.resourceVersion", "77"),
        ("regarding.fieldPath", ""),
        ("reason", "ScalingReplicaSet"),
        ("reportingController", "deployment-controller"),
        ("type", "Normal"),
        ("metadata.name", "web.17a3"),
        ("metadata.namespace", "default"),
    ];
    for (field, expected) in cases {
        assert!(supported("events.k8s.io", "Event", field), "{field}");
        assert_eq!(
            value("events.k8s.io", "Event", &ev, field),
            expected,
            "{field}"
        );
    }
    for core_only in [
        "involvedObject.name",
        "source",
        "reportingComponent",
        "deprecatedSource",
        "note",
    ] {
        assert!(
            !supported("events.k8s.io", "Event", core_only),
            "{core_only}"
        );
    }
    // The stored (core-shaped) object answers the events.k8s.io labels too.
    let stored = json!({"apiVersion": "v1", "involvedObject": {"kind": "Pod", "name": "p"}, "reportingComponent": "kubelet"});
    assert_eq!(
        value("events.k8s.io", "Event", &stored, "regarding.name"),
        "p"
    );
    assert_eq!(
        value("events.k8s.io", "Event", &stored, "reportingController"),
        "kubelet"
    );
    // And a bare object follows the requested group.
    let bare = json!({"regarding": {"name": "r"}});
    assert_eq!(
        value("events.k8s.io", "Event", &bare, "regarding.name"),
        "r"
    );
}

#[test]
fn node_namespace_secret_service_fields() {
    let node = json!({"metadata": {"name": "node-1"}, "spec": {"unschedulable": true}});
    assert!(supported("", "Node", "spec.unschedulable"));
    assert_eq!(value("", "Node", &node, "spec.unschedulable"), "true");
    assert_eq!(
        value("", "Node", &json!({"spec": {}}), "spec.unschedulable"),
        "false"
    );
    assert!(!supported("", "Node", "status.phase"));

    let ns = json!({"metadata": {"name": "dev"}, "status": {"phase": "Terminating"}});
    assert!(supported("", "Namespace", "status.phase"));
    assert_eq!(value("", "Namespace", &ns, "status.phase"), "Terminating");

    let secret =
        json!({"metadata": {"name": "tok"}, "type": "kubernetes.io/service-account-token"});
    assert!(supported("", "Secret", "type"));
    assert_eq!(
        value("", "Secret", &secret, "type"),
        "kubernetes.io/service-account-token"
    );
    assert_eq!(value("", "Secret", &json!({}), "type"), "");
    assert!(!supported("", "ConfigMap", "type"));

    let svc = json!({"spec": {"type": "ClusterIP", "clusterIP": "None"}});
    assert!(supported("", "Service", "spec.clusterIP"));
    assert!(supported("", "Service", "spec.type"));
    assert_eq!(value("", "Service", &svc, "spec.clusterIP"), "None");
    assert_eq!(value("", "Service", &svc, "spec.type"), "ClusterIP");
    assert!(!supported("", "Service", "spec.clusterIPs"));
}

#[test]
fn replica_and_job_counts() {
    let rs = json!({"status": {"replicas": 3}});
    for (group, kind) in [("", "ReplicationController"), ("apps", "ReplicaSet")] {
        assert!(supported(group, kind, "status.replicas"), "{kind}");
        assert_eq!(value(group, kind, &rs, "status.replicas"), "3");
        assert_eq!(value(group, kind, &json!({}), "status.replicas"), "0");
    }
    assert!(!supported("apps", "Deployment", "status.replicas"));

    let job = json!({"status": {"succeeded": 2}});
    assert!(supported("batch", "Job", "status.successful"));
    assert_eq!(value("batch", "Job", &job, "status.successful"), "2");
    assert_eq!(value("batch", "Job", &json!({}), "status.successful"), "0");
    // Accepted for StatefulSets too, but with no value behind it.
    assert!(supported("apps", "StatefulSet", "status.successful"));
    assert_eq!(value("apps", "StatefulSet", &job, "status.successful"), "");
    assert!(!supported("batch", "CronJob", "status.successful"));
}

#[test]
fn unsupported_values_are_empty() {
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}});
    assert_eq!(value("", "ConfigMap", &pod, "spec.nodeName"), "");
    assert_eq!(value("", "Pod", &pod, "spec.nope"), "");
}

#[test]
fn unsupported_messages() {
    assert_eq!(
        unsupported_message("", "Pod", "spec.foo"),
        "field label not supported: spec.foo"
    );
    assert_eq!(
        unsupported_message("events.k8s.io", "Event", "source"),
        "field label not supported: source"
    );
    assert_eq!(
        unsupported_message("", "ConfigMap", "data"),
        "field label \"data\" not supported for \"ConfigMap\""
    );
    assert_eq!(
        unsupported_message("batch", "Job", "x"),
        "field label \"x\" not supported for batchv1.Job"
    );
    assert_eq!(
        unsupported_message("apps", "Deployment", "status.replicas"),
        "\"status.replicas\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
    );
}

/// `obj` with only the subtrees at `paths` (dotted) kept.
fn keep_only(obj: &serde_json::Value, paths: &[&str]) -> serde_json::Value {
    let mut out = json!({});
    for path in paths {
        let parts: Vec<&str> = path.split('.').collect();
        let mut src = obj;
        let mut found = true;
        for part in &parts {
            match src.get(part) {
                Some(v) => src = v,
                None => {
                    found = false;
                    break;
                }
            }
        }
        if !found {
            continue;
        }
        let mut dst = &mut out;
        for part in &parts[..parts.len() - 1] {
            if !dst.get(part).is_some_and(serde_json::Value::is_object) {
                dst[*part] = json!({});
            }
            dst = dst.get_mut(part).unwrap();
        }
        dst[*parts.last().unwrap()] = src.clone();
    }
    out
}

/// Field values computed from only the value sources equal those computed from the whole
/// object, for every field of every kind (each sample gives every field a value).
#[test]
fn value_sources_cover_every_field() {
    let samples = [
        json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "d", "labels": {"a": "b"}},
               "spec": {"nodeName": "n1", "restartPolicy": "Never", "schedulerName": "s",
                        "serviceAccountName": "sa", "hostNetwork": true, "containers": [{"name": "c"}]},
               "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.2"}],
                          "nominatedNodeName": "n2", "conditions": [{"type": "Ready"}]}}),
        json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
               "spec": {"nodeName": "n1"}, "status": {"podIP": "10.0.0.1"}}),
        json!({"kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": true}}),
        json!({"kind": "Namespace", "metadata": {"name": "n"}, "status": {"phase": "Terminating"}}),
        json!({"kind": "Secret", "metadata": {"name": "s", "namespace": "d"}, "type": "Opaque"}),
        json!({"kind": "Service", "metadata": {"name": "s", "namespace": "d"},
               "spec": {"clusterIP": "10.96.0.1", "type": "NodePort"}}),
        json!({"kind": "ReplicaSet", "metadata": {"name": "r", "namespace": "d"},
               "spec": {"replicas": 3}, "status": {"replicas": 2}}),
        json!({"kind": "ReplicationController", "metadata": {"name": "r", "namespace": "d"},
               "status": {"replicas": 2}}),
        json!({"kind": "Job", "metadata": {"name": "j", "namespace": "d"}, "status": {"succeeded": 4}}),
        json!({"kind": "StatefulSet", "metadata": {"name": "s", "namespace": "d"}, "status": {"replicas": 1}}),
        json!({"kind": "Deployment", "metadata": {"name": "x", "namespace": "d"}, "spec": {"replicas": 1}}),
        json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "e", "namespace": "d"},
               "involvedObject": {"kind": "Pod", "namespace": "d", "name": "p", "uid": "u",
                                  "apiVersion": "v1", "resourceVersion": "5", "fieldPath": "spec"},
               "reason": "Started", "type": "Normal", "message": "m",
               "source": {"component": "kubelet"}, "reportingComponent": "rc"}),
        json!({"kind": "Event", "apiVersion": "v1", "metadata": {"name": "e", "namespace": "d"},
               "involvedObject": {"kind": "Pod", "name": "p"}, "reportingComponent": "rc"}),
        json!({"kind": "Event", "apiVersion": "events.k8s.io/v1",
               "metadata": {"name": "e", "namespace": "d"},
               "regarding": {"kind": "Node", "name": "n", "uid": "u", "apiVersion": "v1",
                             "resourceVersion": "7", "fieldPath": "x", "namespace": ""},
               "reason": "R", "type": "Warning", "note": "n", "reportingController": "rc2",
               "deprecatedSource": {"component": "old"}}),
        json!({"kind": "Event", "metadata": {"name": "e", "namespace": "d"},
               "regarding": {"kind": "Node", "name": "n"}, "reportingController": "rc3"}),
    ];
    let mut checked = 0;
    for k in crate::BUILTIN {
        let Some(sources) = value_sources(k.group, k.kind) else {
            continue;
        };
        let mut paths = vec!["metadata.name", "metadata.namespace"];
        paths.extend_from_slice(sources);
        for obj in samples.iter().filter(|o| o["kind"] == k.kind) {
            let pruned = keep_only(obj, &paths);
            for field in supported_fields(k.group, k.kind) {
                let whole = value(k.group, k.kind, obj, field);
                assert_eq!(
                    value(k.group, k.kind, &pruned, field),
                    whole,
                    "{} {field}",
                    k.kind
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "only {checked} values checked");
}
