//! API semantics against an in-process server.

mod common;

use common::*;
use serde_json::{json, Value};
use setpoint_apiserver::watchcache::CacheConfig;
use setpoint_apiserver::StoreConfig;

fn deployment(name: &str, replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "web", "image": "nginx:1.25"}]}}}
    })
}

async fn namespace(r: &setpoint_apiserver::server::Running, name: &str) {
    let resp = post(
        r,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": name}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
}

#[tokio::test]
async fn create_get_update_with_generation_and_conflicts() {
    let r = start().await;
    namespace(&r, "demo").await;
    let c = post(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments",
        &deployment("web", 3),
    )
    .await;
    assert_eq!(c.status, 201, "{}", c.body);
    let d = c.body;
    assert_eq!(d["metadata"]["generation"], 1);
    assert!(!d["metadata"]["uid"].as_str().unwrap().is_empty());
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
    assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
    assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
    let rv1 = d["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    // Creating twice is AlreadyExists.
    let again = post(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments",
        &deployment("web", 3),
    )
    .await;
    assert_eq!(again.status, 409);
    assert_eq!(again.body["reason"], "AlreadyExists");

    // An update with the current resourceVersion bumps generation on a spec change.
    let mut upd = d.clone();
    upd["spec"]["replicas"] = json!(5);
    let u = put(&r, "/apis/apps/v1/namespaces/demo/deployments/web", &upd).await;
    assert_eq!(u.status, 200, "{}", u.body);
    assert_eq!(u.body["metadata"]["generation"], 2);
    // The same resourceVersion again is stale now.
    let stale = put(&r, "/apis/apps/v1/namespaces/demo/deployments/web", &upd).await;
    assert_eq!(stale.status, 409);
    assert_eq!(stale.body["reason"], "Conflict");
    assert_ne!(u.body["metadata"]["resourceVersion"].as_str().unwrap(), rv1);

    // Status writes change only status and not generation; main writes ignore status.
    let mut st = u.body.clone();
    st["status"] = json!({"replicas": 5, "observedGeneration": 2});
    st["spec"]["replicas"] = json!(9);
    let s = put(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments/web/status",
        &st,
    )
    .await;
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(s.body["status"]["replicas"], 5);
    assert_eq!(s.body["spec"]["replicas"], 5);
    assert_eq!(s.body["metadata"]["generation"], 2);
    // A status of the wrong type is refused with its path (the decoder's 400), and nothing is
    // written.
    let mut bad = s.body.clone();
    bad["status"]["replicas"] = json!("five");
    let refused = put(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments/web/status",
        &bad,
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        refused.body["message"],
        "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentStatus.status.replicas of type int32"
    );
    let kept = get(&r, "/apis/apps/v1/namespaces/demo/deployments/web").await;
    assert_eq!(kept.body["status"]["replicas"], 5);
    assert_eq!(
        kept.body["metadata"]["resourceVersion"],
        s.body["metadata"]["resourceVersion"]
    );

    // Scale via merge patch.
    let sc = patch(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments/web/scale",
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 7}}),
    )
    .await;
    assert_eq!(sc.status, 200, "{}", sc.body);
    assert_eq!(sc.body["kind"], "Scale");
    assert_eq!(sc.body["spec"]["replicas"], 7);
    assert_eq!(sc.body["status"]["selector"], "app=web");
    let g = get(&r, "/apis/apps/v1/namespaces/demo/deployments/web").await;
    assert_eq!(g.body["spec"]["replicas"], 7);
    assert_eq!(g.body["metadata"]["generation"], 3);

    // A no-op patch writes nothing.
    let rv_before = g.body["metadata"]["resourceVersion"].clone();
    let noop = patch(
        &r,
        "/apis/apps/v1/namespaces/demo/deployments/web",
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 7}}),
    )
    .await;
    assert_eq!(noop.body["metadata"]["resourceVersion"], rv_before);
}

#[tokio::test]
async fn bad_input_gets_status_errors() {
    let r = start().await;
    namespace(&r, "demo").await;
    let bad_json = call(
        &r,
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        Some("application/json"),
        Some(b"{not json".to_vec()),
    )
    .await;
    assert_eq!(bad_json.status, 400);
    assert_eq!(bad_json.body["kind"], "Status");
    let bad_name = post(
        &r,
        "/api/v1/namespaces/demo/configmaps",
        &json!({"metadata": {"name": "Bad_Name"}}),
    )
    .await;
    assert_eq!(bad_name.status, 422, "{}", bad_name.body);
    assert_eq!(
        bad_name.body["details"]["causes"][0]["field"],
        "metadata.name"
    );
    let no_ns = post(
        &r,
        "/api/v1/namespaces/nope/configmaps",
        &json!({"metadata": {"name": "a"}}),
    )
    .await;
    assert_eq!(no_ns.status, 404);
    assert_eq!(no_ns.body["message"], "namespaces \"nope\" not found");
    let huge = vec![b' '; 4 * 1024 * 1024];
    let too_big = call(
        &r,
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        Some("application/json"),
        Some(huge),
    )
    .await;
    assert_eq!(too_big.status, 413);
    let missing = get(&r, "/api/v1/namespaces/demo/configmaps/none").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body["reason"], "NotFound");
    let strict = call(
        &r,
        "POST",
        "/api/v1/namespaces/demo/configmaps?fieldValidation=Strict",
        Some("application/json"),
        Some(serde_json::to_vec(&json!({"metadata": {"name": "x"}, "dataa": {}})).unwrap()),
    )
    .await;
    assert_eq!(strict.status, 400, "{}", strict.body);
    assert!(strict.body["message"]
        .as_str()
        .unwrap()
        .contains("unknown field \"dataa\""));
    // Nothing was half-written.
    let list = get(&r, "/api/v1/namespaces/demo/configmaps").await;
    assert_eq!(list.body["items"].as_array().unwrap().len(), 0);
    // Missing Content-Type means JSON.
    let noct = call(
        &r,
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        None,
        Some(br#"{"metadata":{"name":"ok"}}"#.to_vec()),
    )
    .await;
    assert_eq!(noct.status, 201);
    // YAML bodies work.
    let yaml = call(
        &r,
        "POST",
        "/api/v1/namespaces/demo/configmaps",
        Some("application/yaml"),
        Some(b"metadata:\n  name: fromyaml\ndata:\n  k: v\n".to_vec()),
    )
    .await;
    assert_eq!(yaml.status, 201, "{}", yaml.body);
    assert_eq!(yaml.body["data"]["k"], "v");
    // An update with a value of the wrong type is refused whole; a good one keeps the
    // object's field ownership, in its place among the metadata keys.
    let path = "/api/v1/namespaces/demo/configmaps/fromyaml";
    let mut wrong = yaml.body.clone();
    wrong["data"]["k"] = json!(5);
    let refused = put(&r, path, &wrong).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(
        refused.body["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string"
    );
    let unchanged = get(&r, path).await;
    assert_eq!(unchanged.body["data"]["k"], "v");
    let mut good = yaml.body.clone();
    good["data"]["k"] = json!("w");
    let updated = put(&r, path, &good).await;
    assert_eq!(updated.status, 200, "{}", updated.body);
    let keys =
        |v: &Value| -> Vec<String> { v["metadata"].as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&updated.body), keys(&yaml.body));
    assert!(!updated.body["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn pagination_returns_every_item_once_and_selectors_filter() {
    let r = start().await;
    namespace(&r, "p").await;
    for i in 0..25 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        let resp = post(
            &r,
            "/api/v1/namespaces/p/configmaps",
            &json!({"metadata": {"name": format!("cm-{i:02}"), "labels": {"tier": tier}}}),
        )
        .await;
        assert_eq!(resp.status, 201);
    }
    let mut seen = Vec::new();
    let mut cont = String::new();
    let mut pages = 0;
    loop {
        let path = if cont.is_empty() {
            "/api/v1/namespaces/p/configmaps?limit=10".to_string()
        } else {
            format!("/api/v1/namespaces/p/configmaps?limit=10&continue={cont}")
        };
        let page = get(&r, &path).await;
        assert_eq!(page.status, 200, "{}", page.body);
        pages += 1;
        for it in page.body["items"].as_array().unwrap() {
            seen.push(it["metadata"]["name"].as_str().unwrap().to_string());
        }
        // Writes between pages don't disturb the listing.
        if pages == 1 {
            post(
                &r,
                "/api/v1/namespaces/p/configmaps",
                &json!({"metadata": {"name": "cm-00a"}}),
            )
            .await;
        }
        match page.body["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => cont = c.to_string(),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(seen, expected);
    let front = get(
        &r,
        "/api/v1/namespaces/p/configmaps?labelSelector=tier%3Dfront",
    )
    .await;
    assert_eq!(front.body["items"].as_array().unwrap().len(), 13);
    let notfront = get(
        &r,
        "/api/v1/namespaces/p/configmaps?labelSelector=tier%20notin%20(front)",
    )
    .await;
    // `notin` also matches objects without the label (cm-00a, added between pages).
    assert_eq!(notfront.body["items"].as_array().unwrap().len(), 13);
    let by_name = get(
        &r,
        "/api/v1/namespaces/p/configmaps?fieldSelector=metadata.name%3Dcm-03",
    )
    .await;
    assert_eq!(by_name.body["items"].as_array().unwrap().len(), 1);
    let unsupported = get(
        &r,
        "/api/v1/namespaces/p/configmaps?fieldSelector=spec.foo%3Dx",
    )
    .await;
    assert_eq!(unsupported.status, 400);
}

#[tokio::test]
async fn watch_resumes_inside_the_window_and_expires_outside() {
    let r = start_with(
        StoreConfig::Memory,
        CacheConfig {
            window: 20,
            ..CacheConfig::default()
        },
    )
    .await;
    namespace(&r, "w").await;
    let first = post(
        &r,
        "/api/v1/namespaces/w/configmaps",
        &json!({"metadata": {"name": "a"}}),
    )
    .await;
    let rv = first.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    post(
        &r,
        "/api/v1/namespaces/w/configmaps",
        &json!({"metadata": {"name": "b"}}),
    )
    .await;
    patch(
        &r,
        "/api/v1/namespaces/w/configmaps/a",
        "application/merge-patch+json",
        &json!({"data": {"x": "1"}}),
    )
    .await;
    delete(&r, "/api/v1/namespaces/w/configmaps/b").await;
    let (status, mut w) = WatchStream::open(
        &r,
        &format!("/api/v1/namespaces/w/configmaps?watch=true&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(status, 200);
    let mut got = Vec::new();
    for _ in 0..3 {
        let e = w.next().await.unwrap();
        got.push((
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    assert_eq!(
        got,
        vec![
            ("ADDED".into(), "b".into()),
            ("MODIFIED".into(), "a".into()),
            ("DELETED".into(), "b".into())
        ]
    );
    // Live events continue the same stream.
    post(
        &r,
        "/api/v1/namespaces/w/configmaps",
        &json!({"metadata": {"name": "c"}}),
    )
    .await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "ADDED");
    assert_eq!(e["object"]["metadata"]["name"], "c");

    // Push the old revision out of the 20-event window: 410 as an ERROR event.
    for i in 0..30 {
        post(
            &r,
            "/api/v1/namespaces/w/configmaps",
            &json!({"metadata": {"name": format!("f{i}")}}),
        )
        .await;
    }
    let (status, mut old) = WatchStream::open(
        &r,
        &format!("/api/v1/namespaces/w/configmaps?watch=true&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(status, 200);
    let e = old.next().await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["code"], 410);
    // A relist recovers: its resourceVersion can be watched immediately.
    let list = get(&r, "/api/v1/namespaces/w/configmaps").await;
    assert_eq!(list.body["items"].as_array().unwrap().len(), 32);
    let lrv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, mut fresh) = WatchStream::open(
        &r,
        &format!("/api/v1/namespaces/w/configmaps?watch=true&resourceVersion={lrv}"),
    )
    .await;
    delete(&r, "/api/v1/namespaces/w/configmaps/a").await;
    let e = fresh.next().await.unwrap();
    assert_eq!(e["type"], "DELETED");
    assert_eq!(e["object"]["metadata"]["name"], "a");
}

#[tokio::test]
async fn watch_without_version_replays_state_and_selectors_translate_events() {
    let r = start().await;
    namespace(&r, "s").await;
    post(
        &r,
        "/api/v1/namespaces/s/configmaps",
        &json!({"metadata": {"name": "one", "labels": {"app": "x"}}}),
    )
    .await;
    let (_, mut w) = WatchStream::open(
        &r,
        "/api/v1/namespaces/s/configmaps?watch=1&labelSelector=app%3Dx",
    )
    .await;
    let e = w.next().await.unwrap();
    assert_eq!(
        (
            e["type"].as_str().unwrap(),
            e["object"]["metadata"]["name"].as_str().unwrap()
        ),
        ("ADDED", "one")
    );
    // Relabelling out of the selector is a DELETED for this watcher.
    patch(
        &r,
        "/api/v1/namespaces/s/configmaps/one",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "y"}}}),
    )
    .await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "DELETED");
    patch(
        &r,
        "/api/v1/namespaces/s/configmaps/one",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "x"}}}),
    )
    .await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "ADDED");
}

#[tokio::test]
async fn watch_times_out_and_sends_bookmarks_on_request() {
    let r = start_with(
        StoreConfig::Memory,
        CacheConfig {
            bookmark_interval: std::time::Duration::from_millis(50),
            ..CacheConfig::default()
        },
    )
    .await;
    let (_, mut w) = WatchStream::open(&r, "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1&allowWatchBookmarks=true&timeoutSeconds=2").await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "BOOKMARK");
    assert_eq!(e["object"]["kind"], "ConfigMap");
    // The stream ends on its own by the timeout.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(8), async {
        while w.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok());
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let r = start().await;
    namespace(&r, "f").await;
    post(
        &r,
        "/api/v1/namespaces/f/configmaps",
        &json!({"metadata": {"name": "held", "finalizers": ["example.com/x"]}}),
    )
    .await;
    let d = delete(&r, "/api/v1/namespaces/f/configmaps/held").await;
    assert!(d.status == 200 || d.status == 202, "{}", d.body);
    assert!(d.body["metadata"]["deletionTimestamp"].is_string());
    let still = get(&r, "/api/v1/namespaces/f/configmaps/held").await;
    assert_eq!(still.status, 200);
    let p = call(
        &r,
        "PATCH",
        "/api/v1/namespaces/f/configmaps/held",
        Some("application/json-patch+json"),
        Some(
            serde_json::to_vec(&json!([{"op": "remove", "path": "/metadata/finalizers"}])).unwrap(),
        ),
    )
    .await;
    assert_eq!(p.status, 200, "{}", p.body);
    let gone = get(&r, "/api/v1/namespaces/f/configmaps/held").await;
    assert_eq!(gone.status, 404);
    // Foreground propagation records the finalizer for the garbage collector.
    post(
        &r,
        "/apis/apps/v1/namespaces/f/deployments",
        &deployment("fg", 1),
    )
    .await;
    let fg = call(
        &r,
        "DELETE",
        "/apis/apps/v1/namespaces/f/deployments/fg",
        Some("application/json"),
        Some(br#"{"propagationPolicy":"Foreground"}"#.to_vec()),
    )
    .await;
    assert_eq!(
        fg.body["metadata"]["finalizers"],
        json!(["foregroundDeletion"])
    );
}

#[tokio::test]
async fn discovery_version_and_tables() {
    let r = start().await;
    let v = get(&r, "/version").await;
    assert_eq!(v.body["major"], "1");
    assert_eq!(v.body["minor"], "32");
    let apps = get(&r, "/apis/apps/v1").await;
    let names: Vec<&str> = apps.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"deployments")
            && names.contains(&"deployments/scale")
            && names.contains(&"deployments/status")
    );
    let agg = call_with(
        &r,
        "GET",
        "/apis",
        None,
        None,
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        )],
    )
    .await;
    assert_eq!(
        agg.headers["content-type"],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(agg.body["kind"], "APIGroupDiscoveryList");
    let core = get(&r, "/api").await;
    assert_eq!(core.body["versions"], json!(["v1"]));
    let root = get(&r, "/openapi/v3").await;
    assert!(root.body["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .starts_with("/openapi/v3/apis/apps/v1?hash="));
    let doc = get(&r, "/openapi/v3/apis/apps/v1").await;
    let patch_op =
        &doc.body["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch_op["x-kubernetes-group-version-kind"]["kind"],
        "Deployment"
    );
    assert!(patch_op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation"));
    let t = call_with(
        &r,
        "GET",
        "/api/v1/namespaces",
        None,
        None,
        &[(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )],
    )
    .await;
    assert_eq!(t.body["kind"], "Table");
    assert_eq!(t.body["columnDefinitions"][0]["name"], "Name");
    assert!(t.body["rows"].as_array().unwrap().len() >= 4);
    assert_eq!(t.body["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let unauth = get(&r, "/healthz").await;
    assert_eq!(unauth.raw.as_ref(), b"ok");
}

#[tokio::test]
async fn restart_keeps_objects_and_revisions_increase() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let r = start_with(
        StoreConfig::Embedded(store_dir.clone()),
        CacheConfig::default(),
    )
    .await;
    namespace(&r, "keep").await;
    let c = post(
        &r,
        "/apis/apps/v1/namespaces/keep/deployments",
        &deployment("web", 2),
    )
    .await;
    let rv: i64 = c.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let uid = c.body["metadata"]["uid"].clone();
    // Shutdown closes the store, so the same directory can be opened again at once.
    r.shutdown().await;
    let r2 = start_with(
        StoreConfig::Embedded(store_dir.clone()),
        CacheConfig::default(),
    )
    .await;
    let g = get(&r2, "/apis/apps/v1/namespaces/keep/deployments/web").await;
    assert_eq!(g.status, 200);
    assert_eq!(g.body["metadata"]["uid"], uid);
    assert_eq!(
        g.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap(),
        rv
    );
    let n = post(
        &r2,
        "/api/v1/namespaces/keep/configmaps",
        &json!({"metadata": {"name": "after"}}),
    )
    .await;
    assert!(
        n.body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            > rv
    );
}

fn pod(name: &str) -> Value {
    json!({"metadata": {"name": name},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
}

/// Field selectors are matched against the attributes the watch cache records per version:
/// a binding moves a pod into a `spec.nodeName` watch, a status write into a `status.phase`
/// list, and events.k8s.io selects on its own field names over core-stored Events.
#[tokio::test]
async fn field_selectors_follow_bindings_status_and_event_names() {
    let r = start().await;
    namespace(&r, "f").await;
    for n in ["a", "b"] {
        let resp = post(&r, "/api/v1/namespaces/f/pods", &pod(n)).await;
        assert_eq!(resp.status, 201, "{}", resp.body);
    }
    let (status, mut w) = WatchStream::open(
        &r,
        "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dnode-1",
    )
    .await;
    assert_eq!(status, 200);
    let resp = post(
        &r,
        "/api/v1/namespaces/f/pods/b/binding",
        &json!({"metadata": {"name": "b"}, "target": {"kind": "Node", "name": "node-1"}}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    // Pod a was never on node-1, so the first event is b entering the selection.
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "ADDED", "{e}");
    assert_eq!(e["object"]["metadata"]["name"], "b");
    assert_eq!(e["object"]["spec"]["nodeName"], "node-1");

    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let running = "/api/v1/namespaces/f/pods?fieldSelector=status.phase%3DRunning";
    assert_eq!(names(&get(&r, running).await.body), Vec::<String>::new());
    let resp = patch(
        &r,
        "/api/v1/namespaces/f/pods/b/status",
        "application/merge-patch+json",
        &json!({"status": {"phase": "Running"}}),
    )
    .await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(names(&get(&r, running).await.body), vec!["b"]);
    let not_running = "/api/v1/namespaces/f/pods?fieldSelector=status.phase!%3DRunning";
    assert_eq!(names(&get(&r, not_running).await.body), vec!["a"]);
    // Paginated lists read the same attributes.
    let page = get(&r, &format!("{not_running}&limit=1")).await;
    assert_eq!(names(&page.body), vec!["a"]);

    let resp = post(
        &r,
        "/api/v1/namespaces/f/events",
        &json!({"metadata": {"name": "ev"},
                "involvedObject": {"kind": "Pod", "name": "b", "namespace": "f"},
                "reason": "Started", "type": "Normal", "message": "m",
                "reportingComponent": "agent"}),
    )
    .await;
    assert_eq!(resp.status, 201, "{}", resp.body);
    for (path, want) in [
        (
            "/api/v1/namespaces/f/events?fieldSelector=involvedObject.name%3Db",
            vec!["ev"],
        ),
        (
            "/api/v1/namespaces/f/events?fieldSelector=involvedObject.name%3Da",
            vec![],
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/f/events?fieldSelector=regarding.name%3Db",
            vec!["ev"],
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/f/events?fieldSelector=reportingController%3Dagent",
            vec!["ev"],
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/f/events?fieldSelector=regarding.name%3Da",
            vec![],
        ),
    ] {
        let resp = get(&r, path).await;
        assert_eq!(resp.status, 200, "{path}: {}", resp.body);
        assert_eq!(names(&resp.body), want, "{path}");
    }
}

/// Metadata-only reads (`as=PartialObjectMetadata`), as metadata informers make them: GET,
/// LIST (from the cache and paginated) and WATCH return each object's metadata alone.
#[tokio::test]
async fn partial_object_metadata_reads() {
    let r = start().await;
    namespace(&r, "m").await;
    for n in ["a", "b"] {
        let mut p = pod(n);
        p["metadata"]["labels"] = json!({"app": n});
        assert_eq!(post(&r, "/api/v1/namespaces/m/pods", &p).await.status, 201);
    }
    let accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let list = call_with(
        &r,
        "GET",
        "/api/v1/namespaces/m/pods",
        None,
        None,
        &[("accept", accept)],
    )
    .await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["kind"], "PartialObjectMetadataList");
    assert_eq!(list.body["apiVersion"], "meta.k8s.io/v1");
    let items = list.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["kind"], "PartialObjectMetadata");
    assert_eq!(items[0]["metadata"]["name"], "a");
    assert_eq!(items[0]["metadata"]["labels"]["app"], "a");
    assert!(items[0].get("spec").is_none(), "{}", items[0]);
    assert!(!list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .is_empty());

    let page = call_with(
        &r,
        "GET",
        "/api/v1/namespaces/m/pods?limit=1",
        None,
        None,
        &[("accept", accept)],
    )
    .await;
    assert_eq!(page.body["kind"], "PartialObjectMetadataList");
    assert_eq!(page.body["items"].as_array().unwrap().len(), 1);
    assert!(
        page.body["metadata"]["continue"].is_string(),
        "{}",
        page.body
    );

    let one_accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let one = call_with(
        &r,
        "GET",
        "/api/v1/namespaces/m/pods/b",
        None,
        None,
        &[("accept", one_accept)],
    )
    .await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body["kind"], "PartialObjectMetadata");
    assert_eq!(one.body["metadata"]["name"], "b");
    assert!(one.body.get("spec").is_none());

    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, mut w) = WatchStream::open_with(
        &r,
        &format!("/api/v1/namespaces/m/pods?watch=1&resourceVersion={rv}"),
        &[("accept", one_accept)],
    )
    .await;
    assert_eq!(status, 200);
    let resp = patch(
        &r,
        "/api/v1/namespaces/m/pods/a",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "z"}}}),
    )
    .await;
    assert_eq!(resp.status, 200);
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(e["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(e["object"]["metadata"]["labels"]["app"], "z");
    assert_eq!(
        e["object"]["metadata"]["resourceVersion"],
        resp.body["metadata"]["resourceVersion"]
    );
    assert!(e["object"].get("spec").is_none());
}
