//! End to end: `setpoint bench density` against a `setpoint up` on the embedded store and
//! against a second, independent `setpoint up --store etcd`, then `setpoint bench compare`
//! on the two reports.
//!
//! Both clusters run their local node too: the benchmark's pods must go only to the
//! simulated nodes it hosts, never to a real node.
//!
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod support;

use support::{Etcd, Setpoint};

/// Runs a small density benchmark against `s`, hosting 3 simulated nodes; returns the report
/// and the raw log's lines.
fn density(s: &Setpoint, dir: &Path, name: &str) -> (Value, Vec<Value>) {
    let report = dir.join(format!("{name}.json"));
    let raw = dir.join(format!("{name}.jsonl"));
    let out = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["bench", "density", "--nodes", "3"])
        .args(["--deployments", "3", "--replicas", "2", "--quiet"])
        .args(["--timeout-seconds", "90", "--json"])
        .arg(&report)
        .arg("--raw-log")
        .arg(&raw)
        .arg("--kubeconfig")
        .arg(&s.kubeconfig)
        .env("SETPOINT_LOG", "warn")
        .output()
        .expect("run setpoint bench");
    let table = support::expect_success(&format!("bench against {name}"), &out);
    assert!(table.contains("pods Running per second"), "{table}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let log = std::fs::read_to_string(&raw)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (report, log)
}

/// What every report of this small run must say, checked against its raw log.
fn check(name: &str, report: &Value, log: &[Value]) {
    assert_eq!(report["benchmark"], "density", "{name}: {report}");
    assert_eq!(report["timed_out"], false, "{name}: {report}");
    assert_eq!(report["pods"], 6, "{name}: {report}");
    assert_eq!(report["pods_running"], 6, "{name}: {report}");
    assert_eq!(report["deployments_available"], 3, "{name}: {report}");
    // Only the 3 nodes the run hosts take its pods (the cluster's own node does not).
    assert_eq!(report["nodes"], 3, "{name}: {report}");
    assert!(report["deletion_seconds"].as_f64().unwrap() > 0.0);
    let prefix = format!("bench-{}-", report["run_id"].as_str().unwrap());
    let placed: Vec<&str> = log
        .iter()
        .filter(|e| e["kind"] == "pod_scheduled")
        .map(|e| e["node"].as_str().unwrap())
        .collect();
    assert_eq!(placed.len(), 6, "{name}: {placed:?}");
    assert!(
        placed.iter().all(|n| n.starts_with(&prefix)),
        "{name}: a pod went to a node the run does not host: {placed:?}"
    );
    let running = log.iter().filter(|e| e["kind"] == "pod_running").count();
    assert_eq!(running, 6, "{name}");
}

#[test]
fn density_against_embedded_and_etcd_then_compare() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();

    let embedded = Setpoint::up(&dir.path().join("embedded"));
    let (a, log_a) = density(&embedded, dir.path(), "embedded");
    embedded.stop();
    check("embedded", &a, &log_a);

    let on_etcd = Setpoint::start(
        &["up", "--store", "etcd", "--etcd-endpoints", &etcd.url],
        &dir.path().join("etcd"),
    );
    let (b, log_b) = density(&on_etcd, dir.path(), "etcd");
    on_etcd.stop();
    check("etcd", &b, &log_b);

    let out = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["bench", "compare"])
        .arg(dir.path().join("embedded.json"))
        .arg(dir.path().join("etcd.json"))
        .output()
        .expect("run setpoint bench compare");
    let text = support::expect_success("setpoint bench compare", &out);
    assert!(
        text.contains("embedded.json") && text.contains("etcd.json"),
        "{text}"
    );
    // The headline figure, with both runs' values and their ratio on one line.
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("total_seconds"))
        .unwrap_or_else(|| panic!("no total_seconds row:\n{text}"));
    let (ta, tb) = (
        a["total_seconds"].as_f64().unwrap(),
        b["total_seconds"].as_f64().unwrap(),
    );
    assert!(
        line.contains(&format!("{:.2}", tb / ta)),
        "{line} (a {ta}, b {tb})"
    );

    // Reports of different benchmarks are refused rather than compared.
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"benchmark": "churn", "total_seconds": 1}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["bench", "compare"])
        .arg(dir.path().join("embedded.json"))
        .arg(&other)
        .output()
        .unwrap();
    let err = support::expect_failure("compare density with churn", &out);
    assert!(err.contains("different benchmarks"), "{err}");
}
