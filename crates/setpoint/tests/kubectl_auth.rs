//! End to end with the real kubectl: `kubectl auth whoami` and `kubectl auth can-i` (the
//! self reviews), `--as` (impersonation, refused for a user who may not impersonate, with
//! upstream's message), and SubjectAccessReview and TokenReview created from files.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::process::Output;
use std::time::Duration;

mod support;

use support::{expect_failure, expect_success, Setpoint};

#[test]
fn whoami_can_i_reviews_and_impersonation() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "carol-token,carol,c-7,\"dev\"\n").unwrap();
    let s = Setpoint::start(
        &["server", "--token-auth-file", tokens.to_str().unwrap()],
        &dir.path().join("data"),
    );
    // kubectl with carol's token and no certificate.
    let as_carol = |args: &[&str]| -> Output {
        let mut cmd = s.kubectl_command(args);
        cmd.args([
            "--kubeconfig=/dev/null",
            "--insecure-skip-tls-verify",
            "--token=carol-token",
        ])
        .arg(format!("--server={}", s.url));
        cmd.output().expect("run kubectl")
    };

    // whoami: the admin certificate's user and groups, then the token's user.
    let me = s.ok(&["auth", "whoami"]);
    let username = me.lines().find(|l| l.starts_with("Username")).unwrap_or("");
    assert!(username.ends_with(" admin"), "{me}");
    assert!(me.contains("system:masters"), "{me}");
    let carol = expect_success(
        "whoami as carol",
        &as_carol(&["auth", "whoami", "-o", "json"]),
    );
    let review: serde_json::Value = serde_json::from_str(&carol).unwrap();
    assert_eq!(review["kind"], "SelfSubjectReview");
    assert_eq!(
        review["status"]["userInfo"],
        serde_json::json!({"username": "carol", "uid": "c-7",
                           "groups": ["dev", "system:authenticated"]})
    );

    // can-i: yes for the admin, no (exit code 1) for alice, whom the admin may impersonate.
    assert_eq!(
        s.ok(&["auth", "can-i", "list", "pods", "-n", "a"]).trim(),
        "yes"
    );
    let no = s.kubectl(&["auth", "can-i", "list", "pods", "-n", "a", "--as=alice"]);
    assert_eq!(no.status.code(), Some(1), "{no:?}");
    assert_eq!(String::from_utf8_lossy(&no.stdout).trim(), "no");
    // --as a ServiceAccount: what its RoleBinding grants, in its namespace only.
    s.ok(&["create", "namespace", "a"]);
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
        "bot-reads",
        "--role=pod-reader",
        "--serviceaccount=a:bot",
        "-n",
        "a",
    ]);
    let bot = "--as=system:serviceaccount:a:bot";
    // The authorizer sees the binding once its cache has it.
    support::eventually(
        "the binding to take effect",
        Duration::from_secs(10),
        || {
            let out = s.kubectl(&["auth", "can-i", "list", "pods", "-n", "a", bot]);
            (String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(())
        },
    );
    let other = s.kubectl(&["auth", "can-i", "list", "pods", "-n", "b", bot]);
    assert_eq!(String::from_utf8_lossy(&other.stdout).trim(), "no");
    let create = s.kubectl(&["auth", "can-i", "create", "pods", "-n", "a", bot]);
    assert_eq!(String::from_utf8_lossy(&create.stdout).trim(), "no");

    // What carol may do: the basic-user rules every authenticated user holds.
    let list = expect_success(
        "can-i --list as carol",
        &as_carol(&["auth", "can-i", "--list", "-n", "a"]),
    );
    assert!(
        list.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{list}"
    );
    assert!(!list.contains("*.*"), "{list}");
    assert!(s
        .ok(&["auth", "can-i", "--list", "-n", "a"])
        .contains("*.*"));

    // A user who may not impersonate is refused with upstream's message.
    let err = expect_failure(
        "get pods as carol --as=admin",
        &as_carol(&["get", "pods", "-n", "a", "--as=admin"]),
    );
    assert!(
        err.contains(
            r#"users "admin" is forbidden: User "carol" cannot impersonate resource "users" in API group "" at the cluster scope"#
        ),
        "{err}"
    );
    let err = expect_failure(
        "get pods as carol --as-group",
        &as_carol(&["get", "pods", "--as=carol", "--as-group=system:masters"]),
    );
    assert!(err.contains("cannot impersonate resource"), "{err}");

    // Reviews created from files answer with their status.
    let sar = s.home().join("sar.yaml");
    std::fs::write(
        &sar,
        "apiVersion: authorization.k8s.io/v1\nkind: SubjectAccessReview\nspec:\n  user: carol\n  groups: [system:authenticated]\n  resourceAttributes:\n    namespace: a\n    verb: create\n    resource: selfsubjectaccessreviews\n    group: authorization.k8s.io\n",
    )
    .unwrap();
    let out = s.ok(&["create", "-f", sar.to_str().unwrap(), "-o", "yaml"]);
    assert!(out.contains("kind: SubjectAccessReview"), "{out}");
    assert!(out.contains("allowed: true"), "{out}");
    let tr = s.home().join("tr.yaml");
    std::fs::write(
        &tr,
        "apiVersion: authentication.k8s.io/v1\nkind: TokenReview\nspec:\n  token: carol-token\n",
    )
    .unwrap();
    let out = s.ok(&["create", "-f", tr.to_str().unwrap(), "-o", "yaml"]);
    assert!(out.contains("authenticated: true"), "{out}");
    assert!(out.contains("username: carol"), "{out}");
    // Reviews are not stored, so there is nothing to list.
    let err = s.fails(&["get", "subjectaccessreviews"]);
    assert!(
        err.contains("the server does not allow this method on the requested resource"),
        "{err}"
    );
    s.stop();
}
