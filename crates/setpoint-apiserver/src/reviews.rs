//! Reviews: resources that are only ever created and never stored (upstream's "virtual"
//! resources). A POST to the collection of one runs its handler here, which answers with the
//! object it was given, its `status` filled in; discovery lists only `create` for them, a
//! LIST, WATCH or DELETE of the collection is 405, and an object path is 404.
//!
//! - `authentication.k8s.io/v1` `TokenReview`: what the server's token authenticators make of
//!   `spec.token`; `SelfSubjectReview` (`kubectl auth whoami`): who the caller is.
//! - `authorization.k8s.io/v1` `SubjectAccessReview` (for any user), `LocalSubjectAccessReview`
//!   (the same, in the path's namespace), `SelfSubjectAccessReview` (`kubectl auth can-i`, for
//!   the caller): what the server's authorizers decide about the attributes in the spec;
//!   `SelfSubjectRulesReview` (`kubectl auth can-i --list`): what the caller may do in a
//!   namespace.
//!
//! The handlers are pure functions of the authenticators, the authorizers, the caller and the
//! body, so the HTTP layer only decodes the body and writes the answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use setpoint_api::{ApiError, Cause};

use crate::authentication::{Authenticators, UserInfo};
use crate::authorization::{Attributes, Authorizers, Decision};
use crate::registry::ResourceDef;

/// What a review is answered with: the server's authenticators and authorizers, and who asks.
pub struct Reviewer<'a> {
    /// The token authenticators (TokenReview).
    pub authenticators: &'a Authenticators,
    /// The audiences the API identifies as (`--api-audiences`): a TokenReview that names no
    /// audiences asks for these.
    pub api_audiences: &'a [String],
    /// The authorizers (the access reviews).
    pub authorizers: &'a Authorizers,
    /// The caller (the self reviews).
    pub caller: &'a Arc<UserInfo>,
    /// The RBAC rules a user holds in a namespace, as `rbac.authorization.k8s.io/v1`
    /// `PolicyRule`s (the rules review); `None` where no RBAC rules are kept.
    pub rules: Option<RulesFor<'a>>,
}

/// A source of the RBAC rules a user holds in a namespace.
pub type RulesFor<'a> = &'a dyn Fn(&UserInfo, &str) -> Vec<Value>;

impl Reviewer<'_> {
    /// Answers the review `obj` of resource `res`, created in `namespace` (`""` for the
    /// cluster-scoped ones): the object with its `status` filled in.
    pub fn review(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let Value::Object(mut obj) = obj else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        };
        match (res.group.as_str(), res.kind.as_str()) {
            ("authentication.k8s.io", "TokenReview") => self.token_review(obj),
            ("authentication.k8s.io", "SelfSubjectReview") => Ok(self.self_subject_review(obj)),
            ("authorization.k8s.io", "SubjectAccessReview") => {
                let spec = spec_of(&obj);
                let mut causes = access_spec_causes(&spec);
                causes.extend(subject_cause(&spec));
                causes.extend(empty_metadata_cause(&obj, false));
                invalid(res, causes)?;
                let user = Arc::new(subject_of(&spec));
                obj.insert("status".into(), self.access_status(user, &spec));
                Ok(Value::Object(obj))
            }
            ("authorization.k8s.io", "LocalSubjectAccessReview") => {
                let spec = spec_of(&obj);
                let mut causes = access_spec_causes(&spec);
                causes.extend(subject_cause(&spec));
                causes.extend(empty_metadata_cause(&obj, true));
                let meta_ns = obj
                    .get("metadata")
                    .and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if let Some(ra) = spec.get("resourceAttributes").filter(|v| !v.is_null()) {
                    let ns = ra
                        .get("namespace")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if ns != meta_ns {
                        causes.push(Cause::invalid(
                            "spec.resourceAttributes.namespace",
                            &json!(ns),
                            "must match metadata.namespace",
                        ));
                    }
                }
                if let Some(nra) = spec.get("nonResourceAttributes").filter(|v| !v.is_null()) {
                    causes.push(Cause::invalid(
                        "spec.nonResourceAttributes",
                        &go_value(Some(nra)),
                        "disallowed on this kind of request",
                    ));
                }
                invalid(res, causes)?;
                if namespace.is_empty() {
                    return Err(ApiError::bad_request(
                        "namespace is required on this type: ",
                    ));
                }
                if namespace != meta_ns {
                    return Err(ApiError::bad_request(format!(
                        "spec.resourceAttributes.namespace must match namespace: {namespace}"
                    )));
                }
                let user = Arc::new(subject_of(&spec));
                obj.insert("status".into(), self.access_status(user, &spec));
                Ok(Value::Object(obj))
            }
            ("authorization.k8s.io", "SelfSubjectAccessReview") => {
                let spec = spec_of(&obj);
                let mut causes = access_spec_causes(&spec);
                causes.extend(empty_metadata_cause(&obj, false));
                invalid(res, causes)?;
                obj.insert(
                    "status".into(),
                    self.access_status(self.caller.clone(), &spec),
                );
                Ok(Value::Object(obj))
            }
            ("authorization.k8s.io", "SelfSubjectRulesReview") => self.rules_review(obj),
            _ => Err(ApiError::method_not_allowed()),
        }
    }

    /// TokenReview: runs the token authenticators on `spec.token` for the audiences asked
    /// (the API's own when none are). A ServiceAccount token is valid for the audiences it was
    /// minted for; other tokens only for the API's own, as upstream's implicit audiences.
    fn token_review(&self, mut obj: Map<String, Value>) -> Result<Value, ApiError> {
        let spec = spec_of(&obj);
        let token = spec_str(&spec, "token");
        if token.is_empty() {
            return Err(ApiError::bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        let mut asked = spec_list(&spec, "audiences");
        if asked.is_empty() {
            asked = self.api_audiences.to_vec();
        }
        let mut status = Map::new();
        let outcome =
            self.authenticators
                .authenticate_token_for(&token, &asked, self.api_audiences);
        match outcome {
            Ok(Some((user, audiences))) => {
                status.insert("authenticated".into(), json!(true));
                status.insert("user".into(), user_info(&user));
                status.insert("audiences".into(), json!(audiences));
            }
            Ok(None) => {
                status.insert("user".into(), json!({}));
                // The bearer-token authenticator's word for a token nobody knows.
                status.insert("error".into(), json!("invalid bearer token"));
            }
            Err(reason) => {
                status.insert("user".into(), json!({}));
                status.insert("error".into(), json!(reason));
            }
        }
        obj.insert("status".into(), Value::Object(status));
        Ok(Value::Object(obj))
    }

    /// SelfSubjectReview: the caller as the server authenticated it, in a new object (what
    /// the body held besides its type is not looked at, as upstream).
    fn self_subject_review(&self, obj: Map<String, Value>) -> Value {
        let mut out = type_of(&obj);
        out.insert(
            "metadata".into(),
            json!({"creationTimestamp": setpoint_api::time::now_rfc3339()}),
        );
        out.insert("status".into(), json!({"userInfo": user_info(self.caller)}));
        Value::Object(out)
    }

    /// The status of an access review: the authorizers' decision on the spec's attributes
    /// for `user`.
    fn access_status(&self, user: Arc<UserInfo>, spec: &Value) -> Value {
        let attributes = attributes_of(user, spec);
        let mut status = Map::new();
        match self.authorizers.decide(&attributes) {
            Decision::Allow => {
                status.insert("allowed".into(), json!(true));
            }
            Decision::Deny(reason) => {
                status.insert("allowed".into(), json!(false));
                status.insert("denied".into(), json!(true));
                if !reason.is_empty() {
                    status.insert("reason".into(), json!(reason));
                }
            }
            Decision::NoOpinion => {
                status.insert("allowed".into(), json!(false));
            }
        }
        Value::Object(status)
    }

    /// SelfSubjectRulesReview: the rules the caller holds in `spec.namespace`: everything for
    /// `system:masters` (as upstream's privileged-group authorizer lists it), then the RBAC
    /// rules of its bindings. Without RBAC rules to ask, the answer is `incomplete`, with why
    /// in `evaluationError`.
    fn rules_review(&self, obj: Map<String, Value>) -> Result<Value, ApiError> {
        let spec = spec_of(&obj);
        let namespace = spec_str(&spec, "namespace");
        if namespace.is_empty() {
            return Err(ApiError::bad_request("no namespace on request"));
        }
        let mut resource_rules = Vec::new();
        let mut non_resource_rules = Vec::new();
        if self.caller.in_group(crate::authentication::MASTERS) {
            resource_rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
            non_resource_rules.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
        }
        let mut status = Map::new();
        match self.rules {
            Some(rules_for) => {
                for rule in rules_for(self.caller, &namespace) {
                    let list = |k: &str| rule.get(k).cloned().unwrap_or_else(|| json!([]));
                    let has = |k: &str| {
                        rule.get(k)
                            .and_then(Value::as_array)
                            .is_some_and(|a| !a.is_empty())
                    };
                    if has("resources") {
                        let mut r = json!({"verbs": list("verbs"), "apiGroups": list("apiGroups"), "resources": list("resources")});
                        if has("resourceNames") {
                            r["resourceNames"] = list("resourceNames");
                        }
                        resource_rules.push(r);
                    }
                    if has("nonResourceURLs") {
                        non_resource_rules.push(json!({"verbs": list("verbs"), "nonResourceURLs": list("nonResourceURLs")}));
                    }
                }
                // Nodes hold more than RBAC lists (the Node authorizer's), which upstream's
                // node authorizer says it cannot enumerate.
                if crate::authorization::node::node_name(self.caller).is_some() {
                    status.insert("incomplete".into(), json!(true));
                    status.insert(
                        "evaluationError".into(),
                        json!("node authorizer does not support user rule resolution"),
                    );
                } else {
                    status.insert("incomplete".into(), json!(false));
                }
            }
            None => {
                status.insert("incomplete".into(), json!(true));
                status.insert(
                    "evaluationError".into(),
                    json!("no rule resolver is configured: only system:masters' rules are listed"),
                );
            }
        }
        status.insert("resourceRules".into(), Value::Array(resource_rules));
        status.insert("nonResourceRules".into(), Value::Array(non_resource_rules));
        let mut out = type_of(&obj);
        out.insert("metadata".into(), json!({"creationTimestamp": null}));
        out.insert("spec".into(), json!({}));
        out.insert("status".into(), Value::Object(status));
        Ok(Value::Object(out))
    }
}

/// A new object of the body's type (`apiVersion` and `kind`, which the server checked).
fn type_of(obj: &Map<String, Value>) -> Map<String, Value> {
    ["kind", "apiVersion"]
        .iter()
        .filter_map(|k| Some((k.to_string(), obj.get(*k)?.clone())))
        .collect()
}

/// 422 with upstream's `Kind.group "" is invalid: …` when there are causes.
fn invalid(res: &ResourceDef, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(&res.group, &res.kind, "", causes))
}

fn spec_of(obj: &Map<String, Value>) -> Value {
    obj.get("spec").cloned().unwrap_or(Value::Null)
}

fn spec_str(spec: &Value, key: &str) -> String {
    spec.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn spec_list(spec: &Value, key: &str) -> Vec<String> {
    spec.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The value of an optional attributes struct as upstream's field error prints it: `null`
/// when absent, else its fields in Go's syntax (`authorization.NonResourceAttributes{Path:"/x",
/// Verb:"get"}`).
fn go_value(v: Option<&Value>) -> Value {
    match v.filter(|v| !v.is_null()) {
        None => json!("null"),
        Some(nra) => {
            let s = |k: &str| {
                nra.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            json!(format!(
                "authorization.NonResourceAttributes{{Path:{:?}, Verb:{:?}}}",
                s("path"),
                s("verb")
            ))
        }
    }
}

/// Upstream's checks of an access review's spec: exactly one of resource and non-resource
/// attributes.
fn access_spec_causes(spec: &Value) -> Vec<Cause> {
    let present = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
    let (ra, nra) = (
        present("resourceAttributes"),
        present("nonResourceAttributes"),
    );
    let mut causes = Vec::new();
    if ra && nra {
        causes.push(Cause::invalid(
            "spec.nonResourceAttributes",
            &go_value(spec.get("nonResourceAttributes")),
            "cannot be specified in combination with resourceAttributes",
        ));
    }
    if !ra && !nra {
        causes.push(Cause::invalid(
            "spec.resourceAttributes",
            &go_value(None),
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    causes
}

/// The non-self access reviews must name someone: a user or a group.
fn subject_cause(spec: &Value) -> Option<Cause> {
    let user = spec_str(spec, "user");
    (user.is_empty() && spec_list(spec, "groups").is_empty()).then(|| {
        Cause::invalid(
            "spec.user",
            &json!(user),
            "at least one of user or group must be specified",
        )
    })
}

/// Access reviews take no metadata (a namespace only, for the local one): upstream refuses
/// any other field but `managedFields`, which its request handler may have added.
fn empty_metadata_cause(obj: &Map<String, Value>, namespace_allowed: bool) -> Option<Cause> {
    let meta = obj.get("metadata")?.as_object()?;
    let set: Map<String, Value> = meta
        .iter()
        .filter(|(k, v)| {
            let skipped =
                k.as_str() == "managedFields" || (namespace_allowed && k.as_str() == "namespace");
            !skipped && !is_empty(v)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if set.is_empty() {
        return None;
    }
    let detail = if namespace_allowed {
        "must be empty except for namespace"
    } else {
        "must be empty"
    };
    Some(Cause::invalid(
        "metadata",
        &Value::Object(meta.clone()),
        detail,
    ))
}

/// Whether a JSON value is its type's zero value (what Go's decode leaves unset).
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(b) => !b,
    }
}

/// The subject of a (local) SubjectAccessReview: the spec's user, groups, uid and extra, as
/// given (no group is added).
fn subject_of(spec: &Value) -> UserInfo {
    let mut extra = BTreeMap::new();
    if let Some(m) = spec.get("extra").and_then(Value::as_object) {
        for (k, v) in m {
            let values = v
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            extra.insert(k.clone(), values);
        }
    }
    UserInfo {
        username: spec_str(spec, "user"),
        uid: spec_str(spec, "uid"),
        groups: spec_list(spec, "groups"),
        extra,
    }
}

/// The authorization attributes an access review's spec describes, for `user`.
fn attributes_of(user: Arc<UserInfo>, spec: &Value) -> Attributes {
    let mut a = Attributes::non_resource(user, &http::Method::GET, "");
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match spec.get("resourceAttributes").filter(|v| !v.is_null()) {
        Some(ra) => {
            a.resource_request = true;
            a.verb = s(ra, "verb");
            a.namespace = s(ra, "namespace");
            a.api_group = s(ra, "group");
            a.api_version = s(ra, "version");
            a.resource = s(ra, "resource");
            a.subresource = s(ra, "subresource");
            a.name = s(ra, "name");
        }
        None => {
            let nra = spec
                .get("nonResourceAttributes")
                .cloned()
                .unwrap_or(Value::Null);
            a.verb = s(&nra, "verb");
            a.path = s(&nra, "path");
        }
    }
    a
}

/// A user as `authentication.k8s.io/v1` `UserInfo` (empty fields left out, as upstream's
/// `omitempty`).
fn user_info(user: &UserInfo) -> Value {
    let mut m = Map::new();
    if !user.username.is_empty() {
        m.insert("username".into(), json!(user.username));
    }
    if !user.uid.is_empty() {
        m.insert("uid".into(), json!(user.uid));
    }
    if !user.groups.is_empty() {
        m.insert("groups".into(), json!(user.groups));
    }
    if !user.extra.is_empty() {
        m.insert("extra".into(), json!(user.extra));
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authentication::MASTERS;

    fn res(group: &str, kind: &str, plural: &str, namespaced: bool) -> ResourceDef {
        crate::registry::Registry::builtin()
            .get(group, "v1", plural)
            .map(|r| (**r).clone())
            .filter(|r| r.kind == kind && r.namespaced == namespaced)
            .expect("a built-in review")
    }

    fn reviewer<'a>(
        authn: &'a Authenticators,
        authz: &'a Authorizers,
        caller: &'a Arc<UserInfo>,
        audiences: &'a [String],
    ) -> Reviewer<'a> {
        Reviewer {
            authenticators: authn,
            api_audiences: audiences,
            authorizers: authz,
            caller,
            rules: None,
        }
    }

    #[test]
    fn access_review_specs_become_the_authorizers_attributes() {
        let user = Arc::new(UserInfo::authenticated("u", vec![]));
        let spec = json!({"resourceAttributes": {"namespace": "a", "verb": "get", "group": "apps",
            "version": "v1", "resource": "deployments", "subresource": "scale", "name": "web"}});
        let a = attributes_of(user.clone(), &spec);
        assert!(a.resource_request);
        assert_eq!(
            (
                a.verb.as_str(),
                a.namespace.as_str(),
                a.api_group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.name.as_str()
            ),
            ("get", "a", "apps", "deployments", "scale", "web")
        );
        let a = attributes_of(
            user,
            &json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}),
        );
        assert!(!a.resource_request);
        assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", "/healthz"));
        // The subject is taken as given: no group is added.
        let subject = subject_of(&json!({"user": "x", "uid": "1", "groups": ["g"],
                                         "extra": {"k": ["v"]}}));
        assert_eq!(subject.groups, ["g"]);
        assert_eq!(subject.extra["k"], ["v"]);
        assert_eq!(subject.uid, "1");
    }

    #[test]
    fn metadata_of_access_reviews_must_be_empty() {
        let with = |meta: Value| {
            let mut m = Map::new();
            m.insert("metadata".into(), meta);
            m
        };
        assert_eq!(empty_metadata_cause(&with(json!({})), false), None);
        assert_eq!(
            empty_metadata_cause(&with(json!({"creationTimestamp": null, "name": ""})), false),
            None
        );
        let c = empty_metadata_cause(&with(json!({"name": "x"})), false).unwrap();
        assert_eq!(c.field, "metadata");
        assert!(c.message.ends_with(": must be empty"), "{}", c.message);
        assert_eq!(
            empty_metadata_cause(&with(json!({"namespace": "a"})), true),
            None
        );
        assert!(empty_metadata_cause(&with(json!({"namespace": "a"})), false).is_some());
    }

    #[test]
    fn without_rbac_rules_a_rules_review_says_it_is_incomplete() {
        let authn = Authenticators::default();
        let authz = Authorizers::default();
        let bob = Arc::new(UserInfo::authenticated("bob", vec![]));
        let r = reviewer(&authn, &authz, &bob, &[]);
        let ssrr = res(
            "authorization.k8s.io",
            "SelfSubjectRulesReview",
            "selfsubjectrulesreviews",
            false,
        );
        let out = r
            .review(&ssrr, "", json!({"spec": {"namespace": "a"}}))
            .unwrap();
        assert_eq!(out["status"]["incomplete"], true);
        assert_eq!(out["status"]["resourceRules"], json!([]));
        assert!(out["status"]["evaluationError"].is_string());

        let admin = Arc::new(UserInfo::authenticated("root", vec![MASTERS.into()]));
        let rules = |_: &UserInfo, ns: &str| {
            vec![
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"],
                        "resourceNames": [ns]}),
                json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}),
            ]
        };
        let r = Reviewer {
            rules: Some(&rules),
            ..reviewer(&authn, &authz, &admin, &[])
        };
        let out = r
            .review(&ssrr, "", json!({"spec": {"namespace": "a"}}))
            .unwrap();
        assert_eq!(
            out["status"],
            json!({"incomplete": false,
                   "resourceRules": [
                       {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                       {"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]}],
                   "nonResourceRules": [
                       {"verbs": ["*"], "nonResourceURLs": ["*"]},
                       {"verbs": ["get"], "nonResourceURLs": ["/healthz"]}]})
        );
    }

    #[test]
    fn token_reviews_report_refusals_and_unknown_tokens() {
        struct Expired;
        impl crate::authentication::TokenAuthenticator for Expired {
            fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
                match token {
                    "old" => Err("token has expired".into()),
                    _ => Ok(None),
                }
            }
        }
        let mut authn = Authenticators::default();
        authn.push(Box::new(Expired));
        let authz = Authorizers::default();
        let caller = Arc::new(UserInfo::internal());
        let audiences = ["api".to_string()];
        let r = reviewer(&authn, &authz, &caller, &audiences);
        let tr = res(
            "authentication.k8s.io",
            "TokenReview",
            "tokenreviews",
            false,
        );
        let out = r
            .review(&tr, "", json!({"spec": {"token": "old"}}))
            .unwrap();
        assert_eq!(
            out["status"],
            json!({"user": {}, "error": "token has expired"})
        );
        let out = r.review(&tr, "", json!({"spec": {"token": "x"}})).unwrap();
        assert_eq!(out["status"]["error"], "invalid bearer token");
    }
}
