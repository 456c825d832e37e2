//! Two operator processes with leader election against one API server: exactly one
//! reconciles; SIGKILL the leader and the other takes over within the lease duration + 2 s.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use serde_json::json;
use setpoint_runtime::client::{Api, PostParams};

const LEASE_SECONDS: u64 = 2;

/// Starts a replica whose log lines arrive on `tx` tagged with `id`.
fn start(id: usize, kubeconfig: &std::path::Path, tx: mpsc::Sender<(usize, String)>) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_namespace-defaults"))
        .args([
            "--leader-elect",
            "--lease-seconds",
            &LEASE_SECONDS.to_string(),
        ])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the operator");
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((id, l)).is_err() {
                break;
            }
        }
    });
    child
}

/// The replica that logs a reconcile of namespace `ns` first, before `deadline`.
fn who_reconciles(
    rx: &mpsc::Receiver<(usize, String)>,
    ns: &str,
    deadline: Instant,
) -> Option<usize> {
    let needle = format!("namespace={ns}");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((id, l)) if l.contains("reconciling") && l.contains(&needle) => return Some(id),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// Kills the replicas however the test ends.
struct Replicas(Vec<Child>);

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &mut self.0 {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_reconciles_and_the_other_takes_over() {
    let cluster = setpoint_testing::TestCluster::start_https().await;
    let dir = std::env::temp_dir().join(format!("ns-defaults-leader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    let mut replicas = Replicas(vec![
        start(0, &kubeconfig, tx.clone()),
        start(1, &kubeconfig, tx),
    ]);
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    let create = |name: &str| {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let namespaces = namespaces.clone();
        async move {
            namespaces
                .create(&PostParams::default(), &ns)
                .await
                .unwrap()
        }
    };

    create("first").await;
    let leader = tokio::task::block_in_place(|| {
        who_reconciles(&rx, "first", Instant::now() + Duration::from_secs(20))
    })
    .expect("one replica reconciles");
    // The standby does not reconcile it as well.
    let also = tokio::task::block_in_place(|| {
        who_reconciles(&rx, "first", Instant::now() + Duration::from_millis(1500))
    });
    assert_eq!(
        also.filter(|id| *id != leader),
        None,
        "both replicas reconciled"
    );

    // Kill the leader's process: the standby reconciles a new namespace within lease + 2 s.
    replicas.0[leader].kill().unwrap();
    let killed = Instant::now();
    create("second").await;
    let next = tokio::task::block_in_place(|| {
        who_reconciles(
            &rx,
            "second",
            killed + Duration::from_secs(LEASE_SECONDS + 5),
        )
    });
    let elapsed = killed.elapsed();
    assert_eq!(next, Some(1 - leader), "the standby did not take over");
    eprintln!("the standby reconciled {elapsed:?} after the leader was killed");
    assert!(
        elapsed <= Duration::from_secs(LEASE_SECONDS + 2),
        "takeover took {elapsed:?}"
    );
    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
}
