//! The committed generated code is what `proto/etcd_v3.proto` generates today.

mod support;

#[test]
fn committed_code_matches_the_proto_file() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = std::fs::read_to_string(support::generate::generate(dir.path())).unwrap();
    let committed = std::fs::read_to_string(support::generate::committed()).unwrap();
    assert!(
        fresh == committed,
        "src/etcdserverpb.rs is out of date with proto/etcd_v3.proto: \
         run `cargo run -p setpoint-etcd-proto --example regenerate` and commit the result"
    );
}
