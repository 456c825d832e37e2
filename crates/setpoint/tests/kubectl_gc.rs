//! End to end: namespace deletion and cascading deletion with the real `kubectl` against
//! `setpoint up`, whose in-process controllers do the work.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Cluster {
    child: Option<Child>,
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Cluster {
    /// Starts `setpoint <command>` (`up` or `server`) on `data_dir` and waits for the line
    /// that says where it runs.
    fn start(command: &str, data_dir: &Path) -> Cluster {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([command, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start setpoint");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
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
            child: Some(child),
            kubeconfig,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.cache.path())
            .env("HOME", self.cache.path())
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

    /// Whether `kubectl get` answers NotFound for this object.
    fn not_found(&self, args: &[&str]) -> bool {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        let out = self.kubectl(&a);
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
    }

    /// Polls until `f` holds, or panics after 30 s.
    fn eventually(&self, what: &str, f: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("timed out waiting for {what}");
    }

    /// Creates ConfigMap `owner` and `dependents` owned by it (blocking owner deletion).
    fn family(&self, owner: &str, dependents: &[&str]) {
        self.ok(&["create", "configmap", owner]);
        let uid = self.ok(&["get", "configmap", owner, "-o", "jsonpath={.metadata.uid}"]);
        let docs: Vec<String> = dependents
            .iter()
            .map(|d| {
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {d}\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: {owner}\n    uid: {uid}\n    blockOwnerDeletion: true\n"
                )
            })
            .collect();
        let file = self.cache.path().join(format!("{owner}.yaml"));
        std::fs::write(&file, docs.join("---\n")).unwrap();
        self.ok(&["create", "-f", file.to_str().unwrap()]);
    }

    /// Stops the server with SIGTERM and waits for it.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn have_kubectl() -> bool {
    Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn kubectl_deletes_namespaces_and_cascades() {
    if !have_kubectl() {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KUBECTL").is_none(),
            "kubectl is required but not installed"
        );
        eprintln!("kubectl not installed; skipping");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let c = Cluster::start("up", data.path());

    // A namespace with content: kubectl waits until the namespace is gone.
    c.ok(&["create", "namespace", "demo"]);
    c.ok(&[
        "-n",
        "demo",
        "create",
        "configmap",
        "a",
        "--from-literal=k=v",
    ]);
    c.ok(&["-n", "demo", "create", "configmap", "b"]);
    c.ok(&[
        "-n",
        "demo",
        "create",
        "secret",
        "generic",
        "s",
        "--from-literal=k=v",
    ]);
    let out = c.ok(&["delete", "namespace", "demo", "--timeout=60s"]);
    assert!(out.contains("namespace \"demo\" deleted"), "{out}");
    assert!(c.not_found(&["namespace", "demo"]));

    // Foreground: when kubectl returns, the owner is gone, and its dependents went first.
    c.family("owner-fg", &["fg-1", "fg-2"]);
    c.ok(&[
        "delete",
        "configmap",
        "owner-fg",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    assert!(c.not_found(&["configmap", "owner-fg"]));
    assert!(c.not_found(&["configmap", "fg-1"]));
    assert!(c.not_found(&["configmap", "fg-2"]));

    // Orphan: the dependents stay, without their reference to the deleted owner.
    c.family("owner-or", &["or-1", "or-2"]);
    c.ok(&[
        "delete",
        "configmap",
        "owner-or",
        "--cascade=orphan",
        "--timeout=60s",
    ]);
    assert!(c.not_found(&["configmap", "owner-or"]));
    for d in ["or-1", "or-2"] {
        let refs = c.ok(&[
            "get",
            "configmap",
            d,
            "-o",
            "jsonpath={.metadata.ownerReferences}",
        ]);
        assert!(
            refs.trim().is_empty(),
            "{d} still has owner references: {refs}"
        );
    }

    // Background (kubectl's default): the owner goes at once, the collector removes the rest.
    c.family("owner-bg", &["bg-1"]);
    c.ok(&["delete", "configmap", "owner-bg", "--timeout=60s"]);
    c.eventually("background dependents deleted", |c| {
        c.not_found(&["configmap", "bg-1"])
    });
    // The orphans are still there after all that.
    c.ok(&["get", "configmap", "or-1", "or-2"]);
    c.stop();
}

/// Stops a process started by the test.
struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn controller_manager_runs_against_a_separate_server() {
    if !have_kubectl() {
        eprintln!("kubectl not installed; skipping");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // The API server alone runs no controllers: a namespace deletion would hang.
    let c = Cluster::start("server", data.path());
    let manager = Stop(
        Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                "controller-manager",
                "--controllers",
                "namespace,garbagecollector",
            ])
            .env("KUBECONFIG", &c.kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the controller manager"),
    );
    c.ok(&["create", "namespace", "team"]);
    c.ok(&["-n", "team", "create", "configmap", "a"]);
    c.ok(&["delete", "namespace", "team", "--timeout=60s"]);
    assert!(c.not_found(&["namespace", "team"]));
    c.family("owner", &["dep"]);
    c.ok(&["delete", "configmap", "owner"]);
    c.eventually("dependent collected", |c| {
        c.not_found(&["configmap", "dep"])
    });
    // It acted as the elected leader.
    let holder = c.ok(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        "kube-controller-manager",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!holder.trim().is_empty(), "no lease holder");
    drop(manager);
    c.stop();
}
