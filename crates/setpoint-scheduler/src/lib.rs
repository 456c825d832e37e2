//! Setpoint's scheduler: places pending pods on nodes the way kube-scheduler does, fast.
//!
//! It watches pods that have no `spec.nodeName` and name this scheduler (`default-scheduler`
//! by default), and all nodes. For each pod it filters the nodes (Ready, not cordoned,
//! taints vs tolerations, `nodeSelector` and required node affinity, CPU / memory / pod-count
//! requests vs allocatable), scores the feasible ones (least-allocated, balanced-allocation,
//! preferred node affinity, PreferNoSchedule taints) and binds the pod to the best through
//! `pods/binding`. A pod that fits nowhere gets `PodScheduled=False` (reason
//! `Unschedulable`) and a `FailedScheduling` event with Kubernetes' message, and is retried
//! when the cluster changes.
//!
//! Throughput comes from keeping the whole decision in memory: per-node totals are updated
//! incrementally, a pod counts on its node the moment it is chosen (before the bind is
//! observed), large clusters are sampled as Kubernetes' `percentageOfNodesToScore` does, and
//! many binds are in flight at once.
//!
//! - [`decision`]: the pure filter / score / select step, with Kubernetes' reasons;
//! - [`cache`]: node infos with their pods, including assumed ones;
//! - [`queue`]: active, backoff and unschedulable pods;
//! - [`resources`] and [`quantity`]: what pods request and nodes offer, as integers;
//! - [`scheduler`]: the informers, the loop, binds, status and events ([`run`]).

pub mod cache;
pub mod decision;
/// Resource quantities, shared with the API server and the node agent.
pub use setpoint_api::quantity;
pub mod queue;
pub mod resources;
pub mod scheduler;
pub mod volumes;

pub use scheduler::{run, run_shared, SchedulerConfig, SchedulerError, DEFAULT_SCHEDULER_NAME};
