//! The run's own Events: each fault as it is injected and the cluster's return to
//! convergence after it, written to the workload's namespace as core/v1 Events about that
//! Namespace, so `kubectl get events -n chaos` and the live view's timeline show a run's
//! faults among the controllers' own Events and decisions.
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
            Happened::NotConverged { fault, why } => (
                "Warning",
                "NotConverged",
                format!("not converged after {fault}: {why}"),
            ),
        }
    }
}

/// The Event for `happened`, about the workload's Namespace.
pub fn event(happened: &Happened<'_>, now: chrono::DateTime<chrono::Utc>) -> Value {
    let (kind, reason, message) = happened.parts();
    let at = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "chaos.", "namespace": NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": NAMESPACE},
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
