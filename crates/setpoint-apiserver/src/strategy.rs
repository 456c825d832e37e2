//! Per-kind rules of the generic write path, as upstream's registry strategies hold them: the
//! fields the server owns (what create sets, what update keeps from the stored object, which
//! part a subresource may change, when `metadata.generation` moves) and how deletion goes
//! (which objects may not be deleted, graceful deletion, what waits for finalization).
//!
//! The write path in [`crate::objects`] names no kind; it asks here.

use serde_json::{json, Map, Value};
use setpoint_api::meta;
use setpoint_api::ApiError;

use crate::registry::ResourceDef;

/// Which view of an object a write goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// The object itself.
    Main,
    /// `/status`: only `.status` changes.
    Status,
    /// `/scale`: only `spec.replicas` changes, through an autoscaling/v1 Scale.
    Scale,
    /// `/finalize` on namespaces: only `spec.finalizers` changes.
    Finalize,
    /// `/approval` on CertificateSigningRequests: only `status.conditions` change.
    Approval,
}

impl View {
    pub fn parse(res: &ResourceDef, sub: Option<&str>) -> Result<View, ApiError> {
        match sub {
            None => Ok(View::Main),
            Some("status") if res.status => Ok(View::Status),
            Some("scale") if res.scale => Ok(View::Scale),
            Some("finalize") if res.group.is_empty() && res.plural == "namespaces" => {
                Ok(View::Finalize)
            }
            Some("approval") if crate::certificates::is_csr(res) => Ok(View::Approval),
            _ => Err(ApiError::not_found_path()),
        }
    }
    pub fn name(self) -> Option<&'static str> {
        match self {
            View::Main => None,
            View::Status => Some("status"),
            View::Scale => Some("scale"),
            View::Finalize => Some("finalize"),
            View::Approval => Some("approval"),
        }
    }
}

fn is(res: &ResourceDef, group: &str, plural: &str) -> bool {
    res.group == group && res.plural == plural
}

/// Sets the server-owned fields of a new object and resets what clients may not set.
pub fn prepare_for_create(res: &ResourceDef, obj: &mut Value, now: &str) {
    let m = meta::metadata_mut(obj);
    m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    m.insert("creationTimestamp".into(), json!(now));
    for f in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        m.remove(f);
    }
    if res.generation {
        m.insert("generation".into(), json!(1));
    } else {
        m.remove("generation");
    }
    if res.status && !is(res, "", "nodes") {
        // Status is written by controllers through /status, never by the creator.
        let status = if is(res, "", "pods") {
            pod_initial_status(obj)
        } else {
            json!({})
        };
        obj.as_object_mut()
            .expect("object")
            .insert("status".into(), status);
    }
    if is(res, "apps", "daemonsets") {
        set_template_generation(obj, 1);
    }
}

/// The annotation a DaemonSet's template generation is kept in (apps/v1 has no
/// `spec.templateGeneration`; upstream's API server converts it to and from this annotation).
/// The DaemonSet controller copies it to its pods' `pod-template-generation` label.
pub const DAEMONSET_TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

fn template_generation(ds: &Value) -> i64 {
    ds.pointer("/metadata/annotations")
        .and_then(|a| a.get(DAEMONSET_TEMPLATE_GENERATION))
        .and_then(Value::as_str)
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

fn set_template_generation(ds: &mut Value, generation: i64) {
    let m = meta::metadata_mut(ds);
    let annotations = m.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations.as_object_mut().expect("an object").insert(
        DAEMONSET_TEMPLATE_GENERATION.into(),
        json!(generation.to_string()),
    );
}

/// Sets what a kind derives from a new object's final name and uid, once generateName has
/// been resolved: a Job's selector and its pods' `controller-uid`/`job-name` labels (upstream's
/// Job strategy does this on create unless `spec.manualSelector` is true).
pub fn prepare_named(res: &ResourceDef, obj: &mut Value) {
    if is(res, "batch", "jobs") {
        let uid = meta::uid(obj).to_string();
        setpoint_kinds::defaults::job_selector(obj, &uid);
    }
}

/// A new pod's status: `Pending` with its QoS class.
fn pod_initial_status(pod: &Value) -> Value {
    json!({"phase": "Pending", "qosClass": qos_class(pod)})
}

/// The pod's QoS class ([`setpoint_api::qos::of_pod`]).
pub fn qos_class(pod: &Value) -> &'static str {
    setpoint_api::qos::of_pod(pod)
}

/// Keeps the server-owned fields of `old` in an update through the main resource, ignores
/// status for kinds with a status subresource, and bumps the generation on spec changes.
pub fn prepare_for_update(res: &ResourceDef, new: &mut Value, old: &Value) {
    let old_meta = meta::metadata(old).cloned().unwrap_or_default();
    {
        let m = meta::metadata_mut(new);
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old_meta.get(f) {
                Some(v) => m.insert(f.into(), v.clone()),
                None => m.remove(f),
            };
        }
        m.remove("selfLink");
    }
    let obj = new.as_object_mut().expect("object");
    if res.status {
        match old.get("status") {
            Some(s) => obj.insert("status".into(), s.clone()),
            None => obj.remove("status"),
        };
    }
    if is(res, "", "namespaces") {
        // spec.finalizers change only through /finalize.
        let fins = old.pointer("/spec/finalizers").cloned();
        let spec = obj.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            match fins {
                Some(f) => spec.insert("finalizers".into(), f),
                None => spec.remove("finalizers"),
            };
        }
    }
    crate::certificates::prepare_for_update(res, new, old);
    if is(res, "apps", "daemonsets") {
        // Only the server moves it: one more when the pod template changed, as upstream.
        let mut generation = template_generation(old);
        let template = |ds: &Value| ds.pointer("/spec/template").cloned().unwrap_or(Value::Null);
        if !same_ignoring_nulls(&template(new), &template(old)) {
            generation += 1;
        }
        set_template_generation(new, generation);
    }
    bump_generation(res, new, old);
}

/// Increments `metadata.generation` when anything outside metadata and status changed.
pub fn bump_generation(res: &ResourceDef, new: &mut Value, old: &Value) {
    if !res.generation {
        return;
    }
    if !same_ignoring_nulls(&Value::Object(spec_of(new)), &Value::Object(spec_of(old))) {
        let g = meta::generation(old) + 1;
        meta::set_meta(new, "generation", json!(g));
    }
}

/// Whether two values are equal once object members whose value is `null` are taken as
/// absent, as upstream compares specs: both decode to the same Go value (a template's
/// `creationTimestamp: null`, which typed clients leave out, is no change).
fn same_ignoring_nulls(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let present = |m: &Map<String, Value>| m.values().filter(|v| !v.is_null()).count();
            present(x) == present(y)
                && x.iter()
                    .filter(|(_, v)| !v.is_null())
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_ignoring_nulls(v, w)))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(v, w)| same_ignoring_nulls(v, w))
        }
        _ => a == b,
    }
}

/// Everything but `metadata`, `status`, `apiVersion` and `kind`.
fn spec_of(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Builds the stored object for a `/status` write: the stored object with the new status.
///
/// Without `keep_managed_fields`, `metadata.managedFields` is left `null` (in its place, so
/// the key order stays): the caller records field ownership afresh from `old`'s entries, so
/// copying them here would be wasted work on every status write.
pub fn apply_status(old: &Value, new: &Value, keep_managed_fields: bool) -> Value {
    let Some(fields) = old.as_object() else {
        return old.clone();
    };
    let mut out = Map::with_capacity(fields.len() + 1);
    let mut status = new.get("status");
    for (k, v) in fields {
        match k.as_str() {
            // The old status is replaced, so it is not copied.
            "status" => {
                if let Some(s) = status.take() {
                    out.insert(k.clone(), s.clone());
                }
            }
            "metadata" if !keep_managed_fields => {
                let meta = match v.as_object() {
                    Some(m) => Value::Object(
                        m.iter()
                            .map(|(k, v)| match k.as_str() {
                                "managedFields" => (k.clone(), Value::Null),
                                _ => (k.clone(), v.clone()),
                            })
                            .collect(),
                    ),
                    None => v.clone(),
                };
                out.insert(k.clone(), meta);
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(s) = status {
        out.insert("status".into(), s.clone());
    }
    let mut out = Value::Object(out);
    copy_resource_version(&mut out, new);
    out
}

/// Builds the stored namespace for a `/finalize` write.
pub fn apply_finalize(old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    let fins = new
        .pointer("/spec/finalizers")
        .cloned()
        .unwrap_or_else(|| json!([]));
    if let Some(obj) = out.as_object_mut() {
        let spec = obj.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            spec.insert("finalizers".into(), fins);
        }
    }
    copy_resource_version(&mut out, new);
    out
}

fn copy_resource_version(out: &mut Value, new: &Value) {
    let rv = meta::resource_version(new);
    if !rv.is_empty() {
        meta::set_meta(out, "resourceVersion", json!(rv));
    }
}

/// The autoscaling/v1 Scale view of an object with a scale subresource.
pub fn scale_of(res: &ResourceDef, obj: &Value) -> Value {
    let m = meta::metadata(obj).cloned().unwrap_or_default();
    let mut sm = Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = m.get(f) {
            sm.insert(f.into(), v.clone());
        }
    }
    let paths = res.custom.as_ref().and_then(|c| c.scale.as_ref());
    let replicas = obj
        .pointer(paths.map_or("/spec/replicas", |p| p.spec_replicas.as_str()))
        .and_then(Value::as_i64)
        .unwrap_or(if paths.is_some() { 0 } else { 1 });
    let status_replicas = obj
        .pointer(paths.map_or("/status/replicas", |p| p.status_replicas.as_str()))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    // A custom resource names a field holding its selector already serialized.
    let custom_selector = paths.map(|p| {
        p.label_selector
            .as_deref()
            .and_then(|ptr| obj.pointer(ptr))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    });
    let selector = custom_selector.unwrap_or_else(|| {
        obj.pointer("/spec/selector")
            .map(|s| {
                if res.plural == "replicationcontrollers" {
                    // RC selectors are plain maps.
                    s.as_object()
                        .map(|m| {
                            let mut parts: Vec<String> = m
                                .iter()
                                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                                .collect();
                            parts.sort();
                            parts.join(",")
                        })
                        .unwrap_or_default()
                } else {
                    setpoint_api::selector::LabelSelector::from_label_selector_json(s)
                        .map(|s| s.to_string())
                        .unwrap_or_default()
                }
            })
            .unwrap_or_default()
    });
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": Value::Object(sm),
        "spec": {"replicas": replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    })
}

/// Applies a Scale write to the stored object: only `spec.replicas` changes.
pub fn apply_scale(res: &ResourceDef, old: &Value, scale: &Value) -> Result<Value, ApiError> {
    let name = meta::name(old);
    let replicas = scale.pointer("/spec/replicas");
    let n = match replicas {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::invalid(
                "autoscaling",
                "Scale",
                name,
                vec![setpoint_api::Cause::invalid(
                    "spec.replicas",
                    v,
                    "must be an integer",
                )],
            )
        })?,
    };
    if n < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            vec![setpoint_api::Cause::invalid(
                "spec.replicas",
                &json!(n),
                "must be greater than or equal to 0",
            )],
        ));
    }
    let mut out = old.clone();
    let pointer = res
        .custom
        .as_ref()
        .and_then(|c| c.scale.as_ref())
        .map_or("/spec/replicas", |p| p.spec_replicas.as_str());
    set_pointer(&mut out, pointer, json!(n));
    copy_resource_version(&mut out, scale);
    bump_generation(res, &mut out, old);
    Ok(out)
}

/// Sets the field at a JSON pointer, creating the objects on the way.
fn set_pointer(obj: &mut Value, pointer: &str, value: Value) {
    let mut cur = obj;
    let segments: Vec<&str> = pointer.trim_start_matches('/').split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        if !cur.is_object() {
            *cur = json!({});
        }
        let map = cur.as_object_mut().expect("made an object above");
        if i == segments.len() - 1 {
            map.insert((*seg).to_string(), value);
            return;
        }
        cur = map.entry((*seg).to_string()).or_insert_with(|| json!({}));
    }
}

/// Whether a stored object that is being deleted can go now: no finalizers left (for
/// namespaces also no `spec.finalizers`) and no grace period still running.
pub fn ready_to_remove(obj: &Value) -> bool {
    if meta::deletion_timestamp(obj).is_none() || !meta::finalizers(obj).is_empty() {
        return false;
    }
    if obj
        .pointer("/spec/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
        && obj.get("kind").and_then(Value::as_str) == Some("Namespace")
    {
        return false;
    }
    let grace = meta::metadata(obj)
        .and_then(|m| m.get("deletionGracePeriodSeconds"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    grace == 0
}

/// Namespaces the API server refuses to delete: the immortal namespaces kube-apiserver's
/// NamespaceLifecycle admission registers (still these three in 1.32). `kube-node-lease` is
/// not among them there, so it may be deleted here too.
pub const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// Refuses the deletion of what the cluster cannot do without: its own namespaces.
pub fn check_delete(res: &ResourceDef, name: &str) -> Result<(), ApiError> {
    if is(res, "", "namespaces") && IMMORTAL_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden(
            &res.group_resource(),
            name,
            "this namespace may not be deleted",
        ));
    }
    Ok(())
}

/// How many seconds a deleted object stays for its owner to stop it (upstream's
/// `CheckGracefulDelete`); 0 deletes it at once. Only pods are deleted gracefully: one bound
/// to a node stays while its node agent stops the containers, for the requested period or
/// else its `terminationGracePeriodSeconds` (default 30); one that never ran, or has
/// finished, goes at once.
pub fn grace_period(res: &ResourceDef, obj: &Value, requested: Option<i64>) -> i64 {
    if !is(res, "", "pods") {
        return 0;
    }
    let bound = obj
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = obj
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let default = obj
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let g = requested.unwrap_or(default).max(0);
    // Kubernetes treats 0 as "now" and anything positive as at least one second.
    if g == 0 {
        0
    } else {
        g.max(1)
    }
}

/// Whether a deleted object waits for finalizers beyond `metadata.finalizers`: a namespace
/// with `spec.finalizers` stays until the namespace controller has emptied it.
pub fn awaits_finalization(res: &ResourceDef, obj: &Value) -> bool {
    is(res, "", "namespaces")
        && obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
}

/// What marking an object for deletion changes beyond its metadata: a namespace's
/// `status.phase` becomes `Terminating`.
pub fn mark_terminating(res: &ResourceDef, obj: &mut Value) {
    if !is(res, "", "namespaces") {
        return;
    }
    if let Some(obj) = obj.as_object_mut() {
        let status = obj.entry("status").or_insert_with(|| json!({}));
        if let Some(s) = status.as_object_mut() {
            s.insert("phase".into(), json!("Terminating"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn a_daemonsets_template_generation_moves_with_its_template_only() {
        let res = crate::registry::Registry::builtin()
            .get("apps", "v1", "daemonsets")
            .cloned()
            .unwrap();
        let mut ds = json!({"metadata": {"name": "d", "annotations": {
                DAEMONSET_TEMPLATE_GENERATION: "9"}},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"image": "a"}]}}}});
        prepare_for_create(&res, &mut ds, "2026-01-01T00:00:00Z");
        assert_eq!(template_generation(&ds), 1);
        let mut other = ds.clone();
        other["spec"]["minReadySeconds"] = json!(5);
        prepare_for_update(&res, &mut other, &ds);
        assert_eq!(template_generation(&other), 1);
        assert_eq!(meta::generation(&other), 2);
        let mut image = other.clone();
        image["spec"]["template"]["spec"]["containers"][0]["image"] = json!("b");
        // A client cannot set it.
        set_template_generation(&mut image, 7);
        prepare_for_update(&res, &mut image, &other);
        assert_eq!(template_generation(&image), 2);
    }

    #[test]
    fn only_bound_running_pods_are_deleted_gracefully() {
        let reg = Registry::builtin();
        let pods = reg.get("", "v1", "pods").unwrap();
        let running = json!({"spec": {"nodeName": "n", "terminationGracePeriodSeconds": 12}, "status": {"phase": "Running"}});
        assert_eq!(grace_period(pods, &running, None), 12);
        assert_eq!(grace_period(pods, &running, Some(0)), 0);
        assert_eq!(grace_period(pods, &running, Some(-5)), 0);
        assert_eq!(grace_period(pods, &running, Some(3)), 3);
        let defaulted = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Running"}});
        assert_eq!(grace_period(pods, &defaulted, None), 30);
        let unbound = json!({"spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(grace_period(pods, &unbound, Some(10)), 0);
        let finished = json!({"spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}});
        assert_eq!(grace_period(pods, &finished, None), 0);
        let deployments = reg.get("apps", "v1", "deployments").unwrap();
        assert_eq!(grace_period(deployments, &running, None), 0);
    }

    #[test]
    fn the_clusters_own_namespaces_are_not_deleted() {
        let reg = Registry::builtin();
        let ns = reg.get("", "v1", "namespaces").unwrap();
        let e = check_delete(ns, "kube-system").unwrap_err();
        assert_eq!(e.code, 403);
        assert!(check_delete(ns, "kube-node-lease").is_ok());
        assert!(check_delete(ns, "team-a").is_ok());
        let cms = reg.get("", "v1", "configmaps").unwrap();
        assert!(check_delete(cms, "kube-system").is_ok());
    }

    #[test]
    fn namespaces_wait_for_their_spec_finalizers() {
        let reg = Registry::builtin();
        let ns = reg.get("", "v1", "namespaces").unwrap();
        let with = json!({"spec": {"finalizers": ["kubernetes"]}});
        assert!(awaits_finalization(ns, &with));
        assert!(!awaits_finalization(
            ns,
            &json!({"spec": {"finalizers": []}})
        ));
        let cms = reg.get("", "v1", "configmaps").unwrap();
        assert!(!awaits_finalization(cms, &with));
        let mut obj = json!({"metadata": {"name": "a"}});
        mark_terminating(ns, &mut obj);
        assert_eq!(obj["status"]["phase"], "Terminating");
        let mut cm = json!({"metadata": {"name": "a"}});
        mark_terminating(cms, &mut cm);
        assert!(cm.get("status").is_none());
    }

    #[test]
    fn a_null_member_is_no_spec_change() {
        let reg = Registry::builtin();
        let res = reg.get("apps", "v1", "deployments").unwrap();
        let old = json!({"metadata": {"name": "a", "generation": 1}, "spec": {"template": {"metadata": {"creationTimestamp": null, "labels": {"app": "a"}}}}});
        let mut typed = json!({"metadata": {"name": "a"}, "spec": {"template": {"metadata": {"labels": {"app": "a"}}}}});
        bump_generation(res, &mut typed, &old);
        assert_eq!(
            meta::generation(&typed),
            0,
            "generation untouched: no spec change"
        );
        let mut changed = json!({"metadata": {"name": "a"}, "spec": {"template": {"metadata": {"labels": {"app": "b"}}}}});
        bump_generation(res, &mut changed, &old);
        assert_eq!(meta::generation(&changed), 2);
        assert!(!same_ignoring_nulls(
            &json!({"a": [1, null]}),
            &json!({"a": [1]})
        ));
        assert!(same_ignoring_nulls(
            &json!({"a": {"b": null}}),
            &json!({"a": {}})
        ));
    }

    #[test]
    fn generation_moves_on_spec_changes_only() {
        let reg = Registry::builtin();
        let res = reg.get("apps", "v1", "deployments").unwrap();
        let old = json!({"metadata": {"name": "a", "generation": 1, "labels": {"x": "1"}}, "spec": {"replicas": 1}, "status": {"replicas": 0}});
        let mut same = json!({"metadata": {"name": "a", "labels": {"x": "2"}}, "spec": {"replicas": 1}, "status": {"replicas": 7}});
        prepare_for_update(res, &mut same, &old);
        assert_eq!(meta::generation(&same), 1);
        assert_eq!(same["status"]["replicas"], 0, "main writes ignore status");
        let mut changed = json!({"metadata": {"name": "a"}, "spec": {"replicas": 3}});
        prepare_for_update(res, &mut changed, &old);
        assert_eq!(meta::generation(&changed), 2);
    }

    #[test]
    fn qos_classes() {
        assert_eq!(
            qos_class(&json!({"spec": {"containers": [{"name": "a"}]}})),
            "BestEffort"
        );
        assert_eq!(
            qos_class(
                &json!({"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}})
            ),
            "Guaranteed"
        );
        assert_eq!(
            qos_class(
                &json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}})
            ),
            "Burstable"
        );
        // Only CPU and memory count: the node agent reports the same class (same rule).
        assert_eq!(
            qos_class(
                &json!({"spec": {"containers": [{"resources": {"requests": {"ephemeral-storage": "1Gi"}}}]}})
            ),
            "BestEffort"
        );
    }

    #[test]
    fn scale_writes_only_replicas() {
        let reg = Registry::builtin();
        let res = reg.get("apps", "v1", "deployments").unwrap();
        let old = json!({"metadata": {"name": "a", "generation": 1, "resourceVersion": "5"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "a"}}}});
        let scale = scale_of(res, &old);
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["status"]["selector"], "app=a");
        let out = apply_scale(res, &old, &json!({"spec": {"replicas": 5}})).unwrap();
        assert_eq!(out["spec"]["replicas"], 5);
        assert_eq!(meta::generation(&out), 2);
        assert!(apply_scale(res, &old, &json!({"spec": {"replicas": -1}})).is_err());
    }
}
