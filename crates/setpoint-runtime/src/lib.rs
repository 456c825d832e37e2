//! Setpoint's controller runtime: the pieces an operator is made of.
//!
//! - [`client`]: typed and dynamic API access over HTTPS (kubeconfig) or in-process;
//! - [`workqueue`]: deduplicating work queue with per-key backoff and a rate limit;
//! - [`metrics`]: Prometheus metrics with the names Go operators use;
//! - [`decision`]: decision records per reconcile, linked to the writes they make;
//! - [`serving`]: the accept loop (TLS handshake with a timeout, hyper) HTTP endpoints run on;
//! - [`customresource`]: typed custom resources — `#[derive(CustomResource)]` on a spec
//!   struct gives the resource type and its CustomResourceDefinition.

pub mod client;
pub mod controller;
pub mod customresource;
pub mod decision;
pub mod events;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod object;
pub mod serving;
pub mod workqueue;

pub use client::{Api, Client, ClientError};
pub use informer::{Informer, SharedInformers, Store};
pub use object::{Object, ObjectKey};
/// The schema generator custom resource types derive `JsonSchema` from.
pub use schemars;
pub use setpoint_derive::CustomResource;
