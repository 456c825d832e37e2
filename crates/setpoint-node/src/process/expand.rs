//! `$(VAR)` expansion and container environments, as Kubernetes builds them.
//!
//! Pure functions: the caller supplies the facts about the pod (its IP, the node) so the
//! rules can be tested without processes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

/// Expands `$(NAME)` references in `input` with `lookup`.
///
/// Kubernetes rules: `$$` is an escaped `$`; a reference whose name `lookup` does not know,
/// an unterminated `$(`, and a `$` before any other character all stay as written.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(inner) = after.strip_prefix('(') {
            match inner.find(')') {
                Some(end) => {
                    let name = &inner[..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &inner[end + 1..];
                }
                None => {
                    // No closing parenthesis: the rest is literal.
                    out.push('$');
                    out.push_str(after);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// What `fieldRef` environment variables may read besides the pod object itself: the values
/// the runtime knows before the API does.
#[derive(Clone, Debug, Default)]
pub struct FieldContext {
    /// The pod's IP as allocated by the runtime (`status.podIP`).
    pub pod_ip: String,
    /// The node's name (`spec.nodeName` when the pod does not say).
    pub node_name: String,
    /// The node's address (`status.hostIP`).
    pub host_ip: String,
    /// The API objects the pod's environments read ([`crate::env::gather`]).
    pub env: std::sync::Arc<crate::env::EnvInputs>,
    /// The pod's prepared volumes.
    pub volumes: std::sync::Arc<crate::volumes::PodVolumes>,
}

/// Resolves a `fieldRef.fieldPath` against the pod.
pub fn field_value(pod: &Pod, path: &str, ctx: &FieldContext) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let labelled = |prefix: &str, map: Option<&std::collections::BTreeMap<String, String>>| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix("']"))
            .map(|key| map.and_then(|m| m.get(key)).cloned().unwrap_or_default())
    };
    if let Some(v) = labelled("metadata.labels['", meta.labels.as_ref()) {
        return Ok(v);
    }
    if let Some(v) = labelled("metadata.annotations['", meta.annotations.as_ref()) {
        return Ok(v);
    }
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| ctx.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".to_string()),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.clone(),
        other => return Err(format!("fieldRef {other:?} is not supported")),
    })
}

/// The container's environment variables in spec order, each value expanded against the
/// variables defined before it. What the node cannot give the container yet
/// ([`crate::unsupported`]: ConfigMaps, Secrets, resource fields, `envFrom`, volume mounts)
/// is an error, never silently empty or missing.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &FieldContext,
) -> Result<Vec<(String, String)>, String> {
    if let Some(why) = crate::unsupported::unsupported(container) {
        return Err(why);
    }
    if let Some(why) = crate::volumes::unsupported_mounts(container) {
        return Err(why);
    }
    let mut defined: HashMap<String, String> = HashMap::new();
    let mut out: Vec<(String, String)> = Vec::new();
    for var in container.env.iter().flatten() {
        let value = if let Some(source) = &var.value_from {
            if let Some(field) = &source.field_ref {
                field_value(pod, &field.field_path, ctx)
                    .map_err(|e| format!("env var {}: {e}", var.name))?
            } else {
                // `unsupported` above names every other source; this guards its future.
                return Err(format!("env var {}: valueFrom has no source", var.name));
            }
        } else {
            let raw = var.value.clone().unwrap_or_default();
            expand(&raw, |name| defined.get(name).cloned())
        };
        defined.insert(var.name.clone(), value.clone());
        match out.iter_mut().find(|(n, _)| *n == var.name) {
            // A later definition of the same name wins, as in Kubernetes.
            Some(slot) => slot.1 = value,
            None => out.push((var.name.clone(), value)),
        }
    }
    Ok(out)
}

/// The process's argv: `command` then `args`, each expanded against `env`. `None` when the
/// container has no command (its image's entrypoint would run, which a process cannot do).
pub fn command_line(container: &Container, env: &[(String, String)]) -> Option<Vec<String>> {
    let command = container.command.as_ref().filter(|c| !c.is_empty())?;
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    Some(
        command
            .iter()
            .chain(container.args.iter().flatten())
            .map(|word| expand(word, lookup))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn map(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        assert_eq!(expand("$(A)", map), "alpha");
        assert_eq!(expand("x-$(A)-y", map), "x-alpha-y");
        assert_eq!(expand("$(B)", map), "$(B)");
        assert_eq!(expand("$$(A)", map), "$(A)");
        assert_eq!(expand("$$$(A)", map), "$alpha");
        assert_eq!(expand("$A", map), "$A");
        assert_eq!(expand("cost $5", map), "cost $5");
        assert_eq!(expand("$(A", map), "$(A");
        assert_eq!(expand("end$", map), "end$");
        assert_eq!(expand("$(EMPTY)!", map), "!");
        assert_eq!(expand("$()", map), "$()");
        assert_eq!(expand("$(A)$(A)", map), "alphaalpha");
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn env_expands_earlier_vars_and_reads_fields() {
        let ctx = FieldContext {
            pod_ip: "127.1.0.7".into(),
            node_name: "ignored".into(),
            host_ip: "10.0.0.1".into(),
            ..Default::default()
        };
        let container = Container {
            name: "c".into(),
            command: Some(vec![
                "serve".into(),
                "--bind".into(),
                "$(POD_IP):$(PORT)".into(),
            ]),
            args: Some(vec!["$(LATER)".into(), "$$(POD_IP)".into()]),
            env: Some(vec![
                var("PORT", "8080"),
                field("POD_IP", "status.podIP"),
                var("URL", "http://$(POD_IP):$(PORT)/$(LATER)"),
                field("NAME", "metadata.name"),
                field("NS", "metadata.namespace"),
                field("NODE", "spec.nodeName"),
                field("HOST", "status.hostIP"),
                field("APP", "metadata.labels['app']"),
                field("SA", "spec.serviceAccountName"),
                var("LATER", "late"),
            ]),
            ..Default::default()
        };
        let env = container_env(&pod(), &container, &ctx).unwrap();
        let get = |n: &str| env.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("URL"), "http://127.1.0.7:8080/$(LATER)");
        assert_eq!(get("NAME"), "web-1");
        assert_eq!(get("NS"), "shop");
        assert_eq!(get("NODE"), "n1");
        assert_eq!(get("HOST"), "10.0.0.1");
        assert_eq!(get("APP"), "web");
        assert_eq!(get("SA"), "default");
        let argv = command_line(&container, &env).unwrap();
        assert_eq!(
            argv,
            ["serve", "--bind", "127.1.0.7:8080", "late", "$(POD_IP)"]
        );
    }

    #[test]
    fn unsupported_sources_are_errors_and_no_command_is_none() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![field("X", "spec.nope")]),
            ..Default::default()
        };
        let err = container_env(&pod(), &container, &FieldContext::default()).unwrap_err();
        assert!(err.contains("spec.nope"), "{err}");
        assert_eq!(command_line(&container, &[]), None);
    }
}
