//! What the server allocates to objects beyond their own key, reserved in the store so that
//! two objects never share it: a Service's cluster IP (from 10.96.0.0/12, the `kubernetes`
//! service keeping 10.96.0.1) and its node ports (from `--service-node-port-range`,
//! 30000-32767 by default: every port of a `NodePort` Service, of a `LoadBalancer` one unless
//! `allocateLoadBalancerNodePorts` is false, and the `healthCheckNodePort` of a
//! `LoadBalancer` with `externalTrafficPolicy: Local`), as upstream's service REST storage
//! allocates them.
//!
//! The generic write path asks [`ApiServer::allocate_for`] before it stores a new object and
//! [`ApiServer::allocate_for_update`] before it stores a changed one, [`ApiServer::release`]
//! when that store fails, [`ApiServer::release_unused`] once an update is stored, and
//! [`ApiServer::release_held`] once an object is gone; which kinds allocate what is decided
//! here alone. [`carry_over`] keeps what an update leaves out, as upstream does.

use std::collections::BTreeSet;

use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_api::{meta, ApiError, Cause};
use setpoint_store::{Precondition, RangeRequest, StoreError};

use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// Where allocated service cluster IPs are reserved, so two services never share one.
const SERVICE_IP_PREFIX: &str = "/registry/_allocations/serviceips/";

/// Where allocated node ports are reserved, so two services never share one.
const NODE_PORT_PREFIX: &str = "/registry/_allocations/nodeports/";

/// What a write reserved, to be given back if the write does not happen.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    /// A Service's cluster IP.
    cluster_ip: Option<String>,
    /// A Service's node ports.
    node_ports: Vec<u16>,
}

impl Reservation {
    /// A reservation of one cluster IP.
    pub(crate) fn cluster_ip(ip: &str) -> Reservation {
        Reservation {
            cluster_ip: Some(ip.to_string()),
            node_ports: vec![],
        }
    }

    fn is_empty(&self) -> bool {
        self.cluster_ip.is_none() && self.node_ports.is_empty()
    }
}

/// What a stored Service holds of the allocators.
#[derive(Debug, Default, PartialEq, Eq)]
struct Held {
    cluster_ip: Option<String>,
    node_ports: BTreeSet<u16>,
}

fn held(svc: &Value) -> Held {
    let spec = svc.get("spec").unwrap_or(&Value::Null);
    let cluster_ip = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .map(str::to_string);
    let mut node_ports: BTreeSet<u16> = ports(spec)
        .iter()
        .filter_map(|p| port_number(p, "nodePort"))
        .collect();
    node_ports.extend(port_number(spec, "healthCheckNodePort"));
    Held {
        cluster_ip,
        node_ports,
    }
}

fn ports(spec: &Value) -> &[Value] {
    spec.get("ports")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn port_number(v: &Value, field: &str) -> Option<u16> {
    v.get(field)
        .and_then(Value::as_i64)
        .filter(|n| *n != 0)
        .and_then(|n| u16::try_from(n).ok())
}

fn service_type(spec: &Value) -> &str {
    spec.get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
}

/// Whether a Service's ports get node ports (upstream's `needsNodePort`).
fn needs_node_ports(spec: &Value) -> bool {
    match service_type(spec) {
        "NodePort" => true,
        "LoadBalancer" => spec
            .get("allocateLoadBalancerNodePorts")
            .and_then(Value::as_bool)
            .unwrap_or(true),
        _ => false,
    }
}

/// Whether a Service gets a `healthCheckNodePort` (upstream's `needsHCNodePort`).
fn needs_health_check_node_port(spec: &Value) -> bool {
    service_type(spec) == "LoadBalancer"
        && spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local")
}

/// Keeps in an updated Service what the update left out and the server had allocated, and
/// drops what its new type no longer uses when the update left it as it was: upstream's
/// `patchAllocatedValues` and `dropTypeDependentFields`. A `kubectl replace` of a manifest
/// without `clusterIP` or `nodePort`s keeps them.
pub(crate) fn carry_over(res: &ResourceDef, new: &mut Value, old: &Value) {
    if is_service(res) {
        carry_over_service(new, old);
    }
}

fn carry_over_service(new: &mut Value, old: &Value) {
    let old_spec = old.get("spec").cloned().unwrap_or(Value::Null);
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let new_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    let old_type = service_type(&old_spec).to_string();
    let unset = |v: Option<&Value>| v.and_then(Value::as_str).is_none_or(str::is_empty);
    if new_type != "ExternalName" && old_type != "ExternalName" && unset(spec.get("clusterIP")) {
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if let Some(v) = old_spec.get(field) {
                spec.entry(field).or_insert(v.clone());
            }
        }
        spec.insert("clusterIP".into(), old_spec["clusterIP"].clone());
    }
    if new_type == "ExternalName"
        && old_type != "ExternalName"
        && spec.get("clusterIP") == old_spec.get("clusterIP")
    {
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            spec.remove(field);
        }
    }
    let spec_now = Value::Object(spec.clone());
    let old_needs = needs_node_ports(&old_spec);
    let new_needs = needs_node_ports(&spec_now);
    if old_needs && new_needs {
        let used_new: BTreeSet<u16> = ports(&spec_now)
            .iter()
            .filter_map(|p| port_number(p, "nodePort"))
            .collect();
        let old_ports = ports(&old_spec);
        if let Some(new_ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for p in new_ports.iter_mut() {
                if port_number(p, "nodePort").is_some() {
                    continue;
                }
                let name = p.get("name").and_then(Value::as_str).unwrap_or("");
                let old_value = old_ports
                    .iter()
                    .find(|o| o.get("name").and_then(Value::as_str).unwrap_or("") == name)
                    .and_then(|o| port_number(o, "nodePort"));
                if let (Some(np), Some(obj)) = (old_value, p.as_object_mut()) {
                    if !used_new.contains(&np) {
                        obj.insert("nodePort".into(), json!(np));
                    }
                }
            }
        }
    } else if old_needs && !new_needs {
        // Switching to a type without node ports: the ones the update kept unchanged go.
        let old_ports = ports(&old_spec);
        if let Some(new_ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            let same = new_ports.len() == old_ports.len()
                && new_ports
                    .iter()
                    .zip(old_ports)
                    .all(|(n, o)| port_number(n, "nodePort") == port_number(o, "nodePort"));
            if same {
                for p in new_ports.iter_mut().filter_map(Value::as_object_mut) {
                    p.remove("nodePort");
                }
            }
        }
    }
    let old_hc = port_number(&old_spec, "healthCheckNodePort");
    let new_hc = port_number(&spec_now, "healthCheckNodePort");
    if needs_health_check_node_port(&spec_now) {
        if new_hc.is_none() && needs_health_check_node_port(&old_spec) {
            if let Some(hc) = old_hc {
                spec.insert("healthCheckNodePort".into(), json!(hc));
            }
        }
    } else if new_hc.is_some() && new_hc == old_hc {
        spec.remove("healthCheckNodePort");
    }
}

impl ApiServer {
    /// Allocates what a new object of `res` needs (a Service's cluster IP and node ports),
    /// writing it into the object. `None` when the kind or the object needs nothing.
    pub(crate) async fn allocate_for(
        &self,
        res: &ResourceDef,
        obj: &mut Value,
    ) -> Result<Option<Reservation>, ApiError> {
        if !is_service(res) {
            return Ok(None);
        }
        let mut reservation = Reservation {
            cluster_ip: self.allocate_cluster_ip(obj).await?,
            node_ports: vec![],
        };
        if let Err(e) = self
            .allocate_node_ports(obj, &BTreeSet::new(), &mut reservation)
            .await
        {
            self.release(&reservation).await;
            return Err(e);
        }
        Ok((!reservation.is_empty()).then_some(reservation))
    }

    /// Allocates what an updated Service needs and `old` did not hold: a cluster IP when it
    /// leaves `ExternalName`, node ports when it becomes a `NodePort` or gains ports.
    pub(crate) async fn allocate_for_update(
        &self,
        res: &ResourceDef,
        new: &mut Value,
        old: &Value,
    ) -> Result<Option<Reservation>, ApiError> {
        if !is_service(res) {
            return Ok(None);
        }
        let before = held(old);
        let mut reservation = Reservation::default();
        // Validation keeps a held cluster IP unchanged; one leaving `ExternalName` needs one.
        if before.cluster_ip.is_none() {
            reservation.cluster_ip = self.allocate_cluster_ip(new).await?;
        }
        if let Err(e) = self
            .allocate_node_ports(new, &before.node_ports, &mut reservation)
            .await
        {
            self.release(&reservation).await;
            return Err(e);
        }
        Ok((!reservation.is_empty()).then_some(reservation))
    }

    /// Gives back what [`Self::allocate_for`] reserved for an object that was not stored.
    pub(crate) async fn release(&self, reservation: &Reservation) {
        if let Some(ip) = &reservation.cluster_ip {
            self.release_cluster_ip(ip).await;
        }
        for port in &reservation.node_ports {
            self.release_node_port(*port).await;
        }
    }

    /// Gives back what `old` held and its stored update `new` no longer holds.
    pub(crate) async fn release_unused(&self, res: &ResourceDef, old: &Value, new: &Value) {
        if !is_service(res) {
            return;
        }
        let (before, after) = (held(old), held(new));
        if let Some(ip) = before
            .cluster_ip
            .filter(|ip| after.cluster_ip.as_ref() != Some(ip))
        {
            self.release_cluster_ip(&ip).await;
        }
        for port in before.node_ports.difference(&after.node_ports) {
            self.release_node_port(*port).await;
        }
    }

    /// Gives back what a removed object held (a Service's cluster IP and node ports).
    pub(crate) async fn release_held(&self, res: &ResourceDef, obj: &Value) {
        if is_service(res) {
            let held = held(obj);
            if let Some(ip) = held.cluster_ip {
                self.release_cluster_ip(&ip).await;
            }
            for port in held.node_ports {
                self.release_node_port(port).await;
            }
        }
    }

    /// Gives every port of `svc` that needs a node port one, reserving those not already in
    /// `held` (what the stored object holds), and the `healthCheckNodePort` likewise. What
    /// this reserves is added to `reservation`.
    async fn allocate_node_ports(
        &self,
        svc: &mut Value,
        held: &BTreeSet<u16>,
        reservation: &mut Reservation,
    ) -> Result<(), ApiError> {
        let spec = svc.get("spec").cloned().unwrap_or(Value::Null);
        let name = meta::name(svc).to_string();
        let mut taken: BTreeSet<u16> = BTreeSet::new();
        let mut wanted: Vec<(String, Option<u16>)> = vec![];
        if needs_node_ports(&spec) {
            for (i, p) in ports(&spec).iter().enumerate() {
                wanted.push((
                    format!("spec.ports[{i}].nodePort"),
                    port_number(p, "nodePort"),
                ));
            }
        }
        if needs_health_check_node_port(&spec) {
            let hc = port_number(&spec, "healthCheckNodePort");
            wanted.push(("spec.healthCheckNodePort".into(), hc));
        }
        let mut assigned: Vec<Option<u16>> = Vec::with_capacity(wanted.len());
        // Ports the user named first, so a random pick never takes one of them.
        for (path, port) in &wanted {
            let Some(port) = *port else {
                assigned.push(None);
                continue;
            };
            // The same node port for two protocols of one Service is one reservation.
            if !held.contains(&port) && taken.insert(port) {
                self.reserve_node_port(port, path, &name).await.map(|()| {
                    reservation.node_ports.push(port);
                })?;
            } else {
                taken.insert(port);
            }
            assigned.push(Some(port));
        }
        for slot in assigned.iter_mut().filter(|s| s.is_none()) {
            let port = self.allocate_random_node_port(&taken).await?;
            reservation.node_ports.push(port);
            taken.insert(port);
            *slot = Some(port);
        }
        let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(());
        };
        let mut assigned = assigned.into_iter().flatten();
        if needs_node_ports(&Value::Object(spec.clone())) {
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    if let Some(port) = assigned.next() {
                        p.insert("nodePort".into(), json!(port));
                    }
                }
            }
        }
        if let Some(port) = assigned.next() {
            spec.insert("healthCheckNodePort".into(), json!(port));
        }
        Ok(())
    }

    /// Reserves a node port the user asked for, with upstream's errors when it is outside the
    /// range or taken.
    async fn reserve_node_port(&self, port: u16, path: &str, name: &str) -> Result<(), ApiError> {
        let range = &self.config.service_node_port_range;
        let invalid = |msg: String| {
            ApiError::invalid(
                "",
                "Service",
                name,
                vec![Cause::invalid(path, &json!(port), &msg)],
            )
        };
        if !range.contains(&port) {
            return Err(invalid(format!(
                "provided port is not in the valid range. The range of valid ports is {}-{}",
                range.start(),
                range.end()
            )));
        }
        match self
            .store
            .put(
                &format!("{NODE_PORT_PREFIX}{port}"),
                Bytes::from_static(b"{}"),
                Precondition::NotExists,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(StoreError::AlreadyExists { .. }) => {
                Err(invalid("provided port is already allocated".into()))
            }
            Err(e) => Err(ApiError::internal(e.to_string())),
        }
    }

    /// Reserves a free node port: random picks first (as upstream's allocator picks at random),
    /// then, when those collide, the first free one after reading what is taken.
    async fn allocate_random_node_port(&self, taken: &BTreeSet<u16>) -> Result<u16, ApiError> {
        let (lo, hi) = (
            *self.config.service_node_port_range.start(),
            *self.config.service_node_port_range.end(),
        );
        let size = u32::from(hi - lo) + 1;
        let random = (0..8).map(|_| lo + (rand::random::<u32>() % size) as u16);
        let try_port = |port: u16| async move {
            match self
                .store
                .put(
                    &format!("{NODE_PORT_PREFIX}{port}"),
                    Bytes::from_static(b"{}"),
                    Precondition::NotExists,
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(StoreError::AlreadyExists { .. }) => Ok(false),
                Err(e) => Err(ApiError::internal(e.to_string())),
            }
        };
        for port in random {
            if !taken.contains(&port) && try_port(port).await? {
                return Ok(port);
            }
        }
        let listed = self
            .store
            .range(RangeRequest {
                prefix: NODE_PORT_PREFIX.into(),
                start_after: None,
                revision: None,
                limit: None,
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let used: BTreeSet<u16> = listed
            .kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(NODE_PORT_PREFIX)?.parse().ok())
            .collect();
        for port in lo..=hi {
            if !used.contains(&port) && !taken.contains(&port) && try_port(port).await? {
                return Ok(port);
            }
        }
        Err(ApiError::internal(
            "failed to allocate a nodePort: range is full",
        ))
    }

    async fn release_node_port(&self, port: u16) {
        let _ = self
            .store
            .delete(&format!("{NODE_PORT_PREFIX}{port}"), Precondition::None)
            .await;
    }

    /// Reserves a cluster IP for a Service that needs one (type other than ExternalName,
    /// `clusterIP` unset). Returns the reserved address.
    async fn allocate_cluster_ip(&self, svc: &mut Value) -> Result<Option<String>, ApiError> {
        let ty = svc
            .pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if ty == "ExternalName" {
            return Ok(None);
        }
        let requested = svc
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if requested == "None" {
            return Ok(None);
        }
        let candidates: Vec<String> = if !requested.is_empty() {
            vec![requested.clone()]
        } else {
            dynamic_candidates(rand::random::<u32>())
        };
        for ip in candidates {
            let key = format!("{SERVICE_IP_PREFIX}{ip}");
            match self
                .store
                .put(&key, Bytes::from_static(b"{}"), Precondition::NotExists)
                .await
            {
                Ok(_) => {
                    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.insert("clusterIP".into(), json!(ip));
                        spec.insert("clusterIPs".into(), json!([ip]));
                    }
                    return Ok(Some(ip));
                }
                Err(StoreError::AlreadyExists { .. }) => {
                    if !requested.is_empty() {
                        return Err(ApiError::invalid(
                            "",
                            "Service",
                            meta::name(svc),
                            vec![Cause::invalid(
                                "spec.clusterIPs",
                                &json!([requested]),
                                &format!("failed to allocate IP {requested}: provided IP is already allocated"),
                            )],
                        ));
                    }
                }
                Err(e) => return Err(ApiError::internal(e.to_string())),
            }
        }
        Err(ApiError::internal(
            "failed to allocate a service cluster IP: range is full",
        ))
    }

    async fn release_cluster_ip(&self, ip: &str) {
        let _ = self
            .store
            .delete(&format!("{SERVICE_IP_PREFIX}{ip}"), Precondition::None)
            .await;
    }
}

fn is_service(res: &ResourceDef) -> bool {
    res.group.is_empty() && res.plural == "services"
}

/// The addresses at the bottom of 10.96.0.0/12 that dynamic allocation leaves to Services
/// naming their cluster IP: upstream's `min(max(16, size/16), 256)`.
const STATIC_BAND: u32 = 256;

/// 64 addresses to try for a Service that names none, spread from `seed`: from the upper
/// band of 10.96.0.0/12 (broadcast excluded), as upstream allocates dynamically (KEP-3070),
/// so the lower band stays for Services that ask for an address, such as `kubernetes`
/// (10.96.0.1) and kube-dns (10.96.0.10).
fn dynamic_candidates(seed: u32) -> Vec<String> {
    let upper = (1u32 << 20) - 1 - STATIC_BAND;
    let start = seed % upper;
    (0..64)
        .map(|i| ip_in_range((start + i * 7919) % upper + STATIC_BAND))
        .collect()
}

/// The `n`th address of 10.96.0.0/12.
fn ip_in_range(n: u32) -> String {
    let base: u32 = (10 << 24) | (96 << 16);
    let ip = base + n;
    format!(
        "{}.{}.{}.{}",
        ip >> 24,
        (ip >> 16) & 255,
        (ip >> 8) & 255,
        ip & 255
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_keeps_what_it_leaves_out_and_drops_what_its_type_no_longer_uses() {
        let old = json!({"spec": {"type": "NodePort", "clusterIP": "10.96.3.4",
            "clusterIPs": ["10.96.3.4"],
            "ports": [{"name": "a", "port": 80, "nodePort": 30001},
                      {"name": "b", "port": 81, "nodePort": 30002}]}});
        // Left out: kept, matched by port name; a port the user gave keeps its own value.
        let mut new = json!({"spec": {"type": "NodePort",
            "ports": [{"name": "b", "port": 81}, {"name": "a", "port": 80, "nodePort": 30009}]}});
        carry_over_service(&mut new, &old);
        assert_eq!(new["spec"]["clusterIP"], "10.96.3.4");
        assert_eq!(new["spec"]["clusterIPs"], json!(["10.96.3.4"]));
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30002);
        assert_eq!(new["spec"]["ports"][1]["nodePort"], 30009);
        // An old value another port now uses is not patched in twice.
        let mut new = json!({"spec": {"type": "NodePort",
            "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81, "nodePort": 30001}]}});
        carry_over_service(&mut new, &old);
        assert_eq!(new["spec"]["ports"][0].get("nodePort"), None);
        // To ClusterIP with the ports unchanged: they go.
        let mut new = old.clone();
        new["spec"]["type"] = json!("ClusterIP");
        carry_over_service(&mut new, &old);
        assert_eq!(held(&new).node_ports, BTreeSet::new());
        assert_eq!(held(&new).cluster_ip.as_deref(), Some("10.96.3.4"));
        // To ExternalName with the cluster IP unchanged: it goes.
        let mut new = old.clone();
        new["spec"]["type"] = json!("ExternalName");
        carry_over_service(&mut new, &old);
        assert_eq!(new["spec"].get("clusterIP"), None);
        assert_eq!(new["spec"].get("clusterIPs"), None);
    }

    #[test]
    fn what_a_service_holds() {
        let lb = json!({"spec": {"type": "LoadBalancer", "clusterIP": "None",
            "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"},
                      {"port": 80, "nodePort": 30080, "protocol": "UDP"}]}});
        assert_eq!(
            held(&lb),
            Held {
                cluster_ip: None,
                node_ports: BTreeSet::from([30080, 31000])
            }
        );
        assert!(needs_node_ports(&lb["spec"]));
        assert!(needs_health_check_node_port(&lb["spec"]));
        let no = json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false});
        assert!(!needs_node_ports(&no));
        assert!(!needs_node_ports(&json!({})));
    }

    #[test]
    fn dynamic_cluster_ips_leave_the_static_band() {
        for seed in [0, 1, 9, 255, 12_345, (1 << 20) - 258, u32::MAX] {
            for ip in dynamic_candidates(seed) {
                let n =
                    u32::from(ip.parse::<std::net::Ipv4Addr>().unwrap()) - (10 << 24 | 96 << 16);
                assert!(
                    (STATIC_BAND..(1 << 20) - 1).contains(&n),
                    "{ip} from {seed}"
                );
            }
        }
    }

    #[test]
    fn service_ips_stay_in_range() {
        assert_eq!(ip_in_range(1), "10.96.0.1");
        assert_eq!(ip_in_range((1 << 20) - 1), "10.111.255.255");
    }
}
