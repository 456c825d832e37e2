//! Discovery: `/version`, the legacy documents (`/api`, `/apis`, `/apis/<g>`, `/api/v1`,
//! `/apis/<g>/<v>`) and the aggregated form (apidiscovery.k8s.io/v2) kubectl prefers.

use serde_json::{json, Value};

use crate::registry::ResourceDef;
use crate::state::ApiServer;

/// The Kubernetes version Setpoint implements. kubectl's version dispatcher picks its client
/// from `minor`, so this must say 32.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": format!("v1.32.0+setpoint.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": env!("SETPOINT_GIT_COMMIT"),
        "gitTreeState": "",
        "buildDate": env!("SETPOINT_BUILD_DATE"),
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
    })
}

/// `GET /api`.
pub fn core_versions(server: &ApiServer) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": *server.address.read()}],
    })
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": gvs.clone(), "preferredVersion": gvs[0].clone()})
}

/// Every group/version `/apis` lists (not the core group), once each: Setpoint's own, the
/// resource metrics API unless an APIService replaced it, and the service-backed ones.
fn served(server: &ApiServer, remote: &[RemoteGroup]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = vec![];
    let mut add = |g: &str, v: &str| {
        if !out.iter().any(|(og, ov)| og == g && ov == v) {
            out.push((g.to_string(), v.to_string()));
        }
    };
    for (g, versions) in server.registry().groups() {
        if !g.is_empty() {
            versions.iter().for_each(|v| add(&g, v));
        }
    }
    if metrics_served(server) {
        add(
            crate::resourcemetrics::GROUP,
            crate::resourcemetrics::VERSION,
        );
    }
    for (g, versions) in remote {
        versions.iter().for_each(|(v, _)| add(g, v));
    }
    out
}

/// A service-backed group: its versions with their servers' resource lists.
type RemoteGroup = (String, Vec<(String, Value)>);

/// `GET /apis`: groups in the aggregator's order (by their APIServices' priorities), each
/// group's preferred version first.
pub fn groups(server: &ApiServer) -> Value {
    let remote = crate::aggregator::remote_groups(server);
    let ranked = crate::aggregator::ranked(server, served(server, &remote));
    let groups: Vec<Value> = crate::aggregator::order::group_list(ranked)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Whether Setpoint serves the resource metrics API itself (no APIService replaced it).
fn metrics_served(server: &ApiServer) -> bool {
    use crate::resourcemetrics::{GROUP, VERSION};
    !crate::aggregator::replaced(server, GROUP, VERSION)
}

/// `GET /apis/<group>`: its versions in the order `/apis` lists them.
pub fn group(server: &ApiServer, name: &str) -> Option<Value> {
    if name.is_empty() {
        return None;
    }
    let remote = crate::aggregator::remote_groups(server);
    let served: Vec<(String, String)> = served(server, &remote)
        .into_iter()
        .filter(|(g, _)| g == name)
        .collect();
    let ranked = crate::aggregator::ranked(server, served);
    let (g, vs) = crate::aggregator::order::group_list(ranked)
        .into_iter()
        .next()?;
    let mut doc = group_doc(&g, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `GET /api/v1` or `GET /apis/<group>/<version>`.
pub fn resource_list(server: &ApiServer, group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    if (group, version)
        == (
            crate::resourcemetrics::GROUP,
            crate::resourcemetrics::VERSION,
        )
    {
        for (plural, kind, namespaced) in crate::resourcemetrics::RESOURCES {
            resources.push(json!({
                "name": plural, "singularName": "", "namespaced": namespaced, "kind": kind,
                "verbs": ["get", "list"],
            }));
        }
    }
    for r in &server.registry().of_group_version(group, version) {
        resources.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": r.verbs(), "shortNames": r.short_names, "categories": r.categories,
            "storageVersionHash": storage_version_hash(r),
        }));
        for s in r.subresources() {
            let mut e = json!({
                "name": format!("{}/{}", r.plural, s.name), "singularName": "", "namespaced": r.namespaced,
                "kind": s.kind, "verbs": s.verbs,
            });
            if s.group != r.group || s.version != r.version {
                e["group"] = json!(s.group);
                e["version"] = json!(s.version);
            }
            resources.push(e);
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": setpoint_api::resource::api_version(group, version),
        "resources": resources,
    }))
}

/// A short, stable hash of the storage identity, as Kubernetes publishes.
fn storage_version_hash(r: &ResourceDef) -> String {
    use base64::Engine;
    let mut h: u64 = 0xcbf29ce484222325;
    for b in format!("{}/{}/{}", r.storage_group, r.version, r.kind).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    base64::engine::general_purpose::STANDARD.encode(h.to_be_bytes())[..11].to_string()
}

/// A group/version's resources as aggregated discovery lists them.
fn local_resources(server: &ApiServer, group: &str, version: &str) -> Vec<Value> {
    server
        .registry()
        .of_group_version(group, version)
        .iter()
        .map(|r| {
            let subs: Vec<Value> = r
                .subresources()
                .iter()
                .map(|s| {
                    json!({"subresource": s.name,
                           "responseKind": {"group": s.group, "version": s.version, "kind": s.kind},
                           "verbs": s.verbs})
                })
                .collect();
            let mut e = json!({
                "resource": r.plural, "singularResource": r.singular,
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "verbs": r.verbs(),
            });
            if !r.short_names.is_empty() {
                e["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                e["categories"] = json!(r.categories);
            }
            if !subs.is_empty() {
                e["subresources"] = Value::Array(subs);
            }
            e
        })
        .collect()
}

/// The resource metrics API's resources as aggregated discovery lists them.
fn metrics_resources() -> Vec<Value> {
    use crate::resourcemetrics::{GROUP, RESOURCES, VERSION};
    RESOURCES
        .iter()
        .map(|(plural, kind, namespaced)| {
            json!({
                "resource": plural, "singularResource": "",
                "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                "responseKind": {"group": GROUP, "version": VERSION, "kind": kind},
                "verbs": ["get", "list"],
            })
        })
        .collect()
}

/// The aggregated discovery document for `/api` (core) or `/apis` (everything else, in the
/// aggregator's order of groups and versions).
pub fn aggregated(server: &ApiServer, core: bool) -> Value {
    let item =
        |g: &str, versions: Vec<Value>| json!({"metadata": {"name": g}, "versions": versions});
    let version_doc = |v: &str, resources: Vec<Value>| json!({"version": v, "resources": resources, "freshness": "Current"});
    let mut items = Vec::new();
    if core {
        for (g, versions) in server.registry().groups() {
            if g.is_empty() {
                let vs = versions
                    .iter()
                    .map(|v| version_doc(v, local_resources(server, &g, v)))
                    .collect();
                items.push(item(&g, vs));
            }
        }
    } else {
        let remote = crate::aggregator::remote_groups(server);
        let ranked = crate::aggregator::ranked(server, served(server, &remote));
        let metrics = (
            crate::resourcemetrics::GROUP,
            crate::resourcemetrics::VERSION,
        );
        for (g, versions) in crate::aggregator::order::aggregated(ranked) {
            let vs = versions
                .iter()
                .map(|v| {
                    let list = remote
                        .iter()
                        .filter(|(rg, _)| *rg == g)
                        .flat_map(|(_, vs)| vs)
                        .find(|(rv, _)| rv == v)
                        .map(|(_, list)| list);
                    let resources = match list {
                        Some(list) => crate::aggregator::v2_resources(&g, v, list),
                        None if (g.as_str(), v.as_str()) == metrics => metrics_resources(),
                        None => local_resources(server, &g, v),
                    };
                    version_doc(v, resources)
                })
                .collect();
            items.push(item(&g, vs));
        }
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}
