//! The RBAC authorizer (`rbac.authorization.k8s.io/v1`), deciding as upstream's does: a
//! request is allowed when a rule of a role bound to the user (or to one of its groups, or to
//! its ServiceAccount) allows it; ClusterRoleBindings grant everywhere, RoleBindings in their
//! namespace only. RBAC never refuses on its own: without a matching rule it has no opinion,
//! and the chain's end refuses.
//!
//! Roles and bindings come from the server's watch caches. Decoding them per request would
//! cost far more than the request itself, so the authorizer keeps a [`Policy`]: the rules of
//! every role and the grants of every binding indexed by subject, rebuilt only when one of the
//! four RBAC caches has changed since it was built.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{non_resource_url_matches, Attributes, Authorizer, Decision};
use crate::authentication::UserInfo;
use crate::watchcache::Caches;

/// The RBAC API group.
pub const GROUP: &str = "rbac.authorization.k8s.io";

/// The storage prefixes of the four RBAC resources, in the order [`Policy::build`] takes them.
const PREFIXES: [&str; 4] = [
    "/registry/rbac.authorization.k8s.io/roles/",
    "/registry/rbac.authorization.k8s.io/clusterroles/",
    "/registry/rbac.authorization.k8s.io/rolebindings/",
    "/registry/rbac.authorization.k8s.io/clusterrolebindings/",
];

/// One rule of a Role or ClusterRole (`rbacv1.PolicyRule`), as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// The verbs the rule grants (`*` for all).
    #[serde(default)]
    pub verbs: Vec<String>,
    /// The API groups of the resources (`""` for the core group, `*` for all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_groups: Vec<String>,
    /// The resources (`pods`, `pods/log`, `*/scale`, `*`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// The object names the rule is limited to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
    /// Non-resource paths (`/healthz`, `/api/*`); only in ClusterRoles.
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub non_resource_urls: Vec<String>,
}

impl PolicyRule {
    /// The rules of a Role or ClusterRole object; rules that do not decode are skipped (the
    /// server validated them on write, so only a hand-edited store holds such).
    pub fn of(role: &Value) -> Vec<PolicyRule> {
        role.get("rules")
            .and_then(Value::as_array)
            .map(|rules| {
                rules
                    .iter()
                    .filter_map(|r| serde_json::from_value(r.clone()).ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether this rule allows the request (upstream's `RuleAllows`).
    pub fn allows(&self, a: &Attributes) -> bool {
        if !verb_matches(&self.verbs, &a.verb) {
            return false;
        }
        if !a.resource_request {
            return self
                .non_resource_urls
                .iter()
                .any(|u| u == "*" || non_resource_url_matches(u, &a.path));
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.api_groups
            .iter()
            .any(|g| g == "*" || *g == a.api_group)
            && resource_matches(&self.resources, &combined, &a.subresource)
            && (self.resource_names.is_empty()
                || (!a.name.is_empty() && self.resource_names.contains(&a.name)))
    }
}

fn verb_matches(verbs: &[String], verb: &str) -> bool {
    verbs.iter().any(|v| v == "*" || v == verb)
}

/// Upstream's `ResourceMatches`: `*`, the exact `resource[/subresource]`, or `*/<sub>` for a
/// request of that subresource of any resource.
fn resource_matches(resources: &[String], combined: &str, subresource: &str) -> bool {
    resources.iter().any(|r| {
        r == "*"
            || r == combined
            || (!subresource.is_empty()
                && r.strip_prefix("*/").is_some_and(|sub| sub == subresource))
    })
}

/// A subject of a binding, as upstream names it.
#[derive(Clone, Debug, Default, Deserialize)]
struct Subject {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

/// The role a binding grants.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq, Hash)]
struct RoleRef {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
}

/// What one binding grants to one subject: a role, everywhere (`namespace` empty, a
/// ClusterRoleBinding) or in one namespace (a RoleBinding).
#[derive(Clone, Debug)]
struct Grant {
    namespace: String,
    role: RoleRef,
}

/// Every role's rules and every binding's grants, indexed for the questions a request asks.
#[derive(Debug, Default)]
pub struct Policy {
    /// Role rules by (namespace, name).
    roles: HashMap<(String, String), Arc<[PolicyRule]>>,
    /// ClusterRole rules by name.
    cluster_roles: HashMap<String, Arc<[PolicyRule]>>,
    /// Grants by user name (ServiceAccount subjects under their user name).
    users: HashMap<String, Vec<Grant>>,
    /// Grants by group.
    groups: HashMap<String, Vec<Grant>>,
}

impl Policy {
    /// The policy these Roles, ClusterRoles, RoleBindings and ClusterRoleBindings make.
    pub fn build(
        roles: &[Value],
        cluster_roles: &[Value],
        role_bindings: &[Value],
        cluster_role_bindings: &[Value],
    ) -> Policy {
        let mut p = Policy::default();
        for r in roles {
            p.roles.insert(
                (meta(r, "namespace"), meta(r, "name")),
                PolicyRule::of(r).into(),
            );
        }
        for r in cluster_roles {
            p.cluster_roles
                .insert(meta(r, "name"), PolicyRule::of(r).into());
        }
        for b in role_bindings {
            p.add_binding(b, meta(b, "namespace"));
        }
        for b in cluster_role_bindings {
            p.add_binding(b, String::new());
        }
        p
    }

    fn add_binding(&mut self, b: &Value, namespace: String) {
        let Some(role) = b
            .get("roleRef")
            .and_then(|r| serde_json::from_value::<RoleRef>(r.clone()).ok())
        else {
            return;
        };
        let subjects = b
            .get("subjects")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for s in subjects {
            let Ok(s) = serde_json::from_value::<Subject>(s.clone()) else {
                continue;
            };
            let grant = Grant {
                namespace: namespace.clone(),
                role: role.clone(),
            };
            match s.kind.as_str() {
                "User" => self.users.entry(s.name).or_default().push(grant),
                "Group" => self.groups.entry(s.name).or_default().push(grant),
                "ServiceAccount" => {
                    // A ServiceAccount subject without a namespace is in the binding's.
                    let ns = if s.namespace.is_empty() {
                        &namespace
                    } else {
                        &s.namespace
                    };
                    if ns.is_empty() {
                        continue;
                    }
                    let user = format!("system:serviceaccount:{ns}:{}", s.name);
                    self.users.entry(user).or_default().push(grant);
                }
                _ => {}
            }
        }
    }

    /// The grants that apply to `user`.
    fn grants<'a>(&'a self, user: &'a UserInfo) -> impl Iterator<Item = &'a Grant> + 'a {
        self.users
            .get(&user.username)
            .into_iter()
            .chain(user.groups.iter().filter_map(|g| self.groups.get(g)))
            .flatten()
    }

    /// The rules a grant gives: a RoleBinding's Role is looked up in its own namespace.
    fn rules_of(&self, grant: &Grant) -> &[PolicyRule] {
        let rules = match grant.role.kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&grant.role.name),
            "Role" => self
                .roles
                .get(&(grant.namespace.clone(), grant.role.name.clone())),
            _ => None,
        };
        rules.map(|r| &r[..]).unwrap_or_default()
    }

    /// The rules of a ClusterRole, if it exists.
    pub fn cluster_role(&self, name: &str) -> Option<&[PolicyRule]> {
        self.cluster_roles.get(name).map(|r| &r[..])
    }

    /// The rules of a Role, if it exists.
    pub fn role(&self, namespace: &str, name: &str) -> Option<&[PolicyRule]> {
        self.roles
            .get(&(namespace.to_string(), name.to_string()))
            .map(|r| &r[..])
    }

    /// Whether a rule granted to the request's user allows it.
    pub fn allows(&self, a: &Attributes) -> bool {
        self.grants(&a.user)
            .filter(|g| g.namespace.is_empty() || g.namespace == a.namespace)
            .any(|g| self.rules_of(g).iter().any(|r| r.allows(a)))
    }
}

/// The rules `user` holds in `namespace` (`""`: only what ClusterRoleBindings grant), as
/// upstream's `RulesFor` lists them: those of ClusterRoleBindings first, then those of the
/// namespace's RoleBindings. Duplicates are kept, as upstream keeps them.
pub fn rules_for(policy: &Policy, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
    let mut cluster = Vec::new();
    let mut local = Vec::new();
    for g in policy.grants(user) {
        if g.namespace.is_empty() {
            cluster.extend_from_slice(policy.rules_of(g));
        } else if !namespace.is_empty() && g.namespace == namespace {
            local.extend_from_slice(policy.rules_of(g));
        }
    }
    cluster.extend(local);
    cluster
}

fn meta(obj: &Value, field: &str) -> String {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The RBAC authorizer over the server's caches; cheap to clone (clones share the index).
#[derive(Clone)]
pub struct Rbac {
    inner: Arc<Inner>,
}

struct Inner {
    caches: Arc<Caches>,
    /// The policy and the caches' change marks it was built at.
    current: parking_lot::Mutex<(Arc<Policy>, [i64; 4])>,
}

impl Rbac {
    /// An authorizer reading roles and bindings from these caches.
    pub fn new(caches: Arc<Caches>) -> Rbac {
        Rbac {
            inner: Arc::new(Inner {
                caches,
                current: parking_lot::Mutex::new((Arc::new(Policy::default()), [-1; 4])),
            }),
        }
    }

    /// The policy as the caches hold it now, rebuilt only when one of them changed.
    pub fn policy(&self) -> Arc<Policy> {
        let caches: Vec<_> = PREFIXES.iter().map(|p| self.inner.caches.get(p)).collect();
        let marks: [i64; 4] = std::array::from_fn(|i| caches[i].last_change());
        let mut current = self.inner.current.lock();
        if current.1 != marks {
            // Marks read before the objects: a change in between only means the next
            // request rebuilds once more.
            let filter = crate::watchcache::Filter::all();
            let objects: Vec<Vec<Value>> = caches
                .iter()
                .map(|c| {
                    let (items, _) = c.list(&c.prefix, &filter);
                    items.iter().map(|o| o.object()).collect()
                })
                .collect();
            let policy = Policy::build(&objects[0], &objects[1], &objects[2], &objects[3]);
            *current = (Arc::new(policy), marks);
        }
        current.0.clone()
    }

    /// The rules `user` holds in `namespace`; see [`rules_for`].
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        rules_for(&self.policy(), user, namespace)
    }
}

impl Authorizer for Rbac {
    fn authorize(&self, a: &Attributes) -> Decision {
        if self.policy().allows(a) {
            Decision::Allow
        } else {
            Decision::NoOpinion
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;
    use serde_json::json;

    fn user(name: &str, groups: &[&str]) -> Arc<UserInfo> {
        Arc::new(UserInfo::authenticated(
            name,
            groups.iter().map(|g| g.to_string()).collect(),
        ))
    }

    fn req(
        u: &Arc<UserInfo>,
        verb: &str,
        group: &str,
        res: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        let (resource, sub) = res.split_once('/').unwrap_or((res, ""));
        let mut a = Attributes::non_resource(u.clone(), &Method::GET, "");
        a.verb = verb.into();
        a.resource_request = true;
        a.api_group = group.into();
        a.resource = resource.into();
        a.subresource = sub.into();
        a.namespace = ns.into();
        a.name = name.into();
        a
    }

    fn rule(v: Value) -> PolicyRule {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rules_match_as_upstreams_rule_allows() {
        let u = user("alice", &[]);
        let r = rule(json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}));
        assert!(r.allows(&req(&u, "get", "", "pods", "a", "p")));
        assert!(r.allows(&req(&u, "list", "", "pods", "a", "")));
        assert!(!r.allows(&req(&u, "create", "", "pods", "a", "")));
        assert!(!r.allows(&req(&u, "get", "apps", "pods", "a", "p")));
        // A subresource is its own resource.
        assert!(!r.allows(&req(&u, "get", "", "pods/log", "a", "p")));
        let log = rule(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}));
        assert!(log.allows(&req(&u, "get", "", "pods/log", "a", "p")));
        assert!(!log.allows(&req(&u, "get", "", "pods", "a", "p")));
        let scale = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*/scale"]}));
        assert!(scale.allows(&req(&u, "update", "apps", "deployments/scale", "a", "d")));
        assert!(!scale.allows(&req(&u, "update", "apps", "deployments", "a", "d")));
        assert!(!scale.allows(&req(&u, "update", "apps", "deployments/status", "a", "d")));
        let all = rule(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
        assert!(all.allows(&req(
            &u,
            "deletecollection",
            "x.io",
            "things/status",
            "",
            ""
        )));
        let named = rule(
            json!({"verbs": ["get", "create"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]}),
        );
        assert!(named.allows(&req(&u, "get", "", "secrets", "a", "s1")));
        assert!(!named.allows(&req(&u, "get", "", "secrets", "a", "s2")));
        // A create (or a list) names no object, so a rule limited to names cannot allow it.
        assert!(!named.allows(&req(&u, "create", "", "secrets", "a", "")));
        let urls = rule(json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/apis/*"]}));
        let path = |p: &str| Attributes::non_resource(u.clone(), &Method::GET, p);
        assert!(urls.allows(&path("/healthz")));
        assert!(urls.allows(&path("/apis/apps/v1")));
        assert!(!urls.allows(&path("/healthz/ping")));
        assert!(!urls.allows(&path("/api")));
        assert!(!urls.allows(&req(&u, "get", "", "healthz", "", "")));
        let star = rule(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
        assert!(star.allows(&path("/anything")));
        assert!(!star.allows(&req(&u, "get", "", "pods", "a", "")));
    }

    fn policy() -> Policy {
        let reader = json!({"metadata": {"name": "pod-reader", "namespace": "a"},
            "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]});
        let view = json!({"metadata": {"name": "view"},
            "rules": [{"verbs": ["get"], "apiGroups": ["apps"], "resources": ["deployments"]}]});
        let health = json!({"metadata": {"name": "health"},
            "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]});
        let rb = json!({"metadata": {"name": "read", "namespace": "a"},
            "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "User", "name": "alice", "apiGroup": GROUP},
                         {"kind": "ServiceAccount", "name": "bot"}]});
        // A RoleBinding to a ClusterRole grants it in the binding's namespace only.
        let rb_view = json!({"metadata": {"name": "view", "namespace": "b"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "Group", "name": "devs", "apiGroup": GROUP}]});
        let crb = json!({"metadata": {"name": "health"},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "health"},
            "subjects": [{"kind": "Group", "name": "system:authenticated", "apiGroup": GROUP},
                         {"kind": "ServiceAccount", "name": "ops", "namespace": "kube-system"}]});
        Policy::build(&[reader], &[view, health], &[rb, rb_view], &[crb])
    }

    #[test]
    fn bindings_grant_to_users_groups_and_service_accounts() {
        let p = policy();
        let alice = user("alice", &[]);
        assert!(p.allows(&req(&alice, "list", "", "pods", "a", "")));
        assert!(!p.allows(&req(&alice, "list", "", "pods", "b", "")));
        assert!(!p.allows(&req(&alice, "list", "", "pods", "", "")));
        assert!(!p.allows(&req(&alice, "create", "", "pods", "a", "")));
        let bot = user("system:serviceaccount:a:bot", &[]);
        assert!(p.allows(&req(&bot, "get", "", "pods", "a", "p")));
        let other_bot = user("system:serviceaccount:b:bot", &[]);
        assert!(!p.allows(&req(&other_bot, "get", "", "pods", "a", "p")));
        let dev = user("carol", &["devs"]);
        assert!(p.allows(&req(&dev, "get", "apps", "deployments", "b", "d")));
        assert!(!p.allows(&req(&dev, "get", "apps", "deployments", "a", "d")));
        let healthz = Attributes::non_resource(alice.clone(), &Method::GET, "/healthz");
        assert!(p.allows(&healthz));
        let anon = Arc::new(UserInfo::anonymous());
        let healthz = Attributes::non_resource(anon, &Method::GET, "/healthz");
        assert!(!p.allows(&healthz));
        let ops = user("system:serviceaccount:kube-system:ops", &[]);
        let healthz = Attributes::non_resource(ops, &Method::GET, "/healthz");
        assert!(p.allows(&healthz));
    }

    /// The index is rebuilt when an RBAC object changes, and only then.
    #[tokio::test]
    async fn the_policy_is_rebuilt_only_when_rbac_objects_change() {
        use setpoint_store::{Precondition, Store};
        let store: Arc<dyn Store> = Arc::new(setpoint_store::memory::MemoryStore::new());
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut prefixes: Vec<String> = PREFIXES.iter().map(|p| p.to_string()).collect();
        prefixes.push("/registry/core/configmaps/".into());
        let caches = Caches::start(
            store.clone(),
            prefixes,
            Default::default(),
            crate::metrics::Metrics::new(),
            stop_rx,
        )
        .await
        .unwrap();
        let rbac = Rbac::new(caches.clone());
        let put = |key: &'static str, v: Value| {
            let store = store.clone();
            async move {
                let value = serde_json::to_vec(&v).unwrap().into();
                store
                    .put(key, value, Precondition::None)
                    .await
                    .unwrap()
                    .mod_revision
            }
        };
        let first = rbac.policy();
        assert!(Arc::ptr_eq(&first, &rbac.policy()));
        let rev = put(
            "/registry/core/configmaps/a/c",
            json!({"metadata": {"name": "c", "namespace": "a"}}),
        )
        .await;
        assert!(
            caches
                .wait_for(rev, std::time::Duration::from_secs(10))
                .await
        );
        assert!(
            Arc::ptr_eq(&first, &rbac.policy()),
            "a ConfigMap is not RBAC"
        );
        let rev = put(
            "/registry/rbac.authorization.k8s.io/clusterroles/x",
            json!({"metadata": {"name": "x"}, "rules": [{"verbs": ["get"], "nonResourceURLs": ["/x"]}]}),
        )
        .await;
        assert!(
            caches
                .wait_for(rev, std::time::Duration::from_secs(10))
                .await
        );
        let second = rbac.policy();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(
            second.cluster_role("x").unwrap()[0].non_resource_urls,
            ["/x"]
        );
        assert!(Arc::ptr_eq(&second, &rbac.policy()));
    }

    #[test]
    fn rules_for_lists_cluster_then_namespace_rules() {
        let p = policy();
        let alice = UserInfo::authenticated("alice", vec![]);
        let rules = rules_for(&p, &alice, "a");
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].non_resource_urls, ["/healthz"]);
        assert_eq!(rules[1].resources, ["pods"]);
        assert_eq!(rules_for(&p, &alice, "b").len(), 1);
        assert_eq!(rules_for(&p, &alice, "").len(), 1);
        let out = serde_json::to_value(&rules[0]).unwrap();
        assert_eq!(
            out,
            json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]})
        );
    }
}
