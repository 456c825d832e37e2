//! The client against a real in-process API server.

use k8s_openapi::api::core::v1::ConfigMap;
use setpoint_runtime::client::{Api, PostParams};
use setpoint_runtime::Client;
use setpoint_testing::TestCluster;

async fn create(client: &Client, name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    // Something to own: an object that sets no field gets no managedFields entry.
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("config map")
}

fn managers(cm: &ConfigMap) -> Vec<String> {
    cm.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|e| e.manager.clone())
        .collect()
}

#[tokio::test]
async fn writes_are_recorded_under_the_user_agent_name() {
    let cluster = TestCluster::start().await;
    // By default the program's name, as client-go sends it.
    let program = std::env::current_exe()
        .unwrap()
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let plain = create(&cluster.client(), "plain").await;
    assert_eq!(managers(&plain), [program]);

    let named = create(&cluster.client().with_user_agent("my-operator"), "named").await;
    assert_eq!(managers(&named), ["my-operator"]);

    // A name a header cannot carry is cut to what it can.
    let odd = create(&cluster.client().with_user_agent("my/op\u{e9}rator"), "odd").await;
    assert_eq!(managers(&odd), ["myoprator"]);

    // An explicit field manager still wins.
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("explicit".into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    let explicit = Api::<ConfigMap>::namespaced(cluster.client(), "default")
        .create(
            &PostParams {
                field_manager: Some("by-hand".into()),
                ..PostParams::default()
            },
            &cm,
        )
        .await
        .unwrap();
    assert_eq!(managers(&explicit), ["by-hand"]);
}
