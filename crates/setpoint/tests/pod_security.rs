//! End to end: Pod Security admission with the real kubectl against `setpoint server`. A
//! namespace labelled `enforce=restricted` refuses a privileged pod with upstream's message;
//! `warn=baseline` lets a pod with a host namespace in and kubectl prints the warning, for a
//! Deployment's template too; tightening `enforce` warns about the pods already there; labels
//! that name no level are refused; the cluster's own namespaces cannot be deleted.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

mod support;

use support::{expect_failure, Setpoint};

/// Runs `kubectl create -f` of `manifest`; returns (success, stdout, stderr).
fn create(s: &Setpoint, name: &str, manifest: &str) -> (bool, String, String) {
    let file = s.home().join(format!("{name}.yaml"));
    std::fs::write(&file, manifest).unwrap();
    let out = s.kubectl(&["create", "-f", file.to_str().unwrap()]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pod_security_labels_enforce_and_warn_with_upstreams_messages() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A server without a controller manager has no `default` ServiceAccounts: as upstream's
    // integration tests do, it admits pods without one.
    let s = Setpoint::start(
        &["server", "--disable-admission-plugins=ServiceAccount"],
        &dir.path().join("data"),
    );

    // enforce=restricted: a privileged pod is refused, naming every check it fails.
    s.ok(&["create", "namespace", "strict"]);
    s.ok(&[
        "label",
        "namespace",
        "strict",
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let (ok, _, err) = create(
        &s,
        "privileged",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: strict}
spec:
  containers:
  - name: c
    image: busybox
    securityContext: {privileged: true}
"#,
    );
    assert!(
        !ok,
        "a privileged pod was admitted under enforce=restricted"
    );
    assert!(
        err.contains(
            r#"pods "p" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c" must not set securityContext.privileged=true), allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
        ),
        "{err}"
    );
    expect_failure(
        "the refused pod",
        &s.kubectl(&["get", "pod", "p", "-n", "strict"]),
    );
    // A pod that meets the restricted level is admitted there.
    let (ok, _, err) = create(
        &s,
        "hardened",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: hardened, namespace: strict}
spec:
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: c
    image: busybox
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
"#,
    );
    assert!(ok, "{err}");
    assert!(!err.contains("Warning"), "{err}");

    // warn=baseline: the pod is created, and kubectl prints the warning.
    s.ok(&["create", "namespace", "warned"]);
    s.ok(&[
        "label",
        "namespace",
        "warned",
        "pod-security.kubernetes.io/warn=baseline",
    ]);
    let (ok, _, err) = create(
        &s,
        "hostnet",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: h, namespace: warned}
spec:
  hostNetwork: true
  containers:
  - name: c
    image: busybox
"#,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains(
            r#"Warning: would violate PodSecurity "baseline:latest": host namespaces (hostNetwork=true)"#
        ),
        "{err}"
    );
    s.ok(&["get", "pod", "h", "-n", "warned"]);
    // A Deployment's pod template is checked for warn too.
    let (ok, _, err) = create(
        &s,
        "deployment",
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: d, namespace: warned}
spec:
  selector: {matchLabels: {app: d}}
  template:
    metadata: {labels: {app: d}}
    spec:
      hostPID: true
      containers:
      - name: c
        image: busybox
"#,
    );
    assert!(ok, "{err}");
    assert!(
        err.contains(
            r#"Warning: would violate PodSecurity "baseline:latest": host namespaces (hostPID=true)"#
        ),
        "{err}"
    );

    // Tightening enforce over pods that violate it warns about them (a LIST first, which
    // waits until the API server's cache holds every pod).
    s.ok(&["get", "pods", "-n", "warned"]);
    let out = s.kubectl(&[
        "label",
        "namespace",
        "warned",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(
            r#"Warning: existing pods in namespace "warned" violate the new PodSecurity enforce level "baseline:latest""#
        ),
        "{err}"
    );
    assert!(err.contains("Warning: h: host namespaces"), "{err}");

    // A level that does not exist is refused (422; kubectl prints an Invalid status without
    // causes as upstream's does) and the label is not stored.
    let err = s.fails(&[
        "label",
        "namespace",
        "warned",
        "pod-security.kubernetes.io/enforce=strict",
        "--overwrite",
    ]);
    assert!(
        err.contains(r#"The namespaces "warned" is invalid"#),
        "{err}"
    );
    let labels = s.ok(&[
        "get",
        "namespace",
        "warned",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    assert!(
        labels.contains(r#""pod-security.kubernetes.io/enforce":"baseline""#),
        "{labels}"
    );

    // NamespaceLifecycle keeps the cluster's own namespaces.
    let err = s.fails(&["delete", "namespace", "default"]);
    assert!(
        err.contains(r#"namespaces "default" is forbidden: this namespace may not be deleted"#),
        "{err}"
    );
    s.stop();
}
