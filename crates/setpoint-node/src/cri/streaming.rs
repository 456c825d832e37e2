//! `exec` and `attach` for CRI containers: the CRI `Exec` and `Attach` calls return a URL
//! on the runtime's streaming server, and the agent connects to it as a client and bridges
//! its channels to the session's [`StreamIo`].
//!
//! containerd's streaming server (the kubelet's, vendored) speaks SPDY and the WebSocket
//! channel protocols up to `v4.channel.k8s.io` (containerd 1.6; `v5`, with its close
//! channel, only in newer ones). The agent offers `v5.channel.k8s.io` first and
//! `v4.channel.k8s.io` second. Over v4 there is no way to end the command's stdin while still
//! reading its output, so once the client's stdin ends the agent waits for the command to
//! finish on its own; a command that reads stdin to its end (`cat`) needs a runtime that
//! speaks v5.
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
use crate::streaming::websocket::{self, channel, Protocol};

/// How much of the client's stdin goes into one frame.
const CHUNK: usize = 32 * 1024;

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
    let status = bridge(&url, io).await?;
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
    let status = bridge(&url, io).await?;
    exit_code_of(&status)
        .map(|_| ())
        .map_err(RuntimeError::Internal)
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
    if status.is_empty() {
        return Ok(serde_json::json!({"status": "Success"}));
    }
    serde_json::from_slice(&status).map_err(|e| {
        RuntimeError::Internal(format!(
            "the runtime's status is not JSON ({e}): {}",
            String::from_utf8_lossy(&status)
        ))
    })
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
