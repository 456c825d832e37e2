//! The kubelet's WebSocket channel protocols, server side.
//!
//! Every message is one channel's bytes: in the binary protocols a first byte names the
//! channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize) and the rest is data; in the
//! base64 protocols a text message starts with the channel as an ASCII digit and the rest is
//! base64. `v5.channel.k8s.io` (kubectl's first choice since 1.29) adds channel 255: `[255, n]`
//! from the client closes its channel `n` (stdin's EOF, which v4 clients cannot send).
//! `v4.channel.k8s.io` and later put the outcome on the error channel as a JSON `Status`; the
//! older ones put only a failure's message there.
//!
//! The protocol is the first one of the client's `Sec-WebSocket-Protocol` list that this
//! server speaks; a client naming none gets `channel.k8s.io`, as the kubelet does.
//!
//! tokio-tungstenite frames the upgraded connection: it takes any `AsyncRead + AsyncWrite`,
//! so it sits directly on hyper's upgraded stream (the same path the API server proxies
//! through), and it is the client of containerd's streaming server too.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::remotecommand::{self, Outcome, Session};

/// Channel numbers of the remote command protocols.
pub mod channel {
    /// The client's stdin.
    pub const STDIN: u8 = 0;
    /// The container's stdout.
    pub const STDOUT: u8 = 1;
    /// The container's stderr.
    pub const STDERR: u8 = 2;
    /// The outcome (a `Status` from v4 on).
    pub const ERROR: u8 = 3;
    /// Terminal resizes, JSON `{"Width":..,"Height":..}`.
    pub const RESIZE: u8 = 4;
    /// v5: `[255, n]` closes channel `n`.
    pub const CLOSE: u8 = 255;
}

/// A channel protocol this server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// `v5.channel.k8s.io`: v4 plus the close channel.
    V5,
    /// `v4.channel.k8s.io`: the error channel carries a JSON `Status`.
    V4,
    /// `v4.base64.channel.k8s.io`: v4 as base64 text messages.
    V4Base64,
    /// `channel.k8s.io`: the error channel carries text.
    V1,
    /// `base64.channel.k8s.io`: v1 as base64 text messages.
    V1Base64,
}

impl Protocol {
    /// Every protocol, the newest first.
    pub const ALL: [Protocol; 5] = [
        Protocol::V5,
        Protocol::V4,
        Protocol::V4Base64,
        Protocol::V1,
        Protocol::V1Base64,
    ];

    /// Its `Sec-WebSocket-Protocol` name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::V5 => "v5.channel.k8s.io",
            Protocol::V4 => "v4.channel.k8s.io",
            Protocol::V4Base64 => "v4.base64.channel.k8s.io",
            Protocol::V1 => "channel.k8s.io",
            Protocol::V1Base64 => "base64.channel.k8s.io",
        }
    }

    fn base64(self) -> bool {
        matches!(self, Protocol::V4Base64 | Protocol::V1Base64)
    }

    /// Whether the error channel carries a JSON `Status` (v4 and later).
    pub fn status_json(self) -> bool {
        matches!(self, Protocol::V5 | Protocol::V4 | Protocol::V4Base64)
    }

    /// Whether the client may close channels (v5).
    pub fn has_close(self) -> bool {
        self == Protocol::V5
    }

    /// One channel's data as a message of this protocol.
    pub fn encode(self, channel: u8, data: &[u8]) -> Message {
        if self.base64() {
            let mut text = String::with_capacity(1 + data.len().div_ceil(3) * 4);
            text.push(char::from(b'0' + channel % 10));
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
            Message::Text(text.into())
        } else {
            let mut frame = Vec::with_capacity(1 + data.len());
            frame.push(channel);
            frame.extend_from_slice(data);
            Message::Binary(Bytes::from(frame))
        }
    }

    /// A data message's channel and bytes; `None` for messages that carry none (control
    /// frames, empty messages) and for malformed ones.
    pub fn decode(self, message: &Message) -> Option<(u8, Bytes)> {
        match message {
            Message::Binary(b) if !self.base64() && !b.is_empty() => Some((b[0], b.slice(1..))),
            Message::Text(t) if self.base64() && !t.is_empty() => {
                let t = t.as_str();
                let channel = t.as_bytes()[0].checked_sub(b'0').filter(|c| *c <= 9)?;
                let data = base64::engine::general_purpose::STANDARD
                    .decode(&t[1..])
                    .ok()?;
                Some((channel, Bytes::from(data)))
            }
            _ => None,
        }
    }
}

/// The most one message (and one frame) from the client may hold. kubectl sends stdin in
/// chunks of at most 32 KiB; this bounds what a client can make the agent buffer.
pub const MAX_MESSAGE: usize = 1024 * 1024;
/// How many frames may wait for the connection's writer.
const OUTGOING: usize = 16;
/// How long output waits for a client that sends nothing first to be ready to read it.
const CLIENT_READY_GRACE: Duration = Duration::from_millis(150);
/// How much of one output stream goes into one frame.
const CHUNK: usize = 32 * 1024;

/// The connection's frame limits.
pub fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

fn header_has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    })
}

/// Whether the request asks for a WebSocket upgrade.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    header_has_token(headers, header::CONNECTION, "upgrade")
        && header_has_token(headers, header::UPGRADE, "websocket")
}

/// The protocol for the client's `Sec-WebSocket-Protocol` offers: the first offered that
/// this server speaks; `V1` (named in no header) when the client offers none.
pub fn negotiate(headers: &HeaderMap) -> Result<(Protocol, bool), String> {
    let offered = offered_subprotocols(headers);
    if offered.is_empty() {
        return Ok((Protocol::V1, false));
    }
    offered
        .iter()
        .find_map(|o| Protocol::ALL.into_iter().find(|p| p.name() == o))
        .map(|p| (p, true))
        .ok_or_else(|| {
            let ours: Vec<&str> = Protocol::ALL.iter().map(|p| p.name()).collect();
            format!(
                "requested protocol(s) are not supported: [{}]; supports [{}]",
                offered.join(" "),
                ours.join(" ")
            )
        })
}

/// Answers a WebSocket upgrade with 101 and runs the session on the upgraded connection.
pub fn serve(request: Request, session: Session) -> Response {
    let (protocol, named) = match negotiate(request.headers()) {
        Ok(p) => p,
        Err(e) => return super::text(StatusCode::BAD_REQUEST, e),
    };
    accept(request, named.then(|| protocol.name()), move |ws| {
        run(ws, protocol, session)
    })
}

/// The subprotocols a client offers in `Sec-WebSocket-Protocol`, in its order.
pub fn offered_subprotocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| {
            v.to_str()
                .unwrap_or("")
                .split(',')
                .map(|p| p.trim().to_string())
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.is_empty())
        .collect()
}

/// Answers a WebSocket upgrade with 101 (naming `protocol`, if any) and runs `session` on
/// the upgraded connection, with this module's frame limits.
pub fn accept<F, Fut>(mut request: Request, protocol: Option<&'static str>, session: F) -> Response
where
    F: FnOnce(WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let headers = request.headers();
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return super::text(
            StatusCode::BAD_REQUEST,
            "unsupported WebSocket version: Sec-WebSocket-Version must be 13",
        );
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return super::text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config()),
                )
                .await;
                session(ws).await;
            }
            Err(e) => tracing::debug!(error = %e, "streaming upgrade failed"),
        }
    });
    let mut response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(p) = protocol {
        response = response.header(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p));
    }
    response
        .body(Body::empty())
        .unwrap_or_else(|e| super::text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// Copies `from` into frames of `channel` until it ends.
async fn pump(
    protocol: Protocol,
    channel: u8,
    mut from: impl AsyncRead + Unpin,
    to: mpsc::Sender<Message>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.send(protocol.encode(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs a session over an open WebSocket: the client's stdin and resizes in, the
/// container's output out, the outcome on the error channel, then a normal close.
pub async fn run<S>(ws: WebSocketStream<S>, protocol: Protocol, session: Session)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut incoming) = ws.split();
    let remotecommand::Pipes {
        io,
        stdin,
        stdout,
        stderr,
        resize,
    } = remotecommand::pipes(&session.options);
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(OUTGOING);
    let client_spoke = Arc::new(Notify::new());
    let heard = client_spoke.clone();
    let writer = tokio::spawn(async move {
        // client-go (kubectl) starts reading right after the handshake but registers its
        // channels a moment later, and drops frames of channels it has not registered yet:
        // a fast command's whole output and status could be lost. So nothing is sent until
        // the client has sent something (a TTY's first resize, stdin) or a short grace has
        // passed.
        tokio::select! {
            _ = heard.notified() => {}
            _ = tokio::time::sleep(CLIENT_READY_GRACE) => {}
        }
        while let Some(m) = out_rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        // A normal closure (1000): clients read it as the end of every channel, while a
        // close without a code is an error to client-go.
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        let _ = sink.close().await;
    });
    let mut pumps = Vec::new();
    for (channel, pipe) in [(channel::STDOUT, stdout), (channel::STDERR, stderr)] {
        if let Some(pipe) = pipe {
            pumps.push(tokio::spawn(pump(protocol, channel, pipe, out_tx.clone())));
        }
    }
    // The client's side: stdin bytes, resizes, and (v5) closes. Reading also answers pings.
    let reader = tokio::spawn(async move {
        let mut stdin = stdin;
        while let Some(Ok(message)) = incoming.next().await {
            client_spoke.notify_one();
            if message.is_close() {
                break;
            }
            let Some((ch, data)) = protocol.decode(&message) else {
                continue;
            };
            match ch {
                channel::STDIN => {
                    if let Some(pipe) = stdin.as_mut() {
                        if pipe.write_all(&data).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                channel::RESIZE => match remotecommand::parse_resize(&data) {
                    Ok(size) => {
                        if let Some(tx) = &resize {
                            let _ = tx.send(size).await;
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "ignoring a malformed resize"),
                },
                channel::CLOSE if protocol.has_close() && data.first() == Some(&channel::STDIN) => {
                    // The container's stdin sees EOF.
                    stdin = None;
                }
                _ => {}
            }
        }
        // The client went away or closed: its stdin ends.
        drop(stdin);
    });
    let outcome = remotecommand::run(&session, io).await;
    // The runtime has let go of its ends: what is left in the pipes goes out before the
    // outcome, so the client sees all output and then the status.
    for p in pumps {
        let _ = p.await;
    }
    let status = if protocol.status_json() {
        Some(outcome.status().to_string())
    } else {
        outcome.text()
    };
    if let Some(status) = status {
        let _ = out_tx
            .send(protocol.encode(channel::ERROR, status.as_bytes()))
            .await;
    }
    if let Outcome::Failed { error, .. } = &outcome {
        tracing::debug!(pod = %session.pod.name, container = %session.container, %error, "streaming session failed");
    }
    drop(out_tx);
    let _ = writer.await;
    reader.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn negotiation_takes_the_clients_first_known_protocol() {
        let h = headers(&[("sec-websocket-protocol", "v5.channel.k8s.io")]);
        assert_eq!(negotiate(&h).unwrap(), (Protocol::V5, true));
        let h = headers(&[(
            "sec-websocket-protocol",
            "v9.channel.k8s.io, v4.channel.k8s.io, channel.k8s.io",
        )]);
        assert_eq!(negotiate(&h).unwrap(), (Protocol::V4, true));
        assert_eq!(negotiate(&headers(&[])).unwrap(), (Protocol::V1, false));
        let e = negotiate(&headers(&[("sec-websocket-protocol", "x")])).unwrap_err();
        assert!(
            e.starts_with("requested protocol(s) are not supported: [x]"),
            "{e}"
        );
        assert!(is_upgrade(&headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
    }

    #[test]
    fn frames_round_trip_in_both_encodings() {
        for p in Protocol::ALL {
            let m = p.encode(channel::STDOUT, b"hello\0");
            assert_eq!(
                p.decode(&m),
                Some((channel::STDOUT, Bytes::from_static(b"hello\0")))
            );
        }
        assert_eq!(
            Protocol::V5.encode(channel::ERROR, b"x"),
            Message::Binary(Bytes::from_static(&[3, b'x']))
        );
        assert_eq!(
            Protocol::V1Base64.encode(channel::STDERR, b"hi"),
            Message::Text("2aGk=".into())
        );
        assert_eq!(Protocol::V5.decode(&Message::Binary(Bytes::new())), None);
        assert_eq!(
            Protocol::V4Base64.decode(&Message::Text("x!!".into())),
            None
        );
    }
}
