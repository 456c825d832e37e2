//! Which resource a client talks to, and the URLs that name it.

use std::any::TypeId;

/// Group, version, kind, plural and scope of a resource.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiResource {
    /// The API group, e.g. `apps`; empty for the core group.
    pub group: String,
    /// The API version within the group, e.g. `v1`.
    pub version: String,
    /// The object kind, e.g. `Deployment`.
    pub kind: String,
    /// The resource name in URLs, e.g. `deployments`.
    pub plural: String,
    /// Whether objects live in a namespace (`/namespaces/<ns>/<plural>`) rather than at cluster
    /// scope.
    pub namespaced: bool,
}

impl ApiResource {
    /// The resource of a k8s-openapi type (or a user type implementing its `Resource` trait).
    pub fn of<K: k8s_openapi::Resource>() -> Self
    where
        K::Scope: 'static,
    {
        ApiResource {
            group: K::GROUP.to_string(),
            version: K::VERSION.to_string(),
            kind: K::KIND.to_string(),
            plural: K::URL_PATH_SEGMENT.to_string(),
            namespaced: TypeId::of::<K::Scope>()
                == TypeId::of::<k8s_openapi::NamespaceResourceScope>(),
        }
    }

    /// A resource by its parts.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        ApiResource {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
        }
    }

    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        setpoint_api::resource::api_version(&self.group, &self.version)
    }

    /// The path of a collection (namespace `None` = all namespaces, or cluster-scoped).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace {
            Some(ns) if self.namespaced => format!("{base}/namespaces/{}/{}", enc(ns), self.plural),
            _ => format!("{base}/{}", self.plural),
        }
    }

    /// The path of one object, optionally a subresource.
    pub fn object_path(
        &self,
        namespace: Option<&str>,
        name: &str,
        subresource: Option<&str>,
    ) -> String {
        let mut p = format!("{}/{}", self.collection_path(namespace), enc(name));
        if let Some(s) = subresource {
            p.push('/');
            p.push_str(s);
        }
        p
    }
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
        .to_string()
        .replace("%2D", "-")
        .replace("%2E", ".")
        .replace("%5F", "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_for_typed_resources() {
        let d = ApiResource::of::<k8s_openapi::api::apps::v1::Deployment>();
        assert!(d.namespaced);
        assert_eq!(
            d.object_path(Some("demo"), "web", Some("scale")),
            "/apis/apps/v1/namespaces/demo/deployments/web/scale"
        );
        let n = ApiResource::of::<k8s_openapi::api::core::v1::Node>();
        assert!(!n.namespaced);
        assert_eq!(
            n.object_path(Some("ignored"), "n1", None),
            "/api/v1/nodes/n1"
        );
    }
}
