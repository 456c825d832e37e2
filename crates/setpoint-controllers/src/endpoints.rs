//! The Endpoints controller: every Service with a selector gets a core `v1` Endpoints of
//! the same name listing the pods it selects, ready ones under `addresses` and the others
//! under `notReadyAddresses`, one subset per set of resolved ports (upstream's
//! `endpoints-controller`). More than [`MAX_CAPACITY`] addresses are truncated, and the
//! object says so with `endpoints.kubernetes.io/over-capacity: truncated`.
//!
//! Services without a selector keep the Endpoints their user writes. A deleted Service's
//! Endpoints are deleted with it, as upstream does.
//!
//! [`desired_subsets`], [`truncate`] and [`desired`] are the pure decision;
//! [`EndpointsController`] does the I/O. The pod rules are shared with the EndpointSlice
//! controller ([`crate::endpointslice::pods`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::events::{EventRecorder, EventType, Reporter, ToObjectReference};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use crate::endpointslice::pods::{self, HEADLESS_LABEL, TRIGGER_TIME_ANNOTATION};

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "endpoint";
/// The most addresses (ready and not) one Endpoints object holds.
pub const MAX_CAPACITY: usize = 1000;
/// The annotation marking an Endpoints object that holds fewer addresses than it should.
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";
/// The value of [`OVER_CAPACITY_ANNOTATION`].
pub const TRUNCATED: &str = "truncated";

fn address(service: &Service, pod: &Pod) -> Option<EndpointAddress> {
    Some(EndpointAddress {
        ip: pods::ipv4(pod)?,
        hostname: pods::should_set_hostname(pod, service)
            .then(|| pod.spec.as_ref().and_then(|s| s.hostname.clone()))
            .flatten(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
    })
}

/// The subsets of the pods the Service selects (`pods` may hold others): per pod, one entry
/// per Service port that resolves on it (none for a headless Service without ports), ready
/// under `addresses` (every pod with `publishNotReadyAddresses`), else `notReadyAddresses`;
/// terminating pods only with `publishNotReadyAddresses`. Entries with the same ports are
/// packed into one subset; addresses are sorted by IP.
pub fn desired_subsets(service: &Service, pods: &[impl AsRef<Pod>]) -> Vec<EndpointSubset> {
    let Some(selector) = pods::selector(service) else {
        return Vec::new();
    };
    let tolerate = pods::publish_not_ready(service);
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    // Subsets keyed by their ports' canonical text: (ports, ready, not ready).
    type Packed = BTreeMap<
        String,
        (
            Vec<EndpointPort>,
            Vec<EndpointAddress>,
            Vec<EndpointAddress>,
        ),
    >;
    let mut packed: Packed = BTreeMap::new();
    let mut add = |ports: Vec<EndpointPort>, addr: EndpointAddress, ready: bool| {
        let key = serde_json::to_string(&ports).unwrap_or_default();
        let entry = packed
            .entry(key)
            .or_insert_with(|| (ports, Vec::new(), Vec::new()));
        if ready {
            entry.1.push(addr);
        } else {
            entry.2.push(addr);
        }
    };
    for pod in pods.iter().map(AsRef::as_ref) {
        if !pods::selects(&selector, service, pod) || !pods::should_be_in_endpoints(pod, tolerate) {
            continue;
        }
        let Some(addr) = address(service, pod) else {
            continue;
        };
        let ready = tolerate || pods::is_pod_ready(pod);
        let mut resolved: Vec<EndpointPort> = ports
            .iter()
            .filter_map(|sp| {
                Some(EndpointPort {
                    name: sp.name.clone().filter(|n| !n.is_empty()),
                    port: pods::find_port(pod, sp)?,
                    protocol: Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                    app_protocol: sp.app_protocol.clone(),
                })
            })
            .collect();
        // A pod none of whose ports resolve serves nothing; a headless Service without
        // ports lists bare addresses.
        if resolved.is_empty() && !(ports.is_empty() && pods::is_headless(service)) {
            continue;
        }
        resolved.sort_by(|a, b| (&a.name, a.port).cmp(&(&b.name, b.port)));
        add(resolved, addr, ready);
    }
    // One subset per set of ports, as upstream's RepackSubsets makes them.
    packed
        .into_values()
        .map(|(ports, mut ready, mut not_ready)| {
            let by_ip = |a: &EndpointAddress, b: &EndpointAddress| {
                sort_key(&a.ip)
                    .cmp(&sort_key(&b.ip))
                    .then_with(|| uid(a).cmp(uid(b)))
            };
            ready.sort_by(by_ip);
            not_ready.sort_by(by_ip);
            EndpointSubset {
                addresses: (!ready.is_empty()).then_some(ready),
                not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

fn uid(a: &EndpointAddress) -> &str {
    a.target_ref
        .as_ref()
        .and_then(|t| t.uid.as_deref())
        .unwrap_or_default()
}

/// Sorts IPv4 addresses numerically (10.0.0.9 before 10.0.0.10).
fn sort_key(ip: &str) -> (u32, String) {
    match ip.parse::<std::net::Ipv4Addr>() {
        Ok(a) => (u32::from(a), String::new()),
        Err(_) => (u32::MAX, ip.to_string()),
    }
}

/// Cuts the subsets to [`MAX_CAPACITY`] addresses as upstream's `truncateEndpoints` does:
/// not-ready addresses go first; if the ready ones alone are too many, every not-ready one
/// goes and the ready ones are cut. Each subset keeps its share of what is kept, the last
/// one the rest. Returns whether anything was cut.
pub fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let len = |v: &Option<Vec<EndpointAddress>>| v.as_ref().map_or(0, Vec::len);
    let ready: usize = subsets.iter().map(|s| len(&s.addresses)).sum();
    let not_ready: usize = subsets.iter().map(|s| len(&s.not_ready_addresses)).sum();
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let cut_ready = ready > MAX_CAPACITY;
    let (max, total) = if cut_ready {
        (MAX_CAPACITY, ready)
    } else {
        (MAX_CAPACITY - ready, not_ready)
    };
    let mut room = max;
    let last = subsets.len().saturating_sub(1);
    for (i, s) in subsets.iter_mut().enumerate() {
        let here = if cut_ready {
            len(&s.addresses)
        } else {
            len(&s.not_ready_addresses)
        };
        let mut share = if i == last {
            room
        } else {
            (here * max).div_ceil(total.max(1))
        };
        share = share.min(room);
        let target = if cut_ready {
            s.not_ready_addresses = None;
            &mut s.addresses
        } else {
            &mut s.not_ready_addresses
        };
        if let Some(list) = target.as_mut() {
            list.truncate(share);
            room -= list.len();
        }
    }
    true
}

/// The Endpoints a Service should have, given what exists (`current`, whose other labels
/// and annotations are kept), or `None` when `current` already says it. `trigger` is
/// recorded as the last change's time on a write.
pub fn desired(
    service: &Service,
    pods: &[impl AsRef<Pod>],
    current: Option<&Endpoints>,
    trigger: Option<&str>,
) -> Option<Endpoints> {
    let mut subsets = desired_subsets(service, pods);
    let truncated = truncate(&mut subsets);
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    labels.remove(HEADLESS_LABEL);
    if pods::is_headless(service) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    let subsets = (!subsets.is_empty()).then_some(subsets);
    if let Some(cur) = current {
        let cur_labels = cur.metadata.labels.clone().unwrap_or_default();
        let capacity = cur
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(OVER_CAPACITY_ANNOTATION));
        let same_subsets = cur.subsets.clone().filter(|s| !s.is_empty()) == subsets;
        if same_subsets && cur_labels == labels && capacity.is_some() == truncated {
            return None;
        }
    }
    let mut out = current.cloned().unwrap_or_else(|| Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.metadata.namespace.clone(),
            ..Default::default()
        },
        ..Default::default()
    });
    out.metadata.labels = Some(labels);
    let annotations = out.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if let Some(t) = trigger {
        annotations.insert(TRIGGER_TIME_ANNOTATION.into(), t.into());
    }
    if truncated {
        annotations.insert(OVER_CAPACITY_ANNOTATION.into(), TRUNCATED.into());
    } else {
        annotations.remove(OVER_CAPACITY_ANNOTATION);
    }
    out.subsets = subsets;
    Some(out)
}

/// The decision record's summary of subsets: ready and not-ready addresses and the ports.
fn summary(subsets: &[EndpointSubset]) -> String {
    let len = |v: &Option<Vec<EndpointAddress>>| v.as_ref().map_or(0, Vec::len);
    let ready: usize = subsets.iter().map(|s| len(&s.addresses)).sum();
    let not_ready: usize = subsets.iter().map(|s| len(&s.not_ready_addresses)).sum();
    let mut ports: Vec<String> = subsets
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            match &p.name {
                Some(n) => format!("{n}:{}/{proto}", p.port),
                None => format!("{}/{proto}", p.port),
            }
        })
        .collect();
    ports.sort();
    ports.dedup();
    format!(
        "{ready} ready, {not_ready} not ready addresses; ports: {}",
        if ports.is_empty() {
            "none".to_string()
        } else {
            ports.join(", ")
        }
    )
}

/// The reconciler of Services' Endpoints.
pub struct EndpointsController {
    client: Client,
    services: Store<Service>,
    pods: Store<Pod>,
    endpoints: Store<Endpoints>,
    events: EventRecorder,
}

#[async_trait::async_trait]
impl Reconciler for EndpointsController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let ns = key.namespace.clone().unwrap_or_default();
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
        let Some(service) = self.services.get(key) else {
            ctx.observe("the Service is gone");
            // The Service is gone: so are its endpoints (upstream deletes them whoever made
            // them).
            if self.endpoints.get(key).is_some() {
                if ctx.recording() {
                    ctx.action(
                        format!("delete Endpoints {}", key.name),
                        "the Service is gone (its Endpoints go with it, whoever made them)",
                    );
                }
                match api.delete(&key.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(Action::Done);
        };
        if pods::selector(&service).is_none() {
            ctx.observe("the Service has no selector: its Endpoints are its user's");
            return Ok(Action::Done);
        }
        if service.metadata.deletion_timestamp.is_some() {
            ctx.observe("the Service is being deleted");
            return Ok(Action::Done);
        }
        let pods = self.pods.by_namespace(&ns);
        let current = self.endpoints.get(key);
        let trigger = crate::endpointslice::trigger_time(&service, &pods);
        let Some(next) = desired(&service, &pods, current.as_deref(), trigger.as_deref()) else {
            setpoint_runtime::decision::observe_with(|| {
                let subsets = current.as_ref().and_then(|c| c.subsets.as_deref());
                format!(
                    "{}; the Endpoints already list them",
                    summary(subsets.unwrap_or_default())
                )
            });
            return Ok(Action::Done);
        };
        if ctx.recording() {
            let truncated = next
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(OVER_CAPACITY_ANNOTATION));
            ctx.observe(format!(
                "{}{}",
                summary(next.subsets.as_deref().unwrap_or_default()),
                if truncated {
                    format!(" (truncated to {MAX_CAPACITY})")
                } else {
                    String::new()
                }
            ));
            match &current {
                Some(_) => ctx.action(
                    format!("update Endpoints {}", key.name),
                    "the selected pods' addresses, ports or the labels differ from the Endpoints",
                ),
                None => ctx.action(
                    format!("create Endpoints {}", key.name),
                    "the Service has a selector and no Endpoints",
                ),
            }
        }
        let result = match &current {
            Some(_) => api.replace(&key.name, &PostParams::default(), &next).await,
            None => api.create(&PostParams::default(), &next).await,
        };
        match result {
            Ok(_) => Ok(Action::Done),
            // A stale cache: the informer brings the fresh object and another pass.
            Err(e) if e.is_conflict() || e.is_already_exists() => Err(e.into()),
            Err(e) => {
                self.events.publish(
                    &service.object_reference(),
                    EventType::Warning,
                    "FailedToUpdateEndpoint",
                    &format!("Failed to update endpoint {key}: {e}"),
                );
                Err(e.into())
            }
        }
    }
}

/// The Endpoints controller, reconciling a Service when it, a pod it selects (before or
/// after a change) or its Endpoints change.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let services = informers.typed::<Service>(Scope::all()).store();
    let reconciler = EndpointsController {
        events: EventRecorder::new(client.clone(), Reporter::new("endpoint-controller")),
        client,
        services: services.clone(),
        pods: informers.typed::<Pod>(Scope::all()).store(),
        endpoints: informers.typed::<Endpoints>(Scope::all()).store(),
    };
    Controller::for_type::<Service>(NAME, informers, None)
        .watches::<Pod>(None, move |pod: &Pod| {
            services
                .by_namespace(&pod.namespace().unwrap_or_default())
                .iter()
                .filter(|svc| pods::selector(svc).is_some_and(|sel| pods::selects(&sel, svc, pod)))
                .map(|svc| ObjectKey::of(svc.as_ref()))
                .collect()
        })
        .watches::<Endpoints>(None, |ep: &Endpoints| vec![ObjectKey::of(ep)])
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(extra: serde_json::Value) -> Service {
        let mut v = json!({
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
        });
        if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra.as_object()) {
            for (k, val) in extra {
                spec.insert(k.clone(), val.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(n: usize, ready: bool, port: i32) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("web-{n}"), "namespace": "default",
                             "uid": format!("uid-{n}"), "labels": {"app": "web"}},
                "spec": {"nodeName": "node-a", "containers": [{"name": "c",
                         "ports": [{"name": "http", "containerPort": port}]}]},
                "status": {"podIP": format!("10.1.{}.{}", n / 250, n % 250 + 1),
                           "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
            }))
            .unwrap(),
        )
    }

    fn ips(v: &Option<Vec<EndpointAddress>>) -> Vec<String> {
        v.iter().flatten().map(|a| a.ip.clone()).collect()
    }

    #[test]
    fn ready_and_not_ready_pods_are_listed_apart() {
        let svc = service(json!({}));
        let subsets = desired_subsets(
            &svc,
            &[pod(1, true, 8080), pod(0, false, 8080), pod(9, true, 8080)],
        );
        assert_eq!(subsets.len(), 1);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.1.0.2", "10.1.0.10"]);
        assert_eq!(ips(&subsets[0].not_ready_addresses), vec!["10.1.0.1"]);
        let port = &subsets[0].ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.port, port.protocol.as_deref()),
            (Some("http"), 8080, Some("TCP"))
        );
        let target = subsets[0].addresses.as_ref().unwrap()[0]
            .target_ref
            .clone()
            .unwrap();
        assert_eq!(target.name.as_deref(), Some("web-1"));
    }

    #[test]
    fn publishing_not_ready_addresses_lists_every_pod_as_ready() {
        let svc = service(json!({"publishNotReadyAddresses": true}));
        let subsets = desired_subsets(&svc, &[pod(0, false, 8080)]);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.1.0.1"]);
        assert!(subsets[0].not_ready_addresses.is_none());
    }

    #[test]
    fn pods_resolving_ports_differently_get_subsets_of_their_own() {
        let svc = service(json!({}));
        let subsets = desired_subsets(&svc, &[pod(0, true, 8080), pod(1, true, 9090)]);
        assert_eq!(subsets.len(), 2);
        let mut ports: Vec<i32> = subsets
            .iter()
            .map(|s| s.ports.as_ref().unwrap()[0].port)
            .collect();
        ports.sort();
        assert_eq!(ports, vec![8080, 9090]);
    }

    #[test]
    fn terminating_and_finished_pods_are_left_out() {
        let svc = service(json!({}));
        let mut going = (*pod(0, true, 8080)).clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        let mut done = (*pod(1, true, 8080)).clone();
        done.status.as_mut().unwrap().phase = Some("Failed".into());
        assert!(desired_subsets(&svc, &[Arc::new(going.clone()), Arc::new(done)]).is_empty());
        let tolerant = service(json!({"publishNotReadyAddresses": true}));
        assert_eq!(desired_subsets(&tolerant, &[Arc::new(going)]).len(), 1);
    }

    #[test]
    fn selectorless_services_are_left_alone() {
        let svc = service(json!({"selector": null}));
        assert!(desired_subsets(&svc, &[pod(0, true, 8080)]).is_empty());
    }

    #[test]
    fn more_than_the_capacity_is_truncated_not_ready_first() {
        let svc = service(json!({}));
        let pods: Vec<Arc<Pod>> = (0..1100).map(|n| pod(n, n < 950, 8080)).collect();
        let ep = desired(&svc, &pods, None, Some("2024-01-01T00:00:00Z")).unwrap();
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(ips(&s.addresses).len(), 950);
        assert_eq!(ips(&s.not_ready_addresses).len(), 50);
        let annotations = ep.metadata.annotations.clone().unwrap();
        assert_eq!(annotations[OVER_CAPACITY_ANNOTATION], "truncated");
        assert_eq!(annotations[TRIGGER_TIME_ANNOTATION], "2024-01-01T00:00:00Z");
        // Nothing changed: nothing to write.
        assert!(desired(&svc, &pods, Some(&ep), None).is_none());

        let all_ready: Vec<Arc<Pod>> = (0..1200).map(|n| pod(n, true, 8080)).collect();
        let mut subsets = desired_subsets(&svc, &all_ready);
        assert!(truncate(&mut subsets));
        assert_eq!(ips(&subsets[0].addresses).len(), MAX_CAPACITY);

        // Back under the limit: the annotation goes.
        let fewer = desired(&svc, &pods[..10], Some(&ep), None).unwrap();
        assert!(!fewer
            .metadata
            .annotations
            .unwrap()
            .contains_key(OVER_CAPACITY_ANNOTATION));
    }

    #[test]
    fn truncation_shares_the_room_between_subsets() {
        let subset = |ready: usize, not_ready: usize| EndpointSubset {
            addresses: Some(vec![EndpointAddress::default(); ready]),
            not_ready_addresses: Some(vec![EndpointAddress::default(); not_ready]),
            ports: None,
        };
        let mut subsets = vec![subset(400, 300), subset(400, 300)];
        assert!(truncate(&mut subsets));
        let count = |s: &EndpointSubset| {
            (
                s.addresses.as_ref().unwrap().len(),
                s.not_ready_addresses.as_ref().unwrap().len(),
            )
        };
        assert_eq!(count(&subsets[0]), (400, 100));
        assert_eq!(count(&subsets[1]), (400, 100));
        let mut small = vec![subset(3, 3)];
        assert!(!truncate(&mut small));
    }

    #[test]
    fn headless_services_without_ports_list_bare_addresses() {
        let svc = service(json!({"clusterIP": "None", "ports": null}));
        let ep = desired(&svc, &[pod(0, true, 8080)], None, None).unwrap();
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert!(s.ports.is_none());
        assert_eq!(ips(&s.addresses), vec!["10.1.0.1"]);
        assert_eq!(
            ep.metadata
                .labels
                .unwrap()
                .get(HEADLESS_LABEL)
                .map(String::as_str),
            Some("")
        );
    }
}
