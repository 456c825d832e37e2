//! End to end: two `setpoint up` clusters on one machine, each running the same Deployment of
//! real servers. Each cluster's node takes pod addresses from its own block, so all six pods
//! bind, become Ready and answer on six distinct addresses.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::collections::HashSet;
use std::time::Duration;

mod support;

use support::{eventually, http_get, ready_pods, Setpoint, WEB};

#[test]
fn two_clusters_run_the_same_deployment_on_distinct_addresses() {
    if !support::kubectl_available() {
        return;
    }
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Setpoint::up(a_dir.path());
    let b = Setpoint::up(b_dir.path());
    a.apply(WEB);
    b.apply(WEB);
    let mut ips = HashSet::new();
    for cluster in [&a, &b] {
        let pods = eventually("3 ready web pods", Duration::from_secs(90), || {
            ready_pods(cluster, "app=web", 3)
        });
        for pod in pods {
            let ip = cluster.ok(&["get", "pod", &pod, "-o", "jsonpath={.status.podIP}"]);
            assert!(ip.starts_with("127."), "{pod}: {ip}");
            assert!(ips.insert(ip.clone()), "{ip} is used twice");
            assert!(http_get(&ip, "/").contains(" 200 "), "{pod} at {ip}");
        }
    }
    assert_eq!(ips.len(), 6);
}
