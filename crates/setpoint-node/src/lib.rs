//! Setpoint's node agent (the kubelet's role): registers `Node` objects, renews their Leases,
//! and runs the pods bound to them through a [`runtime::PodRuntime`] — local processes
//! (`process`) or simulated containers ([`simulated`]).
//!
//! # Design
//!
//! The agent is the system's reconcile loop applied to a node. For every pod bound to a node,
//! a pod worker ([`podworker`]) compares the pod the API shows (informer cache) with the pods
//! the runtime holds (`runtime.pods()`), closes the whole gap — start, restart, kill, final
//! delete — and writes the status composed by the pure [`status`] functions through
//! `pods/status`, only when it changed. A sync is woken by the informer, by the runtime
//! ([`runtime::PodRuntime::subscribe`]) and by a periodic resync, and never depends on which
//! one woke it; so an agent that restarts simply reconciles what its runtime still holds
//! against the API and duplicates nothing.
//!
//! Per node, [`node`] registers the `Node` and reports its status (when it changed, and every
//! few minutes otherwise) and [`lease`] renews the Lease the node lifecycle controller
//! watches. The private `host` module wires these per node on shared informers, which is what lets
//! one process host a single local node ([`agent::run_agent`]) or thousands of simulated ones
//! ([`simulation::run_simulated`]: one pod informer for all, Lease renewals spread over the
//! interval) with the same code. [`server`] is the kubelet's HTTPS endpoint for container
//! logs and [`metrics`] (`/metrics`), requiring client certificates signed by the cluster CA.

pub mod agent;
pub mod containerd;
pub mod cri;
pub mod deathsig;
pub mod env;
mod host;
pub mod lease;
pub mod localpath;
pub mod metrics;
pub mod node;
pub mod podcidr;
pub mod podworker;
pub mod process;
pub mod routed;
pub mod runtime;
pub mod server;
pub mod simulated;
pub mod simulation;
pub mod sources;
pub mod stats;
pub mod status;
pub mod streaming;
pub mod unsupported;
pub mod volumes;

pub use agent::{run_agent, AgentConfig, AgentError, Capacity};
pub use metrics::NodeMetrics;
pub use simulated::{SimulatedConfig, SimulatedRuntime};
pub use simulation::{run_simulated, run_simulated_as, run_simulated_on, SimulationConfig};
