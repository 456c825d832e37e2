//! Generates the Rust code for `proto/api.proto`, with a protobuf compiler written in Rust
//! (protox), so neither regenerating nor checking the committed code needs `protoc`.

use std::path::{Path, PathBuf};

/// The crate's directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The committed generated file.
pub fn committed() -> PathBuf {
    crate_dir().join("src").join("runtime_v1.rs")
}

/// Compiles the proto file and writes `runtime.v1.rs` into `out_dir`; returns its path.
pub fn generate(out_dir: &Path) -> PathBuf {
    let proto = crate_dir().join("proto");
    let fds = protox::compile([proto.join("api.proto")], [&proto])
        .unwrap_or_else(|e| panic!("compiling proto/api.proto: {e}"));
    tonic_prost_build::configure()
        // The node agent is a client of the runtime; nothing here serves CRI.
        .build_server(false)
        // The node agent builds its own channel (a unix socket connector).
        .build_transport(false)
        // Registry credentials must not reach logs: lib.rs writes a redacting Debug.
        .skip_debug(["runtime.v1.AuthConfig"])
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_fds(fds)
        .expect("generating the Rust code");
    out_dir.join("runtime.v1.rs")
}
