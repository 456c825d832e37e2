//! End to end: a Job runs real processes on the local node of `setpoint up` to completion; an
//! Indexed Job gives each pod its index; a `podFailurePolicy` `FailJob` rule fails a Job at once.
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

#[test]
fn indexed_job_gives_each_pod_its_index() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    s.apply("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: shards\nspec:\n  completions: 5\n  parallelism: 3\n  completionMode: Indexed\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: work\n        image: busybox\n        command: [sh, -c, 'echo shard $JOB_COMPLETION_INDEX of 5']\n");
    let waited = s.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/shards",
        "--timeout=120s",
    ]);
    assert!(waited.contains("condition met"), "{waited}");
    let indexes = s.ok(&[
        "get",
        "job",
        "shards",
        "-o",
        "jsonpath={.status.completedIndexes} {.status.succeeded}",
    ]);
    assert_eq!(indexes, "0-4 5");
    // Every pod: its index in the annotation, the label, its name and hostname, and its log.
    let pods = s.ok(&[
        "get",
        "pods",
        "-l",
        "batch.kubernetes.io/job-name=shards",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.annotations.batch\.kubernetes\.io/job-completion-index} {.metadata.labels.batch\.kubernetes\.io/job-completion-index} {.spec.hostname}{"\n"}{end}"#,
    ]);
    let mut seen = Vec::new();
    for line in support::lines(&pods) {
        let f: Vec<&str> = line.split(' ').collect();
        let (name, annotation, label, hostname) = (f[0], f[1], f[2], f[3]);
        assert_eq!(annotation, label, "{line}");
        assert!(name.starts_with(&format!("shards-{annotation}-")), "{line}");
        assert_eq!(hostname, format!("shards-{annotation}"), "{line}");
        let log = s.ok(&["logs", name]);
        assert_eq!(log.trim(), format!("shard {annotation} of 5"), "{name}");
        seen.push(annotation.parse::<i32>().unwrap());
    }
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4], "one pod per index, none retried");
    s.stop();
}

#[test]
fn pod_failure_policy_fails_the_job_at_once() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    s.apply("apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: fatal\nspec:\n  backoffLimit: 6\n  podFailurePolicy:\n    rules:\n    - action: FailJob\n      onExitCodes:\n        operator: In\n        values: [42]\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        image: busybox\n        command: [sh, -c, 'exit 42']\n");
    let waited = s.ok(&[
        "wait",
        "--for=condition=Failed",
        "job/fatal",
        "--timeout=120s",
    ]);
    assert!(waited.contains("condition met"), "{waited}");
    let pod = s.ok(&[
        "get",
        "pods",
        "-l",
        "job-name=fatal",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ]);
    assert!(!pod.contains(' '), "one pod, no retries: {pod}");
    let failed = s.ok(&[
        "get",
        "job",
        "fatal",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Failed")].reason}|{.status.conditions[?(@.type=="Failed")].message}|{.status.conditions[?(@.type=="FailureTarget")].reason}"#,
    ]);
    assert_eq!(
        failed,
        format!("PodFailurePolicy|Container main for pod default/{pod} failed with exit code 42 matching FailJob rule at index 0|PodFailurePolicy")
    );
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=fatal",
        "-o",
        "jsonpath={range .items[*]}{.reason}{\"\\n\"}{end}",
    ]);
    assert!(events.contains("PodFailurePolicy"), "{events}");
    s.stop();
}
