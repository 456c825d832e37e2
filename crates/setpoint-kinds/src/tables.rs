//! Table columns and cells for `kubectl get`, as Kubernetes 1.32's server-side printers make them.
//!
//! kubectl asks for `application/json;as=Table;v=v1;g=meta.k8s.io` and prints the cells verbatim,
//! so everything here is pre-rendered: ages are human durations (`5m`, `2d3h`), counts are
//! `ready/desired`, and absent values are spelled the way kubectl users expect (`<none>`,
//! `<pending>`, `<unknown>`). Like the upstream apiserver, rows always carry every column
//! (the "wide" ones too); kubectl hides columns with `priority > 0` unless `-o wide`.

mod admissionregistration;
mod apiregistration;
mod apps;
mod certificates;
mod core;
mod discovery;
mod policy;
mod rbac;
mod storage;
#[cfg(test)]
mod tests;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

pub(crate) use self::core::EventView;
pub use setpoint_api::quantity::canonical_quantity;

/// One column of a `meta.k8s.io/v1` Table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// The header kubectl prints, upper-cased by kubectl (`Nominated Node` → `NOMINATED NODE`).
    pub name: &'static str,
    /// `string`, `integer`, `number`, `boolean`, `date`.
    pub type_: &'static str,
    /// `name` for the name column, otherwise usually empty.
    pub format: &'static str,
    /// What the column shows, for clients that display column help.
    pub description: &'static str,
    /// 0 = always shown; 1 = only with `-o wide`.
    pub priority: i32,
}

impl Column {
    /// The column as a `TableColumnDefinition` JSON object.
    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "type": self.type_,
            "format": self.format,
            "description": self.description,
            "priority": self.priority,
        })
    }
}

/// A column shown by default.
const fn col(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column {
        name,
        type_,
        format: "",
        description,
        priority: 0,
    }
}

/// A column shown only with `-o wide`.
const fn wide(name: &'static str, type_: &'static str, description: &'static str) -> Column {
    Column {
        name,
        type_,
        format: "",
        description,
        priority: 1,
    }
}

/// The object's name. `format: name` is what makes `kubectl get all` prefix it with the kind.
const NAME: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    description: "Name of the object, unique within its namespace (or the cluster).",
    priority: 0,
};

/// Time since `metadata.creationTimestamp`. Upstream types it `string` because the cell is a
/// pre-rendered duration rather than a timestamp.
const AGE: Column = col("Age", "string", "How long ago the object was created.");

const CONTAINERS: Column = wide(
    "Containers",
    "string",
    "Names of the containers in the pod template.",
);
const IMAGES: Column = wide(
    "Images",
    "string",
    "Images of the containers in the pod template.",
);
const SELECTOR: Column = wide(
    "Selector",
    "string",
    "Label selector for the pods this object manages.",
);

/// Produces the cells of one row.
type CellFn = fn(&Value, DateTime<Utc>) -> Vec<Value>;

/// The printer for a kind: its columns and how to fill a row.
fn printer(group: &str, kind: &str) -> (&'static [Column], CellFn) {
    match (group, kind) {
        ("", "Pod") => (core::POD, core::pod),
        ("", "Service") => (core::SERVICE, core::service),
        ("", "ReplicationController") => {
            (core::REPLICATION_CONTROLLER, core::replication_controller)
        }
        ("", "Namespace") => (core::NAMESPACE, core::namespace),
        ("", "Node") => (core::NODE, core::node),
        ("", "Endpoints") => (core::ENDPOINTS, core::endpoints),
        ("discovery.k8s.io", "EndpointSlice") => {
            (discovery::ENDPOINT_SLICE, discovery::endpoint_slice)
        }
        ("", "ConfigMap") => (core::CONFIG_MAP, core::config_map),
        ("", "Secret") => (core::SECRET, core::secret),
        ("", "ServiceAccount") => (core::SERVICE_ACCOUNT, core::service_account),
        // events.k8s.io events are served from the same storage as core events and upstream
        // prints them with the core printer after converting, so both read through `EventView`.
        ("", "Event") => (core::EVENT, core::event),
        ("events.k8s.io", "Event") => (core::EVENT, core::events_k8s_io_event),
        ("", "ResourceQuota") => (core::RESOURCE_QUOTA, core::resource_quota),
        ("", "LimitRange") => (core::LIMIT_RANGE, core::limit_range),
        ("", "PersistentVolume") => (storage::PERSISTENT_VOLUME, storage::persistent_volume),
        ("", "PersistentVolumeClaim") => (
            storage::PERSISTENT_VOLUME_CLAIM,
            storage::persistent_volume_claim,
        ),
        ("storage.k8s.io", "StorageClass") => (storage::STORAGE_CLASS, storage::storage_class),
        ("apps", "Deployment") => (apps::DEPLOYMENT, apps::deployment),
        ("apps", "ReplicaSet") => (apps::REPLICA_SET, apps::replica_set),
        ("apps", "StatefulSet") => (apps::STATEFUL_SET, apps::stateful_set),
        ("apps", "DaemonSet") => (apps::DAEMON_SET, apps::daemon_set),
        ("apps", "ControllerRevision") => (apps::CONTROLLER_REVISION, apps::controller_revision),
        ("batch", "Job") => (apps::JOB, apps::job),
        ("batch", "CronJob") => (apps::CRON_JOB, apps::cron_job),
        ("autoscaling", "HorizontalPodAutoscaler") => (apps::HPA, apps::hpa),
        ("coordination.k8s.io", "Lease") => (apps::LEASE, apps::lease),
        ("policy", "PodDisruptionBudget") => (policy::POD_DISRUPTION_BUDGET, policy::pdb),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => (rbac::ROLE, rbac::role),
        ("rbac.authorization.k8s.io", "RoleBinding") => (rbac::BINDING, rbac::role_binding),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            (rbac::BINDING, rbac::cluster_role_binding)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            (admissionregistration::POLICY, admissionregistration::policy)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => (
            admissionregistration::BINDING,
            admissionregistration::binding,
        ),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => (apps::CRD, apps::crd),
        (
            "admissionregistration.k8s.io",
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration",
        ) => (
            admissionregistration::WEBHOOKS,
            admissionregistration::webhooks,
        ),
        ("apiregistration.k8s.io", "APIService") => {
            (apiregistration::API_SERVICE, apiregistration::api_service)
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            (certificates::CSR, certificates::csr)
        }
        _ => (DEFAULT, default_cells),
    }
}

/// Kinds without a printer: the name and an age. The age column is typed `date` like the
/// default column of a CustomResourceDefinition, whose cell is likewise rendered as a duration.
const DEFAULT: &[Column] = &[
    NAME,
    col("Age", "date", "How long ago the object was created."),
];

fn default_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![name_cell(obj), age(obj, now)]
}

/// The columns for a kind.
pub fn columns(group: &str, kind: &str) -> Vec<Column> {
    printer(group, kind).0.to_vec()
}

/// The cells of one row, one per column of [`columns`].
pub fn cells(group: &str, kind: &str, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    (printer(group, kind).1)(obj, now)
}

/// The `conditions` of a Table row, when the printer sets any. Upstream marks pods that have
/// finished (phase `Succeeded` or `Failed`) as `Completed` so clients can tell them apart.
pub fn row_conditions(group: &str, kind: &str, obj: &Value) -> Option<Value> {
    if (group, kind) != ("", "Pod") {
        return None;
    }
    let (reason, message) = match str_at(obj, "status.phase") {
        "Succeeded" => ("Succeeded", "The pod has completed successfully."),
        "Failed" => ("Failed", "The pod failed."),
        _ => return None,
    };
    Some(json!([{"type": "Completed", "status": "True", "reason": reason, "message": message}]))
}

/// Formats a duration the way Kubernetes' `duration.HumanDuration` does, which is what every
/// `Age` cell shows.
///
/// Precision shrinks as the duration grows so the text stays short: seconds below two minutes,
/// minutes and seconds below ten minutes, minutes below three hours, hours and minutes below
/// eight hours, hours below two days, days and hours below eight days, days below two years,
/// years and days below eight years, then years. A second or less in the future (clock skew
/// between machines) counts as `0s`; anything further ahead is `<invalid>`.
pub fn human_duration(d: chrono::Duration) -> String {
    // `num_seconds` truncates toward zero, like Go's `int(d.Seconds())`.
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        let dy = days % 365;
        return if dy == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{dy}d")
        };
    }
    format!("{years}y")
}

// ---- helpers shared by the printers --------------------------------------------------------

/// The value at a dotted path, treating JSON `null` as absent.
fn at<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    setpoint_api::meta::path(obj, dotted).filter(|v| !v.is_null())
}

/// A string at a dotted path (`""` when absent or not a string).
fn str_at<'a>(obj: &'a Value, dotted: &str) -> &'a str {
    at(obj, dotted).and_then(Value::as_str).unwrap_or("")
}

/// An integer at a dotted path (0 when absent).
fn int_at(obj: &Value, dotted: &str) -> i64 {
    at(obj, dotted).and_then(Value::as_i64).unwrap_or(0)
}

/// An array at a dotted path (empty when absent).
fn arr_at<'a>(obj: &'a Value, dotted: &str) -> &'a [Value] {
    at(obj, dotted)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The number of entries of a map (or list) at a dotted path.
fn len_at(obj: &Value, dotted: &str) -> usize {
    match at(obj, dotted) {
        Some(Value::Object(m)) => m.len(),
        Some(Value::Array(a)) => a.len(),
        _ => 0,
    }
}

/// A timestamp (RFC 3339, any precision) at a dotted path.
fn time_at(obj: &Value, dotted: &str) -> Option<DateTime<Utc>> {
    parse_time(str_at(obj, dotted))
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// Time since `t` as a human duration, `<unknown>` when there is no timestamp.
fn since(t: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match t {
        Some(t) => human_duration(now - t),
        None => "<unknown>".to_string(),
    }
}

/// The `Age` cell.
fn age(obj: &Value, now: DateTime<Utc>) -> Value {
    Value::from(since(time_at(obj, "metadata.creationTimestamp"), now))
}

/// The `Name` cell.
fn name_cell(obj: &Value) -> Value {
    Value::from(str_at(obj, "metadata.name"))
}

/// A string map rendered as sorted `k=v` pairs, `<none>` when empty (upstream `FormatLabels`).
fn format_labels(map: Option<&Value>) -> String {
    let mut pairs: Vec<(&str, String)> = map
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.as_str(), scalar_string(v)))
                .collect()
        })
        .unwrap_or_default();
    if pairs.is_empty() {
        return "<none>".to_string();
    }
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A JSON scalar as text: strings without quotes, numbers and booleans as written.
fn scalar_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A `metav1.LabelSelector` in selector syntax (`app=web,tier in (a,b)`), sorted by key.
///
/// `Ok("")` means the selector is absent or empty (it selects nothing or everything, which
/// upstream renders the same); `Err(())` means it is malformed, e.g. `In` without values.
fn label_selector_string(sel: Option<&Value>) -> Result<String, ()> {
    let Some(sel) = sel else {
        return Ok(String::new());
    };
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", scalar_string(v))));
        }
    }
    for expr in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let key = expr.get("key").and_then(Value::as_str).unwrap_or("");
        let mut values: Vec<String> = expr
            .get("values")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(scalar_string).collect())
            .unwrap_or_default();
        values.sort();
        let text = match expr.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" if !values.is_empty() => format!("{key} in ({})", values.join(",")),
            "NotIn" if !values.is_empty() => format!("{key} notin ({})", values.join(",")),
            "Exists" if values.is_empty() => key.to_string(),
            "DoesNotExist" if values.is_empty() => format!("!{key}"),
            _ => return Err(()),
        };
        reqs.push((key.to_string(), text));
    }
    // Stable, so a key with both a label and an expression keeps labels first, as upstream's
    // small-slice sort does.
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(reqs
        .into_iter()
        .map(|(_, text)| text)
        .collect::<Vec<_>>()
        .join(","))
}

/// Upstream `FormatLabelSelector`: `<none>` for an empty selector, `<error>` for a bad one.
fn format_label_selector(sel: Option<&Value>) -> String {
    match label_selector_string(sel) {
        Ok(s) if s.is_empty() => "<none>".to_string(),
        Ok(s) => s,
        Err(()) => "<error>".to_string(),
    }
}

/// The `Containers` and `Images` cells: comma-joined names and images of a container list.
fn container_cells(containers: &[Value]) -> [Value; 2] {
    let names: Vec<&str> = containers.iter().map(|c| str_at(c, "name")).collect();
    let images: Vec<&str> = containers.iter().map(|c| str_at(c, "image")).collect();
    [Value::from(names.join(",")), Value::from(images.join(","))]
}
