//! A pod's CRI sandbox configuration, as the kubelet builds it: metadata (name, uid,
//! namespace, attempt), hostname, the labels the agent finds its sandboxes by again
//! (`io.kubernetes.pod.uid`, `.name`, `.namespace`, plus the pod's own labels), the log
//! directory `<data>/pods/<namespace>_<name>_<uid>`, DNS, `hostPort` mappings, host
//! namespaces, the cgroup parent of the pod's QoS class and the pod's security context.

use std::collections::HashMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use setpoint_cri_proto as cri;
use setpoint_network::dns::resolvconf::{self, ClusterDns, ResolvConf};

use super::resources;

/// The label holding the pod's uid on sandboxes and containers.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// The label holding the pod's name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// The label holding the pod's namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// The label holding a container's name.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// The pod's name, namespace and uid.
pub fn identity(pod: &Pod) -> (String, String, String) {
    let m = &pod.metadata;
    (
        m.name.clone().unwrap_or_default(),
        m.namespace.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
    )
}

/// The labels naming the pod, which sandboxes and containers carry.
pub fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let (name, namespace, uid) = identity(pod);
    HashMap::from([
        (POD_NAME_LABEL.to_string(), name),
        (POD_NAMESPACE_LABEL.to_string(), namespace),
        (POD_UID_LABEL.to_string(), uid),
    ])
}

/// The directory the pod's container logs go to.
pub fn log_directory(data_dir: &Path, pod: &Pod) -> std::path::PathBuf {
    let (name, namespace, uid) = identity(pod);
    log_directory_of(data_dir, &namespace, &name, &uid)
}

/// The log directory of the pod `namespace`/`name` with `uid`.
pub fn log_directory_of(
    data_dir: &Path,
    namespace: &str,
    name: &str,
    uid: &str,
) -> std::path::PathBuf {
    data_dir
        .join("pods")
        .join(format!("{namespace}_{name}_{uid}"))
}

/// Whether the pod uses the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.host_network) == Some(true)
}

/// The namespaces the pod's containers share with the node (`hostNetwork`, `hostPID`,
/// `hostIPC`) or with each other.
pub fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let spec = pod.spec.as_ref();
    let node = |flag: Option<bool>, otherwise: cri::NamespaceMode| {
        if flag == Some(true) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: node(spec.and_then(|s| s.host_network), cri::NamespaceMode::Pod),
        pid: node(spec.and_then(|s| s.host_pid), cri::NamespaceMode::Container),
        ipc: node(spec.and_then(|s| s.host_ipc), cri::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// The DNS configuration of the pod's sandbox: the kubelet's composition from `dnsPolicy`,
/// `dnsConfig`, the node's cluster DNS and its `resolv.conf` (the rule lives in
/// `setpoint_network::dns::resolvconf`, shared with every runtime). Given for host-network
/// pods too, so `ClusterFirstWithHostNet` reaches the cluster DNS as upstream. What the
/// kubelet records as Warning events (limits cut, no cluster DNS) is logged.
pub fn dns_config(pod: &Pod, resolv_conf: &str, cluster: &ClusterDns) -> cri::DnsConfig {
    let host = ResolvConf::parse(resolv_conf);
    let composed = resolvconf::pod_dns(pod, cluster, &host);
    for warning in &composed.warnings {
        tracing::warn!(reason = warning.reason, "{}", warning.message);
    }
    cri::DnsConfig {
        servers: composed.config.nameservers,
        searches: composed.config.searches,
        options: composed.config.options,
    }
}

/// The `hostPort` mappings of every container port that names one.
pub fn port_mappings(pod: &Pod) -> Vec<cri::PortMapping> {
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp,
                Some("SCTP") => cri::Protocol::Sctp,
                _ => cri::Protocol::Tcp,
            } as i32,
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect()
}

/// The whole sandbox configuration of `pod`, its `attempt`-th sandbox.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    data_dir: &Path,
    resolv_conf: &str,
    cluster_dns: &ClusterDns,
) -> cri::PodSandboxConfig {
    let (name, namespace, uid) = identity(pod);
    let spec = pod.spec.clone().unwrap_or_default();
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.extend(pod_labels(pod));
    let annotations = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    // A host-network pod keeps the node's hostname.
    let hostname = if host_network(pod) {
        String::new()
    } else {
        let h = spec.hostname.clone().unwrap_or_else(|| name.clone());
        h.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_string()
    };
    let psc = spec.security_context.clone().unwrap_or_default();
    let privileged = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    let security = cri::LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod)),
        run_as_user: psc.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: psc.run_as_group.map(|value| cri::Int64Value { value }),
        supplemental_groups: psc
            .supplemental_groups
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(psc.fs_group)
            .collect(),
        privileged,
        // The sandbox's own profile: a Localhost one (refused for the containers) is left
        // to the runtime's default here.
        seccomp: super::containers::seccomp(pod, None).ok(),
        ..Default::default()
    };
    let sysctls = psc
        .sysctls
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.name, s.value))
        .collect();
    let qos = crate::status::qos_class(pod);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name,
            uid: uid.clone(),
            namespace,
            attempt,
        }),
        hostname,
        log_directory: log_directory(data_dir, pod).to_string_lossy().into_owned(),
        dns_config: Some(dns_config(pod, resolv_conf, cluster_dns)),
        port_mappings: port_mappings(pod),
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: resources::cgroup_parent(qos, &uid),
            security_context: Some(security),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSecurityContext, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    ports: Some(vec![
                        ContainerPort {
                            container_port: 80,
                            host_port: Some(8080),
                            ..Default::default()
                        },
                        ContainerPort {
                            container_port: 53,
                            protocol: Some("UDP".into()),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }],
                security_context: Some(PodSecurityContext {
                    run_as_user: Some(1000),
                    fs_group: Some(2000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn sandbox_config_as_the_kubelet_builds_it() {
        let c = sandbox_config(
            &pod(),
            2,
            Path::new("data"),
            "# c\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nsearch a.example b.example\noptions ndots:2\n",
            &ClusterDns::default(),
        );
        let m = c.metadata.as_ref().unwrap();
        assert_eq!(
            (
                m.name.as_str(),
                m.namespace.as_str(),
                m.uid.as_str(),
                m.attempt
            ),
            ("web", "shop", "u-1", 2)
        );
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "data/pods/shop_web_u-1");
        assert_eq!(c.labels[POD_UID_LABEL], "u-1");
        assert_eq!(c.labels[POD_NAME_LABEL], "web");
        assert_eq!(c.labels[POD_NAMESPACE_LABEL], "shop");
        assert_eq!(c.labels["app"], "web");
        let dns = c.dns_config.unwrap();
        assert_eq!(dns.servers, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(dns.searches, ["a.example", "b.example"]);
        assert_eq!(dns.options, ["ndots:2"]);
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!(
            (
                c.port_mappings[0].container_port,
                c.port_mappings[0].host_port
            ),
            (80, 8080)
        );
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu-1");
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.supplemental_groups, [2000]);
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
    }

    #[test]
    fn host_network_pods_share_the_node_namespace_and_name() {
        let mut p = pod();
        p.spec.as_mut().unwrap().host_network = Some(true);
        let cluster = ClusterDns {
            servers: vec!["10.96.0.10".into()],
            domain: "cluster.local".into(),
        };
        let c = sandbox_config(&p, 0, Path::new("d"), "nameserver 1.1.1.1\n", &cluster);
        assert_eq!(c.hostname, "");
        // ClusterFirst on the host network resolves as Default: the node's servers.
        assert_eq!(c.dns_config.as_ref().unwrap().servers, ["1.1.1.1"]);
        p.spec.as_mut().unwrap().dns_policy = Some("ClusterFirstWithHostNet".into());
        let c = sandbox_config(&p, 0, Path::new("d"), "nameserver 1.1.1.1\n", &cluster);
        let dns = c.dns_config.as_ref().unwrap();
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            [
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(dns.options, ["ndots:5"]);
        let ns = c
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
    }
}
