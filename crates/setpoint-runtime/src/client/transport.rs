//! How requests reach an API server: the [`Transport`] trait, with an HTTPS implementation
//! for any Kubernetes-compatible server and [`ServiceTransport`] for an in-process server (any
//! `tower::Service`, e.g. Setpoint's API router — same admission and storage path, no sockets).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use tower::ServiceExt;

use super::kubeconfig::Kubeconfig;
use super::ClientError;

/// A boxed error for response bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body that can be read as a whole or streamed (watches).
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Sends one request and returns the response with a streaming body.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` and returns the response once its head has arrived. Any HTTP status is
    /// `Ok`; an error means the request got no answer ([`ClientError::Transport`]) or could not
    /// be formed ([`ClientError::Config`]).
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError>;

    /// Whether the request itself reaches the server, extensions included (an in-process
    /// server), rather than its bytes over a connection.
    fn in_process(&self) -> bool {
        false
    }
}

/// A transport over any `tower::Service` that speaks HTTP (the in-process API server).
#[derive(Clone)]
pub struct ServiceTransport<S> {
    service: S,
}

impl<S> ServiceTransport<S> {
    /// A transport that hands every request to a clone of `service`.
    pub fn new(service: S) -> Self {
        ServiceTransport { service }
    }
}

#[async_trait]
impl<S, B> Transport for ServiceTransport<S>
where
    S: tower::Service<http::Request<Full<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let resp = self
            .service
            .clone()
            .oneshot(req.map(Full::new))
            .await
            .map_err(|e| ClientError::Transport(e.into().to_string()))?;
        Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync()))
    }

    fn in_process(&self) -> bool {
        true
    }
}

/// HTTPS (or plain HTTP) to a server described by a kubeconfig: the server URL, its CA, and a
/// client certificate or bearer token. Connections are pooled; HTTP/2 is used when offered.
pub struct HttpsTransport {
    base: String,
    token: Option<TokenSource>,
    client: HyperClient<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Full<Bytes>,
    >,
}

impl HttpsTransport {
    /// Builds a transport from a parsed kubeconfig's current context.
    pub fn from_kubeconfig(kc: &Kubeconfig) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = &kc.ca_pem {
            use rustls_pki_types::pem::PemObject;
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
                let c = c.map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
                roots
                    .add(c)
                    .map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let builder = if kc.insecure_skip_tls_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
        } else {
            builder.with_root_certificates(roots)
        };
        let tls = match (&kc.client_cert_pem, &kc.client_key_pem) {
            (Some(cert), Some(key)) => {
                use rustls_pki_types::pem::PemObject;
                let certs = rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| ClientError::Config(format!("client certificate: {e}")))?;
                let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| ClientError::Config(format!("client key: {e}")))?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| ClientError::Config(e.to_string()))?
            }
            _ => builder.with_no_client_auth(),
        };
        // hyper-rustls sets ALPN (h2, http/1.1) itself from the enabled protocols.
        // Small API requests must not wait for Nagle's algorithm (~40 ms with delayed ACKs).
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build(connector);
        let token = match (&kc.token_file, &kc.token) {
            (Some(path), initial) => Some(TokenSource::file(
                path.clone(),
                initial.clone(),
                TOKEN_FILE_PERIOD,
            )),
            (None, Some(t)) => Some(TokenSource::Static(t.clone())),
            (None, None) => None,
        };
        Ok(HttpsTransport {
            base: kc.server.trim_end_matches('/').to_string(),
            token,
            client,
        })
    }
}

#[async_trait]
impl Transport for HttpsTransport {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = format!("{}{}", self.base, path)
            .parse()
            .map_err(|e| ClientError::Config(format!("URL: {e}")))?;
        if let Some(source) = &self.token {
            let t = source.token()?;
            let v = http::HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|e| ClientError::Config(e.to_string()))?;
            parts.headers.insert(http::header::AUTHORIZATION, v);
        }
        let resp = self
            .client
            .request(http::Request::from_parts(parts, Full::new(body)))
            .await
            .map_err(|e| ClientError::Transport(format!("{e:?}")))?;
        Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
    }
}

/// How often a token file is read again: client-go's cached file token source and kube-rs
/// both re-read it once a minute, well within the refresh margin of a projected token (the
/// node rewrites it at 80 % of its lifetime, an hour by default).
const TOKEN_FILE_PERIOD: Duration = Duration::from_secs(60);

/// Where a transport's bearer token comes from.
enum TokenSource {
    /// A token given once (a kubeconfig's `token`).
    Static(String),
    /// A file read again once `period` has passed since the last read (a kubeconfig's
    /// `tokenFile`, a pod's projected service-account token).
    File {
        path: PathBuf,
        period: Duration,
        /// The token last read and when; `None` until the first read.
        cached: Mutex<Option<(String, Instant)>>,
    },
}

impl TokenSource {
    /// A file source; `initial` (already read by the caller) counts as read now.
    fn file(path: PathBuf, initial: Option<String>, period: Duration) -> Self {
        TokenSource::File {
            path,
            period,
            cached: Mutex::new(initial.map(|t| (t, Instant::now()))),
        }
    }

    /// The token to send now.
    fn token(&self) -> Result<String, ClientError> {
        let (path, period, cached) = match self {
            TokenSource::Static(t) => return Ok(t.clone()),
            TokenSource::File {
                path,
                period,
                cached,
            } => (path, *period, cached),
        };
        let mut cached = cached.lock();
        if let Some((token, read)) = cached.as_ref() {
            if read.elapsed() < period {
                return Ok(token.clone());
            }
        }
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let token = text.trim().to_string();
                *cached = Some((token.clone(), Instant::now()));
                Ok(token)
            }
            // As client-go's caching source: a token that cannot be read again is kept (and
            // tried again on the next request) rather than failing the request outright.
            Err(e) => match cached.as_ref() {
                Some((token, _)) => {
                    tracing::warn!(path = %path.display(), error = %e, "re-reading the bearer token file failed; using the token read before");
                    Ok(token.clone())
                }
                None => Err(ClientError::Config(format!(
                    "reading the bearer token file {}: {e}",
                    path.display()
                ))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_token_is_sent_as_given() {
        assert_eq!(TokenSource::Static("t".into()).token().unwrap(), "t");
    }

    #[test]
    fn a_token_file_is_read_again_once_its_period_has_passed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one\n").unwrap();
        // Period zero: every request reads the file, so a rotated token is seen at once.
        let fresh = TokenSource::file(path.clone(), None, Duration::ZERO);
        assert_eq!(fresh.token().unwrap(), "one");
        std::fs::write(&path, "two").unwrap();
        assert_eq!(fresh.token().unwrap(), "two");
        // Within the period the token read before is sent without touching the file.
        let cached = TokenSource::file(path.clone(), Some("two".into()), Duration::from_secs(3600));
        std::fs::write(&path, "three").unwrap();
        assert_eq!(cached.token().unwrap(), "two");
    }

    #[test]
    fn an_unreadable_token_file_keeps_the_last_token_or_fails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let source = TokenSource::file(path.clone(), Some("old".into()), Duration::ZERO);
        assert_eq!(source.token().unwrap(), "old");
        let never = TokenSource::file(path, None, Duration::ZERO);
        assert!(never
            .token()
            .unwrap_err()
            .to_string()
            .contains("reading the bearer token file"));
    }
}
