//! `setpoint controller-manager --use-service-account-credentials`, as kube-controller-manager's
//! flag: each controller talks to the API server as its own ServiceAccount in `kube-system`
//! (`deployment-controller`, `replicaset-controller`, …), which upstream's bootstrap policy
//! binds to the `system:controller:<name>` ClusterRole. The controller manager's own identity
//! (`system:kube-controller-manager`) only makes those accounts and asks for their tokens
//! (TokenRequest); each controller's client presents its token, renewed before it expires,
//! and no client certificate, so the token is what identifies it.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_runtime::client::{Body, Client, ClientError, HttpsTransport, Kubeconfig, Transport};
use tokio::sync::watch;

/// The namespace of the controllers' ServiceAccounts.
const NAMESPACE: &str = "kube-system";

/// The lifetime asked of each token; upstream's controller-manager asks for an hour too.
const TOKEN_SECONDS: i64 = 3600;

/// The ServiceAccount a controller runs as, upstream's names. `None` for those that use the
/// controller manager's own credentials: the token controller (upstream's runs on the root
/// client, since it mints tokens) and any controller upstream gives no account.
pub fn service_account_of(controller: &str) -> Option<&'static str> {
    Some(match controller {
        "namespace" => "namespace-controller",
        "garbagecollector" => "generic-garbage-collector",
        "replicaset" => "replicaset-controller",
        "replicationcontroller" => "replication-controller",
        "deployment" => "deployment-controller",
        "statefulset" => "statefulset-controller",
        "daemonset" => "daemon-set-controller",
        "endpoint" => "endpoint-controller",
        "endpointslice" => "endpointslice-controller",
        "endpointslicemirroring" => "endpointslicemirroring-controller",
        "nodelifecycle" | "nodeipam" => "node-controller",
        "job" => "job-controller",
        "cronjob" => "cronjob-controller",
        "ttl-after-finished" => "ttl-after-finished-controller",
        "pod-garbage-collector" => "pod-garbage-collector",
        "clusterrole-aggregation" => "clusterrole-aggregation-controller",
        "serviceaccount" => "service-account-controller",
        "root-ca-cert-publisher" => "root-ca-cert-publisher",
        "resourcequota" => "resourcequota-controller",
        "csrapproving" | "csrsigning" => "certificate-controller",
        "persistentvolume-binder" => "persistent-volume-binder",
        "pvc-protection" => "pvc-protection-controller",
        "pv-protection" => "pv-protection-controller",
        "horizontalpodautoscaling" => "horizontal-pod-autoscaler",
        "disruption" => "disruption-controller",
        "service-lb-controller" => "service-controller",
        _ => return None,
    })
}

/// When to renew a token valid for `lifetime` from now: at 80 % of it (client-go's rule),
/// never sooner than 10 seconds.
pub fn renew_after(lifetime: Duration) -> Duration {
    (lifetime * 4 / 5).max(Duration::from_secs(10))
}

/// HTTPS with the current token of one ServiceAccount as the bearer.
struct TokenTransport {
    inner: HttpsTransport,
    token: Arc<RwLock<String>>,
}

#[async_trait::async_trait]
impl Transport for TokenTransport {
    async fn send(
        &self,
        mut req: http::Request<Bytes>,
    ) -> Result<http::Response<Body>, ClientError> {
        let token = self.token.read().map(|t| t.clone()).unwrap_or_default();
        let value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|e| ClientError::Config(format!("token: {e}")))?;
        req.headers_mut().insert(http::header::AUTHORIZATION, value);
        self.inner.send(req).await
    }
}

/// Makes the ServiceAccount unless it exists.
async fn ensure_account(cm: &Client, account: &str) -> Result<(), ClientError> {
    let path = format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}");
    match cm
        .request(http::Method::GET, &path, None, Bytes::new())
        .await
    {
        Ok(_) => return Ok(()),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e),
    }
    let body = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": account, "namespace": NAMESPACE},
    });
    match cm
        .request(
            http::Method::POST,
            &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts"),
            Some("application/json"),
            Bytes::from(body.to_string()),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A fresh token of the account and how long it is valid.
async fn request_token(cm: &Client, account: &str) -> Result<(String, Duration), ClientError> {
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    });
    let answer: Value = cm
        .request(
            http::Method::POST,
            &format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token"),
            Some("application/json"),
            Bytes::from(body.to_string()),
        )
        .await?;
    let token = answer["status"]["token"]
        .as_str()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ClientError::Decode("TokenRequest answered without a token".into()))?
        .to_string();
    // The server may shorten the lifetime; its expirationTimestamp is what counts.
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let lifetime = answer["status"]["expirationTimestamp"]
        .as_str()
        .and_then(|t| setpoint_api::time::parse_time(t).ok())
        .map(|t| (t.timestamp() - now).max(0))
        .unwrap_or(TOKEN_SECONDS);
    Ok((token, Duration::from_secs(lifetime as u64)))
}

/// The account exists and a token of it: retried every second until it works (the API
/// server may still be starting), or until `stop`.
async fn first_token(
    cm: &Client,
    account: &str,
    stop: &mut watch::Receiver<bool>,
) -> Option<(String, Duration)> {
    loop {
        let attempt = async {
            ensure_account(cm, account).await?;
            request_token(cm, account).await
        };
        match attempt.await {
            Ok(t) => return Some(t),
            Err(e) => {
                tracing::warn!(account, error = %e, "getting a service account token; retrying")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.wait_for(|s| *s) => return None,
        }
    }
}

/// A client authenticated as the controller's ServiceAccount (`kube-system/<account>`),
/// whose token `cm` (the controller manager's own client) requests and renews until `stop`.
/// `None` when `stop` came first.
pub async fn client_for(
    cm: &Client,
    kubeconfig: &Kubeconfig,
    account: &'static str,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Option<Client>> {
    let mut stop_first = stop.clone();
    let Some((token, lifetime)) = first_token(cm, account, &mut stop_first).await else {
        return Ok(None);
    };
    let token = Arc::new(RwLock::new(token));
    // The same server and CA, without the controller manager's certificate or token: the
    // API server authenticates a certificate before a bearer token.
    let bare = Kubeconfig {
        client_cert_pem: None,
        client_key_pem: None,
        token: None,
        ..kubeconfig.clone()
    };
    let transport = TokenTransport {
        inner: HttpsTransport::from_kubeconfig(&bare)?,
        token: token.clone(),
    };
    let renewer = cm.clone();
    let mut stop = stop;
    tokio::spawn(async move {
        let mut wait = renew_after(lifetime);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            wait = match request_token(&renewer, account).await {
                Ok((t, lifetime)) => {
                    if let Ok(mut current) = token.write() {
                        *current = t;
                    }
                    tracing::debug!(account, "renewed the service account token");
                    renew_after(lifetime)
                }
                Err(e) => {
                    tracing::warn!(account, error = %e, "renewing the service account token; retrying");
                    Duration::from_secs(5)
                }
            };
        }
    });
    Ok(Some(Client::new(transport)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_run_as_upstreams_service_accounts() {
        assert_eq!(
            service_account_of("deployment"),
            Some("deployment-controller")
        );
        assert_eq!(
            service_account_of("garbagecollector"),
            Some("generic-garbage-collector")
        );
        assert_eq!(service_account_of("nodelifecycle"), Some("node-controller"));
        // The token controller mints tokens, so it keeps the manager's own credentials.
        assert_eq!(service_account_of("serviceaccount-token"), None);
        for c in setpoint_controllers::manager::ALL {
            if *c != "serviceaccount-token" {
                assert!(service_account_of(c).is_some(), "{c} has no account");
            }
        }
    }

    #[test]
    fn tokens_are_renewed_at_four_fifths_of_their_life() {
        assert_eq!(
            renew_after(Duration::from_secs(3600)),
            Duration::from_secs(2880)
        );
        assert_eq!(renew_after(Duration::from_secs(1)), Duration::from_secs(10));
    }
}
