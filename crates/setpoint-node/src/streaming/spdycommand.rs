//! `exec` and `attach` over SPDY/3.1: what kubectl falls back to when the WebSocket upgrade
//! fails, and speaks always with `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false`.
//!
//! The protocol is negotiated through `X-Stream-Protocol-Version` among those the kubelet
//! speaks: `v4.channel.k8s.io` (the outcome as a JSON `Status` on the error stream),
//! `v3.channel.k8s.io` (adds the resize stream), `v2.channel.k8s.io` and `channel.k8s.io`
//! (the error stream carries a failure's message as text). The client opens one stream per
//! channel, each named by its `streamType` header (`error`, `stdin`, `stdout`, `stderr`,
//! `resize`); the session starts once every stream the options call for is open, and gives
//! up after the kubelet's 30 s. Then the output streams are closed once drained, the outcome
//! goes on the error stream, and the session ends with a GOAWAY.

use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::remotecommand::{self, Session};
use super::spdy::{self, Headers};

/// The stream protocols served, the newest first.
pub const PROTOCOLS: [&str; 4] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// How long the client has to open its streams (the kubelet's stream creation timeout).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// The most bytes one resize message may take before it is complete.
const MAX_RESIZE: usize = 4096;
/// How long the GOAWAY and the last frames may take to leave.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether `protocol` puts a JSON `Status` on the error stream.
fn status_json(protocol: &str) -> bool {
    protocol == PROTOCOLS[0]
}

/// Whether `protocol` has a resize stream.
fn has_resize(protocol: &str) -> bool {
    protocol == PROTOCOLS[0] || protocol == PROTOCOLS[1]
}

/// The kubelet's check of a stream's type.
fn validate(headers: &Headers) -> Result<(), String> {
    match headers.get("streamtype").unwrap_or("") {
        "error" | "stdin" | "stdout" | "stderr" | "resize" => Ok(()),
        other => Err(format!("unexpected stream type: {other:?}")),
    }
}

/// Answers the SPDY upgrade and runs the session on it.
pub fn serve(request: Request, session: Session) -> Response {
    let protocol = match spdy::negotiate(request.headers(), &PROTOCOLS) {
        Ok(p) => p,
        Err(response) => return *response,
    };
    spdy::upgrade(request, protocol, move |io| run(io, protocol, session))
}

/// The streams of one session, as the client opened them.
#[derive(Default)]
struct Streams {
    error: Option<spdy::Stream>,
    stdin: Option<spdy::Stream>,
    stdout: Option<spdy::Stream>,
    stderr: Option<spdy::Stream>,
    resize: Option<spdy::Stream>,
}

impl Streams {
    fn complete(&self, o: &remotecommand::Options, protocol: &str) -> bool {
        self.error.is_some()
            && (!o.stdin || self.stdin.is_some())
            && (!o.stdout || self.stdout.is_some())
            && (!o.stderr || o.tty || self.stderr.is_some())
            && (!(o.tty && has_resize(protocol)) || self.resize.is_some())
    }
}

/// Runs one session on an upgraded connection.
pub async fn run<IO>(io: IO, protocol: &'static str, session: Session)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let mut conn = spdy::serve_with(io, std::sync::Arc::new(validate));
    let mut streams = Streams::default();
    let gathered = tokio::time::timeout(STREAM_CREATION_TIMEOUT, async {
        while !streams.complete(&session.options, protocol) {
            let Some(s) = conn.accept().await else {
                return false;
            };
            let slot = match s.headers.get("streamtype") {
                Some("error") => &mut streams.error,
                Some("stdin") => &mut streams.stdin,
                Some("stdout") => &mut streams.stdout,
                Some("stderr") => &mut streams.stderr,
                _ => &mut streams.resize,
            };
            *slot = Some(s);
        }
        true
    })
    .await;
    if gathered != Ok(true) {
        tracing::debug!(pod = %session.pod.name, "exec over SPDY: the client did not open its streams");
        conn.close(CLOSE_TIMEOUT).await;
        return;
    }
    let remotecommand::Pipes {
        io: runtime_io,
        stdin,
        stdout,
        stderr,
        resize,
    } = remotecommand::pipes(&session.options);
    // The client's stdin into the runtime's pipe; its FIN is the container's EOF.
    let stdin_task = match (streams.stdin.take(), stdin) {
        (Some(mut from), Some(mut to)) => Some(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from.io, &mut to).await;
            let _ = to.shutdown().await;
        })),
        _ => None,
    };
    let resize_task = match (streams.resize.take(), resize) {
        (Some(from), Some(to)) => Some(tokio::spawn(read_resizes(from.io, to))),
        _ => None,
    };
    let mut pumps = Vec::new();
    for (pipe, stream) in [
        (stdout, streams.stdout.take()),
        (stderr, streams.stderr.take()),
    ] {
        match (pipe, stream) {
            (Some(mut from), Some(mut to)) => pumps.push(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to.io).await;
                let _ = to.io.shutdown().await;
            })),
            // A stream the client opened that nothing writes to is closed at once.
            (None, Some(mut to)) => {
                let _ = to.io.shutdown().await;
            }
            _ => {}
        }
    }
    let outcome = remotecommand::run(&session, runtime_io).await;
    for p in pumps {
        let _ = p.await;
    }
    if let Some(mut error) = streams.error.take() {
        let message = if status_json(protocol) {
            Some(outcome.status().to_string())
        } else {
            outcome.text()
        };
        if let Some(m) = message {
            let _ = error.io.write_all(m.as_bytes()).await;
        }
        let _ = error.io.shutdown().await;
    }
    if let remotecommand::Outcome::Failed { error, .. } = &outcome {
        tracing::debug!(pod = %session.pod.name, container = %session.container, %error, "exec over SPDY failed");
    }
    if let Some(t) = stdin_task {
        t.abort();
    }
    if let Some(t) = resize_task {
        t.abort();
    }
    conn.close(CLOSE_TIMEOUT).await;
}

/// Terminal sizes from the resize stream: a sequence of JSON objects, each handed on as it
/// completes. A malformed one, or one longer than [`MAX_RESIZE`], ends the stream.
async fn read_resizes(
    mut from: tokio::io::DuplexStream,
    to: tokio::sync::mpsc::Sender<crate::runtime::TerminalSize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        loop {
            let mut values = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            match values.next() {
                Some(Ok(_)) => {
                    let end = values.byte_offset();
                    match remotecommand::parse_resize(&buf[..end]) {
                        Ok(size) => {
                            if to.send(size).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => tracing::debug!(error = %e, "ignoring a malformed resize"),
                    }
                    buf.drain(..end);
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(_)) => return,
                None => {
                    buf.clear();
                    break;
                }
            }
        }
        if buf.len() > MAX_RESIZE {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::TerminalSize;

    #[test]
    fn streams_are_complete_when_the_options_are_met() {
        use super::super::remotecommand::Options;
        let (a, _b) = tokio::io::duplex(8);
        let stream = |t: &str, io| spdy::Stream {
            id: 1,
            headers: Headers(vec![("streamtype".into(), t.into())]),
            io,
        };
        let s = Options {
            stdout: true,
            tty: true,
            ..Default::default()
        };
        let mut streams = Streams {
            error: Some(stream("error", a)),
            ..Default::default()
        };
        assert!(!streams.complete(&s, "v4.channel.k8s.io"));
        let (c, _d) = tokio::io::duplex(8);
        streams.stdout = Some(stream("stdout", c));
        // v4 with a TTY waits for the resize stream; v2 has none.
        assert!(!streams.complete(&s, "v4.channel.k8s.io"));
        assert!(streams.complete(&s, "v2.channel.k8s.io"));
        assert!(validate(&Headers(vec![("streamtype".into(), "resize".into())])).is_ok());
        assert!(validate(&Headers(vec![])).is_err());
    }

    #[tokio::test]
    async fn resizes_are_read_as_they_complete() {
        let (mut client, server) = tokio::io::duplex(1024);
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let task = tokio::spawn(read_resizes(server, tx));
        client.write_all(br#"{"Width":80,"#).await.unwrap();
        client
            .write_all(br#""Height":24}{"Width":100,"Height":30}"#)
            .await
            .unwrap();
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 80,
                height: 24
            })
        );
        assert_eq!(
            rx.recv().await,
            Some(TerminalSize {
                width: 100,
                height: 30
            })
        );
        drop(client);
        task.await.unwrap();
        assert_eq!(rx.recv().await, None);
    }
}
