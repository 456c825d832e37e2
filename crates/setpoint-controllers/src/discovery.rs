//! Which resources the server serves, read from its discovery documents (`/api/v1`,
//! `/apis` and `/apis/<group>/<version>`) through the client's raw request API.

use bytes::Bytes;
use serde_json::Value;
use setpoint_runtime::client::{ApiResource, Client};

use crate::Error;

/// A served resource and the verbs the server allows on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedResource {
    /// The resource's group, version, kind, plural and scope.
    pub resource: ApiResource,
    /// The discovery document's `verbs`, e.g. `list`, `watch`, `deletecollection`.
    pub verbs: Vec<String>,
}

impl ServedResource {
    /// Whether the server allows `verb` on this resource.
    pub fn supports(&self, verb: &str) -> bool {
        self.verbs.iter().any(|v| v == verb)
    }

    /// `plural` for the core group, `plural.group` otherwise (how kubectl names resources).
    pub fn id(&self) -> String {
        resource_id(&self.resource)
    }
}

/// `plural` for the core group, `plural.group` otherwise.
pub fn resource_id(r: &ApiResource) -> String {
    if r.group.is_empty() {
        r.plural.clone()
    } else {
        format!("{}.{}", r.plural, r.group)
    }
}

async fn get(client: &Client, path: &str) -> Result<Value, Error> {
    Ok(client
        .request(http::Method::GET, path, None, Bytes::new())
        .await?)
}

/// Parses one `APIResourceList` (the answer of `/api/v1` or `/apis/<g>/<v>`); subresources
/// (`pods/status`) are left out.
pub fn parse_resource_list(group: &str, version: &str, doc: &Value) -> Vec<ServedResource> {
    doc.get("resources")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let plural = r.get("name")?.as_str()?;
            if plural.contains('/') {
                return None;
            }
            Some(ServedResource {
                resource: ApiResource::new(
                    group,
                    version,
                    r.get("kind")?.as_str()?,
                    plural,
                    r.get("namespaced")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                ),
                verbs: r
                    .get("verbs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect(),
            })
        })
        .collect()
}

/// Every resource the server serves, in the core group and each group's preferred version
/// (one version per group, so that the same objects are not seen twice).
pub async fn served_resources(client: &Client) -> Result<Vec<ServedResource>, Error> {
    let mut out = parse_resource_list("", "v1", &get(client, "/api/v1").await?);
    let groups = get(client, "/apis").await?;
    let groups = groups
        .get("groups")
        .and_then(Value::as_array)
        .ok_or_else(|| Error::Discovery {
            path: "/apis".into(),
            message: "no groups".into(),
        })?;
    for g in groups {
        let Some(name) = g.get("name").and_then(Value::as_str) else {
            continue;
        };
        let Some(version) = g
            .pointer("/preferredVersion/version")
            .and_then(Value::as_str)
            .or_else(|| g.pointer("/versions/0/version").and_then(Value::as_str))
        else {
            continue;
        };
        let path = format!("/apis/{name}/{version}");
        match get(client, &path).await {
            Ok(doc) => out.extend(parse_resource_list(name, version, &doc)),
            // An aggregated or half-installed group must not stop the others from being
            // handled; the next discovery will try it again.
            Err(e) => tracing::warn!(%path, error = %e, "discovery failed for a group"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_skip_subresources() {
        let doc = serde_json::json!({"resources": [
            {"name": "pods", "kind": "Pod", "namespaced": true, "verbs": ["list", "delete"]},
            {"name": "pods/status", "kind": "Pod", "namespaced": true, "verbs": ["get"]},
            {"name": "nodes", "kind": "Node", "namespaced": false, "verbs": ["list"]}
        ]});
        let got = parse_resource_list("", "v1", &doc);
        assert_eq!(got.len(), 2);
        assert!(got[0].resource.namespaced && got[0].supports("delete"));
        assert_eq!(got[0].id(), "pods");
        assert!(!got[1].resource.namespaced);
        let apps = parse_resource_list(
            "apps",
            "v1",
            &serde_json::json!({"resources": [{"name": "deployments", "kind": "Deployment", "namespaced": true, "verbs": []}]}),
        );
        assert_eq!(apps[0].id(), "deployments.apps");
    }
}
