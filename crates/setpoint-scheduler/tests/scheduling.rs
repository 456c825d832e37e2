//! The scheduler against a real in-process API server.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use serde_json::{json, Value};
use setpoint_runtime::client::{
    Api, Body, Client, ClientError, DeleteParams, ListParams, Patch, PatchParams, PostParams,
    Transport,
};
use setpoint_scheduler::SchedulerConfig;
use setpoint_testing::TestCluster;
use tokio::sync::{oneshot, watch};

const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `check` until it returns `Some`, failing the test after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    setpoint_testing::eventually_within(DEADLINE, what, check).await
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().map(|s| s.send(()));
        self.task.await.unwrap();
    }
}

fn config() -> SchedulerConfig {
    SchedulerConfig {
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        ..SchedulerConfig::default()
    }
}

fn start(client: Client, leader: Option<watch::Receiver<bool>>) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(setpoint_scheduler::run(
        client,
        config(),
        leader,
        async move {
            let _ = stopped.await;
        },
    ));
    Running {
        stop: Some(stop),
        task,
    }
}

/// Creates a Ready node with `cpu`, `memory` and room for 110 pods.
async fn node(client: &Client, name: &str, cpu: &str, memory: &str, spec: Value, labels: Value) {
    let nodes: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let resources = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

fn pod_json(name: &str, cpu: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]},
    })
}

async fn create_pod(client: &Client, v: Value) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p: Pod = serde_json::from_value(v).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
}

async fn get_pod(client: &Client, name: &str) -> Pod {
    Api::<Pod>::namespaced(client.clone(), "default")
        .get(name)
        .await
        .unwrap()
}

fn node_name(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

async fn bound_to(client: &Client, name: &str) -> String {
    eventually(&format!("{name} to be bound"), || async {
        node_name(&get_pod(client, name).await)
    })
    .await
}

/// Waits for PodScheduled=False/Unschedulable and returns its message.
async fn unschedulable_message(client: &Client, name: &str) -> String {
    eventually(&format!("{name} to be marked unschedulable"), || async {
        let p = get_pod(client, name).await;
        let c = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| c.message.unwrap_or_default())
    })
    .await
}

async fn failed_scheduling_event(client: &Client, pod: &str) -> Event {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually(&format!("a FailedScheduling event for {pod}"), || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.involved_object.name.as_deref() == Some(pod)
            })
    })
    .await
}

#[tokio::test]
async fn binds_pending_pods_onto_ready_nodes() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    for n in ["n1", "n2", "n3"] {
        node(&client, n, "4", "8Gi", json!({}), json!({})).await;
    }
    // A node that is not Ready never gets pods.
    let nodes: Api<Node> = Api::all(client.clone());
    let mut not_ready = Node::default();
    not_ready.metadata.name = Some("down".into());
    nodes
        .create(&PostParams::default(), &not_ready)
        .await
        .unwrap();

    // Some pods exist before the scheduler starts, some arrive after.
    for i in 0..5 {
        create_pod(&client, pod_json(&format!("early-{i}"), "100m")).await;
    }
    let scheduler = start(client.clone(), None);
    for i in 0..5 {
        create_pod(&client, pod_json(&format!("late-{i}"), "100m")).await;
    }
    let mut used = HashMap::new();
    for name in (0..5).flat_map(|i| [format!("early-{i}"), format!("late-{i}")]) {
        let n = bound_to(&client, &name).await;
        assert!(["n1", "n2", "n3"].contains(&n.as_str()), "{name} on {n}");
        *used.entry(n).or_insert(0) += 1;
        let p = get_pod(&client, &name).await;
        let scheduled = p
            .status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == "PodScheduled"))
            .unwrap();
        assert_eq!(scheduled.status, "True");
    }
    // Least-allocated scoring spreads ten small pods over three empty nodes.
    assert_eq!(used.len(), 3, "{used:?}");
    // A pod for another scheduler is left alone (checked after ours was handled, later).
    let mut other = pod_json("other", "100m");
    other["spec"]["schedulerName"] = json!("someone-else");
    create_pod(&client, other).await;
    create_pod(&client, pod_json("marker", "100m")).await;
    bound_to(&client, "marker").await;
    assert_eq!(node_name(&get_pod(&client, "other").await), None);
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn an_unschedulable_pod_is_reported_and_placed_when_a_node_fits() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    node(&client, "small", "2", "4Gi", json!({}), json!({})).await;
    let scheduler = start(client.clone(), None);
    create_pod(&client, pod_json("big", "8")).await;
    let message = unschedulable_message(&client, "big").await;
    assert_eq!(message, "0/1 nodes are available: 1 Insufficient cpu.");
    let event = failed_scheduling_event(&client, "big").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(message.as_str()));
    assert_eq!(
        event.source.and_then(|s| s.component).as_deref(),
        Some("default-scheduler")
    );
    // A big enough node is a cluster event that retries the pod.
    node(&client, "large", "16", "32Gi", json!({}), json!({})).await;
    assert_eq!(bound_to(&client, "big").await, "large");
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn node_selectors_taints_and_tolerations() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    node(
        &client,
        "gpu",
        "4",
        "8Gi",
        json!({"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}),
        json!({"accelerator": "gpu"}),
    )
    .await;
    node(
        &client,
        "plain",
        "4",
        "8Gi",
        json!({}),
        json!({"disk": "ssd"}),
    )
    .await;
    let scheduler = start(client.clone(), None);

    let mut selected_untolerated = pod_json("wants-gpu", "100m");
    selected_untolerated["spec"]["nodeSelector"] = json!({"accelerator": "gpu"});
    create_pod(&client, selected_untolerated).await;
    let mut gpu_job = pod_json("gpu-job", "100m");
    gpu_job["spec"]["nodeSelector"] = json!({"accelerator": "gpu"});
    gpu_job["spec"]["tolerations"] =
        json!([{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]);
    create_pod(&client, gpu_job).await;
    let mut affinity = pod_json("wants-ssd", "100m");
    affinity["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]
    }}});
    affinity["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    create_pod(&client, affinity).await;
    for i in 0..4 {
        create_pod(&client, pod_json(&format!("plain-{i}"), "100m")).await;
    }

    assert_eq!(bound_to(&client, "gpu-job").await, "gpu");
    assert_eq!(bound_to(&client, "wants-ssd").await, "plain");
    for i in 0..4 {
        assert_eq!(bound_to(&client, &format!("plain-{i}")).await, "plain");
    }
    assert_eq!(
        unschedulable_message(&client, "wants-gpu").await,
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
         1 node(s) had untolerated taint {gpu: true}."
    );
    // Removing the taint is a node change, which retries the pod.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "gpu",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    assert_eq!(bound_to(&client, "wants-gpu").await, "gpu");
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn many_pods_at_once_never_overcommit_small_nodes() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    for n in ["a", "b", "c"] {
        node(&client, n, "1", "8Gi", json!({}), json!({})).await;
    }
    let scheduler = start(client.clone(), None);
    let creates: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(
                async move { create_pod(&client, pod_json(&format!("p{i}"), "300m")).await },
            )
        })
        .collect();
    for c in creates {
        c.await.unwrap();
    }
    // Three 300m pods fit in each 1-CPU node: 9 bound, 11 reported unschedulable.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (bound, unschedulable) = eventually("every pod to be bound or reported", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let bound: Vec<Pod> = list
            .iter()
            .filter(|p| node_name(p).is_some())
            .cloned()
            .collect();
        let reported = list
            .iter()
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
                    })
            })
            .count();
        (bound.len() + reported == 20).then_some((bound, reported))
    })
    .await;
    assert_eq!(bound.len(), 9);
    assert_eq!(unschedulable, 11);
    let mut per_node: HashMap<String, usize> = HashMap::new();
    for p in &bound {
        *per_node.entry(node_name(p).unwrap()).or_default() += 1;
    }
    assert_eq!(
        per_node.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
    let message = unschedulable_message(&client, &{
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        list.into_iter()
            .find(|p| node_name(p).is_none())
            .and_then(|p| p.metadata.name)
            .unwrap()
    })
    .await;
    assert_eq!(message, "0/3 nodes are available: 3 Insufficient cpu.");
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn pods_already_on_a_node_count_and_deleting_them_frees_room() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    node(&client, "only", "1", "8Gi", json!({}), json!({})).await;
    let mut resident = pod_json("resident", "800m");
    resident["spec"]["nodeName"] = json!("only");
    create_pod(&client, resident).await;
    // A finished pod on the node no longer holds its requests.
    let mut finished = pod_json("finished", "900m");
    finished["spec"]["nodeName"] = json!("only");
    create_pod(&client, finished).await;
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status(
            "finished",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap();
    let scheduler = start(client.clone(), None);
    create_pod(&client, pod_json("tiny", "100m")).await;
    assert_eq!(bound_to(&client, "tiny").await, "only");
    create_pod(&client, pod_json("waiting", "500m")).await;
    assert_eq!(
        unschedulable_message(&client, "waiting").await,
        "0/1 nodes are available: 1 Insufficient cpu."
    );
    Api::<Pod>::namespaced(client.clone(), "default")
        // Force: a bound pod is otherwise deleted gracefully and keeps its room until its
        // node agent confirms it stopped (there is none here).
        .delete(
            "resident",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(bound_to(&client, "waiting").await, "only");
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn binds_only_while_leading() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    node(&client, "n", "4", "8Gi", json!({}), json!({})).await;
    let (lead, leader) = watch::channel(false);
    let standby = start(client.clone(), Some(leader));
    // A leading scheduler for another name proves time passes and pods get handled while
    // the standby holds back.
    let (other_stop, other_stopped) = oneshot::channel::<()>();
    let other = tokio::spawn(setpoint_scheduler::run(
        client.clone(),
        SchedulerConfig {
            scheduler_name: "other".into(),
            ..config()
        },
        None,
        async move {
            let _ = other_stopped.await;
        },
    ));
    create_pod(&client, pod_json("mine", "100m")).await;
    let mut probe = pod_json("probe", "100m");
    probe["spec"]["schedulerName"] = json!("other");
    create_pod(&client, probe).await;
    bound_to(&client, "probe").await;
    assert_eq!(node_name(&get_pod(&client, "mine").await), None);
    lead.send(true).unwrap();
    assert_eq!(bound_to(&client, "mine").await, "n");
    standby.stop().await;
    let _ = other_stop.send(());
    other.await.unwrap();
    cluster.stop().await;
}

/// Forwards to a real client, but refuses the first `failures` binds.
struct FailingBinds {
    inner: Client,
    failures: AtomicUsize,
    binds: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl Transport for FailingBinds {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default();
        if req.method() == http::Method::POST && req.uri().path().ends_with("/binding") {
            self.binds.fetch_add(1, Ordering::SeqCst);
            let left = self.failures.load(Ordering::SeqCst);
            if left > 0 {
                self.failures.store(left - 1, Ordering::SeqCst);
                return Err(ClientError::Transport("injected bind failure".into()));
            }
        }
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let (parts, body) = req.into_parts();
        self.inner
            .send(parts.method, &path, content_type.as_deref(), body)
            .await
    }
}

#[tokio::test]
async fn a_failed_bind_frees_the_room_and_is_retried() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    // One node with room for exactly one such pod: had the failed attempt's assumption
    // been kept, the retry would find the node full.
    node(&client, "only", "1", "8Gi", json!({}), json!({})).await;
    let binds = Arc::new(AtomicUsize::new(0));
    let flaky = Client::new(FailingBinds {
        inner: client.clone(),
        failures: AtomicUsize::new(2),
        binds: binds.clone(),
    });
    let scheduler = start(flaky, None);
    create_pod(&client, pod_json("p", "800m")).await;
    assert_eq!(bound_to(&client, "p").await, "only");
    assert_eq!(
        binds.load(Ordering::SeqCst),
        3,
        "two refused binds, then one that worked"
    );
    let event = failed_scheduling_event(&client, "p").await;
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("Binding rejected:")),
        "{event:?}"
    );
    scheduler.stop().await;
    cluster.stop().await;
}

#[tokio::test]
async fn changing_a_waiting_pod_retries_it() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    node(
        &client,
        "tainted",
        "4",
        "8Gi",
        json!({"taints": [{"key": "team", "value": "a", "effect": "NoSchedule"}]}),
        json!({}),
    )
    .await;
    let scheduler = start(client.clone(), None);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // Unschedulable until it tolerates the taint; adding the toleration is a spec change.
    let mut intolerant = pod_json("intolerant", "100m");
    intolerant["spec"]["tolerations"] = json!([{"key": "other", "operator": "Exists"}]);
    create_pod(&client, intolerant).await;
    assert_eq!(
        unschedulable_message(&client, "intolerant").await,
        "0/1 nodes are available: 1 node(s) had untolerated taint {team: a}."
    );
    pods.patch(
        "intolerant",
        &PatchParams::default(),
        // Appended: pod updates may only add tolerations.
        &Patch::Json(json!([{"op": "add", "path": "/spec/tolerations/-", "value":
            {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
        }])),
    )
    .await
    .unwrap();
    assert_eq!(bound_to(&client, "intolerant").await, "tainted");

    // A gated pod waits for its gates to go, then is scheduled.
    let mut gated = pod_json("gated", "100m");
    gated["spec"]["schedulingGates"] = json!([{"name": "example.com/wait"}]);
    gated["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    create_pod(&client, gated).await;
    let mut probe = pod_json("probe", "100m");
    probe["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    create_pod(&client, probe).await;
    bound_to(&client, "probe").await;
    assert_eq!(node_name(&get_pod(&client, "gated").await), None);
    pods.patch(
        "gated",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
    )
    .await
    .unwrap();
    assert_eq!(bound_to(&client, "gated").await, "tainted");
    scheduler.stop().await;
    cluster.stop().await;
}
