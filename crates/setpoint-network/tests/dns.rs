//! The DNS server against an in-process API server, queried over real UDP and TCP with the
//! crate's client: records follow the Service and EndpointSlice objects as they change, and
//! names outside the zone go to an upstream (here a second server, authoritative for
//! `upstream.test`).

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use setpoint_network::dns::{self, client, Upstreams};
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::{eventually_within, TestCluster};

const NS: &str = "dns";
const WAIT: Duration = Duration::from_secs(30);
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

async fn create<K>(api: &Api<K>, value: serde_json::Value)
where
    K: serde::de::DeserializeOwned + serde::Serialize + Clone + std::fmt::Debug,
    K: setpoint_runtime::Object,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn objects(client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    create(&namespaces, json!({"metadata": {"name": NS}})).await;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    create(
        &services,
        json!({"metadata": {"name": "web"},
               "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .await;
    create(
        &services,
        json!({"metadata": {"name": "db"},
               "spec": {"clusterIP": "None",
                        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}}),
    )
    .await;
    create(
        &services,
        json!({"metadata": {"name": "ext"},
               "spec": {"type": "ExternalName", "externalName": "10-9-8-7.www.pod.upstream.test"}}),
    )
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    create(
        &slices,
        json!({"metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.244.0.5"], "hostname": "db-0",
             "conditions": {"ready": true}},
            {"addresses": ["10.244.0.6"], "conditions": {"ready": true}},
            {"addresses": ["10.244.0.7"], "conditions": {"ready": false}}
        ]}),
    )
    .await;
}

/// The answer's records as text, sorted.
fn answers(m: &Message) -> Vec<String> {
    let mut out: Vec<String> = m.answers().iter().map(|r| r.data().to_string()).collect();
    out.sort();
    out
}

async fn ask(server: SocketAddr, name: &str, qtype: RecordType, tcp: bool) -> Message {
    client::query(server, name, qtype, tcp, QUERY_TIMEOUT)
        .await
        .unwrap()
}

/// An upstream resolver for `upstream.test`: another instance of the server, whose
/// `<a-b-c-d>.<ns>.pod.upstream.test` names stand for records of the outside world.
async fn upstream() -> (TestCluster, dns::DnsServer) {
    let cluster = TestCluster::start().await;
    let informers = SharedInformers::new(cluster.client());
    let server = dns::start(
        &informers,
        "127.0.0.1:0".parse().unwrap(),
        "upstream.test",
        Upstreams::default(),
    )
    .await
    .unwrap();
    (cluster, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_records_over_udp_and_tcp() {
    let (_up_cluster, up) = upstream().await;
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    objects(&client).await;
    let informers = SharedInformers::new(client.clone());
    let server = dns::start(
        &informers,
        "127.0.0.1:0".parse().unwrap(),
        "cluster.local",
        Upstreams::from_addrs(vec![up.local_addr()]),
    )
    .await
    .unwrap();
    let addr = server.local_addr();

    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let cluster_ip = services
        .get("web")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();

    // A ClusterIP Service, over both transports.
    for tcp in [false, true] {
        let reply = eventually_within(WAIT, "web's A record", || async {
            let m = ask(addr, "web.dns.svc.cluster.local.", RecordType::A, tcp).await;
            (m.response_code() == ResponseCode::NoError && !m.answers().is_empty()).then_some(m)
        })
        .await;
        assert_eq!(answers(&reply), vec![cluster_ip.clone()]);
        assert!(reply.authoritative());
        assert_eq!(reply.answers()[0].ttl(), 5);
    }
    let m = ask(addr, "web.dns.svc.cluster.local.", RecordType::AAAA, false).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert!(m.answers().is_empty());
    assert_eq!(m.name_servers().len(), 1, "NODATA carries the SOA");

    // Headless: the ready endpoints, by Service name, by hostname and in SRV.
    let m = ask(addr, "db.dns.svc.cluster.local.", RecordType::A, false).await;
    assert_eq!(answers(&m), vec!["10.244.0.5", "10.244.0.6"]);
    let m = ask(addr, "db-0.db.dns.svc.cluster.local.", RecordType::A, false).await;
    assert_eq!(answers(&m), vec!["10.244.0.5"]);
    let m = ask(
        addr,
        "_pg._tcp.db.dns.svc.cluster.local.",
        RecordType::SRV,
        true,
    )
    .await;
    assert_eq!(
        answers(&m),
        vec![
            "0 50 5432 10-244-0-6.db.dns.svc.cluster.local.",
            "0 50 5432 db-0.db.dns.svc.cluster.local."
        ]
    );
    assert_eq!(m.additionals().len(), 2);
    let m = ask(
        addr,
        "_http._tcp.web.dns.svc.cluster.local.",
        RecordType::SRV,
        false,
    )
    .await;
    assert_eq!(answers(&m), vec!["0 100 80 web.dns.svc.cluster.local."]);

    // PTR for the cluster IP and for an endpoint.
    let ip: std::net::Ipv4Addr = cluster_ip.parse().unwrap();
    let o = ip.octets();
    let reverse = format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0]);
    let m = ask(addr, &reverse, RecordType::PTR, false).await;
    assert_eq!(answers(&m), vec!["web.dns.svc.cluster.local."]);
    let m = ask(addr, "5.0.244.10.in-addr.arpa.", RecordType::PTR, false).await;
    assert_eq!(answers(&m), vec!["db-0.db.dns.svc.cluster.local."]);

    // NXDOMAIN for what does not exist.
    let m = ask(addr, "nope.dns.svc.cluster.local.", RecordType::A, false).await;
    assert_eq!(m.response_code(), ResponseCode::NXDomain);

    // Pods by address.
    let m = ask(
        addr,
        "10-1-2-3.dns.pod.cluster.local.",
        RecordType::A,
        false,
    )
    .await;
    assert_eq!(answers(&m), vec!["10.1.2.3"]);

    // ExternalName: the CNAME, followed upstream for the target's address (the upstream
    // answers the target from its own zone); a CNAME question gets the CNAME alone. A name
    // wholly outside the zone is relayed with the upstream's own answer.
    let m = ask(addr, "ext.dns.svc.cluster.local.", RecordType::A, false).await;
    assert_eq!(m.answers().len(), 2);
    assert_eq!(m.answers()[0].record_type(), RecordType::CNAME);
    assert_eq!(
        answers(&m),
        vec!["10-9-8-7.www.pod.upstream.test.", "10.9.8.7"]
    );
    let m = ask(addr, "ext.dns.svc.cluster.local.", RecordType::CNAME, false).await;
    assert_eq!(answers(&m), vec!["10-9-8-7.www.pod.upstream.test."]);
    let m = ask(addr, "dns-version.upstream.test.", RecordType::TXT, false).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert_eq!(answers(&m), vec!["1.1.0"]);
    let m = ask(addr, "nothing.here.upstream.test.", RecordType::A, true).await;
    assert_eq!(m.response_code(), ResponseCode::NXDomain);

    // Records follow the objects: the slice deleted, the headless name goes away.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    slices
        .delete("db-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually_within(WAIT, "db to be NXDOMAIN", || async {
        let m = ask(addr, "db.dns.svc.cluster.local.", RecordType::A, false).await;
        (m.response_code() == ResponseCode::NXDomain).then_some(())
    })
    .await;
    drop(server);
    informers.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_upstream_answers_servfail_and_garbage_gets_formerr() {
    let cluster = TestCluster::start().await;
    let informers = SharedInformers::new(cluster.client());
    let server = dns::start(
        &informers,
        "127.0.0.1:0".parse().unwrap(),
        "cluster.local",
        Upstreams::default(),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let m = ask(addr, "example.com.", RecordType::A, false).await;
    assert_eq!(m.response_code(), ResponseCode::ServFail);

    // Twelve bytes of header and a question that does not decode: FORMERR, same id.
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.connect(addr).await.unwrap();
    let mut packet = vec![0xAB, 0xCD, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0];
    packet.extend_from_slice(&[0x3F, b'x']);
    socket.send(&packet).await.unwrap();
    let mut buf = [0u8; 512];
    let len = tokio::time::timeout(QUERY_TIMEOUT, socket.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let reply = Message::from_vec(&buf[..len]).unwrap();
    assert_eq!(reply.id(), 0xABCD);
    assert_eq!(reply.response_code(), ResponseCode::FormErr);
    informers.shutdown().await;
}

/// A node's server listens on each of its addresses, one of which (a pod bridge's gateway
/// before the first pod) may not be on the host yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_dns_listens_on_an_address_not_yet_on_the_host() {
    let cluster = TestCluster::start().await;
    let informers = SharedInformers::new(cluster.client());
    let config = dns::node::NodeDnsConfig {
        // 198.18.0.0/15 is for benchmarks: on no interface here.
        addresses: vec![
            "127.0.0.1".parse().unwrap(),
            "198.18.255.1".parse().unwrap(),
        ],
        port: 0,
        domain: "cluster.local".into(),
        host: dns::ResolvConf::default(),
    };
    let node = dns::node::start_node(&informers, &config).await.unwrap();
    let addrs = node.addresses();
    assert_eq!(addrs.len(), 2);
    assert_eq!(addrs[1].ip().to_string(), "198.18.255.1");
    let m = ask(
        addrs[0],
        "dns-version.cluster.local.",
        RecordType::TXT,
        false,
    )
    .await;
    assert_eq!(answers(&m), vec!["1.1.0"]);
    let m = ask(addrs[0], "cluster.local.", RecordType::NS, true).await;
    assert_eq!(answers(&m), vec!["ns.dns.cluster.local."]);
    drop(node);
    informers.shutdown().await;
}
