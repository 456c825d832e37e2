//! `$(VAR)` expansion and container environments, as Kubernetes builds them.
//!
//! Pure functions: the caller supplies the facts about the pod (its IP, the node) so the
//! rules can be tested without processes.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod, Service};

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

/// Resolves an environment variable's `fieldRef.fieldPath` against the pod, as the kubelet
/// does: `spec.nodeName`, `spec.serviceAccountName`, the pod's and the node's addresses
/// (`status.podIPs` and `status.hostIPs` comma-separated), and the pod's metadata
/// ([`crate::volumes::downward::field_value`], the rule volumes use too).
pub fn field_value(pod: &Pod, path: &str, ctx: &FieldContext) -> Result<String, String> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| ctx.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.clone(),
        _ => {
            let selector = k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: path.to_string(),
                ..Default::default()
            };
            return crate::volumes::downward::field_value(pod, &selector);
        }
    })
}

/// Whether the pod shares the node's network namespace, so that it reaches what the node
/// reaches on its loopback addresses: `hostNetwork` pods, and process pods, whose addresses
/// are loopback addresses of the node ([`crate::process::ipam`]).
fn shares_node_network(pod: &Pod, ctx: &FieldContext) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
        || ctx
            .pod_ip
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// `host:port`, an IPv6 address in brackets (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A Service name as a variable-name prefix: upper case, `-` as `_`.
fn env_prefix(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// The service environment variables of `services` (the kubelet's `FromServices`), in
/// order: for each Service with a cluster IP (not `None`, not empty, with a port),
/// `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT`, `<SVC>_SERVICE_PORT_<NAME>` per named port,
/// then Docker's link variables (`<SVC>_PORT` for the first port, and per port
/// `<SVC>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT` and `_ADDR`).
pub fn service_env(services: &[Service]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for service in services {
        let Some(spec) = &service.spec else { continue };
        let ip = spec.cluster_ip.as_deref().unwrap_or_default();
        let ports = spec.ports.as_deref().unwrap_or_default();
        if ip.is_empty() || ip == "None" || ports.is_empty() {
            continue;
        }
        let prefix = env_prefix(service.metadata.name.as_deref().unwrap_or_default());
        out.push((format!("{prefix}_SERVICE_HOST"), ip.to_string()));
        let port_var = format!("{prefix}_SERVICE_PORT");
        out.push((port_var.clone(), ports[0].port.to_string()));
        for p in ports {
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.push((
                    format!("{port_var}_{}", env_prefix(name)),
                    p.port.to_string(),
                ));
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let protocol = p
                .protocol
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("TCP");
            let url = format!(
                "{}://{}",
                protocol.to_lowercase(),
                join_host_port(ip, p.port)
            );
            if i == 0 {
                out.push((format!("{prefix}_PORT"), url.clone()));
            }
            let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
            out.push((port_prefix.clone(), url));
            out.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
            out.push((format!("{port_prefix}_PORT"), p.port.to_string()));
            out.push((format!("{port_prefix}_ADDR"), ip.to_string()));
        }
    }
    out
}

/// The Services whose variables `pod` gets, from what [`crate::env::gather`] read. For a pod
/// that shares the node's network, the master Service points at the API server's own
/// address (which the node knows and such a pod reaches) instead of its cluster IP, which
/// nothing on this node routes.
fn pod_services(pod: &Pod, ctx: &FieldContext) -> Result<Vec<Service>, String> {
    let mut services = ctx.env.services.clone()?;
    let direct = ctx
        .env
        .api_server
        .as_ref()
        .filter(|_| shares_node_network(pod, ctx));
    if let Some(api) = direct {
        let is_master = |s: &Service| {
            s.metadata.name.as_deref() == Some(crate::env::MASTER_SERVICE)
                && s.metadata.namespace.as_deref() == Some(crate::env::MASTER_SERVICE_NAMESPACE)
        };
        services.retain(|s| !is_master(s));
        services.push(Service {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(crate::env::MASTER_SERVICE.into()),
                namespace: Some(crate::env::MASTER_SERVICE_NAMESPACE.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                cluster_ip: Some(api.host.clone()),
                ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                    name: Some("https".into()),
                    port: i32::from(api.port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    // Upstream builds them from a map keyed by name; a stable order keeps restarts alike.
    services.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(services)
}

/// Variables in definition order; a later definition of a name replaces the value where the
/// name first appeared.
#[derive(Default)]
struct OrderedEnv {
    vars: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl OrderedEnv {
    fn set(&mut self, name: String, value: String) {
        match self.index.get(&name) {
            Some(&i) => self.vars[i].1 = value,
            None => {
                self.index.insert(name.clone(), self.vars.len());
                self.vars.push((name, value));
            }
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.index.get(name).map(|&i| self.vars[i].1.as_str())
    }
}

/// The object `name` of what `gather` read, or the kubelet's error. `Ok(None)`: an optional
/// reference to an object that does not exist.
fn referenced<'a, T>(
    read: &'a std::collections::BTreeMap<String, crate::env::Read<T>>,
    resource: &str,
    name: &str,
    optional: bool,
) -> Result<Option<&'a T>, String> {
    use crate::env::Read;
    match read.get(name) {
        Some(Read::Found(o)) => Ok(Some(o)),
        // The kubelet's managers answer with a NotFound of the singular resource.
        Some(Read::Missing) if optional => Ok(None),
        Some(Read::Missing) => Err(format!("{resource} {name:?} not found")),
        Some(Read::Failed(e)) => Err(e.clone()),
        None => Err(format!("{resource} {name:?} was not read for this pod")),
    }
}

/// The container's environment as the kubelet builds it: the service variables
/// ([`service_env`]; those of the pod's namespace unless `enableServiceLinks` is false, and
/// always the master Service's), then `envFrom` (each source's keys with its `prefix`, a
/// later source replacing an earlier one's), then `env` in spec order, a `value` expanded
/// against the variables defined before it and the service variables, a `valueFrom` read
/// from the pod, its resources, a ConfigMap or a Secret. Explicit variables replace service
/// variables of the same name. An error is the kubelet's message for what is missing
/// (`configmap "x" not found`, `couldn't find key k in ConfigMap ns/x`), which the container
/// waits with as `CreateContainerConfigError`.
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
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let services = service_env(&pod_services(pod, ctx)?);
    let service_value = |name: &str| {
        services
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let inputs = &ctx.env;
    let mut env = OrderedEnv::default();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            let optional = r.optional == Some(true);
            let Some(cm) = referenced(&inputs.config_maps, "configmap", &r.name, optional)? else {
                continue;
            };
            for (k, v) in cm.data.iter().flatten() {
                env.set(format!("{prefix}{k}"), v.clone());
            }
        } else if let Some(r) = &from.secret_ref {
            let optional = r.optional == Some(true);
            let Some(secret) = referenced(&inputs.secrets, "secret", &r.name, optional)? else {
                continue;
            };
            for (k, v) in secret.data.iter().flatten() {
                env.set(
                    format!("{prefix}{k}"),
                    String::from_utf8_lossy(&v.0).into_owned(),
                );
            }
        }
    }
    for var in container.env.iter().flatten() {
        let raw = var.value.as_deref().unwrap_or_default();
        let value = if !raw.is_empty() {
            expand(raw, |name| {
                env.get(name)
                    .map(str::to_string)
                    .or_else(|| service_value(name))
            })
        } else if let Some(source) = &var.value_from {
            let value = if let Some(field) = &source.field_ref {
                Some(field_value(pod, &field.field_path, ctx)?)
            } else if let Some(resource) = &source.resource_field_ref {
                let mut selector = resource.clone();
                if selector
                    .container_name
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                {
                    // Without a name the variable reads its own container.
                    selector.container_name = Some(container.name.clone());
                }
                Some(crate::volumes::downward::resource_value(
                    pod,
                    &selector,
                    &inputs.allocatable,
                )?)
            } else if let Some(r) = &source.config_map_key_ref {
                let optional = r.optional == Some(true);
                let cm = referenced(&inputs.config_maps, "configmap", &r.name, optional)?;
                match cm.map(|cm| cm.data.as_ref().and_then(|d| d.get(&r.key))) {
                    None | Some(None) if optional => None,
                    Some(Some(v)) => Some(v.clone()),
                    _ => {
                        return Err(format!(
                            "couldn't find key {} in ConfigMap {namespace}/{}",
                            r.key, r.name
                        ))
                    }
                }
            } else if let Some(r) = &source.secret_key_ref {
                let optional = r.optional == Some(true);
                let secret = referenced(&inputs.secrets, "secret", &r.name, optional)?;
                match secret.map(|s| s.data.as_ref().and_then(|d| d.get(&r.key))) {
                    None | Some(None) if optional => None,
                    Some(Some(v)) => Some(String::from_utf8_lossy(&v.0).into_owned()),
                    _ => {
                        return Err(format!(
                            "couldn't find key {} in Secret {namespace}/{}",
                            r.key, r.name
                        ))
                    }
                }
            } else {
                // `unsupported` above names every other source; this guards its future.
                return Err(format!("env var {}: valueFrom has no source", var.name));
            };
            // An optional reference to what does not exist defines nothing.
            let Some(value) = value else { continue };
            value
        } else {
            String::new()
        };
        env.set(var.name.clone(), value);
    }
    let mut out: Vec<(String, String)> = services
        .into_iter()
        .filter(|(n, _)| env.get(n).is_none())
        .collect();
    out.extend(env.vars);
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
        // The spec's value, as the kubelet reads it (admission fills it in).
        assert_eq!(get("SA"), "");
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
        assert_eq!(err, "unsupported fieldPath: spec.nope");
        assert_eq!(command_line(&container, &[]), None);
    }

    use crate::env::{EnvInputs, Read};
    use crate::runtime::ApiServerAddress;
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, ResourceFieldSelector,
        ResourceRequirements, Secret, SecretEnvSource, SecretKeySelector, ServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::ByteString;
    use std::sync::Arc;

    fn from(name: &str, source: EnvVarSource) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(source),
            ..Default::default()
        }
    }

    fn cm_key(name: &str, key: &str, optional: Option<bool>) -> EnvVarSource {
        EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            ..Default::default()
        }
    }

    fn secret_key(name: &str, key: &str, optional: Option<bool>) -> EnvVarSource {
        EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: name.into(),
                key: key.into(),
                optional,
            }),
            ..Default::default()
        }
    }

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, Option<&str>)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(n, p, proto)| ServicePort {
                            name: n.map(String::from),
                            port: *p,
                            protocol: proto.map(String::from),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn inputs() -> EnvInputs {
        let cm = ConfigMap {
            data: Some(
                [
                    ("color".to_string(), "blue".to_string()),
                    ("size".to_string(), "L".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        let secret = Secret {
            data: Some([("password".to_string(), ByteString(b"s3cret".to_vec()))].into()),
            ..Default::default()
        };
        let mut i = EnvInputs {
            services: Ok(vec![
                svc(
                    "default",
                    "kubernetes",
                    "10.96.0.1",
                    &[(Some("https"), 443, Some("TCP"))],
                ),
                svc(
                    "shop",
                    "redis-primary",
                    "10.96.0.9",
                    &[(None, 6379, None), (Some("metrics"), 9121, Some("UDP"))],
                ),
                svc("shop", "headless", "None", &[(None, 80, None)]),
            ]),
            ..Default::default()
        };
        i.allocatable.cpu = "4".into();
        i.allocatable.memory = "8Gi".into();
        i.config_maps.insert("settings".into(), Read::Found(cm));
        i.config_maps.insert("gone".into(), Read::Missing);
        i.config_maps
            .insert("denied".into(), Read::Failed("forbidden".into()));
        i.secrets.insert("db".into(), Read::Found(secret));
        i.secrets.insert("gone".into(), Read::Missing);
        i
    }

    fn ctx_with(inputs: EnvInputs, pod_ip: &str) -> FieldContext {
        FieldContext {
            pod_ip: pod_ip.into(),
            host_ip: "192.168.1.5".into(),
            env: Arc::new(inputs),
            ..Default::default()
        }
    }

    fn env_of(c: &Container, ctx: &FieldContext) -> Result<Vec<(String, String)>, String> {
        container_env(&pod(), c, ctx)
    }

    fn lookup<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    #[test]
    fn service_variables_follow_the_kubelets_names() {
        let services = [svc(
            "shop",
            "redis-primary",
            "10.96.0.9",
            &[
                (None, 6379, None),
                (Some("metrics-port"), 9121, Some("UDP")),
            ],
        )];
        let env = service_env(&services);
        let expected = [
            ("REDIS_PRIMARY_SERVICE_HOST", "10.96.0.9"),
            ("REDIS_PRIMARY_SERVICE_PORT", "6379"),
            ("REDIS_PRIMARY_SERVICE_PORT_METRICS_PORT", "9121"),
            ("REDIS_PRIMARY_PORT", "tcp://10.96.0.9:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP", "tcp://10.96.0.9:6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PROTO", "tcp"),
            ("REDIS_PRIMARY_PORT_6379_TCP_PORT", "6379"),
            ("REDIS_PRIMARY_PORT_6379_TCP_ADDR", "10.96.0.9"),
            ("REDIS_PRIMARY_PORT_9121_UDP", "udp://10.96.0.9:9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PROTO", "udp"),
            ("REDIS_PRIMARY_PORT_9121_UDP_PORT", "9121"),
            ("REDIS_PRIMARY_PORT_9121_UDP_ADDR", "10.96.0.9"),
        ];
        let got: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        assert_eq!(got, expected);
        // Headless, unallocated and port-less Services give nothing; IPv6 is bracketed.
        assert!(service_env(&[svc("a", "h", "None", &[(None, 80, None)])]).is_empty());
        assert!(service_env(&[svc("a", "h", "", &[(None, 80, None)])]).is_empty());
        assert!(service_env(&[svc("a", "h", "10.0.0.1", &[])]).is_empty());
        let v6 = service_env(&[svc("a", "h", "fd00::1", &[(None, 80, None)])]);
        assert_eq!(lookup(&v6, "H_PORT"), Some("tcp://[fd00::1]:80"));
    }

    #[test]
    fn services_come_first_then_env_from_then_env() {
        let c = Container {
            name: "c".into(),
            env_from: Some(vec![EnvFromSource {
                prefix: Some("APP_".into()),
                config_map_ref: Some(ConfigMapEnvSource {
                    name: "settings".into(),
                    optional: None,
                }),
                ..Default::default()
            }]),
            env: Some(vec![
                var("APP_size", "XL"),
                var("URL", "redis://$(REDIS_PRIMARY_SERVICE_HOST)/$(APP_color)"),
                var("KUBERNETES_SERVICE_PORT", "8443"),
            ]),
            ..Default::default()
        };
        let env = env_of(&c, &ctx_with(inputs(), "10.244.0.5")).unwrap();
        let names: Vec<&str> = env.iter().map(|(n, _)| n.as_str()).collect();
        let first_app = names.iter().position(|n| *n == "APP_color").unwrap();
        assert!(names[..first_app]
            .iter()
            .all(|n| n.contains("_SERVICE_") || n.contains("_PORT")));
        assert_eq!(
            &names[first_app..],
            ["APP_color", "APP_size", "URL", "KUBERNETES_SERVICE_PORT"]
        );
        assert_eq!(lookup(&env, "APP_size"), Some("XL"));
        assert_eq!(lookup(&env, "URL"), Some("redis://10.96.0.9/blue"));
        // Explicit env replaces the service variable, which then appears once.
        assert_eq!(
            names
                .iter()
                .filter(|n| **n == "KUBERNETES_SERVICE_PORT")
                .count(),
            1
        );
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_PORT"), Some("8443"));
        // A container pod does not share the node's network: the master Service as it is.
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(lookup(&env, "HEADLESS_SERVICE_HOST"), None);
    }

    #[test]
    fn a_pod_on_the_nodes_network_reaches_the_api_server_directly() {
        let mut i = inputs();
        i.api_server = Some(ApiServerAddress {
            host: "127.0.0.1".into(),
            port: 6443,
        });
        let c = Container {
            name: "c".into(),
            ..Default::default()
        };
        let env = env_of(&c, &ctx_with(i.clone(), "127.1.0.7")).unwrap();
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_PORT"), Some("6443"));
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_PORT_HTTPS"), Some("6443"));
        assert_eq!(
            lookup(&env, "KUBERNETES_PORT"),
            Some("tcp://127.0.0.1:6443")
        );
        assert_eq!(
            lookup(&env, "KUBERNETES_PORT_6443_TCP_ADDR"),
            Some("127.0.0.1")
        );
        assert_eq!(lookup(&env, "KUBERNETES_PORT_443_TCP"), None);
        // Other Services keep their cluster IPs.
        assert_eq!(
            lookup(&env, "REDIS_PRIMARY_SERVICE_HOST"),
            Some("10.96.0.9")
        );
        // Even if the master Service was not read.
        if let Ok(s) = &mut i.services {
            s.retain(|s| s.metadata.name.as_deref() != Some("kubernetes"));
        }
        let env = env_of(&c, &ctx_with(i, "127.1.0.7")).unwrap();
        assert_eq!(lookup(&env, "KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
    }

    #[test]
    fn config_maps_and_secrets_read_as_the_kubelet_reads_them() {
        let ctx = ctx_with(inputs(), "10.244.0.5");
        let c = |env: Vec<EnvVar>| Container {
            name: "c".into(),
            env: Some(env),
            ..Default::default()
        };
        let env = env_of(
            &c(vec![
                from("COLOR", cm_key("settings", "color", None)),
                from("PASSWORD", secret_key("db", "password", None)),
                from("MAYBE", cm_key("gone", "x", Some(true))),
                from("MAYBE_KEY", cm_key("settings", "nope", Some(true))),
                from("MAYBE_SECRET", secret_key("gone", "x", Some(true))),
            ]),
            &ctx,
        )
        .unwrap();
        assert_eq!(lookup(&env, "COLOR"), Some("blue"));
        assert_eq!(lookup(&env, "PASSWORD"), Some("s3cret"));
        assert_eq!(lookup(&env, "MAYBE"), None);
        assert_eq!(lookup(&env, "MAYBE_KEY"), None);
        assert_eq!(lookup(&env, "MAYBE_SECRET"), None);
        let err = |v: EnvVar| env_of(&c(vec![v]), &ctx).unwrap_err();
        assert_eq!(
            err(from("X", cm_key("gone", "k", None))),
            "configmap \"gone\" not found"
        );
        assert_eq!(
            err(from("X", cm_key("settings", "k", None))),
            "couldn't find key k in ConfigMap shop/settings"
        );
        assert_eq!(
            err(from("X", secret_key("gone", "k", None))),
            "secret \"gone\" not found"
        );
        assert_eq!(
            err(from("X", secret_key("db", "k", None))),
            "couldn't find key k in Secret shop/db"
        );
        // Only a missing object is forgiven by `optional`, never an unreadable one.
        assert_eq!(
            err(from("X", cm_key("denied", "k", Some(true)))),
            "forbidden"
        );
    }

    #[test]
    fn env_from_takes_every_key_with_its_prefix() {
        let ctx = ctx_with(inputs(), "10.244.0.5");
        let c = |sources: Vec<EnvFromSource>| Container {
            name: "c".into(),
            env_from: Some(sources),
            ..Default::default()
        };
        let cm = |name: &str, prefix: Option<&str>, optional: Option<bool>| EnvFromSource {
            prefix: prefix.map(String::from),
            config_map_ref: Some(ConfigMapEnvSource {
                name: name.into(),
                optional,
            }),
            ..Default::default()
        };
        let secret = |name: &str, optional: Option<bool>| EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: name.into(),
                optional,
            }),
            ..Default::default()
        };
        let env = env_of(
            &c(vec![
                cm("settings", Some("A_"), None),
                cm("settings", None, None),
                secret("db", None),
                cm("gone", None, Some(true)),
                secret("gone", Some(true)),
            ]),
            &ctx,
        )
        .unwrap();
        for (n, v) in [
            ("A_color", "blue"),
            ("A_size", "L"),
            ("color", "blue"),
            ("password", "s3cret"),
        ] {
            assert_eq!(lookup(&env, n), Some(v), "{n}");
        }
        assert_eq!(
            env_of(&c(vec![cm("gone", Some("P_"), None)]), &ctx).unwrap_err(),
            "configmap \"gone\" not found"
        );
        assert_eq!(
            env_of(&c(vec![secret("gone", Some(false))]), &ctx).unwrap_err(),
            "secret \"gone\" not found"
        );
    }

    #[test]
    fn resource_fields_and_every_field_ref() {
        let mut p = pod();
        p.metadata.annotations = Some([("team".to_string(), "core".to_string())].into());
        p.spec.as_mut().unwrap().service_account_name = Some("builder".into());
        let limits = |cpu: &str, mem: &str| ResourceRequirements {
            limits: Some(
                [
                    ("cpu".to_string(), Q(cpu.into())),
                    ("memory".to_string(), Q(mem.into())),
                ]
                .into(),
            ),
            requests: Some([("cpu".to_string(), Q("250m".into()))].into()),
            ..Default::default()
        };
        let resource = |r: &str, container: Option<&str>, divisor: Option<&str>| EnvVarSource {
            resource_field_ref: Some(ResourceFieldSelector {
                resource: r.into(),
                container_name: container.map(String::from),
                divisor: divisor.map(|d| Q(d.into())),
            }),
            ..Default::default()
        };
        let c = Container {
            name: "main".into(),
            resources: Some(limits("1500m", "256Mi")),
            env: Some(vec![
                from("CPU", resource("limits.cpu", None, None)),
                from("CPU_M", resource("limits.cpu", None, Some("1m"))),
                from("MEM_MI", resource("limits.memory", None, Some("1Mi"))),
                from("REQ_CPU_M", resource("requests.cpu", None, Some("1m"))),
                from("REQ_MEM", resource("requests.memory", None, None)),
                from("SIDE_CPU", resource("limits.cpu", Some("side"), None)),
                from(
                    "SIDE_MEM",
                    resource("limits.memory", Some("side"), Some("1Gi")),
                ),
                field("NAME", "metadata.name"),
                field("NS", "metadata.namespace"),
                field("UID", "metadata.uid"),
                field("APP", "metadata.labels['app']"),
                field("TEAM", "metadata.annotations['team']"),
                field("NODE", "spec.nodeName"),
                field("SA", "spec.serviceAccountName"),
                field("HOST", "status.hostIP"),
                field("HOSTS", "status.hostIPs"),
                field("IP", "status.podIP"),
                field("IPS", "status.podIPs"),
            ]),
            ..Default::default()
        };
        let spec = p.spec.as_mut().unwrap();
        spec.containers = vec![
            c.clone(),
            Container {
                name: "side".into(),
                ..Default::default()
            },
        ];
        let env = container_env(&p, &c, &ctx_with(inputs(), "10.244.0.5")).unwrap();
        for (n, v) in [
            ("CPU", "2"),
            ("CPU_M", "1500"),
            ("MEM_MI", "256"),
            ("REQ_CPU_M", "250"),
            ("REQ_MEM", "0"),
            // No limits: the node's allocatable.
            ("SIDE_CPU", "4"),
            ("SIDE_MEM", "8"),
            ("NAME", "web-1"),
            ("NS", "shop"),
            ("UID", "u-1"),
            ("APP", "web"),
            ("TEAM", "core"),
            ("NODE", "n1"),
            ("SA", "builder"),
            ("HOST", "192.168.1.5"),
            ("HOSTS", "192.168.1.5"),
            ("IP", "10.244.0.5"),
            ("IPS", "10.244.0.5"),
        ] {
            assert_eq!(lookup(&env, n), Some(v), "{n}");
        }
    }

    #[test]
    fn services_that_could_not_be_read_stop_the_container() {
        let mut i = inputs();
        i.services =
            Err("services have not yet been read at least once, cannot construct envvars".into());
        let c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(
            env_of(&c, &ctx_with(i, "10.0.0.1")).unwrap_err(),
            "services have not yet been read at least once, cannot construct envvars"
        );
    }

    /// Whatever the values, a variable sees exactly the variables defined before it, and a
    /// later definition of a name wins in place: checked against a model over many
    /// generated environments (a fixed-seed generator, so every run checks the same ones).
    #[test]
    fn later_definitions_win_and_references_look_back() {
        let mut seed: u64 = 0x5eed;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let alphabet = ["a", "$", "(", ")", "A", "B", "C", "$(A)", "$(B)", "$$"];
        for _ in 0..2000 {
            let count = 1 + next(7);
            let values: Vec<(String, String)> = (0..count)
                .map(|_| {
                    let name = ["A", "B", "C"][next(3) as usize].to_string();
                    let len = next(6);
                    let value = (0..len).map(|_| alphabet[next(10) as usize]).collect();
                    (name, value)
                })
                .collect();
            let c = Container {
                name: "c".into(),
                env: Some(values.iter().map(|(n, v)| var(n, v)).collect()),
                ..Default::default()
            };
            let env =
                container_env(&pod(), &c, &ctx_with(EnvInputs::default(), "10.0.0.1")).unwrap();
            let mut model: Vec<(String, String)> = Vec::new();
            for (n, v) in &values {
                let expanded = expand(v, |name| {
                    model
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                });
                match model.iter_mut().find(|(k, _)| k == n) {
                    Some(slot) => slot.1 = expanded,
                    None => model.push((n.clone(), expanded)),
                }
            }
            assert_eq!(env, model, "{values:?}");
        }
    }
}
