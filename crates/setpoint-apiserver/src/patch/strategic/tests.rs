//! Strategic merge patch: one test per directive on realistic objects, the patches kubectl
//! sends, and property tests (agreement with JSON merge patch where no strategy applies; a
//! two-way patch turns `a` into `b`).

use proptest::prelude::*;
use serde_json::{json, Value};
use setpoint_protobuf::types::{self, TypeRef};

use super::{apply, create_two_way};
use crate::patch::merge_patch;

fn deployment_type() -> TypeRef {
    types::for_kind("apps", "v1", "Deployment").unwrap()
}

fn pod_type() -> TypeRef {
    types::for_kind("", "v1", "Pod").unwrap()
}

fn smp(original: &Value, patch: Value) -> Value {
    apply(original, &patch, deployment_type()).unwrap_or_else(|e| panic!("{}", e.message))
}

fn smp_err(original: &Value, patch: Value) -> (u16, String) {
    let e = apply(original, &patch, deployment_type()).unwrap_err();
    (e.code, e.message)
}

/// A Deployment as the server stores it (trimmed to what the tests touch).
fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "default",
            "labels": {"app": "web"},
            "annotations": {"team": "a"},
            "finalizers": ["example.com/a", "example.com/b"],
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": "nginx:1.25",
                            "args": ["-g", "daemon off;"],
                            "ports": [
                                {"containerPort": 80, "protocol": "TCP"},
                                {"containerPort": 443, "protocol": "TCP"},
                            ],
                            "env": [
                                {"name": "A", "value": "1"},
                                {"name": "B", "value": "2"},
                                {"name": "C", "value": "3"},
                            ],
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
                        },
                        {"name": "sidecar", "image": "busybox:1.36"},
                    ],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "web-config", "defaultMode": 420}},
                        {"name": "cache", "emptyDir": {}},
                    ],
                    "tolerations": [{"key": "a", "operator": "Exists"}],
                },
            },
        },
        "status": {
            "replicas": 2,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
            ],
        },
    })
}

fn containers(d: &Value) -> &Vec<Value> {
    d.pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .unwrap()
}

fn names(list: &Value, key: &str) -> Vec<Value> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|i| i[key].clone())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// maps and plain fields

#[test]
fn maps_merge_and_null_deletes() {
    let d = smp(
        &deployment(),
        json!({"metadata": {"labels": {"tier": "front"}, "annotations": {"team": null}}, "spec": {"paused": true, "replicas": null}}),
    );
    assert_eq!(
        d["metadata"]["labels"],
        json!({"app": "web", "tier": "front"})
    );
    assert_eq!(d["metadata"]["annotations"], json!({}));
    assert_eq!(d["spec"]["paused"], json!(true));
    assert!(d["spec"].get("replicas").is_none());
    // Everything else is untouched.
    assert_eq!(containers(&d), containers(&deployment()));
}

#[test]
fn rollout_pause_resume_restart_patches() {
    let paused = smp(&deployment(), json!({"spec": {"paused": true}}));
    assert_eq!(paused["spec"]["paused"], json!(true));
    let resumed = smp(&paused, json!({"spec": {"paused": null}}));
    assert!(resumed["spec"].get("paused").is_none());
    let restarted = smp(
        &resumed,
        json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}}}}}),
    );
    assert_eq!(
        restarted["spec"]["template"]["metadata"],
        json!({"labels": {"app": "web"}, "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}})
    );
    assert_eq!(restarted, {
        let mut d = deployment();
        d["spec"]["template"]["metadata"]["annotations"] =
            json!({"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"});
        d
    });
}

#[test]
fn unknown_fields_merge_like_plain_json() {
    let d = smp(
        &json!({"spec": {"x-extra": {"a": 1, "b": [1, 2]}}}),
        json!({"spec": {"x-extra": {"b": [3], "c": {"d": null, "e": 1}}}}),
    );
    assert_eq!(
        d["spec"]["x-extra"],
        json!({"a": 1, "b": [3], "c": {"e": 1}})
    );
}

#[test]
fn lists_without_a_strategy_are_replaced() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "containers": [{"name": "web", "args": ["-v"]}],
        }}}}),
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["tolerations"],
        json!([{"key": "b", "operator": "Exists"}])
    );
    assert_eq!(containers(&d)[0]["args"], json!(["-v"]));
}

// ---------------------------------------------------------------------------------------------
// merge lists of objects

#[test]
fn containers_merge_by_name() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.26"}]}}}}),
    );
    let mut expected = deployment();
    expected["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    assert_eq!(d, expected);
}

#[test]
fn kubectl_set_image_patch() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}],
            "containers": [{"image": "nginx:1.27", "name": "web"}],
        }}}}),
    );
    let mut expected = deployment();
    expected["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    assert_eq!(d, expected);
}

#[test]
fn kubectl_apply_deletes_a_container() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}],
            "containers": [{"image": "nginx:1.26", "name": "web"}, {"$patch": "delete", "name": "sidecar"}],
        }}}}),
    );
    assert_eq!(containers(&d).len(), 1);
    assert_eq!(containers(&d)[0]["image"], json!("nginx:1.26"));
    assert_eq!(
        containers(&d)[0]["env"],
        deployment()["spec"]["template"]["spec"]["containers"][0]["env"]
    );
}

#[test]
fn new_items_without_an_order_come_first_as_in_kubernetes() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{"name": "log", "image": "fluentd"}]}}}}),
    );
    let list = &d["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        names(list, "name"),
        [json!("log"), json!("web"), json!("sidecar")]
    );
    // With $setElementOrder the client decides.
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}, {"name": "sidecar"}, {"name": "log"}],
            "containers": [{"name": "log", "image": "fluentd"}],
        }}}}),
    );
    let list = &d["spec"]["template"]["spec"]["containers"];
    assert_eq!(
        names(list, "name"),
        [json!("web"), json!("sidecar"), json!("log")]
    );
}

#[test]
fn env_merges_by_name_with_delete_and_order() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{
            "name": "web",
            "$setElementOrder/env": [{"name": "C"}, {"name": "A"}, {"name": "D"}],
            "env": [
                {"name": "A", "value": "one"},
                {"name": "D", "value": "4"},
                {"name": "B", "$patch": "delete"},
            ],
        }]}}}}),
    );
    assert_eq!(
        containers(&d)[0]["env"],
        json!([
            {"name": "C", "value": "3"},
            {"name": "A", "value": "one"},
            {"name": "D", "value": "4"},
        ])
    );
}

#[test]
fn env_value_source_switch_uses_null() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{
            "name": "web",
            "env": [{"name": "A", "value": null, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        }]}}}}),
    );
    assert_eq!(
        containers(&d)[0]["env"][0],
        json!({"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    );
}

#[test]
fn ports_merge_by_container_port() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{
            "name": "web",
            "ports": [{"containerPort": 80.0, "name": "http"}, {"containerPort": 443, "$patch": "delete"}],
        }]}}}}),
    );
    assert_eq!(
        containers(&d)[0]["ports"],
        // Matched although written as 80.0; like any patched value, the patch's spelling is kept.
        json!([{"containerPort": 80.0, "protocol": "TCP", "name": "http"}])
    );
}

#[test]
fn service_ports_merge_by_port() {
    let svc = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 8443}]}});
    let ty = types::for_kind("", "v1", "Service").unwrap();
    let out = apply(
        &svc,
        &json!({"spec": {"ports": [{"port": 443, "targetPort": 9443}]}}),
        ty,
    )
    .unwrap();
    assert_eq!(
        out["spec"]["ports"],
        json!([{"port": 80, "targetPort": 8080}, {"port": 443, "targetPort": 9443}])
    );
}

#[test]
fn list_item_replace_directive_replaces_the_list() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [
            {"name": "only", "image": "alpine"},
            {"$patch": "replace"},
        ]}}}}),
    );
    assert_eq!(
        containers(&d),
        &vec![json!({"name": "only", "image": "alpine"})]
    );
}

#[test]
fn list_item_merge_directive_is_the_default() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [
            {"$patch": "merge"},
            {"name": "web", "image": "nginx:1.26"},
        ]}}}}),
    );
    assert_eq!(containers(&d).len(), 2);
    assert_eq!(containers(&d)[0]["image"], json!("nginx:1.26"));
}

#[test]
fn conditions_merge_by_type() {
    let d = smp(
        &deployment(),
        json!({"status": {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}),
    );
    assert_eq!(
        d["status"]["conditions"],
        json!([
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"},
        ])
    );
    let pod = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}], "podIPs": [{"ip": "10.0.0.1"}]}});
    let out = apply(
        &pod,
        &json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "podIPs": [{"ip": "fd00::1"}]}}),
        pod_type(),
    )
    .unwrap();
    assert_eq!(
        out["status"]["conditions"],
        json!([{"type": "Ready", "status": "True"}])
    );
    assert_eq!(
        out["status"]["podIPs"],
        json!([{"ip": "fd00::1"}, {"ip": "10.0.0.1"}])
    );
}

#[test]
fn owner_references_merge_by_uid() {
    let d = smp(
        &json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a", "kind": "ReplicaSet"}]}}),
        json!({"metadata": {"ownerReferences": [{"uid": "1", "controller": true}, {"uid": "2", "name": "b", "kind": "ReplicaSet"}]}}),
    );
    assert_eq!(
        d["metadata"]["ownerReferences"],
        json!([
            {"uid": "1", "name": "a", "kind": "ReplicaSet", "controller": true},
            {"uid": "2", "name": "b", "kind": "ReplicaSet"},
        ])
    );
}

// ---------------------------------------------------------------------------------------------
// ordering, as Kubernetes orders

#[test]
fn stored_items_the_order_does_not_name_are_interleaved_by_stored_position() {
    let live = json!({"metadata": {"ownerReferences": [{"uid": "C"}, {"uid": "B"}, {"uid": "D"}, {"uid": "A"}, {"uid": "E"}]}});
    let d = smp(
        &live,
        json!({"metadata": {
            "$setElementOrder/ownerReferences": [{"uid": "A"}, {"uid": "B"}],
            "ownerReferences": [{"uid": "A", "name": "a"}, {"uid": "B", "name": "b"}],
        }}),
    );
    assert_eq!(
        names(&d["metadata"]["ownerReferences"], "uid"),
        ["C", "D", "A", "B", "E"].map(|s| json!(s))
    );
}

#[test]
fn order_may_name_missing_items_and_reorder_without_changes() {
    let live = json!({"metadata": {"ownerReferences": [{"uid": "B"}, {"uid": "A"}]}});
    let d = smp(
        &live,
        json!({"metadata": {"$setElementOrder/ownerReferences": [{"uid": "Z"}, {"uid": "A"}, {"uid": "B"}]}}),
    );
    assert_eq!(
        names(&d["metadata"]["ownerReferences"], "uid"),
        [json!("A"), json!("B")]
    );
}

#[test]
fn order_that_contradicts_the_patch_list_is_rejected() {
    let (code, msg) = smp_err(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "web"}],
            "containers": [{"name": "web", "image": "x"}, {"name": "sidecar", "image": "y"}],
        }}}}),
    );
    assert_eq!(code, 400, "{msg}");
    assert!(msg.contains("$setElementOrder"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// retainKeys

#[test]
fn strategy_retain_keys_switches_to_recreate() {
    let d = smp(
        &deployment(),
        json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null}}}),
    );
    assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    // Without the null, $retainKeys alone clears rollingUpdate.
    let d = smp(
        &deployment(),
        json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
    );
    assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    // On a missing field the directive is resolved, not stored.
    let d = smp(
        &json!({"spec": {}}),
        json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
    );
    assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
}

#[test]
fn volume_retain_keys_switches_the_source() {
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {
            "$setElementOrder/volumes": [{"name": "config"}, {"name": "cache"}],
            "volumes": [{"$retainKeys": ["name", "secret"], "name": "config", "secret": {"secretName": "web"}}],
        }}}}),
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["volumes"],
        json!([
            {"name": "config", "secret": {"secretName": "web"}},
            {"name": "cache", "emptyDir": {}},
        ])
    );
}

#[test]
fn retain_keys_must_list_what_the_patch_sets() {
    let (code, msg) = smp_err(
        &deployment(),
        json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
    );
    assert_eq!(code, 400);
    assert!(
        msg.contains("rollingUpdate") && msg.contains("$retainKeys"),
        "{msg}"
    );
    assert_eq!(
        smp_err(
            &deployment(),
            json!({"spec": {"strategy": {"$retainKeys": "type"}}})
        )
        .0,
        400
    );
}

// ---------------------------------------------------------------------------------------------
// merge lists of scalars

#[test]
fn finalizers_are_a_set() {
    let d = smp(
        &deployment(),
        json!({"metadata": {"finalizers": ["example.com/b", "example.com/c"]}}),
    );
    assert_eq!(
        d["metadata"]["finalizers"],
        json!(["example.com/a", "example.com/b", "example.com/c"])
    );
    let d = smp(
        &deployment(),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a", "example.com/x"]}}),
    );
    assert_eq!(d["metadata"]["finalizers"], json!(["example.com/b"]));
    // What kubectl apply sends when one finalizer is replaced by another.
    let d = smp(
        &deployment(),
        json!({"metadata": {
            "$setElementOrder/finalizers": ["example.com/c", "example.com/b"],
            "$deleteFromPrimitiveList/finalizers": ["example.com/a"],
            "finalizers": ["example.com/c"],
        }}),
    );
    assert_eq!(
        d["metadata"]["finalizers"],
        json!(["example.com/c", "example.com/b"])
    );
}

#[test]
fn set_order_for_scalars_interleaves_server_only_values() {
    // The design example: live [b e a c d], the client wants [a b f] and drops c.
    let live = json!({"metadata": {"finalizers": ["b", "e", "a", "c", "d"]}});
    let d = smp(
        &live,
        json!({"metadata": {
            "$setElementOrder/finalizers": ["a", "b", "f"],
            "$deleteFromPrimitiveList/finalizers": ["c"],
            "finalizers": ["f"],
        }}),
    );
    assert_eq!(
        d["metadata"]["finalizers"],
        json!(["e", "a", "b", "f", "d"])
    );
}

#[test]
fn sets_reject_objects() {
    assert_eq!(
        smp_err(
            &deployment(),
            json!({"metadata": {"finalizers": [{"a": 1}]}})
        )
        .0,
        400
    );
}

// ---------------------------------------------------------------------------------------------
// $patch on objects

#[test]
fn patch_replace_and_delete_on_objects() {
    let d = smp(
        &deployment(),
        json!({"metadata": {"labels": {"$patch": "replace", "new": "x", "gone": null}}}),
    );
    assert_eq!(d["metadata"]["labels"], json!({"new": "x"}));
    let d = smp(
        &deployment(),
        json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "volumeMounts": null}]}}, "strategy": {"$patch": "delete"}}}),
    );
    assert!(d["spec"].get("strategy").is_none());
    assert!(containers(&d)[0].get("volumeMounts").is_none());
    let d = smp(
        &deployment(),
        json!({"spec": {"selector": {"$patch": "replace", "matchLabels": {"app": "v2"}}}}),
    );
    assert_eq!(d["spec"]["selector"], json!({"matchLabels": {"app": "v2"}}));
}

#[test]
fn replace_strategy_fields_are_replaced_whole() {
    let ty = types::for_kind("policy", "v1", "PodDisruptionBudget").unwrap();
    let pdb = json!({"spec": {"minAvailable": 1, "selector": {"matchLabels": {"a": "1"}}}});
    let out = apply(
        &pdb,
        &json!({"spec": {"selector": {"matchLabels": {"b": "2"}}}}),
        ty,
    )
    .unwrap();
    assert_eq!(out["spec"]["selector"], json!({"matchLabels": {"b": "2"}}));
}

// ---------------------------------------------------------------------------------------------
// errors

#[test]
fn malformed_directives_are_bad_requests() {
    let cases = [
        json!({"spec": {"$foo": 1}}),
        json!({"spec": {"$patch": "explode"}}),
        json!({"spec": {"$patch": 1}}),
        json!({"spec": {"template": {"spec": {"containers": [{"image": "no-name"}]}}}}),
        json!({"spec": {"template": {"spec": {"containers": [{"$patch": "delete"}]}}}}),
        json!({"spec": {"template": {"spec": {"containers": ["web"]}}}}),
        json!({"spec": {"template": {"spec": {"containers": [{"$patch": "bogus", "name": "web"}]}}}}),
        json!({"spec": {"template": {"spec": {"$setElementOrder/containers": {"name": "web"}}}}}),
        json!({"spec": {"template": {"spec": {"$setElementOrder/containers": ["web"]}}}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "example.com/a"}}),
        json!({"metadata": {"$deleteFromPrimitiveList/": ["a"]}}),
    ];
    for patch in cases {
        let (code, msg) = smp_err(&deployment(), patch.clone());
        assert_eq!(code, 400, "{patch}: {msg}");
        assert!(msg.starts_with("invalid strategic merge patch"), "{msg}");
    }
    assert_eq!(
        apply(&deployment(), &json!([1]), deployment_type())
            .unwrap_err()
            .code,
        400
    );
}

#[test]
fn patch_that_does_not_fit_the_stored_object_is_unprocessable() {
    let stored = json!({"spec": {"template": {"spec": {"containers": ["not-an-object"]}}}});
    let (code, _) = smp_err(
        &stored,
        json!({"spec": {"template": {"spec": {"containers": [{"name": "web"}]}}}}),
    );
    assert_eq!(code, 422);
    let (code, _) = smp_err(
        &json!({"metadata": {"finalizers": "x"}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}),
    );
    assert_eq!(code, 422);
}

#[test]
fn scale_view_patches() {
    let ty = types::for_kind("autoscaling", "v1", "Scale").unwrap();
    let scale = json!({"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": "web"}, "spec": {"replicas": 2}, "status": {"replicas": 2}});
    let out = apply(&scale, &json!({"spec": {"replicas": 5}}), ty).unwrap();
    assert_eq!(out["spec"]["replicas"], json!(5));
    assert_eq!(out["status"], scale["status"]);
}

// ---------------------------------------------------------------------------------------------
// two-way patches

#[test]
fn two_way_patch_looks_like_kubectls() {
    let a = deployment();
    let mut b = deployment();
    b["spec"]["template"]["spec"]["containers"] = json!([
        {"name": "web", "image": "nginx:1.26", "args": ["-g", "daemon off;"],
         "ports": [{"containerPort": 80, "protocol": "TCP"}],
         "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
         "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}]},
    ]);
    b["spec"]["strategy"] = json!({"type": "Recreate"});
    b["metadata"]["finalizers"] = json!(["example.com/b"]);
    let p = create_two_way(&a, &b, deployment_type());
    assert_eq!(
        p,
        json!({
            "metadata": {
                "$deleteFromPrimitiveList/finalizers": ["example.com/a"],
                "$setElementOrder/finalizers": ["example.com/b"],
            },
            "spec": {
                "strategy": {"type": "Recreate", "rollingUpdate": null, "$retainKeys": ["type"]},
                "template": {"spec": {
                    "containers": [
                        {"name": "web", "image": "nginx:1.26",
                         "ports": [{"containerPort": 443, "$patch": "delete"}],
                         "$setElementOrder/ports": [{"containerPort": 80}]},
                        {"name": "sidecar", "$patch": "delete"},
                    ],
                    "$setElementOrder/containers": [{"name": "web"}],
                }},
            },
        })
    );
    assert_eq!(apply(&a, &p, deployment_type()).unwrap(), b);
    assert_eq!(create_two_way(&a, &a, deployment_type()), json!({}));
}

// ---------------------------------------------------------------------------------------------
// properties

/// Keys that are unknown to the Pod type at every level, plus typed maps and objects without
/// merge lists, so strategic merge patch has nothing to do differently from a merge patch.
const PLAIN_KEYS: &[&str] = &[
    "a",
    "b",
    "c",
    "metadata",
    "spec",
    "labels",
    "annotations",
    "name",
];

/// Random JSON over [`PLAIN_KEYS`]; `nulls` allows `null` (patches may hold it, objects that
/// are compared after patching may not).
fn plain_json(nulls: bool) -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        (-5i64..5).prop_map(|n| json!(n)),
        "[a-c]{0,2}".prop_map(Value::String),
    ];
    let leaf = if nulls {
        prop_oneof![1 => Just(Value::Null), 3 => scalar].boxed()
    } else {
        scalar.boxed()
    };
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(prop::sample::select(PLAIN_KEYS), inner, 0..4).prop_map(
                |m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            ),
        ]
    })
}

fn plain_object(nulls: bool) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(PLAIN_KEYS), plain_json(nulls), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

/// `Some(v)` becomes property `key`.
fn put(obj: &mut serde_json::Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        obj.insert(key.to_string(), v);
    }
}

/// A few distinct names from `pool`, in random order.
fn distinct(pool: &'static [&'static str], max: usize) -> impl Strategy<Value = Vec<&'static str>> {
    prop::sample::subsequence(pool, 0..=max.min(pool.len())).prop_shuffle()
}

fn env_list() -> impl Strategy<Value = Value> {
    distinct(&["A", "B", "C", "D"], 4)
        .prop_flat_map(|names| {
            let n = names.len();
            (
                Just(names),
                prop::collection::vec(
                    prop_oneof![
                        "[xy]{1}".prop_map(|v| json!({"value": v})),
                        Just(json!({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})),
                    ],
                    n,
                ),
            )
        })
        .prop_map(|(names, values)| {
            Value::Array(
                names
                    .into_iter()
                    .zip(values)
                    .map(|(n, mut v)| {
                        v["name"] = json!(n);
                        v
                    })
                    .collect(),
            )
        })
}

fn ports() -> impl Strategy<Value = Value> {
    distinct(&["80", "443", "8080"], 3).prop_flat_map(|ports| {
        let n = ports.len();
        (Just(ports), prop::collection::vec(prop::option::of("[ab]"), n)).prop_map(|(ports, names)| {
            Value::Array(
                ports
                    .into_iter()
                    .zip(names)
                    .map(|(p, name)| {
                        let mut o = json!({"containerPort": p.parse::<u16>().unwrap(), "protocol": "TCP"});
                        if let Some(name) = name {
                            o["name"] = json!(name);
                        }
                        o
                    })
                    .collect(),
            )
        })
    })
}

fn container(name: &'static str) -> impl Strategy<Value = Value> {
    (
        "nginx:1\\.2[5-7]",
        prop::option::of(env_list()),
        prop::option::of(ports()),
        prop::option::of(prop::collection::vec("[a-c]", 0..3)),
        prop::option::of(prop::sample::select(&["1", "2"][..])),
    )
        .prop_map(move |(image, env, ports, args, cpu)| {
            let mut c = serde_json::Map::new();
            c.insert("name".into(), json!(name));
            c.insert("image".into(), json!(image));
            put(&mut c, "env", env);
            put(&mut c, "ports", ports);
            put(&mut c, "args", args.map(|a| json!(a)));
            put(
                &mut c,
                "resources",
                cpu.map(|cpu| json!({"limits": {"cpu": cpu}})),
            );
            Value::Object(c)
        })
}

fn containers_list() -> impl Strategy<Value = Value> {
    distinct(&["web", "side", "log"], 3).prop_flat_map(|names| {
        names
            .into_iter()
            .map(container)
            .collect::<Vec<_>>()
            .prop_map(Value::Array)
    })
}

fn volumes() -> impl Strategy<Value = Value> {
    distinct(&["config", "cache", "data"], 3).prop_flat_map(|names| {
        let n = names.len();
        (
            Just(names),
            prop::collection::vec(
                prop_oneof![
                    Just(json!({"emptyDir": {}})),
                    "[ab]".prop_map(|n| json!({"configMap": {"name": n}})),
                    "[ab]".prop_map(|n| json!({"secret": {"secretName": n}})),
                ],
                n,
            ),
        )
            .prop_map(|(names, sources)| {
                Value::Array(
                    names
                        .into_iter()
                        .zip(sources)
                        .map(|(n, mut s)| {
                            s["name"] = json!(n);
                            s
                        })
                        .collect(),
                )
            })
    })
}

fn deployment_like() -> impl Strategy<Value = Value> {
    (
        (
            prop::option::of(prop::collection::btree_map("[a-c]", "[xy]", 0..3)),
            prop::option::of(distinct(&["f/a", "f/b", "f/c"], 3)),
            prop::option::of(0u8..4),
            prop::option::of(prop_oneof![
                Just(json!({"type": "Recreate"})),
                Just(json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}})),
                Just(json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}})),
            ]),
        ),
        (
            prop::option::of(containers_list()),
            prop::option::of(volumes()),
            prop::option::of(prop::collection::vec(
                prop_oneof![
                    Just(json!({"key": "a", "operator": "Exists"})),
                    Just(json!({"key": "b", "operator": "Exists"}))
                ],
                0..3,
            )),
            prop::option::of(plain_object(false)),
            prop::option::of(prop_oneof![
                Just(json!([{"type": "Available", "status": "True"}])),
                Just(json!([{"type": "Progressing", "status": "True"}, {"type": "Available", "status": "False"}])),
            ]),
        ),
    )
        .prop_map(
            |((labels, finalizers, replicas, strategy), (containers, volumes, tolerations, extra, conditions))| {
                let mut meta = serde_json::Map::new();
                meta.insert("name".into(), json!("web"));
                put(&mut meta, "labels", labels.map(|l| json!(l)));
                put(&mut meta, "finalizers", finalizers.map(|f| json!(f)));
                let mut pod = serde_json::Map::new();
                put(&mut pod, "containers", containers);
                put(&mut pod, "volumes", volumes);
                put(&mut pod, "tolerations", tolerations.map(Value::Array));
                let mut spec = serde_json::Map::new();
                put(&mut spec, "replicas", replicas.map(|r| json!(r)));
                put(&mut spec, "strategy", strategy);
                spec.insert("template".into(), json!({"spec": Value::Object(pod)}));
                put(&mut spec, "x-extra", extra);
                let mut obj = serde_json::Map::new();
                obj.insert("metadata".into(), Value::Object(meta));
                obj.insert("spec".into(), Value::Object(spec));
                put(&mut obj, "status", conditions.map(|c| json!({"conditions": c})));
                Value::Object(obj)
            },
        )
}

proptest! {
    /// Without directives and merge lists, a strategic merge patch is a JSON merge patch.
    #[test]
    fn without_strategies_smp_is_a_merge_patch(original in plain_object(true), patch in plain_object(true)) {
        let smp = apply(&original, &patch, pod_type()).unwrap();
        prop_assert_eq!(smp, merge_patch(&original, &patch));
    }

    /// The two-way patch from `a` to `b` turns `a` into `b`, and is empty when they are equal.
    #[test]
    fn two_way_patch_turns_a_into_b(a in deployment_like(), b in deployment_like()) {
        let patch = create_two_way(&a, &b, deployment_type());
        let out = apply(&a, &patch, deployment_type())
            .map_err(|e| TestCaseError::fail(format!("{}: {patch}", e.message)))?;
        prop_assert_eq!(&out, &b, "patch {}", patch);
        prop_assert_eq!(create_two_way(&b, &b, deployment_type()), json!({}));
    }

    /// The same with untyped JSON (where a two-way patch is a merge patch with nulls).
    #[test]
    fn two_way_patch_of_plain_json(a in plain_object(false), b in plain_object(false)) {
        let patch = create_two_way(&a, &b, pod_type());
        prop_assert_eq!(apply(&a, &patch, pod_type()).unwrap(), b);
    }
}
