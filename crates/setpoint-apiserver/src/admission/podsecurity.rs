//! The `PodSecurity` admission step: a namespace's `pod-security.kubernetes.io/*` labels
//! decide which Pod Security Standard its pods are held to (the checks themselves are
//! `setpoint_api::podsecurity`, shared with anything else that asks).
//!
//! As upstream's plugin: `enforce` refuses a violating pod (403), `warn` answers it with a
//! `Warning` header and `audit` records it in the log. Workloads that carry a pod template
//! (Deployments, ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs,
//! ReplicationControllers) are checked for `warn` and `audit` only: their pods meet `enforce`
//! when they are created. A namespace's labels are validated when it is written.

use serde_json::{Map, Value};
use setpoint_api::meta;
use setpoint_api::podsecurity::{self as ps, LabelError, Level, LevelVersion, Policy};
use setpoint_api::status::ApiError;

use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::watchcache::CachedObject;

fn is_pods(res: &ResourceDef) -> bool {
    res.group.is_empty() && res.plural == "pods"
}

fn is_namespaces(res: &ResourceDef) -> bool {
    res.group.is_empty() && res.plural == "namespaces"
}

fn labels(obj: &Value) -> Option<&Map<String, Value>> {
    obj.pointer("/metadata/labels").and_then(Value::as_object)
}

/// The violations of `lv` by a pod template (`metadata` and `spec`), as the text upstream
/// puts after the policy (`reason (detail), ...`); `None` when it passes.
fn violations(lv: &LevelVersion, template: &Value) -> Option<String> {
    if lv.level == Level::Privileged {
        return None;
    }
    let empty = Value::Null;
    let found = ps::evaluate(
        lv.level,
        template.get("metadata").unwrap_or(&empty),
        template.get("spec").unwrap_or(&empty),
    );
    (!found.is_empty()).then(|| ps::forbidden_detail(&found))
}

/// `namespaces "x" is invalid: <field errors>` (422), upstream's answer to labels it cannot
/// read; the field errors are aggregated as Go's `[a, b]` when there are several.
fn invalid_labels(res: &ResourceDef, name: &str, errors: &[LabelError]) -> ApiError {
    let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let aggregate = if texts.len() == 1 {
        texts[0].clone()
    } else {
        format!("[{}]", texts.join(", "))
    };
    // Upstream starts from a Forbidden error (its details name the resource) and replaces
    // the code, reason and message with the plugin's.
    let mut e = ApiError::forbidden(&res.group_resource(), name, "");
    e.code = 422;
    e.reason = "Invalid".into();
    e.message = format!("{} \"{name}\" is invalid: {aggregate}", res.plural);
    e
}

/// The audit mode: a violation is recorded in the log (upstream puts it in the audit
/// event's annotations), never refused.
fn audit(policy: &Policy, res: &ResourceDef, namespace: &str, name: &str, template: &Value) {
    if let Some(found) = violations(&policy.audit, template) {
        tracing::info!(
            resource = %res.plural,
            namespace,
            name,
            "pod-security.kubernetes.io/audit-violations: would violate PodSecurity \"{}\": {found}",
            policy.audit
        );
    }
}

impl ApiServer {
    /// The Pod Security policy of `namespace`, from the watch cache (as upstream's plugin
    /// reads namespaces from an informer), or from the store when the cache has not seen it.
    async fn pod_security_policy(&self, namespace: &str) -> Option<Policy> {
        let ns_res = self.registry().get("", "v1", "namespaces")?.clone();
        let key = ns_res.key("", namespace);
        if let Some(cached) = self.caches.get(&ns_res.storage_prefix()).get(&key) {
            return cached_policy(&cached);
        }
        let ns = self.get_object(&ns_res, "", namespace).await.ok()?;
        let labels = labels(&ns)?;
        if !labels.keys().any(|k| k.starts_with(ps::LABEL_PREFIX)) {
            return None;
        }
        Some(ps::policy_from_labels(Some(labels)).0)
    }

    /// `PodSecurity` on a create: validates a namespace's labels (422), refuses a pod that
    /// violates its namespace's `enforce` level (403), and returns the warnings for `warn`
    /// (for pods and pod-template-bearing workloads), logging `audit` violations.
    pub(crate) async fn pod_security_on_create(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &Value,
    ) -> Result<Vec<String>, ApiError> {
        if is_namespaces(res) {
            let (_, errors) = ps::policy_from_labels(labels(obj));
            if !errors.is_empty() {
                return Err(invalid_labels(res, meta::name(obj), &errors));
            }
            return Ok(vec![]);
        }
        let pod = is_pods(res);
        let template = if pod {
            Some(obj)
        } else {
            ps::workload_template(&res.group, &res.plural, obj)
        };
        let Some(template) = template else {
            return Ok(vec![]);
        };
        if namespace.is_empty() {
            return Ok(vec![]);
        }
        let Some(policy) = self.pod_security_policy(namespace).await else {
            return Ok(vec![]);
        };
        let name = meta::name(obj);
        if pod {
            if let Some(found) = violations(&policy.enforce, template) {
                audit(&policy, res, namespace, name, template);
                return Err(ApiError::forbidden(
                    &res.group_resource(),
                    name,
                    &format!("violates PodSecurity \"{}\": {found}", policy.enforce),
                ));
            }
        }
        audit(&policy, res, namespace, name, template);
        Ok(warnings(&policy, template))
    }

    /// `PodSecurity` inside an update, before the write: a namespace's changed labels must
    /// be valid (422; labels that were already invalid and still ask for the same policy are
    /// let through, as upstream), and a pod whose spec or security annotations change is held
    /// to `enforce` again (403). Reads only the cache: the namespace of an existing pod is
    /// long known.
    pub(crate) fn pod_security_on_update(
        &self,
        res: &ResourceDef,
        namespace: &str,
        new: &Value,
        cur: &Value,
    ) -> Result<(), ApiError> {
        if is_namespaces(res) {
            let (new_policy, new_errors) = ps::policy_from_labels(labels(new));
            if new_errors.is_empty() {
                return Ok(());
            }
            let (old_policy, old_errors) = ps::policy_from_labels(labels(cur));
            if old_errors.is_empty() || new_policy != old_policy {
                return Err(invalid_labels(res, meta::name(new), &new_errors));
            }
            return Ok(());
        }
        if !is_pods(res) || !significant_pod_update(new, cur) {
            return Ok(());
        }
        let Some(policy) = self.cached_pod_security_policy(namespace) else {
            return Ok(());
        };
        if let Some(found) = violations(&policy.enforce, new) {
            return Err(ApiError::forbidden(
                &res.group_resource(),
                meta::name(new),
                &format!("violates PodSecurity \"{}\": {found}", policy.enforce),
            ));
        }
        Ok(())
    }

    /// What an update's Pod Security answer needs from before the write: the enforce level
    /// of a namespace about to be updated (from the cache), `None` for other resources.
    pub(crate) fn pod_security_before_update(
        &self,
        res: &ResourceDef,
        name: &str,
    ) -> Option<LevelVersion> {
        is_namespaces(res).then(|| {
            self.cached_pod_security_policy(name)
                .unwrap_or_default()
                .enforce
        })
    }

    /// The warnings of an update, read after the write from the stored object: for a
    /// workload, its pod template against `warn` (and `audit` to the log); for a namespace
    /// whose enforce level became stricter (`before` is the old one), the existing pods that
    /// violate the new level, as upstream dry-runs them.
    pub(crate) fn pod_security_after_update(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &Value,
        before: Option<LevelVersion>,
    ) -> Vec<String> {
        if is_namespaces(res) {
            let Some(old) = before else {
                return vec![];
            };
            let (policy, _) = ps::policy_from_labels(labels(obj));
            let name = meta::name(obj);
            if !enforce_tightened(&old, &policy.enforce) {
                return vec![];
            }
            let pods = self.core_objects_in("pods", name);
            return existing_pod_warnings(name, &policy.enforce, &pods);
        }
        let Some(template) = ps::workload_template(&res.group, &res.plural, obj) else {
            return vec![];
        };
        let Some(policy) = self.cached_pod_security_policy(namespace) else {
            return vec![];
        };
        audit(&policy, res, namespace, meta::name(obj), template);
        warnings(&policy, template)
    }

    fn cached_pod_security_policy(&self, namespace: &str) -> Option<Policy> {
        let ns_res = self.registry().get("", "v1", "namespaces")?.clone();
        let cached = self
            .caches
            .get(&ns_res.storage_prefix())
            .get(&ns_res.key("", namespace))?;
        cached_policy(&cached)
    }
}

/// The policy of a cached namespace, read from the labels its cache entry records (every
/// create in a namespace asks, so the namespace's JSON is not parsed); `None` without any
/// Pod Security label.
fn cached_policy(ns: &CachedObject) -> Option<Policy> {
    let labels: Map<String, Value> = [
        ps::ENFORCE_LEVEL_LABEL,
        ps::ENFORCE_VERSION_LABEL,
        ps::AUDIT_LEVEL_LABEL,
        ps::AUDIT_VERSION_LABEL,
        ps::WARN_LEVEL_LABEL,
        ps::WARN_VERSION_LABEL,
    ]
    .into_iter()
    .filter_map(|k| ns.attrs.label(k).map(|v| (k.to_string(), Value::from(v))))
    .collect();
    (!labels.is_empty()).then(|| ps::policy_from_labels(Some(&labels)).0)
}

/// Whether existing pods are checked against a namespace's new enforce level: not when it
/// is unchanged or privileged, nor when only the level was relaxed at the same version.
fn enforce_tightened(old: &LevelVersion, new: &LevelVersion) -> bool {
    if new == old || new.level == Level::Privileged {
        return false;
    }
    !(new.version == old.version && new.level <= old.level)
}

/// Upstream checks at most this many existing pods when a namespace's enforce level changes.
const MAX_PODS_TO_CHECK: usize = 3000;

/// The warnings for a namespace's new enforce level over its existing pods, in upstream's
/// form: a summary, then one line per distinct set of failed checks, naming the first pod
/// (by name) and how many others share it, sorted.
fn existing_pod_warnings(namespace: &str, enforce: &LevelVersion, pods: &[Value]) -> Vec<String> {
    let checked = &pods[..pods.len().min(MAX_PODS_TO_CHECK)];
    // reason list -> (first pod name, count), in the order first seen.
    let mut seen: Vec<(String, String, usize)> = Vec::new();
    let empty = Value::Null;
    for pod in checked {
        let found = ps::evaluate(
            enforce.level,
            pod.get("metadata").unwrap_or(&empty),
            pod.get("spec").unwrap_or(&empty),
        );
        if found.is_empty() {
            continue;
        }
        let reasons = found
            .iter()
            .map(|v| v.reason.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let name = meta::name(pod).to_string();
        match seen.iter_mut().find(|(r, _, _)| *r == reasons) {
            Some((_, first, count)) => {
                *count += 1;
                if name < *first {
                    *first = name;
                }
            }
            None => seen.push((reasons, name, 1)),
        }
    }
    let mut out = Vec::new();
    if checked.len() < pods.len() {
        out.push(format!(
            "new PodSecurity enforce level only checked against the first {} of {} existing pods",
            checked.len(),
            pods.len()
        ));
    }
    if seen.is_empty() {
        return out;
    }
    out.push(format!(
        "existing pods in namespace \"{namespace}\" violate the new PodSecurity enforce level \"{enforce}\""
    ));
    let mut lines: Vec<String> = seen
        .into_iter()
        .map(|(reasons, first, count)| match count {
            1 => format!("{first}: {reasons}"),
            2 => format!("{first} (and 1 other pod): {reasons}"),
            n => format!("{first} (and {} other pods): {reasons}", n - 1),
        })
        .collect();
    lines.sort();
    out.extend(lines);
    out
}

/// The `warn` level's answer: `would violate PodSecurity "<level>:<version>": ...`.
fn warnings(policy: &Policy, template: &Value) -> Vec<String> {
    violations(&policy.warn, template)
        .map(|found| format!("would violate PodSecurity \"{}\": {found}", policy.warn))
        .into_iter()
        .collect()
}

/// Whether a pod update changes what the checks read: its spec, or the annotations the
/// checks look at (AppArmor and seccomp). Label and other metadata changes are not
/// re-checked, as upstream skips them.
fn significant_pod_update(new: &Value, cur: &Value) -> bool {
    if new.get("spec") != cur.get("spec") {
        return true;
    }
    let security = |obj: &Value| -> Vec<(String, Value)> {
        obj.pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(k, _)| {
                k.starts_with("container.apparmor.security.beta.kubernetes.io/")
                    || k.starts_with("container.seccomp.security.alpha.kubernetes.io/")
                    || k.as_str() == "seccomp.security.alpha.kubernetes.io/pod"
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    security(new) != security(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_spec_and_security_annotations_make_a_pod_update_significant() {
        let cur = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        let relabelled = json!({"metadata": {"labels": {"a": "2"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}});
        assert!(!significant_pod_update(&relabelled, &cur));
        let new_image = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [{"name": "c", "image": "x:2"}]}});
        assert!(significant_pod_update(&new_image, &cur));
        let apparmor = json!({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}}, "spec": cur["spec"]});
        assert!(significant_pod_update(&apparmor, &cur));
    }

    #[test]
    fn existing_pods_are_summarised_per_set_of_failed_checks() {
        let lv = |level, version: &str| LevelVersion {
            level,
            version: version.into(),
        };
        let restricted = lv(Level::Restricted, "latest");
        let pods = vec![
            json!({"metadata": {"name": "b"}, "spec": {"hostNetwork": true, "containers": [{"name": "c"}]}}),
            json!({"metadata": {"name": "a"}, "spec": {"hostNetwork": true, "containers": [{"name": "c"}]}}),
            json!({"metadata": {"name": "z"}, "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}),
            json!({"metadata": {"name": "y"}, "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "runAsUser": 0}}]}}),
        ];
        assert_eq!(
            existing_pod_warnings("ns", &restricted, &pods),
            vec![
                r#"existing pods in namespace "ns" violate the new PodSecurity enforce level "restricted:latest""#,
                "a (and 1 other pod): host namespaces, allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile",
                "y: runAsUser=0",
            ]
        );
        assert!(existing_pod_warnings("ns", &restricted, &pods[2..3]).is_empty());

        let baseline = lv(Level::Baseline, "latest");
        assert!(enforce_tightened(
            &lv(Level::Privileged, "latest"),
            &baseline
        ));
        assert!(!enforce_tightened(&baseline, &baseline));
        assert!(!enforce_tightened(&restricted, &baseline), "relaxed");
        assert!(!enforce_tightened(
            &baseline,
            &lv(Level::Privileged, "latest")
        ));
        assert!(
            enforce_tightened(&restricted, &lv(Level::Baseline, "v1.30")),
            "another version"
        );
    }

    #[test]
    fn warnings_name_the_warn_policy() {
        let (policy, _) = ps::policy_from_labels(
            json!({"pod-security.kubernetes.io/warn": "baseline", "pod-security.kubernetes.io/warn-version": "v1.31"})
                .as_object(),
        );
        let pod = json!({"spec": {"hostNetwork": true, "containers": [{"name": "c"}]}});
        assert_eq!(
            warnings(&policy, &pod),
            vec![
                r#"would violate PodSecurity "baseline:v1.31": host namespaces (hostNetwork=true)"#
            ]
        );
        let fine = json!({"spec": {"containers": [{"name": "c"}]}});
        assert!(warnings(&policy, &fine).is_empty());
    }
}
