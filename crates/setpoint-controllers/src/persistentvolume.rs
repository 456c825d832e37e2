//! The PersistentVolume binder (kube-controller-manager's `persistentvolume-binder`) with
//! Setpoint's built-in local-path provisioner.
//!
//! Claims: an unbound claim is bound to the smallest volume that satisfies it (class, access
//! modes, `volumeMode`, capacity, selector; a volume pre-bound to it by `claimRef` or named by
//! its `volumeName` first). Without a match, a claim of a class is provisioned: at once for an
//! `Immediate` class, after the scheduler named a node (`volume.kubernetes.io/selected-node`)
//! for a `WaitForFirstConsumer` one. Claims of the local-path provisioner get a `hostPath`
//! volume under the chosen node's local-path directory (which the node agent publishes on its
//! Node and creates), with required node affinity to that node, pre-bound to the claim.
//!
//! Volumes: `Available` without a claim, `Bound` with one, `Released` once their claim is gone;
//! then `Retain` keeps them, `Delete` deletes them (a local-path volume is deleted by its node's
//! agent, which removes the directory first), and a policy nothing here can carry out leaves
//! the volume `Failed`.
//!
//! [`plan_claim`] and [`plan_volume`] are the pure decisions; [`Binder`] does the I/O.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{json, Value};
use setpoint_api::quantity::Quantity;
use setpoint_api::selector::LabelSelector;
use setpoint_api::storage as st;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, metrics, logs; `--controllers` knows it by this).
pub const NAME: &str = "persistentvolume-binder";
/// The component its events are reported by, as upstream's.
pub const COMPONENT: &str = "persistentvolume-controller";
/// Where a node's local-path directory is published (see [`st::LOCAL_PATH_DIR_ANNOTATION`]).
pub use setpoint_api::storage::LOCAL_PATH_DIR_ANNOTATION;

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn quantity(v: &Value, pointer: &str) -> Option<Quantity> {
    match v.pointer(pointer)? {
        Value::String(text) => Quantity::parse(text).ok(),
        Value::Number(n) => Quantity::parse(&n.to_string()).ok(),
        _ => None,
    }
}

fn modes(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|m| m.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn volume_mode(v: &Value) -> &str {
    match s(v, "/spec/volumeMode") {
        "" => "Filesystem",
        m => m,
    }
}

fn deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// Whether a volume's `claimRef` names this claim (its uid too, once the reference has one).
pub fn claim_ref_matches(pv: &Value, pvc: &Value) -> bool {
    let Some(r) = pv.pointer("/spec/claimRef").filter(|r| !r.is_null()) else {
        return false;
    };
    let uid = s(r, "/uid");
    s(r, "/namespace") == s(pvc, "/metadata/namespace")
        && s(r, "/name") == s(pvc, "/metadata/name")
        && (uid.is_empty() || uid == s(pvc, "/metadata/uid"))
}

/// Whether `pv` satisfies everything `pvc` asks for except being free: class, volume mode,
/// access modes, capacity and selector.
pub fn satisfies(pv: &Value, pvc: &Value) -> bool {
    if st::volume_class(pv) != st::claim_class(pvc) || volume_mode(pv) != volume_mode(pvc) {
        return false;
    }
    let offered = modes(pv, "/spec/accessModes");
    if !modes(pvc, "/spec/accessModes")
        .iter()
        .all(|m| offered.contains(m))
    {
        return false;
    }
    let wanted = quantity(pvc, "/spec/resources/requests/storage");
    let has = quantity(pv, "/spec/capacity/storage");
    match (wanted, has) {
        (Some(w), Some(h)) if h >= w => {}
        (None, _) => {}
        _ => return false,
    }
    if let Some(sel) = pvc.pointer("/spec/selector").filter(|v| !v.is_null()) {
        match LabelSelector::from_label_selector_json(sel) {
            Ok(sel) => {
                if !sel.matches_object(pv) {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}

/// The volume an unbound claim should bind to: one pre-bound to it (`claimRef`) if any
/// satisfies it, else the smallest free one that does (by capacity, then name). `node`, for a
/// claim whose binding waits for its first consumer, keeps only volumes that node can reach.
pub fn best_match<'a>(pvc: &Value, volumes: &'a [Value], node: Option<&Node>) -> Option<&'a Value> {
    let usable = |pv: &&Value| {
        !deleting(pv)
            && satisfies(pv, pvc)
            && node.is_none_or(|n| node_affinity_allows(pv, n))
            && !matches!(s(pv, "/status/phase"), "Released" | "Failed")
    };
    if let Some(pre) = volumes
        .iter()
        .filter(usable)
        .find(|pv| claim_ref_matches(pv, pvc))
    {
        return Some(pre);
    }
    volumes
        .iter()
        .filter(usable)
        .filter(|pv| pv.pointer("/spec/claimRef").is_none_or(Value::is_null))
        .min_by(|a, b| {
            quantity(a, "/spec/capacity/storage")
                .cmp(&quantity(b, "/spec/capacity/storage"))
                .then_with(|| s(a, "/metadata/name").cmp(s(b, "/metadata/name")))
        })
}

/// Whether a volume's required node affinity lets a pod on `node` use it (no affinity: yes).
/// The rule is the scheduler's ([`setpoint_api::nodeselector`]); an affinity that does not
/// parse as a node selector lets no node use the volume.
pub fn node_affinity_allows(pv: &Value, node: &Node) -> bool {
    let Some(required) = pv
        .pointer("/spec/nodeAffinity/required")
        .filter(|r| !r.is_null())
    else {
        return true;
    };
    let Ok(selector) =
        serde_json::from_value::<k8s_openapi::api::core::v1::NodeSelector>(required.clone())
    else {
        return false;
    };
    let empty = std::collections::BTreeMap::new();
    setpoint_api::nodeselector::node_selector_matches(
        &selector,
        node.metadata.name.as_deref().unwrap_or_default(),
        node.metadata.labels.as_ref().unwrap_or(&empty),
    )
}

/// What to do with one claim.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaimPlan {
    /// Nothing to do.
    Nothing,
    /// Bind the claim and this volume to each other (and fill in both statuses).
    Bind {
        /// The volume's name.
        volume: String,
    },
    /// Only the claim's status is behind (already bound both ways): mark it `Bound`.
    MarkBound {
        /// The volume's name.
        volume: String,
    },
    /// Provision a volume for the claim with the local-path provisioner on this node.
    ProvisionLocal {
        /// The node the scheduler chose.
        node: String,
    },
    /// Wait, with an event saying why (reason, message) and the claim `Pending`.
    Wait {
        /// The event's reason.
        reason: &'static str,
        /// The event's message.
        message: String,
        /// `volume.kubernetes.io/storage-provisioner` to set, when the class names one that
        /// is not built in.
        provisioner: Option<String>,
    },
    /// The claim's volume is gone or taken: the claim is `Lost`.
    Lost {
        /// The event's reason (`ClaimLost`, `ClaimMisbound`).
        reason: &'static str,
        /// The event's message.
        message: &'static str,
    },
}

/// The pure decision for a claim, given every volume, the claim's class (when it names one
/// that exists; `class_exists` tells a missing class from no class) and, for a claim whose
/// binding waits for its consumer, the selected node.
pub fn plan_claim(
    pvc: &Value,
    volumes: &[Value],
    class: Option<&Value>,
    selected_node: Option<&Node>,
) -> ClaimPlan {
    if deleting(pvc) {
        return ClaimPlan::Nothing;
    }
    let volume_name = s(pvc, "/spec/volumeName");
    if !volume_name.is_empty() {
        let Some(pv) = volumes
            .iter()
            .find(|v| s(v, "/metadata/name") == volume_name)
        else {
            if annotation(pvc, st::BIND_COMPLETED_ANNOTATION).is_some() {
                return ClaimPlan::Lost {
                    reason: "ClaimLost",
                    message:
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                };
            }
            // Pre-bound by the user to a volume that does not exist yet: wait for it.
            return ClaimPlan::Nothing;
        };
        let ref_uid = s(pv, "/spec/claimRef/uid");
        if pv.pointer("/spec/claimRef").is_none_or(Value::is_null)
            || (claim_ref_matches(pv, pvc) && ref_uid.is_empty())
        {
            // The user named the volume: bind it if it satisfies the claim.
            if satisfies(pv, pvc) {
                return ClaimPlan::Bind {
                    volume: volume_name.to_string(),
                };
            }
            return ClaimPlan::Nothing;
        }
        if claim_ref_matches(pv, pvc) {
            let complete = annotation(pvc, st::BIND_COMPLETED_ANNOTATION).is_some()
                && s(pvc, "/status/phase") == "Bound";
            return if complete {
                ClaimPlan::Nothing
            } else {
                ClaimPlan::MarkBound {
                    volume: volume_name.to_string(),
                }
            };
        }
        return ClaimPlan::Lost {
            reason: "ClaimMisbound",
            message: "Two claims are bound to the same volume, this one is bound incorrectly",
        };
    }
    let class_name = st::claim_class(pvc);
    let delayed = class.is_some_and(|c| s(c, "/volumeBindingMode") == st::WAIT_FOR_FIRST_CONSUMER);
    let node_for_match = if delayed { selected_node } else { None };
    if delayed && selected_node.is_none() {
        return ClaimPlan::Wait {
            reason: "WaitForFirstConsumer",
            message: "waiting for first consumer to be created before binding".into(),
            provisioner: None,
        };
    }
    if let Some(pv) = best_match(pvc, volumes, node_for_match) {
        return ClaimPlan::Bind {
            volume: s(pv, "/metadata/name").to_string(),
        };
    }
    if class_name.is_empty() {
        return ClaimPlan::Wait {
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set"
                .into(),
            provisioner: None,
        };
    }
    let Some(class) = class else {
        return ClaimPlan::Wait {
            reason: "ProvisioningFailed",
            message: format!("storageclass.storage.k8s.io {class_name:?} not found"),
            provisioner: None,
        };
    };
    let provisioner = s(class, "/provisioner");
    if provisioner == st::LOCAL_PATH_PROVISIONER {
        // Local volumes need a node: the scheduler's choice, which an Immediate class never
        // gets, so such a claim is provisioned only once something selects a node for it.
        if let Some(node) = annotation(pvc, st::SELECTED_NODE_ANNOTATION) {
            return ClaimPlan::ProvisionLocal {
                node: node.to_string(),
            };
        }
    }
    ClaimPlan::Wait {
        reason: "ExternalProvisioning",
        message: format!(
            "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
        ),
        provisioner: Some(provisioner.to_string()),
    }
}

/// The volume the local-path provisioner creates for `pvc` on `node`, whose local-path
/// directory is `dir`, with the class's reclaim policy: pre-bound to the claim, so no other
/// claim can take it.
pub fn local_path_volume(pvc: &Value, class: &Value, node: &str, dir: &str) -> Value {
    let uid = s(pvc, "/metadata/uid");
    let name = format!("pvc-{uid}");
    let policy = match s(class, "/reclaimPolicy") {
        "" => "Delete",
        p => p,
    };
    let path = format!(
        "{}/{}_{}_{}",
        dir.trim_end_matches('/'),
        name,
        s(pvc, "/metadata/namespace"),
        s(pvc, "/metadata/name")
    );
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {st::PROVISIONED_BY_ANNOTATION: st::LOCAL_PATH_PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": pvc.pointer("/spec/resources/requests/storage").cloned().unwrap_or(json!("0"))},
            "accessModes": pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
            "persistentVolumeReclaimPolicy": policy,
            "storageClassName": st::claim_class(pvc),
            "volumeMode": volume_mode(pvc),
            "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": st::HOSTNAME_LABEL, "operator": "In", "values": [node]}
            ]}]}},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": s(pvc, "/metadata/namespace"),
                "name": s(pvc, "/metadata/name"),
                "uid": uid,
                "resourceVersion": s(pvc, "/metadata/resourceVersion"),
            },
        },
    })
}

/// What to do with one volume.
#[derive(Clone, Debug, PartialEq)]
pub enum VolumePlan {
    /// Nothing to do.
    Nothing,
    /// Set the phase (and, for `Failed`, a message).
    Phase {
        /// The new phase.
        phase: &'static str,
        /// `status.message`, when there is one.
        message: Option<String>,
    },
    /// The binder bound it to a claim that went on to another volume: clear `claimRef`.
    Unbind,
    /// Released with reclaim `Delete` and not provisioned here: delete the volume.
    Delete,
}

/// Whether the claim a volume's `claimRef` names is gone (or is another incarnation).
pub fn claim_gone(pv: &Value, claim: Option<&Value>) -> bool {
    match claim {
        None => true,
        Some(c) => {
            let uid = s(pv, "/spec/claimRef/uid");
            !uid.is_empty() && uid != s(c, "/metadata/uid")
        }
    }
}

/// The pure decision for a volume, given the claim its `claimRef` names (when it exists).
pub fn plan_volume(pv: &Value, claim: Option<&Value>) -> VolumePlan {
    if deleting(pv) {
        return VolumePlan::Nothing;
    }
    let phase = s(pv, "/status/phase");
    let set = |p: &'static str| {
        if phase == p {
            VolumePlan::Nothing
        } else {
            VolumePlan::Phase {
                phase: p,
                message: None,
            }
        }
    };
    if pv.pointer("/spec/claimRef").is_none_or(Value::is_null) {
        return set("Available");
    }
    if s(pv, "/spec/claimRef/uid").is_empty() {
        // Pre-bound to a claim that has not bound yet.
        return set("Available");
    }
    if !claim_gone(pv, claim) {
        let claim = claim.expect("a claim that is not gone exists");
        let name = s(pv, "/metadata/name");
        return match s(claim, "/spec/volumeName") {
            v if v == name => set("Bound"),
            // Binding in progress: the claim's side is written next.
            "" => set("Bound"),
            _ if annotation(pv, st::BOUND_BY_CONTROLLER_ANNOTATION).is_some() => VolumePlan::Unbind,
            _ => VolumePlan::Nothing,
        };
    }
    match (phase, s(pv, "/spec/persistentVolumeReclaimPolicy")) {
        ("Failed", _) => VolumePlan::Nothing,
        (p, _) if p != "Released" => VolumePlan::Phase {
            phase: "Released",
            message: None,
        },
        (_, "Delete") if annotation(pv, st::PROVISIONED_BY_ANNOTATION) == Some(st::LOCAL_PATH_PROVISIONER) => {
            // Its node's agent removes the directory, then deletes the volume.
            VolumePlan::Nothing
        }
        (_, "Delete") if pv.pointer("/spec/hostPath").is_some_and(|h| !h.is_null()) => {
            VolumePlan::Delete
        }
        (_, "Delete") => VolumePlan::Phase {
            phase: "Failed",
            message: Some(format!(
                "error getting deleter volume plugin for volume {:?}: no deletable volume plugin matched",
                s(pv, "/metadata/name")
            )),
        },
        (_, "Recycle") => VolumePlan::Phase {
            phase: "Failed",
            message: Some("No recycler plugin found for the volume!".into()),
        },
        _ => VolumePlan::Nothing,
    }
}

/// What the binder sees of a claim, for the decision record.
fn claim_summary(pvc: &Value, class: Option<&Value>, volumes: usize) -> String {
    let class_name = st::claim_class(pvc);
    let class = match class {
        _ if class_name.is_empty() => "no class".to_string(),
        None => format!("class {class_name} (not found)"),
        Some(c) => format!(
            "class {class_name} ({})",
            match s(c, "/volumeBindingMode") {
                "" => "Immediate",
                m => m,
            }
        ),
    };
    let or_none = |v: &str| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.to_string()
        }
    };
    let mut out = format!(
        "phase {}, {class}, requests {} [{}] {}, volumeName {}",
        or_none(s(pvc, "/status/phase")),
        or_none(s(pvc, "/spec/resources/requests/storage")),
        modes(pvc, "/spec/accessModes").join(", "),
        volume_mode(pvc),
        or_none(s(pvc, "/spec/volumeName")),
    );
    if let Some(node) = annotation(pvc, st::SELECTED_NODE_ANNOTATION) {
        out.push_str(&format!(", selected node {node}"));
    }
    if deleting(pvc) {
        out.push_str(", being deleted");
    }
    out.push_str(&format!("; {volumes} volume(s) known"));
    out
}

/// The rule [`plan_claim`] bound the claim to `pv` by, in words.
fn bind_rule(pvc: &Value, pv: &Value, delayed_node: Option<&str>) -> String {
    if !s(pvc, "/spec/volumeName").is_empty() {
        return "the claim names it in spec.volumeName and it satisfies the claim".into();
    }
    if claim_ref_matches(pv, pvc) {
        return "it is pre-bound to the claim (claimRef) and satisfies it".into();
    }
    format!(
        "the smallest free volume that satisfies the claim's class, access modes, volumeMode, capacity and selector{}",
        delayed_node
            .map(|n| format!(", reachable from the selected node {n}"))
            .unwrap_or_default()
    )
}

/// Why [`plan_volume`] sets `phase`, in words.
fn phase_rule(phase: &str, pv: &Value) -> String {
    let claim = format!(
        "{}/{}",
        s(pv, "/spec/claimRef/namespace"),
        s(pv, "/spec/claimRef/name")
    );
    match phase {
        "Available" if pv.pointer("/spec/claimRef").is_none_or(Value::is_null) => {
            "no claimRef".into()
        }
        "Available" => format!("pre-bound to claim {claim}, which has not bound yet"),
        "Bound" => format!("its claim {claim} exists and is bound or binding to it"),
        "Released" => format!("its claim {claim} is gone"),
        _ => format!(
            "released with reclaim policy {}, which nothing here can carry out",
            s(pv, "/spec/persistentVolumeReclaimPolicy")
        ),
    }
}

/// The I/O around [`plan_claim`] and [`plan_volume`]: one controller keyed by claims, one by
/// volumes, sharing the caches.
pub struct Binder {
    client: Client,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    nodes: Store<Node>,
    events: EventRecorder,
}

fn to_value<T: k8s_openapi::serde::Serialize>(obj: &T) -> Value {
    serde_json::to_value(obj).unwrap_or(Value::Null)
}

fn merge(api_rv: &str, body: Value) -> Patch {
    let mut body = body;
    // The resourceVersion makes the patch a compare-and-swap on what the decision read.
    body["metadata"]["resourceVersion"] = json!(api_rv);
    Patch::Merge(body)
}

fn conflict_ok<T>(
    r: Result<T, setpoint_runtime::client::ClientError>,
) -> Result<(), ReconcileError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.is_conflict() => Err(ReconcileError::retry("the object changed; retrying")),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Binder {
    fn all_volumes(&self) -> Vec<Value> {
        self.volumes
            .list()
            .iter()
            .map(|v| to_value(v.as_ref()))
            .collect()
    }

    fn class(&self, name: &str) -> Option<Value> {
        if name.is_empty() {
            return None;
        }
        self.classes
            .get(&ObjectKey::new(None, name))
            .map(|c| to_value(c.as_ref()))
    }

    async fn sync_claim(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(claim) = self.claims.get(key) else {
            ctx.observe("the claim is gone");
            return Ok(Action::Done);
        };
        let pvc = to_value(claim.as_ref());
        let ns = key.namespace.clone().unwrap_or_default();
        let class = self.class(st::claim_class(&pvc));
        let selected = annotation(&pvc, st::SELECTED_NODE_ANNOTATION)
            .and_then(|n| self.nodes.get(&ObjectKey::new(None, n)));
        let volumes = self.all_volumes();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let params = PatchParams::default();
        if ctx.recording() {
            ctx.observe(claim_summary(&pvc, class.as_ref(), volumes.len()));
        }
        match plan_claim(&pvc, &volumes, class.as_ref(), selected.as_deref()) {
            ClaimPlan::Nothing => {}
            ClaimPlan::Bind { volume } => {
                let pv = volumes
                    .iter()
                    .find(|v| s(v, "/metadata/name") == volume)
                    .cloned()
                    .unwrap_or(Value::Null);
                if ctx.recording() {
                    let delayed = class
                        .as_ref()
                        .is_some_and(|c| s(c, "/volumeBindingMode") == st::WAIT_FOR_FIRST_CONSUMER);
                    let node = selected
                        .as_ref()
                        .and_then(|n| n.metadata.name.as_deref())
                        .filter(|_| delayed);
                    ctx.action(
                        format!("bind volume {volume} to the claim: claimRef, phase Bound"),
                        bind_rule(&pvc, &pv, node),
                    );
                }
                if s(&pv, "/spec/claimRef/uid").is_empty() {
                    let by_controller = pv.pointer("/spec/claimRef").is_none_or(Value::is_null);
                    let mut body = json!({"spec": {"claimRef": {
                        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "namespace": ns, "name": key.name,
                        "uid": s(&pvc, "/metadata/uid"),
                        "resourceVersion": s(&pvc, "/metadata/resourceVersion"),
                    }}});
                    if by_controller {
                        body["metadata"] =
                            json!({"annotations": {st::BOUND_BY_CONTROLLER_ANNOTATION: "yes"}});
                    }
                    conflict_ok(
                        pvs.patch(
                            &volume,
                            &params,
                            &merge(s(&pv, "/metadata/resourceVersion"), body),
                        )
                        .await,
                    )?;
                }
                conflict_ok(
                    pvs.patch_status(
                        &volume,
                        &params,
                        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
                    )
                    .await,
                )?;
                let mut annotations = json!({st::BIND_COMPLETED_ANNOTATION: "yes"});
                if s(&pvc, "/spec/volumeName").is_empty() {
                    annotations[st::BOUND_BY_CONTROLLER_ANNOTATION] = json!("yes");
                }
                let body = json!({"metadata": {"annotations": annotations},
                                  "spec": {"volumeName": volume}});
                ctx.action(
                    format!("bind the claim to volume {volume}: volumeName, phase Bound"),
                    "the volume's side of the binding is written",
                );
                conflict_ok(
                    claims
                        .patch(
                            &key.name,
                            &params,
                            &merge(s(&pvc, "/metadata/resourceVersion"), body),
                        )
                        .await,
                )?;
                self.mark_bound(&claims, &key.name, &pv).await?;
            }
            ClaimPlan::MarkBound { volume } => {
                ctx.action(
                    format!("mark the claim Bound to volume {volume}"),
                    "bound both ways, but the claim's status or bind-completed annotation lags",
                );
                if annotation(&pvc, st::BIND_COMPLETED_ANNOTATION).is_none() {
                    let body = json!({"metadata": {"annotations": {st::BIND_COMPLETED_ANNOTATION: "yes"}}});
                    conflict_ok(
                        claims
                            .patch(
                                &key.name,
                                &params,
                                &merge(s(&pvc, "/metadata/resourceVersion"), body),
                            )
                            .await,
                    )?;
                }
                let pv = volumes
                    .iter()
                    .find(|v| s(v, "/metadata/name") == volume)
                    .cloned()
                    .unwrap_or(Value::Null);
                self.mark_bound(&claims, &key.name, &pv).await?;
            }
            ClaimPlan::ProvisionLocal { node } => {
                let class = class.unwrap_or(Value::Null);
                let dir = self.nodes.get(&ObjectKey::new(None, &node)).and_then(|n| {
                    n.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(LOCAL_PATH_DIR_ANNOTATION).cloned())
                });
                let Some(dir) = dir else {
                    ctx.observe(format!(
                        "node {node} publishes no local-path directory: nowhere to provision"
                    ));
                    // The node's agent has not published its directory yet (or never will:
                    // a node without local-path support), so there is nowhere to put it.
                    self.events.publish(
                        &claim.object_reference(),
                        EventType::Warning,
                        "ProvisioningFailed",
                        &format!("node {node:?} does not offer local-path volumes (no {LOCAL_PATH_DIR_ANNOTATION} annotation)"),
                    );
                    return Ok(Action::RequeueAfter(std::time::Duration::from_secs(5)));
                };
                let pv = local_path_volume(&pvc, &class, &node, &dir);
                let name = s(&pv, "/metadata/name").to_string();
                let typed: PersistentVolume = serde_json::from_value(pv)
                    .map_err(|e| ReconcileError::terminal(format!("building the volume: {e}")))?;
                ctx.action(
                    format!("create volume {name} (local-path on node {node})"),
                    format!(
                        "no volume matches; class {} is provisioned by {} and node {node} is selected",
                        st::claim_class(&pvc),
                        st::LOCAL_PATH_PROVISIONER
                    ),
                );
                match pvs.create(&Default::default(), &typed).await {
                    Ok(_) => self.events.publish(
                        &claim.object_reference(),
                        EventType::Normal,
                        "ProvisioningSucceeded",
                        &format!("Successfully provisioned volume {name}"),
                    ),
                    Err(e) if e.is_already_exists() => {}
                    Err(e) => {
                        self.events.publish(
                            &claim.object_reference(),
                            EventType::Warning,
                            "ProvisioningFailed",
                            &e.to_string(),
                        );
                        return Err(e.into());
                    }
                }
            }
            ClaimPlan::Wait {
                reason,
                message,
                provisioner,
            } => {
                ctx.observe(format!("no volume to bind yet: {reason}"));
                let kind = if reason == "ExternalProvisioning" || reason == "WaitForFirstConsumer" {
                    EventType::Normal
                } else {
                    EventType::Warning
                };
                self.events
                    .publish(&claim.object_reference(), kind, reason, &message);
                if let Some(p) = provisioner {
                    if annotation(&pvc, st::STORAGE_PROVISIONER_ANNOTATION) != Some(p.as_str()) {
                        ctx.action(
                            format!("annotate the claim: storage-provisioner {p}"),
                            "its class's provisioner is not built in: an external one provisions it",
                        );
                        let body = json!({"metadata": {"annotations": {
                            st::STORAGE_PROVISIONER_ANNOTATION: p,
                            st::BETA_STORAGE_PROVISIONER_ANNOTATION: p,
                        }}});
                        conflict_ok(claims.patch(&key.name, &params, &Patch::Merge(body)).await)?;
                    }
                }
                if s(&pvc, "/status/phase") != "Pending" {
                    ctx.action(
                        "set the claim's phase Pending",
                        format!("no volume to bind yet ({reason})"),
                    );
                    conflict_ok(
                        claims
                            .patch_status(
                                &key.name,
                                &params,
                                &Patch::Merge(json!({"status": {"phase": "Pending"}})),
                            )
                            .await,
                    )?;
                }
            }
            ClaimPlan::Lost { reason, message } => {
                if s(&pvc, "/status/phase") != "Lost" {
                    ctx.action("set the claim's phase Lost", format!("{reason}: {message}"));
                    self.events.publish(
                        &claim.object_reference(),
                        EventType::Warning,
                        reason,
                        message,
                    );
                    conflict_ok(
                        claims
                            .patch_status(
                                &key.name,
                                &params,
                                &Patch::Merge(json!({"status": {"phase": "Lost"}})),
                            )
                            .await,
                    )?;
                }
            }
        }
        Ok(Action::Done)
    }

    async fn mark_bound(
        &self,
        claims: &Api<PersistentVolumeClaim>,
        name: &str,
        pv: &Value,
    ) -> Result<(), ReconcileError> {
        let status = json!({"status": {
            "phase": "Bound",
            "accessModes": pv.pointer("/spec/accessModes").cloned().unwrap_or(json!([])),
            "capacity": pv.pointer("/spec/capacity").cloned().unwrap_or(json!({})),
        }});
        conflict_ok(
            claims
                .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
                .await,
        )
    }

    async fn sync_volume(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(volume) = self.volumes.get(key) else {
            ctx.observe("the volume is gone");
            return Ok(Action::Done);
        };
        let pv = to_value(volume.as_ref());
        let ns = s(&pv, "/spec/claimRef/namespace").to_string();
        let claim_name = s(&pv, "/spec/claimRef/name").to_string();
        let mut claim = if claim_name.is_empty() {
            None
        } else {
            self.claims
                .get(&ObjectKey::new(Some(&ns), &claim_name))
                .map(|c| to_value(c.as_ref()))
        };
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let params = PatchParams::default();
        if !claim_name.is_empty() && claim_gone(&pv, claim.as_ref()) {
            // The cache may be behind a claim created moments ago: ask the API before
            // releasing a volume, as upstream does.
            let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
            claim = api
                .get_opt(&claim_name)
                .await
                .map_err(ReconcileError::from)?
                .map(|c| to_value(&c));
        }
        if ctx.recording() {
            let claim_state = match &claim {
                _ if claim_name.is_empty() => "no claimRef".to_string(),
                Some(_) if !claim_gone(&pv, claim.as_ref()) => {
                    format!("claimRef {ns}/{claim_name} (exists)")
                }
                _ => format!("claimRef {ns}/{claim_name} (gone)"),
            };
            ctx.observe(format!(
                "phase {}, reclaim policy {}, {claim_state}{}",
                match s(&pv, "/status/phase") {
                    "" => "none",
                    p => p,
                },
                s(&pv, "/spec/persistentVolumeReclaimPolicy"),
                if deleting(&pv) { ", being deleted" } else { "" },
            ));
        }
        match plan_volume(&pv, claim.as_ref()) {
            VolumePlan::Nothing => {}
            VolumePlan::Phase { phase, message } => {
                if ctx.recording() {
                    ctx.action(format!("set phase {phase}"), phase_rule(phase, &pv));
                }
                let mut status = json!({"phase": phase});
                if let Some(m) = &message {
                    status["message"] = json!(m);
                    self.events.publish(
                        &volume.object_reference(),
                        EventType::Warning,
                        "VolumeFailedDelete",
                        m,
                    );
                }
                conflict_ok(
                    pvs.patch_status(&key.name, &params, &Patch::Merge(json!({"status": status})))
                        .await,
                )?;
            }
            VolumePlan::Unbind => {
                ctx.action(
                    format!("clear claimRef (unbind from claim {ns}/{claim_name})"),
                    "bound by the binder to a claim that went on to another volume",
                );
                let body = json!({"spec": {"claimRef": null},
                    "metadata": {"annotations": {st::BOUND_BY_CONTROLLER_ANNOTATION: null}}});
                conflict_ok(
                    pvs.patch(
                        &key.name,
                        &params,
                        &merge(s(&pv, "/metadata/resourceVersion"), body),
                    )
                    .await,
                )?;
            }
            VolumePlan::Delete => {
                ctx.action(
                    format!("delete volume {}", key.name),
                    "Released (its claim is gone) with reclaim policy Delete",
                );
                let params = DeleteParams {
                    precondition_uid: volume.metadata.uid.clone(),
                    ..Default::default()
                };
                conflict_ok(pvs.delete(&key.name, &params).await)?;
            }
        }
        Ok(Action::Done)
    }
}

struct ClaimSide(Arc<Binder>);
struct VolumeSide(Arc<Binder>);

#[async_trait::async_trait]
impl Reconciler for ClaimSide {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.0.sync_claim(ctx, key).await
    }
}

#[async_trait::async_trait]
impl Reconciler for VolumeSide {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        self.0.sync_volume(ctx, key).await
    }
}

fn binder(client: Client, informers: &SharedInformers) -> Arc<Binder> {
    Arc::new(Binder {
        events: EventRecorder::new(client.clone(), Reporter::new(COMPONENT)),
        client,
        claims: informers
            .typed::<PersistentVolumeClaim>(Scope::all())
            .store(),
        volumes: informers.typed::<PersistentVolume>(Scope::all()).store(),
        classes: informers.typed::<StorageClass>(Scope::all()).store(),
        nodes: informers.typed::<Node>(Scope::all()).store(),
    })
}

/// The binder's two controllers: claims (re-checked when volumes, classes or nodes change)
/// and volumes (re-checked when their claims change).
pub fn controllers(client: Client, informers: &SharedInformers) -> Vec<Controller> {
    let b = binder(client, informers);
    let claims = b.claims.clone();
    let claims_for_class = b.claims.clone();
    let every_claim = move |claims: &Store<PersistentVolumeClaim>| -> Vec<ObjectKey> {
        claims
            .list()
            .iter()
            .filter(|c| {
                c.spec.as_ref().is_none_or(|s| s.volume_name.is_none())
                    || c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
            })
            .map(|c| {
                ObjectKey::new(
                    c.metadata.namespace.as_deref(),
                    c.metadata.name.as_deref().unwrap_or(""),
                )
            })
            .collect()
    };
    let claim_controller = Controller::for_type::<PersistentVolumeClaim>(NAME, informers, None)
        .watches::<PersistentVolume>(None, move |_pv: &PersistentVolume| every_claim(&claims))
        .watches::<StorageClass>(None, move |_sc: &StorageClass| {
            every_claim(&claims_for_class)
        })
        .build(Arc::new(ClaimSide(b.clone())));
    let volume_controller =
        Controller::for_type::<PersistentVolume>(&format!("{NAME}-volumes"), informers, None)
            .watches::<PersistentVolumeClaim>(None, {
                let volumes = b.volumes.clone();
                move |pvc: &PersistentVolumeClaim| {
                    let ns = pvc.metadata.namespace.clone().unwrap_or_default();
                    let name = pvc.metadata.name.clone().unwrap_or_default();
                    volumes
                        .list()
                        .iter()
                        .filter(|pv| {
                            pv.spec
                                .as_ref()
                                .and_then(|s| s.claim_ref.as_ref())
                                .is_some_and(|r| {
                                    r.namespace.as_deref() == Some(ns.as_str())
                                        && r.name.as_deref() == Some(name.as_str())
                                })
                        })
                        .map(|pv| ObjectKey::new(None, pv.metadata.name.as_deref().unwrap_or("")))
                        .collect()
                }
            })
            .build(Arc::new(VolumeSide(b)));
    vec![claim_controller, volume_controller]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pv(name: &str, size: &str, modes: &[&str], class: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"tier": "fast"}},
               "spec": {"capacity": {"storage": size}, "accessModes": modes,
                        "storageClassName": class, "hostPath": {"path": "/x"},
                        "persistentVolumeReclaimPolicy": "Retain"},
               "status": {"phase": "Available"}})
    }

    fn pvc(size: &str, modes: &[&str], class: &str) -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
               "spec": {"accessModes": modes, "resources": {"requests": {"storage": size}},
                        "storageClassName": class},
               "status": {"phase": "Pending"}})
    }

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(st::HOSTNAME_LABEL.to_string(), name.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn smallest_satisfying_volume_wins() {
        let vols = [
            pv("big", "10Gi", &["ReadWriteOnce"], ""),
            pv("small", "2Gi", &["ReadWriteOnce"], ""),
            pv("tiny", "500Mi", &["ReadWriteOnce"], ""),
            pv("rox", "2Gi", &["ReadOnlyMany"], ""),
            pv("classy", "2Gi", &["ReadWriteOnce"], "gold"),
        ];
        let claim = pvc("1Gi", &["ReadWriteOnce"], "");
        assert_eq!(
            plan_claim(&claim, &vols, None, None),
            ClaimPlan::Bind {
                volume: "small".into()
            }
        );
        let gold = pvc("1Gi", &["ReadWriteOnce"], "gold");
        assert_eq!(
            best_match(&gold, &vols, None).map(|v| s(v, "/metadata/name")),
            Some("classy")
        );
        let rwx = pvc("1Gi", &["ReadWriteMany"], "");
        assert_eq!(
            plan_claim(&rwx, &vols, None, None),
            ClaimPlan::Wait {
                reason: "FailedBinding",
                message:
                    "no persistent volumes available for this claim and no storage class is set"
                        .into(),
                provisioner: None,
            }
        );
    }

    #[test]
    fn selector_volume_mode_and_prebinding() {
        let mut claim = pvc("1Gi", &["ReadWriteOnce"], "");
        claim["spec"]["selector"] = json!({"matchLabels": {"tier": "slow"}});
        assert_eq!(
            best_match(&claim, &[pv("a", "1Gi", &["ReadWriteOnce"], "")], None),
            None
        );
        let mut block = pvc("1Gi", &["ReadWriteOnce"], "");
        block["spec"]["volumeMode"] = json!("Block");
        assert_eq!(
            best_match(&block, &[pv("a", "1Gi", &["ReadWriteOnce"], "")], None),
            None
        );

        // A volume pre-bound to the claim wins over a smaller free one.
        let mut pre = pv("pre", "5Gi", &["ReadWriteOnce"], "");
        pre["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c"});
        let vols = [pv("free", "1Gi", &["ReadWriteOnce"], ""), pre];
        let claim = pvc("1Gi", &["ReadWriteOnce"], "");
        assert_eq!(
            best_match(&claim, &vols, None).map(|v| s(v, "/metadata/name")),
            Some("pre")
        );
        // A volume pre-bound to another claim is not taken.
        let mut other = pv("other", "1Gi", &["ReadWriteOnce"], "");
        other["spec"]["claimRef"] = json!({"namespace": "ns", "name": "d"});
        assert_eq!(best_match(&claim, &[other], None), None);
    }

    #[test]
    fn delayed_binding_waits_for_a_node_then_provisions_there() {
        let class = json!({"metadata": {"name": "local-path"}, "provisioner": st::LOCAL_PATH_PROVISIONER,
                           "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"});
        let mut claim = pvc("1Gi", &["ReadWriteOnce"], "local-path");
        assert!(matches!(
            plan_claim(&claim, &[], Some(&class), None),
            ClaimPlan::Wait {
                reason: "WaitForFirstConsumer",
                ..
            }
        ));
        claim["metadata"]["annotations"] = json!({st::SELECTED_NODE_ANNOTATION: "n1"});
        let n1 = node("n1");
        assert_eq!(
            plan_claim(&claim, &[], Some(&class), Some(&n1)),
            ClaimPlan::ProvisionLocal { node: "n1".into() }
        );
        let pv = local_path_volume(&claim, &class, "n1", "/data/storage");
        assert_eq!(s(&pv, "/metadata/name"), "pvc-u1");
        assert_eq!(s(&pv, "/spec/hostPath/path"), "/data/storage/pvc-u1_ns_c");
        assert_eq!(s(&pv, "/spec/persistentVolumeReclaimPolicy"), "Delete");
        assert_eq!(s(&pv, "/spec/claimRef/uid"), "u1");
        assert!(node_affinity_allows(&pv, &n1));
        assert!(!node_affinity_allows(&pv, &node("n2")));
        // The provisioned volume, pre-bound, is then what the claim binds to.
        let vols = [pv];
        assert_eq!(
            plan_claim(&claim, &vols, Some(&class), Some(&n1)),
            ClaimPlan::Bind {
                volume: "pvc-u1".into()
            }
        );
    }

    #[test]
    fn missing_class_and_external_provisioners() {
        let claim = pvc("1Gi", &["ReadWriteOnce"], "nope");
        assert_eq!(
            plan_claim(&claim, &[], None, None),
            ClaimPlan::Wait {
                reason: "ProvisioningFailed",
                message: "storageclass.storage.k8s.io \"nope\" not found".into(),
                provisioner: None,
            }
        );
        let class = json!({"provisioner": "ebs.csi.aws.com"});
        let claim = pvc("1Gi", &["ReadWriteOnce"], "gp3");
        assert!(matches!(
            plan_claim(&claim, &[], Some(&class), None),
            ClaimPlan::Wait { reason: "ExternalProvisioning", provisioner: Some(p), .. } if p == "ebs.csi.aws.com"
        ));
    }

    #[test]
    fn bound_claims_and_lost_volumes() {
        let mut bound_pv = pv("v", "1Gi", &["ReadWriteOnce"], "");
        bound_pv["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c", "uid": "u1"});
        let mut claim = pvc("1Gi", &["ReadWriteOnce"], "");
        claim["spec"]["volumeName"] = json!("v");
        assert_eq!(
            plan_claim(&claim, std::slice::from_ref(&bound_pv), None, None),
            ClaimPlan::MarkBound { volume: "v".into() }
        );
        claim["metadata"]["annotations"] = json!({st::BIND_COMPLETED_ANNOTATION: "yes"});
        claim["status"]["phase"] = json!("Bound");
        assert_eq!(
            plan_claim(&claim, std::slice::from_ref(&bound_pv), None, None),
            ClaimPlan::Nothing
        );
        assert!(matches!(
            plan_claim(&claim, &[], None, None),
            ClaimPlan::Lost {
                reason: "ClaimLost",
                ..
            }
        ));
    }

    #[test]
    fn volume_phases_and_reclaim() {
        let free = pv("v", "1Gi", &["ReadWriteOnce"], "");
        assert_eq!(plan_volume(&free, None), VolumePlan::Nothing);
        let mut bound = free.clone();
        bound["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c", "uid": "u1"});
        let mut claim = pvc("1Gi", &["ReadWriteOnce"], "");
        claim["spec"]["volumeName"] = json!("v");
        assert_eq!(
            plan_volume(&bound, Some(&claim)),
            VolumePlan::Phase {
                phase: "Bound",
                message: None
            }
        );
        // The claim is gone: Released, and with Retain it stays so.
        assert_eq!(
            plan_volume(&bound, None),
            VolumePlan::Phase {
                phase: "Released",
                message: None
            }
        );
        bound["status"]["phase"] = json!("Released");
        assert_eq!(plan_volume(&bound, None), VolumePlan::Nothing);
        // A new claim of the same name is another incarnation: still released.
        let mut again = claim.clone();
        again["metadata"]["uid"] = json!("u2");
        assert_eq!(plan_volume(&bound, Some(&again)), VolumePlan::Nothing);
        // Delete: a hostPath volume is deleted, a local-path one is left to its node.
        bound["spec"]["persistentVolumeReclaimPolicy"] = json!("Delete");
        assert_eq!(plan_volume(&bound, None), VolumePlan::Delete);
        bound["metadata"]["annotations"] =
            json!({st::PROVISIONED_BY_ANNOTATION: st::LOCAL_PATH_PROVISIONER});
        assert_eq!(plan_volume(&bound, None), VolumePlan::Nothing);
    }
}
