//! What the unit tests of validation share: checking an object as the server does on create
//! or update, finding causes by field, and valid sample objects.

use serde_json::{json, Value};
use setpoint_api::Cause;

use super::validate;
use crate::defaults;

pub(super) fn small_json() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        (0i64..3).prop_map(Value::from),
        proptest::sample::select(vec!["a", "b"]).prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map(
                proptest::sample::select(vec!["x", "y", "z"]),
                inner,
                0..3
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

/// Defaults then validates, as the server does on create.
pub(super) fn check(group: &str, version: &str, kind: &str, mut obj: Value) -> Vec<Cause> {
    defaults::apply(group, kind, &mut obj);
    validate(group, version, kind, &obj, None)
}

pub(super) fn check_update(
    group: &str,
    version: &str,
    kind: &str,
    mut old: Value,
    mut new: Value,
) -> Vec<Cause> {
    defaults::apply(group, kind, &mut old);
    defaults::apply(group, kind, &mut new);
    validate(group, version, kind, &new, Some(&old))
}

pub(super) fn fields(causes: &[Cause]) -> Vec<&str> {
    causes.iter().map(|c| c.field.as_str()).collect()
}

pub(super) fn find<'a>(causes: &'a [Cause], field: &str) -> &'a Cause {
    causes
        .iter()
        .find(|c| c.field == field)
        .unwrap_or_else(|| panic!("no cause on {field}: {causes:?}"))
}

pub(super) fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}, "creationTimestamp": null},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {},
            "template": {
                "metadata": {"labels": {"app": "web"}, "creationTimestamp": null},
                "spec": {"containers": [{
                    "name": "nginx",
                    "image": "nginx:1.25",
                    "ports": [{"containerPort": 80, "name": "http"}],
                    "resources": {"limits": {"cpu": "1", "memory": "128Mi"}, "requests": {"cpu": 0.5}},
                    "readinessProbe": {"httpGet": {"port": "http", "path": "/"}},
                    "env": [{"name": "A", "value": "b"}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                }], "volumes": [{"name": "data", "emptyDir": {}}]}
            }
        },
        "status": {}
    })
}

pub(super) fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p1", "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36", "ports": [{"containerPort": 8080}]}]},
        "status": {}
    })
}
