//! The EndpointSliceMirroring controller: the Endpoints a user writes for a Service without
//! a selector are mirrored into EndpointSlices (managed by
//! `endpointslicemirroring-controller.k8s.io`, owned by the Endpoints), so clients that read
//! slices see them too. Endpoints labelled `endpointslice.kubernetes.io/skip-mirror: true`
//! (the `kubernetes` Service's), Endpoints of a Service with a selector and Endpoints without
//! a Service are not mirrored, and their mirrored slices are deleted.
//!
//! [`desired`] and [`writer`] are the pure part; the slices are planned by
//! [`super::reconcile::plan_for`] as the EndpointSlice controller's are.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use setpoint_runtime::client::{Api, Client, DeleteParams, PostParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::{Object, ObjectKey};

use super::pods::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TRIGGER_TIME_ANNOTATION};
use super::reconcile::{self, port_key, Desired, Writer};

/// The controller's name (work queue, metrics, logs).
pub const NAME: &str = "endpointslicemirroring";
/// The value of the managed-by label on mirrored slices.
pub const CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
/// The label that keeps an Endpoints object from being mirrored.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Endpoints per mirrored slice (upstream's `--mirroring-max-endpoints-per-subset` default).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// Whether the Endpoints should be mirrored, given its Service.
pub fn should_mirror(endpoints: &Endpoints, service: Option<&Service>) -> bool {
    let skip = endpoints
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SKIP_MIRROR_LABEL))
        .is_some_and(|v| v == "true");
    let selectorless = service.is_some_and(|s| super::pods::selector(s).is_none());
    !skip && selectorless && endpoints.metadata.deletion_timestamp.is_none()
}

fn endpoint(a: &EndpointAddress, ready: bool) -> Option<Endpoint> {
    a.ip.parse::<std::net::Ipv4Addr>().ok()?;
    Some(Endpoint {
        addresses: vec![a.ip.clone()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(ready),
            terminating: Some(false),
        }),
        hostname: a.hostname.clone().filter(|h| !h.is_empty()),
        node_name: a.node_name.clone().filter(|n| !n.is_empty()),
        target_ref: a.target_ref.clone(),
        ..Default::default()
    })
}

/// The slices' endpoints: each subset's IPv4 addresses (ready) and not-ready addresses, on
/// the subset's ports.
pub fn desired(endpoints: &Endpoints) -> Desired {
    let mut out = Desired::new();
    for subset in endpoints.subsets.iter().flatten() {
        let ports: Vec<EndpointPort> = subset
            .ports
            .iter()
            .flatten()
            .map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            })
            .collect();
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let not_ready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        let eps: Vec<Endpoint> = ready
            .chain(not_ready)
            .filter_map(|(a, r)| endpoint(a, r))
            .collect();
        if eps.is_empty() {
            continue;
        }
        out.entry(port_key(&ports))
            .or_insert_with(|| (ports, Vec::new()))
            .1
            .extend(eps);
    }
    out
}

/// Who writes the mirrored slices: the Endpoints' labels (but the skip label), the Service's
/// name, this controller, and a controller reference to the Endpoints.
pub fn writer(endpoints: &Endpoints) -> Writer {
    let name = endpoints.metadata.name.clone().unwrap_or_default();
    let mut labels = endpoints.metadata.labels.clone().unwrap_or_default();
    labels.remove(SKIP_MIRROR_LABEL);
    labels.insert(SERVICE_NAME_LABEL.into(), name.clone());
    labels.insert(MANAGED_BY_LABEL.into(), CONTROLLER_NAME.into());
    Writer {
        name: name.clone(),
        namespace: endpoints.metadata.namespace.clone(),
        labels,
        owner: OwnerReference {
            api_version: "v1".into(),
            kind: "Endpoints".into(),
            name,
            uid: endpoints.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    }
}

/// Why [`should_mirror`] said no, for the decision record.
fn not_mirrored(endpoints: Option<&Endpoints>, service: Option<&Service>) -> &'static str {
    match (endpoints, service) {
        (None, _) => "the Endpoints are gone",
        (Some(e), _) if e.metadata.deletion_timestamp.is_some() => {
            "the Endpoints are being deleted"
        }
        (Some(_), None) => "the Endpoints have no Service",
        (Some(_), Some(svc)) if super::pods::selector(svc).is_some() => {
            "the Service has a selector"
        }
        _ => "the Endpoints are labelled skip-mirror",
    }
}

fn is_mirrored(slice: &EndpointSlice, service: &str) -> bool {
    let labels = slice.metadata.labels.as_ref();
    let get = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    get(MANAGED_BY_LABEL) == Some(CONTROLLER_NAME) && get(SERVICE_NAME_LABEL) == Some(service)
}

struct MirroringController {
    client: Client,
    endpoints: Store<Endpoints>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

#[async_trait::async_trait]
impl Reconciler for MirroringController {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let ns = key.namespace.clone().unwrap_or_default();
        let existing: Vec<Arc<EndpointSlice>> = self
            .slices
            .by_label(SERVICE_NAME_LABEL, &key.name)
            .into_iter()
            .filter(|s| s.namespace().as_deref() == Some(ns.as_str()) && is_mirrored(s, &key.name))
            .collect();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let endpoints = self.endpoints.get(key);
        let service = self.services.get(key);
        let mirror = endpoints
            .as_deref()
            .filter(|ep| should_mirror(ep, service.as_deref()));
        let Some(ep) = mirror else {
            if ctx.recording() {
                ctx.observe(format!(
                    "{}; {} mirrored slices",
                    not_mirrored(endpoints.as_deref(), service.as_deref()),
                    existing.len()
                ));
                for s in &existing {
                    ctx.action(
                        format!("delete slice {}", s.name()),
                        "the Endpoints are not to be mirrored",
                    );
                }
            }
            for s in &existing {
                match api.delete(&s.name(), &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(Action::Done);
        };
        let trigger = ep
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
            .cloned();
        let want = desired(ep);
        let changes = reconcile::plan_for(
            &writer(ep),
            &want,
            &existing,
            MAX_ENDPOINTS_PER_SLICE,
            trigger.as_deref(),
        );
        if ctx.recording() {
            ctx.observe(format!(
                "{}; {} mirrored slices",
                super::endpoints_summary(&want),
                existing.len()
            ));
            super::record_changes(
                &changes,
                want.values().map(|(_, eps)| eps.len()).sum(),
                MAX_ENDPOINTS_PER_SLICE,
            );
        }
        for s in &changes.create {
            api.create(&PostParams::default(), s).await?;
        }
        for s in &changes.update {
            let name = s.metadata.name.clone().unwrap_or_default();
            api.replace(&name, &PostParams::default(), s).await?;
        }
        for name in &changes.delete {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Action::Done)
    }
}

/// The EndpointSliceMirroring controller, reconciling an Endpoints object's key when it, its
/// Service or one of its mirrored slices changes.
pub fn controller(client: Client, informers: &SharedInformers) -> Controller {
    let reconciler = MirroringController {
        client,
        endpoints: informers.typed::<Endpoints>(Scope::all()).store(),
        services: informers.typed::<Service>(Scope::all()).store(),
        slices: informers.typed::<EndpointSlice>(Scope::all()).store(),
    };
    Controller::for_type::<Endpoints>(NAME, informers, None)
        .watches::<Service>(None, |svc: &Service| vec![ObjectKey::of(svc)])
        .watches::<EndpointSlice>(None, |slice: &EndpointSlice| {
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            match (service, slice.namespace()) {
                (Some(name), Some(ns)) if is_mirrored(slice, name) => {
                    vec![ObjectKey::new(Some(&ns), name)]
                }
                _ => Vec::new(),
            }
        })
        .build(Arc::new(reconciler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn endpoints(v: serde_json::Value) -> Endpoints {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn user_endpoints_of_selectorless_services_are_mirrored() {
        let ep = endpoints(json!({
            "metadata": {"name": "db", "namespace": "default", "uid": "ep-uid", "labels": {"team": "a"}},
            "subsets": [
                {"addresses": [{"ip": "192.0.2.1"}], "notReadyAddresses": [{"ip": "192.0.2.2"}],
                 "ports": [{"name": "sql", "port": 5432}]},
                {"addresses": [{"ip": "2001:db8::1"}], "ports": [{"port": 9}]}
            ]
        }));
        let d = desired(&ep);
        assert_eq!(d.len(), 1, "the IPv6-only subset has no IPv4 endpoint");
        let (ports, eps) = d.values().next().unwrap();
        assert_eq!(ports[0].port, Some(5432));
        let ready: Vec<(String, bool)> = eps
            .iter()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().unwrap().ready.unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ready,
            vec![("192.0.2.1".into(), true), ("192.0.2.2".into(), false)]
        );
        let w = writer(&ep);
        assert_eq!(w.labels[MANAGED_BY_LABEL], CONTROLLER_NAME);
        assert_eq!(w.labels[SERVICE_NAME_LABEL], "db");
        assert_eq!(w.labels["team"], "a");
        assert_eq!(
            (w.owner.kind.as_str(), w.owner.uid.as_str()),
            ("Endpoints", "ep-uid")
        );
        let changes = reconcile::plan_for(&w, &d, &Vec::<EndpointSlice>::new(), 1000, None);
        assert_eq!(changes.create.len(), 1);
        assert_eq!(
            changes.create[0].metadata.generate_name.as_deref(),
            Some("db-")
        );
    }

    #[test]
    fn only_selectorless_services_unskipped_endpoints_are_mirrored() {
        let ep = endpoints(json!({"metadata": {"name": "db"}}));
        let selectorless: Service = serde_json::from_value(
            json!({"metadata": {"name": "db"}, "spec": {"ports": [{"port": 1}]}}),
        )
        .unwrap();
        let selecting: Service = serde_json::from_value(
            json!({"metadata": {"name": "db"}, "spec": {"selector": {"app": "db"}}}),
        )
        .unwrap();
        assert!(should_mirror(&ep, Some(&selectorless)));
        assert!(!should_mirror(&ep, Some(&selecting)));
        assert!(!should_mirror(&ep, None));
        let skipped = endpoints(json!({"metadata": {"name": "db",
            "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}}}));
        assert!(!should_mirror(&skipped, Some(&selectorless)));
    }
}
