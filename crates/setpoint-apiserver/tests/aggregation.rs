//! The aggregation layer against an in-process server: local APIServices for Setpoint's own
//! group/versions, the `Available` condition's reasons as a service-backed APIService's
//! Service, port and Endpoints come and go, and `503 service unavailable` for requests while
//! it is not available.

mod common;

use std::time::Duration;

use common::{get, post, put, start};
use serde_json::{json, Value};

const WITHIN: Duration = Duration::from_secs(20);
const APISERVICES: &str = "/apis/apiregistration.k8s.io/v1/apiservices";

/// The `Available` condition's status, reason and message.
async fn available(
    r: &setpoint_apiserver::server::Running,
    name: &str,
) -> Option<(String, String, String)> {
    let a = get(r, &format!("{APISERVICES}/{name}")).await.body;
    let c = a
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Available")?
        .clone();
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    Some((text("status"), text("reason"), text("message")))
}

/// Waits for the APIService's condition to have `reason`, and returns its status and message.
async fn wait_for(
    r: &setpoint_apiserver::server::Running,
    name: &str,
    reason: &str,
) -> (String, String) {
    setpoint_testing::eventually_within(WITHIN, &format!("{name} to say {reason}"), || async {
        available(r, name)
            .await
            .filter(|(_, why, _)| why == reason)
            .map(|(status, _, message)| (status, message))
    })
    .await
}

#[tokio::test]
async fn conditions_follow_the_service_its_port_and_endpoints() {
    let r = start().await;
    // Setpoint's own group/versions are local and available.
    let (status, message) = wait_for(&r, "v1.apps", "Local").await;
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("True", "Local APIServices are always available")
    );
    let core = get(&r, &format!("{APISERVICES}/v1.")).await.body;
    assert_eq!(
        core["metadata"]["labels"]["kube-aggregator.kubernetes.io/automanaged"],
        "onstart"
    );
    assert_eq!(core["spec"]["groupPriorityMinimum"], 18000);

    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ext"}});
    assert_eq!(post(&r, "/api/v1/namespaces", &ns).await.status, 201);
    let name = "v1.ext.example.com";
    let api_service = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": name},
        "spec": {"group": "ext.example.com", "version": "v1", "groupPriorityMinimum": 1000,
                 "versionPriority": 15, "insecureSkipTLSVerify": true,
                 "service": {"namespace": "ext", "name": "api"}}});
    let created = post(&r, APISERVICES, &api_service).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["spec"]["service"]["port"], 443);

    let (status, message) = wait_for(&r, name, "ServiceNotFound").await;
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("False", "service/api in \"ext\" is not present")
    );
    // Not available: its group/version answers 503 as kube-aggregator's proxy does.
    let down = get(&r, "/apis/ext.example.com/v1/things").await;
    assert_eq!(
        (down.status, down.raw.as_ref()),
        (503, b"service unavailable\n".as_ref())
    );

    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api", "namespace": "ext"},
        "spec": {"ports": [{"name": "https", "port": 8443, "targetPort": 8443}]}});
    assert_eq!(
        post(&r, "/api/v1/namespaces/ext/services", &svc)
            .await
            .status,
        201
    );
    let (_, message) = wait_for(&r, name, "ServicePortError").await;
    assert_eq!(
        message,
        "service/api in \"ext\" is not listening on port 443"
    );

    let mut svc = get(&r, "/api/v1/namespaces/ext/services/api").await.body;
    svc["spec"]["ports"][0]["port"] = json!(443);
    assert_eq!(
        put(&r, "/api/v1/namespaces/ext/services/api", &svc)
            .await
            .status,
        200
    );
    let (_, message) = wait_for(&r, name, "EndpointsNotFound").await;
    assert_eq!(message, "cannot find endpoints for service/api in \"ext\"");

    let eps = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "api", "namespace": "ext"},
        "subsets": [{"addresses": [{"ip": "127.87.0.1"}], "ports": [{"name": "other", "port": 8443}]}]});
    assert_eq!(
        post(&r, "/api/v1/namespaces/ext/endpoints", &eps)
            .await
            .status,
        201
    );
    let (_, message) = wait_for(&r, name, "MissingEndpoints").await;
    assert_eq!(
        message,
        "endpoints for service/api in \"ext\" have no addresses with port name \"https\""
    );

    // An endpoint nothing listens on fails the discovery check with Go's words.
    let closed = std::net::TcpListener::bind("127.87.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut eps = get(&r, "/api/v1/namespaces/ext/endpoints/api").await.body;
    eps["subsets"][0]["ports"] = json!([{"name": "https", "port": port}]);
    assert_eq!(
        put(&r, "/api/v1/namespaces/ext/endpoints/api", &eps)
            .await
            .status,
        200
    );
    let (status, message) = wait_for(&r, name, "FailedDiscoveryCheck").await;
    let url = format!("https://127.87.0.1:{port}/apis/ext.example.com/v1");
    assert_eq!(status, "False");
    assert_eq!(
        message,
        format!("failing or missing response from {url}: Get {url:?}: dial tcp 127.87.0.1:{port}: connect: connection refused")
    );
    // `/apis` lists the group from its APIService even while its server does not answer.
    let groups: Value = get(&r, "/apis").await.body;
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "ext.example.com"));
    r.shutdown().await;
}
