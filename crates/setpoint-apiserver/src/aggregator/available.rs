//! The availability controller: every APIService's `Available` condition, with upstream's
//! reasons and messages. A local one is always available (`Local`); a service-backed one
//! needs its Service, a port of it, ready endpoints on that port and an answer from its
//! server's discovery endpoint (`/apis/<group>/<version>`, asked as
//! `system:kube-aggregator` in `system:masters` through the front proxy), checked every
//! [`PROBE_INTERVAL`] and at once when its spec changes; while it waits on its Service, port
//! or Endpoints, every second. The resources that answer lists are kept for discovery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, Limited};
use serde_json::{json, Value};

use crate::authentication::UserInfo;
use crate::objects::WriteOptions;
use crate::state::ApiServer;
use crate::strategy::View;

/// How often a service-backed APIService is probed (upstream resyncs every 30 s and on every
/// change of the APIService, its Service or Endpoints; probing more often makes an outage show
/// sooner).
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long one discovery probe may take (upstream's insurance against slow dials).
const PROBE_TIMEOUT: Duration = Duration::from_secs(6);
/// Upstream tries this many probes at once and is satisfied by any one.
const ATTEMPTS: usize = 5;
/// The largest discovery document read from an extension server.
const MAX_DISCOVERY_BYTES: usize = 3 * 1024 * 1024;

/// One check's outcome: the condition's status, reason and message, and on success the
/// server's resource list.
#[derive(Debug, PartialEq)]
pub(crate) struct Check {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub resources: Option<Value>,
}

fn failed(status: &'static str, reason: &'static str, message: String) -> Check {
    Check {
        status,
        reason,
        message,
        resources: None,
    }
}

/// Checks an APIService as upstream's `sync` does.
pub(crate) async fn check(server: &ApiServer, api_service: &Value) -> Check {
    if super::is_local(api_service) {
        return failed(
            "True",
            "Local",
            "Local APIServices are always available".into(),
        );
    }
    let service = &api_service["spec"]["service"];
    let text = |k: &str| service.get(k).and_then(Value::as_str).unwrap_or("");
    let (namespace, name) = (text("namespace"), text("name"));
    let port = service.get("port").and_then(Value::as_i64).unwrap_or(443);
    let registry = server.registry();
    let def = |plural: &str| registry.get("", "v1", plural).map(|d| (**d).clone());
    let (Some(services), Some(endpoints)) = (def("services"), def("endpoints")) else {
        return failed(
            "Unknown",
            "ServiceAccessError",
            "services are not served".into(),
        );
    };
    let svc = match server.get_object(&services, namespace, name).await {
        Ok(svc) => svc,
        Err(e) if e.code == 404 => {
            return failed(
                "False",
                "ServiceNotFound",
                format!("service/{name} in {namespace:?} is not present"),
            )
        }
        Err(e) => {
            return failed(
                "Unknown",
                "ServiceAccessError",
                format!(
                    "service/{name} in {namespace:?} cannot be checked due to: {}",
                    e.message
                ),
            )
        }
    };
    let service_type = svc
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if service_type == "ClusterIP" {
        let port_name = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("port").and_then(Value::as_i64) == Some(port))
            .map(|p| p.get("name").and_then(Value::as_str).unwrap_or(""));
        let Some(port_name) = port_name else {
            return failed(
                "False",
                "ServicePortError",
                format!("service/{name} in {namespace:?} is not listening on port {port}"),
            );
        };
        let eps = match server.get_object(&endpoints, namespace, name).await {
            Ok(eps) => eps,
            Err(e) if e.code == 404 => {
                return failed(
                    "False",
                    "EndpointsNotFound",
                    format!("cannot find endpoints for service/{name} in {namespace:?}"),
                )
            }
            Err(e) => {
                return failed(
                    "Unknown",
                    "EndpointsAccessError",
                    format!(
                        "service/{name} in {namespace:?} cannot be checked due to: {}",
                        e.message
                    ),
                )
            }
        };
        if !has_active_endpoints(&eps, port_name) {
            return failed(
                "False",
                "MissingEndpoints",
                format!(
                    "endpoints for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
                ),
            );
        }
    }
    let probes = (0..ATTEMPTS).map(|_| probe(server, api_service));
    let results = futures::future::join_all(probes).await;
    let mut last_error = String::new();
    for result in results {
        match result {
            Ok(list) => {
                return Check {
                    status: "True",
                    reason: "Passed",
                    message: "all checks passed".into(),
                    resources: Some(list),
                }
            }
            Err(e) => last_error = e,
        }
    }
    failed("False", "FailedDiscoveryCheck", last_error)
}

/// Whether the APIService's last check stopped before its discovery probe, at its Service,
/// the Service's port or its Endpoints.
fn waits_on_the_service(api_service: &Value) -> bool {
    const BEFORE_THE_PROBE: &[&str] = &[
        "ServiceNotFound",
        "ServiceAccessError",
        "ServicePortError",
        "EndpointsNotFound",
        "EndpointsAccessError",
        "MissingEndpoints",
    ];
    api_service
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["type"] == "Available")
        .any(|c| BEFORE_THE_PROBE.contains(&c["reason"].as_str().unwrap_or("")))
}

/// Whether a subset has addresses and a port named `port_name`.
fn has_active_endpoints(endpoints: &Value, port_name: &str) -> bool {
    endpoints
        .get("subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|s| {
            s.get("addresses")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        })
        .any(|s| {
            s.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
        })
}

/// Asks the extension server for its group/version's resource list.
async fn probe(server: &ApiServer, api_service: &Value) -> Result<Value, String> {
    let backend = super::backend(server, api_service).await?;
    let path = format!(
        "/apis/{}/{}",
        super::spec_str(api_service, "group"),
        super::spec_str(api_service, "version")
    );
    let address = if backend.host.contains(':') {
        format!("[{}]:{}", backend.host, backend.port)
    } else {
        format!("{}:{}", backend.host, backend.port)
    };
    let url = format!("https://{address}{path}");
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::ACCEPT,
        "application/json".parse().expect("valid"),
    );
    // The system:masters identity ensures the check is always allowed.
    let user = UserInfo {
        username: "system:kube-aggregator".into(),
        uid: String::new(),
        groups: vec!["system:masters".into()],
        extra: Default::default(),
    };
    super::frontproxy::set_identity(&mut headers, &user);
    let (host, port) = (backend.host.clone(), backend.port);
    let to = crate::proxy::Destination {
        host: &host,
        port,
        tls: Some((backend.tls, backend.server_name)),
    };
    let exchange = async {
        let response =
            crate::proxy::forward(to, "", &path, None, &Method::GET, &headers, Body::empty())
                .await
                .map_err(|e| {
                    let reason = match e {
                        crate::proxy::ForwardError::Connect(e) => {
                            crate::webhook::client::dial_error(&host, port, &e)
                        }
                        crate::proxy::ForwardError::Timeout => {
                            format!("dial tcp {address}: i/o timeout")
                        }
                        crate::proxy::ForwardError::Exchange(e) => e,
                    };
                    format!("failing or missing response from {url}: Get {url:?}: {reason}")
                })?;
        let status = response.status();
        if !(200..300).contains(&status.as_u16()) {
            return Err(format!(
                "failing or missing response from {url}: bad status from {url}: {}",
                status.as_u16()
            ));
        }
        let body = Limited::new(response.into_body(), MAX_DISCOVERY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("failing or missing response from {url}: {e}"))?
            .to_bytes();
        Ok(serde_json::from_slice::<Value>(&body).unwrap_or(json!({"resources": []})))
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("timed out waiting for {url}")))
}

/// The APIService's status with `check`'s `Available` condition, or `None` when it already
/// says so. The transition time moves only when the status does.
pub(crate) fn updated_status(api_service: &Value, check: &Check, now: &str) -> Option<Value> {
    let conditions = api_service
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let old = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"));
    let same = |k: &str, v: &str| old.and_then(|c| c.get(k)).and_then(Value::as_str) == Some(v);
    if same("status", check.status)
        && same("reason", check.reason)
        && same("message", &check.message)
    {
        return None;
    }
    let transition = match old {
        Some(c) if same("status", check.status) => c
            .get("lastTransitionTime")
            .cloned()
            .unwrap_or_else(|| json!(now)),
        _ => json!(now),
    };
    let condition = json!({"type": "Available", "status": check.status,
        "lastTransitionTime": transition, "reason": check.reason, "message": check.message});
    let mut others: Vec<Value> = conditions
        .into_iter()
        .filter(|c| c.get("type").and_then(Value::as_str) != Some("Available"))
        .collect();
    others.insert(0, condition);
    Some(json!({"conditions": others}))
}

/// Writes `check` into the APIService's status unless it already says so (a conflict is left
/// to the next round, which reads the newer object).
async fn record(server: &ApiServer, api_service: &Value, check: &Check) {
    let Some(status) = updated_status(api_service, check, &setpoint_api::time::now_rfc3339())
    else {
        return;
    };
    let Some(def) = super::api_services_def(server) else {
        return;
    };
    let mut obj = api_service.clone();
    obj["status"] = status;
    let name = setpoint_api::meta::name(api_service).to_string();
    if let Err(e) = server
        .update(&def, "", &name, View::Status, obj, &WriteOptions::default())
        .await
    {
        if e.code != 409 && e.code != 404 {
            tracing::warn!(apiservice = %name, error = %e.message, "updating an APIService's status");
        }
    }
}

/// Registers local APIServices when the served set changes and keeps every APIService's
/// condition, until the server stops.
pub(crate) async fn controller(server: Arc<ApiServer>) {
    let mut stopping = server.stopping_signal();
    let mut registry = server.registry();
    super::autoregister::sync(&server).await;
    // The spec each service-backed APIService was last probed with, and when.
    let mut probed: HashMap<String, (Value, Instant)> = HashMap::new();
    let mut published: Option<Value> = None;
    loop {
        let config_map = server.aggregator.authentication_config_map();
        if config_map.is_some() && config_map != published {
            match super::publish(&server, config_map.clone().expect("checked")).await {
                Ok(()) => published = config_map,
                Err(e) => {
                    tracing::warn!(error = %e.message, "publishing kube-system/extension-apiserver-authentication")
                }
            }
        }
        let current = server.registry();
        if !Arc::ptr_eq(&current, &registry) {
            registry = current;
            super::autoregister::sync(&server).await;
        }
        let all = super::api_services(&server);
        // Known to requests and discovery before any status says it is available.
        let remote: Vec<String> = all
            .iter()
            .filter(|a| !super::is_local(a))
            .map(|a| setpoint_api::meta::name(a).to_string())
            .collect();
        *server.aggregator.remote.write() = Arc::new(remote);
        let mut due = vec![];
        for a in &all {
            let name = setpoint_api::meta::name(a).to_string();
            if super::is_local(a) {
                probed.remove(&name);
                server.aggregator.resources.write().remove(&name);
                if super::available_status(a) != "True" {
                    record(&server, a, &check(&server, a).await).await;
                }
                continue;
            }
            // Waiting on its Service or Endpoints costs only reads, so it is checked every tick
            // (upstream reacts to their changes); a discovery probe every PROBE_INTERVAL.
            let interval = if waits_on_the_service(a) {
                super::TICK
            } else {
                PROBE_INTERVAL
            };
            let fresh = probed
                .get(&name)
                .is_some_and(|(spec, at)| *spec == a["spec"] && at.elapsed() < interval);
            if !fresh {
                probed.insert(name, (a["spec"].clone(), Instant::now()));
                due.push(a);
            }
        }
        let server_ref: &ApiServer = &server;
        let checks = futures::future::join_all(due.iter().map(|a| {
            let a: &Value = a;
            async move { (a, check(server_ref, a).await) }
        }))
        .await;
        for (a, c) in checks {
            let name = setpoint_api::meta::name(a).to_string();
            if let Some(list) = &c.resources {
                server
                    .aggregator
                    .resources
                    .write()
                    .insert(name, list.clone());
            }
            record(&server, a, &c).await;
        }
        let names: Vec<&str> = all.iter().map(setpoint_api::meta::name).collect();
        probed.retain(|n, _| names.contains(&n.as_str()));
        server
            .aggregator
            .resources
            .write()
            .retain(|n, _| names.contains(&n.as_str()));
        tokio::select! {
            _ = tokio::time::sleep(super::TICK) => {}
            _ = stopping.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_of(status: &'static str, reason: &'static str) -> Check {
        failed(status, reason, "m".into())
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let a = json!({"status": {"conditions": [{"type": "Available", "status": "False",
            "reason": "MissingEndpoints", "message": "m", "lastTransitionTime": "T0"}]}});
        assert_eq!(
            updated_status(&a, &check_of("False", "MissingEndpoints"), "T1"),
            None
        );
        let s = updated_status(&a, &check_of("False", "FailedDiscoveryCheck"), "T1").unwrap();
        assert_eq!(s["conditions"][0]["lastTransitionTime"], "T0");
        let s = updated_status(&a, &check_of("True", "Passed"), "T2").unwrap();
        assert_eq!(s["conditions"][0]["lastTransitionTime"], "T2");
        assert_eq!(s["conditions"][0]["reason"], "Passed");
    }

    #[test]
    fn endpoints_count_only_with_addresses_on_the_port_name() {
        let eps = json!({"subsets": [
            {"addresses": [], "ports": [{"name": "https", "port": 1}]},
            {"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "other", "port": 2}]}]});
        assert!(!has_active_endpoints(&eps, "https"));
        assert!(has_active_endpoints(&eps, "other"));
        assert!(!has_active_endpoints(&json!({}), ""));
    }
}
