//! The DNS server's I/O: UDP and TCP listeners on one address, answers from
//! [`Directory::resolve`], and every other question forwarded to the host's resolvers.
//!
//! Bounds, so the server is no amplifier and no memory sink: a UDP answer is never larger than
//! the client's advertised size (512 bytes without EDNS, at most [`MAX_UDP_PAYLOAD`]; larger
//! answers are truncated with TC set, so the client asks again over TCP); packets that are
//! responses are dropped, never answered; forwarded questions are at most
//! [`MAX_CONCURRENT_FORWARDS`] at a time (more are REFUSED, as CoreDNS's `max_concurrent`),
//! each with [`FORWARD_TIMEOUT`] per upstream; TCP connections are at most
//! [`MAX_TCP_CONNECTIONS`], idle ones closed after [`TCP_IDLE_TIMEOUT`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tracing::{debug, info_span, warn, Instrument};

use super::records::{Directory, Resolution, Zone};

/// The largest UDP answer sent, whatever a client advertises (the DNS flag day's 1232 bytes,
/// which fits any path's MTU without fragments).
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// Forwarded questions in flight at once; more are REFUSED.
pub const MAX_CONCURRENT_FORWARDS: usize = 1000;
/// How long one upstream has to answer a forwarded question (CoreDNS `forward`'s read timeout).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// TCP connections served at once; more wait in the listen backlog.
pub const MAX_TCP_CONNECTIONS: usize = 256;
/// A TCP connection with no complete question for this long is closed.
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest DNS message read or sent over TCP (its length prefix is 16 bits).
const MAX_TCP_MESSAGE: usize = 65535;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound (in use, or not on this host).
    #[error("cannot listen for DNS on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
}

/// The host resolvers the server forwards to.
#[derive(Clone, Debug, Default)]
pub struct Upstreams {
    servers: Vec<SocketAddr>,
}

impl Upstreams {
    /// These servers, in order of preference, less any of `own` (the server's addresses: a
    /// host whose resolv.conf names the cluster DNS must not make it ask itself).
    pub fn new(servers: impl IntoIterator<Item = IpAddr>, own: &[IpAddr]) -> Upstreams {
        let mut out: Vec<SocketAddr> = Vec::new();
        for ip in servers {
            let addr = SocketAddr::new(ip, 53);
            if !own.contains(&ip) && !out.contains(&addr) {
                out.push(addr);
            }
        }
        Upstreams { servers: out }
    }

    /// Upstreams at explicit socket addresses (tests, or a resolver on another port).
    pub fn from_addrs(servers: Vec<SocketAddr>) -> Upstreams {
        Upstreams { servers }
    }

    /// The nameservers of a `resolv.conf`, less `own`.
    pub fn from_resolv_conf(conf: &super::resolvconf::ResolvConf, own: &[IpAddr]) -> Upstreams {
        // A zone index (`fe80::1%eth0`) is dropped: a link-local upstream is not supported.
        let ips = conf
            .nameservers
            .iter()
            .filter_map(|s| s.split('%').next().and_then(|s| s.parse::<IpAddr>().ok()));
        Upstreams::new(ips, own)
    }

    /// The servers, in order.
    pub fn servers(&self) -> &[SocketAddr] {
        &self.servers
    }
}

/// How transport a question came over, which the forwarded one uses too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

struct Shared {
    directory: Directory,
    zone: Zone,
    upstreams: Upstreams,
    forwards: Semaphore,
}

/// A running DNS server; stops (both listeners) when dropped.
pub struct DnsServer {
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl DnsServer {
    /// Binds UDP and TCP on `addr` (port 0: the same free port for both) and starts serving.
    pub async fn start(
        addr: SocketAddr,
        directory: Directory,
        zone: Zone,
        upstreams: Upstreams,
    ) -> Result<DnsServer, ServerError> {
        let (udp, tcp) = bind_pair(addr)?;
        let addr = udp
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        let shared = Arc::new(Shared {
            directory,
            zone,
            upstreams,
            forwards: Semaphore::new(MAX_CONCURRENT_FORWARDS),
        });
        let span = info_span!("dns", %addr);
        let udp_task =
            tokio::spawn(serve_udp(Arc::new(udp), shared.clone()).instrument(span.clone()));
        let tcp_task = tokio::spawn(serve_tcp(tcp, shared).instrument(span));
        Ok(DnsServer {
            addr,
            tasks: vec![udp_task, tcp_task],
        })
    }

    /// The address it serves on (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// UDP and TCP sockets on one port. Port 0 picks the UDP port first and retries a few times
/// should TCP's be taken.
fn bind_pair(addr: SocketAddr) -> Result<(UdpSocket, TcpListener), ServerError> {
    let mut last = None;
    for _ in 0..16 {
        let udp = bind_udp(addr).map_err(|source| ServerError::Bind { addr, source })?;
        let bound = udp
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        match bind_tcp(bound) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(source) if addr.port() == 0 => last = Some(source),
            Err(source) => return Err(ServerError::Bind { addr, source }),
        }
    }
    Err(ServerError::Bind {
        addr,
        source: last.unwrap_or_else(|| std::io::Error::other("no free port")),
    })
}

/// A socket of `kind` bound to `addr` with `IP_FREEBIND`: a node's DNS address may be its pod
/// bridge's gateway, which exists only once the first pod's network is set up, and the
/// server must be listening by then.
fn bound_socket(addr: SocketAddr, kind: socket2::Type) -> std::io::Result<socket2::Socket> {
    let domain = socket2::Domain::for_address(addr);
    let protocol = if kind == socket2::Type::DGRAM {
        socket2::Protocol::UDP
    } else {
        socket2::Protocol::TCP
    };
    let socket = socket2::Socket::new(domain, kind, Some(protocol))?;
    if addr.is_ipv4() {
        socket.set_freebind_v4(true)?;
    } else {
        socket.set_freebind_v6(true)?;
    }
    if kind == socket2::Type::STREAM {
        // A restarted server rebinds at once though connections of the last one linger.
        socket.set_reuse_address(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = bound_socket(addr, socket2::Type::DGRAM)?;
    UdpSocket::from_std(socket.into())
}

fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = bound_socket(addr, socket2::Type::STREAM)?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

async fn serve_udp(socket: Arc<UdpSocket>, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (len, peer) = match socket.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                // ICMP errors of earlier sends surface here on Linux; keep serving.
                debug!(error = %e, "udp receive");
                continue;
            }
        };
        let packet = buf[..len].to_vec();
        let socket = socket.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Some(reply) = handle(&shared, &packet, Transport::Udp).await {
                if let Err(e) = socket.send_to(&reply, peer).await {
                    debug!(error = %e, %peer, "udp send");
                }
            }
        });
    }
}

async fn serve_tcp(listener: TcpListener, shared: Arc<Shared>) {
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "tcp accept");
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, &shared).await {
                debug!(error = %e, %peer, "tcp connection");
            }
            drop(permit);
        });
    }
}

async fn serve_connection(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    loop {
        let Ok(message) = tokio::time::timeout(TCP_IDLE_TIMEOUT, read_framed(&mut stream)).await
        else {
            return Ok(());
        };
        let Some(message) = message? else {
            return Ok(());
        };
        if let Some(reply) = handle(shared, &message, Transport::Tcp).await {
            write_framed(&mut stream, &reply).await?;
        }
    }
}

/// One length-prefixed message; `None` at a clean end of stream.
async fn read_framed(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut message = vec![0u8; u16::from_be_bytes(len) as usize];
    stream.read_exact(&mut message).await?;
    Ok(Some(message))
}

async fn write_framed(stream: &mut TcpStream, message: &[u8]) -> std::io::Result<()> {
    let len =
        u16::try_from(message.len()).map_err(|_| std::io::Error::other("message too long"))?;
    let mut framed = Vec::with_capacity(message.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(message);
    stream.write_all(&framed).await
}

/// The reply to one packet, or `None` to send nothing (a response, or bytes too short to
/// carry an id to answer).
async fn handle(shared: &Shared, packet: &[u8], transport: Transport) -> Option<Vec<u8>> {
    let request = match Message::from_vec(packet) {
        Ok(m) => m,
        Err(_) => {
            // Undecodable: FORMERR to the id, if there is a query header to answer.
            if packet.len() < 12 || packet[2] & 0x80 != 0 {
                return None;
            }
            let id = u16::from_be_bytes([packet[0], packet[1]]);
            let reply = Message::error_msg(id, OpCode::Query, ResponseCode::FormErr);
            return reply.to_vec().ok();
        }
    };
    if request.message_type() != MessageType::Query {
        return None;
    }
    if request.op_code() != OpCode::Query {
        return finish(
            error_reply(&request, ResponseCode::NotImp),
            &request,
            transport,
        );
    }
    let [query] = request.queries() else {
        return finish(
            error_reply(&request, ResponseCode::FormErr),
            &request,
            transport,
        );
    };
    let span = info_span!("query", name = %query.name(), qtype = %query.query_type());
    async {
        let resolution = if query.query_class() == DNSClass::IN {
            shared
                .directory
                .resolve(&shared.zone, query.name(), query.query_type())
        } else {
            None
        };
        match resolution {
            Some(resolution) => {
                let reply = authoritative(shared, &request, query, resolution, transport).await;
                finish(reply, &request, transport)
            }
            None => forward_raw(shared, &request, packet, transport).await,
        }
    }
    .instrument(span)
    .await
}

fn error_reply(request: &Message, code: ResponseCode) -> Message {
    let mut reply = Message::error_msg(request.id(), request.op_code(), code);
    reply.add_queries(request.queries().iter().cloned());
    reply.set_recursion_desired(request.recursion_desired());
    reply
}

/// The zone's answer, with an ExternalName's target resolved upstream and appended.
async fn authoritative(
    shared: &Shared,
    request: &Message,
    query: &Query,
    resolution: Resolution,
    transport: Transport,
) -> Message {
    let mut reply = Message::new();
    reply
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(true)
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(resolution.code.unwrap_or(ResponseCode::NoError))
        .add_query(query.clone())
        .add_answers(resolution.answers)
        .add_additionals(resolution.additionals);
    if resolution.soa {
        reply.add_name_server(shared.zone.soa());
    }
    if let Some(target) = resolution.chase {
        let chased = if shared.zone.domain().zone_of(&target.to_lowercase()) {
            // A target inside the zone is answered from it (one step: no CNAME chains).
            shared
                .directory
                .resolve(&shared.zone, &target, query.query_type())
                .map(|r| r.answers)
                .unwrap_or_default()
        } else {
            forward_query(shared, &target, query.query_type(), transport).await
        };
        reply.add_answers(chased);
    }
    reply
}

/// Asks the upstreams `name`/`qtype` and returns their answer section (empty on failure: the
/// CNAME alone is still a correct answer the client can follow).
async fn forward_query(
    shared: &Shared,
    name: &hickory_proto::rr::Name,
    qtype: RecordType,
    transport: Transport,
) -> Vec<Record> {
    let mut message = Message::new();
    message
        .set_id(rand_id())
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), qtype));
    let Ok(bytes) = message.to_vec() else {
        return Vec::new();
    };
    let Ok(_permit) = shared.forwards.try_acquire() else {
        return Vec::new();
    };
    match exchange(&shared.upstreams, &bytes, message.id(), transport).await {
        Some(reply) => Message::from_vec(&reply)
            .map(|m| m.answers().to_vec())
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

/// Forwards the client's own packet and relays the upstream's reply as it came (with the
/// client's id), or SERVFAIL when no upstream answered in time; REFUSED when too many are in
/// flight.
async fn forward_raw(
    shared: &Shared,
    request: &Message,
    packet: &[u8],
    transport: Transport,
) -> Option<Vec<u8>> {
    let Ok(_permit) = shared.forwards.try_acquire() else {
        return finish(
            error_reply(request, ResponseCode::Refused),
            request,
            transport,
        );
    };
    // A fresh id upstream, so a reply cannot be matched by guessing the client's.
    let id = rand_id();
    let mut outgoing = packet.to_vec();
    outgoing[..2].copy_from_slice(&id.to_be_bytes());
    match exchange(&shared.upstreams, &outgoing, id, transport).await {
        Some(mut reply) => {
            reply[..2].copy_from_slice(&request.id().to_be_bytes());
            if transport == Transport::Udp && reply.len() > udp_limit(request) {
                // The upstream honoured a larger size than we pass on: the client retries
                // over TCP.
                let truncated = Message::from_vec(&reply).ok()?.truncate();
                return truncated.to_vec().ok();
            }
            Some(reply)
        }
        None => finish(
            error_reply(request, ResponseCode::ServFail),
            request,
            transport,
        ),
    }
}

/// Tries each upstream in turn with [`FORWARD_TIMEOUT`]; the first reply carrying `id`.
async fn exchange(
    upstreams: &Upstreams,
    packet: &[u8],
    id: u16,
    transport: Transport,
) -> Option<Vec<u8>> {
    for server in upstreams.servers() {
        let attempt = async {
            match transport {
                Transport::Udp => exchange_udp(*server, packet, id).await,
                Transport::Tcp => exchange_tcp(*server, packet).await,
            }
        };
        match tokio::time::timeout(FORWARD_TIMEOUT, attempt).await {
            Ok(Ok(reply)) if reply.len() >= 12 && reply[..2] == id.to_be_bytes() => {
                return Some(reply)
            }
            Ok(Ok(_)) => debug!(%server, "upstream reply with another id"),
            Ok(Err(e)) => debug!(%server, error = %e, "upstream failed"),
            Err(_) => debug!(%server, "upstream timed out"),
        }
    }
    None
}

async fn exchange_udp(server: SocketAddr, packet: &[u8], id: u16) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    socket.send(packet).await?;
    let mut buf = vec![0u8; 4096];
    loop {
        let len = socket.recv(&mut buf).await?;
        // Stray datagrams with another id are ignored; the timeout bounds the wait.
        if len >= 2 && buf[..2] == id.to_be_bytes() {
            buf.truncate(len);
            return Ok(buf);
        }
    }
}

async fn exchange_tcp(server: SocketAddr, packet: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server).await?;
    write_framed(&mut stream, packet).await?;
    match read_framed(&mut stream).await? {
        Some(reply) if reply.len() <= MAX_TCP_MESSAGE => Ok(reply),
        _ => Err(std::io::Error::other("upstream closed without a reply")),
    }
}

/// The size a UDP reply to `request` may have.
fn udp_limit(request: &Message) -> usize {
    match request.extensions() {
        Some(edns) => edns.max_payload().clamp(512, MAX_UDP_PAYLOAD) as usize,
        None => 512,
    }
}

/// Encodes a reply: EDNS echoed when the client used it, truncated with TC over UDP when it
/// does not fit the client's size.
fn finish(mut reply: Message, request: &Message, transport: Transport) -> Option<Vec<u8>> {
    if request.extensions().is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP_PAYLOAD);
        reply.set_edns(edns);
    }
    let bytes = reply.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > udp_limit(request) {
        let mut truncated = reply.truncate();
        if request.extensions().is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(MAX_UDP_PAYLOAD);
            truncated.set_edns(edns);
        }
        return truncated.to_vec().ok();
    }
    Some(bytes)
}

/// A random message id for a forwarded question.
fn rand_id() -> u16 {
    // The standard library's hasher is seeded randomly per process and per instance.
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default(),
    );
    hasher.finish() as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_skip_our_own_address_and_duplicates() {
        let conf = super::super::resolvconf::ResolvConf::parse(
            "nameserver 10.0.0.2\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\n",
        );
        let own = ["127.0.0.53".parse().unwrap()];
        let up = Upstreams::from_resolv_conf(&conf, &own);
        assert_eq!(
            up.servers(),
            &[
                "10.0.0.2:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }

    #[test]
    fn udp_limit_follows_edns_within_bounds() {
        let mut m = Message::new();
        assert_eq!(udp_limit(&m), 512);
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        m.set_edns(edns);
        assert_eq!(udp_limit(&m), MAX_UDP_PAYLOAD as usize);
        let mut edns = Edns::new();
        edns.set_max_payload(100);
        m.set_edns(edns);
        assert_eq!(udp_limit(&m), 512);
    }
}
