//! The run's own Events: each fault as it is injected and the cluster's return to
//! convergence after it, written to the workload's namespace as core/v1 Events about that
//! Namespace, and each workload object's own return (a Deployment, StatefulSet or Job that was
//! seen out of convergence after the fault) as an Event about that object, so
//! `kubectl get events -n chaos`, `kubectl describe` and the live view's timeline show a
//! run's faults and what each did to each object among the controllers' own Events and
//! decisions.
//!
//! Each Event also carries annotations, so that readers (the live view's chaos panel) group a
//! run's Events by fault without parsing messages:
//!
//! - `setpoint.io/chaos-fault`: the fault's label, as the report names its type
//!   (`sigkill agent`);
//! - `setpoint.io/chaos-fault-index`: the fault's number within its schedule, from 1, which
//!   tells apart repeated faults of one type;
//! - `setpoint.io/chaos-seed`: the schedule's seed, which tells apart the faults of different
//!   schedules (`--schedules` runs each on a cluster of its own, but Events may be read
//!   together, and a fault's number repeats in every schedule);
//! - `setpoint.io/chaos-process`, on `FaultInjected`: the process the fault hit
//!   (`controller-manager-1`);
//! - `setpoint.io/chaos-converged-ms`, on `Converged`: the time from the recovery to
//!   convergence, in whole milliseconds.
//!
//! Best effort: an Event that cannot be written (the API server is the fault) is logged and
//! skipped; the run's report is the record.

use std::time::Duration;

use serde_json::{json, Value};
use setpoint_runtime::client::Client;

use super::workload::NAMESPACE;

/// The `source.component` and `reportingComponent` of the run's Events.
pub const COMPONENT: &str = "setpoint-chaos";

/// The annotation naming the fault's label.
pub const FAULT_ANNOTATION: &str = "setpoint.io/chaos-fault";
/// The annotation numbering the fault within its schedule, from 1.
pub const FAULT_INDEX_ANNOTATION: &str = "setpoint.io/chaos-fault-index";
/// The annotation naming the schedule's seed.
pub const SEED_ANNOTATION: &str = "setpoint.io/chaos-seed";
/// The annotation naming the process a `FaultInjected` Event's fault hit.
pub const PROCESS_ANNOTATION: &str = "setpoint.io/chaos-process";
/// The annotation giving a `Converged` Event's time to converge, in milliseconds.
pub const CONVERGED_MS_ANNOTATION: &str = "setpoint.io/chaos-converged-ms";

/// How long writing one Event may take before it is skipped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which fault of which schedule an Event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultRef<'a> {
    /// The fault's label, as the report names its type (`sigkill agent`).
    pub label: &'a str,
    /// The fault's number within the schedule, from 1.
    pub index: usize,
    /// The schedule's seed.
    pub seed: u64,
}

/// What happened, as an Event's reason, type and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happened<'a> {
    /// A fault is about to be injected.
    Injecting {
        fault: FaultRef<'a>,
        process: &'a str,
    },
    /// Every object converged again this long after the target recovered.
    Converged {
        fault: FaultRef<'a>,
        after: Duration,
    },
    /// One workload object (`deployments/<ns>/<name>`, `statefulsets/…`, `jobs/…`), seen out
    /// of convergence after the fault, was converged again this long after the recovery.
    ObjectConverged {
        fault: FaultRef<'a>,
        object: &'a str,
        after: Duration,
    },
    /// The cluster did not converge in time.
    NotConverged { fault: FaultRef<'a>, why: &'a str },
}

impl Happened<'_> {
    /// The fault this is about.
    fn fault(&self) -> &FaultRef<'_> {
        match self {
            Happened::Injecting { fault, .. }
            | Happened::Converged { fault, .. }
            | Happened::ObjectConverged { fault, .. }
            | Happened::NotConverged { fault, .. } => fault,
        }
    }

    /// `(type, reason, message)`.
    fn parts(&self) -> (&'static str, &'static str, String) {
        let fault = self.fault().label;
        match self {
            Happened::Injecting { process, .. } => {
                ("Warning", "FaultInjected", format!("{fault} on {process}"))
            }
            Happened::Converged { after, .. } => (
                "Normal",
                "Converged",
                format!(
                    "every object converged {:.2}s after recovery from {fault}",
                    after.as_secs_f64()
                ),
            ),
            Happened::ObjectConverged { after, .. } => (
                "Normal",
                "Converged",
                format!(
                    "converged {:.2}s after recovery from {fault}",
                    after.as_secs_f64()
                ),
            ),
            Happened::NotConverged { why, .. } => (
                "Warning",
                "NotConverged",
                format!("not converged after {fault}: {why}"),
            ),
        }
    }

    /// The Event's annotations (see the module's documentation).
    fn annotations(&self) -> Value {
        let fault = self.fault();
        let mut a = json!({
            FAULT_ANNOTATION: fault.label,
            FAULT_INDEX_ANNOTATION: fault.index.to_string(),
            SEED_ANNOTATION: fault.seed.to_string(),
        });
        match self {
            Happened::Injecting { process, .. } => {
                a[PROCESS_ANNOTATION] = json!(process);
            }
            Happened::Converged { after, .. } | Happened::ObjectConverged { after, .. } => {
                a[CONVERGED_MS_ANNOTATION] = json!(after.as_millis().to_string());
            }
            Happened::NotConverged { .. } => {}
        }
        a
    }
}

/// What an Event about `happened` is about: the workload object it names, else the
/// workload's Namespace.
fn involved(happened: &Happened<'_>) -> Value {
    if let Happened::ObjectConverged { object, .. } = happened {
        let mut parts = object.splitn(3, '/');
        let (resource, name) = (parts.next().unwrap_or(""), parts.nth(1).unwrap_or(""));
        let kind = match resource {
            "deployments" => Some(("apps/v1", "Deployment")),
            "statefulsets" => Some(("apps/v1", "StatefulSet")),
            "jobs" => Some(("batch/v1", "Job")),
            _ => None,
        };
        if let Some((api_version, kind)) = kind {
            return json!({"apiVersion": api_version, "kind": kind, "namespace": NAMESPACE,
                          "name": name});
        }
    }
    json!({"apiVersion": "v1", "kind": "Namespace", "name": NAMESPACE})
}

/// The Event for `happened`, about the workload object it names or else the workload's
/// Namespace.
pub fn event(happened: &Happened<'_>, now: chrono::DateTime<chrono::Utc>) -> Value {
    let (kind, reason, message) = happened.parts();
    let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            // A prefix must itself be a DNS subdomain but for one trailing '-': "chaos." is
            // refused (422), as upstream refuses it.
            "generateName": "chaos-",
            "namespace": NAMESPACE,
            "annotations": happened.annotations(),
        },
        "involvedObject": involved(happened),
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    })
}

/// Writes the Event for `happened` at `ago` before now; whether it was written. A refusal
/// is logged as a warning: the run's faults are over by the time it writes, so a refused
/// Event is a defect of the Event, not the fault at work.
pub async fn record(client: &Client, happened: Happened<'_>, ago: Duration) -> bool {
    let at = chrono::Utc::now() - chrono::Duration::from_std(ago).unwrap_or_default();
    let body = event(&happened, at);
    let path = format!("/api/v1/namespaces/{NAMESPACE}/events");
    let write = client.request(
        http::Method::POST,
        &path,
        Some("application/json"),
        bytes::Bytes::from(body.to_string()),
    );
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::warn!("chaos: event {happened:?} not written: {e}");
            false
        }
        Err(_) => {
            tracing::warn!("chaos: event {happened:?} not written within {WRITE_TIMEOUT:?}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KILL_API_SERVER: FaultRef<'static> = FaultRef {
        label: "sigkill api-server",
        index: 1,
        seed: 42,
    };

    /// The Event's annotations, as strings.
    fn annotations(e: &Value) -> Vec<(&str, &str)> {
        let mut a: Vec<(&str, &str)> = e["metadata"]["annotations"]
            .as_object()
            .expect("annotations")
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str().expect("string annotation values")))
            .collect();
        a.sort();
        a
    }

    #[test]
    fn events_name_the_fault_and_the_time_to_converge() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let e = event(
            &Happened::Injecting {
                fault: KILL_API_SERVER,
                process: "api-server",
            },
            now,
        );
        assert_eq!(e["type"], "Warning");
        assert_eq!(e["reason"], "FaultInjected");
        assert_eq!(e["message"], "sigkill api-server on api-server");
        assert_eq!(e["involvedObject"]["kind"], "Namespace");
        assert_eq!(e["involvedObject"]["name"], NAMESPACE);
        assert_eq!(e["metadata"]["namespace"], NAMESPACE);
        assert_eq!(e["lastTimestamp"], "2026-01-02T03:04:05Z");
        // The API server validates a generateName as a name whose trailing '-' is masked.
        let prefix = e["metadata"]["generateName"].as_str().unwrap();
        let masked = match prefix.strip_suffix('-') {
            Some(p) => format!("{p}a"),
            None => prefix.to_string(),
        };
        assert_eq!(
            setpoint_api::names::is_dns1123_subdomain(&masked),
            Ok(()),
            "{prefix}"
        );
        assert_eq!(
            annotations(&e),
            [
                ("setpoint.io/chaos-fault", "sigkill api-server"),
                ("setpoint.io/chaos-fault-index", "1"),
                ("setpoint.io/chaos-process", "api-server"),
                ("setpoint.io/chaos-seed", "42"),
            ]
        );

        let e = event(
            &Happened::Converged {
                fault: KILL_API_SERVER,
                after: Duration::from_millis(2346),
            },
            now,
        );
        assert_eq!(e["type"], "Normal");
        assert_eq!(e["reason"], "Converged");
        assert_eq!(
            e["message"],
            "every object converged 2.35s after recovery from sigkill api-server"
        );
        assert_eq!(
            annotations(&e),
            [
                ("setpoint.io/chaos-converged-ms", "2346"),
                ("setpoint.io/chaos-fault", "sigkill api-server"),
                ("setpoint.io/chaos-fault-index", "1"),
                ("setpoint.io/chaos-seed", "42"),
            ]
        );

        let e = event(
            &Happened::ObjectConverged {
                fault: FaultRef {
                    label: "sigkill agent",
                    index: 7,
                    seed: 43,
                },
                object: "statefulsets/chaos/db-0",
                after: Duration::from_millis(1234),
            },
            now,
        );
        assert_eq!(e["reason"], "Converged");
        assert_eq!(
            e["message"],
            "converged 1.23s after recovery from sigkill agent"
        );
        assert_eq!(e["involvedObject"]["kind"], "StatefulSet");
        assert_eq!(e["involvedObject"]["apiVersion"], "apps/v1");
        assert_eq!(e["involvedObject"]["name"], "db-0");
        assert_eq!(e["involvedObject"]["namespace"], NAMESPACE);
        assert_eq!(
            annotations(&e),
            [
                ("setpoint.io/chaos-converged-ms", "1234"),
                ("setpoint.io/chaos-fault", "sigkill agent"),
                ("setpoint.io/chaos-fault-index", "7"),
                ("setpoint.io/chaos-seed", "43"),
            ]
        );

        let e = event(
            &Happened::NotConverged {
                fault: FaultRef {
                    label: "latency api-server",
                    index: 2,
                    seed: 42,
                },
                why: "web-0: 2 of 3 ready",
            },
            now,
        );
        assert_eq!(e["reason"], "NotConverged");
        assert_eq!(
            e["message"],
            "not converged after latency api-server: web-0: 2 of 3 ready"
        );
        assert_eq!(
            annotations(&e),
            [
                ("setpoint.io/chaos-fault", "latency api-server"),
                ("setpoint.io/chaos-fault-index", "2"),
                ("setpoint.io/chaos-seed", "42"),
            ]
        );
    }
}
