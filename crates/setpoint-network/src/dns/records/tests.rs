use super::*;
use serde_json::json;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).unwrap()
}

fn slice(value: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(value).unwrap()
}

fn fixture() -> (Directory, Zone) {
    let services = vec![
        service(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]}
        })),
        service(json!({
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "clusterIPs": ["None"],
                     "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        })),
        service(json!({
            "metadata": {"name": "empty", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        })),
        service(json!({
            "metadata": {"name": "ext", "namespace": "other"},
            "spec": {"type": "ExternalName", "externalName": "example.com"}
        })),
    ];
    let slices = vec![
        slice(json!({
            "metadata": {"name": "db-abc", "namespace": "default",
                         "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.22.0.5"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.22.0.6"], "conditions": {"ready": true}},
                {"addresses": ["10.22.0.7"], "conditions": {"ready": false}},
                {"addresses": ["10.22.0.8"]}
            ]
        })),
        // A slice of a same-named Service in another namespace must not leak in.
        slice(json!({
            "metadata": {"name": "db-xyz", "namespace": "other",
                         "labels": {"kubernetes.io/service-name": "db"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.22.9.9"]}]
        })),
    ];
    let dir = Directory::new(Store::from_objects(services), Store::from_objects(slices)).unwrap();
    let zone = Zone::new("cluster.local", Some("127.0.0.53".parse().unwrap()))
        .unwrap()
        .with_serial(7);
    (dir, zone)
}

fn ask(dir: &Directory, zone: &Zone, name: &str, qtype: RecordType) -> Option<Resolution> {
    dir.resolve(zone, &Name::from_ascii(name).unwrap(), qtype)
}

fn rdatas(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| r.data().to_string()).collect();
    out.sort();
    out
}

#[test]
fn cluster_ip_service_has_an_a_record_and_no_aaaa() {
    let (dir, zone) = fixture();
    let r = ask(&dir, &zone, "web.default.svc.cluster.local.", RecordType::A).unwrap();
    assert_eq!(r.code, Some(ResponseCode::NoError));
    assert_eq!(rdatas(&r.answers), vec!["10.96.0.20"]);
    assert_eq!(r.answers[0].ttl(), 5);
    assert!(!r.soa);
    // Case does not matter.
    let r = ask(&dir, &zone, "WEB.Default.svc.cluster.LOCAL.", RecordType::A).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["10.96.0.20"]);
    // An IPv4 Service has no AAAA: NODATA, not NXDOMAIN.
    let r = ask(
        &dir,
        &zone,
        "web.default.svc.cluster.local.",
        RecordType::AAAA,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NoError));
    assert!(r.answers.is_empty() && r.soa);
}

#[test]
fn unknown_names_are_nxdomain_and_structural_names_nodata() {
    let (dir, zone) = fixture();
    for name in [
        "nope.default.svc.cluster.local.",
        "web.nope.svc.cluster.local.",
        "a.b.c.d.e.f.cluster.local.",
        "other.cluster.local.",
        "nope.svc.cluster.local.",
    ] {
        let r = ask(&dir, &zone, name, RecordType::A).unwrap();
        assert_eq!(r.code, Some(ResponseCode::NXDomain), "{name}");
        assert!(r.soa, "{name}");
    }
    for name in [
        "cluster.local.",
        "svc.cluster.local.",
        "default.svc.cluster.local.",
        "pod.cluster.local.",
    ] {
        let r = ask(&dir, &zone, name, RecordType::A).unwrap();
        assert_eq!(r.code, Some(ResponseCode::NoError), "{name}");
        assert!(r.answers.is_empty() && r.soa, "{name}");
    }
}

#[test]
fn apex_answers_soa_ns_and_the_schema_version() {
    let (dir, zone) = fixture();
    let r = ask(&dir, &zone, "cluster.local.", RecordType::SOA).unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec!["ns.dns.cluster.local. hostmaster.cluster.local. 7 7200 1800 86400 5"]
    );
    let r = ask(&dir, &zone, "cluster.local.", RecordType::NS).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["ns.dns.cluster.local."]);
    let r = ask(&dir, &zone, "ns.dns.cluster.local.", RecordType::A).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["127.0.0.53"]);
    let r = ask(&dir, &zone, "dns-version.cluster.local.", RecordType::TXT).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["1.1.0"]);
}

#[test]
fn headless_service_resolves_to_its_ready_endpoints() {
    let (dir, zone) = fixture();
    let r = ask(&dir, &zone, "db.default.svc.cluster.local.", RecordType::A).unwrap();
    // 10.22.0.7 is not ready; 10.22.0.8 has no conditions, which reads as ready.
    assert_eq!(
        rdatas(&r.answers),
        vec!["10.22.0.5", "10.22.0.6", "10.22.0.8"]
    );
    // No ready endpoints: NXDOMAIN, as kube-dns and CoreDNS answer.
    let r = ask(
        &dir,
        &zone,
        "empty.default.svc.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NXDomain));
}

#[test]
fn endpoints_resolve_by_hostname_or_dashed_address() {
    let (dir, zone) = fixture();
    let r = ask(
        &dir,
        &zone,
        "db-0.db.default.svc.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(rdatas(&r.answers), vec!["10.22.0.5"]);
    let r = ask(
        &dir,
        &zone,
        "10-22-0-6.db.default.svc.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(rdatas(&r.answers), vec!["10.22.0.6"]);
    // Not ready: no name.
    let r = ask(
        &dir,
        &zone,
        "10-22-0-7.db.default.svc.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NXDomain));
}

#[test]
fn srv_records_of_named_ports() {
    let (dir, zone) = fixture();
    let r = ask(
        &dir,
        &zone,
        "_http._tcp.web.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec!["0 100 80 web.default.svc.cluster.local."]
    );
    assert_eq!(rdatas(&r.additionals), vec!["10.96.0.20"]);
    // The protocol must match the port's.
    let r = ask(
        &dir,
        &zone,
        "_http._udp.web.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NXDomain));
    let r = ask(
        &dir,
        &zone,
        "_dns._udp.web.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec!["0 100 53 web.default.svc.cluster.local."]
    );
    // A headless Service: one record per ready endpoint, the weight shared.
    let r = ask(
        &dir,
        &zone,
        "_pg._tcp.db.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec![
            "0 33 5432 10-22-0-6.db.default.svc.cluster.local.",
            "0 33 5432 10-22-0-8.db.default.svc.cluster.local.",
            "0 33 5432 db-0.db.default.svc.cluster.local.",
        ]
    );
    assert_eq!(r.additionals.len(), 3);
    // The SRV name exists, other types have no data.
    let r = ask(
        &dir,
        &zone,
        "_pg._tcp.db.default.svc.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NoError));
    assert!(r.answers.is_empty());
    // SRV of the Service's own name lists every port.
    let r = ask(
        &dir,
        &zone,
        "web.default.svc.cluster.local.",
        RecordType::SRV,
    )
    .unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec![
            "0 50 53 web.default.svc.cluster.local.",
            "0 50 80 web.default.svc.cluster.local."
        ]
    );
}

#[test]
fn external_name_is_a_cname_chased_upstream() {
    let (dir, zone) = fixture();
    let r = ask(&dir, &zone, "ext.other.svc.cluster.local.", RecordType::A).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["example.com."]);
    assert_eq!(r.answers[0].record_type(), RecordType::CNAME);
    assert_eq!(r.chase, Some(Name::from_ascii("example.com.").unwrap()));
    let r = ask(
        &dir,
        &zone,
        "ext.other.svc.cluster.local.",
        RecordType::CNAME,
    )
    .unwrap();
    assert_eq!(r.chase, None);
}

#[test]
fn ptr_for_service_and_endpoint_addresses_and_fallthrough_otherwise() {
    let (dir, zone) = fixture();
    let r = ask(&dir, &zone, "20.0.96.10.in-addr.arpa.", RecordType::PTR).unwrap();
    assert_eq!(rdatas(&r.answers), vec!["web.default.svc.cluster.local."]);
    let r = ask(&dir, &zone, "5.0.22.10.in-addr.arpa.", RecordType::PTR).unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec!["db-0.db.default.svc.cluster.local."]
    );
    let r = ask(&dir, &zone, "6.0.22.10.in-addr.arpa.", RecordType::PTR).unwrap();
    assert_eq!(
        rdatas(&r.answers),
        vec!["10-22-0-6.db.default.svc.cluster.local."]
    );
    // Not the cluster's: forwarded.
    assert!(ask(&dir, &zone, "1.1.168.192.in-addr.arpa.", RecordType::PTR).is_none());
    assert!(ask(&dir, &zone, "7.0.22.10.in-addr.arpa.", RecordType::PTR).is_none());
    assert!(ask(&dir, &zone, "10.in-addr.arpa.", RecordType::PTR).is_none());
}

#[test]
fn pods_insecure_reads_the_address_from_the_name() {
    let (dir, zone) = fixture();
    let r = ask(
        &dir,
        &zone,
        "10-22-1-2.any.pod.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(rdatas(&r.answers), vec!["10.22.1.2"]);
    let r = ask(
        &dir,
        &zone,
        "fd00--1.any.pod.cluster.local.",
        RecordType::AAAA,
    )
    .unwrap();
    assert_eq!(rdatas(&r.answers), vec!["fd00::1"]);
    let r = ask(
        &dir,
        &zone,
        "not-an-ip.any.pod.cluster.local.",
        RecordType::A,
    )
    .unwrap();
    assert_eq!(r.code, Some(ResponseCode::NXDomain));
}

#[test]
fn other_names_are_not_the_zones() {
    let (dir, zone) = fixture();
    assert!(ask(&dir, &zone, "example.com.", RecordType::A).is_none());
    assert!(ask(&dir, &zone, "local.", RecordType::A).is_none());
}

#[test]
fn reverse_names_parse_to_addresses() {
    let v6 = Name::from(IpAddr::from("fd00::5".parse::<Ipv6Addr>().unwrap()));
    assert_eq!(reverse_ip(&v6), Some("fd00::5".parse().unwrap()));
    let v4 = Name::from_ascii("4.3.2.1.in-addr.arpa.").unwrap();
    assert_eq!(reverse_ip(&v4), Some("1.2.3.4".parse().unwrap()));
    assert_eq!(dashed("10.0.0.1".parse().unwrap()), "10-0-0-1");
}

#[test]
fn zone_refuses_bad_domains() {
    assert!(Zone::new("", None).is_err());
    assert!(Zone::new("bad..domain", None).is_err());
    assert_eq!(
        Zone::new("Cluster.Local.", None)
            .unwrap()
            .domain()
            .to_string(),
        "cluster.local."
    );
}
