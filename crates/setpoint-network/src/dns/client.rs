//! A small DNS client: one question to one server over UDP or TCP. What tests and the
//! node's readiness checks query the server with.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// Errors of a query.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The name is not a valid DNS name.
    #[error("invalid name {0:?}: {1}")]
    Name(String, String),
    /// Sending or receiving failed.
    #[error("dns query to {server}: {source}")]
    Io {
        /// The server asked.
        server: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// No reply in time.
    #[error("dns query to {0}: no reply within {1:?}")]
    Timeout(SocketAddr, Duration),
    /// The reply did not decode.
    #[error("dns reply from {0}: {1}")]
    Decode(SocketAddr, String),
}

/// Asks `server` for `name`/`qtype` over UDP (`tcp` false) or TCP, waiting at most `timeout`.
pub async fn query(
    server: SocketAddr,
    name: &str,
    qtype: RecordType,
    tcp: bool,
    timeout: Duration,
) -> Result<Message, ClientError> {
    let name = Name::from_ascii(name).map_err(|e| ClientError::Name(name.into(), e.to_string()))?;
    let id: u16 = (std::process::id() as u16) ^ u16::from(qtype);
    let mut message = Message::new();
    message
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name, qtype));
    let bytes = message
        .to_vec()
        .map_err(|e| ClientError::Decode(server, e.to_string()))?;
    let io = |source| ClientError::Io { server, source };
    let exchange = async {
        if tcp {
            let mut stream = TcpStream::connect(server).await.map_err(io)?;
            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            stream.write_all(&framed).await.map_err(io)?;
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await.map_err(io)?;
            let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
            stream.read_exact(&mut reply).await.map_err(io)?;
            Ok(reply)
        } else {
            let local: SocketAddr = if server.is_ipv4() {
                "0.0.0.0:0".parse().expect("literal")
            } else {
                "[::]:0".parse().expect("literal")
            };
            let socket = UdpSocket::bind(local).await.map_err(io)?;
            socket.connect(server).await.map_err(io)?;
            socket.send(&bytes).await.map_err(io)?;
            let mut buf = vec![0u8; 65535];
            loop {
                let len = socket.recv(&mut buf).await.map_err(io)?;
                if len >= 2 && buf[..2] == id.to_be_bytes() {
                    buf.truncate(len);
                    return Ok(buf);
                }
            }
        }
    };
    let reply = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ClientError::Timeout(server, timeout))??;
    Message::from_vec(&reply).map_err(|e| ClientError::Decode(server, e.to_string()))
}
