//! The login `setpoint up` prints for the live view at `/ui/` (docs/ui.md): a browser cannot
//! present the admin kubeconfig's client certificate, so `up` keeps a `setpoint-ui` service
//! account in `kube-system` bound to `cluster-admin` (the admin's own rights) and asks a
//! TokenRequest for a token of it, which the printed URL carries in its fragment (never sent
//! to the server, so never in its logs).

use anyhow::Context;
use serde_json::{json, Value};
use setpoint_runtime::client::Client;

use crate::join::{create_or_replace, send};

/// The service account, and the ClusterRoleBinding that gives it `cluster-admin`.
pub const ACCOUNT: &str = "setpoint-ui";
/// How long the printed token is valid.
pub const TOKEN_SECONDS: i64 = 24 * 3600;

/// Keeps the account and its binding, and returns a new token for it.
pub async fn token(client: &Client) -> anyhow::Result<String> {
    let account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": ACCOUNT, "namespace": "kube-system"},
    });
    create_or_replace(
        client,
        "/api/v1/namespaces/kube-system/serviceaccounts",
        ACCOUNT,
        &account,
    )
    .await
    .context("keeping the kube-system/setpoint-ui service account")?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "kube-system"}],
    });
    create_or_replace(
        client,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        ACCOUNT,
        &binding,
    )
    .await
    .context("binding setpoint-ui to cluster-admin")?;
    let request = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    });
    let answer: Value = send(
        client,
        http::Method::POST,
        &format!("/api/v1/namespaces/kube-system/serviceaccounts/{ACCOUNT}/token"),
        &request,
    )
    .await
    .context("requesting a token for setpoint-ui")?;
    answer["status"]["token"]
        .as_str()
        .map(str::to_string)
        .context("the TokenRequest's answer has no status.token")
}

/// The URL that opens the live view of the server at `url` signed in with `token`.
pub fn url(server: &str, token: &str) -> String {
    format!("{}/ui/#token={token}", server.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_goes_in_the_fragment() {
        assert_eq!(
            super::url("https://127.0.0.1:6443/", "abc"),
            "https://127.0.0.1:6443/ui/#token=abc"
        );
    }
}
