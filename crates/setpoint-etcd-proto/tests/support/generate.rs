//! Generates the Rust code for `proto/etcd_v3.proto`, with a protobuf compiler written in Rust
//! (protox), so neither regenerating nor checking the committed code needs `protoc`.

use std::path::{Path, PathBuf};

/// The crate's directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The committed generated file.
pub fn committed() -> PathBuf {
    crate_dir().join("src").join("etcdserverpb.rs")
}

/// Compiles the proto file and writes `etcdserverpb.rs` into `out_dir`; returns its path.
pub fn generate(out_dir: &Path) -> PathBuf {
    let proto = crate_dir().join("proto");
    let fds = protox::compile([proto.join("etcd_v3.proto")], [&proto])
        .unwrap_or_else(|e| panic!("compiling proto/etcd_v3.proto: {e}"));
    tonic_prost_build::configure()
        .build_server(false)
        // The store builds its own channel (TLS, keep-alive, several endpoints).
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_fds(fds)
        .expect("generating the Rust code");
    out_dir.join("etcdserverpb.rs")
}
