//! Setpoint's controller runtime: the pieces an operator is made of.
//!
//! - [`client`]: typed and dynamic API access over HTTPS (kubeconfig) or in-process;
//! - [`workqueue`]: deduplicating work queue with per-key backoff and a rate limit;
//! - [`metrics`]: Prometheus metrics with the names Go operators use.

pub mod client;
pub mod controller;
pub mod events;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod object;
pub mod workqueue;

pub use client::{Api, Client, ClientError};
pub use informer::{Informer, SharedInformers, Store};
pub use object::{Object, ObjectKey};
