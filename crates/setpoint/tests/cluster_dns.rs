//! Cluster DNS end to end, with the real kubectl and a real containerd: `setpoint up
//! --container-runtime cri` serves DNS on its pod bridge's gateway; from this host, a query
//! sent there straight gets `<svc>.<ns>.svc.cluster.local`, a headless Service's pod
//! addresses, SRV of its named port, PTR of a pod address and an ExternalName's CNAME; from
//! inside a container pod, busybox `nslookup` resolves the Services through the
//! `resolv.conf` the sandbox got (the node's DNS address, the `ClusterFirst` search path,
//! `ndots:5`). The `kube-dns` Service is kubeadm's (`kubectl cluster-info` lists it) and its
//! endpoint is the node's DNS address.
//!
//! Skipped (saying why) unless root with containerd, runc, the CNI plugins and a static
//! busybox installed; `SETPOINT_REQUIRE_CONTAINERD=1` makes that a failure.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use setpoint_network::dns::client;
use setpoint_network::dns::proto::op::{Message, ResponseCode};
use setpoint_network::dns::proto::rr::RecordType;
use support::{eventually, lines, Setpoint};

const DEADLINE: Duration = Duration::from_secs(120);

/// The pod subnet's gateway `setpoint up` printed for its private containerd
/// (`(pod subnet 10.223.<x>.0/24)`), or `None` for a system containerd (whose bridge is not
/// the node's to serve DNS on).
fn gateway(setpoint: &Setpoint) -> Option<String> {
    let line = loop {
        let line = setpoint
            .output
            .recv_timeout(DEADLINE)
            .expect("setpoint up says what its local node runs pods on");
        if line.starts_with("The local node runs pods ") {
            break line;
        }
    };
    let subnet = line.split("(pod subnet ").nth(1)?.split(')').next()?;
    Some(format!("{}1", subnet.trim_end_matches("0/24")))
}

fn ask(server: SocketAddr, name: &str, qtype: RecordType, tcp: bool) -> Option<Message> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(client::query(
        server,
        name,
        qtype,
        tcp,
        Duration::from_secs(3),
    ))
    .ok()
}

fn answers(m: &Message) -> BTreeSet<String> {
    m.answers().iter().map(|r| r.data().to_string()).collect()
}

#[test]
fn cluster_dns_from_the_host_and_from_a_container() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--container-runtime", "cri"], dir.path());
    let Some(gateway) = gateway(&s) else {
        eprintln!("skipping: a system containerd runs the pods; the node serves no DNS on it");
        s.stop();
        return;
    };
    let server: SocketAddr = format!("{gateway}:53").parse().unwrap();

    // A headless Service over two busybox pods (its port is named `80-80`), and an
    // ExternalName Service.
    s.ok(&[
        "create",
        "deployment",
        "db",
        "--image=setpoint.local/busybox:1",
        "--replicas=2",
        "--",
        "sleep",
        "3600",
    ]);
    s.ok(&[
        "create",
        "service",
        "clusterip",
        "db",
        "--clusterip=None",
        "--tcp=80:80",
    ]);
    s.ok(&[
        "create",
        "service",
        "externalname",
        "ext",
        "--external-name=www.example.com",
    ]);
    let pods = eventually("two ready db pods", DEADLINE, || {
        support::ready_pods(&s, "app=db", 2)
    });
    let ips: BTreeSet<String> = lines(&s.ok(&[
        "get",
        "pods",
        "-l",
        "app=db",
        "-o",
        "jsonpath={range .items[*]}{.status.podIP}{\"\\n\"}{end}",
    ]))
    .into_iter()
    .collect();
    assert_eq!(ips.len(), 2, "{ips:?}");

    // From the host, straight to the node's DNS address (the bridge exists now).
    let m = eventually("kubernetes.default over UDP", DEADLINE, || {
        ask(
            server,
            "kubernetes.default.svc.cluster.local.",
            RecordType::A,
            false,
        )
        .filter(|m| !m.answers().is_empty())
    });
    assert_eq!(answers(&m), BTreeSet::from(["10.96.0.1".to_string()]));
    let m = eventually("the headless Service's pods", DEADLINE, || {
        ask(server, "db.default.svc.cluster.local.", RecordType::A, true)
            .filter(|m| answers(m) == ips)
    });
    assert_eq!(m.answers()[0].ttl(), 5);
    let m = ask(
        server,
        "_80-80._tcp.db.default.svc.cluster.local.",
        RecordType::SRV,
        false,
    )
    .unwrap();
    let targets: BTreeSet<String> = ips
        .iter()
        .map(|ip| {
            format!(
                "0 50 80 {}.db.default.svc.cluster.local.",
                ip.replace('.', "-")
            )
        })
        .collect();
    assert_eq!(answers(&m), targets);
    let first = ips.iter().next().unwrap();
    let reverse: Vec<&str> = first.split('.').rev().collect();
    let m = ask(
        server,
        &format!("{}.in-addr.arpa.", reverse.join(".")),
        RecordType::PTR,
        false,
    )
    .unwrap();
    assert_eq!(
        answers(&m),
        BTreeSet::from([format!(
            "{}.db.default.svc.cluster.local.",
            first.replace('.', "-")
        )])
    );
    let m = ask(
        server,
        "ext.default.svc.cluster.local.",
        RecordType::CNAME,
        false,
    )
    .unwrap();
    assert_eq!(
        answers(&m),
        BTreeSet::from(["www.example.com.".to_string()])
    );
    let m = ask(
        server,
        "nothing.default.svc.cluster.local.",
        RecordType::A,
        false,
    )
    .unwrap();
    assert_eq!(m.response_code(), ResponseCode::NXDomain);

    // The kube-dns Service as kubeadm's, listed by `kubectl cluster-info`, with this node's
    // DNS address as its endpoint.
    let m = ask(
        server,
        "kube-dns.kube-system.svc.cluster.local.",
        RecordType::A,
        false,
    )
    .unwrap();
    assert_eq!(answers(&m), BTreeSet::from(["10.96.0.10".to_string()]));
    let info = s.ok(&["cluster-info"]);
    assert!(
        info.contains("CoreDNS is running at") && info.contains("/services/kube-dns:dns/proxy"),
        "{info}"
    );
    let endpoints = eventually("kube-dns endpoints", DEADLINE, || {
        let out = s.ok(&[
            "get",
            "endpointslices",
            "-n",
            "kube-system",
            "-l",
            "kubernetes.io/service-name=kube-dns",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ]);
        (!out.trim().is_empty()).then_some(out)
    });
    assert_eq!(endpoints.trim(), gateway);

    // From inside a container: the sandbox's resolv.conf, and busybox's nslookup.
    let pod = &pods[0];
    let resolv = s.ok(&["exec", pod, "--", "cat", "/etc/resolv.conf"]);
    assert!(
        resolv.contains(&format!("nameserver {gateway}")),
        "{resolv}"
    );
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("ndots:5"), "{resolv}");
    let out = s.ok(&[
        "exec",
        pod,
        "--",
        "nslookup",
        "kubernetes.default.svc.cluster.local",
    ]);
    assert!(out.contains("10.96.0.1"), "{out}");
    let out = s.ok(&[
        "exec",
        pod,
        "--",
        "nslookup",
        "db.default.svc.cluster.local",
    ]);
    for ip in &ips {
        assert!(out.contains(ip.as_str()), "{ip} in {out}");
    }

    s.ok(&["delete", "deployment", "db"]);
    eventually("the db pods gone", DEADLINE, || {
        s.ok(&["get", "pods", "-l", "app=db", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    s.stop();
    let x = gateway.trim_end_matches(".1").rsplit('.').next().unwrap();
    let _ = std::process::Command::new("ip")
        .args(["link", "del", &format!("sp-n{x}")])
        .status();
}
