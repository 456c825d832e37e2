//! End to end: RBAC through the real kubectl. The admin grants a Role in one namespace to a
//! token user, who may then do exactly that and gets upstream's 403 elsewhere; a user bound
//! to `edit` may not touch bindings, and one bound to `admin` may bind what they hold but not
//! `cluster-admin` (escalation refused with upstream's message); the bootstrap ClusterRoles
//! are listed, with `admin`'s rules filled in by the aggregation controller.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::process::Output;
use std::time::Duration;

mod support;

use support::{eventually, expect_failure, expect_success, Setpoint};

/// How long RBAC changes may take to reach the authorizer (the watch cache) and the
/// aggregation controller.
const SETTLE: Duration = Duration::from_secs(20);

#[test]
fn roles_bindings_and_escalation_through_kubectl() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(
        &tokens,
        "alice-token,alice,1001\nbob-token,bob,1002\ncarol-token,carol,1003\n",
    )
    .unwrap();
    // `up` without a node: the API server and the controllers (the aggregation controller
    // among them).
    let s = Setpoint::start(
        &[
            "up",
            "--no-node",
            "--token-auth-file",
            tokens.to_str().unwrap(),
        ],
        &dir.path().join("data"),
    );
    let as_user = |token: &str, args: &[&str]| -> Output {
        let mut cmd = s.kubectl_command(args);
        cmd.args([
            "--kubeconfig=/dev/null",
            "--insecure-skip-tls-verify",
            &format!("--token={token}"),
        ])
        .arg(format!("--server={}", s.url));
        cmd.output().expect("run kubectl")
    };

    s.ok(&["create", "namespace", "a"]);
    s.ok(&["create", "namespace", "b"]);
    s.ok(&[
        "create",
        "role",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
        "-n",
        "a",
    ]);
    s.ok(&[
        "create",
        "rolebinding",
        "alice-reads",
        "--role=pod-reader",
        "--user=alice",
        "-n",
        "a",
    ]);
    let wide = s.ok(&["get", "rolebinding", "alice-reads", "-n", "a", "-o", "wide"]);
    assert!(
        wide.contains("Role/pod-reader") && wide.contains("alice"),
        "{wide}"
    );
    let roles = s.ok(&["get", "roles", "-n", "a"]);
    assert!(
        roles.contains("pod-reader") && roles.contains("CREATED AT"),
        "{roles}"
    );

    eventually("alice may list pods in a", SETTLE, || {
        as_user("alice-token", &["get", "pods", "-n", "a"])
            .status
            .success()
            .then_some(())
    });
    let err = expect_failure(
        "alice lists pods in b",
        &as_user("alice-token", &["get", "pods", "-n", "b"]),
    );
    assert!(
        err.contains(
            r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "b""#
        ),
        "{err}"
    );
    let err = expect_failure(
        "alice creates a pod in a",
        &as_user(
            "alice-token",
            &["run", "p", "--image=busybox", "-n", "a", "--restart=Never"],
        ),
    );
    assert!(
        err.contains(
            r#"pods is forbidden: User "alice" cannot create resource "pods" in API group "" in the namespace "a""#
        ),
        "{err}"
    );

    // The bootstrap roles, and `admin` filled in by aggregation.
    let list = s.ok(&["get", "clusterroles"]);
    for role in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:discovery",
        "system:basic-user",
        "system:public-info-viewer",
        "system:kube-controller-manager",
        "system:kube-scheduler",
    ] {
        assert!(
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(role)),
            "{role} missing from:\n{list}"
        );
    }
    eventually("admin's aggregated rules", SETTLE, || {
        let rules = s.ok(&["get", "clusterrole", "admin", "-o", "jsonpath={.rules}"]);
        (rules.contains("rolebindings") && rules.contains("deployments")).then_some(())
    });

    // bob holds `edit` in a: he may create pods there, but not bindings.
    s.ok(&[
        "create",
        "rolebinding",
        "bob-edits",
        "--clusterrole=edit",
        "--user=bob",
        "-n",
        "a",
    ]);
    eventually("bob may create a ConfigMap in a", SETTLE, || {
        as_user(
            "bob-token",
            &["create", "configmap", "c", "--from-literal=k=v", "-n", "a"],
        )
        .status
        .success()
        .then_some(())
    });
    let err = expect_failure(
        "bob binds cluster-admin",
        &as_user(
            "bob-token",
            &[
                "create",
                "rolebinding",
                "bob-admin",
                "--clusterrole=cluster-admin",
                "--user=bob",
                "-n",
                "a",
            ],
        ),
    );
    assert!(
        err.contains(
            r#"rolebindings.rbac.authorization.k8s.io is forbidden: User "bob" cannot create resource "rolebindings" in API group "rbac.authorization.k8s.io" in the namespace "a""#
        ),
        "{err}"
    );

    // carol holds `admin` in a: she may grant `edit` there, but not `cluster-admin`.
    s.ok(&[
        "create",
        "rolebinding",
        "carol-admins",
        "--clusterrole=admin",
        "--user=carol",
        "-n",
        "a",
    ]);
    eventually("carol may bind edit in a", SETTLE, || {
        as_user(
            "carol-token",
            &[
                "create",
                "rolebinding",
                "dave-edits",
                "--clusterrole=edit",
                "--user=dave",
                "-n",
                "a",
            ],
        )
        .status
        .success()
        .then_some(())
    });
    let err = expect_failure(
        "carol binds cluster-admin",
        &as_user(
            "carol-token",
            &[
                "create",
                "rolebinding",
                "carol-root",
                "--clusterrole=cluster-admin",
                "--user=carol",
                "-n",
                "a",
            ],
        ),
    );
    assert!(
        err.contains(
            "rolebindings.rbac.authorization.k8s.io \"carol-root\" is forbidden: user \"carol\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"*\"], Resources:[\"*\"], Verbs:[\"*\"]}\n{NonResourceURLs:[\"*\"], Verbs:[\"*\"]}"
        ),
        "{err}"
    );
    // Nor a Role with rules she does not hold.
    let err = expect_failure(
        "carol creates a role beyond her own",
        &as_user(
            "carol-token",
            &[
                "create",
                "role",
                "nodes",
                "--verb=get",
                "--resource=nodes",
                "-n",
                "a",
            ],
        ),
    );
    assert!(
        err.contains(r#"roles.rbac.authorization.k8s.io "nodes" is forbidden: user "carol""#)
            && err.contains(r#"{APIGroups:[""], Resources:["nodes"], Verbs:["get"]}"#),
        "{err}"
    );
    expect_success(
        "carol creates a role within her own",
        &as_user(
            "carol-token",
            &[
                "create",
                "role",
                "readers",
                "--verb=get",
                "--resource=pods",
                "-n",
                "a",
            ],
        ),
    );
    s.stop();
}
