//! etcd's v3 gRPC API, the part Setpoint's etcd store uses, as Rust types and gRPC clients.
//!
//! The code in `etcdserverpb.rs` is generated from `proto/etcd_v3.proto` and committed, so
//! building Setpoint needs no protobuf compiler. Regenerate it after changing the proto file
//! with `cargo run -p setpoint-etcd-proto --example regenerate`; a test fails while the two
//! disagree.

#![allow(missing_docs, clippy::all)]

/// etcd's `etcdserverpb` package (with `mvccpb`'s `KeyValue` and `Event`).
pub mod etcdserverpb {
    include!("etcdserverpb.rs");
}

pub use etcdserverpb::*;
