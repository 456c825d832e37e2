//! Typed decoding: an object is decoded into its k8s-openapi type to find the fields the type
//! does not know (unknown fields) and the values of the wrong type (type errors).
//!
//! Valid objects decode in one pass straight from the `Value`, noting the keys the decoder
//! passes over. When that fails, the object is rendered with one value per line, the error's
//! line mapped back to a field path, the bad value removed and the decode retried, which yields
//! one cause per bad field.

use k8s_openapi::api;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use setpoint_api::Cause;

/// Decodes into a typed object: `value` straight from a `Value`, noting the keys the
/// decoder passes over (the fast path, for valid objects); `text` from rendered text whose
/// line numbers locate an error, encoding the result back to JSON (the slow path, only when
/// the fast one failed).
#[derive(Clone, Copy)]
pub struct DecodeFn {
    value: fn(&Value) -> Result<Vec<Vec<Seg>>, serde_json::Error>,
    text: fn(&str) -> Result<Value, serde_json::Error>,
    fits: fn(&Value) -> bool,
    /// Whether a `status` value decodes as the kind's status type; `None` for kinds
    /// without one.
    status: Option<fn(&Value) -> bool>,
}

impl DecodeFn {
    fn of<T: DeserializeOwned + Serialize>() -> Self {
        DecodeFn {
            value: passed_over::<T>,
            text: round_trip::<T>,
            fits: |v| T::deserialize(v).is_ok(),
            status: None,
        }
    }

    /// A kind whose `status` has type `S`.
    fn with_status<S: DeserializeOwned>(self) -> Self {
        DecodeFn {
            status: Some(|v| S::deserialize(v).is_ok()),
            ..self
        }
    }

    /// Whether `obj` decodes as the type as it is (apiVersion and kind included).
    pub fn fits(&self, obj: &Value) -> bool {
        (self.fits)(obj)
    }

    /// Whether `obj`'s `status` decodes as the kind's status type (absent or `null` does);
    /// false for a kind without one.
    pub fn status_fits(&self, obj: &Value) -> bool {
        match (self.status, obj.get("status")) {
            (None, _) => false,
            (Some(_), None | Some(Value::Null)) => true,
            (Some(fits), Some(status)) => fits(status),
        }
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(text: &str) -> Result<Value, serde_json::Error> {
    let typed: T = serde_json::from_str(text)?;
    serde_json::to_value(&typed)
}

/// Decodes `v` as `T` and returns the paths of the keys `T` does not know, which its
/// decoder skips.
fn passed_over<T: DeserializeOwned>(v: &Value) -> Result<Vec<Vec<Seg>>, serde_json::Error> {
    let mut skipped = Vec::new();
    let _: T = serde_ignored::deserialize(v, |path| skipped.push(segments(&path)))?;
    Ok(skipped)
}

fn segments(path: &serde_ignored::Path) -> Vec<Seg> {
    let mut out = Vec::new();
    let mut at = path;
    loop {
        at = match at {
            serde_ignored::Path::Root => break,
            serde_ignored::Path::Seq { parent, index } => {
                out.push(Seg::Index(*index));
                parent
            }
            serde_ignored::Path::Map { parent, key } => {
                out.push(Seg::Key(key.clone()));
                parent
            }
            serde_ignored::Path::Some { parent }
            | serde_ignored::Path::NewtypeStruct { parent }
            | serde_ignored::Path::NewtypeVariant { parent } => parent,
        };
    }
    out.reverse();
    out
}

/// The typed schema for a group/version/kind, if k8s-openapi has it.
pub fn decoder(group: &str, version: &str, kind: &str) -> Option<DecodeFn> {
    use api::*;
    let f: DecodeFn = match (group, version, kind) {
        ("", "v1", "Pod") => DecodeFn::of::<core::v1::Pod>().with_status::<core::v1::PodStatus>(),
        ("", "v1", "Service") => {
            DecodeFn::of::<core::v1::Service>().with_status::<core::v1::ServiceStatus>()
        }
        ("", "v1", "ReplicationController") => DecodeFn::of::<core::v1::ReplicationController>()
            .with_status::<core::v1::ReplicationControllerStatus>(
        ),
        ("", "v1", "Namespace") => {
            DecodeFn::of::<core::v1::Namespace>().with_status::<core::v1::NamespaceStatus>()
        }
        ("", "v1", "Node") => {
            DecodeFn::of::<core::v1::Node>().with_status::<core::v1::NodeStatus>()
        }
        ("", "v1", "Endpoints") => DecodeFn::of::<core::v1::Endpoints>(),
        ("", "v1", "ConfigMap") => DecodeFn::of::<core::v1::ConfigMap>(),
        ("", "v1", "Secret") => DecodeFn::of::<core::v1::Secret>(),
        ("", "v1", "ServiceAccount") => DecodeFn::of::<core::v1::ServiceAccount>(),
        ("", "v1", "Event") => DecodeFn::of::<core::v1::Event>(),
        ("", "v1", "ResourceQuota") => {
            DecodeFn::of::<core::v1::ResourceQuota>().with_status::<core::v1::ResourceQuotaStatus>()
        }
        ("", "v1", "LimitRange") => DecodeFn::of::<core::v1::LimitRange>(),
        ("", "v1", "PodTemplate") => DecodeFn::of::<core::v1::PodTemplate>(),
        ("", "v1", "PersistentVolumeClaim") => DecodeFn::of::<core::v1::PersistentVolumeClaim>()
            .with_status::<core::v1::PersistentVolumeClaimStatus>(
        ),
        ("", "v1", "PersistentVolume") => DecodeFn::of::<core::v1::PersistentVolume>()
            .with_status::<core::v1::PersistentVolumeStatus>(),
        ("", "v1", "Binding") => DecodeFn::of::<core::v1::Binding>(),
        ("apps", "v1", "Deployment") => {
            DecodeFn::of::<apps::v1::Deployment>().with_status::<apps::v1::DeploymentStatus>()
        }
        ("apps", "v1", "ReplicaSet") => {
            DecodeFn::of::<apps::v1::ReplicaSet>().with_status::<apps::v1::ReplicaSetStatus>()
        }
        ("apps", "v1", "StatefulSet") => {
            DecodeFn::of::<apps::v1::StatefulSet>().with_status::<apps::v1::StatefulSetStatus>()
        }
        ("apps", "v1", "DaemonSet") => {
            DecodeFn::of::<apps::v1::DaemonSet>().with_status::<apps::v1::DaemonSetStatus>()
        }
        ("apps", "v1", "ControllerRevision") => DecodeFn::of::<apps::v1::ControllerRevision>(),
        ("batch", "v1", "Job") => {
            DecodeFn::of::<batch::v1::Job>().with_status::<batch::v1::JobStatus>()
        }
        ("batch", "v1", "CronJob") => {
            DecodeFn::of::<batch::v1::CronJob>().with_status::<batch::v1::CronJobStatus>()
        }
        ("autoscaling", "v2", "HorizontalPodAutoscaler") => {
            DecodeFn::of::<autoscaling::v2::HorizontalPodAutoscaler>()
                .with_status::<autoscaling::v2::HorizontalPodAutoscalerStatus>()
        }
        ("autoscaling", "v1", "HorizontalPodAutoscaler") => {
            DecodeFn::of::<autoscaling::v1::HorizontalPodAutoscaler>()
                .with_status::<autoscaling::v1::HorizontalPodAutoscalerStatus>()
        }
        ("autoscaling", "v1", "Scale") => DecodeFn::of::<autoscaling::v1::Scale>(),
        ("coordination.k8s.io", "v1", "Lease") => DecodeFn::of::<coordination::v1::Lease>(),
        ("storage.k8s.io", "v1", "StorageClass") => DecodeFn::of::<storage::v1::StorageClass>(),
        ("discovery.k8s.io", "v1", "EndpointSlice") => {
            DecodeFn::of::<discovery::v1::EndpointSlice>()
        }
        ("rbac.authorization.k8s.io", "v1", "Role") => DecodeFn::of::<rbac::v1::Role>(),
        ("rbac.authorization.k8s.io", "v1", "ClusterRole") => {
            DecodeFn::of::<rbac::v1::ClusterRole>()
        }
        ("rbac.authorization.k8s.io", "v1", "RoleBinding") => {
            DecodeFn::of::<rbac::v1::RoleBinding>()
        }
        ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding") => {
            DecodeFn::of::<rbac::v1::ClusterRoleBinding>()
        }
        ("events.k8s.io", "v1", "Event") => DecodeFn::of::<events::v1::Event>(),
        ("policy", "v1", "Eviction") => DecodeFn::of::<policy::v1::Eviction>(),
        ("policy", "v1", "PodDisruptionBudget") => {
            DecodeFn::of::<policy::v1::PodDisruptionBudget>()
                .with_status::<policy::v1::PodDisruptionBudgetStatus>()
        }
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition") => {
            DecodeFn::of::<apiextensions::CustomResourceDefinition>()
                .with_status::<apiextensions::CustomResourceDefinitionStatus>()
        }
        _ => return None,
    };
    Some(f)
}

/// One step of a JSON path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

pub fn path_string(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// JSON text with one member or element per line, and the path each line holds.
pub fn render(v: &Value) -> (String, Vec<Vec<Seg>>) {
    let mut lines: Vec<(String, Vec<Seg>)> = Vec::new();
    emit(v, "", &mut Vec::new(), &mut lines);
    let text = lines
        .iter()
        .map(|(l, _)| l.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    (text, lines.into_iter().map(|(_, p)| p).collect())
}

fn emit(v: &Value, prefix: &str, path: &mut Vec<Seg>, lines: &mut Vec<(String, Vec<Seg>)>) {
    match v {
        Value::Object(m) => {
            lines.push((format!("{prefix}{{"), path.clone()));
            for (i, (k, child)) in m.iter().enumerate() {
                path.push(Seg::Key(k.clone()));
                let key_text = Value::String(k.clone()).to_string();
                emit(child, &format!("{key_text}: "), path, lines);
                path.pop();
                if i + 1 < m.len() {
                    if let Some(last) = lines.last_mut() {
                        last.0.push(',');
                    }
                }
            }
            lines.push(("}".into(), path.clone()));
        }
        Value::Array(a) => {
            lines.push((format!("{prefix}["), path.clone()));
            for (i, child) in a.iter().enumerate() {
                path.push(Seg::Index(i));
                emit(child, "", path, lines);
                path.pop();
                if i + 1 < a.len() {
                    if let Some(last) = lines.last_mut() {
                        last.0.push(',');
                    }
                }
            }
            lines.push(("]".into(), path.clone()));
        }
        scalar => lines.push((format!("{prefix}{scalar}"), path.clone())),
    }
}

fn lookup<'a>(v: &'a Value, path: &[Seg]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, seg| match seg {
        Seg::Key(k) => cur.get(k.as_str()),
        Seg::Index(i) => cur.get(*i),
    })
}

/// Removes the value at `path` so decoding can go on; a bad array element takes its whole
/// array with it (removing one element would renumber the rest). Returns what was removed.
fn remove(v: &mut Value, path: &[Seg]) -> Option<Vec<Seg>> {
    let cut = path.iter().rposition(|s| matches!(s, Seg::Key(_)))?;
    let (parent, last) = (&path[..cut], &path[cut]);
    let Seg::Key(k) = last else { return None };
    let mut cur = v;
    for seg in parent {
        cur = match seg {
            Seg::Key(k) => cur.get_mut(k.as_str())?,
            Seg::Index(i) => cur.get_mut(*i)?,
        };
    }
    cur.as_object_mut()?.remove(k.as_str())?;
    Some(path[..=cut].to_vec())
}

/// Makes serde's wording about Rust types read in API terms.
fn detail(err: &serde_json::Error) -> String {
    let text = err.to_string();
    let text = match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    };
    let mut out = text;
    for (rust, api) in [
        ("expected i32", "expected int32"),
        ("expected i64", "expected int64"),
        ("expected u32", "expected int32"),
        ("expected u64", "expected int64"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("expected a map", "expected an object"),
    ] {
        if let Some(rest) = out.strip_suffix(rust) {
            out = format!("{rest}{api}");
        }
    }
    out
}

pub struct Decoded {
    pub errors: Vec<Cause>,
    /// Paths of the non-null fields the type does not know (none when the object could not
    /// be decoded at all).
    pub unknown: Vec<String>,
    /// Where the fields the type does not know are, `null` ones included.
    pub unknown_at: Vec<Vec<Seg>>,
}

pub fn decode(f: DecodeFn, obj: &Value) -> Decoded {
    // Fast path: a valid object decodes in one pass without rendering text. The typed
    // decoders insist on their own apiVersion/kind, so only take it when those are absent
    // or decode fine; any failure goes to the careful path below.
    if let Ok(skipped) = (f.value)(obj) {
        return Decoded {
            errors: Vec::new(),
            unknown: skipped
                .iter()
                .filter(|p| lookup(obj, p).is_some_and(|v| !v.is_null()))
                .map(|p| path_string(p))
                .collect(),
            unknown_at: skipped,
        };
    }
    let mut work = obj.clone();
    // The typed decoders insist on their own apiVersion/kind; the server has already
    // routed the request, so those two are not this check's business.
    if let Some(m) = work.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
    }
    let mut errors = Vec::new();
    let mut dropped = Vec::new();
    for _ in 0..64 {
        let (text, lines) = render(&work);
        let err = match (f.text)(&text) {
            Ok(round_trip) => {
                // Keys of the original that did not survive the round trip are unknown.
                let mut unknown = Vec::new();
                let mut at = Vec::new();
                unknown_at(
                    obj,
                    &round_trip,
                    &mut Vec::new(),
                    &dropped,
                    &mut unknown,
                    &mut at,
                );
                return Decoded {
                    errors,
                    unknown,
                    unknown_at: at,
                };
            }
            Err(err) => err,
        };
        let mut path = err
            .line()
            .checked_sub(1)
            .and_then(|l| lines.get(l))
            .cloned()
            .unwrap_or_default();
        // A struct given an array (or a list given a map) is reported after its opening
        // bracket, on the first member's line: blame the container instead.
        let message = err.to_string();
        let (want_seq, want_map) = (
            message.contains("invalid type: sequence"),
            message.contains("invalid type: map"),
        );
        if want_seq || want_map {
            loop {
                let v = lookup(&work, &path);
                let fits = (want_seq && v.is_some_and(Value::is_array))
                    || (want_map && v.is_some_and(Value::is_object));
                if fits || path.pop().is_none() {
                    break;
                }
            }
        }
        let bad = lookup(&work, &path).cloned().unwrap_or(Value::Null);
        errors.push(Cause::invalid(path_string(&path), &bad, &detail(&err)));
        match remove(&mut work, &path) {
            Some(removed) => dropped.push(path_string(&removed)),
            None => break,
        }
    }
    Decoded {
        errors,
        unknown: Vec::new(),
        unknown_at: Vec::new(),
    }
}

/// The unknown fields of a valid `obj` found the slow path's way: keys of the original
/// missing from its typed round trip (the reference the fast path is tested against).
#[cfg(test)]
pub fn unknown_by_round_trip<T: DeserializeOwned + Serialize>(obj: &Value) -> Vec<String> {
    let round_trip = serde_json::to_value(T::deserialize(obj).expect("valid")).unwrap();
    let mut out = Vec::new();
    unknown_at(
        obj,
        &round_trip,
        &mut Vec::new(),
        &[],
        &mut out,
        &mut Vec::new(),
    );
    out
}

/// Collects keys of `orig` missing from `typed` (the typed round trip), as path strings
/// (`out`) and as paths (`at`), with one path buffer for the whole walk (a path is copied
/// only when it is reported). `null` values set nothing and are not reported.
fn unknown_at(
    orig: &Value,
    typed: &Value,
    path: &mut Vec<Seg>,
    dropped: &[String],
    out: &mut Vec<String>,
    at: &mut Vec<Vec<Seg>>,
) {
    match (orig, typed) {
        (Value::Object(o), Value::Object(t)) => {
            for (k, v) in o {
                path.push(Seg::Key(k.clone()));
                let was_dropped =
                    !dropped.is_empty() && dropped.iter().any(|d| *d == path_string(path));
                if !v.is_null() && !was_dropped {
                    match t.get(k) {
                        None => {
                            out.push(path_string(path));
                            at.push(path.clone());
                        }
                        Some(tv) => unknown_at(v, tv, path, dropped, out, at),
                    }
                }
                path.pop();
            }
        }
        (Value::Array(o), Value::Array(t)) => {
            for (i, (v, tv)) in o.iter().zip(t).enumerate() {
                path.push(Seg::Index(i));
                unknown_at(v, tv, path, dropped, out, at);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, deployment, fields, find, pod, small_json};
    use crate::validation::{status_type_errors, type_errors, unknown_fields, validate};
    use serde_json::json;

    #[test]
    fn type_errors_name_their_fields() {
        let mut d = deployment();
        d["spec"]["replicas"] = json!("3");
        d["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = json!("80");
        d["spec"]["paused"] = json!("yes");
        let causes = check("apps", "v1", "Deployment", d.clone());
        let c = find(&causes, "spec.replicas");
        assert_eq!(
            c.message,
            "Invalid value: \"3\": invalid type: string \"3\", expected int32"
        );
        find(
            &causes,
            "spec.template.spec.containers[0].ports[0].containerPort",
        );
        find(&causes, "spec.paused");
        // A bad value is a type error, not an unknown field.
        assert_eq!(
            unknown_fields("apps", "v1", "Deployment", &d),
            Vec::<String>::new()
        );
    }

    #[test]
    fn wrong_container_types_blame_the_container() {
        let mut d = deployment();
        d["spec"]["selector"] = json!([{"matchLabels": {"app": "web"}}]);
        d["spec"]["template"]["spec"]["containers"] = json!({"name": "a", "image": "b"});
        let causes = check("apps", "v1", "Deployment", d);
        assert_eq!(
            fields(&causes),
            vec!["spec.selector", "spec.template.spec.containers"],
            "{causes:?}"
        );
        assert!(causes[0].message.contains("invalid type: sequence"));
        let causes = validate("", "v1", "Pod", &json!([1, 2]), None);
        assert_eq!(causes[0].field, "");
    }

    #[test]
    fn status_writes_decode_only_the_status() {
        let mut p = pod();
        p["status"] = json!({"phase": "Running", "podIP": "10.0.0.1"});
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        p.as_object_mut().unwrap().remove("status");
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        // A wrong status is reported with its path, by the whole decode.
        p["status"] = json!({"phase": "Running", "containerStatuses": {"name": "a"}});
        let causes = status_type_errors("", "v1", "Pod", &p);
        find(&causes, "status.containerStatuses");
        p["status"] = json!(["Running"]);
        find(&status_type_errors("", "v1", "Pod", &p), "status");
        // What a status write copies from the stored object is not decoded again.
        p["status"] = json!({"phase": "Running"});
        p["spec"]["containers"][0]["args"] = json!(["ok", 5]);
        assert!(status_type_errors("", "v1", "Pod", &p).is_empty());
        assert!(!type_errors("", "v1", "Pod", &p).is_empty());
        // Kinds without a typed status are decoded whole.
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "d"}, "data": {"k": 5}});
        find(&status_type_errors("", "v1", "ConfigMap", &cm), "data.k");
        cm["data"] = json!({"k": "v"});
        assert!(status_type_errors("", "v1", "ConfigMap", &cm).is_empty());
    }

    #[test]
    fn type_error_in_array_element() {
        let mut p = pod();
        p["spec"]["containers"][0]["args"] = json!(["ok", 5]);
        p["spec"]["containers"][0]["imagee"] = json!("typo");
        let causes = check("", "v1", "Pod", p.clone());
        let c = find(&causes, "spec.containers[0].args[1]");
        assert!(c.message.contains("expected a string"), "{}", c.message);
        assert_eq!(
            unknown_fields("", "v1", "Pod", &p),
            vec!["spec.containers[0].imagee".to_string()]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// The keys the decoder passes over are the keys the round trip loses, wherever
        /// unknown keys (with any values, null included) are put.
        #[test]
        fn passed_over_keys_are_the_keys_a_round_trip_loses(
            extra in proptest::collection::vec(
                (0..8usize, proptest::sample::select(vec!["foo", "imagee", "name", "x.y"]), small_json()),
                0..6,
            )
        ) {
            use k8s_openapi::api::apps::v1::Deployment;
            use serde::Deserialize;
            let mut d = deployment();
            let places = [
                "", "/metadata", "/spec", "/spec/strategy", "/spec/template/metadata",
                "/spec/template/spec/containers/0", "/spec/template/spec/volumes/0/emptyDir",
                "/spec/template/spec/containers/0/ports/0",
            ];
            for (at, key, value) in extra {
                if let Some(obj) = d.pointer_mut(places[at]).and_then(Value::as_object_mut) {
                    // A known key keeps a value of its own type, so the object stays valid.
                    if !obj.contains_key(key) {
                        obj.insert(key.to_string(), value);
                    }
                }
            }
            if Deployment::deserialize(&d).is_err() {
                return Ok(());
            }
            proptest::prop_assert_eq!(
                unknown_fields("apps", "v1", "Deployment", &d),
                unknown_by_round_trip::<Deployment>(&d)
            );
        }
    }

    #[test]
    fn unknown_fields_at_several_depths() {
        let mut d = deployment();
        d["spec"]["foo"] = json!(1);
        d["spec"]["template"]["spec"]["containers"][0]["imagee"] = json!("nginx");
        d["spec"]["template"]["metadata"]["lables"] = json!({"a": "b"});
        d["metadata"]["labelz"] = json!({});
        d["spec"]["strategy"]["rollingUpdate"] = json!({"maxSurge": 1, "maxSurgee": 2});
        d["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizelimit"] = json!("1Gi");
        d["topLevel"] = json!([]);
        d["spec"]["ignored"] = Value::Null;
        let mut got = unknown_fields("apps", "v1", "Deployment", &d);
        got.sort();
        assert_eq!(
            got,
            vec![
                "metadata.labelz",
                "spec.foo",
                "spec.strategy.rollingUpdate.maxSurgee",
                "spec.template.metadata.lables",
                "spec.template.spec.containers[0].imagee",
                "spec.template.spec.volumes[0].emptyDir.sizelimit",
                "topLevel",
            ]
        );
        assert!(unknown_fields("example.com", "v1", "Widget", &d).is_empty());
    }

    #[test]
    fn empty_objects_and_lists_are_known() {
        let p = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {}, "annotations": {}, "finalizers": [], "ownerReferences": []},
            "spec": {"containers": [{"name": "a", "image": "b", "resources": {}, "env": [], "securityContext": {}, "args": []}],
                     "securityContext": {}, "tolerations": [], "volumes": [], "affinity": {}},
            "status": {"conditions": [], "containerStatuses": []}
        });
        assert_eq!(unknown_fields("", "v1", "Pod", &p), Vec::<String>::new());
    }

    #[test]
    fn kopf_event_timestamps_decode() {
        let ev = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "kopf-event-", "namespace": "default"},
            "action": "Action", "reason": "Logging", "type": "Normal", "message": "hi",
            "reportingComponent": "kopf", "reportingInstance": "dev", "source": {"component": "kopf"},
            "firstTimestamp": "2026-11-22T01:19:32.636911+00:00",
            "lastTimestamp": "2026-11-22T01:19:32.636911+00:00",
            "eventTime": "2026-11-22T01:19:32.636911+00:00",
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "namespace": "default"}
        });
        assert_eq!(validate("", "v1", "Event", &ev, None), vec![]);
        assert!(unknown_fields("", "v1", "Event", &ev).is_empty());
    }

    #[test]
    fn render_maps_lines_to_paths() {
        let v = json!({"a": {"b": [1, {"c": "x"}]}, "d": true});
        let (text, lines) = render(&v);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
        let paths: Vec<String> = lines.iter().map(|p| path_string(p)).collect();
        let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap();
        assert_eq!(paths[line_of("\"c\"")], "a.b[1].c");
        assert_eq!(paths[line_of("true")], "d");
    }
}
