//! End to end: `kubectl explain` and client-side field validation with the real `kubectl`
//! against `setpoint up`, which both read the server's OpenAPI v3 documents.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::io::Write;

mod support;

use support::Setpoint;

/// Collapses the wrapped lines kubectl prints into single spaces.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn kubectl_explain_and_validation_use_the_openapi_schemas() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));

    let out = s.ok(&["explain", "deployment.spec.strategy.rollingUpdate"]);
    assert!(out.contains("KIND:       Deployment"), "{out}");
    assert!(out.contains("maxSurge\t<IntOrString>"), "{out}");
    assert!(out.contains("maxUnavailable\t<IntOrString>"), "{out}");
    let text = flat(&out);
    assert!(
        text.contains(
            "The maximum number of pods that can be scheduled above the desired number of pods."
        ),
        "{out}"
    );
    assert!(
        text.contains("The maximum number of pods that can be unavailable during the update."),
        "{out}"
    );
    assert!(!text.contains("+optional"), "{out}");

    let out = s.ok(&["explain", "pods.spec.containers"]);
    assert!(out.contains("FIELD: containers <[]Container>"), "{out}");
    assert!(out.contains("image\t<string>"), "{out}");
    assert!(out.contains("name\t<string> -required-"), "{out}");
    assert!(
        flat(&out).contains("List of containers belonging to the pod."),
        "{out}"
    );

    let out = s.ok(&["explain", "deployment", "--recursive"]);
    assert!(out.contains("maxSurge\t<IntOrString>"), "{out}");

    // Unknown fields: the server validates strictly for kubectl's default --validate.
    let manifest = data.path().join("dep.yaml");
    let mut f = std::fs::File::create(&manifest).unwrap();
    f.write_all(
        b"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        bogusField: 1
",
    )
    .unwrap();
    drop(f);
    let path = manifest.to_str().unwrap();
    let out = s.kubectl(&["apply", "-f", path]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "apply with an unknown field succeeded"
    );
    assert!(stderr.contains("bogusField"), "{stderr}");
    let out = s.ok(&["apply", "--validate=false", "-f", path]);
    assert!(out.contains("deployment.apps/web created"), "{out}");
    // The server dropped the unknown field, as Kubernetes does, so a second apply goes through
    // the patch path (OpenAPI v2 request included) with a patch that sets it again: kubectl
    // says "configured", and the field is still not stored.
    let out = s.ok(&["apply", "--validate=false", "-f", path]);
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    // (kubectl's last-applied annotation still quotes it; the container does not have it.)
    let stored = s.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.spec.template.spec.containers[0]}",
    ]);
    assert!(
        stored.contains("nginx") && !stored.contains("bogusField"),
        "{stored}"
    );
    // A change is sent as a strategic merge patch: kubectl fetches /openapi/v2 in protobuf
    // and computes the patch from its patch metadata (merge keys and strategies).
    std::fs::write(
        &manifest,
        std::fs::read_to_string(&manifest)
            .unwrap()
            .replace("nginx:1.25", "nginx:1.26"),
    )
    .unwrap();
    let out = s.ok(&["apply", "--validate=false", "-f", path]);
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let image = s.ok(&[
        "get",
        "deployment",
        "web",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.26");
}
