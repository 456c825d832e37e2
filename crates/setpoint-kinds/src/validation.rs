//! Validation of built-in kinds (422 causes with Kubernetes' field paths and wording), type
//! checking against the k8s-openapi types, and unknown-field detection for `fieldValidation`.
//!
//! [`validate`] expects the object after defaulting ([`crate::defaults::apply`]) and, for Jobs,
//! after [`crate::defaults::job_selector`], the same order the Kubernetes API server uses. The
//! rules are the ones kubectl users meet most; each cites upstream's message text so that error
//! output reads the same.
//!
//! Type errors (a string where an integer belongs) are found by decoding into the k8s-openapi
//! type. serde_json stops at the first error and reports only a line, so the object is rendered
//! with one value per line, the line mapped back to a field path, the bad value removed and the
//! decode retried, which yields one cause per bad field.
//!
//! This file holds the public entry points and the dispatch by kind; the rules live in one file
//! per concern: `meta` (object metadata), `fields` (shared field helpers and rules),
//! `quantity`, `pod` and `container`, `apps` (workloads), `batch`, `service`, `config`
//! (ConfigMaps and Secrets), `autoscaling`, and `typed` (typed decoding: unknown fields and
//! type errors).

mod admissionregistration;
mod apps;
mod autoscaling;
mod batch;
pub mod certificates;
mod config;
mod container;
mod discovery;
mod fields;
mod meta;
mod node;
mod pod;
mod policy;
mod quantity;
mod rbac;
mod service;
mod storage;
#[cfg(test)]
mod testutil;
mod typed;

// APIServices of the aggregation layer.
mod apiregistration;

use serde_json::{json, Value};
use setpoint_api::Cause;

use self::apps::{daemon_set, deployment, replica_set, replication_controller, stateful_set};
use self::autoscaling::hpa;
use self::batch::{cron_job, job};
use self::config::{config_map, secret};
use self::fields::{arr, at, int, non_negative, qualified_name};
use self::pod::{pod, pod_template};
use self::service::service;

pub use self::meta::{name_rule, validate_object_meta, validate_object_meta_update, NameRule};
pub use self::policy::UNHEALTHY_POD_EVICTION_POLICIES;
pub use self::quantity::parse_quantity;

/// Validates an object of this kind on create (`old` = None) or update; empty means valid.
pub fn validate(
    group: &str,
    version: &str,
    kind: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Vec<Cause> {
    validate_with_type_errors(
        group,
        kind,
        obj,
        old,
        type_errors(group, version, kind, obj),
    )
}

/// What one typed decode of an object finds: values of the wrong type, and unknown fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeCheck {
    /// Values whose JSON type does not fit the schema, as `FieldValueInvalid` causes (what
    /// [`type_errors`] returns).
    pub type_errors: Vec<Cause>,
    /// Paths as [`unknown_fields`] reports them.
    pub unknown: Vec<String>,
    /// Where every field the type does not know is, `null` ones included (which
    /// [`TypeCheck::unknown`] does not report): what [`TypeCheck::drop_unknown`] removes.
    pub unknown_at: Vec<FieldPath>,
}

impl TypeCheck {
    /// Removes the fields the type does not know from `obj` (the object this check decoded), as
    /// Kubernetes does by decoding a built-in kind into its Go type: they are never stored.
    pub fn drop_unknown(&self, obj: &mut Value) {
        for path in &self.unknown_at {
            path.remove_from(obj);
        }
    }
}

/// The location of a field in an object: keys and array indices from the top.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(Vec<typed::Seg>);

impl FieldPath {
    /// Removes the field at this path from `obj`, if it is there.
    fn remove_from(&self, obj: &mut Value) {
        let Some((typed::Seg::Key(last), parent)) = self.0.split_last() else {
            return;
        };
        let mut cur = obj;
        for seg in parent {
            let next = match seg {
                typed::Seg::Key(k) => cur.get_mut(k.as_str()),
                typed::Seg::Index(i) => cur.get_mut(*i),
            };
            match next {
                Some(v) => cur = v,
                None => return,
            }
        }
        if let Some(map) = cur.as_object_mut() {
            map.remove(last.as_str());
        }
    }
}

/// Decodes `obj` into its kind's type once and reports both type errors and unknown fields,
/// for callers that need both (a write checks the client's body for both, then validates the
/// defaulted object with [`validate_with_type_errors`] without decoding again).
pub fn check_types(group: &str, version: &str, kind: &str, obj: &Value) -> TypeCheck {
    let Some(decode) = typed::decoder(group, version, kind) else {
        return TypeCheck::default();
    };
    let decoded = typed::decode(decode, obj);
    TypeCheck {
        type_errors: decoded.errors,
        unknown: decoded.unknown,
        unknown_at: decoded.unknown_at.into_iter().map(FieldPath).collect(),
    }
}

/// [`validate`] with the type errors already known (from [`check_types`]).
pub fn validate_with_type_errors(
    group: &str,
    kind: &str,
    obj: &Value,
    old: Option<&Value>,
    type_errors: Vec<Cause>,
) -> Vec<Cause> {
    let mut typed = type_errors;
    typed.retain(|c| !checked_by_rules(group, kind, c));
    let mut errs = validate_object_meta(obj, name_rule(group, kind));
    if let Some(old) = old {
        errs.extend(validate_object_meta_update(obj, old));
    }
    let e = &mut errs;
    match (group, kind) {
        ("", "Pod") => pod(e, obj, old),
        ("", "PodTemplate") => pod_template(e, at(obj, "template"), "template"),
        ("", "ReplicationController") => replication_controller(e, obj),
        ("", "Service") => service(e, obj, old),
        ("", "Namespace") => {
            for f in arr(at(obj, "spec"), "finalizers") {
                qualified_name(e, f.as_str().unwrap_or(""), "spec.finalizers");
            }
        }
        ("", "Node") => node::node(e, obj, old),
        ("", "ConfigMap") => config_map(e, obj, old),
        ("", "PersistentVolume") => storage::persistent_volume(e, obj, old),
        ("", "PersistentVolumeClaim") => storage::persistent_volume_claim(e, obj, old),
        ("storage.k8s.io", "StorageClass") => storage::storage_class(e, obj, old),
        ("", "Secret") => secret(e, obj, old),
        ("apps", "Deployment") => deployment(e, obj, old),
        ("apps", "ReplicaSet") => replica_set(e, obj, old),
        ("apps", "StatefulSet") => stateful_set(e, obj, old),
        ("apps", "DaemonSet") => daemon_set(e, obj, old),
        ("apps", "ControllerRevision") => {
            if at(obj, "data").is_null() {
                e.push(Cause::required("data", "data is mandatory"));
            }
            non_negative(e, obj, "revision", "revision");
        }
        ("batch", "Job") => job(e, obj, old),
        ("batch", "CronJob") => cron_job(e, obj, old),
        ("policy", "PodDisruptionBudget") => policy::pod_disruption_budget(e, obj),
        ("autoscaling", "HorizontalPodAutoscaler") => hpa(e, obj),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            admissionregistration::policy::policy(e, obj)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            admissionregistration::policy::binding(e, obj)
        }
        ("rbac.authorization.k8s.io", "Role") => rbac::role(e, obj),
        ("rbac.authorization.k8s.io", "ClusterRole") => rbac::cluster_role(e, obj),
        ("rbac.authorization.k8s.io", "RoleBinding") => rbac::role_binding(e, obj, old),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            rbac::cluster_role_binding(e, obj, old)
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            certificates::csr(e, obj, old, certificates::parse_request)
        }
        ("discovery.k8s.io", "EndpointSlice") => discovery::endpoint_slice(e, obj, old),
        ("apiregistration.k8s.io", "APIService") => apiregistration::api_service(e, obj),
        ("admissionregistration.k8s.io", "MutatingWebhookConfiguration") => {
            admissionregistration::webhook_configuration(e, obj, true)
        }
        ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration") => {
            admissionregistration::webhook_configuration(e, obj, false)
        }
        ("coordination.k8s.io", "Lease") => {
            let spec = at(obj, "spec");
            if let Some(d) = int(spec, "leaseDurationSeconds") {
                if d <= 0 {
                    e.push(Cause::invalid(
                        "spec.leaseDurationSeconds",
                        &json!(d),
                        "must be greater than 0",
                    ));
                }
            }
            non_negative(e, spec, "leaseTransitions", "spec.leaseTransitions");
        }
        _ => {}
    }
    // A value of the wrong type was already reported; rules that then misread it (an "empty"
    // selector that is really a string) would only add noise.
    let shadowed = |field: &str| {
        typed.iter().any(|t| {
            field
                .strip_prefix(t.field.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        })
    };
    errs.retain(|c| !shadowed(&c.field));
    typed.extend(errs);
    typed
}

/// Whether a type error is one the kind's rules report themselves, with Kubernetes' paths and
/// words: base64 byte fields (`data[key]` of a Secret, `binaryData[key]` of a ConfigMap, but not
/// ConfigMap `data`), whose decoder reports are dropped in favour of the rules'.
pub fn checked_by_rules(group: &str, kind: &str, type_error: &Cause) -> bool {
    let byte_field = match (group, kind) {
        ("", "Secret") => "data.",
        ("", "ConfigMap") => "binaryData.",
        _ => return false,
    };
    type_error.field.starts_with(byte_field)
}

/// Paths of fields in `obj` that the kind's schema does not know, as `spec.foo` or
/// `spec.template.spec.containers[0].imagee` (what `unknown field "…"` names). Empty for kinds
/// without a typed schema here (custom resources).
///
/// Found as the keys the k8s-openapi type's decoder passes over. `null` values are skipped
/// (known or not, they set nothing), as are values that failed to decode (those are type
/// errors, not unknown).
pub fn unknown_fields(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<String> {
    match typed::decoder(group, version, kind) {
        Some(decode) => typed::decode(decode, obj).unknown,
        None => Vec::new(),
    }
}

/// Fields whose JSON type does not fit the kind's schema, as `FieldValueInvalid` causes
/// (`spec.replicas: Invalid value: "3": invalid type: string "3", expected int32`).
pub fn type_errors(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<Cause> {
    match typed::decoder(group, version, kind) {
        // Most objects decode: checking that needs no round trip back to JSON.
        Some(decode) if decode.fits(obj) => Vec::new(),
        Some(decode) => typed::decode(decode, obj).errors,
        None => Vec::new(),
    }
}

/// [`type_errors`] of an object whose every part but `status` is a stored object's, as a
/// `/status` write builds it: only `status` is decoded (a pod's spec, most of its JSON, was
/// checked when it was written). The whole object is decoded when that finds an error, for the
/// causes' paths, and for kinds without a typed status.
pub fn status_type_errors(group: &str, version: &str, kind: &str, obj: &Value) -> Vec<Cause> {
    match typed::decoder(group, version, kind) {
        Some(decode) if decode.status_fits(obj) => Vec::new(),
        _ => type_errors(group, version, kind, obj),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, find};

    #[test]
    fn small_kinds() {
        let hpa = json!({"apiVersion": "autoscaling/v2", "metadata": {"name": "h"}, "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "minReplicas": 3, "maxReplicas": 2}});
        let causes = check("autoscaling", "v2", "HorizontalPodAutoscaler", hpa);
        assert!(find(&causes, "spec.maxReplicas")
            .message
            .ends_with("must be greater than or equal to `minReplicas`"));
        let lease = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 0, "renewTime": "2026-01-01T00:00:00.000000Z"}});
        find(
            &check("coordination.k8s.io", "v1", "Lease", lease),
            "spec.leaseDurationSeconds",
        );
        let ns = json!({"metadata": {"name": "team-a"}, "spec": {"finalizers": ["kubernetes", "bad finalizer"]}});
        find(&check("", "v1", "Namespace", ns), "spec.finalizers");
        // Unknown kinds get only metadata checks.
        assert_eq!(
            validate(
                "example.com",
                "v1",
                "Widget",
                &json!({"metadata": {"name": "w"}, "spec": {"anything": 1}}),
                None
            ),
            vec![]
        );
    }
}
