//! Port-forward to a CRI pod, as containerd's CRI plugin does it: a TCP connection to
//! `localhost:<port>` made inside the pod sandbox's network namespace, so it reaches what
//! listens on the pod's loopback as well as on its address.
//!
//! The namespace is found from the sandbox's verbose status: the network namespace path of
//! its OCI spec, else `/proc/<sandbox pid>/ns/net`. Joining a namespace (`setns`) changes the
//! calling thread, so the connect happens on a thread of its own that ends right after; the
//! socket stays in the pod's namespace and is handed to tokio.

// `setns(2)` has no safe wrapper in the dependencies.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::api as cri;
use serde_json::Value;

use super::client::CriClient;
use super::sandbox::POD_UID_LABEL;
use crate::process::portforward::go_errno;
use crate::runtime::{Duplex, RuntimeError};

/// How long the connect inside the namespace may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The network namespace of a sandbox from its verbose status `info` (containerd's `info`
/// key: `{"pid": .., "runtimeSpec": {"linux": {"namespaces": [{"type": "network", "path": ..}]}}}`).
pub fn netns_from_info(info: &HashMap<String, String>) -> Option<String> {
    let v: Value = serde_json::from_str(info.get("info")?).ok()?;
    let from_spec = v
        .pointer("/runtimeSpec/linux/namespaces")
        .and_then(Value::as_array)
        .and_then(|ns| {
            ns.iter()
                .find(|n| n.get("type").and_then(Value::as_str) == Some("network"))
        })
        .and_then(|n| n.get("path"))
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(String::from);
    from_spec.or_else(|| {
        v.get("pid")
            .and_then(Value::as_u64)
            .filter(|pid| *pid > 0)
            .map(|pid| format!("/proc/{pid}/ns/net"))
    })
}

/// The id and network namespace of the pod `uid`'s ready sandbox.
async fn sandbox_netns(client: &CriClient, uid: &str) -> Result<(String, String), RuntimeError> {
    let filter = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    let sandboxes = client
        .list_pod_sandbox(&filter)
        .await
        .map_err(|e| RuntimeError::Internal(format!("listing the pod's sandboxes: {e}")))?;
    let ready = sandboxes
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .max_by_key(|s| s.created_at)
        .ok_or_else(|| RuntimeError::NotFound("the pod's ready sandbox".into()))?;
    let status = client
        .pod_sandbox_status(&ready.id, true)
        .await
        .map_err(|e| RuntimeError::Internal(format!("reading the sandbox status: {e}")))?;
    let netns = netns_from_info(&status.info).ok_or_else(|| {
        RuntimeError::Internal(format!(
            "failed to find network namespace for sandbox {:?}",
            ready.id
        ))
    })?;
    Ok((ready.id.clone(), netns))
}

/// Connects to `localhost:port` in the network namespace at `netns`, containerd's way: IPv4
/// first, then IPv6, the error naming both.
fn connect_in(netns: &str, sandbox: &str, port: u16) -> Result<TcpStream, String> {
    let file = File::open(netns).map_err(|e| {
        format!(
            "failed to open network namespace {netns:?}: {}",
            go_errno(&e)
        )
    })?;
    // SAFETY: setns on a namespace file we hold open; it changes only this thread, which
    // is dedicated to this connect and ends right after it.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "failed to execute portforward in network namespace {netns:?}: {}",
            go_errno(&e)
        ));
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(s) => Ok(s),
        Err(e4) => TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|e6| {
            format!(
                "failed to execute portforward in network namespace {netns:?}: failed to connect to localhost:{port} inside namespace {sandbox:?}, IPv4: dial tcp4 {v4}: connect: {} IPv6 dial tcp6 {v6}: connect: {} ",
                go_errno(&e4),
                go_errno(&e6)
            )
        }),
    }
}

/// A connection to `port` on the pod `uid`'s loopback, inside its sandbox.
pub async fn connect(
    client: &CriClient,
    uid: &str,
    port: u16,
) -> Result<Box<dyn Duplex>, RuntimeError> {
    let (sandbox, netns) = sandbox_netns(client, uid).await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("portforward-netns".into())
        .spawn(move || {
            let _ = tx.send(connect_in(&netns, &sandbox, port));
        })
        .map_err(|e| RuntimeError::Internal(format!("starting the connect thread: {e}")))?;
    let stream = rx
        .await
        .map_err(|_| RuntimeError::Internal("the connect thread ended without a result".into()))?
        .map_err(RuntimeError::Internal)?;
    stream
        .set_nonblocking(true)
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let stream = tokio::net::TcpStream::from_std(stream)
        .map_err(|e| RuntimeError::Internal(e.to_string()))?;
    Ok(Box::new(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_comes_from_the_spec_else_the_pid() {
        let info = |json: &str| HashMap::from([("info".to_string(), json.to_string())]);
        assert_eq!(
            netns_from_info(&info(
                r#"{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}"#
            ))
            .as_deref(),
            Some("/var/run/netns/cni-1")
        );
        assert_eq!(
            netns_from_info(&info(
                r#"{"pid":42,"runtimeSpec":{"linux":{"namespaces":[{"type":"network"}]}}}"#
            ))
            .as_deref(),
            Some("/proc/42/ns/net")
        );
        assert_eq!(netns_from_info(&info(r#"{"pid":0}"#)), None);
        assert_eq!(netns_from_info(&HashMap::new()), None);
    }

    #[test]
    fn connecting_in_our_own_namespace_reaches_loopback() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // A thread of its own, as `connect` uses: setns into our own namespace is harmless.
        let s = std::thread::spawn(move || connect_in("/proc/self/ns/net", "sb", port))
            .join()
            .unwrap();
        assert!(s.is_ok(), "{s:?}");
        drop(listener);
        let e = std::thread::spawn(move || connect_in("/proc/self/ns/net", "sb", port))
            .join()
            .unwrap()
            .unwrap_err();
        assert!(
            e.contains(&format!(
                "failed to connect to localhost:{port} inside namespace \"sb\", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused"
            )),
            "{e}"
        );
    }
}
