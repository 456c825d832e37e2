//! A `TestCluster` with an admission webhook served by the test process (envtest's
//! `WebhookInstallOptions`): how long the cluster, the webhook server and the registration
//! take together, and the webhook refusing and allowing writes through the client.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, PostParams};
use setpoint_testing::webhook::WebhookServer;
use setpoint_testing::TestCluster;

fn configuration() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "configmap-keys"},
        "webhooks": [{
            "name": "keys.configmaps.example.com",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "system", "name": "webhooks",
                                         "path": "/validate"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}]
        }]
    })
}

fn config_map(name: &str, key: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.data = Some([(key.to_string(), "v".to_string())].into());
    cm
}

#[tokio::test]
async fn a_cluster_with_a_webhook_starts_in_milliseconds_and_calls_it() {
    let started = Instant::now();
    let cluster = TestCluster::start().await;
    let hooks = WebhookServer::start(|path, request| {
        let forbidden = request.pointer("/object/data/forbidden").is_some();
        json!({"allowed": path == "/validate" && !forbidden,
               "status": {"code": 403, "message": "the key \"forbidden\" is not allowed"}})
    })
    .await;
    cluster
        .install_webhooks(&hooks, &[configuration()])
        .await
        .expect("the configuration is installed");
    let elapsed = started.elapsed();
    eprintln!("TestCluster + webhook server + registration: {elapsed:?}");
    // Generous for a loaded CI machine; a quiet one takes milliseconds.
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");

    let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let err = cms
        .create(&PostParams::default(), &config_map("bad", "forbidden"))
        .await
        .expect_err("the webhook refuses it");
    let text = err.to_string();
    assert!(
        text.contains(
            "admission webhook \"keys.configmaps.example.com\" denied the request: the key \"forbidden\" is not allowed"
        ),
        "{text}"
    );
    cms.create(&PostParams::default(), &config_map("good", "fine"))
        .await
        .expect("the webhook allows it");
    cluster.stop().await;
}
