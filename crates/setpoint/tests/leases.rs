//! End to end: `setpoint up` takes part in the controller manager's and the scheduler's
//! leader elections, as kube-controller-manager and kube-scheduler do. `kubectl -n kube-system
//! get lease` names both holders (`<hostname>_<uuid>`); a standalone `setpoint
//! controller-manager` stands by while `up` leads, and takes over once `up` stops cleanly
//! (releasing its Leases), well within the lease duration.
//!
//! `up` and the standalone controller manager need a store they can both reach while `up`
//! stops, so `up` runs on etcd next to a `setpoint server` the controller manager talks to.
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod support;

use support::{eventually, share_pki, Etcd, Setpoint};

/// kube-controller-manager's default `--leader-elect-lease-duration`, which `up` uses.
const LEASE_DURATION: Duration = Duration::from_secs(15);

/// A `setpoint controller-manager` process; its log lines arrive on `lines`.
struct ControllerManager {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl ControllerManager {
    fn start(kubeconfig: &Path) -> ControllerManager {
        let (child, lines) = support::spawn_with_stderr_lines(
            Command::new(env!("CARGO_BIN_EXE_setpoint"))
                .args([
                    "controller-manager",
                    "--secure-port",
                    "0",
                    "--leader-elect-retry-period",
                    "500ms",
                    "--kubeconfig",
                ])
                .arg(kubeconfig)
                // Standbys say at trace level that someone else holds the Lease.
                .env("SETPOINT_LOG", "info,setpoint_runtime::leader=trace")
                .env("NO_COLOR", "1")
                .stdout(Stdio::null()),
        );
        ControllerManager {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line logged so far that contains `needle`.
    fn logged(&mut self, needle: &str) -> Option<String> {
        self.seen.extend(self.lines.try_iter());
        self.seen.iter().find(|l| l.contains(needle)).cloned()
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of `key=` in a log line, without the quotes the formatter may add.
fn field(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[start..];
    let value = match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest.split_whitespace().next()?,
    };
    Some(value.to_string())
}

/// Whether `identity` has upstream's form: `<hostname>_<uuid>`.
fn upstream_identity(identity: &str) -> bool {
    let Some((host, uuid)) = identity.rsplit_once('_') else {
        return false;
    };
    let groups: Vec<usize> = uuid.split('-').map(str::len).collect();
    !host.is_empty()
        && groups == [8, 4, 4, 4, 12]
        && uuid.chars().all(|c| c == '-' || c.is_ascii_hexdigit())
}

fn holder(s: &Setpoint, lease: &str) -> String {
    s.ok(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        lease,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
    .trim()
    .to_string()
}

#[test]
fn up_holds_both_leases_and_a_standalone_controller_manager_takes_over_when_it_stops() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = Etcd::start() else { return };
    let (up_dir, server_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let up = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--store",
            "etcd",
            "--etcd-endpoints",
            &etcd.url,
        ],
        up_dir.path(),
    );

    // Both Leases exist and name `up` in upstream's form.
    let listed = eventually(
        "kubectl -n kube-system get lease lists both holders",
        Duration::from_secs(30),
        || {
            let out = up.ok(&["-n", "kube-system", "get", "lease"]);
            let named = |lease: &str| {
                out.lines().any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.first() == Some(&lease)
                        && cols.get(1).is_some_and(|h| upstream_identity(h))
                })
            };
            (named("kube-controller-manager") && named("kube-scheduler")).then_some(out)
        },
    );
    assert!(listed.starts_with("NAME"), "{listed}");
    assert!(listed.contains("HOLDER"), "{listed}");
    let up_holder = holder(&up, "kube-controller-manager");

    // A second API server on the same etcd, for the standalone controller manager to use
    // while `up` comes and goes.
    share_pki(up_dir.path(), server_dir.path());
    let server = Setpoint::start(
        &["server", "--store", "etcd", "--etcd-endpoints", &etcd.url],
        server_dir.path(),
    );
    let mut cm = ControllerManager::start(&server.kubeconfig);
    let campaign = eventually(
        "the controller manager joins the election",
        Duration::from_secs(30),
        || cm.logged("leader election"),
    );
    let cm_identity = field(&campaign, "identity").expect("identity in the log line");
    assert!(upstream_identity(&cm_identity), "{campaign}");
    assert_ne!(cm_identity, up_holder);
    eventually(
        "the controller manager sees the Lease held and stands by",
        Duration::from_secs(30),
        || cm.logged("lease held by another candidate"),
    );
    assert!(cm.logged("became leader").is_none(), "{:#?}", cm.seen);
    assert_eq!(holder(&server, "kube-controller-manager"), up_holder);

    // `up` stops cleanly and releases its Leases; the standby takes over within the lease
    // duration.
    up.stop();
    eventually(
        "the standalone controller manager holds the Lease",
        LEASE_DURATION,
        || (holder(&server, "kube-controller-manager") == cm_identity).then_some(()),
    );
    eventually(
        "the controller manager says it leads",
        Duration::from_secs(5),
        || cm.logged("became leader"),
    );
    // Nobody else campaigns for the scheduler's Lease: `up` left it released.
    assert_eq!(holder(&server, "kube-scheduler"), "");
}
