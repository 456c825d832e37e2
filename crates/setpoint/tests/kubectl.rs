//! End to end: the real `kubectl` against `setpoint up` on a temporary data dir.
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
    url: String,
}

impl Cluster {
    /// Starts `setpoint up` on `data_dir` and waits for the line that says where it runs.
    fn start(data_dir: &Path) -> Cluster {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(["up", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start setpoint");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let mut url = String::new();
        let mut kubeconfig = PathBuf::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let line = lines.next().expect("setpoint printed its address").unwrap();
            if let Some(rest) = line.strip_prefix("Setpoint is running at ") {
                url = rest.split_whitespace().next().unwrap().to_string();
            }
            if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
                kubeconfig = PathBuf::from(rest);
                break;
            }
        }
        assert!(
            !url.is_empty() && kubeconfig.exists(),
            "setpoint did not print its kubeconfig"
        );
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Cluster {
            child: Some(child),
            kubeconfig,
            cache: tempfile::tempdir().unwrap(),
            url,
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

    /// Runs kubectl expecting failure; returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded"
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// Stops the server with SIGTERM (a clean shutdown) and waits for it, within a deadline.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        if rx.recv_timeout(Duration::from_secs(15)).is_err() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("setpoint did not shut down on SIGTERM");
        }
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
fn kubectl_tour() {
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
    assert!(c.url.starts_with("https://"));

    let v = c.ok(&["version", "-o", "json"]);
    assert!(v.contains("\"minor\": \"32\""), "{v}");

    assert!(c
        .ok(&["create", "namespace", "demo"])
        .contains("namespace/demo created"));
    let out = c.ok(&[
        "-n",
        "demo",
        "create",
        "deployment",
        "demo",
        "--image=nginx:1.25",
        "--replicas=3",
    ]);
    assert!(out.contains("deployment.apps/demo created"), "{out}");

    let table = c.ok(&["-n", "demo", "get", "deploy"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(table.contains("demo"), "{table}");

    let yaml = c.ok(&["-n", "demo", "get", "deploy", "demo", "-o", "yaml"]);
    for expected in [
        "maxSurge: 25%",
        "revisionHistoryLimit: 10",
        "progressDeadlineSeconds: 600",
        "restartPolicy: Always",
        "imagePullPolicy: IfNotPresent",
        "terminationGracePeriodSeconds: 30",
        "dnsPolicy: ClusterFirst",
    ] {
        assert!(yaml.contains(expected), "missing {expected:?} in\n{yaml}");
    }
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "deploy",
            "demo",
            "-o",
            "jsonpath={.metadata.generation}"
        ]),
        "1"
    );

    assert!(c
        .ok(&["-n", "demo", "scale", "deployment", "demo", "--replicas=5"])
        .contains("scaled"));
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "deploy",
            "demo",
            "-o",
            "jsonpath={.metadata.generation} {.spec.replicas}"
        ]),
        "2 5"
    );

    let all = c.ok(&["get", "all", "-n", "demo"]);
    assert!(all.contains("deployment.apps/demo"), "{all}");

    let resources = c.ok(&["api-resources"]);
    for (name, short) in [
        ("deployments", "deploy"),
        ("pods", "po"),
        ("namespaces", "ns"),
        ("configmaps", "cm"),
        ("replicasets", "rs"),
        ("services", "svc"),
        ("leases", ""),
    ] {
        let line = resources
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not in api-resources:\n{resources}"));
        if !short.is_empty() {
            assert!(
                line.split_whitespace()
                    .any(|w| w.split(',').any(|s| s == short)),
                "{line}"
            );
        }
    }

    let manifests = tempfile::tempdir().unwrap();
    let bad = manifests.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n  namespace: demo\ndata:\n  a: b\n").unwrap();
    let err = c.fails(&["create", "-f", bad.to_str().unwrap()]);
    assert!(
        err.contains("is invalid") && err.contains("metadata.name"),
        "{err}"
    );

    let good = manifests.path().join("cm.yaml");
    std::fs::write(&good, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: demo\ndata:\n  a: b\n").unwrap();
    assert!(c
        .ok(&["create", "-f", good.to_str().unwrap()])
        .contains("configmap/settings created"));
    let err = c.fails(&["create", "-f", good.to_str().unwrap()]);
    assert!(err.contains("AlreadyExists"), "{err}");

    // `kubectl get -w` prints later changes.
    let mut watch = Command::new("kubectl")
        .args([
            "-n",
            "demo",
            "get",
            "configmaps",
            "-w",
            "--output-watch-events",
        ])
        .env("KUBECONFIG", &c.kubeconfig)
        .env("KUBECACHEDIR", c.cache.path())
        .env("HOME", c.cache.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut wlines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The initial listing comes first.
    let mut saw_initial = false;
    for line in wlines.by_ref() {
        if line.unwrap().contains("settings") {
            saw_initial = true;
            break;
        }
    }
    assert!(saw_initial);
    c.ok(&[
        "-n",
        "demo",
        "create",
        "configmap",
        "later",
        "--from-literal=x=y",
    ]);
    let mut saw_later = false;
    for line in wlines.by_ref() {
        let line = line.unwrap();
        if line.contains("later") {
            assert!(line.starts_with("ADDED"), "{line}");
            saw_later = true;
            break;
        }
    }
    assert!(saw_later);
    let _ = watch.kill();
    let _ = watch.wait();

    assert!(c
        .ok(&["-n", "demo", "delete", "configmap", "settings"])
        .contains("deleted"));
    let err = c.fails(&["-n", "demo", "get", "configmap", "settings"]);
    assert!(err.contains("NotFound"), "{err}");
    assert!(c
        .ok(&["-n", "demo", "delete", "deployment", "demo"])
        .contains("deleted"));

    // Restart on the same data dir: objects and resourceVersions survive.
    let rv_before: i64 = c
        .ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "later",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    c.stop();
    let c = Cluster::start(data.path());
    assert_eq!(
        c.ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "later",
            "-o",
            "jsonpath={.metadata.resourceVersion}"
        ])
        .parse::<i64>()
        .unwrap(),
        rv_before
    );
    c.ok(&["-n", "demo", "create", "configmap", "after-restart"]);
    let rv_after: i64 = c
        .ok(&[
            "-n",
            "demo",
            "get",
            "configmap",
            "after-restart",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    assert!(rv_after > rv_before);
    c.stop();
}
