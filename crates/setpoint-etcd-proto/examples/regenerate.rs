//! Regenerates `src/etcdserverpb.rs` from `proto/etcd_v3.proto`:
//! `cargo run -p setpoint-etcd-proto --example regenerate`.

#[path = "../tests/support/generate.rs"]
mod generate;

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fresh = generate::generate(dir.path());
    std::fs::copy(&fresh, generate::committed()).expect("writing src/etcdserverpb.rs");
    println!("wrote {}", generate::committed().display());
}
