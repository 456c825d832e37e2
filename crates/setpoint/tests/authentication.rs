//! End to end: who is calling. Anonymous requests are `system:anonymous` and may read only the
//! health endpoints and the version; bearer tokens of `--token-auth-file` name their user,
//! whom authorization then refuses with upstream's 403 message; `--anonymous-auth=false`
//! answers requests without credentials with 401.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::process::Command;

mod support;

use support::{expect_failure, expect_success, Setpoint};

/// `curl -k` of `url`: (status code, body).
fn curl(url: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("curl printed the code");
    (
        code.trim().parse().expect("a status code"),
        body.to_string(),
    )
}

#[test]
fn anonymous_and_token_callers_get_upstreams_answers() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "s3cret-token,alice,1001,\"dev,ops\"\n").unwrap();
    let tokens_arg = tokens.to_str().unwrap();
    let s = Setpoint::start(
        &["server", "--token-auth-file", tokens_arg],
        &dir.path().join("data"),
    );

    let (code, body) = curl(&format!("{}/api", s.url), &[]);
    assert_eq!(code, 403, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        status["message"],
        r#"forbidden: User "system:anonymous" cannot get path "/api""#
    );
    assert_eq!(status["reason"], "Forbidden");
    let (code, body) = curl(&format!("{}/version", s.url), &[]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(curl(&format!("{}/healthz", s.url), &[]).0, 200);
    let (code, _) = curl(
        &format!("{}/api", s.url),
        &["-H", "Authorization: Bearer not-a-token"],
    );
    assert_eq!(code, 401, "an unknown token is refused, not anonymous");

    // kubectl with the token and no certificate: the user is alice, who holds no role.
    let as_alice = |args: &[&str]| {
        let mut cmd = s.kubectl_command(args);
        cmd.args([
            "--kubeconfig=/dev/null",
            "--insecure-skip-tls-verify",
            "--token=s3cret-token",
        ])
        .arg(format!("--server={}", s.url));
        cmd.output().expect("run kubectl")
    };
    let err = expect_failure(
        "kubectl get pods as alice",
        &as_alice(&["get", "pods", "-n", "a"]),
    );
    assert!(
        err.contains(
            r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "a""#
        ),
        "{err}"
    );
    // The admin certificate is in system:masters.
    expect_success(
        "kubectl get pods as admin",
        &s.kubectl(&["get", "pods", "-n", "default"]),
    );
    s.stop();

    let closed = Setpoint::start(
        &["server", "--anonymous-auth=false"],
        &dir.path().join("closed"),
    );
    for path in ["/api", "/version", "/healthz"] {
        let (code, body) = curl(&format!("{}{path}", closed.url), &[]);
        assert_eq!(code, 401, "{path}: {body}");
    }
    closed.stop();
}
