//! The HTTPS endpoint `setpoint controller-manager` and `setpoint scheduler` serve on their
//! own port, as kube-controller-manager (10257) and kube-scheduler (10259) do: `/healthz`,
//! `/livez` and `/readyz` for anyone, `/metrics` for authenticated, authorized callers.
//!
//! Authentication is by client certificate: a certificate signed by the client CA
//! (`--client-ca-file`, by default the cluster CA of the component's kubeconfig) identifies
//! its caller, and every such caller may read `/metrics`. Upstream would also accept bearer
//! tokens (checked with a TokenReview) and ask the API server whether the caller may `get`
//! the path (a SubjectAccessReview); neither review is implemented by the API server yet,
//! so a token is not accepted and a valid certificate is all the authorization there is.
//! Without `--tls-cert-file`, the serving certificate is a self-signed one made at start.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::Full;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use setpoint_runtime::metrics::Registry;

/// Where and how the endpoint serves (kube-controller-manager's and kube-scheduler's flag
/// names; the port's default is the component's own).
#[derive(Clone, Debug)]
pub struct SecureServing {
    /// `--bind-address`.
    pub bind_address: IpAddr,
    /// `--secure-port`; 0 picks a free port (printed at start).
    pub secure_port: u16,
    /// `--tls-cert-file` and `--tls-private-key-file`.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// `--client-ca-file`, else the kubeconfig's cluster CA (PEM).
    pub client_ca_file: Option<PathBuf>,
}

/// A running endpoint; stops when dropped.
pub struct SecureServer {
    server: setpoint_runtime::serving::Server,
}

impl SecureServer {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }
}

impl SecureServing {
    /// Binds and serves `registry`; `kubeconfig_ca` is the cluster CA used when no
    /// `--client-ca-file` is given. Prints `Serving securely on <addr>` (the port chosen for
    /// `--secure-port 0` included).
    pub async fn start(
        &self,
        registry: Arc<Registry>,
        kubeconfig_ca: Option<&str>,
    ) -> anyhow::Result<SecureServer> {
        let client_ca = match &self.client_ca_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading --client-ca-file {}", path.display()))?,
            ),
            None => kubeconfig_ca.map(str::to_owned),
        };
        if client_ca.is_none() {
            tracing::warn!("no client CA (--client-ca-file, or the kubeconfig's cluster CA): /metrics refuses every caller");
        }
        let tls = self.tls_config(client_ca.as_deref())?;
        let listen = SocketAddr::new(self.bind_address, self.secure_port);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        println!("Serving securely on {addr}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let server = setpoint_runtime::serving::serve(
            listener,
            Some(Arc::new(tls)),
            "secure port",
            move |connection| {
                let registry = registry.clone();
                // rustls verified any certificate the client sent against the client CA.
                let authenticated = connection.client_certificate;
                hyper::service::service_fn(move |req| {
                    let registry = registry.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(respond(&registry, authenticated, &req))
                    }
                })
            },
        )?;
        Ok(SecureServer { server })
    }

    /// The serving certificate (the files, or a self-signed one for this host) and the
    /// optional client certificate check.
    fn tls_config(&self, client_ca: Option<&str>) -> anyhow::Result<rustls::ServerConfig> {
        let (certs, key) = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => {
                let certs = CertificateDer::pem_file_iter(cert)
                    .with_context(|| format!("reading --tls-cert-file {}", cert.display()))?
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("parsing {}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("reading --tls-private-key-file {}", key.display()))?;
                (certs, key)
            }
            (None, None) => {
                let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
                if !self.bind_address.is_unspecified() {
                    names.push(self.bind_address.to_string());
                }
                let generated = rcgen::generate_simple_self_signed(names)?;
                let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
                    generated.signing_key.serialize_der(),
                ));
                (vec![generated.cert.der().clone()], key)
            }
            _ => anyhow::bail!("--tls-cert-file and --tls-private-key-file go together"),
        };
        // A certificate is asked for but not required: health checks come without one.
        Ok(setpoint_runtime::serving::tls_config(
            certs,
            key,
            client_ca,
            setpoint_runtime::serving::ClientCertificates::Optional,
        )?)
    }
}

/// The paths every caller may read, as upstream's `--authorization-always-allow-paths`
/// default (`/healthz,/readyz,/livez`).
const ALWAYS_ALLOWED: &[&str] = &["/healthz", "/readyz", "/livez"];

fn respond<B>(
    registry: &Registry,
    authenticated: bool,
    req: &http::Request<B>,
) -> http::Response<Full<Bytes>> {
    let path = req.uri().path();
    let reply = |status: http::StatusCode, content_type: &str, body: String| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .header("X-Content-Type-Options", "nosniff")
            .body(Full::new(Bytes::from(body)))
            .expect("valid response")
    };
    let text = "text/plain; charset=utf-8";
    if ALWAYS_ALLOWED.contains(&path) {
        return reply(http::StatusCode::OK, text, "ok".into());
    }
    if path != "/metrics" {
        return reply(
            http::StatusCode::NOT_FOUND,
            text,
            "404 page not found\n".into(),
        );
    }
    if !authenticated {
        let verb = req.method().as_str().to_ascii_lowercase();
        let status = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("forbidden: User \"system:anonymous\" cannot {verb} path \"{path}\""),
            "reason": "Forbidden",
            "details": {},
            "code": 403,
        });
        return reply(
            http::StatusCode::FORBIDDEN,
            "application/json",
            serde_json::to_string_pretty(&status).unwrap_or_default(),
        );
    }
    let accept = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (content_type, body) = setpoint_runtime::metrics::exposition(registry, accept);
    reply(http::StatusCode::OK, content_type, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> http::Request<()> {
        http::Request::get(path).body(()).unwrap()
    }

    #[test]
    fn health_is_open_metrics_need_a_client_certificate() {
        let registry = Registry::default();
        for p in ALWAYS_ALLOWED {
            assert_eq!(respond(&registry, false, &get(p)).status(), 200);
        }
        let refused = respond(&registry, false, &get("/metrics"));
        assert_eq!(refused.status(), 403);
        assert_eq!(respond(&registry, true, &get("/metrics")).status(), 200);
        assert_eq!(respond(&registry, true, &get("/other")).status(), 404);
    }
}
