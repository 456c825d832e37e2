//! End to end: two API servers on one etcd, a controller manager on each. Exactly one leads;
//! killing it (SIGKILL, so it cannot release its Lease) in the middle of a scale-up hands the
//! work to the other, which finishes it with exactly the requested pods and never a pod too
//! many.
//!
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod support;

use support::{eventually, Etcd, Setpoint};

const REPLICAS: usize = 60;

fn start_server(etcd_url: &str, data_dir: &Path) -> Setpoint {
    // The controller managers here run only the ReplicaSet controller, so no `default`
    // ServiceAccount exists: as upstream's integration tests do, the servers admit pods
    // without one.
    Setpoint::start(
        &[
            "server",
            "--store",
            "etcd",
            "--etcd-endpoints",
            etcd_url,
            "--disable-admission-plugins=ServiceAccount",
        ],
        data_dir,
    )
}

/// A `setpoint controller-manager` process; its log lines arrive on `lines`.
struct ControllerManager {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ControllerManager {
    /// Runs the ReplicaSet controller against the server in `kubeconfig`, rate limited so a
    /// scale-up takes seconds and can be interrupted half way.
    fn start(kubeconfig: &Path) -> ControllerManager {
        let (child, lines) = support::spawn_with_stderr_lines(
            Command::new(env!("CARGO_BIN_EXE_setpoint"))
                .args(["controller-manager", "--controllers", "replicaset"])
                // Two run at once: each serves its endpoint on a port of its own.
                .args(["--secure-port", "0"])
                .args([
                    "--kube-api-qps",
                    "10",
                    "--kube-api-burst",
                    "2",
                    "--kubeconfig",
                ])
                .arg(kubeconfig)
                .env("SETPOINT_LOG", "info")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null()),
        );
        ControllerManager { child, lines }
    }

    /// Whether it has logged that it became the leader (drains what it logged so far).
    fn became_leader(&self) -> bool {
        self.lines.try_iter().any(|l| l.contains("became leader"))
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn controller_managers_on_two_servers_hand_over_a_scale_up() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = start_server(&etcd.url, dir_a.path());
    support::share_pki(dir_a.path(), dir_b.path());
    let b = start_server(&etcd.url, dir_b.path());

    let mut managers = [
        Some(ControllerManager::start(&a.kubeconfig)),
        Some(ControllerManager::start(&b.kubeconfig)),
    ];
    let leader = eventually(
        "one controller manager to lead",
        Duration::from_secs(60),
        || {
            managers
                .iter()
                .position(|m| m.as_ref().is_some_and(|m| m.became_leader()))
        },
    );
    let holder = a.ok(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "kube-controller-manager",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!holder.trim().is_empty(), "the Lease names its holder");

    // Every pod name ever created, from a watch through server B.
    let mut watch = b
        .kubectl_command(&["get", "pods", "-w", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get pods -w");
    let stdout = watch.stdout.take().unwrap();
    let (tx, created) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.trim().to_string());
        }
    });
    let mut seen = BTreeSet::new();

    let manifest = dir_a.path().join("rs.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: web\nspec:\n  replicas: 0\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: web\n        image: nginx:1.25\n",
    )
    .unwrap();
    a.ok(&["apply", "-f", manifest.to_str().unwrap()]);
    let replicas = format!("--replicas={REPLICAS}");
    b.ok(&["scale", "replicaset", "web", &replicas]);

    // Half way through, the leader dies without releasing its Lease.
    eventually("the scale-up to start", Duration::from_secs(60), || {
        seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
        (seen.len() >= 5).then_some(())
    });
    let killed_at = seen.len();
    let mut dead = managers[leader].take().unwrap();
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();
    assert!(
        killed_at < REPLICAS,
        "the scale-up finished before the leader was killed ({killed_at} pods)"
    );
    let survivor = managers[1 - leader].as_ref().unwrap();
    eventually(
        "the other controller manager to take over",
        Duration::from_secs(60),
        || survivor.became_leader().then_some(()),
    );

    // The survivor finishes: exactly REPLICAS pods, and never a pod more.
    eventually("all pods to exist", Duration::from_secs(120), || {
        seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
        let listed = a.ok(&["get", "pods", "-l", "app=web", "-o", "name"]);
        (listed.lines().count() == REPLICAS).then_some(())
    });
    let status = eventually(
        "the ReplicaSet status to catch up",
        Duration::from_secs(60),
        || {
            let s = b.ok(&["get", "rs", "web", "-o", "jsonpath={.status.replicas}"]);
            (s.trim() == REPLICAS.to_string()).then_some(s)
        },
    );
    assert_eq!(status.trim(), REPLICAS.to_string());
    // Anything created for an already-filled slot would have been seen by the watch (and
    // deleted again by the controller): every name it ever printed is a pod that still exists.
    let listed: BTreeSet<String> = a
        .ok(&["get", "pods", "-l", "app=web", "-o", "name"])
        .lines()
        .map(String::from)
        .collect();
    seen.extend(created.try_iter().filter(|l| l.starts_with("pod/")));
    assert!(
        seen.is_subset(&listed),
        "pods were created and removed again: {:?}",
        seen.difference(&listed).collect::<Vec<_>>()
    );
    let deletes = a.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=SuccessfulDelete",
        "-o",
        "name",
    ]);
    assert!(
        deletes.trim().is_empty(),
        "the controller deleted surplus pods: {deletes}"
    );
    eprintln!(
        "leader killed after {killed_at} of {REPLICAS} pods; the other finished with exactly {REPLICAS}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
    drop(managers);
    a.stop();
    b.stop();
}
