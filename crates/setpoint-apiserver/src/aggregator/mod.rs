//! The aggregation layer (kube-aggregator's job): `apiregistration.k8s.io/v1` APIServices
//! say which server serves a group/version. Setpoint's own group/versions are registered as
//! local APIServices (no `spec.service`) at start, as upstream's autoregister controller does
//! ([`autoregister`]); an APIService pointing at a Service has `/apis/<group>/<version>[/…]`
//! relayed to one of the Service's ready endpoints over TLS verified by its `caBundle`, with
//! the caller's identity in `X-Remote-*` headers and the front-proxy client certificate
//! ([`frontproxy`]). The availability controller ([`available`]) checks every APIService and
//! keeps its `Available` condition, and keeps each extension server's resource list, which
//! discovery merges into `/apis` and the aggregated discovery document.
//!
//! A request is authenticated and authorized by Setpoint before it is relayed. A request that
//! asks to switch protocols (an extension server's `exec`-like stream, a WebSocket) is relayed
//! with its upgrade headers, and once the extension server answers 101 the two connections are
//! spliced ([`crate::proxy::forward_upgrade`]). The core group is never relayed (`v1.` is
//! always local).

pub(crate) mod autoregister;
pub(crate) mod available;
pub(crate) mod frontproxy;
pub(crate) mod order;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{json, Value};

use crate::authentication::UserInfo;
use crate::registry::ResourceDef;
use crate::response::text_response;
use crate::state::ApiServer;
use crate::watchcache::Filter;

use self::frontproxy::FrontProxy;

/// The APIService group.
pub(crate) const GROUP: &str = "apiregistration.k8s.io";

/// How often the availability controller looks at the APIServices (registering new local
/// group/versions, marking local ones available, probing a changed one at once).
const TICK: Duration = Duration::from_secs(1);

/// What the aggregation layer keeps between requests.
#[derive(Default)]
pub(crate) struct Aggregator {
    /// The client identity towards extension servers, once loaded.
    front_proxy: parking_lot::RwLock<Option<Arc<FrontProxy>>>,
    /// Each service-backed APIService's resources, as its server's discovery last listed them
    /// (an `APIResourceList`), by APIService name.
    resources: parking_lot::RwLock<BTreeMap<String, Value>>,
    /// The CA client certificates are verified against, when serving HTTPS.
    client_ca: parking_lot::RwLock<Option<String>>,
    /// The names of the service-backed APIServices, as the controller last listed them: what
    /// requests and discovery look at first, so that the common case (none) costs a lock.
    remote: parking_lot::RwLock<Arc<Vec<String>>>,
}

/// The `apiservices` resource.
fn api_services_def(server: &ApiServer) -> Option<Arc<ResourceDef>> {
    server.registry().get(GROUP, "v1", "apiservices").cloned()
}

/// Every APIService, from the watch cache, by name.
pub(crate) fn api_services(server: &ApiServer) -> Vec<Value> {
    let Some(def) = api_services_def(server) else {
        return vec![];
    };
    let cache = server.caches.get(&def.storage_prefix());
    let (cached, _) = cache.list(&def.namespace_prefix(None), &Filter::all());
    let mut all: Vec<Value> = cached.iter().map(|o| o.object()).collect();
    all.sort_by(|a, b| setpoint_api::meta::name(a).cmp(setpoint_api::meta::name(b)));
    all
}

/// The APIService `name` from the watch cache.
fn cached(server: &ApiServer, name: &str) -> Option<Value> {
    let def = api_services_def(server)?;
    server
        .caches
        .get(&def.storage_prefix())
        .get(&def.key("", name))
        .map(|o| o.object())
}

/// Whether Setpoint itself serves the APIService's group/version.
pub(crate) fn is_local(api_service: &Value) -> bool {
    api_service
        .pointer("/spec/service")
        .is_none_or(Value::is_null)
}

/// The status of the APIService's `Available` condition (`""` without one).
fn available_status(api_service: &Value) -> &str {
    api_service
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Available"))
        .and_then(|c| c.get("status").and_then(Value::as_str))
        .unwrap_or("")
}

/// A spec string field.
fn spec_str<'a>(api_service: &'a Value, key: &str) -> &'a str {
    api_service
        .pointer(&format!("/spec/{key}"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The service-backed APIService named `name`, if the controller has seen it.
fn remote(server: &ApiServer, name: &str) -> Option<Value> {
    let known = server.aggregator.remote.read().clone();
    if !known.iter().any(|n| n == name) {
        return None;
    }
    cached(server, name).filter(|a| !is_local(a))
}

/// The service-backed APIService serving the group/version `path` names (`/apis/<g>/<v>…`),
/// if any: such requests are relayed instead of served.
pub(crate) fn proxied(server: &ApiServer, path: &str) -> Option<Value> {
    let mut segments = path.strip_prefix("/apis/")?.split('/');
    let (group, version) = (segments.next()?, segments.next()?);
    if group.is_empty() || version.is_empty() {
        return None;
    }
    remote(server, &format!("{version}.{group}"))
}

/// Whether a service-backed APIService replaces Setpoint's own `group`/`version`.
pub(crate) fn replaced(server: &ApiServer, group: &str, version: &str) -> bool {
    remote(server, &format!("{version}.{group}")).is_some()
}

/// The TLS settings and the endpoint to reach `api_service`'s server at, with the name its
/// certificate must hold (`<service>.<namespace>.svc`, as upstream's resolver gives it).
pub(crate) struct Backend {
    pub host: String,
    pub port: u16,
    pub tls: Arc<rustls::ClientConfig>,
    pub server_name: String,
}

/// Resolves `api_service`'s Service to a ready endpoint (its Endpoints, as `services/proxy`
/// resolves one) and builds the client TLS towards it.
pub(crate) async fn backend(server: &ApiServer, api_service: &Value) -> Result<Backend, String> {
    let service = api_service
        .pointer("/spec/service")
        .ok_or("local APIService")?;
    let text = |k: &str| service.get(k).and_then(Value::as_str).unwrap_or("");
    let (namespace, name) = (text("namespace"), text("name"));
    let port = service.get("port").and_then(Value::as_i64).unwrap_or(443);
    let registry = server.registry();
    let def = |plural: &str| registry.get("", "v1", plural).map(|d| (**d).clone());
    let (Some(services), Some(endpoints)) = (def("services"), def("endpoints")) else {
        return Err("services are not served".into());
    };
    let svc = server
        .get_object(&services, namespace, name)
        .await
        .map_err(|e| e.message)?;
    let eps = server.get_object(&endpoints, namespace, name).await.ok();
    let target =
        crate::proxy::service_target(&svc, eps.as_ref(), "https", &port.to_string(), |n| {
            rand::random::<u32>() as usize % n
        })
        .map_err(|e| e.message)?;
    let front_proxy = server
        .aggregator
        .front_proxy
        .read()
        .clone()
        .ok_or("the front-proxy client certificate is not loaded yet")?;
    let insecure = api_service
        .pointer("/spec/insecureSkipTLSVerify")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tls = front_proxy.client_config(spec_str(api_service, "caBundle"), insecure)?;
    Ok(Backend {
        host: target.host,
        port: target.port,
        tls,
        server_name: format!("{name}.{namespace}.svc"),
    })
}

/// Relays a request for a service-backed APIService's group/version to its server, as
/// `user`; an upgrade request (`client_upgrade`, the caller's connection once switched) is
/// spliced to the server's once it agrees. Unavailable APIServices and unresolvable Services
/// answer 503 `service unavailable`, as kube-aggregator's proxy does.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn proxy(
    server: &ApiServer,
    api_service: &Value,
    user: &UserInfo,
    method: &Method,
    path: &str,
    raw_query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Response {
    let unavailable = || text_response(StatusCode::SERVICE_UNAVAILABLE, "service unavailable\n");
    if available_status(api_service) != "True" {
        return unavailable();
    }
    let backend = match backend(server, api_service).await {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(apiservice = setpoint_api::meta::name(api_service), error = %e, "cannot reach the extension server");
            return unavailable();
        }
    };
    let mut headers = headers.clone();
    frontproxy::set_identity(&mut headers, user);
    let to = crate::proxy::Destination {
        host: &backend.host,
        port: backend.port,
        tls: Some((backend.tls, backend.server_name)),
    };
    let relayed = match client_upgrade.filter(|_| crate::podstream::is_upgrade(&headers)) {
        Some(client) => {
            crate::proxy::forward_upgrade(to, path, raw_query, method, &headers, body, client).await
        }
        None => crate::proxy::forward(to, "", path, raw_query, method, &headers, body).await,
    };
    match relayed {
        Ok(response) => response,
        Err(e) => {
            tracing::warn!(apiservice = setpoint_api::meta::name(api_service), error = %e, "relaying to the extension server");
            text_response(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("error trying to reach service: {e}\n"),
            )
        }
    }
}

/// The group/versions service-backed APIServices serve, with the resources their servers
/// listed: `(group, [(version, APIResourceList)])`, groups and versions by name.
pub(crate) fn remote_groups(server: &ApiServer) -> Vec<(String, Vec<(String, Value)>)> {
    let names = server.aggregator.remote.read().clone();
    let remotes: Vec<Value> = names.iter().filter_map(|n| remote(server, n)).collect();
    let resources = server.aggregator.resources.read();
    let mut out: Vec<(String, Vec<(String, Value)>)> = vec![];
    for a in &remotes {
        let (group, version) = (spec_str(a, "group"), spec_str(a, "version"));
        if group.is_empty() {
            continue;
        }
        let list = resources
            .get(setpoint_api::meta::name(a))
            .cloned()
            .unwrap_or_else(|| json!({"resources": []}));
        match out.iter_mut().find(|(g, _)| g == group) {
            Some((_, versions)) => versions.push((version.to_string(), list)),
            None => out.push((group.to_string(), vec![(version.to_string(), list)])),
        }
    }
    out
}

/// `served` (group/versions) with the priorities of their APIServices, which order discovery
/// ([`order`]); a group/version without an APIService yet (before the first registration)
/// has the priorities its local APIService will get.
pub(crate) fn ranked(server: &ApiServer, served: Vec<(String, String)>) -> Vec<order::Ranked> {
    // Parsed once per change of the APIServices: every discovery request reads them.
    let api_services = api_services_def(server)
        .map(|def| {
            let cache = server.caches.get(&def.storage_prefix());
            cache.parsed(&def.namespace_prefix(None))
        })
        .unwrap_or_default();
    let by_name: BTreeMap<&str, &Value> = api_services
        .iter()
        .map(|a| (setpoint_api::meta::name(a), a))
        .collect();
    served
        .into_iter()
        .map(|(group, version)| {
            let (default_group, default_version) = autoregister::priority(&group, &version);
            let spec = by_name
                .get(format!("{version}.{group}").as_str())
                .and_then(|a| a.get("spec"));
            let number = |key: &str, default: i64| {
                spec.and_then(|s| s.get(key))
                    .and_then(Value::as_i64)
                    .unwrap_or(default)
            };
            order::Ranked {
                group_priority: number("groupPriorityMinimum", default_group),
                version_priority: number("versionPriority", default_version),
                group,
                version,
            }
        })
        .collect()
}

/// An extension server's `APIResourceList` entries as aggregated discovery (v2) resources:
/// subresources (`<plural>/<sub>`) under their resource.
pub(crate) fn v2_resources(group: &str, version: &str, list: &Value) -> Vec<Value> {
    let entries = list
        .get("resources")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let text = |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out: Vec<Value> = vec![];
    for e in entries {
        let name = text(e, "name");
        let kind = json!({"group": e.get("group").and_then(Value::as_str).unwrap_or(group),
                          "version": e.get("version").and_then(Value::as_str).unwrap_or(version),
                          "kind": text(e, "kind")});
        let verbs = e.get("verbs").cloned().unwrap_or(json!([]));
        if let Some((parent, sub)) = name.split_once('/') {
            if let Some(r) = out.iter_mut().find(|r| r["resource"] == parent) {
                let subs = r
                    .as_object_mut()
                    .expect("an object")
                    .entry("subresources")
                    .or_insert(json!([]));
                if let Some(subs) = subs.as_array_mut() {
                    subs.push(json!({"subresource": sub, "responseKind": kind, "verbs": verbs}));
                }
            }
            continue;
        }
        let namespaced = e
            .get("namespaced")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut r = json!({
            "resource": name, "singularResource": text(e, "singularName"),
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "responseKind": kind, "verbs": verbs,
        });
        for key in ["shortNames", "categories"] {
            if let Some(v) = e
                .get(key)
                .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            {
                r[key] = v.clone();
            }
        }
        out.push(r);
    }
    out
}

/// Runs the aggregation layer's background work until the server stops: loads the front-proxy
/// identity, then registers the local APIServices and runs the availability controller, which
/// also keeps `kube-system/extension-apiserver-authentication` published.
pub(crate) async fn run(server: Arc<ApiServer>) {
    match FrontProxy::load_or_create(server.config.data_dir.as_deref()) {
        Ok(fp) => *server.aggregator.front_proxy.write() = Some(Arc::new(fp)),
        Err(e) => {
            tracing::error!(error = %e, "the front-proxy certificates: requests for service-backed APIServices will answer 503");
        }
    }
    available::controller(server).await;
}

impl Aggregator {
    /// Sets the CA client certificates are verified against (when serving HTTPS), which the
    /// authentication ConfigMap publishes as `client-ca-file`.
    pub(crate) fn set_client_ca(&self, ca_pem: String) {
        *self.client_ca.write() = Some(ca_pem);
    }

    /// The authentication ConfigMap as it should be, once the front-proxy identity is loaded.
    fn authentication_config_map(&self) -> Option<Value> {
        let fp = self.front_proxy.read().clone()?;
        let client_ca = self.client_ca.read().clone();
        Some(frontproxy::authentication_config_map(
            client_ca.as_deref(),
            &fp.ca_pem,
        ))
    }
}

/// Creates or replaces the ConfigMap's data.
pub(crate) async fn publish(
    server: &ApiServer,
    config_map: Value,
) -> Result<(), setpoint_api::ApiError> {
    use crate::objects::WriteOptions;
    let def = server
        .registry()
        .get("", "v1", "configmaps")
        .map(|d| (**d).clone())
        .expect("built in");
    let name = "extension-apiserver-authentication";
    match server
        .create(
            &def,
            "kube-system",
            config_map.clone(),
            &WriteOptions::default(),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.reason == "AlreadyExists" => {
            let mut current = server.get_object(&def, "kube-system", name).await?;
            if current.get("data") == config_map.get("data") {
                return Ok(());
            }
            current["data"] = config_map["data"].clone();
            server
                .update(
                    &def,
                    "kube-system",
                    name,
                    crate::strategy::View::Main,
                    current,
                    &WriteOptions::default(),
                )
                .await
                .map(|_| ())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_become_v2_resources_with_their_subresources() {
        let list = json!({"resources": [
            {"name": "flunders", "singularName": "flunder", "namespaced": true, "kind": "Flunder",
             "verbs": ["get", "list"], "shortNames": ["fl"]},
            {"name": "flunders/status", "namespaced": true, "kind": "Flunder", "verbs": ["get"]},
            {"name": "fischers", "namespaced": false, "kind": "Fischer", "verbs": ["list"]}]});
        let v2 = v2_resources("wardle.example.com", "v1alpha1", &list);
        assert_eq!(v2.len(), 2);
        assert_eq!(v2[0]["scope"], "Namespaced");
        assert_eq!(v2[0]["shortNames"], json!(["fl"]));
        assert_eq!(v2[0]["subresources"][0]["subresource"], "status");
        assert_eq!(v2[0]["responseKind"]["group"], "wardle.example.com");
        assert_eq!(v2[1]["scope"], "Cluster");
        assert!(v2[1].get("shortNames").is_none());
    }

    #[test]
    fn local_means_no_service() {
        assert!(is_local(&json!({"spec": {"group": "apps"}})));
        assert!(is_local(&json!({"spec": {"service": null}})));
        assert!(!is_local(
            &json!({"spec": {"service": {"namespace": "a", "name": "b"}}})
        ));
    }
}
