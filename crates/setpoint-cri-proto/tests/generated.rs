//! The committed generated code is what `proto/api.proto` generates today.

mod support;

#[test]
fn committed_code_matches_the_proto_file() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = std::fs::read_to_string(support::generate::generate(dir.path())).unwrap();
    let committed = std::fs::read_to_string(support::generate::committed()).unwrap();
    assert!(
        fresh == committed,
        "src/runtime_v1.rs is out of date with proto/api.proto: \
         run `cargo run -p setpoint-cri-proto --example regenerate` and commit the result"
    );
}
