//! The pure proxy: what rules Services and endpoints give, and that every incremental
//! transaction, run on a model of the kernel's table that refuses what nft refuses, ends
//! where a full rebuild does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use proptest::prelude::*;
use serde_json::json;

use super::model::{self, Endpoint, PortKey, Protocol, ServiceMap, ServicePort};
use super::rules::{self, NodeInfo, Op, Ruleset};

fn node() -> NodeInfo {
    NodeInfo {
        node_name: "n1".into(),
        cluster_cidr: Some("10.244.0.0/16".into()),
        bridge_netfilter: true,
        route_localnet: false,
    }
}

fn key(name: &str) -> PortKey {
    PortKey {
        namespace: "ns".into(),
        name: name.into(),
        port_name: "http".into(),
        protocol: Protocol::Tcp,
    }
}

fn port(name: &str, ip: [u8; 4]) -> ServicePort {
    ServicePort {
        key: key(name),
        cluster_ip: Ipv4Addr::from(ip),
        port: 80,
        node_port: None,
        external_ips: Vec::new(),
        affinity_timeout: None,
        internal_local: false,
        external_local: false,
    }
}

fn ep(last: u8, ready: bool, node: &str) -> Endpoint {
    Endpoint {
        ip: Ipv4Addr::new(10, 244, 0, last),
        port: 8080,
        ready,
        serving: ready,
        terminating: false,
        node_name: Some(node.into()),
    }
}

fn one(sp: ServicePort, eps: Vec<Endpoint>) -> ServiceMap {
    let mut m = ServiceMap::new();
    m.insert(sp.key.clone(), (sp, eps));
    m
}

fn element<'a>(rs: &'a Ruleset, set: &str, k: &str) -> Option<&'a str> {
    rs.sets[set].elements.get(k).map(String::as_str)
}

#[test]
fn cluster_ip_balances_over_ready_endpoints() {
    let sp = port("web", [10, 96, 0, 10]);
    let rs = rules::desired(
        &one(
            sp.clone(),
            vec![ep(1, true, "n1"), ep(2, false, "n1"), ep(3, true, "n2")],
        ),
        &node(),
    );
    let chain = rules::service_chain(&sp.key);
    assert_eq!(
        element(&rs, "service-ips", "10.96.0.10 . tcp . 80"),
        Some(format!("goto {chain}").as_str())
    );
    let rules = &rs.chains[&chain].rules;
    assert_eq!(
        rules[0],
        "ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade"
    );
    let e1 = rules::endpoint_chain(&sp.key, &ep(1, true, "n1"));
    let e3 = rules::endpoint_chain(&sp.key, &ep(3, true, "n2"));
    assert_eq!(
        rules[1],
        format!("numgen random mod 2 vmap {{ 0 : goto {e1} , 1 : goto {e3} }}")
    );
    assert_eq!(
        rs.chains[&e1].rules,
        vec![
            "ip saddr 10.244.0.1 jump mark-for-masquerade".to_string(),
            "meta l4proto tcp dnat to 10.244.0.1:8080".to_string()
        ]
    );
    // The endpoint that is not ready has no chain.
    assert!(!rs
        .chains
        .contains_key(&rules::endpoint_chain(&sp.key, &ep(2, false, "n1"))));
    assert!(rs.sets["no-endpoint-services"].elements.is_empty());
    assert!(e1.starts_with("endpoint-") && e1.ends_with("-ns/web/tcp/http__10.244.0.1/8080"));
}

#[test]
fn without_bridge_netfilter_pod_traffic_to_endpoints_is_masqueraded() {
    let sp = port("web", [10, 96, 0, 10]);
    let mut map = ServiceMap::new();
    map.insert(sp.key.clone(), (sp.clone(), vec![ep(1, true, "n1")]));
    let e1 = rules::endpoint_chain(&sp.key, &ep(1, true, "n1"));
    let hairpin = "ip saddr 10.244.0.1 jump mark-for-masquerade".to_string();
    let pods = "ip saddr 10.244.0.0/16 jump mark-for-masquerade".to_string();
    let dnat = "meta l4proto tcp dnat to 10.244.0.1:8080".to_string();
    // Bridged replies meet conntrack: the endpoint sees the client pod's address.
    let rs = rules::desired(&map, &node());
    assert_eq!(rs.chains[&e1].rules, [hairpin.clone(), dnat.clone()]);
    // Without: the pod network's traffic is masqueraded so replies come through the host.
    let mut plain = node();
    plain.bridge_netfilter = false;
    let rs = rules::desired(&map, &plain);
    assert_eq!(rs.chains[&e1].rules, [hairpin.clone(), pods, dnat.clone()]);
    // With no pod network known there is nothing to match it by.
    plain.cluster_cidr = None;
    let rs = rules::desired(&map, &plain);
    assert_eq!(rs.chains[&e1].rules, [hairpin, dnat]);
}

#[test]
fn the_bridge_switch_is_on_only_at_one() {
    assert!(super::bridge::is_on("1\n"));
    assert!(!super::bridge::is_on("0\n"));
    assert!(!super::bridge::is_on(""));
}

#[test]
fn terminating_serving_endpoints_are_the_fallback_then_reject() {
    let sp = port("web", [10, 96, 0, 10]);
    let mut term = ep(1, false, "n1");
    term.serving = true;
    term.terminating = true;
    let rs = rules::desired(&one(sp.clone(), vec![term.clone()]), &node());
    assert!(rs
        .chains
        .contains_key(&rules::endpoint_chain(&sp.key, &term)));
    // Not serving any more: nothing to send to, new connections are rejected.
    term.serving = false;
    let rs = rules::desired(&one(sp.clone(), vec![term]), &node());
    assert_eq!(
        element(&rs, "no-endpoint-services", "10.96.0.10 . tcp . 80"),
        Some("goto reject-chain")
    );
    assert!(rs.sets["service-ips"].elements.is_empty());
    assert!(!rs.chains.contains_key(&rules::service_chain(&sp.key)));
    // A ready endpoint next to a terminating one: only the ready one is used.
    let mut t = ep(1, false, "n1");
    t.serving = true;
    t.terminating = true;
    let rs = rules::desired(
        &one(sp.clone(), vec![t.clone(), ep(2, true, "n1")]),
        &node(),
    );
    assert!(!rs.chains.contains_key(&rules::endpoint_chain(&sp.key, &t)));
}

#[test]
fn client_ip_affinity_sets_per_endpoint() {
    let mut sp = port("web", [10, 96, 0, 10]);
    sp.affinity_timeout = Some(30);
    let e = ep(1, true, "n1");
    let rs = rules::desired(&one(sp.clone(), vec![e.clone()]), &node());
    let set = rules::affinity_set(&sp.key, &e, 30);
    assert_eq!(
        rs.sets[&set].spec,
        "type ipv4_addr; flags dynamic,timeout; timeout 30s;"
    );
    let chain = &rs.chains[&rules::service_chain(&sp.key)].rules;
    assert_eq!(
        chain[1],
        format!(
            "ip saddr @{set} goto {}",
            rules::endpoint_chain(&sp.key, &e)
        )
    );
    assert!(rs.chains[&rules::endpoint_chain(&sp.key, &e)]
        .rules
        .contains(&format!("update @{set} {{ ip saddr }}")));
    // Another timeout is another set, so the change needs no redeclaration.
    assert_ne!(set, rules::affinity_set(&sp.key, &e, 31));
}

#[test]
fn internal_traffic_policy_local() {
    let mut sp = port("web", [10, 96, 0, 10]);
    sp.internal_local = true;
    let rs = rules::desired(
        &one(sp.clone(), vec![ep(1, true, "n1"), ep(2, true, "n2")]),
        &node(),
    );
    let local = rules::local_chain(&sp.key);
    assert_eq!(
        element(&rs, "service-ips", "10.96.0.10 . tcp . 80"),
        Some(format!("goto {local}").as_str())
    );
    assert!(rs.chains[&local].rules[0].contains("numgen random mod 1"));
    assert!(!rs.chains.contains_key(&rules::service_chain(&sp.key)));
    assert!(!rs
        .chains
        .contains_key(&rules::endpoint_chain(&sp.key, &ep(2, true, "n2"))));
    // Endpoints only elsewhere: dropped, as upstream (not rejected).
    let rs = rules::desired(&one(sp.clone(), vec![ep(2, true, "n2")]), &node());
    assert_eq!(
        element(&rs, "no-endpoint-services", "10.96.0.10 . tcp . 80"),
        Some("drop")
    );
}

#[test]
fn node_ports_and_external_traffic_policy() {
    let mut sp = port("web", [10, 96, 0, 10]);
    sp.node_port = Some(30080);
    sp.external_ips = vec![Ipv4Addr::new(192, 0, 2, 50)];
    let eps = vec![ep(1, true, "n1"), ep(2, true, "n2")];
    let rs = rules::desired(&one(sp.clone(), eps.clone()), &node());
    let ext = rules::external_chain(&sp.key);
    let goto_ext = format!("goto {ext}");
    assert_eq!(
        element(&rs, "service-nodeports", "tcp . 30080"),
        Some(goto_ext.as_str())
    );
    assert_eq!(
        element(&rs, "service-ips", "192.0.2.50 . tcp . 80"),
        Some(goto_ext.as_str())
    );
    assert_eq!(
        rs.chains[&ext].rules,
        vec![
            "jump mark-for-masquerade".to_string(),
            format!("goto {}", rules::service_chain(&sp.key))
        ]
    );
    // Local: outside clients only to this node's endpoint, unmasqueraded.
    sp.external_local = true;
    let rs = rules::desired(&one(sp.clone(), eps.clone()), &node());
    let last = rs.chains[&ext].rules.last().unwrap().clone();
    assert_eq!(last, format!("goto {}", rules::local_chain(&sp.key)));
    assert!(!rs.chains[&ext]
        .rules
        .contains(&"jump mark-for-masquerade".to_string()));
    assert!(rs.chains[&rules::local_chain(&sp.key)].rules[0].contains("mod 1"));
    // The cluster IP still uses both.
    assert!(rs.chains[&rules::service_chain(&sp.key)].rules[1].contains("mod 2"));
    // No endpoint here: outside traffic is dropped, cluster-IP traffic still served.
    let rs = rules::desired(&one(sp.clone(), vec![ep(2, true, "n2")]), &node());
    assert_eq!(
        element(&rs, "no-endpoint-nodeports", "tcp . 30080"),
        Some("drop")
    );
    assert!(element(&rs, "service-ips", "10.96.0.10 . tcp . 80").is_some());
}

#[test]
fn node_ports_answer_on_loopback_only_with_route_localnet() {
    let nodeports = |rs: &Ruleset| -> String {
        rs.chains["services"]
            .rules
            .iter()
            .find(|r| r.contains("@service-nodeports"))
            .unwrap()
            .clone()
    };
    let guard = |rs: &Ruleset| {
        rs.chains["filter-input"].rules.iter().any(|r| {
            r.starts_with("ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8") && r.ends_with(" drop")
        })
    };
    let map = one(port("web", [10, 96, 0, 10]), vec![ep(1, true, "n1")]);
    // As kube-proxy's nftables mode: never on loopback, and no guard needed.
    let rs = rules::desired(&map, &node());
    assert!(nodeports(&rs).contains("ip daddr != 127.0.0.0/8"));
    assert!(!guard(&rs));
    // With route_localnet, as its iptables mode: on every local address, guarded.
    let mut localnet = node();
    localnet.route_localnet = true;
    let rs = rules::desired(&map, &localnet);
    assert!(!nodeports(&rs).contains("127.0.0.0/8"));
    assert!(rs.chains["service-endpoints-check"]
        .rules
        .iter()
        .all(|r| !r.contains("127.0.0.0/8")));
    assert!(guard(&rs));
    assert!(rs.chains["filter-output"]
        .rules
        .iter()
        .all(|r| !r.contains("drop")));
    // A translated loopback client leaving the loopback is masqueraded, whatever marked it.
    assert_eq!(
        rs.chains["masquerading"].rules[0],
        "ip saddr 127.0.0.0/8 oifname != \"lo\" ct status & dnat != 0 jump mark-for-masquerade"
    );
}

#[test]
fn loopback_endpoints_need_no_hairpin_masquerade() {
    let sp = port("web", [10, 96, 0, 10]);
    let mut e = ep(1, true, "n1");
    e.ip = Ipv4Addr::new(127, 0, 100, 7);
    let rs = rules::desired(&one(sp.clone(), vec![e.clone()]), &node());
    assert_eq!(
        rs.chains[&rules::endpoint_chain(&sp.key, &e)].rules,
        vec!["meta l4proto tcp dnat to 127.0.100.7:8080".to_string()]
    );
}

#[test]
fn an_endpoint_leaving_touches_only_its_service() {
    let a = port("a", [10, 96, 0, 10]);
    let b = port("b", [10, 96, 0, 11]);
    let mut before = one(a.clone(), vec![ep(1, true, "n1"), ep(2, true, "n1")]);
    before.insert(b.key.clone(), (b.clone(), vec![ep(3, true, "n1")]));
    let mut after = before.clone();
    after.get_mut(&a.key).unwrap().1[1].ready = false;
    let prev = rules::desired(&before, &node());
    let next = rules::desired(&after, &node());
    let ops = rules::partial_sync(&prev, &next);
    let gone = rules::endpoint_chain(&a.key, &ep(2, true, "n1"));
    let svc = rules::service_chain(&a.key);
    assert!(ops.contains(&Op::FlushChain(svc.clone())));
    assert!(ops.contains(&Op::DeleteChain(gone.clone())));
    assert!(
        ops.iter().all(|op| !format!("{op:?}").contains("ns/b/")),
        "{ops:?}"
    );
    assert_eq!(rules::partial_sync(&next, &next), Vec::<Op>::new());
}

#[test]
fn table_names_differ_per_identity() {
    let a = super::table_name("/var/lib/setpoint/a");
    let b = super::table_name("/var/lib/setpoint/b");
    assert_ne!(a, b);
    assert!(a.starts_with("setpoint-") && a.len() == "setpoint-".len() + 8);
    assert_eq!(a, super::table_name("/var/lib/setpoint/a"));
}

#[test]
fn listing_names() {
    let listing = "table ip t {\n\tmap service-ips {\n\t\ttype ipv4_addr : verdict\n\t}\n\tset affinity-X-ns/a {\n\t}\n\tchain services {\n\t\tip daddr 1.2.3.4 accept\n\t}\n\tchain nat-output {\n\t}\n}\n";
    let (chains, sets) = rules::parse_listing(listing);
    assert_eq!(
        chains,
        BTreeSet::from(["services".to_string(), "nat-output".to_string()])
    );
    assert_eq!(
        sets,
        BTreeMap::from([
            ("service-ips".to_string(), true),
            ("affinity-X-ns/a".to_string(), false)
        ])
    );
}

#[test]
fn services_and_slices_from_the_api() {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "type": "NodePort",
                 "sessionAffinity": "ClientIP", "externalTrafficPolicy": "Local",
                 "ports": [{"name": "http", "port": 80, "nodePort": 30080, "targetPort": 8080},
                           {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]}
    }))
    .unwrap();
    let ports = model::service_ports(&svc);
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0].key, key("web"));
    assert_eq!(ports[0].node_port, Some(30080));
    assert_eq!(
        ports[0].affinity_timeout,
        Some(model::DEFAULT_AFFINITY_TIMEOUT)
    );
    assert!(ports[0].external_local);
    assert_eq!(ports[1].key.protocol, Protocol::Udp);
    let headless: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "h"},
        "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
    }))
    .unwrap();
    assert!(model::service_ports(&headless).is_empty());
    let cluster_ip: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "c"},
        "spec": {"clusterIP": "10.96.0.11", "externalTrafficPolicy": "Local",
                 "ports": [{"port": 80, "nodePort": 30081}]}
    }))
    .unwrap();
    let c = model::service_ports(&cluster_ip);
    assert_eq!(
        (c[0].node_port, c[0].external_local),
        (None, false),
        "a ClusterIP Service has no node port"
    );
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "web-abc",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 5353, "protocol": "UDP"}],
        "endpoints": [
            {"addresses": ["10.244.0.1"], "nodeName": "n1"},
            {"addresses": ["10.244.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["10.244.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}}
        ]
    }))
    .unwrap();
    let map = model::service_map([&svc, &headless], [&slice]);
    assert_eq!(map.len(), 2);
    let (_, eps) = &map[&key("web")];
    assert_eq!(eps.len(), 2, "the same endpoint twice counts once");
    assert!(eps[0].ready && eps[0].serving && !eps[0].terminating);
    assert_eq!(eps[0].port, 8080);
    assert!(!eps[1].ready && eps[1].serving && eps[1].terminating);
    let dns = PortKey {
        port_name: "dns".into(),
        protocol: Protocol::Udp,
        ..key("web")
    };
    assert_eq!(map[&dns].1[0].port, 5353);
}

/// The kernel's table as far as the proxy's commands go, refusing what nft refuses: unknown
/// chains or sets, deleting a chain that has rules or is referenced, a set still referenced,
/// an element that is not there or is there with another value.
#[derive(Default, Debug)]
struct Kernel {
    rules: Ruleset,
}

fn references(text: &str) -> Vec<(bool, String)> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if (*w == "goto" || *w == "jump") && i + 1 < words.len() {
            out.push((true, words[i + 1].to_string()));
        }
        if let Some(set) = w.strip_prefix('@') {
            out.push((false, set.to_string()));
        }
    }
    out
}

impl Kernel {
    fn referenced(&self, chain: bool, name: &str) -> bool {
        let target = (chain, name.to_string());
        self.rules
            .chains
            .values()
            .flat_map(|c| c.rules.iter())
            .chain(self.rules.sets.values().flat_map(|s| s.elements.values()))
            .any(|t| references(t).contains(&target))
    }

    fn apply(&mut self, ops: &[Op]) -> Result<(), String> {
        // A transaction is all or nothing.
        let mut k = Kernel {
            rules: self.rules.clone(),
        };
        for op in ops {
            k.op(op).map_err(|e| format!("{op:?}: {e}"))?;
        }
        self.rules = k.rules;
        Ok(())
    }

    fn op(&mut self, op: &Op) -> Result<(), String> {
        let rs = &mut self.rules;
        match op {
            Op::AddTable => {}
            Op::FlushTable => {
                rs.chains.values_mut().for_each(|c| c.rules.clear());
                rs.sets.values_mut().for_each(|s| s.elements.clear());
            }
            Op::AddChain(name, base) => match rs.chains.get(name) {
                Some(c) if &c.base != base => return Err("chain exists, other hook".into()),
                Some(_) => {}
                None => {
                    rs.chains.insert(
                        name.clone(),
                        rules::Chain {
                            base: base.clone(),
                            rules: Vec::new(),
                        },
                    );
                }
            },
            Op::FlushChain(name) => rs
                .chains
                .get_mut(name)
                .ok_or("no such chain")?
                .rules
                .clear(),
            Op::DeleteChain(name) => {
                if !rs.chains.get(name).ok_or("no such chain")?.rules.is_empty() {
                    return Err("chain not empty".into());
                }
                if self.referenced(true, name) {
                    return Err("chain in use".into());
                }
                self.rules.chains.remove(name);
            }
            Op::AddSet(name, map, spec) => match rs.sets.get(name) {
                Some(s) if (&s.spec, s.map) != (spec, *map) => {
                    return Err("set exists, other spec".into())
                }
                Some(_) => {}
                None => {
                    rs.sets.insert(
                        name.clone(),
                        rules::Set {
                            map: *map,
                            spec: spec.clone(),
                            elements: BTreeMap::new(),
                        },
                    );
                }
            },
            Op::DeleteSet(name, _) => {
                rs.sets.get(name).ok_or("no such set")?;
                if self.referenced(false, name) {
                    return Err("set in use".into());
                }
                self.rules.sets.remove(name);
            }
            Op::AddRule(chain, rule) => {
                for (is_chain, target) in references(rule) {
                    let exists = if is_chain {
                        rs.chains.contains_key(&target)
                    } else {
                        rs.sets.contains_key(&target)
                    };
                    if !exists {
                        return Err(format!("rule refers to missing {target}"));
                    }
                }
                rs.chains
                    .get_mut(chain)
                    .ok_or("no such chain")?
                    .rules
                    .push(rule.clone());
            }
            Op::AddElement(set, key, value) => {
                for (_, target) in references(value) {
                    if !rs.chains.contains_key(&target) {
                        return Err(format!("element refers to missing {target}"));
                    }
                }
                let s = rs.sets.get_mut(set).ok_or("no such set")?;
                match s.elements.get(key) {
                    Some(v) if v != value => return Err("element exists".into()),
                    _ => {
                        s.elements.insert(key.clone(), value.clone());
                    }
                }
            }
            Op::DeleteElement(set, _, key) => {
                rs.sets
                    .get_mut(set)
                    .ok_or("no such set")?
                    .elements
                    .remove(key)
                    .ok_or("no such element")?;
            }
        }
        Ok(())
    }
}

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    (
        0u8..6,
        prop_oneof![Just(8080u16), Just(9090)],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just("n1"), Just("n2")],
        any::<bool>(),
    )
        .prop_map(
            |(last, port, ready, serving, terminating, n, lo)| Endpoint {
                ip: if lo {
                    Ipv4Addr::new(127, 0, 100, last)
                } else {
                    Ipv4Addr::new(10, 244, 0, last)
                },
                port,
                ready,
                serving,
                terminating,
                node_name: Some(n.into()),
            },
        )
}

fn arb_service() -> impl Strategy<Value = (ServicePort, Vec<Endpoint>)> {
    (
        0u8..4,
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp)],
        prop::option::of(prop_oneof![Just(30u32), Just(60)]),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(30000u16..30003),
        any::<bool>(),
        prop::collection::vec(arb_endpoint(), 0..5),
    )
        .prop_map(
            |(n, protocol, affinity, internal_local, external_local, node_port, ext_ip, eps)| {
                let key = PortKey {
                    namespace: "ns".into(),
                    name: format!("s{n}"),
                    port_name: String::new(),
                    protocol,
                };
                let external_ips = if ext_ip {
                    vec![Ipv4Addr::new(192, 0, 2, 50 + n)]
                } else {
                    Vec::new()
                };
                let external = node_port.is_some() || !external_ips.is_empty();
                let sp = ServicePort {
                    key,
                    cluster_ip: Ipv4Addr::new(10, 96, 0, 10 + n),
                    port: 80,
                    // Distinct per Service, as the API server allocates them.
                    node_port: node_port.map(|p| p + 10 * u16::from(n)),
                    external_ips,
                    affinity_timeout: affinity,
                    internal_local,
                    external_local: external_local && external,
                };
                (sp, eps)
            },
        )
}

fn arb_map() -> impl Strategy<Value = ServiceMap> {
    prop::collection::vec(arb_service(), 0..4).prop_map(|services| {
        let mut m = ServiceMap::new();
        for (sp, mut eps) in services {
            eps.sort();
            eps.dedup_by(|a, b| a.ip == b.ip && a.port == b.port);
            m.insert(sp.key.clone(), (sp, eps));
        }
        m
    })
}

fn arb_node() -> impl Strategy<Value = NodeInfo> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(cidr, bridge_netfilter, route_localnet)| NodeInfo {
            node_name: "n1".into(),
            cluster_cidr: cidr.then(|| "10.244.0.0/16".into()),
            bridge_netfilter,
            route_localnet,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Any sequence of changes applied incrementally leaves the table exactly as a full
    /// rebuild of the last state would, each transaction accepted by the model kernel.
    #[test]
    fn partial_syncs_equal_a_full_rebuild(
        node in arb_node(),
        states in prop::collection::vec(arb_map(), 1..6),
    ) {
        let mut kernel = Kernel::default();
        let first = rules::desired(&states[0], &node);
        kernel.apply(&rules::full_sync(&first, &BTreeSet::new(), &BTreeMap::new())).unwrap();
        prop_assert_eq!(&kernel.rules, &first);
        let mut prev = first;
        for state in &states[1..] {
            let next = rules::desired(state, &node);
            let ops = rules::partial_sync(&prev, &next);
            kernel.apply(&ops).map_err(TestCaseError::fail)?;
            prop_assert_eq!(&kernel.rules, &next);
            prev = next;
        }
    }

    /// A full sync over whatever an earlier run left (stale chains and sets, other
    /// elements) gives exactly the desired table.
    #[test]
    fn full_sync_replaces_any_leftover(
        node in arb_node(),
        old in arb_map(),
        new in arb_map(),
    ) {
        let mut kernel = Kernel::default();
        let before = rules::desired(&old, &node);
        kernel.apply(&rules::full_sync(&before, &BTreeSet::new(), &BTreeMap::new())).unwrap();
        let chains: BTreeSet<String> = kernel.rules.chains.keys().cloned().collect();
        let sets: BTreeMap<String, bool> =
            kernel.rules.sets.iter().map(|(k, s)| (k.clone(), s.map)).collect();
        let next = rules::desired(&new, &node);
        kernel.apply(&rules::full_sync(&next, &chains, &sets)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(&kernel.rules, &next);
    }

    /// Every reference in the desired ruleset names a chain or set it has.
    #[test]
    fn desired_rulesets_are_closed(node in arb_node(), map in arb_map()) {
        let rs = rules::desired(&map, &node);
        let texts = rs.chains.values().flat_map(|c| c.rules.iter())
            .chain(rs.sets.values().flat_map(|s| s.elements.values()));
        for t in texts {
            for (chain, name) in references(t) {
                prop_assert!(if chain { rs.chains.contains_key(&name) } else { rs.sets.contains_key(&name) },
                    "{} refers to missing {}", t, name);
            }
        }
    }
}
