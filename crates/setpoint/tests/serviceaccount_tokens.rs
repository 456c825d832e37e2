//! End to end: ServiceAccount tokens through the real kubectl against `setpoint server`.
//! `kubectl create token` mints a token that authenticates as the service account; a token
//! bound to a pod stops working once the pod is gone; an audience other than the API's is
//! refused; the issuer's discovery documents answer; the token subresource is in discovery;
//! tokens survive a restart of the server; deleting the service account ends them. A legacy
//! token Secret is filled in by the token controller of a standalone controller manager, and
//! its token works while the Secret exists. Two servers on one etcd share one key: each
//! accepts the other's tokens. The issuer and the API's audiences are flags.
//!
//! Skipped (with a message) when kubectl (or, for the etcd test, etcd) is missing, unless
//! `SETPOINT_REQUIRE_KUBECTL` / `SETPOINT_REQUIRE_ETCD` is set.

use std::process::Command;
use std::time::Duration;

mod support;

use support::{eventually, expect_failure, expect_success, Setpoint};

/// `curl -k` of `url` with a bearer token: (status code, body).
fn curl_with_token(url: &str, token: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "-w", "\n%{http_code}", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
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
fn service_account_tokens_authenticate_until_their_binding_is_gone() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], &dir.path().join("data"));
    s.ok(&["create", "namespace", "a"]);
    s.ok(&["create", "sa", "bot", "-n", "a"]);

    // The subresource is in discovery.
    let v1 = s.ok(&["get", "--raw", "/api/v1"]);
    assert!(v1.contains(r#""name":"serviceaccounts/token""#), "{v1}");

    let token = s
        .ok(&["create", "token", "bot", "-n", "a"])
        .trim()
        .to_string();
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let (code, body) = curl_with_token(&format!("{}/apis", s.url), &token);
    assert_eq!(code, 200, "discovery as the service account: {body}");
    // kubectl with the token alone: authenticated as the service account, which holds no role.
    let as_bot = |token: &str, args: &[&str]| {
        let mut cmd = s.kubectl_command(args);
        cmd.args(["--kubeconfig=/dev/null", "--insecure-skip-tls-verify"])
            .arg(format!("--token={token}"))
            .arg(format!("--server={}", s.url));
        cmd.output().expect("run kubectl")
    };
    let err = expect_failure(
        "kubectl get pods as the service account",
        &as_bot(&token, &["get", "pods", "-n", "a"]),
    );
    assert!(
        err.contains(
            r#"pods is forbidden: User "system:serviceaccount:a:bot" cannot list resource "pods" in API group "" in the namespace "a""#
        ),
        "{err}"
    );

    let whoami = expect_success(
        "kubectl auth whoami as the service account",
        &as_bot(&token, &["auth", "whoami", "-o", "json"]),
    );
    let review: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    let user = &review["status"]["userInfo"];
    assert_eq!(user["username"], "system:serviceaccount:a:bot", "{whoami}");
    let groups = user["groups"].as_array().unwrap();
    assert!(
        groups.iter().any(|g| g == "system:serviceaccounts:a"),
        "{whoami}"
    );
    assert!(
        user["extra"]["authentication.kubernetes.io/credential-id"][0]
            .as_str()
            .unwrap()
            .starts_with("JTI=")
    );

    // Upstream's validation of the duration.
    let err = s.fails(&["create", "token", "bot", "-n", "a", "--duration", "1m"]);
    assert!(
        err.contains("spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"),
        "{err}"
    );
    // Another audience: a valid token, but not for this API.
    let other = s
        .ok(&["create", "token", "bot", "-n", "a", "--audience", "x"])
        .trim()
        .to_string();
    assert_eq!(curl_with_token(&format!("{}/apis", s.url), &other).0, 401);

    // A token bound to a pod works while the pod exists, and is refused once it is gone.
    s.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\n\
         spec: {serviceAccountName: bot, containers: [{name: c, image: busybox}]}\n",
    );
    let bound = s
        .ok(&[
            "create",
            "token",
            "bot",
            "-n",
            "a",
            "--duration",
            "10m",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "p",
        ])
        .trim()
        .to_string();
    let err = s.fails(&[
        "create",
        "token",
        "bot",
        "-n",
        "a",
        "--audience",
        "x",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "missing",
    ]);
    assert!(err.contains(r#"pods "missing" not found"#), "{err}");
    let apis = format!("{}/apis", s.url);
    eventually("the bound token works", Duration::from_secs(10), || {
        (curl_with_token(&apis, &bound).0 == 200).then_some(())
    });
    s.ok(&[
        "delete",
        "pod",
        "p",
        "-n",
        "a",
        "--grace-period=0",
        "--force",
        "--wait",
    ]);
    eventually(
        "the token of a deleted pod is refused",
        REVOKED_WITHIN,
        || (curl_with_token(&apis, &bound).0 == 401).then_some(()),
    );
    assert_eq!(curl_with_token(&apis, &token).0, 200, "unbound token");

    // The issuer's documents, to an authenticated caller.
    let (code, body) = curl_with_token(
        &format!("{}/.well-known/openid-configuration", s.url),
        &token,
    );
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );
    let jwks_uri = doc["jwks_uri"].as_str().unwrap();
    assert!(jwks_uri.ends_with("/openid/v1/jwks"), "{jwks_uri}");
    let (code, body) = curl_with_token(&format!("{}/openid/v1/jwks", s.url), &token);
    assert_eq!(code, 200, "{body}");
    let jwks: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jwks["keys"][0]["alg"], "ES256");
    assert_eq!(jwks["keys"][0]["use"], "sig");

    // The key is kept in the data dir: a restarted server accepts the tokens it minted.
    s.stop();
    let s = Setpoint::start(&["server"], &dir.path().join("data"));
    let apis = format!("{}/apis", s.url);
    assert_eq!(curl_with_token(&apis, &token).0, 200, "after a restart");

    // Deleting the service account ends all its tokens.
    s.ok(&["delete", "sa", "bot", "-n", "a"]);
    eventually(
        "the token of a deleted service account is refused",
        REVOKED_WITHIN,
        || (curl_with_token(&apis, &token).0 == 401).then_some(()),
    );
    s.stop();
}

/// How long a revoked token may still be accepted: the server keeps an accepted token's user
/// for 10 s (as upstream's token cache does), on top of the watch cache's lag.
const REVOKED_WITHIN: Duration = Duration::from_secs(30);

/// A child process killed (and reaped) when dropped, pass or fail.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn legacy_token_secrets_are_filled_in_and_live_while_the_secret_does() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], &dir.path().join("data"));
    // A standalone controller manager running only the token controller: it mints through
    // the API, without the server's key.
    let controllers = Stopped(
        Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(["controller-manager", "--kubeconfig"])
            .arg(&s.kubeconfig)
            .args([
                "--controllers",
                "serviceaccount-token",
                "--secure-port",
                "0",
                "--leader-elect=false",
            ])
            .env("SETPOINT_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the controller manager"),
    );
    s.ok(&["create", "sa", "robot", "-n", "default"]);
    s.apply(
        "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/service-account-token\n\
         metadata:\n  name: robot-token\n  namespace: default\n  annotations:\n    \
         kubernetes.io/service-account.name: robot\n",
    );
    // A secret field, decoded (kubectl's templates have base64decode).
    let field = |key: &str| {
        let template = format!("--template={{{{index .data \"{key}\" | base64decode}}}}");
        let out = s.kubectl(&[
            "get",
            "secret",
            "robot-token",
            "-o",
            "go-template",
            &template,
        ]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.success() && !text.is_empty() && !text.contains("no value")).then_some(text)
    };
    let token = eventually(
        "the token controller fills in the secret",
        Duration::from_secs(20),
        || field("token"),
    );
    assert_eq!(field("namespace").as_deref(), Some("default"));
    let ca = field("ca.crt").unwrap();
    assert!(ca.contains("BEGIN CERTIFICATE"), "{ca}");
    let secret: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "secret", "robot-token", "-o", "json"])).unwrap();
    let sa_uid = s.ok(&["get", "sa", "robot", "-o", "jsonpath={.metadata.uid}"]);
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.uid"],
        sa_uid.trim()
    );

    let apis = format!("{}/apis", s.url);
    eventually("the secret's token works", Duration::from_secs(10), || {
        (curl_with_token(&apis, &token).0 == 200).then_some(())
    });
    s.ok(&["delete", "secret", "robot-token"]);
    eventually(
        "the token of a deleted secret is refused",
        REVOKED_WITHIN,
        || (curl_with_token(&apis, &token).0 == 401).then_some(()),
    );
    drop(controllers);
    s.stop();
}

#[test]
fn the_issuer_and_api_audiences_are_flags() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "server",
            "--service-account-issuer",
            "https://issuer.example",
            "--api-audiences",
            "api,vault",
        ],
        &dir.path().join("data"),
    );
    s.ok(&["create", "sa", "bot"]);
    let apis = format!("{}/apis", s.url);
    // Tokens default to the API's audiences, and name the configured issuer.
    let token = s.ok(&["create", "token", "bot"]).trim().to_string();
    assert_eq!(curl_with_token(&apis, &token).0, 200);
    let vault = s
        .ok(&["create", "token", "bot", "--audience", "vault"])
        .trim()
        .to_string();
    assert_eq!(curl_with_token(&apis, &vault).0, 200);
    let issuer_audience = s
        .ok(&[
            "create",
            "token",
            "bot",
            "--audience",
            "https://issuer.example",
        ])
        .trim()
        .to_string();
    assert_eq!(curl_with_token(&apis, &issuer_audience).0, 401);
    let (code, body) = curl_with_token(
        &format!("{}/.well-known/openid-configuration", s.url),
        &token,
    );
    assert_eq!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["issuer"], "https://issuer.example");
    s.stop();
}

#[test]
fn servers_on_one_etcd_accept_each_others_tokens() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = support::Etcd::start() else {
        return;
    };
    let on_etcd = |dir: &std::path::Path| {
        Setpoint::start(
            &["server", "--store", "etcd", "--etcd-endpoints", &etcd.url],
            dir,
        )
    };
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let a = on_etcd(dir_a.path());
    support::share_pki(dir_a.path(), dir_b.path());
    let b = on_etcd(dir_b.path());
    a.ok(&["create", "sa", "bot"]);
    let from_a = a.ok(&["create", "token", "bot"]).trim().to_string();
    let from_b = b.ok(&["create", "token", "bot"]).trim().to_string();
    for (token, server) in [(&from_a, &b), (&from_b, &a)] {
        let apis = format!("{}/apis", server.url);
        eventually(
            "a token minted by one server works on the other",
            Duration::from_secs(10),
            || (curl_with_token(&apis, token).0 == 200).then_some(()),
        );
    }
    // One key, published the same by both.
    let jwks = |s: &Setpoint| curl_with_token(&format!("{}/openid/v1/jwks", s.url), &from_a).1;
    assert_eq!(jwks(&a), jwks(&b));
    b.stop();
    a.stop();
}
