//! Services' node ports: allocated from `--service-node-port-range` on create and update,
//! kept when an update leaves them out, refused with upstream's messages when taken or out of
//! range, and given back when a Service drops them or is deleted.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::{ApiServer, ServerConfig};

const SVCS: &str = "/api/v1/namespaces/default/services";

fn service(name: &str, ty: &str, ports: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
           "spec": {"type": ty, "selector": {"app": name}, "ports": ports}})
}

fn node_ports(svc: &Value) -> Vec<i64> {
    svc["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["nodePort"].as_i64())
        .collect()
}

/// A server whose node port range is `range`.
async fn start_range(range: std::ops::RangeInclusive<u16>) -> setpoint_apiserver::server::Running {
    let config = ServerConfig {
        service_node_port_range: range,
        ..memory_config()
    };
    let store = ApiServer::open_store(&config).await.unwrap();
    ApiServer::new(config, store)
        .await
        .unwrap()
        .serve()
        .await
        .unwrap()
}

#[tokio::test]
async fn node_ports_are_allocated_kept_refused_and_released() {
    let r = start().await;
    let two = json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]);
    let web = post(&r, SVCS, &service("web", "NodePort", two.clone())).await;
    assert_eq!(web.status, 201, "{}", web.body);
    let allocated = node_ports(&web.body);
    assert_eq!(allocated.len(), 2, "{}", web.body);
    assert!(allocated.iter().all(|p| (30000..=32767).contains(p)));
    assert_ne!(allocated[0], allocated[1]);

    // A port someone holds is refused with upstream's words.
    let taken = json!([{"port": 80, "nodePort": allocated[0]}]);
    let clash = post(&r, SVCS, &service("clash", "NodePort", taken)).await;
    assert_eq!(clash.status, 422, "{}", clash.body);
    assert_eq!(
        clash.body["message"],
        format!(
            "Service \"clash\" is invalid: spec.ports[0].nodePort: Invalid value: {}: provided port is already allocated",
            allocated[0]
        )
    );
    let outside = json!([{"port": 80, "nodePort": 8080}]);
    let outside = post(&r, SVCS, &service("outside", "NodePort", outside)).await;
    assert_eq!(outside.status, 422, "{}", outside.body);
    assert_eq!(
        outside.body["details"]["causes"][0]["message"],
        "Invalid value: 8080: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );

    // A replace without nodePorts keeps them (upstream's patchAllocatedValues), and keeps
    // the cluster IP too.
    let mut replaced = service("web", "NodePort", two);
    replaced["metadata"]["resourceVersion"] = web.body["metadata"]["resourceVersion"].clone();
    let put_resp = put(&r, &format!("{SVCS}/web"), &replaced).await;
    assert_eq!(put_resp.status, 200, "{}", put_resp.body);
    assert_eq!(node_ports(&put_resp.body), allocated);
    assert_eq!(
        put_resp.body["spec"]["clusterIP"],
        web.body["spec"]["clusterIP"]
    );

    // Back to ClusterIP: the node ports go, and are free for another Service.
    let to_cluster_ip = patch(
        &r,
        &format!("{SVCS}/web"),
        "application/merge-patch+json",
        &json!({"spec": {"type": "ClusterIP"}}),
    )
    .await;
    assert_eq!(to_cluster_ip.status, 200, "{}", to_cluster_ip.body);
    assert!(
        node_ports(&to_cluster_ip.body).is_empty(),
        "{}",
        to_cluster_ip.body
    );
    let reuse = json!([{"port": 80, "nodePort": allocated[0]}]);
    let reuse = post(&r, SVCS, &service("reuse", "NodePort", reuse)).await;
    assert_eq!(reuse.status, 201, "{}", reuse.body);

    // ClusterIP to NodePort allocates; deleting releases.
    let to_node_port = patch(
        &r,
        &format!("{SVCS}/web"),
        "application/merge-patch+json",
        &json!({"spec": {"type": "NodePort"}}),
    )
    .await;
    assert_eq!(to_node_port.status, 200, "{}", to_node_port.body);
    let again = node_ports(&to_node_port.body);
    assert_eq!(again.len(), 2, "{}", to_node_port.body);
    assert!(!again.contains(&allocated[0]));
    assert_eq!(delete(&r, &format!("{SVCS}/reuse")).await.status, 200);
    let after_delete = json!([{"port": 80, "nodePort": allocated[0]}]);
    let after_delete = post(&r, SVCS, &service("after", "NodePort", after_delete)).await;
    assert_eq!(after_delete.status, 201, "{}", after_delete.body);

    // A LoadBalancer with externalTrafficPolicy Local also gets a health check node port.
    let mut lb = service("lb", "LoadBalancer", json!([{"port": 80}]));
    lb["spec"]["externalTrafficPolicy"] = json!("Local");
    let lb = post(&r, SVCS, &lb).await;
    assert_eq!(lb.status, 201, "{}", lb.body);
    assert_eq!(node_ports(&lb.body).len(), 1);
    let hc = lb.body["spec"]["healthCheckNodePort"].as_i64().unwrap();
    assert!((30000..=32767).contains(&hc) && hc != node_ports(&lb.body)[0]);
    let mut no_ports = service("lb-none", "LoadBalancer", json!([{"port": 80}]));
    no_ports["spec"]["allocateLoadBalancerNodePorts"] = json!(false);
    let no_ports = post(&r, SVCS, &no_ports).await;
    assert_eq!(no_ports.status, 201, "{}", no_ports.body);
    assert!(node_ports(&no_ports.body).is_empty());
}

#[tokio::test]
async fn a_small_range_fills_up_and_frees_again() {
    let r = start_range(31000..=31002).await;
    let mut seen = BTreeSet::new();
    let mut held = vec![];
    for i in 0..3 {
        let svc = post(
            &r,
            SVCS,
            &service(&format!("s{i}"), "NodePort", json!([{"port": 80}])),
        )
        .await;
        assert_eq!(svc.status, 201, "{}", svc.body);
        seen.extend(node_ports(&svc.body));
        held.push(node_ports(&svc.body));
    }
    assert_eq!(seen, BTreeSet::from([31000, 31001, 31002]));
    let full = post(&r, SVCS, &service("s3", "NodePort", json!([{"port": 80}]))).await;
    assert_eq!(full.status, 500, "{}", full.body);
    assert_eq!(
        full.body["message"],
        "Internal error occurred: failed to allocate a nodePort: range is full"
    );
    // The failed create left nothing behind: its cluster IP was given back, and so on.
    assert_eq!(get(&r, &format!("{SVCS}/s3")).await.status, 404);
    assert_eq!(delete(&r, &format!("{SVCS}/s1")).await.status, 200);
    let freed = post(&r, SVCS, &service("s3", "NodePort", json!([{"port": 80}]))).await;
    assert_eq!(freed.status, 201, "{}", freed.body);
    // Ports are picked at random: the one free port is the one s1 held.
    assert_eq!(node_ports(&freed.body), held[1]);
}
