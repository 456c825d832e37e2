//! The node agent's side of the Container Runtime Interface (CRI v1): a gRPC client of a
//! container runtime's `RuntimeService` and `ImageService` (containerd, CRI-O) over a unix
//! socket, as kubelet's remote runtime is.
//!
//! [`client::CriClient`] is a thin, typed layer over the generated clients of
//! `setpoint-cri-proto`: each call has a deadline (kubelet's runtime request timeout, two
//! minutes, by default; pulls have their own), messages are bounded to kubelet's 16 MiB, and
//! failures keep the gRPC code ([`client::CriError::is_not_found`], since a sandbox or
//! container that is already gone means stop and remove are done).

pub mod auth;
pub mod client;
pub mod containers;
pub mod gc;
pub mod hooks;
pub mod images;
pub mod logs;
pub mod portforward;
pub mod resources;
pub mod runtime;
pub mod sandbox;
pub mod state;
pub mod streaming;

pub use client::{CriClient, CriError, CriOptions, ExecSyncOutput};
pub use runtime::{CriRuntime, CriRuntimeOptions};
/// The CRI v1 messages, re-exported so callers need not name the proto crate.
pub use setpoint_cri_proto as api;
