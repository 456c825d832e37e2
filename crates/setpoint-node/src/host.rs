//! Hosting nodes: the part the local agent and the simulation host share.
//!
//! A host runs any number of nodes (one for `run_agent`, N for `run_simulated`) on one pod
//! informer and one node informer. Per node it registers the `Node`, runs a heartbeat task
//! (Lease renewals, and status reports when needed) and a set of [`PodWorkers`]; the pod
//! informer's events are routed by `spec.nodeName` to the node's workers, so a pod bound to a
//! node this process does not host costs nothing but its cache entry.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use parking_lot::Mutex;
use setpoint_runtime::client::Client;
use setpoint_runtime::informer::{Event, Informer};
use setpoint_runtime::workqueue::WorkQueueMetrics;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::agent::{AgentConfig, AgentError};
use crate::lease::LeaseRenewer;
use crate::node::NodeReporter;
use crate::podworker::PodWorkers;
use crate::runtime::{NodeContext, PodRuntime, Sources};
use crate::sources::ApiSources;

/// How many nodes register at once when a host starts many.
const REGISTER_CONCURRENCY: usize = 32;
/// Registration attempts before a host gives up on starting.
const REGISTER_ATTEMPTS: u32 = 6;

/// One node to host.
pub(crate) struct HostedNode {
    /// What the node writes through: its registration, Lease, status reports and pod writes
    /// (under the Node authorizer and NodeRestriction, a client of the node's own identity).
    pub client: Client,
    pub config: Arc<AgentConfig>,
    pub runtime: Arc<dyn PodRuntime>,
    /// Delay of the first periodic Lease renewal, to spread many nodes' renewals over the interval.
    pub lease_offset: Duration,
    /// Where the node's pod work queue records its metrics, if anywhere.
    pub queue_metrics: Option<WorkQueueMetrics>,
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

async fn register(reporter: &mut NodeReporter, name: &str) -> Result<Node, AgentError> {
    let mut delay = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        match reporter.register().await {
            Ok(n) => return Ok(n),
            Err(e) if attempt < REGISTER_ATTEMPTS => {
                tracing::warn!(node = %name, error = %e, "registering the node failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            Err(e) => return Err(AgentError::Register(name.to_string(), e)),
        }
    }
}

/// Renews the Lease every `lease_interval` and reports status every `status_interval` when
/// it changed or is due. Runs until aborted.
async fn heartbeat(mut lease: LeaseRenewer, mut reporter: NodeReporter, mut node: HostedNodeTimes) {
    // Zero intervals would spin; nothing needs to be faster than this.
    let floor = Duration::from_millis(50);
    node.lease_interval = node.lease_interval.max(floor);
    node.status_interval = node.status_interval.max(floor);
    let start = Instant::now();
    // The first renewal happened at registration; node i of n then renews at i/n of the
    // interval, so many nodes' renewals arrive evenly.
    let first = if node.lease_offset.is_zero() {
        node.lease_interval
    } else {
        node.lease_offset
    };
    let mut next_lease = start + first;
    let mut next_status = start + node.lease_offset + node.status_interval;
    loop {
        tokio::time::sleep_until(next_lease.min(next_status)).await;
        let now = Instant::now();
        if now >= next_lease {
            if let Some(uid) = reporter.node_uid() {
                lease.set_owner(&uid);
            }
            next_lease = match lease.renew().await {
                Ok(()) => next_lease + node.lease_interval,
                Err(e) => {
                    tracing::warn!(node = %node.name, error = %e, "renewing the node Lease failed");
                    now + node.lease_interval.min(Duration::from_secs(1))
                }
            };
            // Never try to catch up on missed renewals in a burst.
            next_lease = next_lease.max(now);
        }
        if now >= next_status {
            if let Err(e) = reporter.report().await {
                tracing::warn!(node = %node.name, error = %e, "reporting node status failed");
            }
            next_status = (next_status + node.status_interval).max(now);
        }
    }
}

struct HostedNodeTimes {
    name: String,
    lease_offset: Duration,
    lease_interval: Duration,
    status_interval: Duration,
}

/// A registered node whose heartbeat runs, its pod workers ready to start.
struct Registered {
    workers: PodWorkers,
    sources: Arc<ApiSources>,
    pod_workers: usize,
    resync: Duration,
}

/// Registers `node` and starts its heartbeat in `heartbeats` at once: with many nodes
/// registering, the first must not wait for the last to keep their Leases fresh.
async fn register_node(
    pods: Informer<Pod>,
    nodes: Informer<Node>,
    port: u16,
    node: HostedNode,
    heartbeats: Arc<Mutex<JoinSet<()>>>,
) -> Result<Registered, AgentError> {
    let config = node.config.clone();
    let client = node.client.clone();
    let mut reporter = NodeReporter::new(client.clone(), nodes.store(), config.clone(), port)
        .with_images_from(Arc::clone(&node.runtime));
    let registered = register(&mut reporter, &config.node_name).await?;
    let mut lease = LeaseRenewer::new(
        client.clone(),
        &config.node_name,
        registered.metadata.uid.as_deref(),
    );
    // A node has its Lease as soon as it is registered, as the kubelet does.
    if let Err(e) = lease.renew().await {
        tracing::warn!(node = %config.node_name, error = %e, "creating the node Lease failed; the heartbeat retries");
    }
    let times = HostedNodeTimes {
        name: config.node_name.clone(),
        lease_offset: node.lease_offset,
        lease_interval: config.lease_interval,
        status_interval: config.status_interval,
    };
    heartbeats.lock().spawn(heartbeat(lease, reporter, times));
    let sources = Arc::new(ApiSources::new(client.clone(), config.api_server.clone()));
    let context = NodeContext {
        node_name: config.node_name.clone(),
        host_ip: config.address.clone(),
        sources: Some(Sources(sources.clone())),
    };
    let workers = PodWorkers::new(client, context, node.runtime, pods.store());
    // A change of an object a pod names syncs the pod again.
    let resync = workers.clone();
    sources.set_resync(Box::new(move |pod| resync.enqueue(pod)));
    if let Some(m) = &node.queue_metrics {
        workers.record_metrics(m);
    }
    Ok(Registered {
        workers,
        sources,
        pod_workers: config.pod_workers,
        resync: config.resync_interval,
    })
}

/// Hosts `nodes` on the given (started) informers until `shutdown`, each writing through its
/// own client. Pods keep running in their runtimes when it returns.
pub(crate) async fn run(
    pods: Informer<Pod>,
    nodes: Informer<Node>,
    port: u16,
    hosted: Vec<HostedNode>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    // Dropping the set (any return) stops every heartbeat.
    let heartbeats = Arc::new(Mutex::new(JoinSet::new()));
    let startup = async {
        pods.wait_synced().await?;
        nodes.wait_synced().await?;
        let registered: Vec<Result<Registered, AgentError>> = futures::stream::iter(
            hosted
                .into_iter()
                .map(|n| register_node(pods.clone(), nodes.clone(), port, n, heartbeats.clone())),
        )
        .buffer_unordered(REGISTER_CONCURRENCY)
        .collect()
        .await;
        registered.into_iter().collect::<Result<Vec<_>, _>>()
    };
    // Shutting down while still registering (an unreachable API server) ends at once.
    let mut shutdown = std::pin::pin!(shutdown);
    let registered = tokio::select! {
        r = startup => r?,
        _ = &mut shutdown => return Ok(()),
    };
    let mut tasks = std::mem::take(&mut *heartbeats.lock());
    let mut workers = HashMap::new();
    for r in registered {
        r.workers.spawn(r.pod_workers, r.resync, &mut tasks);
        workers.insert(r.workers.node().node_name.clone(), (r.workers, r.sources));
    }
    let workers = Arc::new(workers);
    let routed = workers.clone();
    let routing = pods.subscribe(Arc::new(move |event: &Event<Pod>| {
        if let Some((w, sources)) = node_of(event.object()).and_then(|n| routed.get(n)) {
            // What the pod names is tracked before its sync reads it.
            sources.observe(event);
            w.enqueue(event.key());
        }
    }));
    // After a restart: reconcile what the runtimes still hold against the API.
    for (w, _) in workers.values() {
        w.enqueue_all().await;
    }
    tracing::info!(nodes = workers.len(), "hosting nodes");
    shutdown.await;
    // The informer may be shared with other components and outlive these nodes.
    pods.unsubscribe(routing);
    for (w, _) in workers.values() {
        w.shutdown().await;
    }
    tasks.shutdown().await;
    Ok(())
}
