//! `exec` and `attach` for CRI containers: the CRI `Exec` and `Attach` calls return a URL
//! on the runtime's streaming server, and the agent connects to it as a client and bridges
//! its channels to the session's [`StreamIo`].
//!
//! containerd's streaming server (the kubelet's, vendored) speaks SPDY/3.1 and the WebSocket
//! channel protocols up to `v4.channel.k8s.io` (containerd 1.6; `v5`, with its close
//! channel, only in newer ones). Over WebSocket v4 there is no way to end the command's stdin
//! while still reading its output, so a session with stdin goes over SPDY, as client-go's
//! executor does it: one stream per channel, and the stdin stream's FLAG_FIN is the command's
//! end of input (`echo data | kubectl exec -i p -- cat`, the `tar xf -` of `kubectl cp`).
//! A session without stdin stays on WebSocket, offering `v5.channel.k8s.io` then
//! `v4.channel.k8s.io`: it needs no end of input, and keeps the protocol newer runtimes
//! move to.
//!
//! The exit code comes from the server's `Status` on the error channel: `Success` is 0, a
//! `NonZeroExitCode` failure carries the code in its `ExitCode` cause.

use std::collections::HashMap;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use super::api as cri;
use super::client::CriClient;
use super::sandbox::{CONTAINER_NAME_LABEL, POD_UID_LABEL};
use crate::runtime::{ExecRequest, RuntimeError, StreamIo};
use crate::streaming::spdy;
use crate::streaming::websocket::{self, channel, Protocol};

/// How much of the client's stdin goes into one frame.
const CHUNK: usize = 32 * 1024;
/// The stream protocol spoken over SPDY: client-go's newest, with the `Status` on the error
/// stream and the resize stream.
const SPDY_PROTOCOL: &str = "v4.channel.k8s.io";

/// The id of the container's running instance.
async fn running_container(
    client: &CriClient,
    uid: &str,
    container: &str,
) -> Result<String, RuntimeError> {
    let filter = HashMap::from([
        (POD_UID_LABEL.to_string(), uid.to_string()),
        (CONTAINER_NAME_LABEL.to_string(), container.to_string()),
    ]);
    let containers = client
        .list_containers("", &filter)
        .await
        .map_err(|e| RuntimeError::Internal(format!("listing the pod's containers: {e}")))?;
    containers
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .max_by_key(|c| c.created_at)
        .map(|c| c.id)
        .ok_or_else(|| RuntimeError::BadRequest(format!("container not found ({container:?})")))
}

/// The exit code a remote command `Status` reports (0 for `Success`), or the error it
/// reports instead.
pub fn exit_code_of(status: &Value) -> Result<i32, String> {
    match status.get("status").and_then(Value::as_str) {
        Some("Success") => Ok(0),
        _ if status.get("reason").and_then(Value::as_str) == Some("NonZeroExitCode") => status
            .pointer("/details/causes")
            .and_then(Value::as_array)
            .and_then(|causes| {
                causes
                    .iter()
                    .find(|c| c.get("reason").and_then(Value::as_str) == Some("ExitCode"))
            })
            .and_then(|c| c.get("message").and_then(Value::as_str))
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| format!("a NonZeroExitCode status without its code: {status}")),
        _ => Err(status
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("the runtime reported a failure")
            .to_string()),
    }
}

/// Runs `request` in the pod's container through the runtime's streaming server.
pub async fn exec(
    client: &CriClient,
    uid: &str,
    request: ExecRequest,
    io: StreamIo,
) -> Result<i32, RuntimeError> {
    let container_id = running_container(client, uid, &request.container).await?;
    let url = client
        .exec(cri::ExecRequest {
            container_id,
            cmd: request.command.clone(),
            tty: request.tty,
            stdin: io.stdin.is_some(),
            stdout: io.stdout.is_some(),
            stderr: io.stderr.is_some() && !request.tty,
            ..Default::default()
        })
        .await
        .map_err(|e| RuntimeError::Internal(format!("preparing the exec: {e}")))?;
    let status = connect(&url, request.tty, io).await?;
    exit_code_of(&status).map_err(RuntimeError::Internal)
}

/// Attaches `io` to the container's main process through the runtime's streaming server.
pub async fn attach(
    client: &CriClient,
    uid: &str,
    container: &str,
    tty: bool,
    io: StreamIo,
) -> Result<(), RuntimeError> {
    let container_id = running_container(client, uid, container).await?;
    let url = client
        .attach(cri::AttachRequest {
            container_id,
            stdin: io.stdin.is_some(),
            tty,
            stdout: io.stdout.is_some(),
            stderr: io.stderr.is_some() && !tty,
            ..Default::default()
        })
        .await
        .map_err(|e| RuntimeError::Internal(format!("preparing the attach: {e}")))?;
    let status = connect(&url, tty, io).await?;
    exit_code_of(&status)
        .map(|_| ())
        .map_err(RuntimeError::Internal)
}

/// Moves `io` over the streaming URL: over SPDY when there is stdin (its end must reach the
/// command), else over WebSocket. Returns the server's final `Status`.
async fn connect(url: &str, tty: bool, io: StreamIo) -> Result<Value, RuntimeError> {
    if io.stdin.is_some() {
        bridge_spdy(url, tty, io).await
    } else {
        bridge(url, io).await
    }
}

/// The server's `Status` from what its error channel carried (a `Success` when nothing).
fn parse_status(status: &[u8]) -> Result<Value, RuntimeError> {
    if status.is_empty() {
        return Ok(serde_json::json!({"status": "Success"}));
    }
    serde_json::from_slice(status).map_err(|e| {
        RuntimeError::Internal(format!(
            "the runtime's status is not JSON ({e}): {}",
            String::from_utf8_lossy(status)
        ))
    })
}

/// A stream of client-go's remote command protocol, named by its `streamType` header.
async fn open_stream(
    conn: &mut spdy::Connection,
    kind: &str,
) -> Result<tokio::io::DuplexStream, RuntimeError> {
    conn.open(vec![("streamtype".into(), kind.into())])
        .await
        .map(|s| s.io)
        .ok_or_else(|| {
            RuntimeError::Internal(format!(
                "the runtime's streaming server closed before the {kind} stream opened"
            ))
        })
}

/// client-go's SPDY executor (`v4.channel.k8s.io`): opens the error stream first, then one
/// stream per channel the session has, copies stdin in (closing its stream at the end, the
/// command's EOF), stdout and stderr out and resizes in as JSON, and returns the `Status`
/// the server writes on the error stream once the command is done.
async fn bridge_spdy(url: &str, tty: bool, io: StreamIo) -> Result<Value, RuntimeError> {
    let mut conn = spdy::dial(url, SPDY_PROTOCOL).await.map_err(|e| {
        RuntimeError::Internal(format!("connecting to the runtime's streaming server: {e}"))
    })?;
    let StreamIo {
        stdin,
        stdout,
        stderr,
        resize,
    } = io;
    let mut error = open_stream(&mut conn, "error").await?;
    let mut tasks = Vec::new();
    if let Some(mut from) = stdin {
        let mut to = open_stream(&mut conn, "stdin").await?;
        tasks.push(tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from, &mut to).await;
            // The stream's FLAG_FIN: the command's end of input.
            let _ = to.shutdown().await;
        }));
    }
    let mut outputs = tokio::task::JoinSet::new();
    for (kind, to) in [("stdout", stdout), ("stderr", stderr.filter(|_| !tty))] {
        let Some(mut to) = to else { continue };
        let mut from = open_stream(&mut conn, kind).await?;
        // Whether the client went away (its writer failed) rather than the server ending.
        outputs.spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
                            return true;
                        }
                    }
                }
            }
        });
    }
    if tty {
        let mut to = open_stream(&mut conn, "resize").await?;
        if let Some(mut sizes) = resize {
            tasks.push(tokio::spawn(async move {
                while let Some(size) = sizes.recv().await {
                    let json = serde_json::json!({"Width": size.width, "Height": size.height});
                    if to.write_all(json.to_string().as_bytes()).await.is_err() {
                        break;
                    }
                }
            }));
        }
    }
    // The server ends the output streams when the command is done (its status is on the
    // error stream by then); a client gone away ends the session without waiting for that,
    // as an attach to a container that runs on would never end.
    let mut client_gone = false;
    while let Some(gone) = outputs.join_next().await {
        if gone.unwrap_or(true) {
            client_gone = true;
            outputs.abort_all();
            break;
        }
    }
    let mut status = Vec::new();
    if !client_gone {
        let _ = (&mut error)
            .take(websocket::MAX_MESSAGE as u64)
            .read_to_end(&mut status)
            .await;
    }
    for t in tasks {
        t.abort();
    }
    drop(conn);
    parse_status(&status)
}

/// Connects to a streaming URL and moves `io` over it until the server closes; returns the
/// server's final `Status` (a `Success` when it closed without one).
async fn bridge(url: &str, io: StreamIo) -> Result<Value, RuntimeError> {
    let failed = |e: &dyn std::fmt::Display| {
        RuntimeError::Internal(format!("connecting to the runtime's streaming server: {e}"))
    };
    let ws_url = url
        .strip_prefix("http://")
        .map(|rest| format!("ws://{rest}"))
        .or_else(|| url.strip_prefix("https://").map(|r| format!("wss://{r}")))
        .ok_or_else(|| failed(&format!("unexpected URL {url:?}")))?;
    if ws_url.starts_with("wss://") {
        return Err(failed(&"TLS streaming servers are not supported"));
    }
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| failed(&e))?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("v5.channel.k8s.io, v4.channel.k8s.io"),
    );
    let uri = request.uri().clone();
    let host = uri.host().unwrap_or("127.0.0.1").to_string();
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| failed(&e))?;
    let _ = tcp.set_nodelay(true);
    let (ws, response) =
        tokio_tungstenite::client_async_with_config(request, tcp, Some(websocket::config()))
            .await
            .map_err(|e| failed(&e))?;
    let protocol = match response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .and_then(|v| v.to_str().ok())
    {
        Some("v5.channel.k8s.io") => Protocol::V5,
        Some("v4.channel.k8s.io") => Protocol::V4,
        other => return Err(failed(&format!("the server chose protocol {other:?}"))),
    };
    let (mut sink, mut incoming) = ws.split();
    let StreamIo {
        stdin,
        mut stdout,
        mut stderr,
        resize,
    } = io;
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Message>(16);
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
    });
    let feeder = stdin.map(|from| tokio::spawn(feed(protocol, from, out_tx.clone())));
    let resizer = resize.map(|mut sizes| {
        let tx = out_tx.clone();
        tokio::spawn(async move {
            while let Some(size) = sizes.recv().await {
                let json = serde_json::json!({"Width": size.width, "Height": size.height});
                if tx
                    .send(protocol.encode(channel::RESIZE, json.to_string().as_bytes()))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        })
    });
    drop(out_tx);
    let mut status = Vec::new();
    while let Some(message) = incoming.next().await {
        let Ok(message) = message else { break };
        if message.is_close() {
            break;
        }
        let Some((ch, data)) = protocol.decode(&message) else {
            continue;
        };
        let target = match ch {
            channel::STDOUT => stdout.as_mut(),
            channel::STDERR => stderr.as_mut(),
            channel::ERROR => {
                if status.len() + data.len() <= websocket::MAX_MESSAGE {
                    status.extend_from_slice(&data);
                }
                continue;
            }
            _ => continue,
        };
        if let Some(w) = target {
            if w.write_all(&data).await.is_err() || w.flush().await.is_err() {
                break;
            }
        }
    }
    for task in [feeder, resizer].into_iter().flatten() {
        task.abort();
    }
    writer.abort();
    parse_status(&status)
}

/// Sends the client's stdin as frames; at its end closes the channel where the protocol can.
async fn feed(
    protocol: Protocol,
    mut from: impl AsyncRead + Unpin,
    to: tokio::sync::mpsc::Sender<Message>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to
                    .send(protocol.encode(channel::STDIN, &buf[..n]))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
    if protocol.has_close() {
        let _ = to
            .send(Message::Binary(bytes::Bytes::from_static(&[
                channel::CLOSE,
                channel::STDIN,
            ])))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A streaming server on a local port speaking the kubelet's side of SPDY
    /// `v4.channel.k8s.io` for a session with stdin and stdout: once both streams and the
    /// error stream are open it echoes stdin onto stdout; at stdin's end it closes stdout and
    /// reports exit code 7. With `endless`, it writes ticks on stdout for as long as they are
    /// taken and never ends the session (an attach to a container that runs on).
    async fn kubelet(endless: bool) -> std::net::SocketAddr {
        use axum::routing::post;
        let exec = move |request: axum::extract::Request| async move {
            let protocol = match spdy::negotiate(request.headers(), &[SPDY_PROTOCOL]) {
                Ok(p) => p,
                Err(refused) => return *refused,
            };
            spdy::upgrade(request, protocol, move |io| async move {
                let mut conn = spdy::serve(io);
                let mut streams = HashMap::new();
                while streams.len() < 3 {
                    let Some(s) = conn.accept().await else { return };
                    let kind = s.headers.get("streamtype").unwrap_or("").to_string();
                    streams.insert(kind, s);
                }
                let (Some(mut stdin), Some(mut stdout), Some(mut error)) = (
                    streams.remove("stdin"),
                    streams.remove("stdout"),
                    streams.remove("error"),
                ) else {
                    return;
                };
                if endless {
                    while stdout.io.write_all(b"tick\n").await.is_ok() {}
                    std::future::pending::<()>().await;
                }
                let _ = tokio::io::copy(&mut stdin.io, &mut stdout.io).await;
                let _ = stdout.io.shutdown().await;
                let status = json!({"status": "Failure", "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": "7"}]}});
                let _ = error.io.write_all(status.to_string().as_bytes()).await;
                let _ = error.io.shutdown().await;
                conn.close(std::time::Duration::from_secs(5)).await;
            })
        };
        let app = axum::Router::new().route("/exec/{token}", post(exec));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(app);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .with_upgrades()
                .await;
        });
        addr
    }

    #[tokio::test]
    async fn stdin_ends_for_the_command_over_spdy_and_its_status_comes_back() {
        let addr = kubelet(false).await;
        let (mut typed, stdin) = tokio::io::duplex(1024);
        let (stdout, mut shown) = tokio::io::duplex(1024);
        let io = StreamIo {
            stdin: Some(Box::new(stdin)),
            stdout: Some(Box::new(stdout)),
            ..Default::default()
        };
        let session =
            tokio::spawn(
                async move { connect(&format!("http://{addr}/exec/abc"), false, io).await },
            );
        typed.write_all(b"data\n").await.unwrap();
        // The client's stdin ends: only its FIN lets the server's copy, and the command, end.
        drop(typed);
        let mut out = Vec::new();
        shown.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"data\n");
        let status = session.await.unwrap().unwrap();
        assert_eq!(exit_code_of(&status), Ok(7));
    }

    #[tokio::test]
    async fn a_client_gone_away_ends_a_session_the_server_does_not_end() {
        let addr = kubelet(true).await;
        let (_typed, stdin) = tokio::io::duplex(1024);
        let (stdout, mut shown) = tokio::io::duplex(1024);
        let io = StreamIo {
            stdin: Some(Box::new(stdin)),
            stdout: Some(Box::new(stdout)),
            ..Default::default()
        };
        let session =
            tokio::spawn(
                async move { connect(&format!("http://{addr}/exec/abc"), false, io).await },
            );
        let mut line = [0u8; 5];
        shown.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"tick\n");
        // The client leaves: the next tick cannot be shown, and the session ends although the
        // server never ends it.
        drop(shown);
        let status = tokio::time::timeout(std::time::Duration::from_secs(30), session)
            .await
            .expect("the session ends once its client is gone")
            .unwrap()
            .unwrap();
        assert_eq!(exit_code_of(&status), Ok(0));
    }

    #[test]
    fn statuses_give_exit_codes() {
        assert_eq!(exit_code_of(&json!({"status": "Success"})), Ok(0));
        let s = json!({"status": "Failure", "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}});
        assert_eq!(exit_code_of(&s), Ok(3));
        let s = json!({"status": "Failure", "reason": "InternalError", "message": "boom"});
        assert_eq!(exit_code_of(&s), Err("boom".into()));
    }
}
