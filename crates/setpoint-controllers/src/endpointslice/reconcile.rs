//! The pure decision of the EndpointSlice controller: the endpoints a Service should have
//! ([`desired`]) and the creates, updates and deletes that bring its slices there with the
//! least churn ([`plan`]), the way upstream's `endpointslice` reconciler does it:
//!
//! 1. endpoints are grouped by the ports they resolve to (a named `targetPort` can mean a
//!    different number on each pod), one group of slices per port mapping;
//! 2. an existing slice keeps the endpoints that are still wanted (updated in place when one
//!    changed), loses those that are not, and is deleted once empty;
//! 3. new endpoints fill the slices already being updated, then one unchanged slice that has
//!    room for all of them, and only then go to new slices, at most `max_per_slice` each;
//! 4. a new slice reuses a slice about to be deleted (an update instead of a delete and a
//!    create);
//! 5. a Service with no endpoints keeps one empty placeholder slice.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::pods::{
    self, HEADLESS_LABEL, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TRIGGER_TIME_ANNOTATION,
};

/// The value of the managed-by label on the slices this controller owns.
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The address type of every slice this controller writes.
pub const ADDRESS_TYPE: &str = "IPv4";

/// The endpoints a Service should have, grouped by the ports they resolve to (the key is
/// [`port_key`] of the ports).
pub type Desired = BTreeMap<String, (Vec<EndpointPort>, Vec<Endpoint>)>;

/// A canonical text for a list of ports, equal for the same ports in any order.
pub fn port_key(ports: &[EndpointPort]) -> String {
    let mut sorted: Vec<String> = ports
        .iter()
        .map(|p| serde_json::to_string(p).unwrap_or_default())
        .collect();
    sorted.sort();
    sorted.join("|")
}

/// Which pod an endpoint stands for: its addresses and target (upstream hashes the same).
fn endpoint_key(ep: &Endpoint) -> String {
    let target = ep.target_ref.as_ref();
    format!(
        "{}/{}/{}",
        target
            .and_then(|t| t.namespace.as_deref())
            .unwrap_or_default(),
        target.and_then(|t| t.name.as_deref()).unwrap_or_default(),
        ep.addresses.join(",")
    )
}

/// The endpoint of one pod: its address, its conditions (`serving` is readiness; `ready` is
/// readiness of a pod that is not terminating, or always with `publishNotReadyAddresses`;
/// `terminating` is a deletion timestamp), its node and zone, and its hostname when its
/// subdomain is the Service.
pub fn endpoint(service: &Service, pod: &Pod, zone: Option<String>) -> Option<Endpoint> {
    let ip = pods::ipv4(pod)?;
    let serving = pods::is_pod_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let ready = pods::publish_not_ready(service) || (serving && !terminating);
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    Some(Endpoint {
        addresses: vec![ip],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: pods::should_set_hostname(pod, service)
            .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
            .flatten(),
        node_name: node,
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        zone: zone.filter(|z| !z.is_empty()),
        ..Default::default()
    })
}

/// The ports a pod serves the Service on: each Service port whose `targetPort` resolves on
/// the pod (a port that does not resolve is left out, as upstream does).
pub fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref());
    ports
        .into_iter()
        .flatten()
        .filter_map(|sp| {
            Some(EndpointPort {
                name: Some(sp.name.clone().unwrap_or_default()),
                port: Some(pods::find_port(pod, sp)?),
                protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: sp.app_protocol.clone(),
            })
        })
        .collect()
}

/// The endpoints of the pods the Service selects (`pods` may hold others; they are
/// filtered here), grouped by their resolved ports. `zone_of` gives a node's zone label.
pub fn desired(
    service: &Service,
    pods: &[impl Borrow<Pod>],
    zone_of: impl Fn(&str) -> Option<String>,
) -> Desired {
    let mut out = Desired::new();
    let Some(selector) = pods::selector(service) else {
        return out;
    };
    let mut chosen: Vec<&Pod> = pods
        .iter()
        .map(Borrow::borrow)
        .filter(|p| pods::selects(&selector, service, p) && pods::should_be_in_endpoints(p, true))
        .collect();
    chosen.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for pod in chosen {
        let zone = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(&zone_of);
        let Some(ep) = endpoint(service, pod, zone) else {
            continue;
        };
        let ports = endpoint_ports(service, pod);
        out.entry(port_key(&ports))
            .or_insert_with(|| (ports, Vec::new()))
            .1
            .push(ep);
    }
    out
}

/// The labels of a Service's slices: the Service's own, its name, the managing controller,
/// and the headless label for a headless Service.
pub fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.remove(HEADLESS_LABEL);
    labels.insert(
        SERVICE_NAME_LABEL.into(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    if pods::is_headless(service) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels
}

/// The controller reference a slice carries to its Service.
pub fn owner_reference(service: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: service.metadata.name.clone().unwrap_or_default(),
        uid: service.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Whether the slice is this controller's slice of this Service (and not of an earlier
/// Service of the same name).
pub fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "Service" && r.uid == uid)
}

/// Whether the slice is managed by this controller for the Service named `service`.
pub fn is_managed(slice: &EndpointSlice, service: &str) -> bool {
    let labels = slice.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(MANAGED_BY_LABEL) == Some(CONTROLLER_NAME) && get(SERVICE_NAME_LABEL) == Some(service)
}

/// What to write for one Service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// New slices (named by `generateName`).
    pub create: Vec<EndpointSlice>,
    /// Existing slices with new contents (their names and resource versions kept).
    pub update: Vec<EndpointSlice>,
    /// Names of slices to delete.
    pub delete: Vec<String>,
}

impl Changes {
    /// Whether nothing needs writing.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// Who writes a Service's slices: the labels and controller reference they carry.
#[derive(Clone, Debug, PartialEq)]
pub struct Writer {
    /// The Service's name (`generateName` is `<name>-`).
    pub name: String,
    /// The Service's namespace.
    pub namespace: Option<String>,
    /// The labels the slices carry (the managed-by label among them).
    pub labels: BTreeMap<String, String>,
    /// The slices' controller reference.
    pub owner: OwnerReference,
}

impl Writer {
    /// The EndpointSlice controller's writer of a Service's slices.
    pub fn for_service(service: &Service) -> Writer {
        Writer {
            name: service.metadata.name.clone().unwrap_or_default(),
            namespace: service.metadata.namespace.clone(),
            labels: slice_labels(service),
            owner: owner_reference(service),
        }
    }

    /// Whether the slice's controller reference is this writer's owner.
    pub fn owns(&self, slice: &EndpointSlice) -> bool {
        slice.metadata.owner_references.iter().flatten().any(|r| {
            r.controller == Some(true) && r.kind == self.owner.kind && r.uid == self.owner.uid
        })
    }
}

/// A new slice with these ports and endpoints.
fn new_slice(w: &Writer, ports: Vec<EndpointPort>, endpoints: Vec<Endpoint>) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", w.name)),
            namespace: w.namespace.clone(),
            labels: Some(w.labels.clone()),
            owner_references: Some(vec![w.owner.clone()]),
            ..Default::default()
        },
        address_type: ADDRESS_TYPE.into(),
        endpoints,
        ports: Some(ports),
    }
}

/// Sets what the controller owns on a slice it writes: labels, controller reference and the
/// trigger-time annotation.
fn stamp(slice: &mut EndpointSlice, w: &Writer, trigger: Option<&str>) {
    let mut labels = slice.metadata.labels.clone().unwrap_or_default();
    labels.remove(HEADLESS_LABEL);
    labels.extend(w.labels.clone());
    slice.metadata.labels = Some(labels);
    slice.metadata.owner_references = Some(vec![w.owner.clone()]);
    if let Some(t) = trigger {
        slice
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TRIGGER_TIME_ANNOTATION.into(), t.into());
    }
}

/// Whether a slice's labels and owner are what the controller would write.
fn stamped(slice: &EndpointSlice, w: &Writer) -> bool {
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    let want = &w.labels;
    let headless_ok = want.contains_key(HEADLESS_LABEL) || !labels.contains_key(HEADLESS_LABEL);
    headless_ok
        && want.iter().all(|(k, v)| labels.get(k) == Some(v))
        && slice.metadata.owner_references.as_deref() == Some(std::slice::from_ref(&w.owner))
}

fn ports_of(slice: &EndpointSlice) -> &[EndpointPort] {
    slice.ports.as_deref().unwrap_or_default()
}

/// The creates, updates and deletes that turn `existing` (the Service's managed slices) into
/// slices holding `desired`, at most `max_per_slice` endpoints each. `trigger` is the
/// trigger time recorded on the slices written.
pub fn plan(
    service: &Service,
    desired: &Desired,
    existing: &[impl Borrow<EndpointSlice>],
    max_per_slice: usize,
    trigger: Option<&str>,
) -> Changes {
    plan_for(
        &Writer::for_service(service),
        desired,
        existing,
        max_per_slice,
        trigger,
    )
}

/// [`plan`] for slices written by `w` (the EndpointSlice controller's for a Service, or the
/// mirroring controller's for a user's Endpoints).
pub fn plan_for(
    w: &Writer,
    desired: &Desired,
    existing: &[impl Borrow<EndpointSlice>],
    max_per_slice: usize,
    trigger: Option<&str>,
) -> Changes {
    let max = max_per_slice.max(1);
    let mut changes = Changes::default();
    let mut existing: Vec<&EndpointSlice> = existing.iter().map(Borrow::borrow).collect();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    // Slices of another address type or an earlier Service of the same name go.
    let (mut mine, others): (Vec<&EndpointSlice>, Vec<&EndpointSlice>) = existing
        .into_iter()
        .partition(|s| s.address_type == ADDRESS_TYPE && w.owns(s));
    let mut deleting: Vec<&EndpointSlice> = others;

    let total: usize = desired.values().map(|(_, eps)| eps.len()).sum();
    if total == 0 {
        // One placeholder: an empty slice without ports.
        let placeholder = mine
            .iter()
            .position(|s| s.endpoints.is_empty() && ports_of(s).is_empty());
        match placeholder {
            Some(i) => {
                let keep = mine.remove(i);
                if !stamped(keep, w) {
                    let mut s = keep.clone();
                    stamp(&mut s, w, trigger);
                    changes.update.push(s);
                }
            }
            None => match mine.pop() {
                Some(reused) => {
                    let mut s = reused.clone();
                    s.endpoints = Vec::new();
                    s.ports = Some(Vec::new());
                    stamp(&mut s, w, trigger);
                    changes.update.push(s);
                }
                None => {
                    let mut s = new_slice(w, Vec::new(), Vec::new());
                    stamp(&mut s, w, trigger);
                    changes.create.push(s);
                }
            },
        }
        deleting.extend(mine);
        changes.delete = deleting
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        return changes;
    }

    let mut by_ports: BTreeMap<String, Vec<&EndpointSlice>> = BTreeMap::new();
    for s in mine {
        by_ports.entry(port_key(ports_of(s))).or_default().push(s);
    }
    let mut to_create: Vec<EndpointSlice> = Vec::new();
    for (key, (ports, eps)) in desired {
        let mut wanted: BTreeMap<String, Endpoint> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        for ep in eps {
            let k = endpoint_key(ep);
            if wanted.insert(k.clone(), ep.clone()).is_none() {
                order.push(k);
            }
        }
        let mut updating: Vec<EndpointSlice> = Vec::new();
        let mut unchanged: Vec<&EndpointSlice> = Vec::new();
        for slice in by_ports.remove(key).unwrap_or_default() {
            let mut kept = Vec::new();
            let mut changed = !stamped(slice, w);
            for ep in &slice.endpoints {
                match wanted.remove(&endpoint_key(ep)) {
                    Some(want) => {
                        changed |= &want != ep;
                        kept.push(want);
                    }
                    None => changed = true,
                }
            }
            if kept.len() > max {
                // Written under a higher limit: the overflow is placed anew.
                for ep in kept.split_off(max) {
                    wanted.insert(endpoint_key(&ep), ep);
                }
                changed = true;
            }
            if !changed {
                unchanged.push(slice);
            } else if kept.is_empty() {
                deleting.push(slice);
            } else {
                let mut s = slice.clone();
                s.endpoints = kept;
                updating.push(s);
            }
        }
        let mut remaining: Vec<Endpoint> = order.iter().filter_map(|k| wanted.remove(k)).collect();
        // New endpoints fill the slices being written anyway, fullest first.
        updating.sort_by_key(|s| std::cmp::Reverse(s.endpoints.len()));
        for s in &mut updating {
            let room = max.saturating_sub(s.endpoints.len()).min(remaining.len());
            s.endpoints.extend(remaining.drain(..room));
        }
        // Then one unchanged slice with room for all that is left, the fullest that fits.
        if !remaining.is_empty() {
            unchanged.sort_by_key(|s| std::cmp::Reverse(s.endpoints.len()));
            if let Some(i) = unchanged
                .iter()
                .position(|s| s.endpoints.len() + remaining.len() <= max)
            {
                let mut s = unchanged.remove(i).clone();
                s.endpoints.append(&mut remaining);
                updating.push(s);
            }
        }
        for chunk in remaining.chunks(max) {
            to_create.push(new_slice(w, ports.clone(), chunk.to_vec()));
        }
        for mut s in updating {
            stamp(&mut s, w, trigger);
            changes.update.push(s);
        }
    }
    // Slices of port mappings no longer wanted go.
    deleting.extend(by_ports.into_values().flatten());
    // A new slice takes the place of one about to be deleted.
    for mut s in to_create {
        // The address type cannot change, so only a slice of this one is reused.
        let reusable = deleting
            .iter()
            .rposition(|d| d.address_type == ADDRESS_TYPE);
        match reusable.map(|i| deleting.remove(i)) {
            Some(old) => {
                s.metadata = old.metadata.clone();
                s.address_type = ADDRESS_TYPE.into();
                stamp(&mut s, w, trigger);
                changes.update.push(s);
            }
            None => {
                stamp(&mut s, w, trigger);
                changes.create.push(s);
            }
        }
    }
    let names: BTreeSet<String> = deleting
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    changes.delete = names.into_iter().collect();
    changes
}
