//! End to end: server-side apply (`kubectl apply --server-side`) with the real `kubectl` against
//! `setpoint up`: create, re-apply after each edit of the manifest, conflicts between managers,
//! `--force-conflicts`, `--show-managed-fields` and `kubectl diff --server-side`.
//!
//! The expected objects follow from server-side apply semantics (fields the manager stops
//! applying are removed, everything else stays) plus the server's defaulting.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Cluster {
    child: Child,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
    manifests: tempfile::TempDir,
}

impl Cluster {
    /// Starts `setpoint up` on `data_dir` and waits for the line naming its kubeconfig.
    fn start(data_dir: &Path) -> Cluster {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            // No node: pods stay Pending, so once the controllers' status writes settle,
            // resourceVersions move only when kubectl writes — which is what this test checks.
            .args(["up", "--no-node", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start setpoint");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut kubeconfig = PathBuf::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let line = lines.next().expect("setpoint printed its address").unwrap();
            if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
                kubeconfig = PathBuf::from(rest);
                break;
            }
        }
        assert!(kubeconfig.exists(), "setpoint did not print its kubeconfig");
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Cluster {
            child,
            kubeconfig,
            home: tempfile::tempdir().unwrap(),
            manifests: tempfile::tempdir().unwrap(),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.home.path().join("cache"))
            .env("HOME", self.home.path())
            .output()
            .expect("run kubectl")
    }

    /// Runs kubectl and returns stdout, panicking with stderr on failure.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Writes `yaml` to a manifest file and returns its path.
    fn manifest(&self, yaml: &str) -> String {
        let file = self.manifests.path().join("manifest.yaml");
        std::fs::write(&file, yaml).unwrap();
        file.to_str().unwrap().to_string()
    }

    /// `kubectl apply --server-side` of `yaml` with extra flags; returns the output.
    fn apply(&self, yaml: &str, extra: &[&str]) -> Output {
        let file = self.manifest(yaml);
        let mut args = vec!["apply", "--server-side", "-f", &file];
        args.extend_from_slice(extra);
        self.kubectl(&args)
    }

    /// Server-side applies `yaml` as `kubectl` and checks kubectl's verdict.
    fn apply_ok(&self, yaml: &str) {
        let out = self.apply(yaml, &[]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "apply failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.trim(),
            "deployment.apps/web-frontend serverside-applied"
        );
    }

    fn get(&self) -> Value {
        let out = self.ok(&[
            "-n",
            "production",
            "get",
            "deployment",
            "web-frontend",
            "-o",
            "json",
            "--show-managed-fields",
        ]);
        let mut d: Value = serde_json::from_str(&out).unwrap();
        // The in-process deployment controller writes the revision annotation and the status
        // as `kube-controller-manager` (as in a real cluster); this test is about kubectl's
        // own field ownership, so those entries are left out.
        if let Some(entries) = d["metadata"]["managedFields"].as_array_mut() {
            entries.retain(|e| e["manager"] != "kube-controller-manager");
        }
        d
    }

    /// `kubectl diff --server-side` exit code.
    fn diff(&self, yaml: &str) -> i32 {
        let file = self.manifest(yaml);
        let out = self.kubectl(&["diff", "--server-side", "-f", &file]);
        out.status.code().expect("kubectl diff exited")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have_kubectl() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

const SEED: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web-frontend, namespace: production}
spec:
  replicas: 3
  selector: {matchLabels: {app: web-frontend}}
  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web-frontend}}
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
        ports: [{containerPort: 80}]
        resources: {requests: {cpu: 100m, memory: 128Mi}}
"#;

/// The seed manifest with one more edit applied at each step.
fn edited(step: usize) -> String {
    let mut yaml = SEED.to_string();
    if step >= 1 {
        yaml = yaml.replace("replicas: 3", "replicas: 5");
    }
    if step >= 2 {
        yaml = yaml.replace("nginx:1.25", "nginx:1.26");
    }
    if step >= 3 {
        yaml = yaml.replace(
            "        ports:",
            "        env: [{name: MODE, value: production}]\n        ports:",
        );
    }
    if step >= 4 {
        yaml = yaml.replace("        ports: [{containerPort: 80}]\n", "");
    }
    if step >= 5 {
        yaml = yaml.replace(
            "  strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}\n",
            "",
        );
    }
    yaml
}

/// The stored container after `step` edits: the manifest's fields plus defaulting.
fn container(step: usize) -> Value {
    let mut c = json!({
        "name": "nginx",
        "image": if step >= 2 { "nginx:1.26" } else { "nginx:1.25" },
        "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    });
    if step < 4 {
        c["ports"] = json!([{"containerPort": 80, "protocol": "TCP"}]);
    }
    if step >= 3 {
        c["env"] = json!([{"name": "MODE", "value": "production"}]);
    }
    c
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                // The deployment controller's own writes (see `Cluster::get`).
                .filter(|e| e["manager"] != "kube-controller-manager")
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_string(),
                        e["operation"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kubectl_server_side_apply() {
    if !have_kubectl() {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KUBECTL").is_none(),
            "kubectl is required but not installed"
        );
        eprintln!("kubectl not installed; skipping");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let c = Cluster::start(data.path());
    c.ok(&["create", "namespace", "production"]);

    // --- create, then the same manifest again changes nothing.
    assert_eq!(c.diff(SEED), 1, "diff of a missing object shows it");
    c.apply_ok(SEED);
    let seeded = c.get();
    assert_eq!(seeded["spec"]["replicas"], 3);
    assert_eq!(
        seeded["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    assert_eq!(
        seeded["spec"]["template"]["spec"]["containers"],
        json!([container(0)])
    );
    assert_eq!(
        managers(&seeded),
        vec![("kubectl".to_string(), "Apply".to_string())]
    );
    let owned = &seeded["metadata"]["managedFields"][0]["fieldsV1"];
    assert_eq!(
        owned["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"nginx\"}"]
            ["f:ports"],
        json!({"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}})
    );
    c.apply_ok(SEED);
    let again = c.get();
    // A no-op apply changes nothing kubectl owns (the controllers may meanwhile have written
    // the status, so the resourceVersion itself can move).
    assert_eq!(
        again["metadata"]["generation"],
        seeded["metadata"]["generation"]
    );
    let entry = |o: &serde_json::Value| {
        o["metadata"]["managedFields"]
            .as_array()
            .and_then(|m| m.iter().find(|e| e["manager"] == "kubectl").cloned())
    };
    assert_eq!(entry(&again), entry(&seeded));

    // --- each edit, applied on its own.
    for step in 1..=5 {
        let yaml = edited(step);
        let before = c.get();
        assert_eq!(c.diff(&yaml), 1, "step {step}: diff shows the change");
        assert_eq!(
            c.get()["metadata"]["resourceVersion"],
            before["metadata"]["resourceVersion"],
            "step {step}: diff stores nothing"
        );
        c.apply_ok(&yaml);
        let d = c.get();
        assert_eq!(
            d["spec"]["replicas"],
            if step >= 1 { 5 } else { 3 },
            "step {step}"
        );
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"],
            json!([container(step)]),
            "step {step}"
        );
        let strategy = if step >= 5 {
            // No one owns the strategy any more: it is gone and defaulted again.
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        } else {
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
        };
        assert_eq!(d["spec"]["strategy"], strategy, "step {step}");
        assert_eq!(d["metadata"]["generation"], json!(step + 1), "step {step}");
        assert_eq!(c.diff(&yaml), 0, "step {step}: no diff once applied");
    }
    let last = edited(5);

    // --- a second manager changing replicas conflicts, naming the owner.
    let other = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web-frontend, namespace: production}\nspec:\n  replicas: 8\n";
    let out = c.apply(other, &["--field-manager=other"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Apply failed with 1 conflict: conflict with \"kubectl\" using apps/v1: .spec.replicas"
        ),
        "{stderr}"
    );
    assert_eq!(c.get()["spec"]["replicas"], 5);

    // --- --force-conflicts takes ownership.
    let out = c.apply(other, &["--field-manager=other", "--force-conflicts"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = c.get();
    assert_eq!(d["spec"]["replicas"], 8);
    assert_eq!(
        managers(&d),
        vec![
            ("kubectl".to_string(), "Apply".to_string()),
            ("other".to_string(), "Apply".to_string())
        ]
    );
    let entries = d["metadata"]["managedFields"].as_array().unwrap();
    assert!(entries[0]["fieldsV1"]["f:spec"].get("f:replicas").is_none());
    assert_eq!(
        entries[1]["fieldsV1"],
        json!({"f:spec": {"f:replicas": {}}})
    );

    // The YAML view shows both managers.
    let yaml = c.ok(&[
        "-n",
        "production",
        "get",
        "deployment",
        "web-frontend",
        "-o",
        "yaml",
        "--show-managed-fields",
    ]);
    assert!(yaml.contains("manager: kubectl"), "{yaml}");
    assert!(yaml.contains("manager: other"), "{yaml}");

    // Now the original manager conflicts with `other` over its replicas: 5.
    let out = c.apply(&last, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("conflict with \"other\""));
    let file = c.manifest(other);
    let out = c.kubectl(&[
        "diff",
        "--server-side",
        "--field-manager=other",
        "-f",
        &file,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "other's manifest is what is stored"
    );

    // --- moving from client-side apply: the same manifest applied server-side shares the
    // fields with `kubectl-client-side-apply` (no conflict), kubectl records the
    // last-applied annotation under `kubectl-last-applied` without wiping the spec, and its
    // migration patch hands the client-side manager's fields to `kubectl`.
    let legacy = SEED.replace("name: web-frontend,", "name: legacy,");
    let file = c.manifest(&legacy);
    let out = c.ok(&["apply", "-f", &file]);
    assert_eq!(out.trim(), "deployment.apps/legacy created");
    let out = c.ok(&["apply", "--server-side", "-f", &file]);
    assert_eq!(out.trim(), "deployment.apps/legacy serverside-applied");
    let out = c.ok(&[
        "-n",
        "production",
        "get",
        "deployment",
        "legacy",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    let d: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"],
        json!([container(0)])
    );
    assert!(
        d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    assert_eq!(
        managers(&d),
        vec![
            ("kubectl".to_string(), "Apply".to_string()),
            ("kubectl-last-applied".to_string(), "Apply".to_string())
        ]
    );
}
