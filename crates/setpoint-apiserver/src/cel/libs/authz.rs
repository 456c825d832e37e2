//! Kubernetes' authorizer library (`k8s.io/apiserver/pkg/cel/library/authz.go`): the
//! `authorizer` variable of admission policies and webhooks' `matchConditions`, and the
//! checks built from it.
//!
//! ```text
//! authorizer.group('apps').resource('deployments').subresource('scale')
//!     .namespace('ns').name('web').check('update').allowed()
//! authorizer.path('/healthz').check('get').allowed()
//! authorizer.serviceAccount('ns', 'bot').group('').resource('pods').check('list').reason()
//! authorizer.requestResource.check('approve').allowed()
//! ```
//!
//! A check asks the API server's authorizers, as the request's user (or the service account
//! `serviceAccount` names), exactly what a request with those attributes would be asked;
//! resource checks are for any API version (`*`), as upstream's. `allowed()` is true only
//! for an allow: no opinion is a refusal. The authorizers never fail, so `errored()` is
//! false and `error()` empty; `reason()` is the reason a refusal gives (allowed decisions
//! carry none here). `fieldSelector` and `labelSelector` are not offered: the authorizers
//! do not look at selectors.

use std::fmt;
use std::sync::Arc;

use cel::common::types::{CelBool, CelString, Type};
use cel::{Context, DeclarationError, Env, ExecutionError};

use super::opaque_val;
use crate::authentication::UserInfo;
use crate::authorization::{Attributes, Authorizers, Decision};

/// The name of the variable admission policies and webhooks' `matchConditions` bind.
pub const VARIABLE: &str = "authorizer";
/// The name of the request's own resource check (`authorizer.requestResource`), a variable of
/// its own as upstream declares it.
pub const REQUEST_RESOURCE_VARIABLE: &str = "authorizer.requestResource";

/// The runtime cost of one `check`, upstream's `authzCheckCost`: two checks fit in one
/// expression's per-call limit, a third does not.
pub const CHECK_COST: u64 = 350_000;

const AUTHORIZER_TYPE: &str = "kubernetes.authorization.Authorizer";
const PATH_CHECK_TYPE: &str = "kubernetes.authorization.PathCheck";
const GROUP_CHECK_TYPE: &str = "kubernetes.authorization.GroupCheck";
const RESOURCE_CHECK_TYPE: &str = "kubernetes.authorization.ResourceCheck";
const DECISION_TYPE: &str = "kubernetes.authorization.Decision";

/// `kubernetes.authorization.Authorizer`: the authorizers, and whom they are asked about.
#[derive(Clone)]
pub struct CelAuthorizer {
    authorizers: Arc<Authorizers>,
    user: Arc<UserInfo>,
}

impl fmt::Debug for CelAuthorizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CelAuthorizer")
            .field("user", &self.user.username)
            .finish_non_exhaustive()
    }
}

impl PartialEq for CelAuthorizer {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.authorizers, &other.authorizers) && self.user == other.user
    }
}

opaque_val!(CelAuthorizer, Type::new_unspecified_type(AUTHORIZER_TYPE));

impl CelAuthorizer {
    fn ask(&self, attributes: Attributes) -> CelDecision {
        CelDecision(self.authorizers.decide(&attributes))
    }
}

/// `kubernetes.authorization.PathCheck`: a non-resource path.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PathCheck {
    authorizer: CelAuthorizer,
    path: String,
}

opaque_val!(PathCheck, Type::new_unspecified_type(PATH_CHECK_TYPE));

/// `kubernetes.authorization.GroupCheck`: an API group, before its resource is named.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GroupCheck {
    authorizer: CelAuthorizer,
    group: String,
}

opaque_val!(GroupCheck, Type::new_unspecified_type(GROUP_CHECK_TYPE));

/// What a resource check is about; empty strings are unset (the cluster scope, every name,
/// no subresource).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource.
    pub subresource: String,
    /// The namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

/// `kubernetes.authorization.ResourceCheck`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ResourceCheck {
    authorizer: CelAuthorizer,
    target: ResourceAttributes,
}

opaque_val!(
    ResourceCheck,
    Type::new_unspecified_type(RESOURCE_CHECK_TYPE)
);

/// `kubernetes.authorization.Decision`: what the authorizers answered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelDecision(Decision);

opaque_val!(CelDecision, Type::new_unspecified_type(DECISION_TYPE));

/// The `authorizer` and `authorizer.requestResource` variables of one request.
#[derive(Clone, Debug)]
pub struct Bindings {
    authorizer: CelAuthorizer,
    request_resource: ResourceCheck,
}

impl Bindings {
    /// The variables for a request by `user` to `request`, checked by `authorizers`.
    pub fn new(
        authorizers: Arc<Authorizers>,
        user: Arc<UserInfo>,
        request: ResourceAttributes,
    ) -> Bindings {
        let authorizer = CelAuthorizer { authorizers, user };
        Bindings {
            request_resource: ResourceCheck {
                authorizer: authorizer.clone(),
                target: request,
            },
            authorizer,
        }
    }

    /// Binds both variables in `ctx`.
    pub(crate) fn bind(&self, ctx: &mut Context<'_, '_>) {
        ctx.add_variable_as_val(VARIABLE, Box::new(self.authorizer.clone()));
        ctx.add_variable_as_val(
            REQUEST_RESOURCE_VARIABLE,
            Box::new(self.request_resource.clone()),
        );
    }
}

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    for name in [
        AUTHORIZER_TYPE,
        PATH_CHECK_TYPE,
        GROUP_CHECK_TYPE,
        RESOURCE_CHECK_TYPE,
        DECISION_TYPE,
    ] {
        env.add_type(Type::new_unspecified_type(name))?;
    }
    cel::add_member_overload!(env, fn path: (CelAuthorizer, CelString) -> Result<PathCheck>,
        id = "authorizer_path")?;
    cel::add_member_overload!(env, fn group: (CelAuthorizer, CelString) -> GroupCheck,
        id = "authorizer_group")?;
    cel::add_member_overload!(env,
        fn service_account: (CelAuthorizer, CelString, CelString) -> Result<CelAuthorizer>,
        name = "serviceAccount", id = "authorizer_serviceaccount")?;
    cel::add_member_overload!(env, fn resource: (GroupCheck, CelString) -> Result<ResourceCheck>,
        id = "groupcheck_resource")?;
    cel::add_member_overload!(env, fn subresource: (ResourceCheck, CelString) -> ResourceCheck,
        id = "resourcecheck_subresource")?;
    cel::add_member_overload!(env, fn namespace: (ResourceCheck, CelString) -> ResourceCheck,
        id = "resourcecheck_namespace")?;
    cel::add_member_overload!(env, fn name: (ResourceCheck, CelString) -> ResourceCheck,
        id = "resourcecheck_name")?;
    cel::add_member_overload!(env, fn path_check: (PathCheck, CelString) -> CelDecision,
        name = "check", id = "pathcheck_check")?;
    cel::add_member_overload!(env, fn resource_check: (ResourceCheck, CelString) -> CelDecision,
        name = "check", id = "resourcecheck_check")?;
    cel::add_member_overload!(env, fn allowed: (CelDecision) -> CelBool,
        id = "decision_allowed")?;
    cel::add_member_overload!(env, fn reason: (CelDecision) -> CelString<'static>,
        id = "decision_reason")?;
    cel::add_member_overload!(env, fn errored: (CelDecision) -> CelBool,
        id = "decision_errored")?;
    cel::add_member_overload!(env, fn error: (CelDecision) -> CelString<'static>,
        id = "decision_error")?;
    Ok(())
}

fn path(a: &CelAuthorizer, path: &CelString<'_>) -> Result<PathCheck, ExecutionError> {
    if path.inner().trim().is_empty() {
        return Err(ExecutionError::function_error(
            "path",
            "path must not be empty",
        ));
    }
    Ok(PathCheck {
        authorizer: a.clone(),
        path: path.inner().to_string(),
    })
}

fn group(a: &CelAuthorizer, group: &CelString<'_>) -> GroupCheck {
    GroupCheck {
        authorizer: a.clone(),
        group: group.inner().to_string(),
    }
}

/// The same authorizers asked about a service account, as upstream's service account user:
/// its user name and its two groups, nothing else.
fn service_account(
    a: &CelAuthorizer,
    namespace: &CelString<'_>,
    name: &CelString<'_>,
) -> Result<CelAuthorizer, ExecutionError> {
    use crate::authentication::serviceaccount;
    let invalid = |what: &str| ExecutionError::function_error("serviceAccount", what);
    if setpoint_api::names::is_dns1123_subdomain(name.inner()).is_err() {
        return Err(invalid("Invalid service account name"));
    }
    if setpoint_api::names::is_dns1123_label(namespace.inner()).is_err() {
        return Err(invalid("Invalid service account namespace"));
    }
    let user = UserInfo {
        username: serviceaccount::username(namespace.inner(), name.inner()),
        groups: serviceaccount::groups(namespace.inner()),
        ..UserInfo::default()
    };
    Ok(CelAuthorizer {
        authorizers: a.authorizers.clone(),
        user: Arc::new(user),
    })
}

fn resource(g: &GroupCheck, resource: &CelString<'_>) -> Result<ResourceCheck, ExecutionError> {
    if resource.inner().trim().is_empty() {
        return Err(ExecutionError::function_error(
            "resource",
            "resource must not be empty",
        ));
    }
    Ok(ResourceCheck {
        authorizer: g.authorizer.clone(),
        target: ResourceAttributes {
            group: g.group.clone(),
            resource: resource.inner().to_string(),
            ..ResourceAttributes::default()
        },
    })
}

/// `r` with one of its attributes replaced.
fn with(r: &ResourceCheck, set: impl FnOnce(&mut ResourceAttributes)) -> ResourceCheck {
    let mut out = r.clone();
    set(&mut out.target);
    out
}

fn subresource(r: &ResourceCheck, s: &CelString<'_>) -> ResourceCheck {
    with(r, |t| t.subresource = s.inner().to_string())
}

fn namespace(r: &ResourceCheck, s: &CelString<'_>) -> ResourceCheck {
    with(r, |t| t.namespace = s.inner().to_string())
}

fn name(r: &ResourceCheck, s: &CelString<'_>) -> ResourceCheck {
    with(r, |t| t.name = s.inner().to_string())
}

fn path_check(p: &PathCheck, verb: &CelString<'_>) -> CelDecision {
    let a = Attributes::verb_on_path(p.authorizer.user.clone(), verb.inner(), &p.path);
    p.authorizer.ask(a)
}

fn resource_check(r: &ResourceCheck, verb: &CelString<'_>) -> CelDecision {
    let t = &r.target;
    let mut a = Attributes::verb_on_path(r.authorizer.user.clone(), verb.inner(), "");
    a.resource_request = true;
    a.api_group = t.group.clone();
    a.api_version = "*".into();
    a.resource = t.resource.clone();
    a.subresource = t.subresource.clone();
    a.namespace = t.namespace.clone();
    a.name = t.name.clone();
    r.authorizer.ask(a)
}

fn allowed(d: &CelDecision) -> CelBool {
    (d.0 == Decision::Allow).into()
}

fn reason(d: &CelDecision) -> CelString<'static> {
    match &d.0 {
        Decision::Deny(reason) => reason.clone().into(),
        Decision::Allow | Decision::NoOpinion => String::new().into(),
    }
}

/// The authorizers answer without failing: no decision is an error.
fn errored(_: &CelDecision) -> CelBool {
    false.into()
}

fn error(_: &CelDecision) -> CelString<'static> {
    String::new().into()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::authorization::Authorizer;

    /// Allows `alice` what her rules list, denies `mallory` with a reason, and records every
    /// question asked.
    struct Rules {
        asked: Arc<Mutex<Vec<Attributes>>>,
    }

    impl Authorizer for Rules {
        fn authorize(&self, a: &Attributes) -> Decision {
            self.asked.lock().unwrap().push(a.clone());
            let user = a.user.username.as_str();
            let resource = (
                a.verb.as_str(),
                a.api_group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str(),
            );
            match user {
                "mallory" => Decision::Deny("mallory may do nothing".into()),
                "alice" if a.resource_request => match resource {
                    ("update", "apps", "deployments", "scale", "ns") => Decision::Allow,
                    ("approve", "", "configmaps", "", "ns") if a.name == "cm" => Decision::Allow,
                    _ => Decision::NoOpinion,
                },
                "alice" if a.path == "/healthz" && a.verb == "get" => Decision::Allow,
                "system:serviceaccount:ns:bot"
                    if a.resource_request
                        && a.user.groups
                            == ["system:serviceaccounts", "system:serviceaccounts:ns"]
                        && resource == ("list", "", "pods", "", "ns") =>
                {
                    Decision::Allow
                }
                _ => Decision::NoOpinion,
            }
        }
    }

    fn eval(user: &str, expr: &str) -> (Result<cel::Value, crate::cel::Error>, Vec<Attributes>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let mut authorizers = Authorizers::default();
        authorizers.push(Box::new(Rules {
            asked: asked.clone(),
        }));
        let bindings = Bindings::new(
            Arc::new(authorizers),
            Arc::new(UserInfo::authenticated(user, vec![])),
            ResourceAttributes {
                group: String::new(),
                resource: "configmaps".into(),
                subresource: String::new(),
                namespace: "ns".into(),
                name: "cm".into(),
            },
        );
        let program = crate::cel::compile(expr).unwrap();
        let result = crate::cel::evaluate_with(
            &program,
            &[],
            Some(&bindings),
            &mut crate::cel::Budget::per_request(),
        );
        let asked = asked.lock().unwrap().clone();
        (result, asked)
    }

    fn holds(user: &str, expr: &str) -> bool {
        match eval(user, expr).0 {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("{expr}: {other:?}"),
        }
    }

    #[test]
    fn resource_checks_ask_with_every_attribute() {
        let scale = "authorizer.group('apps').resource('deployments').subresource('scale')\
                     .namespace('ns').name('web').check('update')";
        assert!(holds("alice", &format!("{scale}.allowed()")));
        assert!(!holds("bob", &format!("{scale}.allowed()")));
        let (_, asked) = eval("alice", &format!("{scale}.allowed()"));
        let a = &asked[0];
        assert!(a.resource_request);
        assert_eq!(
            (
                a.verb.as_str(),
                a.api_group.as_str(),
                a.api_version.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str(),
                a.name.as_str(),
                a.user.username.as_str()
            ),
            (
                "update",
                "apps",
                "*",
                "deployments",
                "scale",
                "ns",
                "web",
                "alice"
            )
        );
        // An empty subresource or name is unset; the namespace defaults to the cluster scope.
        assert!(!holds(
            "alice",
            "authorizer.group('apps').resource('deployments').check('update').allowed()"
        ));
        assert!(holds(
            "alice",
            "authorizer.group('apps').resource('deployments').subresource('x').subresource('scale')\
             .namespace('ns').name('').check('update').allowed()"
        ));
    }

    #[test]
    fn the_request_resource_and_paths_are_checked_too() {
        assert!(holds(
            "alice",
            "authorizer.requestResource.check('approve').allowed()"
        ));
        assert!(!holds(
            "alice",
            "authorizer.requestResource.name('other').check('approve').allowed()"
        ));
        assert!(holds(
            "alice",
            "authorizer.path('/healthz').check('get').allowed()"
        ));
        let (_, asked) = eval(
            "alice",
            "authorizer.path('/healthz').check('get').allowed()",
        );
        assert!(!asked[0].resource_request);
        assert_eq!(asked[0].path, "/healthz");
        assert!(!holds(
            "alice",
            "authorizer.path('/healthz').check('post').allowed()"
        ));
    }

    #[test]
    fn service_accounts_are_asked_about_as_themselves() {
        let list = ".group('').resource('pods').namespace('ns').check('list').allowed()";
        assert!(holds(
            "alice",
            &format!("authorizer.serviceAccount('ns', 'bot'){list}")
        ));
        assert!(!holds("alice", &format!("authorizer{list}")));
        for (expr, message) in [
            (
                "authorizer.serviceAccount('ns', 'Not_A_Name')",
                "Invalid service account name",
            ),
            (
                "authorizer.serviceAccount('a.b', 'bot')",
                "Invalid service account namespace",
            ),
            ("authorizer.path('  ')", "path must not be empty"),
            (
                "authorizer.group('apps').resource('')",
                "resource must not be empty",
            ),
        ] {
            match eval("alice", expr).0 {
                Err(e) => assert_eq!(e.to_string(), message, "{expr}"),
                other => panic!("{expr}: {other:?}"),
            }
        }
    }

    #[test]
    fn decisions_say_allowed_and_why() {
        let check = "authorizer.group('').resource('pods').check('get')";
        for (user, expr) in [
            ("mallory", format!("!{check}.allowed()")),
            (
                "mallory",
                format!("{check}.reason() == 'mallory may do nothing'"),
            ),
            (
                "mallory",
                format!("!{check}.errored() && {check}.error() == ''"),
            ),
            // No opinion is not an allow, and has no reason.
            (
                "bob",
                format!("!{check}.allowed() && {check}.reason() == ''"),
            ),
        ] {
            assert!(holds(user, &expr), "{user}: {expr}");
        }
        assert!(holds(
            "bob",
            "type(authorizer.requestResource) == kubernetes.authorization.ResourceCheck"
        ));
    }

    #[test]
    fn checks_are_expensive() {
        let check = "authorizer.requestResource.check('approve').allowed()";
        let two = format!("{check} && {check}");
        assert!(holds("alice", &two));
        let three = format!("{check} && {check} && {check}");
        assert_eq!(
            eval("alice", &three).0,
            Err(crate::cel::Error::CallCostExceeded)
        );
    }

    #[test]
    fn without_the_bindings_the_variable_is_undeclared() {
        let program = crate::cel::compile("authorizer.path('/x').check('get').allowed()").unwrap();
        let result = crate::cel::evaluate(&program, &[], &mut crate::cel::Budget::per_request());
        assert!(
            matches!(&result, Err(crate::cel::Error::Execution(m)) if m.contains("authorizer")),
            "{result:?}"
        );
    }
}
