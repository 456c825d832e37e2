//! The node's sources against an in-process API server: a ConfigMap a tracked pod names is
//! read from a watch of that one object, started by the first read and shared; creating,
//! changing and deleting it syncs the pods naming it again; the watch stops with the last
//! pod; Services come from their informer; a read of an object no tracked pod names is a GET.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapEnvSource, Container, EnvFromSource, Pod, PodSpec, Service, ServicePort,
    ServiceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_node::runtime::ObjectSource;
use setpoint_node::sources::ApiSources;
use setpoint_runtime::client::{Api, DeleteParams, PostParams};
use setpoint_runtime::informer::Event;
use setpoint_runtime::object::ObjectKey;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);

fn pod(name: &str, uid: &str, config_map: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                env_from: Some(vec![EnvFromSource {
                    config_map_ref: Some(ConfigMapEnvSource {
                        name: config_map.into(),
                        optional: None,
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), value.to_string())].into()),
        ..Default::default()
    }
}

/// The next pod synced again, within the deadline.
async fn next_resync(rx: &mut mpsc::UnboundedReceiver<ObjectKey>) -> ObjectKey {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a pod synced again in time")
        .expect("resyncs open")
}

#[tokio::test]
async fn config_maps_are_watched_for_the_pods_that_name_them() {
    let cluster = setpoint_testing::TestCluster::start().await;
    let client = cluster.client();
    let sources = ApiSources::new(client.clone(), None);
    let (tx, mut rx) = mpsc::unbounded_channel();
    sources.set_resync(Box::new(move |k| {
        let _ = tx.send(k);
    }));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // Nothing read yet: no pod is tracked and no watch runs. A read of an object no tracked
    // pod names is a GET.
    sources.observe(&Event::Added(Arc::new(pod("early", "u-0", "settings"))));
    assert_eq!(sources.config_map("default", "settings").await, Ok(None));
    assert_eq!(sources.watches(), 0);

    // From the first read on, pods are tracked; the first read of what one names starts the
    // watch, which a second pod shares.
    let a = Arc::new(pod("a", "u-1", "settings"));
    let b = Arc::new(pod("b", "u-2", "settings"));
    sources.observe(&Event::Added(a.clone()));
    sources.observe(&Event::Added(b.clone()));
    assert_eq!(sources.config_map("default", "settings").await, Ok(None));
    assert_eq!(sources.watches(), 1);
    assert_eq!(sources.config_map("default", "settings").await, Ok(None));
    assert_eq!(sources.watches(), 1);

    // It appears: both pods are synced again, and the read is served from the watch.
    cms.create(&PostParams::default(), &config_map("settings", "1"))
        .await
        .unwrap();
    let mut synced = vec![next_resync(&mut rx).await, next_resync(&mut rx).await];
    synced.sort();
    assert_eq!(
        synced,
        [
            ObjectKey::new(Some("default"), "a"),
            ObjectKey::new(Some("default"), "b")
        ]
    );
    let read = sources.config_map("default", "settings").await.unwrap();
    assert_eq!(read.unwrap().data.unwrap()["k"], "1");

    // One pod goes: a change syncs only the other.
    sources.observe(&Event::Deleted(a));
    let mut changed = config_map("settings", "2");
    changed.metadata.resource_version = None;
    cms.replace("settings", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(
        next_resync(&mut rx).await,
        ObjectKey::new(Some("default"), "b")
    );
    // The cache follows the change.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let read = sources.config_map("default", "settings").await.unwrap();
        if read.and_then(|c| c.data).is_some_and(|d| d["k"] == "2") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change in the cache"
        );
        tokio::task::yield_now().await;
    }
    cms.delete("settings", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        next_resync(&mut rx).await,
        ObjectKey::new(Some("default"), "b")
    );

    // The last pod goes: the watch stops.
    sources.observe(&Event::Deleted(b));
    assert_eq!(sources.watches(), 0);
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn services_come_from_their_informer() {
    let cluster = setpoint_testing::TestCluster::start().await;
    let client = cluster.client();
    let sources = ApiSources::new(client.clone(), None);
    let services: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    services.create(&PostParams::default(), &svc).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let listed = sources.services("kube-system").await.unwrap();
        if listed
            .iter()
            .any(|s| s.metadata.name.as_deref() == Some("web"))
        {
            assert!(listed
                .iter()
                .all(|s| s.metadata.namespace.as_deref() == Some("kube-system")));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Service in the cache"
        );
        tokio::task::yield_now().await;
    }
}
