//! Regenerates `src/runtime_v1.rs` from `proto/api.proto`:
//! `cargo run -p setpoint-cri-proto --example regenerate`.

#[path = "../tests/support/generate.rs"]
mod generate;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fresh = generate::generate(dir.path());
    std::fs::copy(&fresh, generate::committed()).expect("writing src/runtime_v1.rs");
    println!("wrote {}", generate::committed().display());
}
