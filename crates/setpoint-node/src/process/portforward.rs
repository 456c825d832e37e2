//! Port-forward to a process pod. A process pod has no network namespace of its own: it
//! listens on the host, on its loopback address (`127.B.x.y`, [`super::ipam`]) or on every
//! address, and either way a connection to its address reaches it; so forwarding is a TCP
//! connection to `<pod IP>:<port>`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::runtime::{Duplex, RuntimeError};

/// How long a connection to the pod may take; a loopback connect either succeeds or is
/// refused at once, so this only bounds a pathological host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `port` at the pod's address `ip`, with the error text the way Go words a
/// failed dial (what kubectl users see from the kubelet).
pub async fn connect(ip: &str, port: u16) -> Result<Box<dyn Duplex>, RuntimeError> {
    let addr: IpAddr = ip
        .parse()
        .map_err(|_| RuntimeError::Internal(format!("pod address {ip:?} is not an IP")))?;
    let target = SocketAddr::new(addr, port);
    let family = if addr.is_ipv4() { "tcp4" } else { "tcp6" };
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(Box::new(stream))
        }
        Ok(Err(e)) => Err(RuntimeError::Internal(format!(
            "dial {family} {target}: connect: {}",
            go_errno(&e)
        ))),
        Err(_) => Err(RuntimeError::Internal(format!(
            "dial {family} {target}: i/o timeout"
        ))),
    }
}

/// An OS error as Go prints a `syscall.Errno`: the C library's message, first letter lower
/// case, without Rust's "(os error N)".
pub fn go_errno(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connects_to_the_pod_address_and_words_a_refusal_as_go() {
        let listener = tokio::net::TcpListener::bind("127.203.9.7:0")
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"hello").await.unwrap();
        });
        let mut c = connect("127.203.9.7", port).await.unwrap();
        let mut got = Vec::new();
        c.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello");
        server.await.unwrap();
        // Nothing listens on the same port at another pod's address.
        let e = connect("127.203.9.8", port)
            .await
            .err()
            .unwrap()
            .to_string();
        assert_eq!(
            e,
            format!("dial tcp4 127.203.9.8:{port}: connect: connection refused")
        );
        assert!(connect("not-an-ip", 80).await.is_err());
    }
}
