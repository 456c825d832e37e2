//! End to end: the HorizontalPodAutoscaler controller with the real `kubectl` against
//! `setpoint up`, synced every second (`--horizontal-pod-autoscaler-sync-period=1s`).
//!
//! The drift story: a Deployment scaled by hand past its autoscaler's `maxReplicas` is
//! pulled back to it at the next sync, and one scaled below `minReplicas` is brought up to
//! it — with no metrics needed, as upstream clamps before it reads any. Meanwhile the
//! autoscaler says why it cannot compute a count from its CPU metric (the pods request no
//! CPU), and `kubectl get hpa` prints `<unknown>/70%`. The same holds for a custom resource
//! with a scale subresource, found through discovery.
//!
//! The autoscaler is made by `kubectl autoscale`, which posts autoscaling/v1: it is stored as
//! v2 and read back either way.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(60);

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: nginx
        image: nginx:1.25
"#;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: workers.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: workers, singular: worker, kind: Worker}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer}
          status:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: string}
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .status.selector
"#;

fn jsonpath(s: &Setpoint, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &p]);
    s.ok(&args).trim().to_string()
}

/// The message of the newest Event of `reason` about the autoscaler `name`, once there is one.
fn event(s: &Setpoint, name: &str, reason: &str, contains: &str) -> Option<String> {
    let out = s.ok(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.kind=HorizontalPodAutoscaler,involvedObject.name={name},reason={reason}"),
        "-o",
        "jsonpath={range .items[*]}{.message}{\"\\n\"}{end}",
    ]);
    lines(&out).into_iter().find(|m| m.contains(contains))
}

fn condition(s: &Setpoint, name: &str, type_: &str) -> String {
    jsonpath(
        s,
        &["hpa", name],
        &format!(
            "{{.status.conditions[?(@.type==\"{type_}\")].status}} {{.status.conditions[?(@.type==\"{type_}\")].reason}}: {{.status.conditions[?(@.type==\"{type_}\")].message}}"
        ),
    )
}

fn replicas_become(s: &Setpoint, what: &[&str], n: i64) {
    eventually(&format!("{what:?} at {n} replicas"), WAIT, || {
        (jsonpath(s, what, "{.spec.replicas}") == n.to_string()).then_some(())
    });
}

#[test]
fn hand_scaled_targets_are_pulled_back_within_bounds() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &["up", "--horizontal-pod-autoscaler-sync-period=1s"],
        &data.path().join("data"),
    );
    s.apply(WEB);
    // kubectl 1.32 creates the autoscaler as autoscaling/v1, stored as v2.
    let created = s.ok(&[
        "autoscale",
        "deployment",
        "web",
        "--min=2",
        "--max=5",
        "--cpu-percent=70",
    ]);
    assert!(created.contains("autoscaled"), "{created}");

    // Within bounds, the autoscaler reads the metrics, and says why it cannot use them.
    let active = eventually("ScalingActive False", WAIT, || {
        let c = condition(&s, "web", "ScalingActive");
        c.starts_with("False FailedGetResourceMetric").then_some(c)
    });
    assert!(
        active.contains(
            ": the HPA was unable to compute the replica count: failed to get cpu utilization: "
        ),
        "{active}"
    );
    let able = condition(&s, "web", "AbleToScale");
    assert!(
        able.starts_with(
            "True SucceededGetScale: the HPA controller was able to get the target's current scale"
        ),
        "{able}"
    );
    eventually("the FailedComputeMetricsReplicas event", WAIT, || {
        event(
            &s,
            "web",
            "FailedComputeMetricsReplicas",
            "invalid metrics (1 invalid out of 1), first error is: failed to get cpu resource metric value: failed to get cpu utilization: ",
        )
    });
    assert_eq!(
        jsonpath(&s, &["deployment", "web"], "{.spec.replicas}"),
        "3"
    );
    assert_eq!(
        jsonpath(&s, &["hpa", "web"], "{.status.currentReplicas}"),
        "3"
    );
    let table = s.ok(&["get", "hpa", "web"]);
    let rows = lines(&table);
    let header: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "REFERENCE",
            "TARGETS",
            "MINPODS",
            "MAXPODS",
            "REPLICAS",
            "AGE"
        ]
    );
    let row: Vec<&str> = rows[1].split_whitespace().collect();
    assert_eq!(
        &row[..6],
        ["web", "Deployment/web", "cpu:", "<unknown>/70%", "2", "5"],
        "{table}"
    );

    // The drift story: scaled by hand to 20, pulled back to the maximum at the next sync.
    s.ok(&["scale", "deployment", "web", "--replicas=20"]);
    replicas_become(&s, &["deployment", "web"], 5);
    eventually("the SuccessfulRescale event", WAIT, || {
        event(
            &s,
            "web",
            "SuccessfulRescale",
            "New size: 5; reason: Current number of replicas above Spec.MaxReplicas",
        )
    });
    eventually("the autoscaler's status", WAIT, || {
        let st = jsonpath(
            &s,
            &["hpa", "web"],
            "{.status.desiredReplicas} {.status.lastScaleTime}",
        );
        (st.starts_with("5 ") && st.len() > 3).then_some(())
    });
    // ... and below the minimum, brought up to it.
    s.ok(&["scale", "deployment", "web", "--replicas=1"]);
    replicas_become(&s, &["deployment", "web"], 2);
    eventually("the SuccessfulRescale event", WAIT, || {
        event(
            &s,
            "web",
            "SuccessfulRescale",
            "New size: 2; reason: Current number of replicas below Spec.MinReplicas",
        )
    });
    assert_eq!(
        jsonpath(&s, &["hpa", "web"], "{.status.observedGeneration}"),
        "1"
    );

    // A custom resource with a scale subresource, resolved through discovery.
    s.apply(CRD);
    eventually("the Worker kind served", WAIT, || {
        s.kubectl(&["get", "workers"])
            .status
            .success()
            .then_some(())
    });
    s.apply("apiVersion: example.com/v1\nkind: Worker\nmetadata: {name: w}\nspec: {replicas: 9}\n");
    s.apply(
        r#"apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: w
spec:
  scaleTargetRef: {apiVersion: example.com/v1, kind: Worker, name: w}
  minReplicas: 1
  maxReplicas: 4
"#,
    );
    replicas_become(&s, &["worker", "w"], 4);
    eventually("the Worker's SuccessfulRescale event", WAIT, || {
        event(
            &s,
            "w",
            "SuccessfulRescale",
            "New size: 4; reason: Current number of replicas above Spec.MaxReplicas",
        )
    });
    // A scale target that does not exist: AbleToScale says so.
    s.apply(
        r#"apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: ghost
spec:
  scaleTargetRef: {apiVersion: example.com/v1, kind: Ghost, name: g}
  maxReplicas: 4
"#,
    );
    let ghost = eventually("AbleToScale False", WAIT, || {
        let c = condition(&s, "ghost", "AbleToScale");
        c.starts_with("False FailedGetScale").then_some(c)
    });
    assert!(
        ghost.ends_with(
            "the HPA controller was unable to get the target's current scale: no matches for kind \"Ghost\" in group \"example.com\""
        ),
        "{ghost}"
    );
    s.stop();
}

/// The seeds' Deployment on simulated nodes, each pod requesting 100m of CPU and steered to
/// use 140m.
const FRONTEND: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web-frontend
spec:
  replicas: 3
  selector:
    matchLabels: {app: web-frontend}
  template:
    metadata:
      labels: {app: web-frontend}
      annotations:
        setpoint.dev/simulated-cpu: 140m
    spec:
      nodeSelector: {setpoint.dev/simulated: "true"}
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: nginx:1.25
        resources:
          requests: {cpu: 100m}
"#;

/// The seeds' autoscaler, with a `behavior` that lets it add at most 3 pods in 10 minutes
/// (so the new pods' figures cannot push it past 6 while the test looks) and scale down
/// after a 5 s window instead of 5 minutes.
const FRONTEND_HPA: &str = r#"apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: web-frontend-hpa
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: web-frontend
  minReplicas: 2
  maxReplicas: 10
  metrics:
  - type: Resource
    resource:
      name: cpu
      target:
        type: Utilization
        averageUtilization: 70
  behavior:
    scaleUp:
      policies:
      - {type: Pods, value: 3, periodSeconds: 600}
    scaleDown:
      stabilizationWindowSeconds: 5
"#;

#[test]
fn steered_cpu_scales_up_by_the_formula_and_down_after_the_window() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "up",
            "--simulate",
            "2",
            "--metric-resolution",
            "1s",
            "--horizontal-pod-autoscaler-sync-period=1s",
        ],
        &data.path().join("data"),
    );
    s.apply(FRONTEND);
    // Every pod has figures (two samples after it started) before the autoscaler exists,
    // so its first sync sees 140 % on all three.
    eventually("140m on three pods", WAIT, || {
        let top = s.kubectl(&["top", "pods", "-l", "app=web-frontend", "--no-headers"]);
        let out = String::from_utf8_lossy(&top.stdout).to_string();
        let rows = lines(&out);
        (rows.len() == 3
            && rows
                .iter()
                .all(|r| r.split_whitespace().nth(1) == Some("140m")))
        .then_some(())
    });
    s.apply(FRONTEND_HPA);
    // ceil(3 × 140 / 70) = 6.
    replicas_become(&s, &["deployment", "web-frontend"], 6);
    eventually("the SuccessfulRescale event", WAIT, || {
        event(
            &s,
            "web-frontend-hpa",
            "SuccessfulRescale",
            "New size: 6; reason: cpu resource utilization (percentage of request) above target",
        )
    });
    let active = condition(&s, "web-frontend-hpa", "ScalingActive");
    assert_eq!(
        active,
        "True ValidMetricFound: the HPA was able to successfully calculate a replica count from cpu resource utilization (percentage of request)"
    );
    eventually("kubectl get hpa shows 140%/70%", WAIT, || {
        let out = s.ok(&["get", "hpa", "web-frontend-hpa", "--no-headers"]);
        let row: Vec<String> = out.split_whitespace().map(String::from).collect();
        (row.get(2).map(String::as_str) == Some("cpu:")
            && row.get(3).map(String::as_str) == Some("140%/70%")
            && row.get(6).map(String::as_str) == Some("6"))
        .then_some(())
    });
    // Six pods at 140 % would ask for 12; the policy holds it at 6 and says so.
    eventually("ScalingLimited by the policy", WAIT, || {
        let c = condition(&s, "web-frontend-hpa", "ScalingLimited");
        (c == "True ScaleUpLimit: the desired replica count is increasing faster than the maximum scale rate")
            .then_some(())
    });
    assert_eq!(
        jsonpath(&s, &["deployment", "web-frontend"], "{.spec.replicas}"),
        "6"
    );

    // The load stops: 10m each is 10 %, ceil(6 × 10 / 70) = 1, held at the minimum of 2,
    // once the 5 s window has passed.
    s.ok(&[
        "annotate",
        "pods",
        "-l",
        "app=web-frontend",
        "setpoint.dev/simulated-cpu=10m",
        "--overwrite",
    ]);
    replicas_become(&s, &["deployment", "web-frontend"], 2);
    let message = eventually("the scale-down event", WAIT, || {
        event(
            &s,
            "web-frontend-hpa",
            "SuccessfulRescale",
            "New size: 2; reason: All metrics below target",
        )
    });
    assert_eq!(message, "New size: 2; reason: All metrics below target");
    let limited = condition(&s, "web-frontend-hpa", "ScalingLimited");
    assert_eq!(
        limited,
        "True TooFewReplicas: the desired replica count is less than the minimum replica count"
    );
    s.stop();
}
