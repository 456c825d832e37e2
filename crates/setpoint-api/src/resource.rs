//! Group/version/kind and group/version/resource names.

use std::fmt;

/// A group and a resource (plural), e.g. `deployments.apps`; `pods` in the core group.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group, `""` for the core group (`v1`).
    pub group: String,
    /// The resource's lowercase plural name, as in URLs (`deployments`).
    pub resource: String,
}

impl fmt::Display for GroupResource {
    /// `deployments.apps`, or `pods` for the core group, as Kubernetes messages print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// A group, version and resource (plural).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupVersionResource {
    /// The API group, `""` for the core group.
    pub group: String,
    /// The API version within the group (`v1`, `v1beta1`).
    pub version: String,
    /// The resource's lowercase plural name, as in URLs (`deployments`).
    pub resource: String,
}

impl GroupVersionResource {
    /// The resource `resource` of `group` (`""` for core) at `version`.
    pub fn new(group: &str, version: &str, resource: &str) -> Self {
        GroupVersionResource {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
        }
    }
    /// The same resource without its version, as errors and messages name it.
    pub fn group_resource(&self) -> GroupResource {
        GroupResource {
            group: self.group.clone(),
            resource: self.resource.clone(),
        }
    }
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }
}

/// A group, version and kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupVersionKind {
    /// The API group, `""` for the core group.
    pub group: String,
    /// The API version within the group (`v1`, `v1beta1`).
    pub version: String,
    /// The kind, in CamelCase as objects' `kind` field names it (`Deployment`).
    pub kind: String,
}

impl GroupVersionKind {
    /// The kind `kind` of `group` (`""` for core) at `version`.
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        GroupVersionKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }
    }
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        api_version(&self.group, &self.version)
    }
    /// Splits an `apiVersion` string into group and version.
    pub fn from_api_version(api_version: &str, kind: &str) -> Self {
        let (g, v) = split_api_version(api_version);
        GroupVersionKind::new(g, v, kind)
    }
}

/// `group/version`, or `version` alone for the core group.
pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// Splits `apps/v1` into (`apps`, `v1`) and `v1` into (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}
