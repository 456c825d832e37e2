//! The resource registry: which group/version/resources are served, and how each behaves.
//!
//! Built-in resources come from [`setpoint_kinds::BUILTIN`]; custom resources will be added at
//! run time through the same [`ResourceDef`] shape, so every request goes through one generic
//! path whatever the kind.

use std::collections::HashMap;
use std::sync::Arc;

use setpoint_api::{GroupResource, GroupVersionKind, GroupVersionResource};

/// Everything the server needs to know about one served resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status: bool,
    pub scale: bool,
    pub generation: bool,
    /// Storage (group, plural): resources that share storage map to the same cache.
    pub storage_group: String,
    pub storage_plural: String,
    /// For custom resources: the schema, printer columns and storage version from the CRD.
    pub custom: Option<Arc<crate::crd::CustomResource>>,
}

impl ResourceDef {
    fn from_builtin(k: &setpoint_kinds::KindInfo) -> Self {
        let (sg, sp) = k.storage_resource();
        ResourceDef {
            group: k.group.into(),
            version: k.version.into(),
            kind: k.kind.into(),
            plural: k.plural.into(),
            singular: k.singular.into(),
            namespaced: k.namespaced,
            short_names: k.short_names.iter().map(|s| s.to_string()).collect(),
            categories: k.categories.iter().map(|s| s.to_string()).collect(),
            status: k.status,
            scale: k.scale,
            generation: k.generation,
            storage_group: sg.into(),
            storage_plural: sp.into(),
            custom: None,
        }
    }

    pub fn gvr(&self) -> GroupVersionResource {
        GroupVersionResource::new(&self.group, &self.version, &self.plural)
    }
    pub fn gvk(&self) -> GroupVersionKind {
        GroupVersionKind::new(&self.group, &self.version, &self.kind)
    }
    pub fn group_resource(&self) -> GroupResource {
        GroupResource {
            group: self.group.clone(),
            resource: self.plural.clone(),
        }
    }
    pub fn api_version(&self) -> String {
        setpoint_api::resource::api_version(&self.group, &self.version)
    }
    /// Whether this resource is stored in another resource's storage (and converted).
    pub fn is_converted(&self) -> bool {
        self.storage_group != self.group
            || self.storage_plural != self.plural
            || match &self.custom {
                Some(c) => c.storage_version != self.version,
                // A built-in served at two versions (autoscaling/v1 and v2 HPAs) is stored at
                // one.
                None => setpoint_kinds::storage_version(&self.group, &self.plural)
                    .is_some_and(|v| v != self.version),
            }
    }
    /// Whether stored objects change on the way out: converted resources, and custom
    /// resources whose schema has defaults (applied on read, so objects stored before a
    /// default was added show it), and every version of a custom resource with a conversion
    /// webhook (objects stored before the storage version changed are in another version).
    pub fn transformed_on_read(&self) -> bool {
        self.is_converted()
            || self
                .custom
                .as_ref()
                .is_some_and(|c| c.has_defaults || c.webhook.is_some())
    }
    /// The storage key prefix for all objects of this resource:
    /// `/registry/<group or "core">/<plural>/`.
    pub fn storage_prefix(&self) -> String {
        storage_prefix(&self.storage_group, &self.storage_plural)
    }
    /// The storage key prefix for one namespace (or all objects for cluster-scoped resources).
    pub fn namespace_prefix(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!("{}{}/", self.storage_prefix(), ns),
            _ => self.storage_prefix(),
        }
    }
    /// The storage key of one object.
    pub fn key(&self, namespace: &str, name: &str) -> String {
        if self.namespaced {
            format!("{}{}/{}", self.storage_prefix(), namespace, name)
        } else {
            format!("{}{}", self.storage_prefix(), name)
        }
    }
    /// Whether the resource is served only as `create` and never stored: a review, answered
    /// by [`crate::reviews`].
    pub fn is_create_only(&self) -> bool {
        self.custom.is_none()
            && setpoint_kinds::by_resource(&self.group, &self.version, &self.plural)
                .is_some_and(|k| k.create_only)
    }
    /// Verbs served on the main resource.
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.is_create_only() {
            return vec!["create"];
        }
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
    /// Subresources served, with the kind they answer with and their verbs.
    pub fn subresources(&self) -> Vec<Subresource> {
        let mut out = Vec::new();
        if self.status {
            out.push(Subresource {
                name: "status",
                group: self.group.clone(),
                version: self.version.clone(),
                kind: self.kind.clone(),
                verbs: &["get", "patch", "update"],
            });
        }
        if self.scale {
            out.push(Subresource {
                name: "scale",
                group: "autoscaling".into(),
                version: "v1".into(),
                kind: "Scale".into(),
                verbs: &["get", "patch", "update"],
            });
        }
        if self.group.is_empty() && self.plural == "pods" {
            out.push(Subresource {
                name: "binding",
                group: String::new(),
                version: "v1".into(),
                kind: "Binding".into(),
                verbs: &["create"],
            });
            out.push(Subresource {
                name: "eviction",
                group: "policy".into(),
                version: "v1".into(),
                kind: "Eviction".into(),
                verbs: &["create"],
            });
            out.push(Subresource {
                name: "log",
                group: String::new(),
                version: "v1".into(),
                kind: "Pod".into(),
                verbs: &["get"],
            });
        }
        if self.group.is_empty() && self.plural == "serviceaccounts" {
            out.push(Subresource {
                name: "token",
                group: "authentication.k8s.io".into(),
                version: "v1".into(),
                kind: "TokenRequest".into(),
                verbs: &["create"],
            });
        }
        if self.group.is_empty() && self.plural == "namespaces" {
            out.push(Subresource {
                name: "finalize",
                group: String::new(),
                version: "v1".into(),
                kind: "Namespace".into(),
                verbs: &["update"],
            });
        }
        out
    }
}

/// `/registry/<group or "core">/<plural>/`.
pub fn storage_prefix(group: &str, plural: &str) -> String {
    let g = if group.is_empty() { "core" } else { group };
    format!("/registry/{g}/{plural}/")
}

/// A subresource as discovery lists it.
#[derive(Clone, Debug)]
pub struct Subresource {
    pub name: &'static str,
    pub group: String,
    pub version: String,
    pub kind: String,
    pub verbs: &'static [&'static str],
}

/// The set of served resources.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// In discovery order.
    resources: Vec<Arc<ResourceDef>>,
    /// By plural, then the few (group, version) pairs that serve it: every request looks its
    /// resource up, and a map keyed by the plural alone is searched without building a key.
    by_plural: HashMap<String, Vec<Arc<ResourceDef>>>,
}

impl Registry {
    /// The registry of built-in resources.
    pub fn builtin() -> Self {
        let mut r = Registry::default();
        for k in setpoint_kinds::BUILTIN {
            r.add(ResourceDef::from_builtin(k));
        }
        r
    }

    /// Adds (or replaces) a resource.
    pub fn add(&mut self, def: ResourceDef) {
        let def = Arc::new(def);
        if let Some(pos) = self.resources.iter().position(|r| r.gvr() == def.gvr()) {
            self.resources[pos] = def.clone();
        } else {
            self.resources.push(def.clone());
        }
        let same_plural = self.by_plural.entry(def.plural.clone()).or_default();
        match same_plural
            .iter()
            .position(|r| r.group == def.group && r.version == def.version)
        {
            Some(pos) => same_plural[pos] = def,
            None => same_plural.push(def),
        }
    }

    /// Looks a resource up by group, version and plural.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<ResourceDef>> {
        self.by_plural
            .get(plural)?
            .iter()
            .find(|r| r.group == group && r.version == version)
    }

    /// Looks a resource up by group, version and kind.
    pub fn by_kind(&self, group: &str, version: &str, kind: &str) -> Option<&Arc<ResourceDef>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// The resources of one group version, in discovery order.
    pub fn of_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceDef>> {
        self.resources
            .iter()
            .filter(|r| r.group == group && r.version == version)
            .cloned()
            .collect()
    }

    /// All resources in discovery order.
    pub fn all(&self) -> &[Arc<ResourceDef>] {
        &self.resources
    }

    /// Groups in discovery order (core first as ""), each with its versions in preference order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in &self.resources {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version.clone());
                    }
                }
                None => out.push((r.group.clone(), vec![r.version.clone()])),
            }
        }
        out
    }

    /// The distinct storage prefixes, one per cache.
    pub fn storage_resources(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for r in &self.resources {
            let s = (r.storage_group.clone(), r.storage_plural.clone());
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_registry_layout() {
        let reg = Registry::builtin();
        let deploy = reg.get("apps", "v1", "deployments").unwrap();
        assert_eq!(
            deploy.key("demo", "web"),
            "/registry/apps/deployments/demo/web"
        );
        let ns = reg.get("", "v1", "namespaces").unwrap();
        assert_eq!(ns.key("", "demo"), "/registry/core/namespaces/demo");
        let ev = reg.get("events.k8s.io", "v1", "events").unwrap();
        assert_eq!(ev.storage_prefix(), "/registry/core/events/");
        assert!(ev.is_converted());
    }
}
