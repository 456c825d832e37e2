//! `ValidatingAdmissionPolicy` admission: CEL policies bound to requests by
//! `ValidatingAdmissionPolicyBinding`s (`admissionregistration.k8s.io/v1`), run in process.
//!
//! For a create, update or delete, every policy whose `matchConstraints` match the request
//! (the webhook rule matcher: `resourceRules`, `excludeResourceRules` with `resourceNames`,
//! `matchPolicy`, namespace and object selectors) is evaluated once per binding that names
//! it and whose `matchResources` also match, and once per parameter object the binding's
//! `paramRef` selects (or once without `params`). The order inside is upstream's:
//! `matchConditions`, then `variables`, then `validations` and `auditAnnotations`, with
//! `object`, `oldObject`, `request`, `params`, `namespaceObject`, `variables` and
//! `authorizer` bound; `object` and `oldObject` are shown as the version the policy matched
//! (the one the client named, or with `matchPolicy: Equivalent` another serving the same
//! objects), converted by the admission webhooks' helper (a custom resource's through its
//! CRD's conversion webhook). `authorizer` checks what the request's user may do (the server's
//! own writes are `system:apiserver`'s), and `authorizer.requestResource` is the request's
//! own resource, subresource, namespace and name ([`crate::cel::authz`]); webhooks'
//! `matchConditions` bind the same variables, built for both by `webhook::Call::authorizer`.
//! A failed validation does what the binding's `validationActions` say: `Deny` refuses the
//! request (the first denial wins, with upstream's message, code and reason), `Warn` adds a
//! `Warning` header, `Audit` records the `validation.policy.admission.k8s.io/validation_failure`
//! annotation in the request's audit event. Errors (an expression that does not compile or
//! fails to evaluate, a missing parameter with `parameterNotFoundAction: Deny`, an unknown
//! `paramKind`) follow the policy's `failurePolicy`.
//!
//! Policies, bindings and parameters are read from the watch cache; a policy is compiled
//! once per generation ([`compiled`]).
//! [`status`] keeps each policy's `status` (`observedGeneration`, and the expressions that
//! do not compile in `typeChecking.expressionWarnings`).

mod compiled;
pub(crate) mod status;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::{json, Value};
use setpoint_api::status::ApiError;
use setpoint_api::Cause;

use self::compiled::{Expr, Policy};
use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::watchcache::Filter;
use crate::webhook::matching::{self, Operation, Resource};
use crate::webhook::Call;

const GROUP: &str = "admissionregistration.k8s.io";
const POLICIES: &str = "validatingadmissionpolicies";
const BINDINGS: &str = "validatingadmissionpolicybindings";
/// The audit annotation an `Audit` action records a failed validation under.
const VALIDATION_FAILURE: &str = "validation.policy.admission.k8s.io/validation_failure";
/// Audit annotation values are cut to this many bytes, as upstream's.
const MAX_ANNOTATION_VALUE: usize = 10 * 1024;

/// Every expression of ValidatingAdmissionPolicy `obj` with its field path
/// (`spec.validations[0].expression`), in the order of the spec: what is compiled when the
/// policy is written.
pub(crate) fn expressions_of(obj: &Value) -> Vec<(String, String)> {
    let policy = Policy::compile(obj);
    policy
        .expressions()
        .into_iter()
        .map(|(path, e)| (path, e.text.clone()))
        .collect()
}

/// A refusal, before it becomes the request's error.
struct Denial {
    policy: String,
    binding: Option<String>,
    message: String,
    /// `""` for `Invalid`.
    reason: String,
}

/// What evaluating the policies came to, besides a denial.
#[derive(Default)]
struct Outcome {
    denials: Vec<Denial>,
    warnings: Vec<String>,
    /// Audit annotations by key, each with its values in order.
    annotations: BTreeMap<String, Vec<String>>,
}

/// A validation that failed (or could not be evaluated under `failurePolicy: Fail`).
struct Failure {
    message: String,
    /// `""` for `Invalid`.
    reason: String,
}

/// The variables every evaluation of one request binds (objects in the matched version).
struct Activation {
    object: Value,
    old_object: Value,
    request: Value,
    namespace_object: Value,
    /// The `authorizer` variables: the request's user and resource.
    authorizer: crate::cel::authz::Bindings,
}

/// Evaluates one expression with `vars` bound, drawing on `budget`.
fn run(
    expr: &Expr,
    vars: &[(&str, &Value)],
    authorizer: &crate::cel::authz::Bindings,
    budget: &mut crate::cel::Budget,
) -> Result<cel::Value, String> {
    let program = expr.program.as_ref().map_err(Clone::clone)?;
    // Only the variables the expression names are bound: each bound value is converted to
    // CEL and costed on every evaluation, and most expressions read only `object`.
    let used: Vec<(&str, &Value)> = vars
        .iter()
        .filter(|(name, _)| program.uses_variable(name))
        .copied()
        .collect();
    let authorizer = program
        .uses_variable(crate::cel::authz::VARIABLE)
        .then_some(authorizer);
    crate::cel::evaluate_with(program, &used, authorizer, budget).map_err(|e| e.to_string())
}

/// A variable's value as JSON, to bind for the expressions after it; `None` for values
/// JSON cannot carry (functions, opaque values), which leaves the variable out.
fn to_json(v: &cel::Value) -> Option<Value> {
    Some(match v {
        cel::Value::Null => Value::Null,
        cel::Value::Bool(b) => json!(b),
        cel::Value::Int(i) => json!(i),
        cel::Value::UInt(u) => json!(u),
        cel::Value::Float(f) => json!(f),
        cel::Value::String(s) => json!(s.as_str()),
        cel::Value::List(items) => Value::Array(items.iter().map(to_json).collect::<Option<_>>()?),
        cel::Value::Map(m) => Value::Object(
            m.map
                .iter()
                .map(|(k, v)| {
                    let key = match k {
                        cel::objects::Key::String(s) => s.to_string(),
                        cel::objects::Key::Int(i) => i.to_string(),
                        cel::objects::Key::Uint(u) => u.to_string(),
                        cel::objects::Key::Bool(b) => b.to_string(),
                    };
                    Some((key, to_json(v)?))
                })
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

/// Whether a rule of `rules` matches one of `candidates` (the request's resource first; only
/// it for `matchPolicy: Exact`), honouring each rule's `resourceNames`.
fn rules_match(
    m: &Value,
    key: &str,
    op: Operation<'_>,
    name: &str,
    candidates: &[Resource],
) -> Option<usize> {
    let rules: &[Value] = m
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let exact = m.get("matchPolicy").and_then(Value::as_str) == Some("Exact");
    let considered = if exact { 1 } else { candidates.len() };
    candidates.iter().take(considered).position(|res| {
        rules.iter().any(|r| {
            let names = r.get("resourceNames").and_then(Value::as_array);
            let named = names.is_none_or(|n| n.is_empty() || n.iter().any(|n| n == name));
            named && matching::rule_matches(r, op, res)
        })
    })
}

/// The facts of a request a `MatchResources` is checked against.
struct Request<'a> {
    op: Operation<'a>,
    call: &'a Call<'a>,
    object: Option<&'a Value>,
    candidates: &'a [Resource],
    namespace: Option<&'a Value>,
}

/// `MatchResources`: the index of the candidate resource it matches, if it does.
/// `rules_required` is false for a binding's `matchResources`, whose rules (when it lists
/// none) leave the choice to the policy.
fn match_resources(m: &Value, r: &Request<'_>, rules_required: bool) -> Option<usize> {
    let name = r.call.name;
    if !matching::namespace_matches(
        m,
        &r.candidates[0],
        r.call.namespace,
        r.object,
        r.call.old,
        r.namespace,
    ) || !matching::object_matches(m, r.object, r.call.old)
    {
        return None;
    }
    if rules_match(m, "excludeResourceRules", r.op, name, r.candidates).is_some() {
        return None;
    }
    let listed = m
        .get("resourceRules")
        .and_then(Value::as_array)
        .is_some_and(|rules| !rules.is_empty());
    if !rules_required && !listed {
        return Some(0);
    }
    rules_match(m, "resourceRules", r.op, name, r.candidates)
}

/// Upstream's `ParamKind.String()`, as its errors print it.
fn param_kind_text(api_version: &str, kind: &str) -> String {
    format!("&ParamKind{{APIVersion:{api_version},Kind:{kind},}}")
}

impl ApiServer {
    /// The parameter objects a binding's `paramRef` selects, for a request in `namespace`;
    /// `Err` is a configuration error (upstream's `CollectParams`).
    fn collect_params(
        &self,
        param_kind: &(String, String),
        param_ref: &Value,
        namespace: &str,
    ) -> Result<Vec<Value>, String> {
        let (api_version, kind) = param_kind;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let def = self
            .registry()
            .by_kind(group, version, kind)
            .filter(|d| !d.is_create_only())
            .cloned()
            .ok_or_else(|| {
                format!(
                    "paramKind kind `{}` not known",
                    param_kind_text(api_version, kind)
                )
            })?;
        let text = |k: &str| param_ref.get(k).and_then(Value::as_str).unwrap_or("");
        let ref_namespace = text("namespace");
        let params_namespace = if def.namespaced {
            let ns = if ref_namespace.is_empty() {
                namespace
            } else {
                ref_namespace
            };
            if ns.is_empty() {
                return Err(
                    "cannot use namespaced paramRef in policy binding that matches \
                            cluster-scoped resources"
                        .into(),
                );
            }
            ns
        } else {
            if !ref_namespace.is_empty() {
                return Err(
                    "paramRef.namespace must not be provided for a cluster-scoped `paramKind`"
                        .into(),
                );
            }
            ""
        };
        let cache = self.caches.get(&def.storage_prefix());
        let name = text("name");
        let selector = param_ref.get("selector").filter(|s| !s.is_null());
        let found: Vec<Value> = if !name.is_empty() {
            if selector.is_some() {
                return Err("paramRef.name and paramRef.selector are mutually exclusive".into());
            }
            cache
                .get(&def.key(params_namespace, name))
                .map(|o| o.object())
                .into_iter()
                .collect()
        } else if let Some(sel) = selector {
            let sel = setpoint_api::selector::LabelSelector::from_label_selector_json(sel)
                .map_err(|e| e.to_string())?;
            let prefix =
                def.namespace_prefix((!params_namespace.is_empty()).then_some(params_namespace));
            let (objs, _) = cache.list(&prefix, &Filter::all());
            let empty = serde_json::Map::new();
            objs.iter()
                .map(|o| o.object())
                .filter(|o| {
                    let labels = o
                        .pointer("/metadata/labels")
                        .and_then(Value::as_object)
                        .unwrap_or(&empty);
                    sel.matches_map(labels)
                })
                .collect()
        } else {
            return Err("one of name or selector must be provided".into());
        };
        if found.is_empty() && text("parameterNotFoundAction") == "Deny" {
            return Err(
                "no params found for policy binding with `Deny` parameterNotFoundAction".into(),
            );
        }
        Ok(found
            .into_iter()
            .map(|o| crate::convert::from_storage(&def, o))
            .collect())
    }

    /// Runs the ValidatingAdmissionPolicies on a request whose object (storage form; `None`
    /// for deletes) has passed validation and mutation: the first denial as the request's
    /// error, else the warnings `Warn` bindings give.
    ///
    /// A policy matches the resource the client named, or with `matchPolicy: Equivalent`
    /// one serving the same objects under another version or group, and sees the object and
    /// old object as the version it matched shows them (a custom resource's converted by its
    /// CRD's conversion webhook when it has one), as upstream converts them to the matched
    /// kind.
    pub(crate) async fn validating_policies(
        &self,
        call: &Call<'_>,
        obj: Option<&Value>,
    ) -> Result<Vec<String>, ApiError> {
        // Policies never judge policies and bindings, so a bad one can always be fixed.
        if call.res.group == GROUP && matches!(call.res.plural.as_str(), POLICIES | BINDINGS) {
            return Ok(vec![]);
        }
        let policies = self.registration_objects(POLICIES);
        if policies.is_empty() {
            return Ok(vec![]);
        }
        let bindings = self.registration_objects(BINDINGS);
        if bindings.is_empty() {
            return Ok(vec![]);
        }
        let mut by_policy: HashMap<&str, Vec<&Value>> = HashMap::new();
        for b in &bindings {
            let policy = b
                .pointer("/spec/policyName")
                .and_then(Value::as_str)
                .unwrap_or("");
            by_policy.entry(policy).or_default().push(b);
        }
        let candidates = self.equivalents(call.res);
        let resources: Vec<Resource> = candidates
            .iter()
            .map(|d| crate::webhook::resource_of(d))
            .collect();
        let namespace = if call.res.namespaced && !call.namespace.is_empty() {
            self.cached_namespace(call.namespace)
        } else {
            None
        };
        let request = Request {
            op: Operation {
                operation: call.operation,
                subresource: call.subresource,
            },
            call,
            object: obj,
            candidates: &resources,
            namespace: namespace.as_ref(),
        };
        let mut outcome = Outcome::default();
        // Activations by the matched resource's index (objects converted to its version),
        // made when a binding first needs one; `Err` is a conversion that failed.
        let mut activations: HashMap<usize, Result<Arc<Activation>, String>> = HashMap::new();
        for policy_obj in &policies {
            let Some(policy_bindings) = by_policy.get(setpoint_api::meta::name(policy_obj)) else {
                continue;
            };
            let policy = compiled::compiled(policy_obj);
            let Some(matched) = match_resources(&policy.constraints, &request, true) else {
                continue;
            };
            let mut annotations: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for binding in policy_bindings {
                let Some(params) = self.binding_params(&policy, binding, &request, &mut outcome)
                else {
                    continue;
                };
                if let Entry::Vacant(slot) = activations.entry(matched) {
                    let made = self
                        .activation(
                            call,
                            obj,
                            &candidates[matched],
                            &resources,
                            matched,
                            &namespace,
                        )
                        .await;
                    slot.insert(made.map(Arc::new));
                }
                match &activations[&matched] {
                    Ok(activation) => run_binding(
                        &policy,
                        binding,
                        params,
                        activation,
                        &mut outcome,
                        &mut annotations,
                    ),
                    // Upstream reports a failed conversion as the binding's configuration
                    // error, so `failurePolicy` decides.
                    Err(e) => config_error(
                        &policy,
                        binding,
                        &mut outcome,
                        format!("failed to convert object version: {e}"),
                    ),
                }
            }
            for (key, values) in annotations {
                outcome
                    .annotations
                    .entry(format!("{}/{key}", policy.name))
                    .or_default()
                    .extend(values);
            }
        }
        for (key, values) in &outcome.annotations {
            let mut value = values.join(", ");
            if value.len() > MAX_ANNOTATION_VALUE {
                let mut cut = MAX_ANNOTATION_VALUE;
                while !value.is_char_boundary(cut) {
                    cut -= 1;
                }
                value.truncate(cut);
            }
            crate::audit::annotate(key, &value);
        }
        if let Some(d) = outcome.denials.into_iter().next() {
            return Err(denial_error(call, d));
        }
        Ok(outcome.warnings)
    }

    /// The variables every evaluation of a request against `def`'s version binds, with the
    /// objects as that version shows them (through the webhooks' conversion); `Err` is the
    /// conversion's error.
    async fn activation(
        &self,
        call: &Call<'_>,
        obj: Option<&Value>,
        def: &ResourceDef,
        resources: &[Resource],
        matched: usize,
        namespace: &Option<Value>,
    ) -> Result<Activation, String> {
        let (view, old_view) = self
            .as_matched(def, obj, call.old)
            .await
            .map_err(|e| e.message)?;
        let mut request = crate::webhook::review::request(
            "",
            &resources[matched],
            &resources[0],
            call.subresource,
            call.operation,
            call.namespace,
            call.name,
            None,
            None,
            call.dry_run,
            call.user,
            call.options,
        );
        if let Some(r) = request.as_object_mut() {
            // The objects are variables of their own; the request carries neither.
            r.remove("uid");
            r.remove("object");
            r.remove("oldObject");
        }
        Ok(Activation {
            object: view.unwrap_or(Value::Null),
            old_object: old_view.unwrap_or(Value::Null),
            request,
            namespace_object: namespace.clone().unwrap_or(Value::Null),
            authorizer: call.authorizer(self.authorizers.clone()),
        })
    }

    /// The parameters a binding of a matching policy is evaluated with, once each: the
    /// objects its `paramRef` selects, or one `None` (`params` null) without a `paramRef`.
    /// `None` when its `matchResources` do not match or its parameters cannot be had (a
    /// configuration error, recorded in `outcome` as the policy's `failurePolicy` says).
    fn binding_params(
        &self,
        policy: &Policy,
        binding: &Value,
        request: &Request<'_>,
        outcome: &mut Outcome,
    ) -> Option<Vec<Option<Value>>> {
        let spec = binding.get("spec").unwrap_or(&Value::Null);
        if let Some(m) = spec.get("matchResources").filter(|m| !m.is_null()) {
            match_resources(m, request, false)?;
        }
        match (
            &policy.param_kind,
            spec.get("paramRef").filter(|r| !r.is_null()),
        ) {
            (Some(kind), Some(param_ref)) => {
                match self.collect_params(kind, param_ref, request.call.namespace) {
                    Ok(found) => Some(found.into_iter().map(Some).collect()),
                    Err(e) => {
                        config_error(policy, binding, outcome, e);
                        None
                    }
                }
            }
            _ => Some(vec![None]),
        }
    }
}

/// A binding that cannot be evaluated (`e`): a denial under `failurePolicy: Fail`, else
/// logged and ignored.
fn config_error(policy: &Policy, binding: &Value, outcome: &mut Outcome, e: String) {
    let binding_name = setpoint_api::meta::name(binding);
    if policy.fails_closed {
        outcome.denials.push(Denial {
            policy: policy.name.clone(),
            binding: Some(binding_name.to_string()),
            message: format!("failed to configure binding: {e}"),
            reason: String::new(),
        });
    } else {
        tracing::warn!(policy = %policy.name, binding = %binding_name, error = %e, "admission policy binding misconfigured; ignored");
    }
}

/// One binding of a matching policy, evaluated once per parameter, with the decisions sent
/// where its actions say.
fn run_binding(
    policy: &Policy,
    binding: &Value,
    params: Vec<Option<Value>>,
    activation: &Activation,
    outcome: &mut Outcome,
    annotations: &mut BTreeMap<String, Vec<String>>,
) {
    let binding_name = setpoint_api::meta::name(binding).to_string();
    let spec = binding.get("spec").unwrap_or(&Value::Null);
    let actions: Vec<&str> = spec
        .get("validationActions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for param in params {
        let null = Value::Null;
        let (failures, notes) = evaluate(policy, activation, param.as_ref().unwrap_or(&null));
        for (index, Failure { message, reason }) in failures {
            for action in &actions {
                match *action {
                    "Deny" => outcome.denials.push(Denial {
                        policy: policy.name.clone(),
                        binding: Some(binding_name.clone()),
                        message: message.clone(),
                        reason: reason.clone(),
                    }),
                    "Warn" => outcome.warnings.push(format!(
                        "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {message}",
                        policy.name, binding_name
                    )),
                    "Audit" => {
                        let value = json!([{
                            "message": message,
                            "policy": policy.name,
                            "binding": binding_name,
                            "expressionIndex": index,
                            "validationActions": actions,
                        }]);
                        crate::audit::annotate(VALIDATION_FAILURE, &value.to_string());
                    }
                    _ => {}
                }
            }
        }
        for note in notes {
            match note {
                Ok((key, value)) => {
                    let values = annotations.entry(key).or_default();
                    if !values.contains(&value) {
                        values.push(value);
                    }
                }
                Err(message) if policy.fails_closed => outcome.denials.push(Denial {
                    policy: policy.name.clone(),
                    binding: Some(binding_name.clone()),
                    message,
                    reason: String::new(),
                }),
                Err(_) => {}
            }
        }
    }
}

/// One evaluation of `policy` with `params`: the failed validations by index, and the
/// audit annotations (`Err` for one that failed to evaluate). The evaluation has upstream's
/// runtime cost budget.
#[allow(clippy::type_complexity)]
fn evaluate(
    policy: &Policy,
    activation: &Activation,
    params: &Value,
) -> (Vec<(usize, Failure)>, Vec<Result<(String, String), String>>) {
    let mut budget = crate::cel::Budget::new(crate::cel::RUNTIME_COST_BUDGET);
    let mut variables = Value::Object(Default::default());
    let eval = |expr: &Expr, variables: &Value, budget: &mut crate::cel::Budget| {
        let vars: [(&str, &Value); 6] = [
            ("object", &activation.object),
            ("oldObject", &activation.old_object),
            ("request", &activation.request),
            ("namespaceObject", &activation.namespace_object),
            ("params", params),
            ("variables", variables),
        ];
        run(expr, &vars, &activation.authorizer, budget)
    };
    let error = |message: String| {
        (
            0,
            Failure {
                message,
                reason: String::new(),
            },
        )
    };
    // matchConditions: a false one skips the policy, and wins over errors.
    let mut condition_error = None;
    for (name, expr) in &policy.match_conditions {
        match eval(expr, &variables, &mut budget) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return (vec![], vec![]),
            Ok(other) => {
                condition_error.get_or_insert(format!(
                    "expression '{name}' resulted in error: expected a bool, got a {}",
                    other.type_of()
                ));
            }
            Err(e) => {
                condition_error
                    .get_or_insert(format!("expression '{name}' resulted in error: {e}"));
            }
        }
    }
    if let Some(e) = condition_error {
        return if policy.fails_closed {
            (vec![error(e)], vec![])
        } else {
            (vec![], vec![])
        };
    }
    // Variables in order, each seeing those before it; one that fails is left out, so an
    // expression that reads it fails in turn.
    for (name, expr) in &policy.variables {
        if let Some(v) = eval(expr, &variables, &mut budget)
            .ok()
            .and_then(|v| to_json(&v))
        {
            variables[name.as_str()] = v;
        }
    }
    let mut failures = Vec::new();
    for (i, v) in policy.validations.iter().enumerate() {
        let failed = match eval(&v.expr, &variables, &mut budget) {
            Ok(cel::Value::Bool(true)) => continue,
            Ok(cel::Value::Bool(false)) => Ok(()),
            Ok(other) => Err(format!(
                "expression '{}' resulted in error: expected a bool, got a {}",
                v.expr.text,
                other.type_of()
            )),
            Err(e) => Err(format!(
                "expression '{}' resulted in error: {e}",
                v.expr.text
            )),
        };
        match failed {
            Ok(()) => {
                // messageExpression's text, unless it fails or is blank or spans lines.
                let shown = v.message_expression.as_ref().and_then(|m| {
                    match eval(m, &variables, &mut budget) {
                        Ok(cel::Value::String(s)) => Some(s.to_string())
                            .filter(|s| !s.trim().is_empty() && !s.contains('\n')),
                        _ => None,
                    }
                });
                let message = shown
                    .or_else(|| Some(v.message.clone()).filter(|m| !m.is_empty()))
                    .unwrap_or_else(|| format!("failed expression: {}", v.expr.text.trim()));
                failures.push((
                    i,
                    Failure {
                        message,
                        reason: v.reason.clone(),
                    },
                ));
            }
            Err(message) if policy.fails_closed => failures.push((
                i,
                Failure {
                    message,
                    reason: String::new(),
                },
            )),
            Err(_) => {}
        }
    }
    let mut notes = Vec::new();
    for a in &policy.audit_annotations {
        match eval(&a.value, &variables, &mut budget) {
            Ok(cel::Value::String(s)) => notes.push(Ok((a.key.clone(), s.to_string()))),
            Ok(cel::Value::Null) => {}
            Ok(other) => notes.push(Err(format!(
                "valueExpression '{}' resulted in error: expected a string, got a {}",
                a.value.text,
                other.type_of()
            ))),
            Err(e) => notes.push(Err(format!(
                "valueExpression '{}' resulted in error: {e}",
                a.value.text
            ))),
        }
    }
    (failures, notes)
}

/// The request's error for a denial: `<resource> "<name>" is forbidden: ValidatingAdmission
/// Policy '<p>' with binding '<b>' denied request: <message>`, with the code of its reason.
fn denial_error(call: &Call<'_>, d: Denial) -> ApiError {
    let message = match &d.binding {
        Some(b) => format!(
            "ValidatingAdmissionPolicy '{}' with binding '{b}' denied request: {}",
            d.policy, d.message
        ),
        None => format!(
            "ValidatingAdmissionPolicy '{}' denied request: {}",
            d.policy, d.message
        ),
    };
    let mut err = ApiError::forbidden(&call.res.group_resource(), call.name, &message);
    let reason = if d.reason.is_empty() {
        "Invalid".to_string()
    } else {
        d.reason
    };
    err.code = match reason.as_str() {
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    err.reason = reason;
    if let Some(details) = err.details.as_mut() {
        details.causes.push(Cause::new("", "", message));
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: Value) -> Policy {
        Policy::compile(&json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
    }

    fn activation(replicas: i64) -> Activation {
        Activation {
            object: json!({"metadata": {"name": "d"}, "spec": {"replicas": replicas}}),
            old_object: Value::Null,
            request: json!({"operation": "CREATE"}),
            namespace_object: json!({"metadata": {"name": "ns", "labels": {"env": "prod"}}}),
            authorizer: crate::cel::authz::Bindings::new(
                Arc::new(crate::authorization::Authorizers::default()),
                Arc::new(crate::authentication::UserInfo::authenticated("u", vec![])),
                crate::cel::authz::ResourceAttributes {
                    group: "apps".into(),
                    resource: "deployments".into(),
                    name: "d".into(),
                    ..Default::default()
                },
            ),
        }
    }

    fn messages(failures: &[(usize, Failure)]) -> Vec<(usize, &str, &str)> {
        failures
            .iter()
            .map(|(i, f)| (*i, f.message.as_str(), f.reason.as_str()))
            .collect()
    }

    #[test]
    fn validations_use_params_variables_and_message_expressions() {
        let p = policy(json!({
        "variables": [{"name": "limit", "expression": "int(params.data.max)"},
                      {"name": "level", "expression": "variables.limit > 5 ? 'high' : 'low'"}],
        "validations": [
            {"expression": "object.spec.replicas <= variables.limit",
             "messageExpression": "'over ' + string(variables.limit)", "reason": "Forbidden"},
            {"expression": "variables.level == 'high'", "message": "a low limit"},
            {"expression": "namespaceObject.metadata.labels.env == 'dev'"},
        ]}));
        let params = json!({"data": {"max": "3"}});
        let (failures, _) = evaluate(&p, &activation(2), &params);
        assert_eq!(
            messages(&failures),
            [
                (1, "a low limit", "Invalid"),
                (
                    2,
                    "failed expression: namespaceObject.metadata.labels.env == 'dev'",
                    "Invalid"
                )
            ]
        );
        let (failures, _) = evaluate(&p, &activation(7), &params);
        assert_eq!(
            messages(&failures)[..2],
            [(0, "over 3", "Forbidden"), (1, "a low limit", "Invalid")]
        );
    }

    #[test]
    fn errors_follow_the_failure_policy_and_conditions_skip() {
        let spec = |failure: &str| {
            json!({"failurePolicy": failure,
                   "validations": [{"expression": "object.spec.nope > 1"}, {"expression": "1 +"}]})
        };
        let (failures, _) = evaluate(&policy(spec("Fail")), &activation(1), &Value::Null);
        assert_eq!(failures.len(), 2);
        assert!(failures[0]
            .1
            .message
            .starts_with("expression 'object.spec.nope > 1' resulted in error: "));
        assert!(
            failures[1].1.message.contains("compilation failed"),
            "{}",
            failures[1].1.message
        );
        let (failures, _) = evaluate(&policy(spec("Ignore")), &activation(1), &Value::Null);
        assert!(failures.is_empty());
        let skipped = policy(json!({
            "matchConditions": [{"name": "big", "expression": "object.spec.replicas > 5"}],
            "validations": [{"expression": "false"}]}));
        assert!(evaluate(&skipped, &activation(1), &Value::Null)
            .0
            .is_empty());
        assert_eq!(evaluate(&skipped, &activation(9), &Value::Null).0.len(), 1);
    }

    #[test]
    fn validations_ask_the_authorizer_about_the_request_user() {
        let p = policy(json!({"validations": [
            {"expression": "authorizer.requestResource.check('update').allowed()",
             "messageExpression": "authorizer.requestResource.check('update').reason()"},
            {"expression": "!authorizer.path('/healthz').check('get').allowed()"}]}));
        // `u` holds no rules: no opinion is no allow, and carries no reason.
        let (failures, _) = evaluate(&p, &activation(1), &Value::Null);
        assert_eq!(
            messages(&failures),
            [(
                0,
                "failed expression: authorizer.requestResource.check('update').allowed()",
                "Invalid"
            )]
        );
        // The server's own writes may do anything.
        let mut internal = activation(1);
        internal.authorizer = crate::cel::authz::Bindings::new(
            Arc::new(crate::authorization::Authorizers::default()),
            Arc::new(crate::authentication::UserInfo::internal()),
            Default::default(),
        );
        let (failures, _) = evaluate(&p, &internal, &Value::Null);
        assert_eq!(messages(&failures)[0].0, 1);
        assert_eq!(failures.len(), 1);
    }

    #[test]
    fn audit_annotations_publish_strings_and_skip_null() {
        let p = policy(json!({"auditAnnotations": [
            {"key": "replicas", "valueExpression": "string(object.spec.replicas)"},
            {"key": "none", "valueExpression": "null"},
            {"key": "bad", "valueExpression": "object.spec.replicas"}]}));
        let (_, notes) = evaluate(&p, &activation(4), &Value::Null);
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0], Ok(("replicas".to_string(), "4".to_string())));
        assert!(notes[1]
            .as_ref()
            .is_err_and(|e| e.contains("expected a string")));
    }

    #[test]
    fn rules_honour_resource_names_exclusions_and_exact() {
        let deployments = Resource {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            kind: "Deployment".into(),
            namespaced: true,
        };
        let rule = |names: Value| {
            json!({"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
                   "resources": ["deployments"], "resourceNames": names})
        };
        let create = Operation {
            operation: "CREATE",
            subresource: "",
        };
        let m = json!({"resourceRules": [rule(json!(["a"]))]});
        let candidates = [deployments];
        assert_eq!(
            rules_match(&m, "resourceRules", create, "a", &candidates),
            Some(0)
        );
        assert_eq!(
            rules_match(&m, "resourceRules", create, "b", &candidates),
            None
        );
        let any = json!({"resourceRules": [rule(json!([]))]});
        assert_eq!(
            rules_match(&any, "resourceRules", create, "b", &candidates),
            Some(0)
        );
    }

    #[test]
    fn exact_matches_only_the_requested_version_and_equivalent_names_the_one_matched() {
        let crontabs = |version: &str| Resource {
            group: "stable.example.com".into(),
            version: version.into(),
            resource: "crontabs".into(),
            kind: "CronTab".into(),
            namespaced: true,
        };
        let rules = json!([{"operations": ["CREATE"], "apiGroups": ["stable.example.com"],
                            "apiVersions": ["v1"], "resources": ["crontabs"]}]);
        let exact = json!({"matchPolicy": "Exact", "resourceRules": rules});
        let equivalent = json!({"matchPolicy": "Equivalent", "resourceRules": rules});
        let defaulted = json!({"resourceRules": rules});
        let create = Operation {
            operation: "CREATE",
            subresource: "",
        };
        // Written through v2 (the request's resource comes first, then its equivalents).
        let through_v2 = [crontabs("v2"), crontabs("v1")];
        assert_eq!(
            rules_match(&exact, "resourceRules", create, "a", &through_v2),
            None
        );
        assert_eq!(
            rules_match(&equivalent, "resourceRules", create, "a", &through_v2),
            Some(1)
        );
        assert_eq!(
            rules_match(&defaulted, "resourceRules", create, "a", &through_v2),
            Some(1)
        );
        // Written through v1, whatever version it is stored in.
        let through_v1 = [crontabs("v1"), crontabs("v2")];
        for m in [&exact, &equivalent] {
            assert_eq!(
                rules_match(m, "resourceRules", create, "a", &through_v1),
                Some(0)
            );
        }
        // An exclusion for v1 only leaves a write through v2 to an Exact policy.
        let excluded = json!({"matchPolicy": "Exact", "excludeResourceRules": rules});
        assert_eq!(
            rules_match(&excluded, "excludeResourceRules", create, "a", &through_v2),
            None
        );
    }

    #[test]
    fn denials_carry_upstream_wording_and_the_code_of_their_reason() {
        let def = crate::registry::Registry::builtin()
            .get("apps", "v1", "deployments")
            .unwrap()
            .clone();
        let options = json!({});
        let call = Call {
            res: &def,
            subresource: "",
            operation: "CREATE",
            namespace: "ns",
            name: "web",
            old: None,
            dry_run: false,
            user: None,
            options: &options,
        };
        let denial = |reason: &str| Denial {
            policy: "p".into(),
            binding: Some("b".into()),
            message: "too many".into(),
            reason: reason.into(),
        };
        let e = denial_error(&call, denial(""));
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            "deployments.apps \"web\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied request: too many"
        );
        assert_eq!(denial_error(&call, denial("Forbidden")).code, 403);
        assert_eq!(denial_error(&call, denial("Unauthorized")).code, 401);
    }
}
