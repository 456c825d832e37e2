//! The Website webhooks on a `TestCluster`, served from the test process by
//! `setpoint-testing`'s `WebhookServer` and registered with `install_webhooks` (what envtest's
//! `WebhookInstallOptions` does): defaulting fills in what a Website leaves out, validation
//! refuses what it must with the webhook's message. The time from nothing to a cluster
//! serving the CRD and calling both webhooks is printed (`--nocapture` shows it).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use setpoint_runtime::client::{Api, ApiResource, ClientError, DynamicObject, PostParams};
use setpoint_testing::webhook::WebhookServer;
use setpoint_testing::TestCluster;
use webhook_defaults::{answer, crd, webhook_configurations, GROUP};

fn websites(cluster: &TestCluster) -> Api<DynamicObject> {
    let resource = ApiResource::new(GROUP, "v1", "Website", "websites", true);
    Api::dynamic(cluster.client(), &resource, Some("default"))
}

fn website(name: &str, spec: Value) -> DynamicObject {
    DynamicObject(
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Website",
                         "metadata": {"name": name}, "spec": spec}),
    )
}

/// A cluster serving the Website CRD with both webhooks registered, and how long it took.
async fn start() -> (TestCluster, WebhookServer, Duration) {
    let started = Instant::now();
    let cluster = TestCluster::start().await;
    let hooks = WebhookServer::start(answer).await;
    let crds: Api<DynamicObject> = Api::dynamic(
        cluster.client(),
        &ApiResource::new(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        ),
        None,
    );
    crds.create(&PostParams::default(), &DynamicObject(crd()))
        .await
        .expect("the CRD is created");
    let configurations = webhook_configurations(|path| hooks.client_config(path));
    cluster
        .install_webhooks(&hooks, &configurations)
        .await
        .expect("the webhook configurations are installed");
    // The CRD is served once a list of its resource answers.
    let api = websites(&cluster);
    setpoint_testing::eventually("websites to be served", || {
        let api = api.clone();
        async move { api.list(&Default::default()).await.ok() }
    })
    .await;
    (cluster, hooks, started.elapsed())
}

#[tokio::test]
async fn websites_are_defaulted_and_validated_by_the_webhooks() {
    let (cluster, _hooks, elapsed) = start().await;
    eprintln!("TestCluster + CRD + webhook server + both webhooks registered: {elapsed:?}");
    // Generous for a loaded CI machine; a quiet one takes tens of milliseconds.
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
    let api = websites(&cluster);

    let created = api
        .create(
            &PostParams::default(),
            &website("blog", json!({"image": "nginx:1.27"})),
        )
        .await
        .expect("a valid Website is admitted");
    assert_eq!(created.0["spec"]["replicas"], 1, "{}", created.0);
    assert_eq!(created.0["spec"]["port"], 8080);

    let kept = api
        .create(
            &PostParams::default(),
            &website(
                "shop",
                json!({"image": "nginx:1.27", "replicas": 4, "port": 80}),
            ),
        )
        .await
        .expect("a Website with its own values is admitted");
    assert_eq!(
        (
            kept.0["spec"]["replicas"].as_i64(),
            kept.0["spec"]["port"].as_i64()
        ),
        (Some(4), Some(80))
    );

    let err = api
        .create(
            &PostParams::default(),
            &website("huge", json!({"image": "nginx:latest", "replicas": 50})),
        )
        .await
        .expect_err("the validating webhook refuses it");
    let ClientError::Api(status) = err else {
        panic!("not an API error: {err}");
    };
    assert_eq!(status.code, 403);
    assert_eq!(
        status.message,
        "admission webhook \"vwebsite.example.com\" denied the request: spec.replicas: 50 is not between 1 and 10; spec.image: \"nginx:latest\" must name a tag other than \"latest\", or a digest"
    );

    // Updates are validated too, after defaulting.
    let mut blog = api.get("blog").await.expect("blog exists");
    blog.0["spec"]["replicas"] = json!(0);
    let err = api
        .replace("blog", &PostParams::default(), &blog)
        .await
        .expect_err("0 replicas is refused");
    assert!(
        err.to_string()
            .contains("spec.replicas: 0 is not between 1 and 10"),
        "{err}"
    );
    cluster.stop().await;
}
