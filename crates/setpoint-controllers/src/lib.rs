//! Setpoint's built-in controllers.
//!
//! Each controller is the loop ARCHITECTURE.md draws ("The loop") with its own decision step, built on
//! `setpoint-runtime` and talking to the API only through its client, so it runs the same
//! in-process (inside `setpoint up`) and against any Kubernetes-compatible server
//! (`setpoint controller-manager`).
//!
//! - [`namespace`]: empties a terminating namespace and then releases its `kubernetes`
//!   finalizer so the server removes it;
//! - [`gc`]: the garbage collector — background, foreground and orphan cascading deletion
//!   driven by `ownerReferences`;
//! - [`replicaset`]: keeps a ReplicaSet's pods at `spec.replicas`;
//! - [`replicationcontroller`]: the same for ReplicationControllers, through an adapter;
//! - [`endpointslice`] and [`endpoints`]: a Service's EndpointSlices and its Endpoints,
//!   from the pods its selector picks;
//! - [`nodeipam`]: gives each Node a `spec.podCIDR` from the cluster CIDR
//!   (`--allocate-node-cidrs`);
//! - [`statefulset`]: pods with stable names, ordinals and claims, in order, with rolling
//!   updates and revision history;
//! - [`daemonset`]: one pod per eligible node (node selector, affinity, taints), rolling
//!   updates with `maxUnavailable`/`maxSurge` or `OnDelete`, revision history;
//! - [`deployment`]: rolls a Deployment's pod template out through ReplicaSets
//!   (rolling update, recreate, pause, rollback, revision history);
//! - [`hpa`]: the HorizontalPodAutoscaler, which sets a `scale` subresource's replicas from
//!   metrics as upstream's replica calculator and scaling behavior do;
//! - [`cronjob`]: creates a Job each time a CronJob's schedule ([`setpoint_api::cron`]) comes round;
//! - [`job`]: runs a Job's pods to `completions` within `parallelism` and `backoffLimit`;
//! - [`ttlafterfinished`]: deletes finished Jobs once their `ttlSecondsAfterFinished` ran out;
//! - [`podgc`]: deletes terminated pods over a threshold, pods of nodes that are gone and
//!   unscheduled terminating pods;
//! - [`nodelifecycle`]: marks nodes whose agent went silent `Unknown`, taints them, and
//!   evicts their pods once the pods' tolerations run out;
//! - [`serviceaccount`]: a `default` ServiceAccount in every active namespace;
//! - [`servicelb`]: `LoadBalancer` Services get the nodes' addresses as their ingress;
//! - [`rootca`]: the `kube-root-ca.crt` ConfigMap (the cluster CA) in every namespace;
//! - [`resourcequota`]: keeps ResourceQuotas' `status.hard` and `status.used` right;
//! - [`clusterroleaggregation`]: gives ClusterRoles with an `aggregationRule` the rules of
//!   the ClusterRoles they select.
//!
//! Every controller separates a pure decision (unit-tested without a server) from the I/O
//! that carries it out.

pub mod clusterroleaggregation;
pub mod cronjob;
pub mod csrapproving;
pub mod csrsigning;
pub mod daemonset;
pub mod deployment;
pub mod discovery;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod expectations;
pub mod gc;
pub mod history;
pub mod hpa;
pub mod job;
pub mod manager;
pub mod namespace;
pub mod nodeipam;
pub mod nodelifecycle;
pub mod persistentvolume;
pub mod podgc;
pub mod replicaset;
pub mod replicationcontroller;
pub mod resourcequota;
pub mod rootca;
pub mod serviceaccount;
pub mod servicelb;
pub mod statefulset;
pub mod tokens;
pub mod ttlafterfinished;
pub mod volumeprotection;

/// The current time in whole seconds, as the API stores timestamps (the `jiff` build that
/// `k8s-openapi` uses has no clock of its own).
pub(crate) fn now() -> k8s_openapi::jiff::Timestamp {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default()
}

/// Errors of the built-in controllers outside a reconcile (set-up and discovery).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("API request failed: {0}")]
    Client(#[from] setpoint_runtime::ClientError),
    /// A discovery document did not have the expected shape.
    #[error("discovery document {path}: {message}")]
    Discovery {
        /// The path of the document, e.g. `/apis/apps/v1`.
        path: String,
        /// What was wrong with it.
        message: String,
    },
}
