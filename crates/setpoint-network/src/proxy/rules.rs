//! The node's nftables ruleset as data, computed purely from the Service map, and the
//! transactions that get the kernel there: a full one (at start and after a failure) and the
//! incremental one from the ruleset applied last (kube-proxy's partial sync, which touches only
//! the chains and map elements that changed).
//!
//! The layout is kube-proxy's nftables mode, in one table of our own:
//!
//! - base chains `nat-prerouting` (traffic arriving from pods' bridge or the network) and
//!   `nat-output` (traffic of the host itself, and of process pods, which share its network)
//!   jump to `services`; `nat-postrouting` jumps to `masquerading`;
//! - `services` looks up `ip daddr . meta l4proto . th dport` in the verdict map `service-ips`
//!   (cluster IPs, external IPs) and, for destinations local to the node (`fib daddr type
//!   local`), `meta l4proto . th dport` in `service-nodeports`;
//! - each Service port has a chain `service-…` that picks an endpoint with
//!   `numgen random mod N`, after the client's affinity entry if it has one; `local-…` does the
//!   same over the endpoints on this node (the `Local` traffic policies), `external-…` is where
//!   node ports and external IPs arrive;
//! - each endpoint has a chain `endpoint-…` that marks hairpin traffic for masquerade, records
//!   the client in the endpoint's affinity set, and DNATs;
//! - Service ports without usable endpoints are in `no-endpoint-services` /
//!   `no-endpoint-nodeports`, whose verdicts reject (or drop, for a `Local` policy with
//!   endpoints elsewhere) new connections in the filter hooks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::model::{usable, Endpoint, PortKey, ServiceMap, ServicePort};

/// The packet mark bit that asks `masquerading` to SNAT a packet: kube-proxy's default
/// `--masquerade-bit` 14.
pub const MASQUERADE_MARK: u32 = 0x4000;

/// What the rules depend on besides the Services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's name, compared with endpoints' `nodeName` for the `Local` policies.
    pub node_name: String,
    /// The pod network (`--cluster-cidr`): traffic to a cluster IP from outside it is
    /// masqueraded, as kube-proxy does when it knows the cluster CIDR. `None`: not masqueraded
    /// (hairpin traffic still is).
    pub cluster_cidr: Option<String>,
    /// Whether packets the pod bridge switches pass the IP hooks ([`super::bridge`]). Without
    /// it an endpoint's reply to a client pod on the same bridge never meets the connection's
    /// DNAT, so traffic from the pod network (`cluster_cidr`) to an endpoint is masqueraded
    /// instead, which sends the reply back through the host.
    pub bridge_netfilter: bool,
    /// Whether packets with a loopback source may be routed off the loopback
    /// (`route_localnet`, [`super::localnet`]). Node ports then answer on 127.0.0.0/8 too, as
    /// kube-proxy's iptables mode does with `--iptables-localhost-nodeports` (the local node
    /// of `setpoint up` has the address 127.0.0.1), and packets to 127.0.0.0/8 from
    /// elsewhere that no translation explains are dropped, as the kubelet does once the
    /// setting lets them in.
    pub route_localnet: bool,
}

/// A chain: its base-chain declaration (hook and priority) if it has one, and its rules.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Chain {
    /// `type nat hook output priority -100; policy accept;` for a base chain.
    pub base: Option<String>,
    /// The rules, in order.
    pub rules: Vec<String>,
}

/// A named set or verdict map: its declaration body and its elements (key → value; sets have
/// empty values).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Set {
    /// `true` for a map.
    pub map: bool,
    /// The declaration body: `type ipv4_addr; flags dynamic,timeout; timeout 10800s;`.
    pub spec: String,
    /// Elements: key → value (`goto service-…`), or key → "" for a set.
    pub elements: BTreeMap<String, String>,
}

/// One table's desired contents.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Ruleset {
    /// Chains by name.
    pub chains: BTreeMap<String, Chain>,
    /// Sets and maps by name.
    pub sets: BTreeMap<String, Set>,
}

/// One command of an `nft -f` transaction on our table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `add table`.
    AddTable,
    /// `flush table`: every chain's rules and every set's elements.
    FlushTable,
    /// `add chain`, with a base chain's declaration.
    AddChain(String, Option<String>),
    /// `flush chain`.
    FlushChain(String),
    /// `delete chain` (it must be empty and unreferenced).
    DeleteChain(String),
    /// `add set` / `add map` with its declaration body.
    AddSet(String, bool, String),
    /// `delete set` / `delete map`.
    DeleteSet(String, bool),
    /// `add rule`.
    AddRule(String, String),
    /// `add element`: set, key, value ("" for a set).
    AddElement(String, String, String),
    /// `delete element`: set, key.
    DeleteElement(String, bool, String),
}

impl Op {
    /// The command in `nft -f` syntax, on table `ip <table>`.
    pub fn render(&self, table: &str, out: &mut String) {
        let _ = match self {
            Op::AddTable => writeln!(out, "add table ip {table}"),
            Op::FlushTable => writeln!(out, "flush table ip {table}"),
            Op::AddChain(name, None) => writeln!(out, "add chain ip {table} {name}"),
            Op::AddChain(name, Some(base)) => {
                writeln!(out, "add chain ip {table} {name} {{ {base} }}")
            }
            Op::FlushChain(name) => writeln!(out, "flush chain ip {table} {name}"),
            Op::DeleteChain(name) => writeln!(out, "delete chain ip {table} {name}"),
            Op::AddSet(name, map, spec) => writeln!(
                out,
                "add {} ip {table} {name} {{ {spec} }}",
                if *map { "map" } else { "set" }
            ),
            Op::DeleteSet(name, map) => writeln!(
                out,
                "delete {} ip {table} {name}",
                if *map { "map" } else { "set" }
            ),
            Op::AddRule(chain, rule) => writeln!(out, "add rule ip {table} {chain} {rule}"),
            Op::AddElement(set, key, value) if value.is_empty() => {
                writeln!(out, "add element ip {table} {set} {{ {key} }}")
            }
            Op::AddElement(set, key, value) => {
                writeln!(out, "add element ip {table} {set} {{ {key} : {value} }}")
            }
            Op::DeleteElement(set, _, key) => {
                writeln!(out, "delete element ip {table} {set} {{ {key} }}")
            }
        };
    }
}

/// Renders a transaction for `nft -f -`.
pub fn render(table: &str, ops: &[Op]) -> String {
    let mut out = String::with_capacity(ops.len() * 80);
    for op in ops {
        op.render(table, &mut out);
    }
    out
}

const SERVICE_IPS: &str = "service-ips";
const SERVICE_NODEPORTS: &str = "service-nodeports";
const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";

/// A short, stable hash of `text`, in the base-32 alphabet kube-proxy's chain names use, so
/// that names stay unique when the readable part is cut or ambiguous.
pub fn short_hash(text: &str) -> String {
    // FNV-1a, 64 bits: stable across builds and platforms, which names on the kernel must be.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    (0..8)
        .map(|i| ALPHABET[((h >> (i * 5)) & 31) as usize] as char)
        .collect()
}

fn chain_name(prefix: &str, readable: &str) -> String {
    format!("{prefix}-{}-{readable}", short_hash(readable))
}

/// `service-<hash>-ns/name/tcp/port`: the chain that load-balances over all usable endpoints.
pub fn service_chain(key: &PortKey) -> String {
    chain_name("service", &key.chain_suffix())
}

/// `local-<hash>-…`: the chain over the usable endpoints on this node.
pub fn local_chain(key: &PortKey) -> String {
    chain_name("local", &key.chain_suffix())
}

/// `external-<hash>-…`: where node-port and external-IP traffic enters.
pub fn external_chain(key: &PortKey) -> String {
    chain_name("external", &key.chain_suffix())
}

/// `endpoint-<hash>-ns/name/tcp/port__ip/port`: one endpoint's DNAT.
pub fn endpoint_chain(key: &PortKey, ep: &Endpoint) -> String {
    chain_name(
        "endpoint",
        &format!("{}__{}", key.chain_suffix(), ep.chain_suffix()),
    )
}

/// `affinity-<hash>-…__ip/port`: the clients that stick to one endpoint. The timeout is part
/// of the hashed text, so a changed timeout is a new set rather than a redeclared one.
pub fn affinity_set(key: &PortKey, ep: &Endpoint, timeout: u32) -> String {
    let readable = format!("{}__{}", key.chain_suffix(), ep.chain_suffix());
    format!(
        "affinity-{}-{readable}",
        short_hash(&format!("{readable}@{timeout}"))
    )
}

fn base(kind: &str, hook: &str, priority: i32) -> Option<String> {
    Some(format!(
        "type {kind} hook {hook} priority {priority}; policy accept;"
    ))
}

/// The chains and maps every ruleset has, whatever the Services.
fn skeleton(rs: &mut Ruleset, node: &NodeInfo) {
    // Node ports answer on the node's addresses; on loopback only when packets from there
    // can reach endpoints off it (kube-proxy's nftables mode never, its iptables mode by
    // default).
    let node_addresses = if node.route_localnet {
        "fib daddr type local"
    } else {
        "fib daddr type local ip daddr != 127.0.0.0/8"
    };
    let chains = &mut rs.chains;
    // dstnat is -100, srcnat 100; the filter checks run just before DNAT as kube-proxy's do.
    chains.insert(
        "nat-prerouting".into(),
        Chain {
            base: base("nat", "prerouting", -100),
            rules: vec!["jump services".into()],
        },
    );
    chains.insert(
        "nat-output".into(),
        Chain {
            base: base("nat", "output", -100),
            rules: vec!["jump services".into()],
        },
    );
    chains.insert(
        "nat-postrouting".into(),
        Chain {
            base: base("nat", "postrouting", 100),
            rules: vec!["jump masquerading".into()],
        },
    );
    for (name, hook) in [
        ("filter-input", "input"),
        ("filter-forward", "forward"),
        ("filter-output", "output"),
    ] {
        let mut rules = Vec::new();
        if node.route_localnet && hook == "input" {
            // With route_localnet the kernel no longer drops packets addressed to loopback
            // that arrive from elsewhere: only those a translation of ours (or a connection
            // already there) explains come in, so nothing off this host reaches what listens
            // on 127.0.0.1 (CVE-2020-8558).
            rules.push(
                "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0 drop".into(),
            );
        }
        rules.push("ct state new jump service-endpoints-check".into());
        chains.insert(
            name.into(),
            Chain {
                base: base("filter", hook, -110),
                rules,
            },
        );
    }
    chains.insert(
        "service-endpoints-check".into(),
        Chain {
            base: None,
            rules: vec![
                format!("ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES}"),
                format!("{node_addresses} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}"),
            ],
        },
    );
    chains.insert(
        "reject-chain".into(),
        Chain {
            base: None,
            rules: vec!["reject".into()],
        },
    );
    chains.insert(
        "masquerading".into(),
        Chain {
            base: None,
            rules: vec![
                // A loopback client translated to an endpoint off the loopback (a node port
                // or load balancer on 127.0.0.1) must not keep its source, which the endpoint
                // would answer itself.
                format!(
                    "ip saddr 127.0.0.0/8 oifname != \"lo\" ct status & dnat != 0 jump {MARK_FOR_MASQUERADE}"
                ),
                format!("meta mark & {MASQUERADE_MARK:#x} == 0 return"),
                format!("meta mark set meta mark ^ {MASQUERADE_MARK:#x}"),
                // Loopback has no address to masquerade to: traffic to process pods on 127.x
                // keeps its source (which is the host's own, so replies come back anyway).
                "oifname \"lo\" return".into(),
                "masquerade fully-random".into(),
            ],
        },
    );
    chains.insert(
        MARK_FOR_MASQUERADE.into(),
        Chain {
            base: None,
            rules: vec![format!("meta mark set meta mark | {MASQUERADE_MARK:#x}")],
        },
    );
    chains.insert(
        "services".into(),
        Chain {
            base: None,
            rules: vec![
                format!("ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS}"),
                format!("{node_addresses} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
            ],
        },
    );
    let ip_map = "type ipv4_addr . inet_proto . inet_service : verdict;";
    let port_map = "type inet_proto . inet_service : verdict;";
    for (name, spec) in [
        (SERVICE_IPS, ip_map),
        (SERVICE_NODEPORTS, port_map),
        (NO_ENDPOINT_SERVICES, ip_map),
        (NO_ENDPOINT_NODEPORTS, port_map),
    ] {
        rs.sets.insert(
            name.into(),
            Set {
                map: true,
                spec: spec.into(),
                elements: BTreeMap::new(),
            },
        );
    }
}

fn element(rs: &mut Ruleset, set: &str, key: String, value: String) {
    if let Some(s) = rs.sets.get_mut(set) {
        s.elements.insert(key, value);
    }
}

/// A load-balancing chain over `endpoints` (non-empty), with affinity lookups first.
fn balance(sp: &ServicePort, endpoints: &[&Endpoint], prefix: Vec<String>) -> Chain {
    let mut rules = prefix;
    if let Some(timeout) = sp.affinity_timeout {
        for ep in endpoints {
            rules.push(format!(
                "ip saddr @{} goto {}",
                affinity_set(&sp.key, ep, timeout),
                endpoint_chain(&sp.key, ep)
            ));
        }
    }
    let targets: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| format!("{i} : goto {}", endpoint_chain(&sp.key, ep)))
        .collect();
    rules.push(format!(
        "numgen random mod {} vmap {{ {} }}",
        endpoints.len(),
        targets.join(" , ")
    ));
    Chain { base: None, rules }
}

fn endpoint(rs: &mut Ruleset, node: &NodeInfo, sp: &ServicePort, ep: &Endpoint) {
    let name = endpoint_chain(&sp.key, ep);
    if rs.chains.contains_key(&name) {
        return;
    }
    let mut rules = Vec::new();
    if !ep.ip.is_loopback() {
        // A pod reaching itself through the Service: without SNAT its reply would go straight
        // back to itself from its own address, which its connection does not expect.
        rules.push(format!("ip saddr {} jump {MARK_FOR_MASQUERADE}", ep.ip));
        if let (Some(cidr), false) = (&node.cluster_cidr, node.bridge_netfilter) {
            rules.push(format!("ip saddr {cidr} jump {MARK_FOR_MASQUERADE}"));
        }
    }
    if let Some(timeout) = sp.affinity_timeout {
        let set = affinity_set(&sp.key, ep, timeout);
        rs.sets.insert(
            set.clone(),
            Set {
                map: false,
                spec: format!("type ipv4_addr; flags dynamic,timeout; timeout {timeout}s;"),
                elements: BTreeMap::new(),
            },
        );
        rules.push(format!("update @{set} {{ ip saddr }}"));
    }
    rules.push(format!(
        "meta l4proto {} dnat to {}:{}",
        sp.key.protocol.nft(),
        ep.ip,
        ep.port
    ));
    rs.chains.insert(name, Chain { base: None, rules });
}

/// The desired ruleset for `node` given every Service port and its endpoints.
pub fn desired(services: &ServiceMap, node: &NodeInfo) -> Ruleset {
    let mut rs = Ruleset::default();
    skeleton(&mut rs, node);
    for (key, (sp, endpoints)) in services {
        let proto = key.protocol.nft();
        let cluster = usable(endpoints.iter());
        let local_all: Vec<&Endpoint> = endpoints
            .iter()
            .filter(|e| e.node_name.as_deref() == Some(node.node_name.as_str()))
            .collect();
        let local = usable(local_all.iter().copied());
        // Where cluster-IP traffic goes, or what becomes of it with nowhere to go: upstream
        // drops it when a `Local` policy has endpoints only elsewhere, and rejects it when the
        // Service has no endpoints at all.
        let internal: Result<String, &str> = if sp.internal_local {
            if !local.is_empty() {
                Ok(local_chain(key))
            } else if cluster.is_empty() {
                Err("goto reject-chain")
            } else {
                Err("drop")
            }
        } else if !cluster.is_empty() {
            Ok(service_chain(key))
        } else {
            Err("goto reject-chain")
        };
        // Cluster-IP traffic uses every endpoint unless its policy is `Local`; node ports and
        // external IPs always may (a `Local` external policy still sends the node's own
        // clients to every endpoint).
        let needs_cluster_chain = !cluster.is_empty() && (!sp.internal_local || sp.is_external());
        if needs_cluster_chain {
            let mut prefix = Vec::new();
            if let Some(cidr) = &node.cluster_cidr {
                prefix.push(format!(
                    "ip daddr {} {proto} dport {} ip saddr != {cidr} jump {MARK_FOR_MASQUERADE}",
                    sp.cluster_ip, sp.port
                ));
            }
            for ep in &cluster {
                endpoint(&mut rs, node, sp, ep);
            }
            rs.chains
                .insert(service_chain(key), balance(sp, &cluster, prefix));
        }
        if !local.is_empty() && (sp.internal_local || sp.external_local) {
            for ep in &local {
                endpoint(&mut rs, node, sp, ep);
            }
            rs.chains
                .insert(local_chain(key), balance(sp, &local, Vec::new()));
        }
        let ip_key = format!("{} . {proto} . {}", sp.cluster_ip, sp.port);
        match &internal {
            Ok(chain) => element(&mut rs, SERVICE_IPS, ip_key, format!("goto {chain}")),
            Err(verdict) => element(&mut rs, NO_ENDPOINT_SERVICES, ip_key, verdict.to_string()),
        }
        if !sp.is_external() {
            continue;
        }
        // Node ports and external IPs.
        let external: Result<String, &str> = if cluster.is_empty() {
            Err("goto reject-chain")
        } else if sp.external_local && local.is_empty() {
            Err("drop")
        } else {
            Ok(external_chain(key))
        };
        if let Ok(chain) = &external {
            let mut rules = Vec::new();
            if sp.external_local {
                // Pods and the node itself are not "external": their traffic may use every
                // endpoint; only the node's own traffic needs SNAT to come back through here.
                if let Some(cidr) = &node.cluster_cidr {
                    rules.push(format!("ip saddr {cidr} goto {}", service_chain(key)));
                }
                rules.push(format!("fib saddr type local jump {MARK_FOR_MASQUERADE}"));
                rules.push(format!("fib saddr type local goto {}", service_chain(key)));
                rules.push(format!("goto {}", local_chain(key)));
            } else {
                // Traffic from outside must come back through this node: SNAT it.
                rules.push(format!("jump {MARK_FOR_MASQUERADE}"));
                rules.push(format!("goto {}", service_chain(key)));
            }
            rs.chains.insert(chain.clone(), Chain { base: None, rules });
        }
        let (map_ips, map_ports, value) = match &external {
            Ok(chain) => (SERVICE_IPS, SERVICE_NODEPORTS, format!("goto {chain}")),
            Err(verdict) => (
                NO_ENDPOINT_SERVICES,
                NO_ENDPOINT_NODEPORTS,
                verdict.to_string(),
            ),
        };
        for ip in &sp.external_ips {
            element(
                &mut rs,
                map_ips,
                format!("{ip} . {proto} . {}", sp.port),
                value.clone(),
            );
        }
        if let Some(np) = sp.node_port {
            element(&mut rs, map_ports, format!("{proto} . {np}"), value);
        }
    }
    rs
}

/// The transaction that replaces whatever the table holds with `next`. `existing_chains` and
/// `existing_sets` are what the kernel's table has now (empty if it does not exist): stale ones
/// are deleted. Established connections survive it: their NAT is in conntrack, not in the
/// rules, and the whole replacement is one atomic transaction.
pub fn full_sync(
    next: &Ruleset,
    existing_chains: &BTreeSet<String>,
    existing_sets: &BTreeMap<String, bool>,
) -> Vec<Op> {
    let mut ops = vec![Op::AddTable, Op::FlushTable];
    for (name, map) in existing_sets {
        // Sets are recreated so their declarations are ours (after the flush nothing
        // references them); affinity entries are lost, as in kube-proxy's full syncs.
        ops.push(Op::DeleteSet(name.clone(), *map));
    }
    for (name, chain) in &next.chains {
        ops.push(Op::AddChain(name.clone(), chain.base.clone()));
    }
    for name in existing_chains {
        if !next.chains.contains_key(name) {
            ops.push(Op::DeleteChain(name.clone()));
        }
    }
    for (name, set) in &next.sets {
        ops.push(Op::AddSet(name.clone(), set.map, set.spec.clone()));
    }
    for (name, chain) in &next.chains {
        for rule in &chain.rules {
            ops.push(Op::AddRule(name.clone(), rule.clone()));
        }
    }
    for (name, set) in &next.sets {
        for (k, v) in &set.elements {
            ops.push(Op::AddElement(name.clone(), k.clone(), v.clone()));
        }
    }
    ops
}

/// The transaction from `prev` (what was applied last) to `next`: new chains and sets are
/// created, changed chains flushed and refilled, map elements added, replaced or deleted, and
/// chains and sets nothing uses any more deleted once nothing references them. Empty when
/// nothing changed.
pub fn partial_sync(prev: &Ruleset, next: &Ruleset) -> Vec<Op> {
    let mut ops = Vec::new();
    // 1. Everything new exists before anything refers to it.
    for (name, chain) in &next.chains {
        if !prev.chains.contains_key(name) {
            ops.push(Op::AddChain(name.clone(), chain.base.clone()));
        }
    }
    for (name, set) in &next.sets {
        if !prev.sets.contains_key(name) {
            ops.push(Op::AddSet(name.clone(), set.map, set.spec.clone()));
        }
    }
    // 2. References to what goes away are removed: changed and removed chains are flushed,
    //    changed and removed elements deleted.
    let mut refill = Vec::new();
    for (name, chain) in &prev.chains {
        match next.chains.get(name) {
            Some(n) if n.rules == chain.rules => {}
            Some(_) => {
                ops.push(Op::FlushChain(name.clone()));
                refill.push(name.clone());
            }
            None => {
                if !chain.rules.is_empty() {
                    ops.push(Op::FlushChain(name.clone()));
                }
            }
        }
    }
    for name in next.chains.keys() {
        if !prev.chains.contains_key(name) {
            refill.push(name.clone());
        }
    }
    for (name, set) in &prev.sets {
        let Some(n) = next.sets.get(name) else {
            continue;
        };
        // A set's own dynamic entries (affinity) are the kernel's: only the elements we wrote
        // are diffed, and affinity sets have none.
        for (k, v) in &set.elements {
            if n.elements.get(k) != Some(v) {
                ops.push(Op::DeleteElement(name.clone(), set.map, k.clone()));
            }
        }
    }
    // 3. Now unreferenced, the removed chains and sets go.
    for name in prev.chains.keys() {
        if !next.chains.contains_key(name) {
            ops.push(Op::DeleteChain(name.clone()));
        }
    }
    for (name, set) in &prev.sets {
        if !next.sets.contains_key(name) {
            ops.push(Op::DeleteSet(name.clone(), set.map));
        }
    }
    // 4. Rules and elements of what is new or changed.
    for name in &refill {
        for rule in &next.chains[name].rules {
            ops.push(Op::AddRule(name.clone(), rule.clone()));
        }
    }
    for (name, set) in &next.sets {
        let old = prev.sets.get(name);
        for (k, v) in &set.elements {
            if old.and_then(|o| o.elements.get(k)) != Some(v) {
                ops.push(Op::AddElement(name.clone(), k.clone(), v.clone()));
            }
        }
    }
    ops
}

/// The names of the chains and sets in `nft list table` output: what a full sync must delete
/// when the desired ruleset no longer has them.
pub fn parse_listing(listing: &str) -> (BTreeSet<String>, BTreeMap<String, bool>) {
    let mut chains = BTreeSet::new();
    let mut sets = BTreeMap::new();
    for line in listing.lines() {
        let mut words = line.split_whitespace();
        let (Some(kind), Some(name), Some("{")) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let name = name.trim_matches('"').to_string();
        match kind {
            "chain" => {
                chains.insert(name);
            }
            "set" => {
                sets.insert(name, false);
            }
            "map" => {
                sets.insert(name, true);
            }
            _ => {}
        }
    }
    (chains, sets)
}
