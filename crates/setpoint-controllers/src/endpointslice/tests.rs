use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::json;

use super::reconcile::{desired, plan, Changes, Desired};
use super::*;

fn service(v: serde_json::Value) -> Service {
    let mut base = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "svc-uid",
                     "labels": {"app": "web"}},
        "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
    });
    merge(&mut base, v);
    serde_json::from_value(base).unwrap()
}

fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// A pod of the service, `n` its index, ready or not, listening on `port` as `http`.
fn pod(n: usize, ready: bool, port: i32) -> Arc<Pod> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{n:04}"), "namespace": "default",
                         "uid": format!("uid-{n}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c",
                     "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": format!("10.1.{}.{}", n / 250, n % 250 + 1),
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                       "lastTransitionTime": "2024-01-01T00:00:00Z"}]}
        }))
        .unwrap(),
    )
}

fn no_zone(_: &str) -> Option<String> {
    None
}

/// Applies changes as the server would: creates get names, updates replace, deletes remove.
fn apply(existing: &[EndpointSlice], changes: &Changes, next: &mut usize) -> Vec<EndpointSlice> {
    let mut out: Vec<EndpointSlice> = existing
        .iter()
        .filter(|s| !changes.delete.contains(s.metadata.name.as_ref().unwrap()))
        .cloned()
        .collect();
    for u in &changes.update {
        let name = u.metadata.name.as_ref().unwrap();
        let slot = out
            .iter_mut()
            .find(|s| s.metadata.name.as_ref() == Some(name))
            .expect("updates name an existing slice");
        *slot = u.clone();
    }
    for c in &changes.create {
        let mut c = c.clone();
        *next += 1;
        c.metadata.name = Some(format!(
            "{}{next}",
            c.metadata.generate_name.clone().unwrap()
        ));
        out.push(c);
    }
    out
}

fn addresses(slices: &[EndpointSlice]) -> Vec<String> {
    let mut all: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    all.sort();
    all
}

#[test]
fn endpoints_carry_upstreams_conditions_and_hints() {
    let svc = service(json!({}));
    let mut terminating = (*pod(2, true, 8080)).clone();
    terminating.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
        ));
    let pods = vec![
        pod(0, true, 8080),
        pod(1, false, 8080),
        Arc::new(terminating),
    ];
    let d = desired(&svc, &pods, |n| {
        (n == "node-a").then(|| "zone-1".to_string())
    });
    assert_eq!(d.len(), 1);
    let (ports, eps) = d.values().next().unwrap();
    assert_eq!(ports[0].port, Some(8080));
    assert_eq!(ports[0].name.as_deref(), Some("http"));
    let cond = |i: usize| {
        let c = eps[i].conditions.clone().unwrap();
        (c.ready.unwrap(), c.serving.unwrap(), c.terminating.unwrap())
    };
    assert_eq!(cond(0), (true, true, false));
    assert_eq!(cond(1), (false, false, false));
    assert_eq!(
        cond(2),
        (false, true, true),
        "a terminating pod is never ready"
    );
    assert_eq!(eps[0].zone.as_deref(), Some("zone-1"));
    assert_eq!(eps[0].node_name.as_deref(), Some("node-a"));
    let target = eps[0].target_ref.clone().unwrap();
    assert_eq!(
        (target.kind.as_deref(), target.name.as_deref()),
        (Some("Pod"), Some("web-0000"))
    );

    let publish = service(json!({"spec": {"publishNotReadyAddresses": true}}));
    let d = desired(&publish, &pods, no_zone);
    let eps = &d.values().next().unwrap().1;
    assert!(eps
        .iter()
        .all(|e| e.conditions.as_ref().unwrap().ready == Some(true)));
}

#[test]
fn pods_resolving_named_ports_differently_go_to_different_slices() {
    let svc = service(json!({}));
    let pods = vec![pod(0, true, 8080), pod(1, true, 9090), pod(2, true, 8080)];
    let d = desired(&svc, &pods, no_zone);
    assert_eq!(d.len(), 2);
    let changes = plan(&svc, &d, &Vec::<EndpointSlice>::new(), 100, None);
    assert_eq!(changes.create.len(), 2);
    let mut shapes: Vec<(i32, usize)> = changes
        .create
        .iter()
        .map(|s| {
            (
                s.ports.as_ref().unwrap()[0].port.unwrap(),
                s.endpoints.len(),
            )
        })
        .collect();
    shapes.sort();
    assert_eq!(shapes, vec![(8080, 2), (9090, 1)]);
    let s = &changes.create[0];
    assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(s.address_type, "IPv4");
    let labels = s.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/service-name"], "web");
    assert_eq!(
        labels["endpointslice.kubernetes.io/managed-by"],
        "endpointslice-controller.k8s.io"
    );
    assert_eq!(labels["app"], "web");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Service", "svc-uid", Some(true))
    );
}

#[test]
fn a_pod_whose_named_port_is_missing_serves_no_ports() {
    let svc = service(json!({}));
    let mut p = (*pod(0, true, 8080)).clone();
    p.spec.as_mut().unwrap().containers[0].ports = None;
    let d = desired(&svc, &[Arc::new(p)], no_zone);
    let (ports, eps) = d.values().next().unwrap();
    assert!(ports.is_empty());
    assert_eq!(eps.len(), 1);
}

#[test]
fn hostname_is_set_when_the_subdomain_is_the_service() {
    let svc = service(json!({"spec": {"clusterIP": "None"}}));
    let mut p = (*pod(0, true, 8080)).clone();
    let spec = p.spec.as_mut().unwrap();
    spec.hostname = Some("web-0".into());
    spec.subdomain = Some("web".into());
    let mut other = (*pod(1, true, 8080)).clone();
    other.spec.as_mut().unwrap().hostname = Some("x".into());
    let d = desired(&svc, &[Arc::new(p), Arc::new(other)], no_zone);
    let eps = &d.values().next().unwrap().1;
    assert_eq!(eps[0].hostname.as_deref(), Some("web-0"));
    assert_eq!(eps[1].hostname, None);
    let changes = plan(&svc, &d, &Vec::<EndpointSlice>::new(), 100, None);
    let labels = changes.create[0].metadata.labels.clone().unwrap();
    assert_eq!(
        labels
            .get("service.kubernetes.io/headless")
            .map(String::as_str),
        Some("")
    );
}

#[test]
fn selectorless_services_get_nothing() {
    let svc = service(json!({"spec": {"selector": null}}));
    assert!(desired(&svc, &[pod(0, true, 8080)], no_zone).is_empty());
}

#[test]
fn slices_split_at_the_maximum_and_scale_down_updates_in_place() {
    let svc = service(json!({}));
    let pods: Vec<Arc<Pod>> = (0..250).map(|n| pod(n, true, 8080)).collect();
    let d = desired(&svc, &pods, no_zone);
    let changes = plan(
        &svc,
        &d,
        &Vec::<EndpointSlice>::new(),
        100,
        Some("2024-01-01T00:00:00Z"),
    );
    let sizes: Vec<usize> = changes.create.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    let annotations = changes.create[0].metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations["endpoints.kubernetes.io/last-change-trigger-time"],
        "2024-01-01T00:00:00Z"
    );
    let mut n = 0;
    let slices = apply(&[], &changes, &mut n);
    // Nothing changed: nothing to write.
    assert!(plan(&svc, &d, &slices, 100, None).is_empty());

    // Scale down to 240: only the slices that lost pods are written, in place.
    let fewer = desired(&svc, &pods[..240], no_zone);
    let changes = plan(&svc, &fewer, &slices, 100, None);
    assert!(changes.create.is_empty() && changes.delete.is_empty());
    assert_eq!(changes.update.len(), 1);
    let slices = apply(&slices, &changes, &mut n);
    assert_eq!(addresses(&slices).len(), 240);

    // One pod turns unready: one slice updated.
    let mut changed = pods[..240].to_vec();
    changed[5] = pod(5, false, 8080);
    let changes = plan(&svc, &desired(&svc, &changed, no_zone), &slices, 100, None);
    assert_eq!(
        (
            changes.create.len(),
            changes.update.len(),
            changes.delete.len()
        ),
        (0, 1, 0)
    );
}

#[test]
fn no_endpoints_leave_one_placeholder() {
    let svc = service(json!({}));
    let changes = plan(
        &svc,
        &Desired::new(),
        &Vec::<EndpointSlice>::new(),
        100,
        None,
    );
    assert_eq!(changes.create.len(), 1);
    assert!(changes.create[0].endpoints.is_empty());
    assert_eq!(changes.create[0].ports, Some(vec![]));
    let mut n = 0;
    let slices = apply(&[], &changes, &mut n);
    assert!(plan(&svc, &Desired::new(), &slices, 100, None).is_empty());

    // Pods arrive: the placeholder is reused rather than deleted and a slice created.
    let d = desired(&svc, &[pod(0, true, 8080)], no_zone);
    let changes = plan(&svc, &d, &slices, 100, None);
    assert_eq!(
        (
            changes.create.len(),
            changes.update.len(),
            changes.delete.len()
        ),
        (0, 1, 0)
    );
    let slices = apply(&slices, &changes, &mut n);
    assert_eq!(slices[0].ports.as_ref().unwrap()[0].port, Some(8080));

    // They go: the slice becomes the placeholder again.
    let changes = plan(&svc, &Desired::new(), &slices, 100, None);
    assert_eq!(
        (
            changes.create.len(),
            changes.update.len(),
            changes.delete.len()
        ),
        (0, 1, 0)
    );
}

#[test]
fn slices_of_an_earlier_service_of_the_same_name_are_replaced() {
    let svc = service(json!({}));
    let d = desired(&svc, &[pod(0, true, 8080)], no_zone);
    let mut n = 0;
    let slices = apply(
        &[],
        &plan(&svc, &d, &Vec::<EndpointSlice>::new(), 100, None),
        &mut n,
    );
    let again = service(json!({"metadata": {"uid": "new-uid"}}));
    let changes = plan(&again, &d, &slices, 100, None);
    let slices = apply(&slices, &changes, &mut n);
    assert_eq!(slices.len(), 1);
    assert!(reconcile::owned_by(&slices[0], &again));
}

proptest! {
    /// Whatever the slices held before, one plan leaves every wanted endpoint in exactly one
    /// slice, no slice over the limit, no empty slice beside others, and a second plan has
    /// nothing left to do.
    #[test]
    fn plans_converge_in_one_step(
        before in proptest::collection::vec((0usize..60, any::<bool>(), prop_oneof![Just(8080), Just(9090)]), 0..60),
        after in proptest::collection::vec((0usize..60, any::<bool>(), prop_oneof![Just(8080), Just(9090)]), 0..60),
        max in 1usize..12,
        old_max in 1usize..12,
    ) {
        let svc = service(json!({}));
        let uniq = |v: &[(usize, bool, i32)]| -> Vec<Arc<Pod>> {
            let mut seen = BTreeSet::new();
            v.iter().filter(|(n, _, _)| seen.insert(*n)).map(|(n, r, p)| pod(*n, *r, *p)).collect()
        };
        let mut n = 0;
        let d0 = desired(&svc, &uniq(&before), no_zone);
        let slices = apply(&[], &plan(&svc, &d0, &Vec::<EndpointSlice>::new(), old_max, None), &mut n);
        let pods = uniq(&after);
        let d1 = desired(&svc, &pods, no_zone);
        let changes = plan(&svc, &d1, &slices, max, None);
        let result = apply(&slices, &changes, &mut n);
        let want: Vec<String> = {
            let mut v: Vec<String> = d1.values().flat_map(|(_, e)| e.iter().map(|e| e.addresses[0].clone())).collect();
            v.sort();
            v
        };
        prop_assert_eq!(addresses(&result), want.clone());
        for s in &result {
            prop_assert!(s.endpoints.len() <= max);
            prop_assert!(!s.endpoints.is_empty() || result.len() == 1);
            let key = reconcile::port_key(s.ports.as_deref().unwrap_or_default());
            for e in &s.endpoints {
                let (_, eps) = &d1[&key];
                prop_assert!(eps.contains(e), "endpoint in a slice of other ports or stale");
            }
        }
        if want.is_empty() {
            prop_assert_eq!(result.len(), 1);
        }
        prop_assert!(plan(&svc, &d1, &result, max, None).is_empty());
    }
}
