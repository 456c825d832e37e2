//! The audit policy (`audit.k8s.io/v1` `Policy`): parsed and validated with kube-apiserver's
//! messages, and matched against a request's attributes. Pure: no I/O.
//!
//! The first rule that matches a request decides its level; a request no rule matches is not
//! audited (`None`), as upstream's policy checker does.

use serde::Deserialize;
use serde_json::Value;
use setpoint_api::Cause;

use crate::authorization::Attributes;

/// How much of a request an event records, from least to most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum Level {
    /// Not audited.
    None,
    /// Who did what to which object, and the response's status.
    Metadata,
    /// Metadata and the request's body.
    Request,
    /// Metadata, the request's body and the response's body.
    RequestResponse,
}

impl Level {
    /// The level's name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }

    fn parse(s: &str) -> Option<Level> {
        LEVELS.iter().copied().find(|l| l.as_str() == s)
    }
}

const LEVELS: [Level; 4] = [
    Level::None,
    Level::Metadata,
    Level::Request,
    Level::RequestResponse,
];

/// When in a request's life an event is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// As soon as the request is received, before it is handled.
    RequestReceived,
    /// Long-running requests (watches, logs, exec): once the response's headers are sent.
    ResponseStarted,
    /// Once the response is complete.
    ResponseComplete,
    /// The handler panicked.
    Panic,
}

impl Stage {
    /// The stage's name as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::RequestReceived => "RequestReceived",
            Stage::ResponseStarted => "ResponseStarted",
            Stage::ResponseComplete => "ResponseComplete",
            Stage::Panic => "Panic",
        }
    }

    fn parse(s: &str) -> Option<Stage> {
        STAGES.iter().copied().find(|st| st.as_str() == s)
    }
}

const STAGES: [Stage; 4] = [
    Stage::RequestReceived,
    Stage::ResponseStarted,
    Stage::ResponseComplete,
    Stage::Panic,
];

/// A group's resources a rule names (`GroupResources`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupResources {
    /// The API group, `""` for the core group.
    pub group: String,
    /// Resources (`pods`), subresources (`pods/log`), `*`, `*/scale` or `pods/*`; empty means
    /// all of the group's.
    pub resources: Vec<String>,
    /// Object names; empty means any.
    pub resource_names: Vec<String>,
}

/// One rule of a policy (`PolicyRule`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The level of the requests it matches.
    pub level: Level,
    /// User names; empty means any.
    pub users: Vec<String>,
    /// Groups, one of which the user must be in; empty means any.
    pub user_groups: Vec<String>,
    /// Verbs (`get`, `list`, `watch`, `create`, …); empty means any.
    pub verbs: Vec<String>,
    /// The resources it matches; with `namespaces`, it matches resource requests only.
    pub resources: Vec<GroupResources>,
    /// Namespaces (`""` for cluster-scoped requests); empty means any.
    pub namespaces: Vec<String>,
    /// Non-resource paths (`/healthz`, `/api*`, `*`).
    pub non_resource_urls: Vec<String>,
    /// Stages not written for the requests it matches (added to the policy's).
    pub omit_stages: Vec<Stage>,
    /// Whether `metadata.managedFields` is left out of logged bodies; unset takes the policy's.
    pub omit_managed_fields: Option<bool>,
}

/// A validated audit policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The rules, first match wins.
    pub rules: Vec<Rule>,
    /// Stages never written.
    pub omit_stages: Vec<Stage>,
    /// Whether `metadata.managedFields` is left out of logged bodies.
    pub omit_managed_fields: bool,
}

/// What the policy decides for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// How much to record.
    pub level: Level,
    /// Stages not to write.
    pub omit_stages: Vec<Stage>,
    /// Whether `metadata.managedFields` is left out of logged bodies.
    pub omit_managed_fields: bool,
}

/// Why a policy file could not be used, worded as kube-apiserver words it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The document is not YAML or JSON of the right shape.
    #[error("failed decoding: {0}")]
    Decoding(String),
    /// Not an `audit.k8s.io/v1` `Policy`.
    #[error("unknown group version field {0} in policy")]
    GroupVersion(String),
    /// Field errors (`rules[0].level: Required value`), one or an aggregate.
    #[error("{0}")]
    Invalid(String),
    /// A policy without rules would audit nothing.
    #[error("loaded illegal policy with 0 rules")]
    NoRules,
}

/// A policy file's contents as written (lenient: unknown fields are reported as warnings, as
/// upstream falls back to lenient decoding).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawPolicy {
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawRule {
    #[serde(default)]
    level: String,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<RawGroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawGroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

const POLICY_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "rules",
    "omitStages",
    "omitManagedFields",
];
const RULE_FIELDS: &[&str] = &[
    "level",
    "users",
    "userGroups",
    "verbs",
    "resources",
    "namespaces",
    "nonResourceURLs",
    "omitStages",
    "omitManagedFields",
];
const GROUP_RESOURCE_FIELDS: &[&str] = &["group", "resources", "resourceNames"];

/// Parses and validates a policy document (YAML or JSON). Returns the policy and the unknown
/// fields it ignored (`rules[0].levle`), which the caller should warn about.
pub fn parse(text: &str) -> Result<(Policy, Vec<String>), PolicyError> {
    let doc = crate::yamlbody::decode(text).map_err(PolicyError::Decoding)?;
    let Value::Object(map) = &doc else {
        return Err(PolicyError::Decoding(
            "Object 'Kind' is missing in the policy document".into(),
        ));
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(PolicyError::Decoding(
            "Object 'Kind' is missing in the policy document".into(),
        ));
    }
    if api_version != "audit.k8s.io/v1" || kind != "Policy" {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        return Err(PolicyError::GroupVersion(format!(
            "{group}/{version}, Kind={kind}"
        )));
    }
    let unknown = unknown_fields(&doc);
    let raw: RawPolicy =
        serde_json::from_value(doc).map_err(|e| PolicyError::Decoding(e.to_string()))?;
    let policy = validate(raw)?;
    if policy.rules.is_empty() {
        return Err(PolicyError::NoRules);
    }
    Ok((policy, unknown))
}

/// Field paths of the document that the policy type does not have.
fn unknown_fields(doc: &Value) -> Vec<String> {
    fn check(v: &Value, known: &[&str], path: &str, out: &mut Vec<String>) {
        if let Some(m) = v.as_object() {
            for k in m.keys().filter(|k| !known.contains(&k.as_str())) {
                out.push(if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                });
            }
        }
    }
    let mut out = Vec::new();
    check(doc, POLICY_FIELDS, "", &mut out);
    for (i, rule) in doc["rules"].as_array().into_iter().flatten().enumerate() {
        let path = format!("rules[{i}]");
        check(rule, RULE_FIELDS, &path, &mut out);
        for (j, gr) in rule["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            check(
                gr,
                GROUP_RESOURCE_FIELDS,
                &format!("{path}.resources[{j}]"),
                &mut out,
            );
        }
    }
    out
}

/// Upstream's `ValidatePolicy`, then the typed policy.
fn validate(raw: RawPolicy) -> Result<Policy, PolicyError> {
    let mut errors = Vec::new();
    let omit_stages = stages(&raw.omit_stages, "omitStages", &mut errors);
    let mut rules = Vec::new();
    for (i, r) in raw.rules.into_iter().enumerate() {
        let path = format!("rules[{i}]");
        let level = if r.level.is_empty() {
            errors.push(Cause::required(format!("{path}.level"), ""));
            Level::None
        } else {
            Level::parse(&r.level).unwrap_or_else(|| {
                errors.push(Cause::not_supported(
                    format!("{path}.level"),
                    &Value::String(r.level.clone()),
                    &sorted(LEVELS.iter().map(|l| l.as_str())),
                ));
                Level::None
            })
        };
        for (j, url) in r.non_resource_urls.iter().enumerate() {
            if url == "*" {
                continue;
            }
            let field = format!("{path}.nonResourceURLs[{j}]");
            if !url.starts_with('/') {
                errors.push(Cause::invalid(
                    field.clone(),
                    &Value::String(url.clone()),
                    "non-resource URL rules must begin with a '/' character",
                ));
            }
            if !url.is_empty() && url[..url.len() - 1].contains('*') {
                errors.push(Cause::invalid(
                    field,
                    &Value::String(url.clone()),
                    "non-resource URL wildcards '*' must be the final character of the rule",
                ));
            }
        }
        for gr in &r.resources {
            let field = format!("{path}.resources.group");
            if !gr.group.is_empty() {
                if let Err(msgs) = setpoint_api::names::is_dns1123_subdomain(&gr.group) {
                    errors.push(Cause::invalid(
                        field,
                        &Value::String(gr.group.clone()),
                        &msgs.join(","),
                    ));
                }
            }
            if !gr.resource_names.is_empty() && gr.resources.is_empty() {
                errors.push(invalid_list(
                    format!("{path}.resources.resourceNames"),
                    &gr.resource_names,
                    "using resourceNames requires at least one resource",
                ));
            }
        }
        let rule_stages = stages(&r.omit_stages, &format!("{path}.omitStages"), &mut errors);
        if !r.non_resource_urls.is_empty() && (!r.resources.is_empty() || !r.namespaces.is_empty())
        {
            errors.push(invalid_list(
                format!("{path}.nonResourceURLs"),
                &r.non_resource_urls,
                "rules cannot apply to both regular resources and non-resource URLs",
            ));
        }
        rules.push(Rule {
            level,
            users: r.users,
            user_groups: r.user_groups,
            verbs: r.verbs,
            resources: r
                .resources
                .into_iter()
                .map(|g| GroupResources {
                    group: g.group,
                    resources: g.resources,
                    resource_names: g.resource_names,
                })
                .collect(),
            namespaces: r.namespaces,
            non_resource_urls: r.non_resource_urls,
            omit_stages: rule_stages,
            omit_managed_fields: r.omit_managed_fields,
        });
    }
    if !errors.is_empty() {
        let texts: Vec<String> = errors
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        // Go's `ToAggregate`: one error as it is, several in brackets.
        let text = if texts.len() == 1 {
            texts.into_iter().next().unwrap_or_default()
        } else {
            format!("[{}]", texts.join(", "))
        };
        return Err(PolicyError::Invalid(text));
    }
    Ok(Policy {
        rules,
        omit_stages,
        omit_managed_fields: raw.omit_managed_fields,
    })
}

/// Go's `sets.String.List()`: the supported values sorted, as upstream's messages list them.
fn sorted<'a>(names: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = names.collect();
    v.sort_unstable();
    v
}

/// `field: Invalid value: []string{"a", "b"}: detail`: Go prints a list value with `%#v`.
fn invalid_list(field: String, values: &[String], detail: &str) -> Cause {
    let items: Vec<String> = values
        .iter()
        .map(|v| setpoint_api::strconv::quote(v))
        .collect();
    Cause::new(
        "FieldValueInvalid",
        field,
        format!("Invalid value: []string{{{}}}: {detail}", items.join(", ")),
    )
}

fn stages(names: &[String], path: &str, errors: &mut Vec<Cause>) -> Vec<Stage> {
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match Stage::parse(name) {
            Some(s) => out.push(s),
            None => {
                errors.push(Cause::not_supported(
                    format!("{path}[{i}]"),
                    &Value::String(name.clone()),
                    &sorted(STAGES.iter().map(|s| s.as_str())),
                ));
            }
        }
    }
    out
}

impl Policy {
    /// The level and omitted stages for a request: the first matching rule's, else `None`.
    pub fn evaluate(&self, a: &Attributes) -> Decision {
        match self.rules.iter().find(|r| r.matches(a)) {
            Some(rule) => {
                let mut omit = self.omit_stages.clone();
                for s in &rule.omit_stages {
                    if !omit.contains(s) {
                        omit.push(*s);
                    }
                }
                Decision {
                    level: rule.level,
                    omit_stages: omit,
                    omit_managed_fields: rule
                        .omit_managed_fields
                        .unwrap_or(self.omit_managed_fields),
                }
            }
            None => Decision {
                level: Level::None,
                omit_stages: self.omit_stages.clone(),
                omit_managed_fields: self.omit_managed_fields,
            },
        }
    }
}

impl Rule {
    /// Whether the rule applies to a request (upstream's `ruleMatches`).
    pub fn matches(&self, a: &Attributes) -> bool {
        if !self.users.is_empty() && !self.users.contains(&a.user.username) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !a.user.groups.iter().any(|g| self.user_groups.contains(g))
        {
            return false;
        }
        if !self.verbs.is_empty() && !self.verbs.contains(&a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(a);
        }
        if !self.non_resource_urls.is_empty() {
            return !a.resource_request
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(&a.path, spec));
        }
        true
    }

    fn matches_resource(&self, a: &Attributes) -> bool {
        if !a.resource_request {
            return false;
        }
        // Cluster-scoped requests have the namespace "".
        if !self.namespaces.is_empty() && !self.namespaces.contains(&a.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.resources
            .iter()
            .filter(|gr| gr.group == a.api_group)
            .any(|gr| {
                if gr.resources.is_empty() {
                    return true;
                }
                if !gr.resource_names.is_empty() && !gr.resource_names.contains(&a.name) {
                    return false;
                }
                gr.resources.iter().any(|res| {
                    res == "*"
                        || *res == combined
                        || (!a.subresource.is_empty()
                            && res.strip_prefix("*/") == Some(a.subresource.as_str()))
                        || res.strip_suffix("/*") == Some(a.resource.as_str())
                })
            })
    }
}

/// A non-resource URL rule against a path: `*`, exact, or a prefix ending in `*`.
fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix.trim_end_matches('*')))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::authentication::UserInfo;

    fn policy(yaml: &str) -> Policy {
        parse(yaml).expect("valid policy").0
    }

    fn attrs(user: &str, groups: &[&str], verb: &str, path_or_resource: &str) -> Attributes {
        let user = Arc::new(UserInfo {
            username: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        });
        let mut a = Attributes::non_resource(user, &http::Method::GET, path_or_resource);
        a.verb = verb.into();
        if !path_or_resource.starts_with('/') {
            // group:resource/sub:namespace:name
            let parts: Vec<&str> = path_or_resource.split(':').collect();
            a.resource_request = true;
            a.api_group = parts[0].into();
            let (res, sub) = parts[1].split_once('/').unwrap_or((parts[1], ""));
            a.resource = res.into();
            a.subresource = sub.into();
            a.namespace = parts.get(2).copied().unwrap_or("").into();
            a.name = parts.get(3).copied().unwrap_or("").into();
            a.path = String::new();
        }
        a
    }

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources:
  - group: coordination.k8s.io
- level: None
  users: ["system:kube-proxy"]
  verbs: ["watch"]
- level: Metadata
  resources:
  - group: ""
    resources: ["secrets", "pods/log"]
- level: RequestResponse
  omitStages: [ResponseStarted]
  resources:
  - group: ""
    resources: ["configmaps"]
    resourceNames: ["audited"]
- level: Request
  namespaces: ["kube-system"]
- level: Metadata
  nonResourceURLs: ["/healthz*", "/version"]
- level: Request
  userGroups: ["system:nodes"]
- level: Metadata
  resources:
  - group: apps
    resources: ["*/scale", "deployments/*"]
"#;

    #[test]
    fn first_matching_rule_decides() {
        let p = policy(POLICY);
        let level = |a: Attributes| p.evaluate(&a).level;
        assert_eq!(
            level(attrs("a", &[], "get", "coordination.k8s.io:leases:ns:x")),
            Level::None
        );
        assert_eq!(
            level(attrs("a", &[], "get", ":secrets:default:s")),
            Level::Metadata
        );
        assert_eq!(
            level(attrs("a", &[], "get", ":pods/log:default:p")),
            Level::Metadata
        );
        // pods itself is not pods/log.
        assert_eq!(
            level(attrs("a", &[], "get", ":pods:default:p")),
            Level::None
        );
        assert_eq!(
            level(attrs("a", &[], "create", ":configmaps:default:audited")),
            Level::RequestResponse
        );
        // resourceNames: another name falls through to later rules.
        assert_eq!(
            level(attrs("a", &[], "create", ":configmaps:default:other")),
            Level::None
        );
        assert_eq!(
            level(attrs("a", &[], "create", ":configmaps:kube-system:other")),
            Level::Request
        );
        assert_eq!(
            level(attrs("system:kube-proxy", &[], "watch", ":services::")),
            Level::None
        );
        assert_eq!(
            level(attrs("system:kube-proxy", &[], "list", ":services::")),
            Level::None
        );
    }

    #[test]
    fn users_groups_and_urls() {
        let p = policy(POLICY);
        let level = |a: Attributes| p.evaluate(&a).level;
        assert_eq!(level(attrs("u", &[], "get", "/healthz")), Level::Metadata);
        assert_eq!(
            level(attrs("u", &[], "get", "/healthz/etcd")),
            Level::Metadata
        );
        assert_eq!(level(attrs("u", &[], "get", "/version")), Level::Metadata);
        assert_eq!(level(attrs("u", &[], "get", "/versionx")), Level::None);
        // A URL rule never matches a resource request, nor a resource rule a path.
        assert_eq!(
            level(attrs("n", &["system:nodes"], "get", ":nodes::n")),
            Level::Request
        );
        assert_eq!(level(attrs("n", &["x"], "get", ":nodes::n")), Level::None);
        // Cluster-scoped requests have the namespace "", which kube-system does not match.
        assert_eq!(level(attrs("u", &[], "get", ":nodes::x")), Level::None);
    }

    #[test]
    fn subresource_wildcards() {
        let p = policy(POLICY);
        let level = |a: Attributes| p.evaluate(&a).level;
        assert_eq!(
            level(attrs("u", &[], "update", "apps:statefulsets/scale:d:x")),
            Level::Metadata
        );
        assert_eq!(
            level(attrs("u", &[], "update", "apps:deployments/status:d:x")),
            Level::Metadata
        );
        assert_eq!(
            level(attrs("u", &[], "update", "apps:statefulsets/status:d:x")),
            Level::None
        );
        // `*/scale` needs a subresource.
        assert_eq!(
            level(attrs("u", &[], "update", "apps:statefulsets:d:x")),
            Level::None
        );
    }

    #[test]
    fn omit_stages_are_the_union() {
        let p = policy(POLICY);
        let d = p.evaluate(&attrs("a", &[], "create", ":configmaps:default:audited"));
        assert_eq!(
            d.omit_stages,
            vec![Stage::RequestReceived, Stage::ResponseStarted]
        );
        let d = p.evaluate(&attrs("a", &[], "get", ":secrets:default:s"));
        assert_eq!(d.omit_stages, vec![Stage::RequestReceived]);
    }

    #[test]
    fn omit_managed_fields_rule_overrides_policy() {
        let p = policy(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitManagedFields: true\nrules:\n\
             - level: Request\n  verbs: [create]\n  omitManagedFields: false\n- level: Request\n",
        );
        assert!(
            !p.evaluate(&attrs("a", &[], "create", ":pods:d:p"))
                .omit_managed_fields
        );
        assert!(
            p.evaluate(&attrs("a", &[], "get", ":pods:d:p"))
                .omit_managed_fields
        );
    }

    #[test]
    fn validation_messages() {
        let err = |y: &str| parse(y).unwrap_err().to_string();
        let head = "apiVersion: audit.k8s.io/v1\nkind: Policy\n";
        assert_eq!(
            err(&format!("{head}rules:\n- level: Everything\n")),
            "rules[0].level: Unsupported value: \"Everything\": supported values: \
             \"Metadata\", \"None\", \"Request\", \"RequestResponse\""
        );
        assert_eq!(
            err(&format!("{head}rules:\n- verbs: [get]\n")),
            "rules[0].level: Required value"
        );
        assert_eq!(
            err(&format!(
                "{head}rules:\n- level: Metadata\n  nonResourceURLs: [healthz]\n  namespaces: [a]\n"
            )),
            "[rules[0].nonResourceURLs[0]: Invalid value: \"healthz\": non-resource URL rules \
             must begin with a '/' character, rules[0].nonResourceURLs: Invalid value: \
             []string{\"healthz\"}: rules cannot apply to both regular resources and non-resource URLs]"
        );
        assert_eq!(
            err(&format!(
                "{head}omitStages: [Later]\nrules:\n- level: None\n"
            )),
            "omitStages[0]: Unsupported value: \"Later\": supported values: \
             \"Panic\", \"RequestReceived\", \"ResponseComplete\", \"ResponseStarted\""
        );
        assert_eq!(
            err(&format!("{head}rules: []\n")),
            "loaded illegal policy with 0 rules"
        );
        assert_eq!(
            err("apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: []\n"),
            "unknown group version field audit.k8s.io/v1beta1, Kind=Policy in policy"
        );
        assert!(err(&format!(
            "{head}rules:\n- level: Metadata\n  resources:\n  - group: apps/v1\n"
        ))
        .starts_with("rules[0].resources.group: Invalid value: \"apps/v1\": "));
    }

    #[test]
    fn unknown_fields_are_warnings() {
        let (_, unknown) = parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  verb: [get]\n",
        )
        .unwrap();
        assert_eq!(unknown, vec!["rules[0].verb".to_string()]);
    }
}
