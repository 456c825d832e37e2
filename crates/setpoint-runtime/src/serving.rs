//! The accept loop every HTTP endpoint outside the API server runs on: the controller
//! manager's and the scheduler's secure port, the node agent's port, and [`metrics::serve`].
//!
//! [`serve`] accepts connections on a bound listener until stopped, completes the TLS
//! handshake (when given a TLS configuration) within [`HANDSHAKE_TIMEOUT`], and serves each
//! connection with hyper (HTTP/1.1, or HTTP/2 when ALPN or the preface asks for it). The
//! service is made per connection, from what the handshake established ([`Connection`]), so
//! an endpoint can decide what an unauthenticated caller may see.
//!
//! [`metrics::serve`]: crate::metrics::serve

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a client has to complete the TLS handshake before its connection is dropped: a
/// client that connects and stays silent must not hold a task and a socket for ever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the loop pauses after `accept` fails (typically out of file descriptors), so a
/// persistent failure does not spin a core.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

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
            let acceptor = acceptor.clone();
            let make_service = make_service.clone();
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let served = match acceptor {
                    None => {
                        let service = make_service(Connection {
                            peer,
                            client_certificate: false,
                        });
                        builder.serve_connection(TokioIo::new(tcp), service).await
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
                            .serve_connection(TokioIo::new(stream), service)
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

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
        let generated = rcgen_free_config();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = serve(listener, Some(generated), "test", echo_certificate).unwrap();
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

    /// A TLS configuration without any certificate generator: a resolver that never finds a
    /// certificate is enough for a server that must only time out a silent client.
    fn rcgen_free_config() -> Arc<rustls::ServerConfig> {
        #[derive(Debug)]
        struct NoCertificate;
        impl rustls::server::ResolvesServerCert for NoCertificate {
            fn resolve(
                &self,
                _: rustls::server::ClientHello<'_>,
            ) -> Option<Arc<rustls::sign::CertifiedKey>> {
                None
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(NoCertificate)),
        )
    }
}
