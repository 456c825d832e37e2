//! Admission webhooks (`admissionregistration.k8s.io/v1` MutatingWebhookConfiguration and
//! ValidatingWebhookConfiguration).
//!
//! The write paths in `objects` call [`ApiServer::mutating_webhooks`] after the built-in
//! mutating admission steps and before validation, and [`ApiServer::validating_webhooks`]
//! after validation and the built-in validating steps (before `ResourceQuota`, as upstream
//! orders its plugins). Mutating webhooks run one after another, each seeing the previous
//! one's patch, and those with `reinvocationPolicy: IfNeeded` run once more when a later
//! webhook changed the object; validating webhooks run in parallel. Configurations are read
//! from the watch cache, so a write pays no store round trip for them.
//!
//! - [`client`]: the HTTPS call to a `url` or a Service (shared with other webhook kinds);
//! - [`matching`]: rules, `matchPolicy`, namespace and object selectors (pure);
//! - [`conditions`]: `matchConditions` in CEL (pure);
//! - [`review`]: the `AdmissionReview` request and the checks on its answer (pure).

pub(crate) mod client;
mod conditions;
pub(crate) mod matching;
pub(crate) mod review;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use setpoint_api::status::ApiError;
use setpoint_api::strconv::quote;

use self::matching::{Operation, Resource};
use crate::authentication::UserInfo;
use crate::registry::ResourceDef;
use crate::state::ApiServer;

const GROUP: &str = "admissionregistration.k8s.io";

/// The request a write puts to the webhooks.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    /// The resource the client named (objects are passed in the storage form of its
    /// resource).
    pub res: &'a ResourceDef,
    /// `""`, or the subresource written (`status`).
    pub subresource: &'a str,
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// The object before the write (updates and deletes), in storage form.
    pub old: Option<&'a Value>,
    pub dry_run: bool,
    pub user: Option<&'a UserInfo>,
    /// The write's options as the request's `options` (`CreateOptions`, `UpdateOptions`,
    /// `PatchOptions` or `DeleteOptions`).
    pub options: &'a Value,
}

impl Call<'_> {
    /// The CEL `authorizer` and `authorizer.requestResource` of this request, for admission
    /// policies and webhooks' `matchConditions` alike: checks are asked of `authorizers` as
    /// the request's user (the server's own writes are `system:apiserver`'s), and the request
    /// resource is the one the client named, with its subresource, namespace and name.
    pub(crate) fn authorizer(
        &self,
        authorizers: Arc<crate::authorization::Authorizers>,
    ) -> crate::cel::authz::Bindings {
        let user = Arc::new(self.user.cloned().unwrap_or_else(UserInfo::internal));
        let request_resource = crate::cel::authz::ResourceAttributes {
            group: self.res.group.clone(),
            resource: self.res.plural.clone(),
            subresource: self.subresource.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
        };
        crate::cel::authz::Bindings::new(authorizers, user, request_resource)
    }
}

/// The `options` of a request: the options kind with the fields webhooks read.
pub(crate) fn options(kind: &str, dry_run: bool, field_manager: Option<&str>) -> Value {
    let mut o = json!({"apiVersion": "meta.k8s.io/v1", "kind": kind});
    if dry_run {
        o["dryRun"] = json!(["All"]);
    }
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        o["fieldManager"] = json!(m);
    }
    o
}

pub(crate) fn resource_of(def: &ResourceDef) -> Resource {
    Resource {
        group: def.group.clone(),
        version: def.version.clone(),
        resource: def.plural.clone(),
        kind: def.kind.clone(),
        namespaced: def.namespaced,
    }
}

/// One webhook of a configuration, in the order upstream calls them: configurations by
/// name, then their webhooks in order.
struct Hook {
    spec: Value,
}

impl Hook {
    fn name(&self) -> &str {
        self.spec.get("name").and_then(Value::as_str).unwrap_or("")
    }
    fn text(&self, key: &str) -> &str {
        self.spec.get(key).and_then(Value::as_str).unwrap_or("")
    }
    fn fails_open(&self) -> bool {
        self.text("failurePolicy") == "Ignore"
    }
    fn timeout(&self) -> Duration {
        let secs = self
            .spec
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10);
        Duration::from_secs(secs.clamp(1, 30))
    }
}

/// What calling one webhook came to.
enum Called {
    /// The webhook did not apply, or failed open.
    Skipped,
    /// It allowed the request; for mutating webhooks, the object as it left it.
    Allowed {
        object: Option<Value>,
        warnings: Vec<String>,
    },
}

impl ApiServer {
    /// The objects of a built-in admissionregistration resource, from the watch cache, by
    /// name (the order upstream calls configurations and evaluates policies in: they are
    /// cluster-scoped, so key order is name order). Parsed once per change of the cache, as
    /// every write reads them.
    pub(crate) fn registration_objects(&self, plural: &str) -> crate::watchcache::Parsed {
        let Some(def) = self.registry().get(GROUP, "v1", plural).cloned() else {
            return Default::default();
        };
        let cache = self.caches.get(&def.storage_prefix());
        cache.parsed(&def.namespace_prefix(None))
    }

    /// The webhooks of every configuration of `plural`, from the watch cache.
    fn configured_webhooks(&self, plural: &str) -> Vec<Hook> {
        self.registration_objects(plural)
            .iter()
            .flat_map(|c| match c.get("webhooks") {
                Some(Value::Array(hooks)) => hooks.clone(),
                _ => vec![],
            })
            .map(|spec| Hook { spec })
            .collect()
    }

    /// The request's resource and then those serving the same objects under another group
    /// or version (what `matchPolicy: Equivalent` also matches).
    pub(crate) fn equivalents(&self, res: &ResourceDef) -> Vec<Arc<ResourceDef>> {
        let registry = self.registry();
        let mut out = vec![Arc::new(res.clone())];
        let prefix = res.storage_prefix();
        out.extend(
            registry
                .all()
                .iter()
                .filter(|d| {
                    d.storage_prefix() == prefix
                        && !d.is_create_only()
                        && (d.group != res.group
                            || d.version != res.version
                            || d.plural != res.plural)
                })
                .cloned(),
        );
        out
    }

    /// The namespace `name` from the watch cache (for `namespaceSelector`).
    pub(crate) fn cached_namespace(&self, name: &str) -> Option<Value> {
        let def = self.registry().get("", "v1", "namespaces")?.clone();
        let key = def.key("", name);
        self.caches
            .get(&def.storage_prefix())
            .get(&key)
            .map(|o| o.object())
    }

    /// The object and old object of a request (storage form) as `def`, the resource a
    /// webhook matched, shows them: a custom resource's through its conversion webhook when
    /// it has one (both in one review), as upstream converts them to the webhook's version.
    /// ValidatingAdmissionPolicies see the version they matched through it too.
    pub(crate) async fn as_matched(
        &self,
        def: &ResourceDef,
        object: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<(Option<Value>, Option<Value>), ApiError> {
        if def.custom.is_none() {
            let show = |o: &Value| crate::convert::from_storage(def, o.clone());
            return Ok((object.map(show), old.map(show)));
        }
        let given: Vec<Value> = [object, old].into_iter().flatten().cloned().collect();
        let mut shown = self.custom_from_storage(def, given).await?.into_iter();
        let view = object.and_then(|_| shown.next());
        let old_view = old.and_then(|_| shown.next());
        Ok((view, old_view))
    }

    /// An object a mutating webhook patched in `def`'s version, back in storage form.
    async fn as_stored(&self, def: &ResourceDef, patched: Value) -> Result<Value, ApiError> {
        if def.custom.is_none() {
            return Ok(crate::convert::to_storage(def, patched));
        }
        self.custom_to_storage(def, patched).await
    }

    /// Calls one webhook if it applies to the request on `object` (storage form).
    async fn call_one(
        &self,
        hook: &Hook,
        call: &Call<'_>,
        candidates: &[Arc<ResourceDef>],
        object: Option<&Value>,
        mutating: bool,
    ) -> Result<Called, ApiError> {
        let resources: Vec<Resource> = candidates.iter().map(|d| resource_of(d)).collect();
        let op = Operation {
            operation: call.operation,
            subresource: call.subresource,
        };
        let Some(matched) = matching::matched_resource(&hook.spec, op, &resources) else {
            return Ok(Called::Skipped);
        };
        let ns_object = if call.res.namespaced && !call.namespace.is_empty() {
            self.cached_namespace(call.namespace)
        } else {
            None
        };
        if !matching::namespace_matches(
            &hook.spec,
            &resources[0],
            call.namespace,
            object,
            call.old,
            ns_object.as_ref(),
        ) || !matching::object_matches(&hook.spec, object, call.old)
        {
            return Ok(Called::Skipped);
        }
        let def = &candidates[matched];
        let (view, old_view) = self.as_matched(def, object, call.old).await?;
        let uid = uuid::Uuid::new_v4().to_string();
        let request = review::request(
            &uid,
            &resources[matched],
            &resources[0],
            call.subresource,
            call.operation,
            call.namespace,
            call.name,
            view.as_ref(),
            old_view.as_ref(),
            call.dry_run,
            call.user,
            call.options,
        );
        let name = hook.name();
        let failed = |reason: String| -> Result<Called, ApiError> {
            if hook.fails_open() {
                tracing::warn!(webhook = name, %reason, "failed calling webhook, failing open");
                Ok(Called::Skipped)
            } else {
                tracing::warn!(webhook = name, %reason, "failed calling webhook, failing closed");
                Err(ApiError::internal(format!(
                    "failed calling webhook {}: {reason}",
                    quote(name)
                )))
            }
        };
        let conditions: &[Value] = hook
            .spec
            .get("matchConditions")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if !conditions.is_empty() {
            let null = Value::Null;
            match conditions::evaluate(
                conditions,
                view.as_ref().unwrap_or(&null),
                old_view.as_ref().unwrap_or(&null),
                &request,
                &call.authorizer(self.authorizers.clone()),
            ) {
                conditions::Outcome::Call => {}
                conditions::Outcome::Skip => return Ok(Called::Skipped),
                conditions::Outcome::Error(e) => {
                    if hook.fails_open() {
                        tracing::warn!(webhook = name, error = %e, "match conditions failed, failing open");
                        return Ok(Called::Skipped);
                    }
                    return Err(ApiError::forbidden(
                        &call.res.group_resource(),
                        call.name,
                        &format!("failed calling webhook {}: {e}", quote(name)),
                    ));
                }
            }
        }
        if call.dry_run && !matches!(hook.text("sideEffects"), "None" | "NoneOnDryRun") {
            return Err(ApiError::bad_request(format!(
                "admission webhook {} does not support dry run",
                quote(name)
            )));
        }
        let version = review::version_for(&hook.spec);
        let body = serde_json::to_vec(&review::review(request, version))
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let answer = match self
            .call_webhook(
                hook.spec.get("clientConfig").unwrap_or(&Value::Null),
                body.into(),
                hook.timeout(),
            )
            .await
        {
            Ok(answer) => answer,
            Err(e) => return failed(e.to_string()),
        };
        let verdict = match review::verdict(&answer, &uid, mutating, version) {
            Ok(v) => v,
            Err(e) => return failed(client::CallError::InvalidResponse(e).to_string()),
        };
        for (key, value) in &verdict.audit_annotations {
            // Upstream records these in the audit event under `<webhook>/<key>`.
            crate::audit::annotate(&format!("{name}/{key}"), value);
        }
        if !verdict.allowed {
            return Err(review::denial(name, &verdict.status));
        }
        let object = match (verdict.patch, view) {
            (Some(ops), Some(view)) => {
                let patched = crate::patch::json_patch(&view, &ops)
                    .map_err(|e| ApiError::internal(format!("JSON Patch: {}", e.message)))?;
                Some(self.as_stored(def, patched).await?)
            }
            _ => None,
        };
        Ok(Called::Allowed {
            object,
            warnings: verdict.warnings,
        })
    }

    /// Calls one mutating webhook and applies its patch to `obj`; says whether it was
    /// called and whether it changed the object.
    async fn mutate_once(
        &self,
        hook: &Hook,
        call: &Call<'_>,
        candidates: &[Arc<ResourceDef>],
        obj: &mut Option<&mut Value>,
        warnings: &mut Vec<String>,
    ) -> Result<(bool, bool), ApiError> {
        let current = obj.as_deref().cloned();
        match self
            .call_one(hook, call, candidates, current.as_ref(), true)
            .await?
        {
            Called::Skipped => Ok((false, false)),
            Called::Allowed {
                object,
                warnings: w,
            } => {
                warnings.extend(w);
                match (object, obj.as_deref_mut()) {
                    (Some(new), Some(target)) if *target != new => {
                        *target = new;
                        Ok((true, true))
                    }
                    _ => Ok((true, false)),
                }
            }
        }
    }

    /// The mutating webhooks, in order, on `obj` (storage form; `None` for deletes): applies
    /// their patches and returns their warnings.
    pub(crate) async fn mutating_webhooks(
        &self,
        call: &Call<'_>,
        obj: Option<&mut Value>,
    ) -> Result<Vec<String>, ApiError> {
        let hooks = self.configured_webhooks("mutatingwebhookconfigurations");
        if hooks.is_empty() {
            return Ok(vec![]);
        }
        let candidates = self.equivalents(call.res);
        let mut obj = obj;
        let mut warnings = Vec::new();
        // How many changes the object had when each `IfNeeded` webhook saw it.
        let mut changes = 0usize;
        let mut seen_at: Vec<(usize, usize)> = Vec::new();
        for (i, hook) in hooks.iter().enumerate() {
            let (called, changed) = self
                .mutate_once(hook, call, &candidates, &mut obj, &mut warnings)
                .await?;
            changes += usize::from(changed);
            if called && hook.text("reinvocationPolicy") == "IfNeeded" {
                seen_at.push((i, changes));
            }
        }
        // Reinvocation: once, for the IfNeeded webhooks whose view of the object a later
        // webhook changed.
        for (i, seen) in seen_at {
            if changes > seen {
                self.mutate_once(&hooks[i], call, &candidates, &mut obj, &mut warnings)
                    .await?;
            }
        }
        Ok(warnings)
    }

    /// Validating admission on `obj` (storage form; `None` for deletes): the
    /// ValidatingAdmissionPolicies first, as upstream's plugin order has them, then the
    /// validating webhooks in parallel. The first refusal or failure (in configuration
    /// order), else the warnings of both.
    pub(crate) async fn validating_webhooks(
        &self,
        call: &Call<'_>,
        obj: Option<&Value>,
    ) -> Result<Vec<String>, ApiError> {
        let mut warnings = self.validating_policies(call, obj).await?;
        let hooks = self.configured_webhooks("validatingwebhookconfigurations");
        if hooks.is_empty() {
            return Ok(warnings);
        }
        let candidates = self.equivalents(call.res);
        let results = futures::future::join_all(
            hooks
                .iter()
                .map(|h| self.call_one(h, call, &candidates, obj, false)),
        )
        .await;
        for r in results {
            if let Called::Allowed { warnings: w, .. } = r? {
                warnings.extend(w);
            }
        }
        Ok(warnings)
    }
}
