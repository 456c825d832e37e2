//! The run's own Events: each fault as it is injected and the cluster's return to
//! convergence after it, written to the workload's namespace as core/v1 Events about that
//! Namespace, and each workload object's own return (a Deployment, StatefulSet or Job that was
//! seen out of convergence after the fault) as an Event about that object, so
//! `kubectl get events -n chaos`, `kubectl describe` and the live view's timeline show a
//! run's faults and what each did to each object among the controllers' own Events and
//! decisions.
//!
//! Best effort: an Event that cannot be written (the API server is the fault) is logged and
//! skipped; the run's report is the record.

use std::time::Duration;

use serde_json::{json, Value};
use setpoint_runtime::client::Client;

use super::workload::NAMESPACE;

/// The `source.component` and `reportingComponent` of the run's Events.
pub const COMPONENT: &str = "setpoint-chaos";

/// How long writing one Event may take before it is skipped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// What happened, as an Event's reason, type and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happened<'a> {
    /// A fault is about to be injected.
    Injecting { fault: &'a str, process: &'a str },
    /// Every object converged again this long after the target recovered.
    Converged { fault: &'a str, after: Duration },
    /// One workload object (`deployments/<ns>/<name>`, `statefulsets/…`, `jobs/…`), seen out
    /// of convergence after the fault, was converged again this long after the recovery.
    ObjectConverged {
        fault: &'a str,
        object: &'a str,
        after: Duration,
    },
    /// The cluster did not converge in time.
    NotConverged { fault: &'a str, why: &'a str },
}

impl Happened<'_> {
    /// `(type, reason, message)`.
    fn parts(&self) -> (&'static str, &'static str, String) {
        match self {
            Happened::Injecting { fault, process } => {
                ("Warning", "FaultInjected", format!("{fault} on {process}"))
            }
            Happened::Converged { fault, after } => (
                "Normal",
                "Converged",
                format!(
                    "every object converged {:.2}s after recovery from {fault}",
                    after.as_secs_f64()
                ),
            ),
            Happened::ObjectConverged { fault, after, .. } => (
                "Normal",
                "Converged",
                format!(
                    "converged {:.2}s after recovery from {fault}",
                    after.as_secs_f64()
                ),
            ),
            Happened::NotConverged { fault, why } => (
                "Warning",
                "NotConverged",
                format!("not converged after {fault}: {why}"),
            ),
        }
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
        "metadata": {"generateName": "chaos.", "namespace": NAMESPACE},
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

/// Writes the Event for `happened` at `ago` before now, or logs why it could not.
pub async fn record(client: &Client, happened: Happened<'_>, ago: Duration) {
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
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!("chaos: event {happened:?} not written: {e}"),
        Err(_) => tracing::debug!("chaos: event {happened:?} not written within {WRITE_TIMEOUT:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_the_fault_and_the_time_to_converge() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let e = event(
            &Happened::Injecting {
                fault: "sigkill api-server",
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

        let e = event(
            &Happened::Converged {
                fault: "sigkill api-server",
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

        let e = event(
            &Happened::ObjectConverged {
                fault: "sigkill agent",
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

        let e = event(
            &Happened::NotConverged {
                fault: "latency api-server",
                why: "web-0: 2 of 3 ready",
            },
            now,
        );
        assert_eq!(e["reason"], "NotConverged");
        assert_eq!(
            e["message"],
            "not converged after latency api-server: web-0: 2 of 3 ready"
        );
    }
}
