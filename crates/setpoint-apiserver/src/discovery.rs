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

/// `GET /apis`.
pub fn groups(server: &ApiServer) -> Value {
    let groups: Vec<Value> = server
        .registry()
        .groups()
        .iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(g, vs))
        .chain(metrics_served(server).then(metrics_group))
        .chain(
            crate::aggregator::remote_groups(server)
                .into_iter()
                .map(|(g, vs)| group_doc(&g, &vs.into_iter().map(|(v, _)| v).collect::<Vec<_>>())),
        )
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The resource metrics API's group, served by [`crate::resourcemetrics`], not stored.
fn metrics_group() -> Value {
    use crate::resourcemetrics::{GROUP, VERSION};
    group_doc(GROUP, &[VERSION.to_string()])
}

/// Whether Setpoint serves the resource metrics API itself (no APIService replaced it).
fn metrics_served(server: &ApiServer) -> bool {
    use crate::resourcemetrics::{GROUP, VERSION};
    !crate::aggregator::replaced(server, GROUP, VERSION)
}

/// `GET /apis/<group>`.
pub fn group(server: &ApiServer, name: &str) -> Option<Value> {
    let remote = crate::aggregator::remote_groups(server);
    if let Some((g, vs)) = remote.iter().find(|(g, _)| g == name) {
        let versions: Vec<String> = vs.iter().map(|(v, _)| v.clone()).collect();
        let mut doc = group_doc(g, &versions);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        return Some(doc);
    }
    if name == crate::resourcemetrics::GROUP {
        let mut doc = metrics_group();
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        return Some(doc);
    }
    let groups = server.registry().groups();
    let (g, vs) = groups.iter().find(|(g, _)| g == name && !g.is_empty())?;
    let mut doc = group_doc(g, vs);
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

/// The aggregated discovery document for `/api` (core) or `/apis` (everything else).
pub fn aggregated(server: &ApiServer, core: bool) -> Value {
    let mut items = Vec::new();
    for (g, versions) in server.registry().groups() {
        if g.is_empty() != core {
            continue;
        }
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| {
                let resources: Vec<Value> = server
                    .registry()
                    .of_group_version(&g, v)
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
                    .collect();
                json!({"version": v, "resources": resources, "freshness": "Current"})
            })
            .collect();
        items.push(json!({"metadata": {"name": g}, "versions": vs}));
    }
    if !core {
        for (group, versions) in crate::aggregator::remote_groups(server) {
            let vs: Vec<Value> = versions
                .iter()
                .map(|(v, list)| {
                    json!({"version": v, "freshness": "Current",
                    "resources": crate::aggregator::v2_resources(&group, v, list)})
                })
                .collect();
            items.push(json!({"metadata": {"name": group}, "versions": vs}));
        }
    }
    if !core && metrics_served(server) {
        use crate::resourcemetrics::{GROUP, RESOURCES, VERSION};
        let resources: Vec<Value> = RESOURCES
            .iter()
            .map(|(plural, kind, namespaced)| {
                json!({
                    "resource": plural, "singularResource": "",
                    "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                    "responseKind": {"group": GROUP, "version": VERSION, "kind": kind},
                    "verbs": ["get", "list"],
                })
            })
            .collect();
        items.push(json!({"metadata": {"name": GROUP},
            "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]}));
    }
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}
