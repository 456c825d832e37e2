//! The proxy's rules on the real kernel, with real packets: a virtual address and a node port
//! reach a listener on loopback (as a process pod's) through the output chain, an endpoint
//! that leaves is rejected, affinity sticks, and a table is cleaned up after. Needs root and
//! `nft`; skipped without them unless `SETPOINT_REQUIRE_NFT` is set.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use setpoint_network::proxy::model::{Endpoint, PortKey, Protocol, ServiceMap, ServicePort};
use setpoint_network::proxy::{self, rules, Nft, NodeInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn nft_or_skip() -> bool {
    match Nft::probe().await {
        Ok(()) => true,
        Err(e) if std::env::var_os("SETPOINT_REQUIRE_NFT").is_some() => {
            panic!("SETPOINT_REQUIRE_NFT is set but nftables cannot be programmed: {e}")
        }
        Err(e) => {
            eprintln!("skipping: nftables cannot be programmed here ({e})");
            false
        }
    }
}

/// Deletes the test's table however the test ends.
struct Table(Nft);

impl Drop for Table {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "ip", self.0.table()])
            .status();
    }
}

/// A listener that answers every connection with `name` and closes.
async fn answering(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = s.write_all(name.as_bytes()).await;
            });
        }
    });
    addr
}

async fn ask(to: SocketAddr) -> std::io::Result<String> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(to))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "read timed out"))??;
    Ok(out)
}

/// The host's own address on its default route, where node ports answer.
fn host_address() -> Option<Ipv4Addr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.255:9").ok()?;
    match socket.local_addr().ok()?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() && !ip.is_loopback() => Some(ip),
        _ => None,
    }
}

fn endpoint(addr: SocketAddr, ready: bool) -> Endpoint {
    let std::net::IpAddr::V4(ip) = addr.ip() else {
        unreachable!()
    };
    Endpoint {
        ip,
        port: addr.port(),
        ready,
        serving: ready,
        terminating: false,
        node_name: Some("n1".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_addresses_reach_loopback_endpoints() {
    if !nft_or_skip().await {
        return;
    }
    let pid = std::process::id();
    let table = Table(Nft::new(&format!("setpoint-test-{pid}")));
    let nft = &table.0;
    // An address no cluster allocates (the benchmarking range), unique to this process.
    let vip = Ipv4Addr::new(198, 18, (pid >> 8) as u8, pid as u8);
    let node_port = 32000 + (pid % 700) as u16;
    let a = answering("a").await;
    let b = answering("b").await;
    // As the proxy runs once route_localnet is on: node ports on 127.0.0.0/8 too, and the
    // guard against packets to loopback from elsewhere in the input hook.
    let node = NodeInfo {
        node_name: "n1".into(),
        cluster_cidr: None,
        bridge_netfilter: true,
        route_localnet: true,
    };
    let key = PortKey {
        namespace: "ns".into(),
        name: "web".into(),
        port_name: String::new(),
        protocol: Protocol::Tcp,
    };
    let sp = ServicePort {
        key: key.clone(),
        cluster_ip: vip,
        port: 80,
        node_port: Some(node_port),
        external_ips: Vec::new(),
        affinity_timeout: None,
        internal_local: false,
        external_local: false,
    };
    let state = |sp: &ServicePort, eps: Vec<Endpoint>| {
        let mut m = ServiceMap::new();
        m.insert(key.clone(), (sp.clone(), eps));
        rules::desired(&m, &node)
    };
    let service = SocketAddr::from((vip, 80));

    // Full sync: one endpoint.
    let first = state(&sp, vec![endpoint(a, true)]);
    proxy::full_sync(nft, &first).await.unwrap();
    assert_eq!(ask(service).await.unwrap(), "a");
    if let Some(host) = host_address() {
        assert_eq!(ask(SocketAddr::from((host, node_port))).await.unwrap(), "a");
    }
    let localhost = SocketAddr::from((Ipv4Addr::LOCALHOST, node_port));
    assert_eq!(ask(localhost).await.unwrap(), "a");

    // Partial sync: both endpoints; connections spread over them.
    let second = state(&sp, vec![endpoint(a, true), endpoint(b, true)]);
    let ops = rules::partial_sync(&first, &second);
    nft.apply(&rules::render(nft.table(), &ops)).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        seen.insert(ask(service).await.unwrap());
    }
    assert_eq!(seen.len(), 2, "40 connections all reached {seen:?}");

    // Client-IP affinity: every connection sticks to the first one's endpoint.
    let mut sticky = sp.clone();
    sticky.affinity_timeout = Some(60);
    let third = state(&sticky, vec![endpoint(a, true), endpoint(b, true)]);
    let ops = rules::partial_sync(&second, &third);
    nft.apply(&rules::render(nft.table(), &ops)).await.unwrap();
    let first_answer = ask(service).await.unwrap();
    for _ in 0..20 {
        assert_eq!(ask(service).await.unwrap(), first_answer);
    }

    // `a` stops being ready: only `b` is reached; then none is ready: refused at once.
    let fourth = state(&sp, vec![endpoint(a, false), endpoint(b, true)]);
    let ops = rules::partial_sync(&third, &fourth);
    nft.apply(&rules::render(nft.table(), &ops)).await.unwrap();
    for _ in 0..20 {
        assert_eq!(ask(service).await.unwrap(), "b");
    }
    let fifth = state(&sp, vec![endpoint(a, false), endpoint(b, false)]);
    let ops = rules::partial_sync(&fourth, &fifth);
    nft.apply(&rules::render(nft.table(), &ops)).await.unwrap();
    let err = ask(service).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");

    // A full sync over the table as it is ends where the partial ones did.
    proxy::full_sync(nft, &second).await.unwrap();
    let listing = nft.list().await.unwrap().unwrap();
    let (chains, _) = rules::parse_listing(&listing);
    let expected: std::collections::BTreeSet<String> = second.chains.keys().cloned().collect();
    assert_eq!(chains, expected);

    // Cleanup removes the table.
    proxy::cleanup(nft.table()).await.unwrap();
    assert_eq!(nft.list().await.unwrap(), None);
    proxy::cleanup(nft.table()).await.unwrap();
}

/// An echo server on loopback: every line comes back.
async fn echoing() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn echo(s: &mut TcpStream, text: &str) -> String {
    s.write_all(text.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; text.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("the echo within 5 s")
        .unwrap();
    String::from_utf8(buf).unwrap()
}

/// A full sync, as at an agent's start, replaces the whole table in one transaction; an
/// established connection through the Service keeps working across it (its translation is in
/// conntrack), even across a table deleted and rebuilt from nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn established_connections_survive_a_full_resync() {
    if !nft_or_skip().await {
        return;
    }
    let pid = std::process::id();
    let table = Table(Nft::new(&format!("setpoint-test-resync-{pid}")));
    let nft = &table.0;
    let vip = Ipv4Addr::new(198, 19, (pid >> 8) as u8, pid as u8);
    let server = echoing().await;
    let node = NodeInfo {
        node_name: "n1".into(),
        cluster_cidr: None,
        bridge_netfilter: true,
        route_localnet: false,
    };
    let key = PortKey {
        namespace: "ns".into(),
        name: "echo".into(),
        port_name: String::new(),
        protocol: Protocol::Tcp,
    };
    let sp = ServicePort {
        key: key.clone(),
        cluster_ip: vip,
        port: 7,
        node_port: None,
        external_ips: Vec::new(),
        affinity_timeout: None,
        internal_local: false,
        external_local: false,
    };
    let mut map = ServiceMap::new();
    map.insert(key.clone(), (sp, vec![endpoint(server, true)]));
    let desired = rules::desired(&map, &node);
    proxy::full_sync(nft, &desired).await.unwrap();
    let mut conn = TcpStream::connect((vip, 7)).await.unwrap();
    assert_eq!(echo(&mut conn, "one\n").await, "one\n");
    // The agent restarts: a full sync over the existing table.
    proxy::full_sync(nft, &desired).await.unwrap();
    assert_eq!(echo(&mut conn, "two\n").await, "two\n");
    // Even with the table gone and rebuilt.
    proxy::cleanup(nft.table()).await.unwrap();
    assert_eq!(echo(&mut conn, "three\n").await, "three\n");
    proxy::full_sync(nft, &desired).await.unwrap();
    assert_eq!(echo(&mut conn, "four\n").await, "four\n");
    // And a new connection is routed again.
    let mut again = TcpStream::connect((vip, 7)).await.unwrap();
    assert_eq!(echo(&mut again, "five\n").await, "five\n");
}
