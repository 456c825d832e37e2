//! Setpoint's Kubernetes-compatible API server.
//!
//! A request flows: [`http`] (authenticate, route, decode with size bounds) → [`request`]
//! (what the path names) → [`registry`] (which resource) → [`objects`] (the generic storage
//! semantics: create, update, patch, delete, get, list, watch) with [`strategy`] (per-kind
//! server-owned fields, status/scale subresources, generation) and `setpoint-kinds` (defaults,
//! validation, tables) → the store. LIST and WATCH are served from [`watchcache`].
//!
//! Start reading at [`server::ApiServer`].

pub mod apply;
pub mod convert;
pub mod crd;
pub mod decoding;
pub mod discovery;
pub mod dupfields;
pub mod health;
pub mod http;
pub mod metrics;
pub mod objects;
pub mod openapi;
pub mod patch;
pub mod podlogs;
pub mod pruned;
pub mod registry;
pub mod request;
pub mod server;
pub mod strategy;
pub mod table;
pub mod tls;
pub mod typemeta;
pub mod watchcache;
pub mod yamlbody;

pub use server::{ApiServer, ServerConfig, StoreConfig, COMPACTION_GUARD_KEY};
