//! Printers for workloads and the other non-core kinds: apps, batch, autoscaling, coordination.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::core::replicas;
use super::{
    age, arr_at, at, canonical_quantity, col, container_cells, format_label_selector,
    format_labels, int_at, label_selector_string, len_at, name_cell, since, str_at, time_at,
    Column, AGE, CONTAINERS, IMAGES, NAME, SELECTOR,
};

// ---- Deployment -----------------------------------------------------------------------------

pub(super) const DEPLOYMENT: &[Column] = &[
    NAME,
    col("Ready", "string", "Ready pods out of the desired number."),
    col(
        "Up-to-date",
        "integer",
        "Pods running the current pod template.",
    ),
    col(
        "Available",
        "integer",
        "Pods that have been ready long enough to count as available.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

pub(super) fn deployment(d: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let [names, images] = container_cells(arr_at(d, "spec.template.spec.containers"));
    // Unlike most printers this one shows an empty selector as nothing, and a bad one as
    // `<invalid>`.
    let selector =
        label_selector_string(at(d, "spec.selector")).unwrap_or_else(|()| "<invalid>".to_string());
    vec![
        name_cell(d),
        Value::from(format!(
            "{}/{}",
            int_at(d, "status.readyReplicas"),
            replicas(d)
        )),
        Value::from(int_at(d, "status.updatedReplicas")),
        Value::from(int_at(d, "status.availableReplicas")),
        age(d, now),
        names,
        images,
        Value::from(selector),
    ]
}

// ---- ReplicaSet -----------------------------------------------------------------------------

pub(super) const REPLICA_SET: &[Column] = &[
    NAME,
    col("Desired", "integer", "Number of pods wanted."),
    col("Current", "integer", "Number of pods that exist."),
    col("Ready", "integer", "Number of pods that are ready."),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

pub(super) fn replica_set(rs: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let [names, images] = container_cells(arr_at(rs, "spec.template.spec.containers"));
    vec![
        name_cell(rs),
        Value::from(replicas(rs)),
        Value::from(int_at(rs, "status.replicas")),
        Value::from(int_at(rs, "status.readyReplicas")),
        age(rs, now),
        names,
        images,
        Value::from(format_label_selector(at(rs, "spec.selector"))),
    ]
}

// ---- StatefulSet ----------------------------------------------------------------------------

pub(super) const STATEFUL_SET: &[Column] = &[
    NAME,
    col("Ready", "string", "Ready pods out of the desired number."),
    AGE,
    CONTAINERS,
    IMAGES,
];

pub(super) fn stateful_set(sts: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let [names, images] = container_cells(arr_at(sts, "spec.template.spec.containers"));
    vec![
        name_cell(sts),
        Value::from(format!(
            "{}/{}",
            int_at(sts, "status.readyReplicas"),
            replicas(sts)
        )),
        age(sts, now),
        names,
        images,
    ]
}

// ---- DaemonSet ------------------------------------------------------------------------------

pub(super) const DAEMON_SET: &[Column] = &[
    NAME,
    col(
        "Desired",
        "integer",
        "Number of nodes that should run the daemon pod.",
    ),
    col(
        "Current",
        "integer",
        "Number of nodes running at least one daemon pod.",
    ),
    col(
        "Ready",
        "integer",
        "Number of nodes whose daemon pod is ready.",
    ),
    col(
        "Up-to-date",
        "integer",
        "Number of nodes running the current pod template.",
    ),
    col(
        "Available",
        "integer",
        "Number of nodes whose daemon pod is available.",
    ),
    col(
        "Node Selector",
        "string",
        "Node labels that decide where the daemon runs.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

pub(super) fn daemon_set(ds: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let [names, images] = container_cells(arr_at(ds, "spec.template.spec.containers"));
    vec![
        name_cell(ds),
        Value::from(int_at(ds, "status.desiredNumberScheduled")),
        Value::from(int_at(ds, "status.currentNumberScheduled")),
        Value::from(int_at(ds, "status.numberReady")),
        Value::from(int_at(ds, "status.updatedNumberScheduled")),
        Value::from(int_at(ds, "status.numberAvailable")),
        Value::from(format_labels(at(ds, "spec.template.spec.nodeSelector"))),
        age(ds, now),
        names,
        images,
        Value::from(format_label_selector(at(ds, "spec.selector"))),
    ]
}

// ---- ControllerRevision ---------------------------------------------------------------------

pub(super) const CONTROLLER_REVISION: &[Column] = &[
    NAME,
    col(
        "Controller",
        "string",
        "The object that owns this revision, as kind.group/name.",
    ),
    col("Revision", "integer", "The revision number."),
    AGE,
];

pub(super) fn controller_revision(cr: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let controller = arr_at(cr, "metadata.ownerReferences")
        .iter()
        .find(|r| at(r, "controller").and_then(Value::as_bool) == Some(true))
        .map(|r| {
            let api_version = str_at(r, "apiVersion");
            let group = match api_version.split_once('/') {
                Some((group, _)) => group,
                None => "",
            };
            let kind = str_at(r, "kind");
            let group_kind = if group.is_empty() {
                kind.to_string()
            } else {
                format!("{kind}.{group}")
            };
            match group_kind.as_str() {
                "" => str_at(r, "name").to_string(),
                gk => format!("{}/{}", gk.to_lowercase(), str_at(r, "name")),
            }
        })
        .unwrap_or_else(|| "<none>".to_string());
    vec![
        name_cell(cr),
        Value::from(controller),
        Value::from(int_at(cr, "revision")),
        age(cr, now),
    ]
}

// ---- Job ------------------------------------------------------------------------------------

pub(super) const JOB: &[Column] = &[
    NAME,
    col(
        "Status",
        "string",
        "Complete, Failed, Running, Suspended, or another state of the job.",
    ),
    col(
        "Completions",
        "string",
        "Succeeded pods out of the completions wanted.",
    ),
    col(
        "Duration",
        "string",
        "How long the job ran, or has been running.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

/// Whether a job has a condition of this type with status `True`.
fn job_condition(job: &Value, type_: &str) -> bool {
    arr_at(job, "status.conditions")
        .iter()
        .any(|c| str_at(c, "type") == type_ && str_at(c, "status") == "True")
}

pub(super) fn job(job: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let succeeded = int_at(job, "status.succeeded");
    let completions = match at(job, "spec.completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        // A work-queue job: done when any pod succeeds.
        None => match int_at(job, "spec.parallelism") {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let duration = match (
        time_at(job, "status.startTime"),
        time_at(job, "status.completionTime"),
    ) {
        (None, _) => String::new(),
        (Some(start), None) => super::human_duration(now - start),
        (Some(start), Some(end)) => super::human_duration(end - start),
    };
    // Terminal conditions first, then deletion, then the transient states.
    let status = if job_condition(job, "Complete") {
        "Complete"
    } else if job_condition(job, "Failed") {
        "Failed"
    } else if at(job, "metadata.deletionTimestamp").is_some() {
        "Terminating"
    } else if job_condition(job, "Suspended") {
        "Suspended"
    } else if job_condition(job, "FailureTarget") {
        "FailureTarget"
    } else if job_condition(job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let [names, images] = container_cells(arr_at(job, "spec.template.spec.containers"));
    vec![
        name_cell(job),
        Value::from(status),
        Value::from(completions),
        Value::from(duration),
        age(job, now),
        names,
        images,
        // Upstream prints the bare selector here: empty rather than `<none>`.
        Value::from(label_selector_string(at(job, "spec.selector")).unwrap_or_default()),
    ]
}

// ---- CronJob --------------------------------------------------------------------------------

pub(super) const CRON_JOB: &[Column] = &[
    NAME,
    col("Schedule", "string", "The cron schedule."),
    col(
        "Timezone",
        "string",
        "The time zone the schedule is read in.",
    ),
    col("Suspend", "boolean", "Whether new runs are suspended."),
    col("Active", "integer", "Number of jobs currently running."),
    col(
        "Last Schedule",
        "string",
        "How long ago a job was last scheduled.",
    ),
    AGE,
    CONTAINERS,
    IMAGES,
    SELECTOR,
];

pub(super) fn cron_job(cj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let last_schedule = match time_at(cj, "status.lastScheduleTime") {
        Some(t) => since(Some(t), now),
        None => "<none>".to_string(),
    };
    let time_zone = at(cj, "spec.timeZone")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    // Rendered as text even though the column is typed boolean, like upstream.
    let suspend = match at(cj, "spec.suspend").and_then(Value::as_bool) {
        Some(true) => "True",
        Some(false) => "False",
        None => "<unset>",
    };
    let [names, images] =
        container_cells(arr_at(cj, "spec.jobTemplate.spec.template.spec.containers"));
    vec![
        name_cell(cj),
        Value::from(str_at(cj, "spec.schedule")),
        Value::from(time_zone),
        Value::from(suspend),
        Value::from(len_at(cj, "status.active")),
        Value::from(last_schedule),
        age(cj, now),
        names,
        images,
        Value::from(
            label_selector_string(at(cj, "spec.jobTemplate.spec.selector")).unwrap_or_default(),
        ),
    ]
}

// ---- HorizontalPodAutoscaler ----------------------------------------------------------------

pub(super) const HPA: &[Column] = &[
    NAME,
    col("Reference", "string", "The scaled object, as Kind/name."),
    col(
        "Targets",
        "string",
        "Current metric values against their targets.",
    ),
    col(
        "MinPods",
        "string",
        "The lowest replica count the autoscaler will set.",
    ),
    col(
        "MaxPods",
        "string",
        "The highest replica count the autoscaler will set.",
    ),
    col(
        "Replicas",
        "string",
        "The replica count the autoscaler last saw.",
    ),
    AGE,
];

pub(super) fn hpa(hpa: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let reference = format!(
        "{}/{}",
        str_at(hpa, "spec.scaleTargetRef.kind"),
        str_at(hpa, "spec.scaleTargetRef.name")
    );
    let min_pods = match at(hpa, "spec.minReplicas").and_then(Value::as_i64) {
        Some(n) => n.to_string(),
        None => "<unset>".to_string(),
    };
    vec![
        name_cell(hpa),
        Value::from(reference),
        Value::from(format_hpa_metrics(
            arr_at(hpa, "spec.metrics"),
            arr_at(hpa, "status.currentMetrics"),
        )),
        Value::from(min_pods),
        Value::from(int_at(hpa, "spec.maxReplicas")),
        Value::from(int_at(hpa, "status.currentReplicas")),
        age(hpa, now),
    ]
}

/// How many metrics the Targets cell lists before summarising the rest.
const MAX_METRICS: usize = 2;

/// A quantity field in canonical form. Upstream prints a missing quantity pointer as `<nil>`.
fn quantity(obj: Option<&Value>, field: &str) -> String {
    match obj.and_then(|o| at(o, field)) {
        Some(Value::String(s)) => canonical_quantity(s),
        Some(Value::Number(n)) => canonical_quantity(&n.to_string()),
        _ => "<nil>".to_string(),
    }
}

/// The Targets cell: `current/target` per metric, where `current` comes from the status entry
/// at the same index (when it is of the same source type).
fn format_hpa_metrics(specs: &[Value], statuses: &[Value]) -> String {
    if specs.is_empty() {
        return "<none>".to_string();
    }
    let mut list = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        // The status source of the matching type, e.g. `currentMetrics[i].resource`.
        let status_of = |source: &str| {
            statuses
                .get(i)
                .and_then(|s| at(s, source))
                .filter(|s| s.is_object())
        };
        let text = match str_at(spec, "type") {
            source_type @ ("External" | "Object") => {
                let source = if source_type == "External" {
                    "external"
                } else {
                    "object"
                };
                let current = status_of(source);
                if at(spec, &format!("{source}.target.averageValue")).is_some() {
                    let current = match current.and_then(|c| at(c, "current.averageValue")) {
                        Some(_) => quantity(current, "current.averageValue"),
                        None => "<unknown>".to_string(),
                    };
                    format!(
                        "{current}/{} (avg)",
                        quantity(Some(spec), &format!("{source}.target.averageValue"))
                    )
                } else {
                    let current = match current {
                        Some(_) => quantity(current, "current.value"),
                        None => "<unknown>".to_string(),
                    };
                    format!(
                        "{current}/{}",
                        quantity(Some(spec), &format!("{source}.target.value"))
                    )
                }
            }
            "Pods" => {
                let current = match status_of("pods") {
                    Some(c) => quantity(Some(c), "current.averageValue"),
                    None => "<unknown>".to_string(),
                };
                format!(
                    "{current}/{}",
                    quantity(Some(spec), "pods.target.averageValue")
                )
            }
            source_type @ ("Resource" | "ContainerResource") => {
                let source = if source_type == "Resource" {
                    "resource"
                } else {
                    "containerResource"
                };
                let current = status_of(source);
                let text = if at(spec, &format!("{source}.target.averageValue")).is_some() {
                    let current = match current {
                        Some(_) => quantity(current, "current.averageValue"),
                        None => "<unknown>".to_string(),
                    };
                    format!(
                        "{current}/{}",
                        quantity(Some(spec), &format!("{source}.target.averageValue"))
                    )
                } else {
                    let current = match current.and_then(|c| at(c, "current.averageUtilization")) {
                        Some(u) => format!("{}%", u.as_i64().unwrap_or(0)),
                        None => "<unknown>".to_string(),
                    };
                    let target = match at(spec, &format!("{source}.target.averageUtilization")) {
                        Some(u) => format!("{}%", u.as_i64().unwrap_or(0)),
                        None => "<auto>".to_string(),
                    };
                    format!("{current}/{target}")
                };
                // Only plain resource metrics are labelled with the resource name.
                if source_type == "Resource" {
                    format!("{}: {text}", str_at(spec, "resource.name"))
                } else {
                    text
                }
            }
            _ => "<unknown type>".to_string(),
        };
        list.push(text);
    }
    if list.len() > MAX_METRICS {
        let more = list.len() - MAX_METRICS;
        list.truncate(MAX_METRICS);
        format!("{} + {more} more...", list.join(", "))
    } else {
        list.join(", ")
    }
}

// ---- Lease ----------------------------------------------------------------------------------

pub(super) const LEASE: &[Column] = &[
    NAME,
    col("Holder", "string", "Who currently holds the lease."),
    AGE,
];

pub(super) fn lease(lease: &Value, now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(lease),
        Value::from(str_at(lease, "spec.holderIdentity")),
        age(lease, now),
    ]
}

// ---- CustomResourceDefinition ---------------------------------------------------------------

pub(super) const CRD: &[Column] = &[
    NAME,
    col(
        "Created At",
        "date",
        "The time the definition was created, as a timestamp.",
    ),
];

/// Upstream prints a CRD's creation time as a timestamp, not an age.
pub(super) fn crd(crd: &Value, _now: DateTime<Utc>) -> Vec<Value> {
    vec![
        name_cell(crd),
        Value::from(str_at(crd, "metadata.creationTimestamp")),
    ]
}
