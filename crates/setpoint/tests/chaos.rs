//! End to end: `setpoint chaos --seed 20261127 --duration 60` starts its own cluster of
//! separate processes (API server, two controller managers, two schedulers, an agent with
//! simulated nodes; the agent and the controller managers in network namespaces of their
//! own where the machine allows), injects every fault type of its schedule while the
//! workload changes, converges after each, breaks no invariant, and reports every fault with
//! its time-to-converge. And the checker on a real cluster, broken on purpose: a pod created
//! beyond a ReplicaSet's replicas under its controller reference is reported. A run killed
//! with SIGKILL leaves no process behind, and the next run deletes the network it left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod support;

/// The seed of the run (any seed must pass; this one is fixed so a failure replays).
const SEED: &str = "20261127";

/// How long the whole run may take: 60 s of faults, the cluster's start and the
/// convergence after the last fault, with room for a busy machine.
const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// Kills whatever the run left (processes working in its directory) when the test ends,
/// passed or failed.
struct Reap(std::path::PathBuf);

impl Drop for Reap {
    fn drop(&mut self) {
        support::kill_processes_under(&self.0);
    }
}

/// Runs `setpoint chaos <args…> --json` in `dir` within [`RUN_DEADLINE`]: whether it
/// succeeded, its report and the report's text.
fn chaos(dir: &std::path::Path, args: &[&str]) -> (bool, serde_json::Value, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .arg("chaos")
        .args(args)
        .arg("--json")
        .arg("--data-dir")
        .arg(dir)
        .current_dir(dir)
        .env("SETPOINT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start setpoint chaos");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(RUN_DEADLINE) {
        Ok(out) => out.expect("wait for setpoint chaos"),
        Err(_) => {
            // SIGTERM: the harness stops its cluster's processes; Reap gets the rest.
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("setpoint chaos did not finish within {RUN_DEADLINE:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("the report is not JSON ({e}):\n{stdout}"));
    (out.status.success(), report, stdout)
}

#[test]
fn chaos_run_converges_after_every_fault_without_violations() {
    let dir = tempfile::tempdir().unwrap();
    let _reap = Reap(dir.path().to_path_buf());
    let (ok, report, stdout) = chaos(dir.path(), &["--seed", SEED, "--duration", "60"]);
    let run = &report["runs"][0];
    assert!(ok, "setpoint chaos failed:\n{stdout}");
    assert_eq!(run["seed"], 20261127);
    assert_eq!(
        run["violations"].as_array().map(Vec::len),
        Some(0),
        "{stdout}"
    );
    assert!(run["finalTimeToConvergeMs"].is_u64(), "{stdout}");
    let faults = run["faults"].as_array().expect("faults");
    // One fault per 8 s of the 60, and every kind of fault among them.
    assert_eq!(faults.len(), 7, "{stdout}");
    for f in faults {
        assert!(
            f["timeToConvergeMs"].is_u64() && f["process"].is_string(),
            "a fault without its time-to-converge: {f}"
        );
    }
    let mut kinds: Vec<String> = faults
        .iter()
        .map(|f| format!("{} {}", f["fault"]["kind"], f["fault"]["target"]))
        .collect();
    kinds.sort();
    kinds.dedup();
    assert_eq!(kinds.len(), 7, "{kinds:?}");
    assert!(
        report["figures"].as_array().is_some_and(|f| f.len() == 7),
        "{stdout}"
    );
    assert!(run["eventsRecorded"].as_u64().unwrap_or(0) > 0);
    // The run's own Events reach the API server (kubectl describe and the live view show
    // them): every fault's at least, and any refused is counted.
    assert!(
        run["eventsWritten"].as_u64().unwrap_or(0) >= faults.len() as u64
            && run["eventsNotWritten"].is_u64(),
        "{stdout}"
    );
    // Each change the schedule makes puts its object out of convergence: the report (and an
    // Event about the object) says when each returned.
    assert!(
        faults.iter().any(|f| f["objectsConvergedMs"]
            .as_object()
            .is_some_and(|o| !o.is_empty() && o.values().all(|ms| ms.is_u64()))),
        "no fault lists an object's return to convergence:\n{stdout}"
    );
    // As root with `ip netns`, the agent and the controller managers run in namespaces of
    // their own and partitions are drawn; elsewhere the report says why they are not.
    if support::netns_available() {
        assert!(run["partitionsNotDrawn"].is_null(), "{stdout}");
    } else {
        assert!(run["partitionsNotDrawn"].is_string(), "{stdout}");
    }
    // A run that passes removes its cluster's directory.
    assert!(!dir.path().join(format!("seed-{SEED}")).exists());
}

/// The command lines of the processes working in `dir` or under it (a run's processes work
/// in its directory); zombies have no working directory and are not among them.
fn processes_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&dir)) {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            out.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    out
}

/// A bridge this test adds, deleted when the test ends, passed or failed.
struct Bridge(String);

impl Bridge {
    fn add(name: &str) -> Bridge {
        let ok = Command::new("ip")
            .args(["link", "add", name, "type", "bridge"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ip link add {name} type bridge failed");
        Bridge(name.to_string())
    }

    fn exists(&self) -> bool {
        Path::new("/sys/class/net").join(&self.0).exists()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

/// A run killed with SIGKILL once its cluster runs: its processes die with it (they ask the
/// kernel for that), and as root its network namespaces, veths and bridge stay until the
/// next run, which deletes them while it leaves a live owner's alone. That next run is the
/// checker's on a real cluster, broken on purpose.
#[test]
fn a_killed_run_leaves_no_process_the_next_deletes_its_network_and_reports_a_rogue_pod() {
    let dir = tempfile::tempdir().unwrap();
    let _reap = Reap(dir.path().to_path_buf());
    let killed_dir = dir.path().join("killed");
    std::fs::create_dir(&killed_dir).unwrap();
    let mut killed = Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(["chaos", "--seed", "3", "--duration", "8", "--data-dir"])
        .arg(&killed_dir)
        .current_dir(&killed_dir)
        .env("SETPOINT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start setpoint chaos");
    // The agent is the last process the run starts.
    support::eventually("the run's agent to start", Duration::from_secs(60), || {
        processes_under(&killed_dir)
            .iter()
            .any(|cmd| cmd.contains(" agent --kubeconfig "))
            .then_some(())
    });
    let root = support::netns_available();
    let netns = Path::new("/run/netns").join(format!("setpoint-chaos-{}-agent-0", killed.id()));
    let bridge = Path::new("/sys/class/net").join(format!("spc{:06x}b", killed.id()));
    // Its lock, held while it lives (the kernel lets go of it when the process dies).
    let lock = Path::new("/run/setpoint-chaos").join(format!("{}.lock", killed.id()));
    if root {
        assert!(netns.exists() && bridge.exists(), "{netns:?}, {bridge:?}");
        assert!(lock.exists(), "{lock:?}");
    }
    killed.kill().unwrap();
    killed.wait().unwrap();
    support::eventually(
        "the killed run's processes to die",
        Duration::from_secs(5),
        || processes_under(&killed_dir).is_empty().then_some(()),
    );
    // Named like a run's, and owned by a live process (this one) without a lock: kept.
    let live = root.then(|| Bridge::add(&format!("spc{:06x}b", std::process::id())));

    let (ok, report, stdout) = chaos(
        dir.path(),
        &["--seed", "3", "--duration", "8", "--rogue-extra-pod"],
    );
    assert!(!ok, "a run with a violation must fail:\n{stdout}");
    let violations = report["runs"][0]["violations"]
        .as_array()
        .expect("violations");
    assert!(
        violations
            .iter()
            .any(|v| v["invariant"] == "replicaset-pods-within-bound"
                && v["evidence"].as_str().is_some_and(|e| e.contains("-rogue"))),
        "the extra pod was not reported:\n{stdout}"
    );
    // Only that: the rest of the run kept every invariant.
    assert!(
        violations
            .iter()
            .all(|v| v["invariant"] == "replicaset-pods-within-bound"),
        "{stdout}"
    );
    if let Some(live) = live {
        // Swept by this run or by another one running meanwhile: nothing else deletes them.
        assert!(!netns.exists() && !bridge.exists(), "{netns:?}, {bridge:?}");
        assert!(!lock.exists(), "{lock:?}");
        assert!(
            live.exists(),
            "a live owner's bridge {} was deleted",
            live.0
        );
    }
}

/// Whether the `etcd` binary runs here; panics if it is required (`SETPOINT_REQUIRE_ETCD`, as
/// CI sets) but missing.
fn etcd_available() -> bool {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found || std::env::var_os("SETPOINT_REQUIRE_ETCD").is_none(),
        "SETPOINT_REQUIRE_ETCD is set but etcd cannot be run"
    );
    found
}

#[test]
fn on_etcd_a_killed_member_is_restarted_and_the_cluster_converges() {
    if !etcd_available() {
        eprintln!("etcd is not installed; skipping (apt-get install etcd-server to run this)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _reap = Reap(dir.path().to_path_buf());
    // One step: a short run on three API servers and a three-member etcd cluster, whose one
    // fault is an etcd member's kill.
    let (ok, report, stdout) = chaos(
        dir.path(),
        &[
            "--store",
            "etcd",
            "--only",
            "sigkill etcd member",
            "--seed",
            "1",
            "--duration",
            "8",
        ],
    );
    assert!(ok, "setpoint chaos --store etcd failed:\n{stdout}");
    let run = &report["runs"][0];
    let faults = run["faults"].as_array().expect("faults");
    assert_eq!(faults.len(), 1, "{stdout}");
    assert_eq!(faults[0]["fault"]["target"], "etcd-member", "{stdout}");
    assert_eq!(faults[0]["process"], "etcd-0", "{stdout}");
    assert!(faults[0]["timeToConvergeMs"].is_u64(), "{stdout}");
    assert_eq!(run["violations"].as_array().map(Vec::len), Some(0));
}
