//! End to end: two `setpoint server` processes on one etcd, driven by the real `kubectl`.
//!
//! What one server writes, the other lists and streams to its watchers promptly; a stale
//! `resourceVersion` is a 409 through either; and the two compact the shared history once
//! per interval between them rather than each on its own clock.
//!
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use setpoint_store::etcd::{EtcdOptions, EtcdStore};
use setpoint_store::Store;

mod support;

use support::{Etcd, Setpoint};

/// The bound the test asserts on cross-server watch delivery (the expectation is well under
/// 100 ms; this leaves room for a loaded CI machine).
const WATCH_BOUND: Duration = Duration::from_secs(2);

/// Compaction interval for both servers, short so the test sees them share the work.
const COMPACTION_SECONDS: u64 = 1;

/// Starts one `setpoint server` process on the etcd at `etcd_url`.
fn start_server(etcd_url: &str, data_dir: &Path) -> Setpoint {
    let compaction = COMPACTION_SECONDS.to_string();
    Setpoint::start(
        &[
            "server",
            "--store",
            "etcd",
            "--etcd-endpoints",
            etcd_url,
            "--compaction-interval-seconds",
            &compaction,
        ],
        data_dir,
    )
}

/// kubectl with one kubeconfig (the first server's), pointed at either server with
/// `--server`: both serve certificates from the same CA and trust the same admin certificate.
struct Kubectl<'a> {
    first: &'a Setpoint,
}

impl Kubectl<'_> {
    fn command(&self, server: &Setpoint, args: &[&str]) -> Command {
        let mut full = vec!["--server", server.url.as_str()];
        full.extend_from_slice(args);
        self.first.kubectl_command(&full)
    }

    fn run(&self, server: &Setpoint, args: &[&str]) -> Output {
        self.command(server, args).output().expect("run kubectl")
    }

    fn ok(&self, server: &Setpoint, args: &[&str]) -> String {
        let what = format!("kubectl {args:?} against {}", server.url);
        support::expect_success(&what, &self.run(server, args))
    }

    fn fails(&self, server: &Setpoint, args: &[&str]) -> String {
        let what = format!("kubectl {args:?} against {}", server.url);
        support::expect_failure(&what, &self.run(server, args))
    }

    /// Starts `kubectl get configmaps -w -o name` against `server`; lines arrive on the
    /// returned channel with the instant they were read.
    fn watch(&self, server: &Setpoint) -> (Child, mpsc::Receiver<(String, Instant)>) {
        let mut child = self
            .command(server, &["get", "configmaps", "-w", "-o", "name"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl get -w");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((line.trim().to_owned(), Instant::now())).is_err() {
                    break;
                }
            }
        });
        (child, rx)
    }
}

/// Waits for `line` on a watch's output; returns when it was read.
fn wait_line(rx: &mpsc::Receiver<(String, Instant)>, line: &str, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((l, at)) if l == line => return at,
            Ok(_) => {}
            Err(_) => panic!("watch did not print {line:?} within {within:?}"),
        }
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
fn two_servers_share_one_etcd() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let observer = runtime.block_on(async {
        EtcdStore::connect(EtcdOptions {
            endpoints: vec![etcd.url.clone()],
            ..EtcdOptions::default()
        })
        .await
        .expect("connect to the test etcd")
    });

    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = start_server(&etcd.url, dir_a.path());
    // The second server uses the first one's CA (and admin certificate), so one kubeconfig
    // works for both: `Pki::load_or_create` reuses what it finds in `<data-dir>/pki`.
    support::share_pki(dir_a.path(), dir_b.path());
    let b = start_server(&etcd.url, dir_b.path());
    let kubectl = Kubectl { first: &a };
    let guard_at_start = runtime
        .block_on(observer.get(setpoint_apiserver::COMPACTION_GUARD_KEY))
        .unwrap();
    let started = Instant::now();

    // Written through A, read through B.
    kubectl.ok(&a, &["create", "configmap", "one", "--from-literal=k=v1"]);
    assert_eq!(
        kubectl
            .ok(&b, &["get", "configmap", "one", "-o", "name"])
            .trim(),
        "configmap/one"
    );
    assert!(kubectl
        .ok(&b, &["get", "configmaps", "-o", "name"])
        .contains("configmap/one"));

    // Watches on both servers; creates through A. The watch on A is the same-server baseline.
    let (mut watch_a, lines_a) = kubectl.watch(&a);
    let (mut watch_b, lines_b) = kubectl.watch(&b);
    wait_line(&lines_a, "configmap/one", Duration::from_secs(30));
    wait_line(&lines_b, "configmap/one", Duration::from_secs(30));
    // kubectl only exits after its response, and its own start-up dominates its run time, so
    // the figures are: how long after `kubectl create` started the watch on B printed the
    // object (an upper bound on the delivery latency), and how much later than the watch on
    // A, the server that took the write (the cost of going through etcd to another server).
    let mut upper = Vec::new();
    let mut extra = Vec::new();
    for i in 0..5 {
        let name = format!("w{i}");
        let before = Instant::now();
        kubectl.ok(&a, &["create", "configmap", &name, "--from-literal=k=v"]);
        let returned = Instant::now();
        let line = format!("configmap/{name}");
        let seen_b = wait_line(&lines_b, &line, WATCH_BOUND + (returned - before));
        let seen_a = wait_line(&lines_a, &line, WATCH_BOUND + (returned - before));
        assert!(
            seen_b <= returned + WATCH_BOUND,
            "the other server's watch took over {WATCH_BOUND:?}"
        );
        let b_ms = millis(seen_b - before);
        let delta_ms = b_ms - millis(seen_a - before);
        eprintln!(
            "create {name} via A (kubectl ran {:.1} ms): watch on B printed it {b_ms:.1} ms after \
             the create started, {delta_ms:+.1} ms relative to the watch on A",
            millis(returned - before),
        );
        upper.push(b_ms);
        extra.push(delta_ms);
    }
    upper.sort_by(f64::total_cmp);
    extra.sort_by(f64::total_cmp);
    eprintln!(
        "cross-server watch: median {:.1} ms (max {:.1} ms) from the start of `kubectl create`; \
         median {:+.1} ms (max {:+.1} ms) behind the writing server's own watch",
        upper[upper.len() / 2],
        upper[upper.len() - 1],
        extra[extra.len() / 2],
        extra[extra.len() - 1],
    );
    let _ = watch_a.kill();
    let _ = watch_b.kill();
    let _ = watch_a.wait();
    let _ = watch_b.wait();

    // A stale resourceVersion is a conflict through either server.
    let old = kubectl.ok(&a, &["get", "configmap", "one", "-o", "yaml"]);
    let old_file = dir_a.path().join("one-old.yaml");
    std::fs::write(&old_file, &old).unwrap();
    let new_file = dir_a.path().join("one-new.yaml");
    std::fs::write(&new_file, old.replace("k: v1", "k: v2")).unwrap();
    assert!(kubectl
        .ok(&b, &["replace", "-f", new_file.to_str().unwrap()])
        .contains("replaced"));
    for server in [&a, &b] {
        let err = kubectl.fails(server, &["replace", "-f", old_file.to_str().unwrap()]);
        assert!(err.contains("Conflict"), "expected a 409 Conflict: {err}");
    }
    let data = kubectl.ok(&a, &["get", "configmap", "one", "-o", "jsonpath={.data.k}"]);
    assert_eq!(data, "v2");

    // Both servers compact on a one-second interval, but the guard lets only one of them
    // compact per interval: the guard key changes at most once per interval (plus the
    // first claim), where two unguarded servers would each compact every second.
    let deadline = Instant::now() + Duration::from_secs(30);
    while runtime.block_on(observer.compacted_revision()).unwrap() == 0 {
        assert!(
            Instant::now() < deadline,
            "the servers never compacted the shared history"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let guard = runtime
        .block_on(observer.get(setpoint_apiserver::COMPACTION_GUARD_KEY))
        .unwrap()
        .expect("the compaction guard exists");
    let swaps = guard.version - guard_at_start.map_or(0, |kv| kv.version);
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = (elapsed / COMPACTION_SECONDS as f64).ceil() as i64 + 2;
    eprintln!(
        "compaction guard changed {swaps} times in {elapsed:.1} s between two servers; \
         compacted through revision {}",
        runtime.block_on(observer.compacted_revision()).unwrap()
    );
    assert!(
        swaps <= allowed,
        "{swaps} guarded compactions in {elapsed:.1} s: the servers are not taking turns"
    );

    a.stop();
    b.stop();
}
