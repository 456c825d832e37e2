//! The kubelet's `/portforward/{namespace}/{pod}` endpoint, in the three forms clients use:
//!
//! - **SPDY** (`Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: portforward.k8s.io`): the
//!   client opens a pair of streams per connection it forwards, both with headers `port` and
//!   `requestID`, one `streamType: error` and one `streamType: data`. The data stream carries
//!   the bytes; a failure is written as text on the error stream (the kubelet's wording,
//!   `error forwarding port <port> to pod <name>_<namespace>, uid <uid>: <cause>`), and both
//!   are then closed. kubectl with `KUBECTL_PORT_FORWARD_WEBSOCKETS=false` speaks this.
//! - **SPDY tunneled over WebSocket** (subprotocol `SPDY/3.1+portforward.k8s.io`): the same
//!   SPDY session, its bytes carried in binary WebSocket messages regardless of frame
//!   boundaries. kubectl 1.30 and later speak this by default.
//! - **WebSocket channels** (`v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, or no
//!   subprotocol), the ports in the query (`port`, as the API server passes them, or the API's
//!   `ports`), each value possibly a comma-separated list: port `i` gets channel `2i` for data
//!   and `2i+1` for errors, each of which starts with the port as 2 bytes little-endian. The
//!   Python client's `portforward()` speaks this.
//!
//! The connection to the pod is the runtime's ([`PodRuntime::port_forward`]); this module
//! only carries bytes, with half-closes passed through (a client's FIN closes the write half of
//! the pod connection, the pod's EOF closes the stream).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::spdy::{self, Headers};
use super::websocket::{self, Protocol};
use crate::runtime::{PodRuntime, RuntimePod};
use crate::server::LogTargets;

/// The SPDY stream protocol of port-forward.
pub const PROTOCOL_V1: &str = "portforward.k8s.io";
/// The WebSocket subprotocol that tunnels a SPDY port-forward session.
pub const TUNNELING_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// How long the first stream of a pair waits for the second (the kubelet's stream creation
/// timeout).
const PAIR_TIMEOUT: Duration = Duration::from_secs(30);
/// The most ports one WebSocket channel request may name.
const MAX_PORTS: usize = 64;
/// How much of the pod's output goes into one WebSocket message.
const CHUNK: usize = 32 * 1024;
/// Messages waiting for the WebSocket writer, and per port for the pod connection.
const QUEUE: usize = 16;

/// The pod a request forwards to.
#[derive(Clone)]
struct Target {
    runtime: Arc<dyn PodRuntime>,
    pod: RuntimePod,
}

impl Target {
    /// The kubelet's message for a failed forward.
    fn failure(&self, port: u16, cause: &str) -> String {
        format!(
            "error forwarding port {port} to pod {}_{}, uid {}: {cause}",
            self.pod.name, self.pod.namespace, self.pod.uid
        )
    }
}

/// The route's handler: resolves the pod, then serves the protocol the request upgrades to.
pub async fn handle(
    State(targets): State<Arc<LogTargets>>,
    Path((namespace, pod)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Response {
    let Some((runtime, pod)) = targets.find(&namespace, &pod).await else {
        return super::text(StatusCode::NOT_FOUND, "pod does not exist");
    };
    let target = Target { runtime, pod };
    let headers = request.headers();
    if websocket::is_upgrade(headers) {
        let offered = websocket::offered_subprotocols(headers);
        if offered.iter().any(|p| p == TUNNELING_PROTOCOL) {
            return websocket::accept(request, Some(TUNNELING_PROTOCOL), move |ws| async move {
                serve_spdy(WsBytes::new(ws), target).await
            });
        }
        let ports = match parse_ports(&super::query_pairs(query.as_deref())) {
            Ok(p) => p,
            Err(e) => return super::text(StatusCode::BAD_REQUEST, e),
        };
        let protocol = if offered.is_empty() {
            None
        } else {
            match offered.iter().find_map(|o| {
                [Protocol::V4, Protocol::V4Base64]
                    .into_iter()
                    .find(|p| p.name() == o)
            }) {
                Some(p) => Some(p),
                None => {
                    return super::text(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "requested protocol(s) are not supported: [{}]; supports [{} {} {}]",
                            offered.join(" "),
                            Protocol::V4.name(),
                            Protocol::V4Base64.name(),
                            TUNNELING_PROTOCOL
                        ),
                    )
                }
            }
        };
        let name = protocol.map(Protocol::name);
        // No subprotocol: binary channels, as the kubelet's default.
        let protocol = protocol.unwrap_or(Protocol::V4);
        return websocket::accept(request, name, move |ws| async move {
            serve_channels(ws, protocol, ports, target).await
        });
    }
    if spdy::is_upgrade(headers) {
        let protocol = match spdy::negotiate(headers, &[PROTOCOL_V1]) {
            Ok(p) => p,
            Err(response) => return *response,
        };
        return spdy::upgrade(request, protocol, move |io| serve_spdy(io, target));
    }
    super::text(
        StatusCode::BAD_REQUEST,
        "unable to upgrade: port-forward needs an upgrade to SPDY/3.1 or WebSocket",
    )
}

/// The ports of a WebSocket request, the kubelet's rules and messages: `port` (or the API's
/// `ports`) at least once, each value a comma-separated list of ports from 1 to 65535.
pub fn parse_ports(query: &[(String, String)]) -> Result<Vec<u16>, String> {
    let values: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "port" || k == "ports")
        .map(|(_, v)| v.as_str())
        .collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            let port: u16 = p.parse().map_err(|e: std::num::ParseIntError| {
                let why = match e.kind() {
                    std::num::IntErrorKind::PosOverflow => "value out of range",
                    _ => "invalid syntax",
                };
                format!(
                    "unable to parse {value:?} as a port: strconv.ParseUint: parsing {p:?}: {why}"
                )
            })?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    if ports.len() > MAX_PORTS {
        return Err(format!(
            "at most {MAX_PORTS} ports may be forwarded at once"
        ));
    }
    Ok(ports)
}

/// The kubelet's checks on a port-forward stream's headers.
fn validate(headers: &Headers) -> Result<(), String> {
    let port = headers.get("port").unwrap_or("");
    if port.is_empty() {
        return Err("\"port\" header is required".into());
    }
    match port.parse::<u16>() {
        Ok(0) => return Err(format!("port {port:?} must be > 0")),
        Ok(_) => {}
        Err(_) => return Err(format!("unable to parse {port:?} as a port")),
    }
    match headers.get("streamtype").unwrap_or("") {
        "" => Err("\"streamType\" header is required".into()),
        "error" | "data" => Ok(()),
        other => Err(format!("invalid stream type {other:?}")),
    }
}

/// A SPDY port-forward session: pairs streams by `requestID` and forwards each pair.
async fn serve_spdy<IO>(io: IO, target: Target)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = spdy::serve_with(io, Arc::new(validate));
    // requestID → (data, error, when the first arrived).
    let mut pending: HashMap<String, (Option<spdy::Stream>, Option<spdy::Stream>, Instant)> =
        HashMap::new();
    while let Some(stream) = conn.accept().await {
        // A pair whose second stream never came is dropped (both ends closed).
        pending.retain(|_, (_, _, since)| since.elapsed() < PAIR_TIMEOUT);
        let data = stream.headers.get("streamtype") == Some("data");
        // Clients before requestID paired streams by id: the error stream first, its data
        // stream two ids later.
        let request_id = match stream.headers.get("requestid") {
            Some(id) => id.to_string(),
            None if data => stream.id.saturating_sub(2).to_string(),
            None => stream.id.to_string(),
        };
        let entry = pending
            .entry(request_id.clone())
            .or_insert_with(|| (None, None, Instant::now()));
        if data {
            entry.0 = Some(stream);
        } else {
            entry.1 = Some(stream);
        }
        if entry.0.is_some() && entry.1.is_some() {
            if let Some((Some(d), Some(e), _)) = pending.remove(&request_id) {
                tokio::spawn(forward_pair(target.clone(), d, e));
            }
        }
    }
}

/// One forwarded connection: the pod's bytes on the data stream, a failure on the error one.
async fn forward_pair(target: Target, data: spdy::Stream, error: spdy::Stream) {
    let port: u16 = data
        .headers
        .get("port")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let mut data_io = data.io;
    let mut error_io = error.io;
    match target.runtime.port_forward(&target.pod, port).await {
        Ok(mut pod) => {
            if let Err(e) = tokio::io::copy_bidirectional(&mut data_io, &mut pod).await {
                tracing::debug!(port, error = %e, "port-forward connection ended");
            }
        }
        Err(e) => {
            let message = target.failure(port, &e.to_string());
            tracing::debug!(%message, "port-forward failed");
            let _ = error_io.write_all(message.as_bytes()).await;
        }
    }
    let _ = error_io.shutdown().await;
    let _ = data_io.shutdown().await;
}

/// Serves the WebSocket channel protocol for `ports`.
async fn serve_channels<S>(
    ws: WebSocketStream<S>,
    protocol: Protocol,
    ports: Vec<u16>,
    target: Target,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut incoming) = ws.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    let mut to_pod = Vec::new();
    let mut forwards = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let (data_ch, error_ch) = ((2 * i) as u8, (2 * i + 1) as u8);
        // Every channel opens with its port, little-endian, as the kubelet's do.
        for ch in [data_ch, error_ch] {
            let _ = out_tx.send(protocol.encode(ch, &port.to_le_bytes())).await;
        }
        let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
        to_pod.push(tx);
        forwards.push(tokio::spawn(forward_channel(
            target.clone(),
            protocol,
            port,
            (data_ch, error_ch),
            rx,
            out_tx.clone(),
        )));
    }
    let reader = tokio::spawn(async move {
        let mut to_pod: Vec<Option<mpsc::Sender<Bytes>>> = to_pod.into_iter().map(Some).collect();
        while let Some(Ok(message)) = incoming.next().await {
            if message.is_close() {
                break;
            }
            let Some((ch, data)) = protocol.decode(&message) else {
                continue;
            };
            // Only data channels carry client bytes; writes to error channels are ignored.
            let Some(slot) = to_pod.get_mut(usize::from(ch) / 2).filter(|_| ch % 2 == 0) else {
                continue;
            };
            if let Some(tx) = slot {
                if tx.send(data).await.is_err() {
                    *slot = None;
                }
            }
        }
        // The client is gone: every pod connection's write half closes.
    });
    for f in forwards {
        let _ = f.await;
    }
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
}

/// One port of a WebSocket channel session.
async fn forward_channel(
    target: Target,
    protocol: Protocol,
    port: u16,
    (data_ch, error_ch): (u8, u8),
    mut from_client: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Message>,
) {
    let pod = match target.runtime.port_forward(&target.pod, port).await {
        Ok(pod) => pod,
        Err(e) => {
            let message = target.failure(port, &e.to_string());
            let _ = out
                .send(protocol.encode(error_ch, message.as_bytes()))
                .await;
            return;
        }
    };
    let (mut pod_read, mut pod_write) = tokio::io::split(pod);
    let upstream = tokio::spawn(async move {
        while let Some(data) = from_client.recv().await {
            if pod_write.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = pod_write.shutdown().await;
    });
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pod_read.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if out.send(protocol.encode(data_ch, &buf[..n])).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                let message = target.failure(port, &e.to_string());
                let _ = out
                    .send(protocol.encode(error_ch, message.as_bytes()))
                    .await;
                break;
            }
        }
    }
    upstream.abort();
}

/// A WebSocket seen as a byte stream: binary messages in, one binary message per write out.
/// client-go's tunneling connection is this on the other side, so SPDY frames need not line up
/// with messages.
pub struct WsBytes<S> {
    ws: WebSocketStream<S>,
    pending: Bytes,
}

impl<S> WsBytes<S> {
    /// Wraps an open WebSocket.
    pub fn new(ws: WebSocketStream<S>) -> Self {
        WsBytes {
            ws,
            pending: Bytes::new(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsBytes<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => self.pending = b,
                // A close, or the end of the connection, is the end of the bytes.
                Some(Ok(Message::Close(_))) | None => return Poll::Ready(Ok(())),
                // Pings are answered by the WebSocket layer; text carries nothing here.
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsBytes<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(io::Error::other)?;
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(Bytes::copy_from_slice(buf)))
            .map_err(io::Error::other)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws)
            .poll_flush(cx)
            .map_err(io::Error::other)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ports_follow_the_kubelets_rules() {
        assert_eq!(
            parse_ports(&q(&[("port", "80"), ("port", "81,82")])).unwrap(),
            [80, 81, 82]
        );
        assert_eq!(parse_ports(&q(&[("ports", "8080")])).unwrap(), [8080]);
        assert_eq!(
            parse_ports(&q(&[])).unwrap_err(),
            "query parameter \"port\" is required"
        );
        assert_eq!(
            parse_ports(&q(&[("port", "")])).unwrap_err(),
            "query parameter \"port\" cannot be empty"
        );
        assert_eq!(
            parse_ports(&q(&[("port", "x")])).unwrap_err(),
            "unable to parse \"x\" as a port: strconv.ParseUint: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            parse_ports(&q(&[("port", "0")])).unwrap_err(),
            "port \"0\" must be > 0"
        );
        assert!(parse_ports(&q(&[("port", "70000")]))
            .unwrap_err()
            .contains("value out of range"));
    }

    #[test]
    fn streams_are_checked_as_the_kubelet_does() {
        let h = |pairs: &[(&str, &str)]| Headers(q(pairs));
        assert!(validate(&h(&[("port", "80"), ("streamtype", "data")])).is_ok());
        assert!(validate(&h(&[("port", "80"), ("streamtype", "error")])).is_ok());
        assert_eq!(
            validate(&h(&[("streamtype", "data")])).unwrap_err(),
            "\"port\" header is required"
        );
        assert_eq!(
            validate(&h(&[("port", "80"), ("streamtype", "stdin")])).unwrap_err(),
            "invalid stream type \"stdin\""
        );
        assert_eq!(
            validate(&h(&[("port", "0"), ("streamtype", "data")])).unwrap_err(),
            "port \"0\" must be > 0"
        );
    }
}
