//! Decision records for a controller built only on the runtime's public API (as a user's
//! operator is): its reconcile's observations and actions, the watch event that woke it, and
//! its writes linked to the decision in the API server's trail, with no code of its own for
//! any of it beyond `ctx.observe` and `ctx.action`.
//!
//! One test in this binary: the process's records are pushed to the first cluster a
//! controller runs against.

use std::sync::Arc;

use bytes::Bytes;
use k8s_openapi::api::core::v1::ConfigMap;
use setpoint_api::trail::{Explanation, WHY_PATH};
use setpoint_runtime::client::{Api, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::SharedInformers;
use setpoint_runtime::{Client, ObjectKey};
use setpoint_testing::TestCluster;

/// Gives every ConfigMap a `<name>-copy`.
struct Mirror {
    client: Client,
}

#[async_trait::async_trait]
impl Reconciler for Mirror {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        if key.name.ends_with("-copy") {
            return Ok(Action::Done);
        }
        let ns = key.namespace.as_deref().unwrap_or("default");
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let copy = format!("{}-copy", key.name);
        if api.get_opt(&copy).await?.is_some() {
            ctx.observe("the copy exists");
            return Ok(Action::Done);
        }
        ctx.observe("no copy yet");
        ctx.action(format!("create {copy}"), "every ConfigMap has a copy");
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(copy);
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(Action::Done),
            Err(e) if e.is_already_exists() => Ok(Action::Done),
            Err(e) => Err(e.into()),
        }
    }
}

async fn why(client: &Client, t: &str, name: &str) -> Explanation {
    let path = format!("{WHY_PATH}?type={t}&namespace=default&name={name}");
    let v = client
        .request(http::Method::GET, &path, None, Bytes::new())
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn a_runtime_controllers_writes_lead_to_its_decision_and_what_woke_it() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let informers = SharedInformers::new(client.clone());
    let controller =
        Controller::for_type::<ConfigMap>("mirror", &informers, None).build(Arc::new(Mirror {
            client: client.clone(),
        }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller.run(async {
        let _ = stopped.await;
    }));

    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("settings".into());
    let created = api.create(&PostParams::default(), &cm).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();

    // The copy's creation: by the mirror controller's decision, which the ConfigMap's ADDED
    // event woke, which the test's own create produced.
    let e = setpoint_testing::eventually("the copy's decision in the trail", || {
        let client = client.clone();
        async move {
            let e = why(&client, "cm", "settings-copy").await;
            let d = e.writes.first()?.decision.as_ref()?;
            (d.controller == "mirror").then_some(e)
        }
    })
    .await;
    let created = &e.writes[0];
    assert_eq!(created.write.verb, "create");
    assert_eq!(created.write.controller.as_deref(), Some("mirror"));
    let d = created.decision.as_ref().unwrap();
    assert_eq!(d.object.kind, "ConfigMap");
    assert_eq!(d.object.name, "settings");
    assert_eq!(d.observed, ["no copy yet"]);
    assert_eq!(d.actions[0].action, "create settings-copy");
    assert_eq!(d.actions[0].rule, "every ConfigMap has a copy");
    assert_eq!(d.result, "success");
    let woke = &d.triggers[0];
    assert_eq!(woke.reason, "ADDED");
    assert_eq!(woke.resource_version.as_deref(), Some(rv.as_str()));
    assert_eq!(created.because[0].write.object.name, "settings");
    assert!(created.because[0].write.decision_id.is_none());

    // The source has its own trail: one create, by no controller.
    let source = why(&client, "configmaps", "settings").await;
    assert_eq!(source.writes.len(), 1);
    assert!(source.writes[0].write.controller.is_none());

    // The records are listed in order with a cursor: the decision is there, stamped with the
    // user that pushed it (the in-process push hands the records over without JSON).
    let page = client
        .request(
            http::Method::GET,
            "/debug/setpoint/decisions?since=0&namespace=default",
            None,
            Bytes::new(),
        )
        .await
        .unwrap();
    let listed = page["records"].as_array().unwrap();
    let mine = listed
        .iter()
        .find(|r| r["id"] == serde_json::json!(d.id))
        .expect("the decision is listed");
    assert_eq!(mine["controller"], "mirror");
    assert!(!mine["reporter"].as_str().unwrap().is_empty());
    assert!(page["next"].as_u64().unwrap() >= listed.len() as u64);

    let _ = stop.send(());
    run.await.unwrap();
    cluster.stop().await;
}
