//! The event recorder against a real in-process API server.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace};
use setpoint_runtime::client::{Api, Body, ListParams, PostParams, Transport};
use setpoint_runtime::events::{
    EventRecorder, EventRecorderConfig, EventType, Reporter, ToObjectReference,
};
use setpoint_runtime::metrics::EventMetrics;
use setpoint_runtime::{Client, ClientError};
use setpoint_testing::TestCluster;

async fn config_map(client: &Client, name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("config map")
}

async fn events(client: &Client, namespace: &str) -> Vec<Event> {
    let mut items = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    items.sort_by_key(|e| e.message.clone());
    items
}

fn reporter() -> Reporter {
    Reporter {
        component: "replicaset-controller".into(),
        instance: "replicaset-controller-host1".into(),
    }
}

#[tokio::test]
async fn a_published_event_is_written_with_every_field() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let cm = config_map(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), reporter());
    recorder.publish(
        &cm.object_reference(),
        EventType::Normal,
        "SuccessfulCreate",
        "Created pod: web-x",
    );
    recorder.flush().await;

    let evs = events(&client, "default").await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    let e = &evs[0];
    let name = e.metadata.name.as_deref().unwrap();
    assert!(
        name.starts_with("web.") && name.len() == "web.".len() + 16,
        "{name}"
    );
    let o = &e.involved_object;
    assert_eq!(o.api_version.as_deref(), Some("v1"));
    assert_eq!(o.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(o.name.as_deref(), Some("web"));
    assert_eq!(o.namespace.as_deref(), Some("default"));
    assert_eq!(o.uid, cm.metadata.uid);
    assert_eq!(o.resource_version, cm.metadata.resource_version);
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(e.reason.as_deref(), Some("SuccessfulCreate"));
    assert_eq!(e.message.as_deref(), Some("Created pod: web-x"));
    assert_eq!(
        e.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("replicaset-controller")
    );
    assert_eq!(
        e.reporting_component.as_deref(),
        Some("replicaset-controller")
    );
    assert_eq!(
        e.reporting_instance.as_deref(),
        Some("replicaset-controller-host1")
    );
    assert_eq!(e.count, Some(1));
    assert!(e.first_timestamp.is_some());
    assert_eq!(e.first_timestamp, e.last_timestamp);
    assert!(e.event_time.is_some());
}

#[tokio::test]
async fn repeats_update_one_event() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let cm = config_map(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), reporter());
    for _ in 0..5 {
        recorder.publish(
            &cm.object_reference(),
            EventType::Warning,
            "FailedCreate",
            "quota exceeded",
        );
    }
    recorder.flush().await;
    let evs = events(&client, "default").await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    assert_eq!(evs[0].count, Some(5));
    assert_eq!(evs[0].type_.as_deref(), Some("Warning"));
    assert!(evs[0].last_timestamp >= evs[0].first_timestamp);
    assert_eq!(recorder.dropped(), 0);
}

#[tokio::test]
async fn different_messages_types_or_objects_are_separate_events() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let (web, db) = (
        config_map(&client, "web").await,
        config_map(&client, "db").await,
    );
    let recorder = EventRecorder::new(client.clone(), reporter());
    let (w, d) = (web.object_reference(), db.object_reference());
    recorder.publish(
        &w,
        EventType::Normal,
        "SuccessfulCreate",
        "Created pod: web-1",
    );
    recorder.publish(
        &w,
        EventType::Normal,
        "SuccessfulCreate",
        "Created pod: web-2",
    );
    recorder.publish(
        &w,
        EventType::Warning,
        "SuccessfulCreate",
        "Created pod: web-2",
    );
    recorder.publish(
        &d,
        EventType::Normal,
        "SuccessfulCreate",
        "Created pod: web-1",
    );
    recorder.publish(
        &w,
        EventType::Normal,
        "SuccessfulCreate",
        "Created pod: web-1",
    );
    recorder.flush().await;
    let evs = events(&client, "default").await;
    assert_eq!(evs.len(), 4, "{evs:#?}");
    let counts: Vec<_> = evs
        .iter()
        .map(|e| {
            (
                e.involved_object.name.clone().unwrap(),
                e.message.clone().unwrap(),
                e.type_.clone().unwrap(),
                e.count.unwrap(),
            )
        })
        .collect();
    assert!(
        counts.contains(&(
            "web".into(),
            "Created pod: web-1".into(),
            "Normal".into(),
            2
        )),
        "{counts:?}"
    );
    assert!(
        counts.contains(&("db".into(), "Created pod: web-1".into(), "Normal".into(), 1)),
        "{counts:?}"
    );
    assert!(
        counts.contains(&(
            "web".into(),
            "Created pod: web-2".into(),
            "Warning".into(),
            1
        )),
        "{counts:?}"
    );
}

#[tokio::test]
async fn the_rate_limit_drops_beyond_the_burst() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let (web, db) = (
        config_map(&client, "web").await,
        config_map(&client, "db").await,
    );
    let mut registry = prometheus_client::registry::Registry::default();
    let config = EventRecorderConfig {
        burst: 3,
        metrics: Some(EventMetrics::new(&mut registry)),
        ..EventRecorderConfig::default()
    };
    let recorder = EventRecorder::with_config(client.clone(), reporter(), config);
    for i in 0..10 {
        recorder.publish(
            &web.object_reference(),
            EventType::Warning,
            "FailedCreate",
            &format!("attempt {i}"),
        );
    }
    // Repeats are writes too, so they spend tokens; another object has its own bucket.
    for _ in 0..5 {
        recorder.publish(&db.object_reference(), EventType::Normal, "Sync", "same");
    }
    recorder.flush().await;
    let evs = events(&client, "default").await;
    let about = |n: &str| {
        evs.iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(n))
            .collect::<Vec<_>>()
    };
    assert_eq!(about("web").len(), 3, "{evs:#?}");
    assert_eq!(about("db").len(), 1);
    assert_eq!(about("db")[0].count, Some(3));
    assert_eq!(recorder.dropped(), 7 + 2);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("event_recorder_dropped_total{reason=\"rate_limited\"} 9"),
        "{text}"
    );
}

#[tokio::test]
async fn events_about_cluster_scoped_objects_go_to_default() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let ns = Api::<Namespace>::all(client.clone())
        .get("kube-system")
        .await
        .unwrap();
    let recorder = EventRecorder::new(client.clone(), Reporter::new("namespace-controller"));
    recorder.publish(
        &ns.object_reference(),
        EventType::Normal,
        "Checked",
        "namespace is fine",
    );
    recorder.flush().await;
    let evs = events(&client, "default").await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    assert_eq!(evs[0].involved_object.kind.as_deref(), Some("Namespace"));
    assert_eq!(evs[0].involved_object.namespace, None);
    assert!(events(&client, "kube-system").await.is_empty());
}

/// Never answers: the API server is hung.
struct Hung;

#[async_trait]
impl Transport for Hung {
    async fn send(&self, _: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn publishing_never_waits_for_the_api() {
    let config = EventRecorderConfig {
        queue_capacity: 100,
        burst: 100_000,
        ..EventRecorderConfig::default()
    };
    let recorder = EventRecorder::with_config(Client::new(Hung), reporter(), config);
    let cm = ConfigMap::default();
    let started = Instant::now();
    for i in 0..5_000 {
        recorder.publish(
            &cm.object_reference(),
            EventType::Normal,
            "Tick",
            &format!("{i}"),
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The writer holds one event in its hung request; the queue holds 100 more.
    assert!(recorder.dropped() >= 5_000 - 101, "{}", recorder.dropped());
}

#[tokio::test]
async fn a_failed_write_does_not_stop_later_ones() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let cm = config_map(&client, "web").await;
    let recorder = EventRecorder::new(client.clone(), reporter());
    let mut elsewhere = cm.object_reference();
    elsewhere.namespace = Some("no-such-namespace".into());
    elsewhere.uid = Some("other".into());
    recorder.publish(&elsewhere, EventType::Normal, "Sync", "lost");
    recorder.publish(&cm.object_reference(), EventType::Normal, "Sync", "kept");
    recorder.flush().await;
    let evs = events(&client, "default").await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    assert_eq!(evs[0].message.as_deref(), Some("kept"));
}
