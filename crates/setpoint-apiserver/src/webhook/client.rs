//! The webhook client: POSTs a JSON body to a `WebhookClientConfig` and returns the answer's
//! body. Admission webhooks use it; CRD conversion and the aggregation layer can too.
//!
//! A `url` is called as written. A `service` reference is resolved to a ready endpoint of
//! the Service (through its Endpoints, the way `services/proxy` resolves one, see
//! [`crate::proxy::service_target`]) and called there, with the TLS server name
//! `<service>.<namespace>.svc` as upstream's service resolver gives it. The server's
//! certificate is verified against `caBundle`, or the host's trust store when it is empty.
//! Errors read as upstream's (`Post "https://…?timeout=10s": …`), since users grep for them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;

use crate::state::ApiServer;

/// The largest answer read from a webhook (upstream's REST client bounds webhook responses
/// the same way, so a misbehaving webhook cannot exhaust the server's memory).
pub(crate) const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

/// Where the host's trusted roots are, for a config without `caBundle`.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why a call failed: its text is what follows `failed calling webhook "<name>": `.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// The config itself is unusable (no url or service, a bad caBundle).
    #[error("could not get REST client: {0}")]
    Config(String),
    /// The request did not get an answer (refused, TLS, timeout, a Service without endpoints).
    #[error("failed to call webhook: Post {url:?}: {reason}")]
    Transport { url: String, reason: String },
    /// The webhook answered with an error status.
    #[error("failed to call webhook: an error on the server ({body:?}) has prevented the request from succeeding")]
    Status { body: String },
    /// The answer was not what the protocol asks for (too large, not JSON, wrong uid).
    #[error("received invalid webhook response: {0}")]
    InvalidResponse(String),
}

/// Where one call goes.
struct Destination {
    /// The URL as upstream's messages show it (with `?timeout=`).
    url: String,
    /// Host and port to connect to.
    host: String,
    port: u16,
    /// The name the certificate must be valid for.
    server_name: String,
    /// Path and query of the request.
    path_and_query: String,
}

/// Go's `time.Duration` text of whole seconds (`10s`, `1m0s`), as upstream appends it.
fn go_seconds(secs: u64) -> String {
    if secs < 60 {
        format!("{secs}s")
    } else {
        format!("{}m{}s", secs / 60, secs % 60)
    }
}

/// Splits an `https://host[:port]/path` URL into its parts.
fn parse_url(url: &str) -> Result<(String, u16, String), CallError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| CallError::Config(format!("invalid url {url:?}: {e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(CallError::Config(format!(
            "invalid url {url:?}: 'https' is the only allowed URL scheme"
        )));
    }
    let host = uri
        .host()
        .ok_or_else(|| CallError::Config(format!("invalid url {url:?}: host must be specified")))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let path = match uri.path() {
        "" => "/".to_string(),
        p => p.to_string(),
    };
    Ok((host, uri.port_u16().unwrap_or(443), path))
}

impl ApiServer {
    /// Finds where `config` points to, resolving a Service reference to an endpoint.
    async fn destination(
        &self,
        config: &Value,
        timeout: Duration,
    ) -> Result<Destination, CallError> {
        let query = format!("?timeout={}", go_seconds(timeout.as_secs().max(1)));
        if let Some(url) = config.get("url").and_then(Value::as_str) {
            let (host, port, path) = parse_url(url)?;
            return Ok(Destination {
                url: format!("{url}{query}"),
                server_name: host.clone(),
                host,
                port,
                path_and_query: format!("{path}{query}"),
            });
        }
        let Some(service) = config.get("service") else {
            return Err(CallError::Config(
                "exactly one of url or service is required".into(),
            ));
        };
        let text = |k: &str| {
            service
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (namespace, name, path) = (text("namespace"), text("name"), text("path"));
        let port = service.get("port").and_then(Value::as_u64).unwrap_or(443);
        let server_name = format!("{name}.{namespace}.svc");
        let path = if path.is_empty() {
            "/".to_string()
        } else {
            path
        };
        let url = format!("https://{server_name}:{port}{path}{query}");
        let transport = |reason: String| CallError::Transport {
            url: url.clone(),
            reason,
        };
        let registry = self.registry();
        let def = |plural: &str| registry.get("", "v1", plural).map(|d| (**d).clone());
        let (Some(services), Some(endpoints)) = (def("services"), def("endpoints")) else {
            return Err(transport("services are not served".into()));
        };
        let svc = self
            .get_object(&services, &namespace, &name)
            .await
            .map_err(|_| transport(format!("service \"{name}\" not found")))?;
        let eps = self.get_object(&endpoints, &namespace, &name).await.ok();
        let target =
            crate::proxy::service_target(&svc, eps.as_ref(), "https", &port.to_string(), |n| {
                rand::random::<u32>() as usize % n
            })
            .map_err(|e| transport(e.message))?;
        Ok(Destination {
            url,
            host: target.host,
            port: target.port,
            server_name,
            path_and_query: format!("{path}{query}"),
        })
    }

    /// POSTs `body` (JSON) to the webhook `config` names and returns the answer's body,
    /// within `timeout` for the whole exchange.
    pub(crate) async fn call_webhook(
        &self,
        config: &Value,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, CallError> {
        let dest = self.destination(config, timeout).await?;
        let tls = tls_config(config.get("caBundle").and_then(Value::as_str))?;
        let url = dest.url.clone();
        match tokio::time::timeout(timeout, post(dest, tls, body)).await {
            Ok(result) => result,
            Err(_) => Err(CallError::Transport {
                url,
                reason: "context deadline exceeded".into(),
            }),
        }
    }
}

/// Go's words for the common connection failures (`connect: connection refused`).
pub(crate) fn dial_error(host: &str, port: u16, e: &std::io::Error) -> String {
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let what = match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".to_string(),
        std::io::ErrorKind::ConnectionReset => "read: connection reset by peer".to_string(),
        _ => e.to_string(),
    };
    format!("dial tcp {addr}: {what}")
}

async fn post(
    dest: Destination,
    tls: Arc<rustls::ClientConfig>,
    body: Bytes,
) -> Result<Bytes, CallError> {
    let transport = |reason: String| CallError::Transport {
        url: dest.url.clone(),
        reason,
    };
    let tcp = tokio::net::TcpStream::connect((dest.host.as_str(), dest.port))
        .await
        .map_err(|e| transport(dial_error(&dest.host, dest.port, &e)))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(dest.server_name.clone())
        .map_err(|e| transport(format!("invalid server name: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| transport(format!("tls: {e}")))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| transport(e.to_string()))?;
    tokio::spawn(async move {
        // Ends with the exchange (or when the caller gives up on it).
        let _ = conn.await;
    });
    let request = http::Request::post(dest.path_and_query.as_str())
        .header(
            http::header::HOST,
            format!("{}:{}", dest.server_name, dest.port),
        )
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(|e| transport(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| transport(e.to_string()))?;
    let status = response.status();
    let bytes = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                CallError::InvalidResponse(format!(
                    "the response is larger than {MAX_RESPONSE_BYTES} bytes"
                ))
            } else {
                transport(e.to_string())
            }
        })?
        .to_bytes();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&bytes);
        return Err(CallError::Status {
            body: text.chars().take(1024).collect(),
        });
    }
    Ok(bytes)
}

/// Client TLS trusting the PEM certificates of `ca_bundle` (base64, as `[]byte` fields are
/// in JSON), or the host's roots when there is none.
fn tls_config(ca_bundle: Option<&str>) -> Result<Arc<rustls::ClientConfig>, CallError> {
    let roots = root_store(ca_bundle)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CallError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The PEM certificates of `ca_bundle` (base64, as `[]byte` fields are in JSON), or the
/// host's roots when there is none; an error when that leaves no certificate. The aggregation
/// layer verifies extension servers with the same rule.
pub(crate) fn root_store(ca_bundle: Option<&str>) -> Result<rustls::RootCertStore, CallError> {
    use base64::Engine;
    let pem = match ca_bundle.filter(|b| !b.is_empty()) {
        Some(b64) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| CallError::Config(format!("caBundle is not base64: {e}")))?,
        None => std::fs::read(SYSTEM_ROOTS).unwrap_or_default(),
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| CallError::Config(format!("unable to load root certificates: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| CallError::Config(format!("unable to load root certificates: {e}")))?;
    }
    if roots.is_empty() {
        return Err(CallError::Config(
            "unable to load root certificates: no valid certificate authority data seen".into(),
        ));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_port_and_path() {
        assert_eq!(
            parse_url("https://127.0.0.1:9443/validate").unwrap(),
            ("127.0.0.1".into(), 9443, "/validate".into())
        );
        assert_eq!(
            parse_url("https://hooks.example.com").unwrap(),
            ("hooks.example.com".into(), 443, "/".into())
        );
        assert!(parse_url("http://x/y").is_err());
    }

    #[test]
    fn timeouts_read_as_go_durations() {
        assert_eq!(go_seconds(10), "10s");
        assert_eq!(go_seconds(90), "1m30s");
    }

    #[test]
    fn refused_connections_read_as_gos() {
        let e = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(
            dial_error("127.0.0.1", 1, &e),
            "dial tcp 127.0.0.1:1: connect: connection refused"
        );
    }
}
