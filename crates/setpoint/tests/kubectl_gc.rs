//! End to end: namespace deletion and cascading deletion with the real `kubectl` against
//! `setpoint up`, whose in-process controllers do the work.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod support;

use support::Setpoint;

/// Whether `kubectl get` answers NotFound for this object.
fn not_found(c: &Setpoint, args: &[&str]) -> bool {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    let out = c.kubectl(&a);
    !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
}

/// Polls until `f` holds, or panics after 30 s.
fn eventually(c: &Setpoint, what: &str, f: impl Fn(&Setpoint) -> bool) {
    support::eventually(what, Duration::from_secs(30), || f(c).then_some(()));
}

/// Creates ConfigMap `owner` and `dependents` owned by it (blocking owner deletion).
fn family(c: &Setpoint, owner: &str, dependents: &[&str]) {
    c.ok(&["create", "configmap", owner]);
    let uid = c.ok(&["get", "configmap", owner, "-o", "jsonpath={.metadata.uid}"]);
    let docs: Vec<String> = dependents
        .iter()
        .map(|d| {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {d}\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: {owner}\n    uid: {uid}\n    blockOwnerDeletion: true\n"
            )
        })
        .collect();
    let file = c.home().join(format!("{owner}.yaml"));
    std::fs::write(&file, docs.join("---\n")).unwrap();
    c.ok(&["create", "-f", file.to_str().unwrap()]);
}

#[test]
fn kubectl_deletes_namespaces_and_cascades() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let c = Setpoint::up(data.path());

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
    assert!(not_found(&c, &["namespace", "demo"]));

    // Foreground: when kubectl returns, the owner is gone, and its dependents went first.
    family(&c, "owner-fg", &["fg-1", "fg-2"]);
    c.ok(&[
        "delete",
        "configmap",
        "owner-fg",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    assert!(not_found(&c, &["configmap", "owner-fg"]));
    assert!(not_found(&c, &["configmap", "fg-1"]));
    assert!(not_found(&c, &["configmap", "fg-2"]));

    // Orphan: the dependents stay, without their reference to the deleted owner.
    family(&c, "owner-or", &["or-1", "or-2"]);
    c.ok(&[
        "delete",
        "configmap",
        "owner-or",
        "--cascade=orphan",
        "--timeout=60s",
    ]);
    assert!(not_found(&c, &["configmap", "owner-or"]));
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
    family(&c, "owner-bg", &["bg-1"]);
    c.ok(&["delete", "configmap", "owner-bg", "--timeout=60s"]);
    eventually(&c, "background dependents deleted", |c| {
        not_found(c, &["configmap", "bg-1"])
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
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // The API server alone runs no controllers: a namespace deletion would hang.
    let c = Setpoint::start(&["server"], data.path());
    let manager = Stop(
        Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                "controller-manager",
                "--controllers",
                "namespace,garbagecollector",
                // A free port for its endpoint, not 10257 (tests run side by side).
                "--secure-port",
                "0",
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
    assert!(not_found(&c, &["namespace", "team"]));
    family(&c, "owner", &["dep"]);
    c.ok(&["delete", "configmap", "owner"]);
    eventually(&c, "dependent collected", |c| {
        not_found(c, &["configmap", "dep"])
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
