//! Printers for the core (`v1`) kinds, plus events.k8s.io events which share the core printer.

use std::collections::{BTreeSet, HashSet};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{
    age, arr_at, at, canonical_quantity, col, container_cells, format_labels, int_at, len_at,
    name_cell, parse_time, since, str_at, time_at, wide, Column, AGE, CONTAINERS, IMAGES, NAME,
};

// ---- Pod ------------------------------------------------------------------------------------

pub(super) const POD: &[Column] = &[
    NAME,
    col(
        "Ready",
        "string",
        "Ready containers out of all containers (sidecars included).",
    ),
    col(
        "Status",
        "string",
        "The pod's phase, or why it is not running normally.",
    ),
    col(
        "Restarts",
        "string",
        "Container restarts in total, and how long ago the latest one happened.",
    ),
    AGE,
    wide("IP", "string", "The pod's first IP address."),
    wide("Node", "string", "The node the pod is bound to."),
    wide(
        "Nominated Node",
        "string",
        "The node the scheduler nominated while preempting other pods.",
    ),
    wide(
        "Readiness Gates",
        "string",
        "Readiness gates whose condition is True, out of all gates.",
    ),
];

/// A container status field that holds an object (`state.waiting`), ignoring JSON `null`.
fn state<'a>(status: &'a Value, which: &str) -> Option<&'a Value> {
    at(status, which).filter(|v| v.is_object())
}

/// Keeps the later of two optional timestamps.
fn latest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Whether the pod has a condition of this type with status `True`.
fn pod_condition_true(pod: &Value, type_: &str) -> bool {
    arr_at(pod, "status.conditions")
        .iter()
        .any(|c| str_at(c, "type") == type_ && str_at(c, "status") == "True")
}

/// The reason text for a terminated container with no reason: the signal, else the exit code.
fn terminated_without_reason(terminated: &Value) -> String {
    let signal = int_at(terminated, "signal");
    if signal != 0 {
        format!("Signal:{signal}")
    } else {
        format!("ExitCode:{}", int_at(terminated, "exitCode"))
    }
}

pub(super) fn pod(pod: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let init_specs = arr_at(pod, "spec.initContainers");
    // Init containers with `restartPolicy: Always` are sidecars: they keep running next to the
    // main containers, so they count towards Ready and their restarts stay visible.
    let sidecars: HashSet<&str> = init_specs
        .iter()
        .filter(|c| str_at(c, "restartPolicy") == "Always")
        .map(|c| str_at(c, "name"))
        .collect();
    let sidecar_specs = init_specs
        .iter()
        .filter(|c| str_at(c, "restartPolicy") == "Always")
        .count();
    let total = arr_at(pod, "spec.containers").len() + sidecar_specs;

    let phase = str_at(pod, "status.phase");
    let status_reason = str_at(pod, "status.reason");
    let mut reason = if status_reason.is_empty() {
        phase
    } else {
        status_reason
    }
    .to_string();
    if arr_at(pod, "status.conditions")
        .iter()
        .any(|c| str_at(c, "type") == "PodScheduled" && str_at(c, "reason") == "SchedulingGated")
    {
        reason = "SchedulingGated".to_string();
    }

    let mut ready = 0;
    let mut restarts = 0;
    let mut last_restart = None;
    let mut sidecar_restarts = 0;
    let mut last_sidecar_restart = None;
    let mut initializing = false;
    let init_statuses = arr_at(pod, "status.initContainerStatuses");
    for (i, cs) in init_statuses.iter().enumerate() {
        let finished = time_at(cs, "lastState.terminated.finishedAt");
        restarts += int_at(cs, "restartCount");
        last_restart = latest(last_restart, finished);
        let sidecar = sidecars.contains(str_at(cs, "name"));
        if sidecar {
            sidecar_restarts += int_at(cs, "restartCount");
            last_sidecar_restart = latest(last_sidecar_restart, finished);
        }
        let terminated = state(cs, "state.terminated");
        let waiting_reason = state(cs, "state.waiting")
            .map(|w| str_at(w, "reason"))
            .unwrap_or("");
        if terminated.is_some_and(|t| int_at(t, "exitCode") == 0) {
            continue;
        }
        if sidecar && at(cs, "started").and_then(Value::as_bool) == Some(true) {
            if at(cs, "ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        // The first init container that has not finished decides the status; later ones have
        // not run yet.
        reason = match terminated {
            Some(t) if str_at(t, "reason").is_empty() => {
                format!("Init:{}", terminated_without_reason(t))
            }
            Some(t) => format!("Init:{}", str_at(t, "reason")),
            None if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" => {
                format!("Init:{waiting_reason}")
            }
            None => format!("Init:{i}/{}", init_specs.len()),
        };
        initializing = true;
        break;
    }

    if !initializing || pod_condition_true(pod, "Initialized") {
        // Once initialised, only sidecar restarts still matter among the init containers.
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        // Walk backwards so that the first container's state wins the Status column.
        for cs in arr_at(pod, "status.containerStatuses").iter().rev() {
            restarts += int_at(cs, "restartCount");
            last_restart = latest(last_restart, time_at(cs, "lastState.terminated.finishedAt"));
            let waiting_reason = state(cs, "state.waiting")
                .map(|w| str_at(w, "reason"))
                .unwrap_or("");
            let terminated = state(cs, "state.terminated");
            if !waiting_reason.is_empty() {
                reason = waiting_reason.to_string();
            } else if let Some(t) = terminated {
                reason = match str_at(t, "reason") {
                    "" => terminated_without_reason(t),
                    r => r.to_string(),
                };
            } else if at(cs, "ready").and_then(Value::as_bool) == Some(true)
                && state(cs, "state.running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        // A finished container next to a running one: the pod as a whole is still running.
        if reason == "Completed" && has_running {
            reason = if pod_condition_true(pod, "Ready") {
                "Running"
            } else {
                "NotReady"
            }
            .to_string();
        }
    }

    if at(pod, "metadata.deletionTimestamp").is_some() {
        if status_reason == "NodeLost" {
            reason = "Unknown".to_string();
        } else if phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".to_string();
        }
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", since(Some(t), now)),
        _ => restarts.to_string(),
    };

    let pod_ip = arr_at(pod, "status.podIPs")
        .first()
        .map(|ip| str_at(ip, "ip"))
        // Older writers may set only the singular field; upstream's conversion fills the list from it.
        .unwrap_or_else(|| str_at(pod, "status.podIP"));
    let gates = arr_at(pod, "spec.readinessGates");
    let gates_cell = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let conditions = arr_at(pod, "status.conditions");
        let passing = gates
            .iter()
            .filter(|g| {
                let wanted = str_at(g, "conditionType");
                // Only the first condition of the gate's type counts, as upstream.
                conditions
                    .iter()
                    .find(|c| str_at(c, "type") == wanted)
                    .is_some_and(|c| str_at(c, "status") == "True")
            })
            .count();
        format!("{passing}/{}", gates.len())
    };

    vec![
        name_cell(pod),
        Value::from(format!("{ready}/{total}")),
        Value::from(reason),
        Value::from(restarts_cell),
        age(pod, now),
        Value::from(or_none(pod_ip)),
        Value::from(or_none(str_at(pod, "spec.nodeName"))),
        Value::from(or_none(str_at(pod, "status.nominatedNodeName"))),
        Value::from(gates_cell),
    ]
}

/// `s`, or `<none>` when empty.
fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

// ---- Service --------------------------------------------------------------------------------

pub(super) const SERVICE: &[Column] = &[
    NAME,
    col(
        "Type",
        "string",
        "How the service is exposed: ClusterIP, NodePort, LoadBalancer or ExternalName.",
    ),
    col(
        "Cluster-IP",
        "string",
        "The service's virtual IP inside the cluster.",
    ),
    col(
        "External-IP",
        "string",
        "Addresses the service is reachable on from outside the cluster.",
    ),
    col(
        "Port(s)",
        "string",
        "Service ports, with the node port when there is one.",
    ),
    AGE,
    wide(
        "Selector",
        "string",
        "Labels of the pods that back the service.",
    ),
];

pub(super) fn service(svc: &Value, now: DateTime<Utc>) -> Vec<Value> {
    // Defaulting always sets the type; an undefaulted object reads as the default.
    let type_ = match str_at(svc, "spec.type") {
        "" => "ClusterIP",
        t => t,
    };
    let cluster_ip = arr_at(svc, "spec.clusterIPs")
        .first()
        .and_then(Value::as_str)
        .unwrap_or_else(|| str_at(svc, "spec.clusterIP"));
    let ports: Vec<String> = arr_at(svc, "spec.ports")
        .iter()
        .map(|p| {
            let port = int_at(p, "port");
            let protocol = match str_at(p, "protocol") {
                "" => "TCP",
                p => p,
            };
            match int_at(p, "nodePort") {
                n if n > 0 => format!("{port}:{n}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    vec![
        name_cell(svc),
        Value::from(type_),
        Value::from(or_none(cluster_ip)),
        Value::from(service_external_ip(svc, type_)),
        Value::from(if ports.is_empty() {
            "<none>".to_string()
        } else {
            ports.join(",")
        }),
        age(svc, now),
        Value::from(format_labels(at(svc, "spec.selector"))),
    ]
}

fn service_external_ip(svc: &Value, type_: &str) -> String {
    let external_ips: Vec<&str> = arr_at(svc, "spec.externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match type_ {
        "ClusterIP" | "NodePort" if external_ips.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external_ips.join(","),
        "LoadBalancer" => {
            // Ingress points are de-duplicated and sorted; an IP is preferred over a hostname.
            let ingress: BTreeSet<&str> = arr_at(svc, "status.loadBalancer.ingress")
                .iter()
                .map(|i| match str_at(i, "ip") {
                    "" => str_at(i, "hostname"),
                    ip => ip,
                })
                .filter(|s| !s.is_empty())
                .collect();
            let mut all: Vec<&str> = ingress.into_iter().collect();
            all.extend(external_ips);
            if all.is_empty() {
                "<pending>".to_string()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => str_at(svc, "spec.externalName").to_string(),
        _ => "<unknown>".to_string(),
    }
}

// ---- ReplicationController ------------------------------------------------------------------

pub(super) const REPLICATION_CONTROLLER: &[Column] = &[
    NAME,
    col("Desired", "integer", "Number of pods wanted."),
    col("Current", "integer", "Number of pods that exist."),
    col("Ready", "integer", "Number of pods that are ready."),
    AGE,
    CONTAINERS,
    IMAGES,
    wide(
        "Selector",
        "string",
        "Labels of the pods this controller manages.",
    ),
];

pub(super) fn replication_controller(rc: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let [names, images] = container_cells(arr_at(rc, "spec.template.spec.containers"));
    vec![
        name_cell(rc),
        Value::from(replicas(rc)),
        Value::from(int_at(rc, "status.replicas")),
        Value::from(int_at(rc, "status.readyReplicas")),
        age(rc, now),
        names,
        images,
        Value::from(format_labels(at(rc, "spec.selector"))),
    ]
}

/// `spec.replicas`, which defaulting sets to 1 when it is left out.
pub(super) fn replicas(obj: &Value) -> i64 {
    at(obj, "spec.replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

// ---- Namespace ------------------------------------------------------------------------------

pub(super) const NAMESPACE: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        "Active, or Terminating while the namespace is being deleted.",
    ),
    AGE,
];

pub(super) fn namespace(ns: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(ns),
        Value::from(str_at(ns, "status.phase")),
        age(ns, now),
    ]
}

// ---- Node -----------------------------------------------------------------------------------

pub(super) const NODE: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        "Whether the node is Ready, and whether scheduling on it is disabled.",
    ),
    col(
        "Roles",
        "string",
        "Roles from the node's node-role.kubernetes.io labels.",
    ),
    AGE,
    col("Version", "string", "The kubelet version the node reports."),
    wide(
        "Internal-IP",
        "string",
        "The node's first internal address.",
    ),
    wide(
        "External-IP",
        "string",
        "The node's first external address.",
    ),
    wide(
        "OS-Image",
        "string",
        "The operating system the node reports.",
    ),
    wide(
        "Kernel-Version",
        "string",
        "The kernel version the node reports.",
    ),
    wide(
        "Container-Runtime",
        "string",
        "The container runtime and its version.",
    ),
];

pub(super) fn node(node: &Value, now: DateTime<Utc>) -> Vec<Value> {
    // Only the Ready condition is shown; the last one of that type wins, as upstream keys the
    // conditions by type.
    let ready = arr_at(node, "status.conditions")
        .iter()
        .rev()
        .find(|c| str_at(c, "type") == "Ready");
    let mut status = vec![match ready {
        Some(c) if str_at(c, "status") == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if at(node, "spec.unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled");
    }

    let mut roles = BTreeSet::new();
    if let Some(labels) = at(node, "metadata.labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" {
                if let Some(v) = v.as_str().filter(|v| !v.is_empty()) {
                    roles.insert(v.to_string());
                }
            }
        }
    }
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };

    let address = |type_: &str| {
        arr_at(node, "status.addresses")
            .iter()
            .find(|a| str_at(a, "type") == type_)
            .map(|a| str_at(a, "address").to_string())
            .unwrap_or_else(|| "<none>".to_string())
    };
    let info = |field: &str| match str_at(node, &format!("status.nodeInfo.{field}")) {
        "" => "<unknown>".to_string(),
        v => v.to_string(),
    };
    vec![
        name_cell(node),
        Value::from(status.join(",")),
        Value::from(roles),
        age(node, now),
        Value::from(str_at(node, "status.nodeInfo.kubeletVersion")),
        Value::from(address("InternalIP")),
        Value::from(address("ExternalIP")),
        Value::from(info("osImage")),
        Value::from(info("kernelVersion")),
        Value::from(info("containerRuntimeVersion")),
    ]
}

// ---- Endpoints ------------------------------------------------------------------------------

pub(super) const ENDPOINTS: &[Column] = &[
    NAME,
    col(
        "Endpoints",
        "string",
        "Ready addresses with their ports (the first few).",
    ),
    AGE,
];

/// How many endpoints the cell lists before summarising the rest.
const MAX_ENDPOINTS: usize = 3;

pub(super) fn endpoints(ep: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(ep),
        Value::from(format_endpoints(ep)),
        age(ep, now),
    ]
}

fn format_endpoints(ep: &Value) -> String {
    let subsets = arr_at(ep, "subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    let mut list: Vec<String> = Vec::new();
    let mut count = 0;
    let mut more = false;
    for subset in subsets {
        let addresses = arr_at(subset, "addresses");
        let ports = arr_at(subset, "ports");
        // A headless service may have no ports; its endpoints are bare addresses.
        let port_numbers: Vec<Option<i64>> = if ports.is_empty() {
            vec![None]
        } else {
            ports.iter().map(|p| Some(int_at(p, "port"))).collect()
        };
        for port in port_numbers {
            count += addresses.len();
            for addr in addresses {
                if list.len() == MAX_ENDPOINTS {
                    more = true;
                    break;
                }
                let ip = str_at(addr, "ip");
                list.push(match port {
                    None => ip.to_string(),
                    Some(port) if ip.contains(':') => format!("[{ip}]:{port}"),
                    Some(port) => format!("{ip}:{port}"),
                });
            }
        }
    }
    let joined = list.join(",");
    if more {
        format!("{joined} + {} more...", count - MAX_ENDPOINTS)
    } else {
        joined
    }
}

// ---- ConfigMap, Secret, ServiceAccount ------------------------------------------------------

// Upstream declares these count columns as `string` while the cells are integers; kept as is.
pub(super) const CONFIG_MAP: &[Column] = &[
    NAME,
    col("Data", "string", "Number of keys in data and binaryData."),
    AGE,
];

pub(super) fn config_map(cm: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let keys = len_at(cm, "data") + len_at(cm, "binaryData");
    vec![name_cell(cm), Value::from(keys), age(cm, now)]
}

pub(super) const SECRET: &[Column] = &[
    NAME,
    col(
        "Type",
        "string",
        "The kind of secret, which fixes the keys it must hold.",
    ),
    col("Data", "string", "Number of keys in data."),
    AGE,
];

pub(super) fn secret(secret: &Value, now: DateTime<Utc>) -> Vec<Value> {
    // stringData is folded into data on write, but count it for objects that skipped that.
    let mut keys: HashSet<&str> = HashSet::new();
    for field in ["data", "stringData"] {
        if let Some(m) = at(secret, field).and_then(Value::as_object) {
            keys.extend(m.keys().map(String::as_str));
        }
    }
    vec![
        name_cell(secret),
        Value::from(str_at(secret, "type")),
        Value::from(keys.len()),
        age(secret, now),
    ]
}

pub(super) const SERVICE_ACCOUNT: &[Column] = &[
    NAME,
    col(
        "Secrets",
        "string",
        "Number of secrets listed on the service account.",
    ),
    AGE,
];

pub(super) fn service_account(sa: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(sa),
        Value::from(len_at(sa, "secrets")),
        age(sa, now),
    ]
}

// ---- Event ----------------------------------------------------------------------------------

pub(super) const EVENT: &[Column] = &[
    col(
        "Last Seen",
        "string",
        "How long ago the event last happened.",
    ),
    col("Type", "string", "Normal or Warning."),
    col(
        "Reason",
        "string",
        "Short machine-readable reason for the event.",
    ),
    col(
        "Object",
        "string",
        "The object the event is about, as kind/name.",
    ),
    wide(
        "Subobject",
        "string",
        "The part of the object the event is about, such as a container.",
    ),
    wide(
        "Source",
        "string",
        "The component (and host) that reported the event.",
    ),
    col("Message", "string", "What happened, in words."),
    wide(
        "First Seen",
        "string",
        "How long ago the event first happened.",
    ),
    wide("Count", "string", "How many times the event has happened."),
    Column {
        priority: 1,
        ..NAME
    },
];

/// A read-only view of an event in either of its API shapes: core `v1` (`involvedObject`,
/// `message`, `source`, …) or `events.k8s.io/v1` (`regarding`, `note`, `deprecatedSource`, …).
/// Both are one stored resource, so tables and field selectors read them through one lens.
pub(crate) struct EventView<'a> {
    obj: &'a Value,
    /// `events.k8s.io` field names.
    new_shape: bool,
}

impl<'a> EventView<'a> {
    /// Picks the shape from the object's `apiVersion`, falling back to the group it was
    /// requested as.
    pub(crate) fn new(group: &str, obj: &'a Value) -> Self {
        let new_shape = match obj.get("apiVersion").and_then(Value::as_str) {
            Some(v) if v.starts_with("events.k8s.io/") => true,
            Some("v1") => false,
            _ => group == "events.k8s.io",
        };
        EventView { obj, new_shape }
    }

    fn field(&self, core: &str, new: &str) -> &'a str {
        str_at(self.obj, if self.new_shape { new } else { core })
    }

    /// A field of `involvedObject` (core) / `regarding` (events.k8s.io).
    pub(crate) fn involved(&self, field: &str) -> &'a str {
        let base = if self.new_shape {
            "regarding"
        } else {
            "involvedObject"
        };
        at(self.obj, base)
            .and_then(|o| o.get(field))
            .and_then(Value::as_str)
            .unwrap_or("")
    }
    pub(crate) fn reason(&self) -> &'a str {
        str_at(self.obj, "reason")
    }
    pub(crate) fn type_(&self) -> &'a str {
        str_at(self.obj, "type")
    }
    fn message(&self) -> &'a str {
        self.field("message", "note")
    }
    /// `reportingComponent` (core) / `reportingController` (events.k8s.io).
    pub(crate) fn reporting_controller(&self) -> &'a str {
        self.field("reportingComponent", "reportingController")
    }
    fn reporting_instance(&self) -> &'a str {
        str_at(self.obj, "reportingInstance")
    }
    pub(crate) fn source_component(&self) -> &'a str {
        self.field("source.component", "deprecatedSource.component")
    }
    fn source_host(&self) -> &'a str {
        self.field("source.host", "deprecatedSource.host")
    }
    fn first_timestamp(&self) -> Option<DateTime<Utc>> {
        parse_time(self.field("firstTimestamp", "deprecatedFirstTimestamp"))
    }
    fn last_timestamp(&self) -> Option<DateTime<Utc>> {
        parse_time(self.field("lastTimestamp", "deprecatedLastTimestamp"))
    }
    fn count(&self) -> i64 {
        int_at(
            self.obj,
            if self.new_shape {
                "deprecatedCount"
            } else {
                "count"
            },
        )
    }
    fn event_time(&self) -> Option<DateTime<Utc>> {
        time_at(self.obj, "eventTime")
    }
    fn series(&self) -> Option<&'a Value> {
        at(self.obj, "series").filter(|s| s.is_object())
    }
}

/// A core `v1` event (or one whose `apiVersion` says otherwise).
pub(super) fn event(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    event_cells(EventView::new("", obj), now)
}

/// An `events.k8s.io` event (or one whose `apiVersion` says otherwise).
pub(super) fn events_k8s_io_event(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    event_cells(EventView::new("events.k8s.io", obj), now)
}

fn event_cells(ev: EventView<'_>, now: DateTime<Utc>) -> Vec<Value> {
    // Events from the newer API only carry eventTime; the deprecated timestamps stand in for
    // it on older events.
    let first = ev.first_timestamp().or_else(|| ev.event_time());
    let first_seen = since(first, now);
    let mut last_seen = match ev.last_timestamp() {
        Some(t) => since(Some(t), now),
        None => first_seen.clone(),
    };
    let mut count = ev.count();
    if let Some(series) = ev.series() {
        last_seen = since(time_at(series, "lastObservedTime"), now);
        count = int_at(series, "count");
    } else if count == 0 {
        // A one-off event from the newer API has no count at all.
        count = 1;
    }

    let kind = ev.involved("kind").to_lowercase();
    let target = match ev.involved("name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let component = match ev.source_component() {
        "" => ev.reporting_controller(),
        c => c,
    };
    let instance = match ev.source_host() {
        "" => ev.reporting_instance(),
        h => h,
    };
    let source = if instance.is_empty() {
        component.to_string()
    } else {
        format!("{component}, {instance}")
    };

    vec![
        Value::from(last_seen),
        Value::from(ev.type_()),
        Value::from(ev.reason()),
        Value::from(target),
        Value::from(ev.involved("fieldPath")),
        Value::from(source),
        Value::from(ev.message().trim()),
        Value::from(first_seen),
        Value::from(count),
        name_cell(ev.obj),
    ]
}

// ---- ResourceQuota, LimitRange --------------------------------------------------------------

pub(super) const RESOURCE_QUOTA: &[Column] = &[
    NAME,
    AGE,
    col(
        "Request",
        "string",
        "Used out of hard limit, for each quota that is not a limits.* one.",
    ),
    col(
        "Limit",
        "string",
        "Used out of hard limit, for each limits.* quota.",
    ),
];

pub(super) fn resource_quota(quota: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let mut requests = Vec::new();
    let mut limits = Vec::new();
    if let Some(hard) = at(quota, "status.hard").and_then(Value::as_object) {
        let mut names: Vec<&String> = hard.keys().collect();
        names.sort();
        for name in names {
            let used = at(quota, "status.used").and_then(|u| u.get(name.as_str()));
            let entry = format!(
                "{name}: {}/{}",
                quantity_or_zero(used),
                quantity_or_zero(hard.get(name.as_str()))
            );
            if name.starts_with("limits.") {
                limits.push(entry);
            } else {
                requests.push(entry);
            }
        }
    }
    vec![
        name_cell(quota),
        age(quota, now),
        Value::from(requests.join(", ")),
        Value::from(limits.join(", ")),
    ]
}

/// A quantity in canonical form, `0` when absent.
fn quantity_or_zero(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => canonical_quantity(s),
        Some(Value::Number(n)) => canonical_quantity(&n.to_string()),
        _ => "0".to_string(),
    }
}

pub(super) const LIMIT_RANGE: &[Column] = &[
    NAME,
    col("Created At", "date", "When the object was created."),
];

pub(super) fn limit_range(lr: &Value, _now: DateTime<Utc>) -> Vec<Value> {
    // Upstream puts the raw creation timestamp here rather than an age.
    let created = match time_at(lr, "metadata.creationTimestamp") {
        Some(t) => Value::from(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
        None => at(lr, "metadata.creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    };
    vec![name_cell(lr), created]
}
