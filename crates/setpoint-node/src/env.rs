//! What a pod's container environments read from the API besides the pod itself: the
//! ConfigMaps and Secrets of `valueFrom` and `envFrom`, the Services of the pod's namespace
//! (and the master `kubernetes` Service) for service environment variables, and where the
//! pod reaches the API server. [`gather`] reads them through the node's
//! [`crate::runtime::Sources`] before a pod's containers are created; composing the
//! environment from them is pure ([`crate::process::expand::container_env`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret, Service};

use crate::agent::Capacity;
use crate::runtime::{ApiServerAddress, NodeContext};

/// The namespace of the master Service.
pub const MASTER_SERVICE_NAMESPACE: &str = "default";
/// The master Service, whose variables every pod gets even without service links.
pub const MASTER_SERVICE: &str = "kubernetes";

/// What reading one referenced object gave.
#[derive(Clone, PartialEq)]
pub enum Read<T> {
    /// The object as read.
    Found(T),
    /// It does not exist (a 404, or absent from the watch that holds it).
    Missing,
    /// It could not be read; the error says why, never what the object holds.
    Failed(String),
}

impl<T> Read<T> {
    fn state(&self) -> String {
        match self {
            Read::Found(_) => "found".into(),
            Read::Missing => "missing".into(),
            Read::Failed(e) => format!("failed: {e}"),
        }
    }
}

impl<T> From<Result<Option<T>, String>> for Read<T> {
    fn from(r: Result<Option<T>, String>) -> Self {
        match r {
            Ok(Some(o)) => Read::Found(o),
            Ok(None) => Read::Missing,
            Err(e) => Read::Failed(e),
        }
    }
}

/// The API objects one pod's container environments read, as read for one sync.
#[derive(Clone)]
pub struct EnvInputs {
    /// The ConfigMaps the pod's containers name, by name (in the pod's namespace).
    pub config_maps: BTreeMap<String, Read<ConfigMap>>,
    /// The Secrets the pod's containers name, by name (in the pod's namespace).
    pub secrets: BTreeMap<String, Read<Secret>>,
    /// The Services whose variables the pod gets: those of its namespace unless
    /// `enableServiceLinks` is false, and the master Service of `default`. An error when the
    /// node could not read them (kubelet's message).
    pub services: Result<Vec<Service>, String>,
    /// Where the pod reaches the API server when it shares the node's network, if the node
    /// knows ([`crate::runtime::ObjectSource::api_server`]).
    pub api_server: Option<ApiServerAddress>,
    /// The node's allocatable CPU and memory: the limits `resourceFieldRef` reads when the
    /// container sets none, as the kubelet merges them.
    pub allocatable: Capacity,
}

impl Default for EnvInputs {
    fn default() -> Self {
        EnvInputs {
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            services: Ok(Vec::new()),
            api_server: None,
            allocatable: machine_capacity(),
        }
    }
}

// Names and states only: a Secret's values never reach a log line through this.
impl fmt::Debug for EnvInputs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvInputs")
            .field("config_maps", &states(&self.config_maps))
            .field("secrets", &states(&self.secrets))
            .field(
                "services",
                &self.services.as_ref().map(|s| {
                    s.iter()
                        .map(|s| s.metadata.name.clone().unwrap_or_default())
                        .collect::<Vec<_>>()
                }),
            )
            .field("api_server", &self.api_server)
            .field("allocatable", &self.allocatable)
            .finish()
    }
}

fn states<T>(m: &BTreeMap<String, Read<T>>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.state())).collect()
}

/// This machine's capacity, read once: what the local agent reports as its allocatable
/// (`AgentConfig::local`), and so what both runtimes, which run on this machine, merge into
/// unset limits.
fn machine_capacity() -> Capacity {
    static CAPACITY: OnceLock<Capacity> = OnceLock::new();
    CAPACITY.get_or_init(Capacity::of_machine).clone()
}

/// Whether a container's environment is built from the cluster's Services: every pod's is,
/// unless `enableServiceLinks` is false, which leaves only the master Service's.
pub fn service_links(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.enable_service_links) != Some(false)
}

/// The containers whose environments this node builds: init and regular ones (no runtime
/// here runs ephemeral containers).
fn env_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// The names of the ConfigMaps and of the Secrets `pod`'s container environments read
/// (`configMapKeyRef`/`configMapRef`, `secretKeyRef`/`secretRef`).
pub fn env_references(pod: &Pod) -> (Vec<String>, Vec<String>) {
    let mut config_maps = std::collections::BTreeSet::new();
    let mut secrets = std::collections::BTreeSet::new();
    for c in env_containers(pod) {
        for from in c.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &from.secret_ref {
                secrets.insert(r.name.clone());
            }
        }
        for var in c.env.iter().flatten() {
            let Some(source) = &var.value_from else {
                continue;
            };
            if let Some(r) = &source.config_map_key_ref {
                config_maps.insert(r.name.clone());
            }
            if let Some(r) = &source.secret_key_ref {
                secrets.insert(r.name.clone());
            }
        }
    }
    (
        config_maps.into_iter().collect(),
        secrets.into_iter().collect(),
    )
}

/// Reads what `pod`'s container environments refer to, through the node's sources (only the
/// objects its containers name). A node without sources reads no Services (as a kubelet
/// without an API server) and answers every reference with an error.
#[tracing::instrument(level = "debug", skip_all, fields(pod = ?pod.metadata.name))]
pub async fn gather(pod: &Pod, node: &NodeContext) -> EnvInputs {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let (config_map_names, secret_names) = env_references(pod);
    let mut inputs = EnvInputs::default();
    let Some(sources) = &node.sources else {
        for name in config_map_names {
            let why = "this node reads no ConfigMaps".to_string();
            inputs.config_maps.insert(name, Read::Failed(why));
        }
        for name in secret_names {
            let why = "this node reads no Secrets".to_string();
            inputs.secrets.insert(name, Read::Failed(why));
        }
        return inputs;
    };
    let source = &sources.0;
    for name in config_map_names {
        let read = source.config_map(&namespace, &name).await.into();
        inputs.config_maps.insert(name, read);
    }
    for name in secret_names {
        let read = source.secret(&namespace, &name).await.into();
        inputs.secrets.insert(name, read);
    }
    inputs.services = gather_services(pod, &namespace, source.as_ref()).await;
    inputs.api_server = source.api_server();
    inputs
}

async fn gather_services(
    pod: &Pod,
    namespace: &str,
    source: &dyn crate::runtime::ObjectSource,
) -> Result<Vec<Service>, String> {
    let links = service_links(pod);
    let mut services = Vec::new();
    if links {
        services.extend(source.services(namespace).await?);
    }
    if !links || namespace != MASTER_SERVICE_NAMESPACE {
        services.extend(
            source
                .services(MASTER_SERVICE_NAMESPACE)
                .await?
                .into_iter()
                .filter(|s| s.metadata.name.as_deref() == Some(MASTER_SERVICE)),
        );
    }
    Ok(services)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ObjectSource, SourceFuture, Sources};
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource, PodSpec,
        SecretEnvSource, SecretKeySelector, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;
    use std::sync::Arc;

    struct Fixed;

    fn service(ns: &str, name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec::default()),
            ..Default::default()
        }
    }

    impl ObjectSource for Fixed {
        fn secret(&self, _: &str, name: &str) -> SourceFuture<Option<Secret>> {
            let found = (name == "s").then(|| Secret {
                data: Some([("k".to_string(), ByteString(b"hidden-value".to_vec()))].into()),
                ..Default::default()
            });
            Box::pin(async move { Ok(found) })
        }
        fn config_map(&self, _: &str, name: &str) -> SourceFuture<Option<ConfigMap>> {
            let name = name.to_string();
            Box::pin(async move {
                match name.as_str() {
                    "cm" => Ok(Some(ConfigMap::default())),
                    "denied" => Err("forbidden".to_string()),
                    _ => Ok(None),
                }
            })
        }
        fn services(&self, namespace: &str) -> SourceFuture<Vec<Service>> {
            let out = match namespace {
                "default" => vec![service("default", "kubernetes"), service("default", "web")],
                ns => vec![service(ns, "db")],
            };
            Box::pin(async move { Ok(out) })
        }
        fn api_server(&self) -> Option<ApiServerAddress> {
            Some(ApiServerAddress {
                host: "127.0.0.1".into(),
                port: 6443,
            })
        }
    }

    fn pod(links: Option<bool>) -> Pod {
        let from_cm = |name: &str| EnvVar {
            name: "A".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: name.into(),
                    key: "k".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                enable_service_links: links,
                init_containers: Some(vec![Container {
                    name: "i".into(),
                    env: Some(vec![from_cm("gone")]),
                    ..Default::default()
                }]),
                containers: vec![Container {
                    name: "c".into(),
                    env: Some(vec![
                        from_cm("cm"),
                        from_cm("denied"),
                        EnvVar {
                            name: "S".into(),
                            value_from: Some(EnvVarSource {
                                secret_key_ref: Some(SecretKeySelector {
                                    name: "s".into(),
                                    key: "k".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    env_from: Some(vec![
                        EnvFromSource {
                            config_map_ref: Some(ConfigMapEnvSource {
                                name: "cm".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        EnvFromSource {
                            secret_ref: Some(SecretEnvSource {
                                name: "other".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node() -> NodeContext {
        NodeContext {
            node_name: "n1".into(),
            host_ip: "127.0.0.1".into(),
            sources: Some(Sources(Arc::new(Fixed))),
        }
    }

    #[test]
    fn references_come_from_every_container() {
        let (cms, secrets) = env_references(&pod(None));
        assert_eq!(cms, ["cm", "denied", "gone"]);
        assert_eq!(secrets, ["other", "s"]);
    }

    #[tokio::test]
    async fn gather_reads_what_the_containers_name() {
        let inputs = gather(&pod(None), &node()).await;
        assert!(matches!(inputs.config_maps["cm"], Read::Found(_)));
        assert!(matches!(inputs.config_maps["gone"], Read::Missing));
        assert!(matches!(&inputs.config_maps["denied"], Read::Failed(e) if e == "forbidden"));
        assert!(matches!(inputs.secrets["s"], Read::Found(_)));
        assert!(matches!(inputs.secrets["other"], Read::Missing));
        let names = |i: &EnvInputs| -> Vec<String> {
            i.services
                .as_ref()
                .unwrap()
                .iter()
                .map(|s| s.metadata.name.clone().unwrap())
                .collect()
        };
        assert_eq!(names(&inputs), ["db", "kubernetes"]);
        assert_eq!(inputs.api_server.as_ref().unwrap().port, 6443);
        // The Debug form names objects, never their values.
        let shown = format!("{inputs:?}");
        assert!(shown.contains("\"s\": \"found\""), "{shown}");
        assert!(!shown.contains("hidden-value"), "{shown}");
        // Without service links only the master Service is read.
        let inputs = gather(&pod(Some(false)), &node()).await;
        assert_eq!(names(&inputs), ["kubernetes"]);
    }

    #[tokio::test]
    async fn a_node_without_sources_refuses_references_and_reads_no_services() {
        let mut n = node();
        n.sources = None;
        let inputs = gather(&pod(None), &n).await;
        assert!(
            matches!(&inputs.config_maps["cm"], Read::Failed(e) if e == "this node reads no ConfigMaps")
        );
        assert!(
            matches!(&inputs.secrets["s"], Read::Failed(e) if e == "this node reads no Secrets")
        );
        assert!(inputs.services.unwrap().is_empty());
    }
}
