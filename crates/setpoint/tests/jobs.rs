//! End to end: a Job runs real processes on the local node of `setpoint up` to completion.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

#[test]
fn job_completes_with_real_processes() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    s.apply("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: count\nspec:\n  completions: 3\n  parallelism: 2\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: work\n        image: busybox\n        command: [sh, -c, 'echo working on $(POD_NAME); sleep 0.5; echo done']\n        env:\n        - name: POD_NAME\n          valueFrom: {fieldRef: {fieldPath: metadata.name}}\n");
    let waited = s.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/count",
        "--timeout=120s",
    ]);
    assert!(waited.contains("condition met"), "{waited}");
    let succeeded = s.ok(&["get", "job", "count", "-o", "jsonpath={.status.succeeded}"]);
    assert_eq!(succeeded, "3");
    let phases = s.ok(&[
        "get",
        "pods",
        "-l",
        "job-name=count",
        "-o",
        "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
    ]);
    let phases: Vec<&str> = phases.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        phases,
        vec!["Succeeded"; 3],
        "exactly three pods, all succeeded"
    );
    let logs = s.ok(&["logs", "job/count"]);
    assert!(
        logs.contains("working on count-") && logs.contains("done"),
        "{logs}"
    );
    let table = s.ok(&["get", "job", "count"]);
    assert!(table.contains("3/3"), "{table}");
    // The pods' exit codes were real: a failing Job fails.
    s.apply("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: fails\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: work\n        image: busybox\n        command: [sh, -c, 'exit 3']\n");
    eventually("the failing Job to fail", Duration::from_secs(60), || {
        let r = s.ok(&[
            "get",
            "job",
            "fails",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Failed")].reason}"#,
        ]);
        (r == "BackoffLimitExceeded").then_some(())
    });
    let code = s.ok(&[
        "get",
        "pods",
        "-l",
        "job-name=fails",
        "-o",
        "jsonpath={.items[0].status.containerStatuses[0].state.terminated.exitCode}",
    ]);
    assert_eq!(code, "3");
    s.stop();
}
