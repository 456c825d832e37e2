//! The `Node` object: what the agent registers (labels, taints, capacity, addresses, daemon
//! endpoint, system info) and the status it keeps reporting (`Ready` and the pressure
//! conditions).
//!
//! The composition is pure and unit-tested; [`NodeReporter`] does the API calls. Status is
//! written when it changed (ignoring heartbeat times) — for instance when the node lifecycle
//! controller marked the node `Ready=Unknown` — and otherwise every
//! [`AgentConfig::status_report_frequency`] (Kubernetes' `nodeStatusReportFrequency`), since
//! the Lease is the frequent heartbeat.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use setpoint_runtime::client::{Api, Client, ClientError, PostParams};
use setpoint_runtime::informer::Store;
use setpoint_runtime::ObjectKey;
use tokio::time::Instant;

use crate::agent::AgentConfig;
use crate::podworker::FIELD_MANAGER;

/// The node's labels: the well-known ones, then the configured ones (which win).
pub fn labels(config: &AgentConfig) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert("kubernetes.io/hostname".into(), config.node_name.clone());
    l.insert("kubernetes.io/os".into(), "linux".into());
    l.insert(
        "kubernetes.io/arch".into(),
        config.system_info.architecture.clone(),
    );
    l.insert("beta.kubernetes.io/os".into(), "linux".into());
    l.insert(
        "beta.kubernetes.io/arch".into(),
        config.system_info.architecture.clone(),
    );
    if let Some(t) = &config.instance_type {
        l.insert("node.kubernetes.io/instance-type".into(), t.clone());
    }
    l.extend(config.labels.clone());
    l
}

/// A new Node object for `config` (status included; a create may drop it, so it is written
/// again through the status subresource).
pub fn new_node(config: &AgentConfig, port: u16, now: Timestamp) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(config.node_name.clone()),
            labels: Some(labels(config)),
            annotations: Some(config.annotations.clone()).filter(|a| !a.is_empty()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(config.taints.clone()).filter(|t| !t.is_empty()),
            ..Default::default()
        }),
        status: Some(desired_status(config, port, None, now)),
    }
}

/// `existing` with our labels, annotations and configured taints added, or `None` when it
/// already has them. Taints others added (the lifecycle controller's `unreachable`) are kept.
pub fn merge_registration(existing: &Node, config: &AgentConfig) -> Option<Node> {
    let mut node = existing.clone();
    let node_labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    let mut changed = false;
    for (k, v) in labels(config) {
        if node_labels.get(&k) != Some(&v) {
            node_labels.insert(k, v);
            changed = true;
        }
    }
    if !config.annotations.is_empty() {
        let node_annotations = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
        for (k, v) in &config.annotations {
            if node_annotations.get(k) != Some(v) {
                node_annotations.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    for t in &config.taints {
        if !taints
            .iter()
            .any(|x| x.key == t.key && x.effect == t.effect)
        {
            taints.push(t.clone());
            changed = true;
        }
    }
    if taints.is_empty() {
        spec.taints = None;
    }
    changed.then_some(node)
}

fn quantities(config: &AgentConfig) -> BTreeMap<String, Quantity> {
    let c = &config.capacity;
    BTreeMap::from([
        ("cpu".to_string(), Quantity(c.cpu.clone())),
        ("memory".to_string(), Quantity(c.memory.clone())),
        ("pods".to_string(), Quantity(c.pods.to_string())),
    ])
}

fn node_condition(
    old: &[NodeCondition],
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> NodeCondition {
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(since.unwrap_or(Time(now))),
    }
}

/// The status to report: ours for capacity, addresses, endpoint, system info and the four
/// conditions (transition times kept while unchanged, heartbeats at `now`); anything else in
/// `old` (images, volumes, foreign conditions) is kept.
pub fn desired_status(
    config: &AgentConfig,
    port: u16,
    old: Option<&NodeStatus>,
    now: Timestamp,
) -> NodeStatus {
    let mut status = old.cloned().unwrap_or_default();
    let old_conditions = status.conditions.take().unwrap_or_default();
    let ours = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];
    let mut conditions = vec![
        node_condition(
            &old_conditions,
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            now,
        ),
        node_condition(
            &old_conditions,
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
            now,
        ),
        node_condition(
            &old_conditions,
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            now,
        ),
        node_condition(
            &old_conditions,
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
            now,
        ),
    ];
    conditions.extend(
        old_conditions
            .into_iter()
            .filter(|c| !ours.contains(&c.type_.as_str())),
    );
    status.conditions = Some(conditions);
    status.capacity = Some(quantities(config));
    status.allocatable = Some(quantities(config));
    status.addresses = Some(vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: config.address.clone(),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: config.node_name.clone(),
        },
    ]);
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint { port: port.into() }),
    });
    status.node_info = Some(config.system_info.clone());
    status
}

fn without_heartbeats(s: &NodeStatus) -> NodeStatus {
    let mut s = s.clone();
    for c in s.conditions.iter_mut().flatten() {
        c.last_heartbeat_time = None;
    }
    s
}

/// Whether `desired` must be written over `current`: it differs in anything but heartbeat
/// times, or the last report is older than the report frequency.
pub fn needs_report(current: Option<&NodeStatus>, desired: &NodeStatus, report_due: bool) -> bool {
    match current {
        None => true,
        Some(c) => report_due || without_heartbeats(c) != without_heartbeats(desired),
    }
}

/// Registers one node and keeps its status reported.
pub struct NodeReporter {
    api: Api<Node>,
    nodes: Store<Node>,
    config: std::sync::Arc<AgentConfig>,
    port: u16,
    last_report: Option<Instant>,
    /// Where `status.images` comes from, if the node has images.
    runtime: Option<std::sync::Arc<dyn crate::runtime::PodRuntime>>,
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

impl NodeReporter {
    /// A reporter writing through `client` and reading the node from `nodes` (an informer
    /// cache that covers it).
    pub fn new(
        client: Client,
        nodes: Store<Node>,
        config: std::sync::Arc<AgentConfig>,
        port: u16,
    ) -> Self {
        NodeReporter {
            api: Api::all(client),
            nodes,
            config,
            port,
            last_report: None,
            runtime: None,
        }
    }

    /// Reports `runtime`'s images as `status.images` from now on.
    pub fn with_images_from(
        mut self,
        runtime: std::sync::Arc<dyn crate::runtime::PodRuntime>,
    ) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// The status to write: [`desired_status`] with the runtime's images, when it has them.
    async fn status_with_images(&self, old: Option<&NodeStatus>) -> NodeStatus {
        let mut status = desired_status(&self.config, self.port, old, crate::status::now());
        if let Some(runtime) = &self.runtime {
            if let Some(images) = runtime.images().await {
                status.images = Some(images);
            }
        }
        status
    }

    /// Creates the Node, or (after a restart) adds our labels and taints to the existing
    /// one, then writes its status. Returns the node as stored.
    pub async fn register(&mut self) -> Result<Node, ClientError> {
        let name = self.config.node_name.clone();
        loop {
            let node = match self.api.get_opt(&name).await? {
                None => {
                    let node = new_node(&self.config, self.port, crate::status::now());
                    match self.api.create(&params(), &node).await {
                        Ok(n) => n,
                        Err(e) if e.is_already_exists() => continue,
                        Err(e) => return Err(e),
                    }
                }
                Some(existing) => match merge_registration(&existing, &self.config) {
                    None => existing,
                    Some(merged) => match self.api.replace(&name, &params(), &merged).await {
                        Ok(n) => n,
                        Err(e) if e.is_conflict() => continue,
                        Err(e) => return Err(e),
                    },
                },
            };
            match self.write_status(node).await {
                Ok(n) => {
                    tracing::info!(node = %name, "node registered");
                    return Ok(n);
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    async fn write_status(&mut self, mut node: Node) -> Result<Node, ClientError> {
        node.status = Some(self.status_with_images(node.status.as_ref()).await);
        let name = self.config.node_name.clone();
        let written = self.api.replace_status(&name, &params(), &node).await?;
        self.last_report = Some(Instant::now());
        Ok(written)
    }

    /// The uid of the Node as the cache shows it.
    pub fn node_uid(&self) -> Option<String> {
        let key = ObjectKey::new(None, &self.config.node_name);
        self.nodes.get(&key)?.metadata.uid.clone()
    }

    /// Writes the node's status if it changed or is due; re-registers a node that was
    /// deleted. Returns whether anything was written.
    pub async fn report(&mut self) -> Result<bool, ClientError> {
        let key = ObjectKey::new(None, &self.config.node_name);
        let Some(current) = self.nodes.get(&key) else {
            if !self.nodes.has_synced() {
                return Ok(false);
            }
            // Deleted, or not yet seen by the cache: a direct read decides.
            if self.api.get_opt(&self.config.node_name).await?.is_some() {
                return Ok(false);
            }
            tracing::warn!(node = %self.config.node_name, "the Node was deleted; registering again");
            self.register().await?;
            return Ok(true);
        };
        let due = self
            .last_report
            .is_none_or(|t| t.elapsed() >= self.config.status_report_frequency);
        let desired = self.status_with_images(current.status.as_ref()).await;
        if !needs_report(current.status.as_ref(), &desired, due) {
            return Ok(false);
        }
        self.write_status((*current).clone()).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Taint;

    fn config() -> AgentConfig {
        let mut c = AgentConfig::local("n1");
        c.address = "10.1.2.3".into();
        c.capacity.cpu = "4".into();
        c.capacity.memory = "8Gi".into();
        c.capacity.pods = 50;
        c.taints = vec![Taint {
            key: "dedicated".into(),
            value: Some("gpu".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }];
        c.labels.insert("zone".into(), "a".into());
        c
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn cond<'a>(s: &'a NodeStatus, t: &str) -> &'a NodeCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
    }

    #[test]
    fn new_node_carries_labels_taints_capacity_and_endpoint() {
        let n = new_node(&config(), 10250, ts(10));
        let l = n.metadata.labels.as_ref().unwrap();
        assert_eq!(l["kubernetes.io/hostname"], "n1");
        assert_eq!(l["kubernetes.io/os"], "linux");
        assert_eq!(l["zone"], "a");
        assert!(l.contains_key("kubernetes.io/arch"));
        assert_eq!(n.spec.as_ref().unwrap().taints.as_ref().unwrap().len(), 1);
        let s = n.status.unwrap();
        assert_eq!(s.capacity.as_ref().unwrap()["pods"], Quantity("50".into()));
        assert_eq!(
            s.allocatable.as_ref().unwrap()["memory"],
            Quantity("8Gi".into())
        );
        assert_eq!(s.addresses.as_ref().unwrap()[0].address, "10.1.2.3");
        assert_eq!(s.addresses.as_ref().unwrap()[1].type_, "Hostname");
        assert_eq!(
            s.daemon_endpoints
                .clone()
                .unwrap()
                .kubelet_endpoint
                .unwrap()
                .port,
            10250
        );
        assert_eq!(cond(&s.clone(), "Ready").status, "True");
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("KubeletReady"));
        assert_eq!(cond(&s, "PIDPressure").status, "False");
        assert!(s.node_info.unwrap().kubelet_version.starts_with("v1.32"));
    }

    #[test]
    fn unchanged_status_needs_no_report_until_due_but_unknown_ready_does() {
        let c = config();
        let first = desired_status(&c, 1, None, ts(10));
        let later = desired_status(&c, 1, Some(&first), ts(20));
        // Only heartbeats moved; transition times are kept.
        assert_eq!(
            cond(&later, "Ready").last_transition_time,
            Some(Time(ts(10)))
        );
        assert!(!needs_report(Some(&first), &later, false));
        assert!(needs_report(Some(&first), &later, true));
        assert!(needs_report(None, &later, false));

        // The lifecycle controller marked the node Unknown: report Ready=True again, with a
        // new transition time and heartbeat.
        let mut unknown = first.clone();
        for cnd in unknown.conditions.iter_mut().flatten() {
            if cnd.type_ == "Ready" {
                cnd.status = "Unknown".into();
                cnd.reason = Some("NodeStatusUnknown".into());
            }
        }
        let fixed = desired_status(&c, 1, Some(&unknown), ts(30));
        assert!(needs_report(Some(&unknown), &fixed, false));
        assert_eq!(cond(&fixed, "Ready").status, "True");
        assert_eq!(
            cond(&fixed, "Ready").last_transition_time,
            Some(Time(ts(30)))
        );
        assert_eq!(
            cond(&fixed, "Ready").last_heartbeat_time,
            Some(Time(ts(30)))
        );
        // A changed port is a change too.
        assert!(needs_report(
            Some(&first),
            &desired_status(&c, 2, Some(&first), ts(20)),
            false
        ));
    }

    #[test]
    fn registration_merges_into_an_existing_node() {
        let c = config();
        let mut existing = new_node(&c, 1, ts(1));
        assert!(merge_registration(&existing, &c).is_none());
        // A taint from the lifecycle controller stays; a missing label comes back.
        existing.metadata.labels.as_mut().unwrap().remove("zone");
        existing
            .spec
            .as_mut()
            .unwrap()
            .taints
            .as_mut()
            .unwrap()
            .push(Taint {
                key: "node.kubernetes.io/unreachable".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            });
        let merged = merge_registration(&existing, &c).unwrap();
        assert_eq!(merged.metadata.labels.as_ref().unwrap()["zone"], "a");
        assert_eq!(merged.spec.unwrap().taints.unwrap().len(), 2);
    }

    #[test]
    fn registration_sets_the_agents_annotations_and_keeps_others() {
        let mut c = config();
        c.annotations
            .insert("setpoint.io/process-pod-network".into(), "host".into());
        let mut existing = new_node(&c, 1, ts(1));
        assert_eq!(
            existing.metadata.annotations.as_ref().unwrap()["setpoint.io/process-pod-network"],
            "host"
        );
        assert!(merge_registration(&existing, &c).is_none());
        existing
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("someone.else/note".into(), "kept".into());
        c.annotations
            .insert("setpoint.io/process-pod-network".into(), "bridge".into());
        let merged = merge_registration(&existing, &c).unwrap();
        let a = merged.metadata.annotations.unwrap();
        assert_eq!(a["setpoint.io/process-pod-network"], "bridge");
        assert_eq!(a["someone.else/note"], "kept");
    }
}
