//! The service proxy's costs on this machine (needs root and `nft`):
//!
//! - rule programming with `<services>` Services × `<endpoints>` endpoints: the desired
//!   ruleset computed, the full sync applied, and one change (an endpoint that stops being
//!   ready) computed and applied as a partial sync;
//! - request overhead: `<requests>` sequential TCP request/answer round trips on new
//!   connections straight to a loopback endpoint, and through a virtual address DNATed to it
//!   by the proxy's rules (with the benchmark's 1,000 Services in the table).
//!
//! `cargo run --release -p setpoint-network --example proxy_bench -- 1000 10 5000`
//!
//! It programs a table `setpoint-bench-<pid>` and deletes it at the end.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use setpoint_network::proxy::model::{Endpoint, PortKey, Protocol, ServiceMap, ServicePort};
use setpoint_network::proxy::{self, rules, Nft, NodeInfo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn service(
    i: usize,
    endpoints: usize,
    first_endpoint: Option<SocketAddr>,
) -> (ServicePort, Vec<Endpoint>) {
    let key = PortKey {
        namespace: format!("ns{}", i % 10),
        name: format!("svc{i}"),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    };
    let sp = ServicePort {
        key,
        // The benchmarking range: no cluster allocates it.
        cluster_ip: Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8),
        port: 80,
        node_port: None,
        external_ips: Vec::new(),
        affinity_timeout: None,
        internal_local: false,
        external_local: false,
    };
    let eps = (0..endpoints)
        .map(|j| {
            let (ip, port) = match (j, first_endpoint) {
                (0, Some(SocketAddr::V4(a))) => (*a.ip(), a.port()),
                _ => (
                    Ipv4Addr::new(10, 200 + (i / 65536) as u8, (i >> 8) as u8, i as u8),
                    8000 + j as u16,
                ),
            };
            Endpoint {
                ip,
                port,
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("bench".into()),
            }
        })
        .collect();
    (sp, eps)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn round_trips(to: SocketAddr, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let mut s = TcpStream::connect(to).await.expect("connect");
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        out.push(started.elapsed());
    }
    out.sort();
    out
}

fn summary(name: &str, mut v: Vec<Duration>) -> f64 {
    v.sort();
    let p = |q: f64| ms(v[((v.len() as f64 * q) as usize).min(v.len() - 1)]);
    let mean = ms(v.iter().sum::<Duration>()) / v.len() as f64;
    println!(
        "{name}: {} round trips, mean {mean:.3} ms, p50 {:.3} ms, p99 {:.3} ms",
        v.len(),
        p(0.5),
        p(0.99)
    );
    mean
}

#[tokio::main]
async fn main() {
    let services = arg(1, 1000);
    let endpoints = arg(2, 10);
    let requests = arg(3, 5000);
    if let Err(e) = Nft::probe().await {
        eprintln!("proxy_bench needs root and nft: {e}");
        std::process::exit(2);
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).await.is_ok() {
                    let _ = s.write_all(&buf).await;
                }
            });
        }
    });
    let node = NodeInfo {
        node_name: "bench".into(),
        cluster_cidr: Some("10.200.0.0/14".into()),
        bridge_netfilter: true,
        route_localnet: true,
    };
    let mut map = ServiceMap::new();
    for i in 0..services {
        // Service 0's only endpoint is the local server, for the overhead measurement.
        let (sp, eps) = if i == 0 {
            service(i, 1, Some(target))
        } else {
            service(i, endpoints, None)
        };
        map.insert(sp.key.clone(), (sp, eps));
    }
    let nft = Nft::new(&format!("setpoint-bench-{}", std::process::id()));

    let started = Instant::now();
    let full = rules::desired(&map, &node);
    let compute = started.elapsed();
    let started = Instant::now();
    let ops = proxy::full_sync(&nft, &full).await.expect("full sync");
    let apply_full = started.elapsed();
    println!(
        "full sync, {services} Services x {endpoints} endpoints: {} chains, {ops} commands; \
         ruleset computed in {:.1} ms, applied in {:.1} ms",
        full.chains.len(),
        ms(compute),
        ms(apply_full)
    );

    // One change: an endpoint of service 500 stops being ready.
    let changed_key = map.keys().nth(services / 2).unwrap().clone();
    let mut changes = Vec::new();
    let mut prev = full;
    for round in 0..10 {
        let eps = &mut map.get_mut(&changed_key).unwrap().1;
        eps[1].ready = round % 2 == 1;
        let started = Instant::now();
        let next = rules::desired(&map, &node);
        let ops = rules::partial_sync(&prev, &next);
        let script = rules::render(nft.table(), &ops);
        let computed = started.elapsed();
        nft.apply(&script).await.expect("partial sync");
        changes.push((computed, started.elapsed(), ops.len()));
        prev = next;
    }
    changes.sort_by_key(|c| c.1);
    let (computed, total, ops) = changes[changes.len() / 2];
    println!(
        "one change (an endpoint leaves or returns), median of 10: {ops} commands, \
         computed in {:.1} ms, computed and applied in {:.1} ms",
        ms(computed),
        ms(total)
    );

    let vip = SocketAddr::from((map.values().next().unwrap().0.cluster_ip, 80));
    // Warm up both paths, then alternate so neither gets a quieter machine.
    round_trips(target, 200).await;
    round_trips(vip, 200).await;
    let mut direct = Vec::new();
    let mut through = Vec::new();
    for _ in 0..10 {
        direct.extend(round_trips(target, requests / 10).await);
        through.extend(round_trips(vip, requests / 10).await);
    }
    let d = summary("direct to the endpoint", direct);
    let t = summary("through the virtual address", through);
    println!(
        "overhead per new connection and round trip: {:.3} ms",
        t - d
    );

    proxy::cleanup(nft.table()).await.expect("delete the table");
}
