//! End to end: an operator written with kopf (Python) runs unmodified against `setpoint up`:
//! its create and update handlers report through the status subresource, its delete handler
//! runs behind the finalizer kopf adds, and the object goes once kopf releases it.
//!
//! Skipped (with a message) when kubectl or kopf is missing, unless `SETPOINT_REQUIRE_KOPF`
//! is set (CI installs kopf and sets it).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;

use support::{eventually, Setpoint};

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

fn kopf_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import kopf, kubernetes"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KOPF").is_none(),
            "kopf is required (SETPOINT_REQUIRE_KOPF is set) but `import kopf, kubernetes` fails"
        );
        eprintln!("skipping: kopf (with the kubernetes client) is not installed");
    }
    ok
}

/// The operator process, killed when dropped.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kopf_operator_runs_unmodified() {
    if !support::kubectl_available() || !kopf_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    s.apply(CRD);
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
    let markers = data.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let log = std::fs::File::create(data.path().join("kopf.log")).unwrap();
    let operator = Operator(
        Command::new("python3")
            .args([
                "-m",
                "kopf",
                "run",
                "--standalone",
                "--all-namespaces",
                "--verbose",
            ])
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/kopf/operator.py"
            ))
            .env("KUBECONFIG", &s.kubeconfig)
            .env("WIDGET_MARKERS", &markers)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kopf"),
    );
    let kopf_log = || std::fs::read_to_string(data.path().join("kopf.log")).unwrap_or_default();

    s.apply("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n");
    let message = eventually(
        "kopf's create handler to report",
        Duration::from_secs(60),
        || {
            let m = s.ok(&[
                "get",
                "wd",
                "w1",
                "-o",
                "jsonpath={.status.create_fn.message}",
            ]);
            (!m.is_empty()).then_some(m)
        },
    );
    assert_eq!(message, "created w1 with size 3", "{}", kopf_log());
    let finalizers = s.ok(&["get", "wd", "w1", "-o", "jsonpath={.metadata.finalizers}"]);
    assert!(
        finalizers.contains("kopf.zalando.org/KopfFinalizerMarker"),
        "{finalizers}"
    );
    let annotations = s.ok(&["get", "wd", "w1", "-o", "jsonpath={.metadata.annotations}"]);
    assert!(
        annotations.contains("kopf.zalando.org/last-handled-configuration"),
        "{annotations}"
    );
    // kopf posts its handler logs as Events, in the background.
    eventually("kopf's events", Duration::from_secs(30), || {
        let events = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=w1",
        ]);
        (events.contains("widget w1 has size 3") && events.contains("widget w1 of size 3 created"))
            .then_some(())
    });

    s.ok(&[
        "patch",
        "wd",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":5}}"#,
    ]);
    eventually(
        "kopf's update handler to report",
        Duration::from_secs(60),
        || {
            let m = s.ok(&[
                "get",
                "wd",
                "w1",
                "-o",
                "jsonpath={.status.update_fn.message}",
            ]);
            (m == "updated w1 to size 5").then_some(())
        },
    );

    s.ok(&["delete", "wd", "w1", "--timeout=60s"]);
    assert_eq!(
        std::fs::read_to_string(markers.join("w1")).unwrap(),
        "deleted"
    );
    let gone = s.kubectl(&["get", "wd", "w1"]);
    assert!(!gone.status.success());
    let log = kopf_log();
    assert!(!log.contains("Traceback"), "kopf hit an error:\n{log}");
    drop(operator);
    s.stop();
}
