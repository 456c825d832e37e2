//! End to end: custom resources with the real `kubectl` against `setpoint up` — a CRD is
//! applied and at once served (plural, short name, category, printer columns, explain), its
//! schema defaults, prunes and validates objects, several versions share storage, the scale
//! subresource follows the CRD's paths, and deleting the CRD deletes its objects.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::time::{Duration, Instant};

mod support;

use support::Setpoint;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: cronbackups.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: cronbackups
    singular: cronbackup
    kind: CronBackup
    shortNames: [cb]
    categories: [all]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - name: Schedule
      type: string
      jsonPath: .spec.schedule
    - name: Database
      type: string
      jsonPath: .spec.database
    - name: Age
      type: date
      jsonPath: .metadata.creationTimestamp
    schema:
      openAPIV3Schema:
        type: object
        description: A scheduled backup of one database.
        properties:
          spec:
            type: object
            required: [database]
            x-kubernetes-validations:
            - rule: "self.retentionDays <= 365"
              message: retention is at most a year
            - rule: "self.retentionDays >= oldSelf.retentionDays"
              message: retention cannot be shortened
            properties:
              schedule:
                type: string
                default: "0 2 * * *"
                description: When to back up, in cron syntax.
              database:
                type: string
                pattern: '^[a-z][a-z0-9-]*$'
              retentionDays:
                type: integer
                default: 30
                minimum: 1
              replicas:
                type: integer
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// Runs kubectl until it succeeds or the deadline passes (for what follows a CRD change).
fn ok_within(s: &Setpoint, args: &[&str], within: Duration) -> String {
    support::eventually(&format!("kubectl {args:?} to succeed"), within, || {
        let out = s.kubectl(args);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    })
}

#[test]
fn custom_resources_with_kubectl() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    let dir = data.path();

    let crd = write(dir, "crd.yaml", CRD);
    let applied = Instant::now();
    s.ok(&["apply", "-f", &crd]);
    let established = s.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=10s",
        "crd/cronbackups.example.com",
    ]);
    assert!(established.contains("condition met"), "{established}");
    let backup = write(
        dir,
        "backup.yaml",
        "apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: nightly\nspec:\n  database: orders\n  replicas: 2\n",
    );
    s.ok(&["apply", "-f", &backup]);
    eprintln!(
        "CRD apply to first object accepted: {:.0} ms",
        applied.elapsed().as_secs_f64() * 1000.0
    );

    // Served under its plural, short name, category; printer columns in the table.
    let table = s.ok(&["get", "cronbackups"]);
    let header = table.lines().next().unwrap();
    for col in ["NAME", "SCHEDULE", "DATABASE", "AGE"] {
        assert!(header.contains(col), "{table}");
    }
    assert!(
        table.contains("nightly") && table.contains("0 2 * * *") && table.contains("orders"),
        "{table}"
    );
    assert!(s
        .ok(&["get", "cb", "-o", "name"])
        .contains("cronbackup.example.com/nightly"));
    let all = s.ok(&["get", "all"]);
    assert!(all.contains("cronbackup.example.com/nightly"), "{all}");

    // Defaults appear; generation starts at 1.
    let yaml = s.ok(&["get", "cb", "nightly", "-o", "yaml"]);
    assert!(yaml.contains("schedule: 0 2 * * *"), "{yaml}");
    assert!(yaml.contains("retentionDays: 30"), "{yaml}");
    assert!(yaml.contains("generation: 1"), "{yaml}");

    // Schema violations: 422 naming the field.
    let bad = write(
        dir,
        "bad.yaml",
        "apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: broken\nspec:\n  database: Not_Valid\n  retentionDays: 0\n",
    );
    let err = s.fails(&["apply", "-f", &bad]);
    assert!(err.contains("spec.database"), "{err}");
    assert!(err.contains("spec.retentionDays"), "{err}");
    assert!(err.contains("is invalid"), "{err}");
    // CEL rules: plain and transition rules.
    let long = write(
        dir,
        "long.yaml",
        "apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: long\nspec:\n  database: orders\n  retentionDays: 400\n",
    );
    let err = s.fails(&["apply", "-f", &long]);
    assert!(err.contains("retention is at most a year"), "{err}");
    let err = s.fails(&[
        "patch",
        "cb",
        "nightly",
        "--type=merge",
        "-p",
        r#"{"spec":{"retentionDays":7}}"#,
    ]);
    assert!(err.contains("retention cannot be shortened"), "{err}");
    let missing = write(
        dir,
        "missing.yaml",
        "apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: nodb\nspec: {}\n",
    );
    let err = s.fails(&["apply", "-f", &missing]);
    assert!(err.contains("spec.database: Required value"), "{err}");

    // Unknown fields: strict validation refuses them; without it they are pruned.
    let extra = write(
        dir,
        "extra.yaml",
        "apiVersion: example.com/v1\nkind: CronBackup\nmetadata:\n  name: extra\nspec:\n  database: users\n  bogus: 1\n",
    );
    let err = s.fails(&["apply", "-f", &extra]);
    assert!(err.contains("unknown field \"spec.bogus\""), "{err}");
    s.ok(&["apply", "--validate=false", "-f", &extra]);
    // (kubectl's last-applied annotation still quotes it; the object does not have it.)
    let spec = s.ok(&["get", "cb", "extra", "-o", "jsonpath={.spec}"]);
    assert!(spec.contains("users") && !spec.contains("bogus"), "{spec}");

    // Status is a subresource: written through it, ignored on the main resource.
    s.ok(&[
        "patch",
        "cb",
        "nightly",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":2,"lastBackup":"never"}}"#,
    ]);
    let status = s.ok(&[
        "get",
        "cb",
        "nightly",
        "-o",
        "jsonpath={.status.lastBackup}",
    ]);
    assert_eq!(status, "never");
    // The scale subresource follows the CRD's paths.
    s.ok(&["scale", "cb", "nightly", "--replicas=5"]);
    assert_eq!(
        s.ok(&["get", "cb", "nightly", "-o", "jsonpath={.spec.replicas}"]),
        "5"
    );
    let gen = s.ok(&[
        "get",
        "cb",
        "nightly",
        "-o",
        "jsonpath={.metadata.generation}",
    ]);
    assert_eq!(gen, "2", "a spec change bumps the generation");
    // A PUT of the Scale is answered with the Scale, not the stored object.
    let scale_path = "/apis/example.com/v1/namespaces/default/cronbackups/nightly/scale";
    let mut scale: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "--raw", scale_path])).unwrap();
    assert_eq!(scale["spec"]["replicas"], 5, "{scale}");
    scale["spec"]["replicas"] = serde_json::json!(6);
    let scale_file = write(dir, "scale.json", &scale.to_string());
    let answer: serde_json::Value =
        serde_json::from_str(&s.ok(&["replace", "--raw", scale_path, "-f", &scale_file])).unwrap();
    assert_eq!(
        (
            &answer["apiVersion"],
            &answer["kind"],
            &answer["spec"]["replicas"]
        ),
        (
            &serde_json::json!("autoscaling/v1"),
            &serde_json::json!("Scale"),
            &serde_json::json!(6)
        ),
        "{answer}"
    );

    // Strategic merge patch is refused for custom resources, as upstream.
    let err = s.fails(&[
        "patch",
        "cb",
        "nightly",
        "--type=strategic",
        "-p",
        r#"{"spec":{"replicas":1}}"#,
    ]);
    assert!(
        err.contains("is not supported by example.com/v1, Kind=CronBackup"),
        "{err}"
    );

    // The other served version reads the same object with its own apiVersion.
    let beta = s.ok(&[
        "get",
        "cronbackups.v1beta1.example.com",
        "nightly",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert_eq!(beta, "example.com/v1beta1");

    // explain reads the schema from the OpenAPI document.
    let explain = ok_within(&s, &["explain", "cronbackup.spec"], Duration::from_secs(10));
    assert!(explain.contains("schedule"), "{explain}");
    assert!(
        explain.contains("When to back up, in cron syntax."),
        "{explain}"
    );

    // Deleting the CRD deletes its objects first, then it goes.
    s.ok(&["delete", "crd", "cronbackups.example.com", "--timeout=30s"]);
    let crds = s.ok(&["get", "crd", "-o", "name"]);
    assert!(!crds.contains("cronbackups"), "{crds}");
    let err = s.fails(&["get", "cronbackups"]);
    // (Depending on kubectl's discovery cache it says so, or gets the server's 404.)
    assert!(
        err.contains("the server doesn't have a resource type")
            || err.contains("the server could not find the requested resource"),
        "{err}"
    );

    // Re-created, it starts empty.
    s.ok(&["apply", "-f", &crd]);
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=10s",
        "crd/cronbackups.example.com",
    ]);
    let list = ok_within(
        &s,
        &["get", "cronbackups", "-o", "name"],
        Duration::from_secs(10),
    );
    assert!(list.trim().is_empty(), "{list}");
    s.stop();
}
