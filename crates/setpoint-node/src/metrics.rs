//! The node agent's Prometheus metrics, served at `/metrics` on its port as kubelet serves
//! them on 10250: the runtime's own series (the pod workers' `workqueue_*`, the agent's
//! `rest_client_*` requests, `informer_decode_errors_total`) and kubelet's gauges of what the
//! node runs, under upstream's names:
//!
//! | series | meaning |
//! |---|---|
//! | `kubelet_running_pods` | pods the runtime holds that have not finished (kubelet: pods with a running sandbox) |
//! | `kubelet_running_containers{container_state}` | containers of those pods by state: `running`, `exited` (terminated, or waiting to restart after a run), `created` and `unknown` (never reported here: no container exists before it starts, and every held pod's state is known) |
//!
//! The gauges are computed when scraped, from the pods the runtimes hold and the status the
//! agent last wrote for them, so they cost nothing between scrapes. A process hosting several
//! nodes (simulated ones) serves one endpoint, whose gauges sum over its nodes.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use setpoint_runtime::metrics::{ClientMetrics, InformerMetrics, Registry};
use setpoint_runtime::workqueue::WorkQueueMetrics;

/// The `container_state` values of `kubelet_running_containers`, as kubelet's container
/// runtime names them.
const CONTAINER_STATES: [&str; 4] = ["created", "running", "exited", "unknown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerState {
    container_state: String,
}

/// The metrics of one node agent process and the registry they are served from. Create one
/// per process, hand its parts to the agent's client, informers and pod workers, and serve
/// [`exposition`](Self::exposition).
pub struct NodeMetrics {
    registry: Registry,
    workqueue: WorkQueueMetrics,
    informers: InformerMetrics,
    client: Arc<ClientMetrics>,
    running_pods: Gauge,
    running_containers: Family<ContainerState, Gauge>,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    /// Creates every metric and registers it in a registry of its own.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let workqueue = WorkQueueMetrics::new();
        workqueue.register(&mut registry);
        let informers = InformerMetrics::new(&mut registry);
        let client = Arc::new(ClientMetrics::new(&mut registry));
        let running_pods = Gauge::default();
        registry.register(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
            running_pods.clone(),
        );
        let running_containers = Family::<ContainerState, Gauge>::default();
        registry.register(
            "kubelet_running_containers",
            "Number of containers currently running",
            running_containers.clone(),
        );
        NodeMetrics {
            registry,
            workqueue,
            informers,
            client,
            running_pods,
            running_containers,
        }
    }

    /// What the pod workers' queues record into.
    pub fn workqueue(&self) -> &WorkQueueMetrics {
        &self.workqueue
    }

    /// What the agent's informers count skipped objects in.
    pub fn informers(&self) -> &InformerMetrics {
        &self.informers
    }

    /// What the agent's API client records request latency in.
    pub fn client(&self) -> &Arc<ClientMetrics> {
        &self.client
    }

    /// The Prometheus exposition for a scrape that sent `accept`, with the kubelet gauges set
    /// from `held`: for each pod a runtime holds, the pod as the informer cache has it (`None`
    /// when the API no longer shows it). Returns the `Content-Type` and the body.
    pub fn exposition<'a>(
        &self,
        held: impl IntoIterator<Item = Option<&'a Pod>>,
        accept: &str,
    ) -> (&'static str, String) {
        let tally = Tally::of(held);
        self.running_pods.set(tally.pods);
        for (state, n) in CONTAINER_STATES.iter().zip(tally.containers) {
            self.running_containers
                .get_or_create(&ContainerState {
                    container_state: (*state).to_string(),
                })
                .set(n);
        }
        setpoint_runtime::metrics::exposition(&self.registry, accept)
    }
}

/// The kubelet gauges' values: running pods, and containers per [`CONTAINER_STATES`] entry.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    pods: i64,
    containers: [i64; 4],
}

impl Tally {
    fn of<'a>(held: impl IntoIterator<Item = Option<&'a Pod>>) -> Tally {
        let mut t = Tally::default();
        for pod in held {
            let Some(pod) = pod else {
                // Held but gone from the API: being stopped, so still running until it is.
                t.pods += 1;
                continue;
            };
            let status = pod.status.as_ref();
            let finished = matches!(
                status.and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            if !finished {
                t.pods += 1;
            }
            let containers = status.into_iter().flat_map(|s| {
                s.init_container_statuses
                    .iter()
                    .chain(&s.container_statuses)
                    .flatten()
            });
            for c in containers {
                let state = c.state.as_ref();
                let index = if state.is_some_and(|s| s.running.is_some()) {
                    Some(1)
                } else if state.is_some_and(|s| s.terminated.is_some())
                    || c.last_state
                        .as_ref()
                        .is_some_and(|s| s.terminated.is_some())
                {
                    // Terminated, or waiting to restart: its last run is an exited container.
                    Some(2)
                } else {
                    // Waiting for its first start: no container exists yet.
                    None
                };
                if let Some(i) = index {
                    t.containers[i] += 1;
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState as State, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, ContainerStatus, PodStatus,
    };

    fn status(name: &str, state: State, last: Option<State>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            state: Some(state),
            last_state: last,
            ..Default::default()
        }
    }

    fn running() -> State {
        State {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }
    }

    fn terminated() -> State {
        State {
            terminated: Some(ContainerStateTerminated::default()),
            ..Default::default()
        }
    }

    fn waiting() -> State {
        State {
            waiting: Some(ContainerStateWaiting::default()),
            ..Default::default()
        }
    }

    fn pod(phase: &str, statuses: Vec<ContainerStatus>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: Some(statuses),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn tally_counts_unfinished_pods_and_containers_by_state() {
        let web = pod(
            "Running",
            vec![
                status("app", running(), None),
                // CrashLoopBackOff: waiting, its last run exited.
                status("sidecar", waiting(), Some(terminated())),
            ],
        );
        let starting = pod("Pending", vec![status("app", waiting(), None)]);
        let done = pod("Succeeded", vec![status("app", terminated(), None)]);
        let t = Tally::of([Some(&web), Some(&starting), Some(&done), None]);
        assert_eq!(
            t,
            Tally {
                pods: 3,
                containers: [0, 1, 2, 0],
            }
        );
        assert_eq!(Tally::of(std::iter::empty()), Tally::default());
    }

    #[test]
    fn exposition_has_the_kubelet_gauges_with_upstream_names() {
        let m = NodeMetrics::new();
        let web = pod("Running", vec![status("app", running(), None)]);
        let (_, text) = m.exposition([Some(&web)], "");
        assert!(text.contains("kubelet_running_pods 1\n"), "{text}");
        assert!(
            text.contains("kubelet_running_containers{container_state=\"running\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_running_containers{container_state=\"exited\"} 0\n"),
            "{text}"
        );
        // Values follow what is held now, not what was held at an earlier scrape.
        let (_, text) = m.exposition([], "");
        assert!(text.contains("kubelet_running_pods 0\n"), "{text}");
    }
}
