//! The accept loop every HTTP endpoint outside the API server runs on: the controller
//! manager's and the scheduler's secure port, the node agent's port, and [`metrics::serve`].
//!
//! [`serve`] accepts connections on a bound listener until stopped, completes the TLS
//! handshake (when given a TLS configuration) within [`HANDSHAKE_TIMEOUT`], and serves each
//! connection with hyper (HTTP/1.1, or HTTP/2 when ALPN or the preface asks for it). The
//! service is made per connection, from what the handshake established ([`Connection`]), so
//! an endpoint can decide what an unauthenticated caller may see. [`tls_config`] builds the
//! TLS configuration these endpoints share: a serving certificate, client certificates checked
//! against the cluster CA, HTTP/2 and HTTP/1.1 offered by ALPN.
//!
//! [`metrics::serve`]: crate::metrics::serve

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a client has to complete the TLS handshake before its connection is dropped: a
/// client that connects and stays silent must not hold a task and a socket for ever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the loop pauses after `accept` fails (typically out of file descriptors), so a
/// persistent failure does not spin a core.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Whether a TLS endpoint requires a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCertificates {
    /// A connection without a certificate of the client CA fails its handshake (kubelet's
    /// port: nothing there is for anonymous callers).
    Required,
    /// A certificate is asked for and, when sent, must be signed by the client CA; a
    /// connection without one is served as anonymous (the controller manager's and the
    /// scheduler's port, whose health paths are open to anyone). Without a client CA none is
    /// asked for.
    Optional,
}

/// Why [`tls_config`] could not build a configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The client CA bundle is not PEM.
    #[error("parsing the client CA bundle: {0}")]
    ClientCaPem(#[from] rustls_pki_types::pem::Error),
    /// Client certificates are required but the client CA bundle holds no certificate.
    #[error("the client CA bundle holds no certificate")]
    NoClientCa,
    /// The client CA cannot verify certificates.
    #[error("the client CA: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    /// A certificate or the key was refused.
    #[error("TLS: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The TLS configuration of an endpoint serving `certs` (the serving certificate first, then
/// its chain) with `key`, checking client certificates against `client_ca_pem` as
/// `client_certificates` says, offering HTTP/2 and HTTP/1.1 by ALPN.
pub fn tls_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_ca_pem: Option<&str>,
    client_certificates: ClientCertificates,
) -> Result<rustls::ServerConfig, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(client_ca_pem.unwrap_or("").as_bytes()) {
        roots.add(c?)?;
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut config = match (roots.is_empty(), client_certificates) {
        (true, ClientCertificates::Required) => return Err(TlsConfigError::NoClientCa),
        (true, ClientCertificates::Optional) => {
            builder.with_no_client_auth().with_single_cert(certs, key)?
        }
        (false, required) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = match required {
                ClientCertificates::Required => verifier.build()?,
                ClientCertificates::Optional => verifier.allow_unauthenticated().build()?,
            };
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs, key)?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What the accept loop knows about a connection when it makes the connection's service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The client's address.
    pub peer: SocketAddr,
    /// Whether the client presented a certificate during the TLS handshake. The TLS
    /// configuration's client verifier has accepted it by then, so with a verifier that
    /// checks against a CA this means "authenticated by that CA". Always `false` without TLS.
    pub client_certificate: bool,
}

/// A running endpoint (see [`serve`]). Stops accepting connections when
/// [`stop`](Self::stop)ped or dropped; connections already accepted run to their end.
pub struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Server {
    /// The bound address (with the port the system chose when the listener asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections and waits until the accept loop has ended.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections on `listener` until the returned [`Server`] is stopped or dropped, and
/// serves each with the service `make_service` returns for it.
///
/// With `tls`, a connection is served only once its handshake completes within
/// [`HANDSHAKE_TIMEOUT`]; a failed or late handshake closes it (logged at debug level, as a
/// client's mistake). `name` labels the loop's log lines. Must be called within a Tokio
/// runtime; fails only when the listener's address cannot be read.
pub fn serve<F, S, B>(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    name: &'static str,
    make_service: F,
) -> std::io::Result<Server>
where
    F: Fn(Connection) -> S + Send + Sync + 'static,
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let addr = listener.local_addr()?;
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let make_service = Arc::new(make_service);
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stopped.wait_for(|s| *s) => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(server = name, error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            // Answers go out in more than one write (TLS records, headers then body): with
            // Nagle's algorithm the last one waits for the caller's delayed ACK, ~40 ms.
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let make_service = make_service.clone();
            tokio::spawn(async move {
                // With upgrades: a handler may switch the connection to another protocol (the
                // node agent's exec, attach and port-forward streams).
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let served = match acceptor {
                    None => {
                        let service = make_service(Connection {
                            peer,
                            client_certificate: false,
                        });
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                            .await
                    }
                    Some(acceptor) => {
                        let stream = match tokio::time::timeout(
                            HANDSHAKE_TIMEOUT,
                            acceptor.accept(tcp),
                        )
                        .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(server = name, %peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(server = name, %peer, "TLS handshake timed out");
                                return;
                            }
                        };
                        let client_certificate = stream
                            .get_ref()
                            .1
                            .peer_certificates()
                            .is_some_and(|c| !c.is_empty());
                        let service = make_service(Connection {
                            peer,
                            client_certificate,
                        });
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(server = name, %peer, error = %e, "connection ended with an error");
                }
            });
        }
    });
    Ok(Server { addr, stop, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Answers every request with whether the connection presented a client certificate.
    fn echo_certificate(
        c: Connection,
    ) -> impl hyper::service::Service<
        http::Request<Incoming>,
        Response = http::Response<Full<bytes::Bytes>>,
        Error = std::convert::Infallible,
        Future = impl Send,
    > + Send {
        hyper::service::service_fn(move |_req| async move {
            Ok(http::Response::new(Full::new(bytes::Bytes::from(
                c.client_certificate.to_string(),
            ))))
        })
    }

    async fn get(addr: SocketAddr) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn plain_connections_are_served_until_stopped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = serve(listener, None, "test", echo_certificate).unwrap();
        let addr = server.local_addr();
        let reply = get(addr).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(reply.ends_with("false"), "{reply}");
        server.stop().await;
        // The listener is closed with the loop: nothing accepts any more.
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    /// A CA, a serving certificate and key, and a client certificate and key the CA signed.
    struct Pki {
        ca_pem: String,
        serving: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
        client: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
    }

    fn pki() -> Pki {
        use rcgen::{
            BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        };
        let key_der = |k: &KeyPair| PrivateKeyDer::Pkcs8(k.serialize_der().into());
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_params(&ca, &ca_key);
        let serving_key = KeyPair::generate().unwrap();
        let serving = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&serving_key)
            .unwrap();
        let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().unwrap();
        let client = client.signed_by(&client_key, &issuer).unwrap();
        Pki {
            ca_pem: ca_cert.pem(),
            serving: (vec![serving.der().clone()], key_der(&serving_key)),
            client: (vec![client.der().clone()], key_der(&client_key)),
        }
    }

    /// `GET /` over TLS, with `identity` as the client certificate if given: the response, or
    /// the error that ended the exchange.
    async fn get_tls(
        addr: SocketAddr,
        identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> std::io::Result<String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider));
        let config = match identity {
            Some((certs, key)) => builder.with_client_auth_cert(certs, key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        tls.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        tls.read_to_string(&mut out).await?;
        Ok(out)
    }

    async fn serve_tls(config: rustls::ServerConfig) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        serve(listener, Some(Arc::new(config)), "test", echo_certificate).unwrap()
    }

    #[tokio::test]
    async fn optional_client_certificates_are_reported_per_connection() {
        let p = pki();
        let (certs, key) = p.serving.clone_key();
        let config = tls_config(certs, key, Some(&p.ca_pem), ClientCertificates::Optional).unwrap();
        let server = serve_tls(config).await;
        let with = get_tls(server.local_addr(), Some(p.client.clone_key()))
            .await
            .unwrap();
        assert!(
            with.starts_with("HTTP/1.1 200") && with.ends_with("true"),
            "{with}"
        );
        let without = get_tls(server.local_addr(), None).await.unwrap();
        assert!(without.ends_with("false"), "{without}");
        // A certificate of another CA is refused, not served as anonymous.
        let stranger = get_tls(server.local_addr(), Some(pki().client)).await;
        assert!(stranger.is_err(), "{stranger:?}");
        server.stop().await;
    }

    #[tokio::test]
    async fn required_client_certificates_refuse_the_handshake_without_one() {
        let p = pki();
        let (certs, key) = p.serving.clone_key();
        let config = tls_config(certs, key, Some(&p.ca_pem), ClientCertificates::Required).unwrap();
        let server = serve_tls(config).await;
        let with = get_tls(server.local_addr(), Some(p.client.clone_key()))
            .await
            .unwrap();
        assert!(with.ends_with("true"), "{with}");
        let without = get_tls(server.local_addr(), None).await;
        assert!(
            without.is_err(),
            "served without a client certificate: {without:?}"
        );
        server.stop().await;
    }

    #[test]
    fn required_client_certificates_need_a_client_ca() {
        let p = pki();
        for ca in [None, Some(""), Some("not PEM")] {
            let (certs, key) = p.serving.clone_key();
            assert!(
                tls_config(certs, key, ca, ClientCertificates::Required).is_err(),
                "{ca:?}"
            );
        }
        let (certs, key) = p.serving.clone_key();
        assert!(tls_config(certs, key, None, ClientCertificates::Optional).is_ok());
    }

    /// Clones a certificate chain and its key (`PrivateKeyDer` is not `Clone`).
    trait CloneKey {
        fn clone_key(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);
    }

    impl CloneKey for (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        fn clone_key(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
            (self.0.clone(), self.1.clone_key())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
        let (certs, key) = pki().serving;
        let server =
            serve_tls(tls_config(certs, key, None, ClientCertificates::Optional).unwrap()).await;
        let mut silent = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        // With the clock paused, the read completes only once the handshake timeout has
        // fired and the server has closed the connection.
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(HANDSHAKE_TIMEOUT * 2, silent.read(&mut buf)).await;
        let n = read
            .expect("the silent connection outlived the handshake timeout")
            .unwrap_or(0);
        assert_eq!(
            n, 0,
            "the server sent something to a client that sent nothing"
        );
        server.stop().await;
    }
}
