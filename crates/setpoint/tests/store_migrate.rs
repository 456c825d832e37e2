//! End to end: a cluster moves from the embedded store to etcd with `setpoint store export` /
//! `setpoint store import`, and its objects keep their uids, generations, creation timestamps
//! and managed fields.
//!
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../../setpoint-store/tests/support/etcd_server.rs"]
mod etcd_server;

use etcd_server::TestEtcd;

/// One `setpoint` server process and the kubeconfig it wrote.
struct Server {
    child: Option<Child>,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Server {
    fn start(args: &[&str], data_dir: &Path) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .env("SETPOINT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start setpoint");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut kubeconfig = PathBuf::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
                kubeconfig = PathBuf::from(rest);
                break;
            }
        }
        assert!(kubeconfig.exists(), "setpoint did not print its kubeconfig");
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child: Some(child),
            kubeconfig,
            home: tempfile::tempdir().unwrap(),
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

    /// An object's metadata (with managed fields), less `resourceVersion`, which is the one
    /// thing a move between stores changes.
    fn metadata(&self, args: &[&str]) -> serde_json::Value {
        let mut full = args.to_vec();
        full.extend(["-o", "json", "--show-managed-fields"]);
        let obj: serde_json::Value = serde_json::from_str(&self.ok(&full)).unwrap();
        let mut meta = obj["metadata"].clone();
        meta.as_object_mut().unwrap().remove("resourceVersion");
        meta
    }

    /// Stops the server with SIGTERM and waits for it, within a deadline.
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        if rx.recv_timeout(Duration::from_secs(15)).is_err() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("setpoint did not shut down on SIGTERM");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `setpoint store …`.
fn store_cmd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .arg("store")
        .args(args)
        .env("SETPOINT_LOG", "warn")
        .output()
        .expect("run setpoint store")
}

fn store_ok(args: &[&str]) -> String {
    let out = store_cmd(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "setpoint store {args:?} failed:\n{stderr}"
    );
    stderr
}

fn store_fails(args: &[&str]) -> String {
    let out = store_cmd(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "setpoint store {args:?} unexpectedly succeeded:\n{stderr}"
    );
    stderr
}

fn have_kubectl() -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KUBECTL").is_none(),
            "kubectl is required but not installed"
        );
        eprintln!("kubectl not installed; skipping");
    }
    ok
}

#[test]
fn embedded_to_etcd_keeps_objects() {
    if !have_kubectl() {
        return;
    }
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let embedded_dir = tempfile::tempdir().unwrap();
    let embedded_data = embedded_dir.path().to_str().unwrap();

    let source = Server::start(&["up"], embedded_dir.path());
    source.ok(&["create", "namespace", "demo"]);
    source.ok(&[
        "-n",
        "demo",
        "create",
        "deployment",
        "web",
        "--image=nginx:1.25",
    ]);
    // A spec change bumps the generation past 1, so it is something to preserve.
    source.ok(&["-n", "demo", "scale", "deployment", "web", "--replicas=3"]);
    source.ok(&[
        "-n",
        "demo",
        "create",
        "service",
        "clusterip",
        "web",
        "--tcp=80:80",
    ]);
    let deployment = source.metadata(&["-n", "demo", "get", "deployment", "web"]);
    assert_eq!(deployment["generation"], 2, "{deployment}");
    let service = source.metadata(&["-n", "demo", "get", "service", "web"]);
    let cluster_ip = source.ok(&[
        "-n",
        "demo",
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);

    // The running server holds the store's lock: the export says so rather than failing
    // obscurely.
    let err = store_fails(&["export", "--data-dir", embedded_data, "--output", "-"]);
    assert!(err.contains("stop the setpoint server"), "{err}");
    source.stop();

    let export_file = embedded_dir.path().join("cluster.export");
    let export_path = export_file.to_str().unwrap();
    let said = store_ok(&[
        "export",
        "--data-dir",
        embedded_data,
        "--output",
        export_path,
    ]);
    assert!(said.contains("exported"), "{said}");
    let text = std::fs::read_to_string(&export_file).unwrap();
    assert!(text.starts_with("{\"format\":\"setpoint-export\",\"version\":1,"));
    assert!(text.contains("/registry/_allocations/serviceips/"));
    // Objects are embedded as JSON, readable with text tools.
    assert!(text.contains(&format!(
        "\"uid\":\"{}\"",
        deployment["uid"].as_str().unwrap()
    )));

    let etcd_flags = ["--store", "etcd", "--etcd-endpoints", &etcd.url];
    let import = |extra: &[&'static str]| {
        let mut args = vec!["import", "--input", export_path];
        args.extend(etcd_flags);
        args.extend(extra.iter().copied());
        args
    };
    store_ok(&import(&[]));
    // A second import finds the store non-empty, and is refused unless forced.
    let err = store_fails(&import(&[]));
    assert!(err.contains("not empty"), "{err}");
    let said = store_ok(&import(&["--force"]));
    assert!(said.contains("overwriting"), "{said}");

    // A server on etcd, with the first cluster's certificates (so its kubeconfig still works
    // and the service account tokens it signed stay valid).
    let etcd_dir = tempfile::tempdir().unwrap();
    let pki = etcd_dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    for entry in std::fs::read_dir(embedded_dir.path().join("pki")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), pki.join(entry.file_name())).unwrap();
    }
    let mut server_args = vec!["server"];
    server_args.extend(etcd_flags);
    let target = Server::start(&server_args, etcd_dir.path());
    assert_eq!(
        target.metadata(&["-n", "demo", "get", "deployment", "web"]),
        deployment
    );
    assert_eq!(
        target.metadata(&["-n", "demo", "get", "service", "web"]),
        service
    );
    assert_eq!(
        target.ok(&[
            "-n",
            "demo",
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]),
        cluster_ip
    );
    // The allocation moved with the service: a new service gets a different address.
    target.ok(&[
        "-n",
        "demo",
        "create",
        "service",
        "clusterip",
        "other",
        "--tcp=80:80",
    ]);
    let other_ip = target.ok(&[
        "-n",
        "demo",
        "get",
        "service",
        "other",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert_ne!(other_ip, cluster_ip);
    target.stop();

    // And back with `store migrate`: etcd → a fresh embedded data dir holds the same bytes.
    let back_dir = tempfile::tempdir().unwrap();
    let back_data = back_dir.path().to_str().unwrap();
    let from = format!("etcd:{}", etcd.url);
    let to = format!("embedded:{back_data}");
    let said = store_ok(&["migrate", "--from", &from, "--to", &to]);
    assert!(said.contains("copied"), "{said}");
    let err = store_fails(&["migrate", "--from", &from, "--to", &to]);
    assert!(err.contains("not empty"), "{err}");
    let back_file = back_dir.path().join("back.export");
    let back_path = back_file.to_str().unwrap();
    store_ok(&["export", "--data-dir", back_data, "--output", back_path]);
    let back_text = std::fs::read_to_string(&back_file).unwrap();
    let deployment_line = |t: &str| {
        t.lines()
            .find(|l| l.contains("\"/registry/apps/deployments/demo/web\""))
            .map(str::to_owned)
    };
    assert!(deployment_line(&text).is_some());
    assert_eq!(deployment_line(&back_text), deployment_line(&text));
}
