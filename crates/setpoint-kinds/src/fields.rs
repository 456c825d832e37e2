//! Fields each kind supports in field selectors (`?fieldSelector=status.phase=Running`), and their
//! values, as Kubernetes 1.32 defines them.
//!
//! Upstream has two layers: a per-version list of the field labels a request may use (anything
//! else is a 400 Bad Request), and a per-kind set of values the selector is matched against.
//! A label may be accepted without having a value (Pod `status.podIPs`, StatefulSet
//! `status.successful`); such a field reads as `""`, so only `field=` or `field!=x` match it.
//! events.k8s.io uses its own names (`regarding.name`, `reportingController`) for a subset of
//! the core event fields.

use serde_json::Value;

use crate::tables::EventView;

/// What every namespaced kind without its own list accepts.
const META: &[&str] = &["metadata.name", "metadata.namespace"];

const POD: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
    // The pre-1.0 name of spec.nodeName, still accepted.
    "spec.host",
];

const CORE_EVENT: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENTS_K8S_IO_EVENT: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

/// The field labels a kind accepts in a field selector.
pub fn supported_fields(group: &str, kind: &str) -> &'static [&'static str] {
    match (group, kind) {
        ("", "Pod") => POD,
        ("", "Event") => CORE_EVENT,
        ("events.k8s.io", "Event") => EVENTS_K8S_IO_EVENT,
        // Cluster-scoped kinds with their own list do not accept metadata.namespace.
        ("", "Node") => &["metadata.name", "spec.unschedulable"],
        (
            "admissionregistration.k8s.io",
            "ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding",
        ) => &["metadata.name"],
        ("", "Namespace") => &["metadata.name", "status.phase"],
        ("apiextensions.k8s.io", "CustomResourceDefinition") => &["metadata.name"],
        ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => &["metadata.name"],
        ("certificates.k8s.io", "CertificateSigningRequest")
        | ("", "PersistentVolume")
        | ("storage.k8s.io", "StorageClass")
        | (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        )
        | ("apiregistration.k8s.io", "APIService") => &["metadata.name"],
        ("", "Secret") => &["metadata.name", "metadata.namespace", "type"],
        ("", "Service") => &[
            "metadata.name",
            "metadata.namespace",
            "spec.clusterIP",
            "spec.type",
        ],
        ("", "ReplicationController") | ("apps", "ReplicaSet") => {
            &["metadata.name", "metadata.namespace", "status.replicas"]
        }
        // StatefulSet accepts status.successful (shared upstream with Job) but has no value for it.
        ("batch", "Job") | ("apps", "StatefulSet") => {
            &["metadata.name", "metadata.namespace", "status.successful"]
        }
        _ => META,
    }
}

/// The name a field of `kind` has in the form the kind is stored as: events.k8s.io Events
/// are stored as core Events, where `regarding.*` is `involvedObject.*` and
/// `reportingController` is `reportingComponent`. Other kinds are stored as served.
pub fn stored_field<'a>(group: &str, kind: &str, field: &'a str) -> std::borrow::Cow<'a, str> {
    if (group, kind) != ("events.k8s.io", "Event") {
        return field.into();
    }
    if let Some(sub) = field.strip_prefix("regarding.") {
        return format!("involvedObject.{sub}").into();
    }
    match field {
        "reportingController" => "reportingComponent".into(),
        other => other.into(),
    }
}

/// Whether `field` can be used in a field selector on this kind.
pub fn supported(group: &str, kind: &str, field: &str) -> bool {
    supported_fields(group, kind).contains(&field)
}

/// The message of the 400 Bad Request for a field label the kind does not accept; each kind's
/// wording is upstream's, since clients show it verbatim.
pub fn unsupported_message(group: &str, kind: &str, field: &str) -> String {
    match (group, kind) {
        ("", "Pod" | "Node" | "Event" | "Namespace" | "Secret" | "Service" | "ReplicationController")
        | ("events.k8s.io", "Event") => format!("field label not supported: {field}"),
        ("", "Endpoints" | "ResourceQuota" | "ServiceAccount" | "ConfigMap") => {
            format!("field label {field:?} not supported for {kind:?}")
        }
        ("batch", "Job") => format!("field label {field:?} not supported for batchv1.Job"),
        ("apps", "StatefulSet" | "ReplicaSet") => format!("field label not supported for appsv1.{kind}: {field}"),
        _ => format!("{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""),
    }
}

/// The value of a selectable field (`""` when absent or when the field is not supported).
///
/// Values are text the way upstream renders them: `true`/`false` for booleans, decimal numbers,
/// and the empty string for anything unset.
pub fn value(group: &str, kind: &str, obj: &Value, field: &str) -> String {
    if !supported(group, kind, field) {
        return String::new();
    }
    match field {
        "metadata.name" => return str_at(obj, "metadata.name").to_string(),
        "metadata.namespace" => return str_at(obj, "metadata.namespace").to_string(),
        _ => {}
    }
    match (group, kind) {
        ("", "Pod") => pod_value(obj, field),
        ("", "Event") | ("events.k8s.io", "Event") => event_value(group, obj, field),
        ("", "Node") => bool_text(at(obj, "spec.unschedulable")),
        ("", "Namespace") | ("", "Secret") | ("", "Service") => str_at(obj, field).to_string(),
        ("", "ReplicationController") | ("apps", "ReplicaSet") => int_text(obj, "status.replicas"),
        ("batch", "Job") => int_text(obj, "status.succeeded"),
        _ => String::new(),
    }
}

fn pod_value(pod: &Value, field: &str) -> String {
    match field {
        "spec.host" => str_at(pod, "spec.nodeName").to_string(),
        "spec.hostNetwork" => bool_text(at(pod, "spec.hostNetwork")),
        // The first pod IP; the list itself has no selectable value upstream.
        "status.podIP" => match at(pod, "status.podIPs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
        {
            Some(ip) => str_at(ip, "ip").to_string(),
            None => str_at(pod, "status.podIP").to_string(),
        },
        "status.podIPs" => String::new(),
        other => str_at(pod, other).to_string(),
    }
}

fn event_value(group: &str, obj: &Value, field: &str) -> String {
    let ev = EventView::new(group, obj);
    let involved = field
        .strip_prefix("involvedObject.")
        .or_else(|| field.strip_prefix("regarding."));
    if let Some(sub) = involved {
        return ev.involved(sub).to_string();
    }
    match field {
        "reason" => ev.reason(),
        "type" => ev.type_(),
        "reportingComponent" | "reportingController" => ev.reporting_controller(),
        // The reporting component, from the old source field when set.
        "source" => match ev.source_component() {
            "" => ev.reporting_controller(),
            c => c,
        },
        _ => "",
    }
    .to_string()
}

/// The value at a dotted path, treating JSON `null` as absent.
fn at<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    setpoint_api::meta::path(obj, dotted).filter(|v| !v.is_null())
}

fn str_at<'a>(obj: &'a Value, dotted: &str) -> &'a str {
    at(obj, dotted).and_then(Value::as_str).unwrap_or("")
}

/// Where [`value`] reads the fields of `kind`: dotted paths of a stored object whose whole
/// subtree it may look at (the names of the fields are not enough: `spec.host` reads
/// `spec.nodeName`, `status.podIP` reads `status.podIPs`). `None` when it may read anywhere.
/// `metadata.name` and `metadata.namespace` come on top, for every kind.
///
/// This lets a caller that only needs field values parse just these parts of an object; keep it
/// in step with [`value`] (a test checks every supported field of every kind against it).
pub fn value_sources(group: &str, kind: &str) -> Option<&'static [&'static str]> {
    match (group, kind) {
        ("", "Pod") => Some(&[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ]),
        // Either shape: `apiVersion` picks the names (`involvedObject` or `regarding`, …), and
        // `source` falls back to the reporting controller.
        ("", "Event") | ("events.k8s.io", "Event") => Some(&[
            "apiVersion",
            "involvedObject",
            "regarding",
            "reason",
            "type",
            "reportingComponent",
            "reportingController",
            "source",
            "deprecatedSource",
        ]),
        ("", "Node") => Some(&["spec.unschedulable"]),
        ("", "Namespace") => Some(&["status.phase"]),
        ("", "Secret") => Some(&["type"]),
        ("", "Service") => Some(&["spec.clusterIP", "spec.type"]),
        ("", "ReplicationController") | ("apps", "ReplicaSet") => Some(&["status.replicas"]),
        ("batch", "Job") => Some(&["status.succeeded"]),
        _ => Some(&[]),
    }
}

/// A boolean as `true`/`false`; unset is `false`, the Go zero value upstream formats.
fn bool_text(v: Option<&Value>) -> String {
    v.and_then(Value::as_bool).unwrap_or(false).to_string()
}

/// An integer as decimal text; unset is `0`.
fn int_text(obj: &Value, dotted: &str) -> String {
    at(obj, dotted)
        .and_then(Value::as_i64)
        .unwrap_or(0)
        .to_string()
}

#[cfg(test)]
mod tests;
