//! The EndpointSlice and Endpoints controllers against a real in-process API server: pods
//! are made ready by writing their status, as a node agent would.

use k8s_openapi::api::core::v1::{Endpoints, Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use setpoint_controllers::endpointslice::EndpointSliceConfig;
use setpoint_runtime::client::{Api, Client, DeleteParams, ListParams, PostParams};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::{eventually, TestCluster};

const NS: &str = "endpoints";

/// Starts both controllers on their own informers; the slice controller splits at `max`.
fn start_controllers(client: &Client, max: usize) -> tokio::task::JoinHandle<()> {
    let informers = SharedInformers::new(client.clone());
    let slices = setpoint_controllers::endpointslice::controller(
        client.clone(),
        &informers,
        EndpointSliceConfig {
            max_endpoints_per_slice: max,
        },
    );
    let endpoints = setpoint_controllers::endpoints::controller(client.clone(), &informers);
    let mirroring =
        setpoint_controllers::endpointslice::mirroring::controller(client.clone(), &informers);
    tokio::spawn(async move {
        tokio::join!(
            slices.run(std::future::pending()),
            endpoints.run(std::future::pending()),
            mirroring.run(std::future::pending())
        );
        informers.shutdown().await;
    })
}

/// Creates a pod of `web` listening on the named port `http` and gives it `ip` and the
/// Ready condition `ready`.
async fn pod(client: &Client, name: &str, ip: &str, ready: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                 "ports": [{"name": "http", "containerPort": 8080}]}]}
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.unwrap();
    set_ready(client, name, ip, ready).await;
}

async fn set_ready(client: &Client, name: &str, ip: &str, ready: bool) {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pod = api.get(name).await.unwrap();
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }))
        .unwrap(),
    );
    api.replace_status(name, &PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The slices of `service`: (name, sorted (address, ready) pairs) each.
async fn slices(client: &Client, service: &str) -> Vec<(String, Vec<(String, bool)>)> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let params = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let mut out: Vec<(String, Vec<(String, bool)>)> = api
        .list(&params)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let mut eps: Vec<(String, bool)> = s
                .endpoints
                .iter()
                .map(|e| {
                    let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
                    (e.addresses[0].clone(), ready)
                })
                .collect();
            eps.sort();
            (s.metadata.name.unwrap_or_default(), eps)
        })
        .collect();
    out.sort();
    out
}

/// The Endpoints of `service` as (ready IPs, not-ready IPs).
async fn endpoints(client: &Client, service: &str) -> Option<(Vec<String>, Vec<String>)> {
    let api: Api<Endpoints> = Api::namespaced(client.clone(), NS);
    let ep = api.get_opt(service).await.unwrap()?;
    let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
    for s in ep.subsets.unwrap_or_default() {
        ready.extend(s.addresses.unwrap_or_default().into_iter().map(|a| a.ip));
        not_ready.extend(
            s.not_ready_addresses
                .unwrap_or_default()
                .into_iter()
                .map(|a| a.ip),
        );
    }
    ready.sort();
    not_ready.sort();
    Some((ready, not_ready))
}

#[tokio::test]
async fn services_get_slices_and_endpoints_of_the_pods_they_select() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let controllers = start_controllers(&client, 2);

    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let web: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }))
    .unwrap();
    services.create(&PostParams::default(), &web).await.unwrap();
    // A Service without a selector and the Endpoints its user wrote.
    let manual: Service = serde_json::from_value(json!({
        "metadata": {"name": "manual"}, "spec": {"ports": [{"port": 80}]}
    }))
    .unwrap();
    services
        .create(&PostParams::default(), &manual)
        .await
        .unwrap();
    let user_endpoints: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "manual"},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 80}]}]
    }))
    .unwrap();
    Api::<Endpoints>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &user_endpoints)
        .await
        .unwrap();

    // No pods yet: one empty placeholder slice.
    eventually("a placeholder slice", || async {
        let s = slices(&client, "web").await;
        (s.len() == 1 && s[0].1.is_empty()).then_some(())
    })
    .await;

    pod(&client, "web-a", "10.1.0.1", true).await;
    pod(&client, "web-b", "10.1.0.2", true).await;
    pod(&client, "web-c", "10.1.0.3", false).await;
    // Three endpoints at two a slice: two slices, the not-ready pod listed as not ready.
    let before = eventually("slices of the three pods", || async {
        let s = slices(&client, "web").await;
        let all: Vec<(String, bool)> = s.iter().flat_map(|(_, e)| e.clone()).collect();
        let want = [("10.1.0.1", true), ("10.1.0.2", true), ("10.1.0.3", false)];
        let mut sorted = all.clone();
        sorted.sort();
        (s.len() == 2
            && sorted
                .iter()
                .zip(want)
                .all(|((a, r), (wa, wr))| a == wa && *r == wr)
            && sorted.len() == 3)
            .then_some(s)
    })
    .await;
    eventually("the Endpoints of the three pods", || async {
        let want = (
            vec!["10.1.0.1".to_string(), "10.1.0.2".to_string()],
            vec!["10.1.0.3".to_string()],
        );
        (endpoints(&client, "web").await == Some(want.clone())).then_some(())
    })
    .await;
    // Each controller's decision records say what it saw and why it wrote.
    let (observed, rule) = setpoint_testing::decision(
        "endpoint",
        NS,
        "web",
        "2 ready, 1 not ready addresses; ports: http:8080/TCP",
        "Endpoints web",
    )
    .await;
    assert!(
        !observed.is_empty() && !rule.is_empty(),
        "{observed:?} {rule}"
    );
    let (observed, rule) = setpoint_testing::decision(
        "endpointslice",
        NS,
        "web",
        "3 endpoints: 2 ready, 1 not ready, 0 terminating",
        "create slice web-",
    )
    .await;
    assert!(
        observed
            .iter()
            .any(|o| o.contains("(at most 2 endpoints a slice)")),
        "{observed:?}"
    );
    assert_eq!(
        rule,
        "endpoints that fit no existing slice (at most 2 a slice)"
    );

    // The not-ready pod becomes ready; one goes: the slices are updated in place.
    set_ready(&client, "web-c", "10.1.0.3", true).await;
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("web-a", &DeleteParams::default())
        .await
        .unwrap();
    let after = eventually("slices of the two remaining pods", || async {
        let s = slices(&client, "web").await;
        let mut all: Vec<(String, bool)> = s.iter().flat_map(|(_, e)| e.clone()).collect();
        all.sort();
        (all == vec![
            ("10.1.0.2".to_string(), true),
            ("10.1.0.3".to_string(), true),
        ])
        .then_some(s)
    })
    .await;
    let names = |s: &[(String, Vec<(String, bool)>)]| -> Vec<String> {
        s.iter().map(|(n, _)| n.clone()).collect()
    };
    assert!(
        names(&after).iter().all(|n| names(&before).contains(n)),
        "no slice was recreated: {before:?} → {after:?}"
    );
    eventually("the Endpoints of the two remaining pods", || async {
        let want = (vec!["10.1.0.2".to_string(), "10.1.0.3".to_string()], vec![]);
        (endpoints(&client, "web").await == Some(want.clone())).then_some(())
    })
    .await;

    // The selector-less Service kept its user's Endpoints, mirrored into a slice by the
    // mirroring controller (and by no other).
    assert_eq!(
        endpoints(&client, "manual").await,
        Some((vec!["192.0.2.10".to_string()], vec![]))
    );
    let mirrored = eventually("the user's Endpoints mirrored", || async {
        let s = slices(&client, "manual").await;
        (s.len() == 1 && s[0].1 == vec![("192.0.2.10".to_string(), true)]).then_some(s)
    })
    .await;
    let slice = Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .get(&mirrored[0].0)
        .await
        .unwrap();
    let labels = slice.metadata.labels.unwrap();
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslicemirroring-controller.k8s.io"
    );
    let (observed, rule) = setpoint_testing::decision(
        "endpointslicemirroring",
        NS,
        "manual",
        "1 endpoints: 1 ready",
        "create slice manual-",
    )
    .await;
    assert!(
        !observed.is_empty() && !rule.is_empty(),
        "{observed:?} {rule}"
    );

    // The Service goes: so do its Endpoints (its slices go with it by the garbage
    // collector, which this test does not run).
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Endpoints deleted with the Service", || async {
        endpoints(&client, "web").await.is_none().then_some(())
    })
    .await;

    controllers.abort();
    cluster.stop().await;
}
