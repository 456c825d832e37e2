//! Setpoint's Kubernetes-compatible API server.
//!
//! A request flows: [`http`] (authenticate, route, decode with size bounds) → [`request`]
//! (what the path names) → [`registry`] (which resource) → [`objects`] (the generic storage
//! semantics: create, update, patch, delete, get, list, watch) with [`strategy`] (per-kind
//! server-owned fields, status/scale subresources, generation) and `setpoint-kinds` (defaults,
//! validation, tables) → the store. LIST and WATCH are served from [`watchcache`].
//!
//! Start reading at [`server::ApiServer`].

mod admission;
mod allocation;
mod apply;
pub mod audit;
pub mod authentication;
pub mod authorization;
pub mod cel;
mod certificates;
mod compaction;
mod connection;
mod convert;
pub mod crd;
mod decoding;
mod discovery;
pub mod dupfields;
mod eviction;
pub mod faults;
// The aggregation layer: APIServices, the front proxy, merged discovery.
mod aggregator;
mod health;
pub mod http;
mod masterendpoints;
mod metrics;
mod objects;
pub mod openapi;
pub mod patch;
mod podlogs;
mod podstream;
mod proxy;
mod pruned;
mod registry;
mod request;
pub mod resourcemetrics;
mod response;
mod reviews;
pub mod server;
mod state;
mod strategy;
mod table;
pub mod tls;
pub mod trail;
mod typemeta;
pub mod ui;
pub mod watchcache;
mod webhook;
mod yamlbody;

pub use server::COMPACTION_GUARD_KEY;
pub use state::{ApiServer, ServerConfig, StoreConfig};
