//! What a caller may do: the request's attributes (verb, resource, namespace, name, or the
//! path of a non-resource request), the authorizers asked in order, and the 403 that names
//! what was refused, word for word as kube-apiserver writes it.
//!
//! The first authorizer with an opinion decides; without one the request is refused. Members
//! of `system:masters` may do anything, as upstream's privileged-group check lets them; the
//! server then asks [`rbac`], whose bootstrap policy ([`bootstrap`]) lets anyone read the
//! health endpoints and the version, and authenticated users read discovery.

pub mod bootstrap;
pub mod escalation;
pub mod node;
pub mod rbac;

use std::sync::Arc;

use http::Method;
use setpoint_api::{ApiError, GroupResource};

use crate::authentication::{UserInfo, MASTERS};
use crate::request::{bool_param, PathTarget, Query};

/// What a request asks to do, as authorizers see it (`authorizer.Attributes` upstream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: Arc<UserInfo>,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection` (or
    /// a special verb such as `impersonate`, `bind`, `escalate`); the HTTP method, lower case,
    /// for non-resource requests.
    pub verb: String,
    /// Whether the request names a resource (else it names a path).
    pub resource_request: bool,
    /// The API group (`""` for the core group).
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource, if any (`status`, `log`, `token`).
    pub subresource: String,
    /// The namespace, `""` for cluster-scoped requests and requests across all namespaces.
    pub namespace: String,
    /// The object's name, `""` for collection requests.
    pub name: String,
    /// The request path.
    pub path: String,
}

impl Attributes {
    /// The attributes of a non-resource request (`/healthz`, `/api`, `/metrics`).
    pub fn non_resource(user: Arc<UserInfo>, method: &Method, path: &str) -> Attributes {
        Attributes::verb_on_path(user, &method.as_str().to_ascii_lowercase(), path)
    }

    /// The attributes of `verb` on the non-resource `path`, every other attribute empty: a
    /// check that names a resource starts from these (with an empty path) and fills it in.
    pub fn verb_on_path(user: Arc<UserInfo>, verb: &str, path: &str) -> Attributes {
        Attributes {
            user,
            verb: verb.to_string(),
            resource_request: false,
            api_group: String::new(),
            api_version: String::new(),
            resource: String::new(),
            subresource: String::new(),
            namespace: String::new(),
            name: String::new(),
            path: path.to_string(),
        }
    }

    /// The attributes of an API request: discovery paths are non-resource requests, the rest
    /// name the resource, with the verb kube-apiserver derives from the method (a GET of a
    /// collection is `list`, or `watch` with `watch=true`; a DELETE of one is
    /// `deletecollection`).
    pub fn for_request(
        user: Arc<UserInfo>,
        method: &Method,
        path: &str,
        target: &PathTarget,
        q: &Query,
    ) -> Attributes {
        let mut a = Attributes::non_resource(user, method, path);
        let (group, version, plural, namespace, name, subresource, collection) = match target {
            PathTarget::Collection {
                group,
                version,
                plural,
                namespace,
            } => (group, version, plural, namespace, None, None, true),
            PathTarget::Object {
                group,
                version,
                plural,
                namespace,
                name,
                subresource,
            } => (
                group,
                version,
                plural,
                namespace,
                Some(name),
                subresource.as_ref(),
                false,
            ),
            _ => {
                a.verb = non_resource_verb(method).to_string();
                return a;
            }
        };
        let watch = bool_param(q, "watch");
        a.verb = match (method, collection) {
            (&Method::GET, true) if watch => "watch",
            (&Method::GET, true) => "list",
            (&Method::GET, false) if watch => "watch",
            (&Method::GET, false) => "get",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, true) => "deletecollection",
            (&Method::DELETE, false) => "delete",
            _ => non_resource_verb(method),
        }
        .to_string();
        a.resource_request = true;
        a.api_group = group.clone();
        a.api_version = version.clone();
        a.resource = plural.clone();
        a.namespace = namespace.clone().unwrap_or_default();
        a.name = name.cloned().unwrap_or_default();
        a.subresource = subresource.cloned().unwrap_or_default();
        if matches!(a.verb.as_str(), "list" | "watch") && collection {
            a.name = selected_name(q).unwrap_or_default();
        }
        // `/api/v1/namespaces/<name>` is the namespace itself: upstream's request info puts
        // its name in the namespace too, so namespaced roles can grant reading it.
        if a.api_group.is_empty() && a.resource == "namespaces" && !a.name.is_empty() {
            a.namespace = a.name.clone();
        }
        a
    }
}

/// The name a list or watch is narrowed to by a `metadata.name=<name>` term of its field
/// selector, as upstream's request info reads it, so an authorizer can allow reading one
/// object through a list or watch (the node agent's per-object watches). A selector that
/// does not parse, or a name that could not be a path segment, names nothing.
fn selected_name(q: &Query) -> Option<String> {
    let selector = q.get("fieldSelector").filter(|s| !s.is_empty())?;
    let selector = setpoint_api::selector::FieldSelector::parse(selector).ok()?;
    let name = selector.exact_match("metadata.name")?;
    setpoint_api::names::path_segment_name(name).ok()?;
    Some(name.to_string())
}

/// The verb of a non-resource request: the method, lower case.
fn non_resource_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::HEAD => "head",
        Method::OPTIONS => "options",
        _ => "unknown",
    }
}

/// An authorizer's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Refused, with a reason appended to the 403's message when not empty.
    Deny(String),
    /// No opinion: the next authorizer decides.
    NoOpinion,
}

/// One authorizer of the chain.
pub trait Authorizer: Send + Sync {
    /// Decides a request.
    fn authorize(&self, attributes: &Attributes) -> Decision;
}

/// Members of `system:masters` may do anything.
struct PrivilegedGroups;

impl Authorizer for PrivilegedGroups {
    fn authorize(&self, a: &Attributes) -> Decision {
        if a.user.in_group(MASTERS) {
            Decision::Allow
        } else {
            Decision::NoOpinion
        }
    }
}

/// Whether `path` matches a non-resource URL rule: exactly, or by prefix when the rule ends
/// in `*`, as RBAC matches `nonResourceURLs`.
pub fn non_resource_url_matches(rule: &str, path: &str) -> bool {
    match rule.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => rule == path,
    }
}

/// The authorizers, asked in order; the first with an opinion decides, and no opinion at all
/// is a refusal.
pub struct Authorizers {
    chain: Vec<Box<dyn Authorizer>>,
}

impl Default for Authorizers {
    fn default() -> Self {
        Authorizers {
            chain: vec![Box::new(PrivilegedGroups)],
        }
    }
}

impl Authorizers {
    /// Appends an authorizer (asked after those already there).
    pub fn push(&mut self, authorizer: Box<dyn Authorizer>) {
        self.chain.push(authorizer);
    }

    /// The chain's decision on a request.
    pub fn decide(&self, a: &Attributes) -> Decision {
        for authorizer in &self.chain {
            match authorizer.authorize(a) {
                Decision::NoOpinion => continue,
                decision => return decision,
            }
        }
        Decision::NoOpinion
    }

    /// `Ok` when the request is allowed, else the 403 kube-apiserver sends.
    pub fn authorize(&self, a: &Attributes) -> Result<(), ApiError> {
        self.decide(a).into_result(a)
    }
}

impl Decision {
    /// `Ok` for an allowed request, else the 403 kube-apiserver sends for it.
    pub fn into_result(self, a: &Attributes) -> Result<(), ApiError> {
        match self {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(forbidden(a, &reason)),
            Decision::NoOpinion => Err(forbidden(a, "")),
        }
    }
}

/// The 403 for a refused request, as kube-apiserver words it:
/// `pods is forbidden: User "x" cannot list resource "pods" in API group "" in the namespace
/// "y"`, `… at the cluster scope`, or `forbidden: User "x" cannot get path "/api"`; an
/// authorizer's reason follows after `: `.
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let mut message = if a.resource_request {
        let resource = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let scope = if a.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", a.namespace)
        };
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} {scope}",
            a.user.username, a.verb, resource, a.api_group
        )
    } else {
        format!(
            "User {:?} cannot {} path {:?}",
            a.user.username, a.verb, a.path
        )
    };
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    if !a.resource_request {
        return ApiError::new(403, "Forbidden", format!("forbidden: {message}"));
    }
    let gr = GroupResource {
        group: a.api_group.clone(),
        resource: a.resource.clone(),
    };
    ApiError::forbidden(&gr, &a.name, &message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse_path;

    fn attrs(user: &UserInfo, method: Method, path: &str, query: &str) -> Attributes {
        let q = crate::request::parse_query(Some(query));
        let target = parse_path(path).unwrap();
        Attributes::for_request(Arc::new(user.clone()), &method, path, &target, &q)
    }

    #[test]
    fn verbs_follow_upstreams_request_info() {
        let u = UserInfo::authenticated("x", vec![]);
        let cases = [
            (Method::GET, "/api/v1/namespaces/y/pods", "", "list"),
            (
                Method::GET,
                "/api/v1/namespaces/y/pods",
                "watch=true",
                "watch",
            ),
            (Method::GET, "/api/v1/namespaces/y/pods/p", "", "get"),
            (Method::POST, "/api/v1/namespaces/y/pods", "", "create"),
            (Method::PUT, "/api/v1/namespaces/y/pods/p", "", "update"),
            (Method::PATCH, "/api/v1/namespaces/y/pods/p", "", "patch"),
            (Method::DELETE, "/api/v1/namespaces/y/pods/p", "", "delete"),
            (
                Method::DELETE,
                "/api/v1/namespaces/y/pods",
                "",
                "deletecollection",
            ),
            (Method::GET, "/apis", "", "get"),
        ];
        for (m, path, q, verb) in cases {
            assert_eq!(attrs(&u, m.clone(), path, q).verb, verb, "{m} {path}?{q}");
        }
        let log = attrs(&u, Method::GET, "/api/v1/namespaces/y/pods/p/log", "");
        assert_eq!(
            (log.resource.as_str(), log.subresource.as_str()),
            ("pods", "log")
        );
        assert!(!attrs(&u, Method::GET, "/apis", "").resource_request);
        let ns = attrs(&u, Method::GET, "/api/v1/namespaces/y", "");
        assert_eq!((ns.namespace.as_str(), ns.name.as_str()), ("y", "y"));
    }

    #[test]
    fn a_list_or_watch_of_one_name_carries_the_name() {
        let u = UserInfo::authenticated("x", vec![]);
        let path = "/api/v1/namespaces/y/configmaps";
        let cases = [
            ("fieldSelector=metadata.name%3Dcm", "list", "cm"),
            ("watch=true&fieldSelector=metadata.name%3Dcm", "watch", "cm"),
            ("fieldSelector=metadata.name%3D%3Dcm", "list", "cm"),
            (
                "fieldSelector=metadata.namespace%3Dy,metadata.name%3Dcm",
                "list",
                "cm",
            ),
            ("fieldSelector=metadata.name!%3Dcm", "list", ""),
            ("fieldSelector=metadata.namespace%3Dy", "list", ""),
            ("fieldSelector=metadata.name%3D..", "list", ""),
            ("fieldSelector=metadata.name", "list", ""),
            ("", "list", ""),
        ];
        for (q, verb, name) in cases {
            let a = attrs(&u, Method::GET, path, q);
            assert_eq!((a.verb.as_str(), a.name.as_str()), (verb, name), "{q}");
        }
        // Only reads: a deletecollection keeps naming the collection.
        let d = attrs(&u, Method::DELETE, path, "fieldSelector=metadata.name%3Dcm");
        assert_eq!((d.verb.as_str(), d.name.as_str()), ("deletecollection", ""));
        let e = forbidden(
            &attrs(
                &u,
                Method::GET,
                path,
                "watch=1&fieldSelector=metadata.name%3Dcm",
            ),
            "",
        );
        assert_eq!(
            e.message,
            r#"configmaps "cm" is forbidden: User "x" cannot watch resource "configmaps" in API group "" in the namespace "y""#
        );
    }

    #[test]
    fn refusals_read_as_upstreams() {
        let u = UserInfo::authenticated("x", vec![]);
        let e = Authorizers::default()
            .authorize(&attrs(&u, Method::GET, "/api/v1/namespaces/y/pods", ""))
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
        assert_eq!(
            e.message,
            r#"pods is forbidden: User "x" cannot list resource "pods" in API group "" in the namespace "y""#
        );
        let e = forbidden(&attrs(&u, Method::GET, "/apis/apps/v1/deployments", ""), "");
        assert_eq!(
            e.message,
            r#"deployments.apps is forbidden: User "x" cannot list resource "deployments" in API group "apps" at the cluster scope"#
        );
        let e = forbidden(
            &attrs(&u, Method::GET, "/api/v1/namespaces/y/pods/p/log", ""),
            "",
        );
        assert_eq!(
            e.message,
            r#"pods "p" is forbidden: User "x" cannot get resource "pods/log" in API group "" in the namespace "y""#
        );
        let anon = UserInfo::anonymous();
        let a = Attributes::non_resource(Arc::new(anon), &Method::GET, "/api");
        assert_eq!(
            forbidden(&a, "").message,
            r#"forbidden: User "system:anonymous" cannot get path "/api""#
        );
        assert!(Authorizers::default()
            .authorize(&attrs(
                &UserInfo::internal(),
                Method::DELETE,
                "/api/v1/nodes",
                ""
            ))
            .is_ok());
    }
}
