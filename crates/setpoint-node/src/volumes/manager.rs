//! [`VolumeManager`]: a pod's volumes set up under the runtime's directory as the kubelet
//! lays them out (`<root>/pods/<uid>/volumes/<kubernetes.io~plugin>/<name>`), on every sync
//! of the pod, and removed with the pod.
//!
//! Each sync reads what the volumes refer to through the node's
//! [`crate::runtime::Sources`] and rewrites a volume only when its contents changed
//! ([`super::writer`]), so a ConfigMap edit reaches a running pod at the pod's next sync. A
//! volume that cannot be set up is reported with the kubelet's `FailedMount` message; one
//! that was set up before keeps its last contents meanwhile, as the kubelet's does.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, Pod, Secret, SecretProjection, Volume, VolumeProjection,
};
use setpoint_api::quantity::{canonical_quantity, Quantity};

use super::writer::{self, Payload};
use super::{claim, emptydir, hostpath, projection, PodVolumes, PreparedVolume, VolumeError};
use crate::agent::Capacity;
use crate::runtime::{NodeContext, Sources, TokenRequestFor};

/// The plugin directory names of the kubelet (`kubernetes.io~<plugin>`).
const CONFIG_MAP: &str = "kubernetes.io~configmap";
const SECRET: &str = "kubernetes.io~secret";
const DOWNWARD_API: &str = "kubernetes.io~downward-api";
const PROJECTED: &str = "kubernetes.io~projected";
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";

/// The lifetime a projected token asks for when the volume names none, and the least it
/// may ask for (the API's default and minimum of `expirationSeconds`).
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// See [`DEFAULT_TOKEN_SECONDS`].
pub const MIN_TOKEN_SECONDS: i64 = 600;

/// Sets up and removes pods' volumes under one root directory (one per runtime).
#[derive(Clone, Debug)]
pub struct VolumeManager {
    root: PathBuf,
    allocatable: Capacity,
}

/// How one volume's set-up went.
type SetUp = Result<PreparedVolume, String>;

impl VolumeManager {
    /// A manager whose pods' volumes live under `<root>/pods/<uid>/volumes`. Limits a
    /// container does not set read as this machine's capacity in downwardAPI files.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root = std::path::absolute(&root).unwrap_or(root);
        VolumeManager {
            root,
            allocatable: Capacity::of_machine(),
        }
    }

    /// The node's allocatable CPU and memory, for `resourceFieldRef` limits a container
    /// does not set.
    pub fn with_allocatable(mut self, allocatable: Capacity) -> Self {
        self.allocatable = allocatable;
        self
    }

    /// The directory of a pod's volumes and everything else the manager keeps for it.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid)
    }

    /// The uids of the pods that have volumes under this manager's root.
    pub fn pods_with_volumes(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.root.join("pods")) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.path().join("volumes").is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|uid| check_uid(uid).is_ok())
            .collect()
    }

    fn volume_dir(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.pod_dir(uid).join("volumes").join(plugin).join(name)
    }

    /// Sets up every volume of `pod` (idempotent: what is already right is only read) and
    /// says where each is. A volume that fails is in the answer with its message
    /// ([`PodVolumes::failures`]); `Err` is only for a pod the manager cannot handle at all.
    pub async fn prepare(&self, pod: &Pod, node: &NodeContext) -> Result<PodVolumes, VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        check_uid(&uid)?;
        let mut out = PodVolumes::default();
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let prepared = self.set_up(pod, &uid, volume, node).await;
            let prepared = match prepared {
                Ok(p) => p,
                Err(message) => PreparedVolume {
                    path: None,
                    read_only: false,
                    error: Some(message),
                },
            };
            out.volumes.insert(volume.name.clone(), prepared);
        }
        out.eviction = self.over_limit(pod, &uid, &out).await;
        Ok(out)
    }

    /// Removes everything the manager made for the pod `uid`: tmpfs mounts are detached,
    /// then the pod's directory removed. Persistent and hostPath volumes live elsewhere and
    /// are never touched.
    pub fn cleanup(&self, uid: &str) -> Result<(), VolumeError> {
        check_uid(uid)?;
        let dir = self.pod_dir(uid);
        for mount in emptydir::mounts_under(&dir) {
            emptydir::unmount(&mount).map_err(io("unmounting", &mount))?;
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", &dir)(e)),
            _ => Ok(()),
        }
    }

    async fn set_up(&self, pod: &Pod, uid: &str, volume: &Volume, node: &NodeContext) -> SetUp {
        let name = volume.name.as_str();
        let setup_failed =
            |e: String| format!("MountVolume.SetUp failed for volume {name:?} : {e}");
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let fs_group = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|s| s.fs_group);
        let (plugin, payload) = if let Some(source) = &volume.config_map {
            let default_mode = projection::default_mode(source.default_mode);
            let payload = config_map_payload(
                node,
                namespace,
                &source.name,
                source.items.as_deref(),
                default_mode,
                source.optional.unwrap_or(false),
            )
            .await;
            (CONFIG_MAP, payload)
        } else if let Some(source) = &volume.secret {
            let default_mode = projection::default_mode(source.default_mode);
            let payload = secret_payload(
                node,
                namespace,
                source.secret_name.as_deref().unwrap_or_default(),
                source.items.as_deref(),
                default_mode,
                source.optional.unwrap_or(false),
            )
            .await;
            (SECRET, payload)
        } else if let Some(source) = &volume.downward_api {
            let default_mode = projection::default_mode(source.default_mode);
            let items = source.items.as_deref().unwrap_or_default();
            let payload = projection::downward_api(pod, items, default_mode, &self.allocatable);
            (DOWNWARD_API, payload)
        } else if let Some(source) = &volume.projected {
            let default_mode = projection::default_mode(source.default_mode);
            let sources = source.sources.as_deref().unwrap_or_default();
            let payload = self
                .projected_payload(pod, node, sources, default_mode, fs_group.is_some())
                .await;
            (PROJECTED, payload)
        } else if let Some(source) = &volume.empty_dir {
            let dir = self.volume_dir(uid, EMPTY_DIR, name);
            let memory = match source.medium.as_deref().unwrap_or_default() {
                "" => false,
                "Memory" => true,
                other => {
                    return Err(setup_failed(format!(
                        "emptyDir medium {other} is not supported by this node"
                    )))
                }
            };
            let limit = source
                .size_limit
                .as_ref()
                .map(|q| Quantity::parse(&q.0).ok().and_then(|q| q.value()))
                .map(|v| v.ok_or_else(|| setup_failed("sizeLimit is out of range".into())))
                .transpose()?;
            let path = dir.clone();
            blocking(move || emptydir::set_up(&path, memory, limit).map_err(|e| e.to_string()))
                .await
                .map_err(setup_failed)?;
            return Ok(ready(dir, false));
        } else if let Some(source) = &volume.host_path {
            let path = PathBuf::from(&source.path);
            let type_ = source.type_.clone();
            let checked = path.clone();
            blocking(move || hostpath::check_type(&checked, type_.as_deref()))
                .await
                .map_err(setup_failed)?;
            return Ok(ready(path, false));
        } else if let Some(source) = &volume.persistent_volume_claim {
            let claim_name = source.claim_name.as_str();
            let (path, type_) = claim_path(node, namespace, claim_name)
                .await
                .map_err(|e| claim::claim_error(namespace, claim_name, &e))?;
            let checked = path.clone();
            blocking(move || hostpath::check_type(&checked, type_.as_deref()))
                .await
                .map_err(setup_failed)?;
            return Ok(ready(path, source.read_only.unwrap_or(false)));
        } else {
            return Err(setup_failed(format!(
                "volume type {} is not supported by this node",
                source_kind(volume)
            )));
        };
        // The kinds written by the atomic writer.
        let dir = self.volume_dir(uid, plugin, name);
        let payload = payload.map(|mut p| {
            projection::with_fs_group(&mut p, fs_group);
            p
        });
        let target = dir.clone();
        let written = blocking(move || -> Result<bool, String> {
            std::fs::create_dir_all(&target).map_err(|e| e.to_string())?;
            match payload {
                Ok(p) => writer::write(&target, &p).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            }
        })
        .await;
        match written {
            Ok(changed) => {
                if changed {
                    tracing::info!(pod = %uid, volume = %name, "volume contents written");
                }
                Ok(ready(dir, true))
            }
            // Set up before: the pod keeps the last contents while the new ones fail.
            Err(e) if writer::current_data_dir(&dir).is_some() => Ok(PreparedVolume {
                path: Some(dir),
                read_only: true,
                error: Some(setup_failed(e)),
            }),
            Err(e) => Err(setup_failed(e)),
        }
    }

    async fn projected_payload(
        &self,
        pod: &Pod,
        node: &NodeContext,
        sources: &[VolumeProjection],
        default_mode: u32,
        has_fs_group: bool,
    ) -> Result<Payload, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let mut payload = Payload::new();
        let mut errors = Vec::new();
        for source in sources {
            let part = if let Some(ConfigMapProjection {
                name,
                items,
                optional,
            }) = &source.config_map
            {
                config_map_payload(
                    node,
                    namespace,
                    name,
                    items.as_deref(),
                    default_mode,
                    optional.unwrap_or(false),
                )
                .await
            } else if let Some(SecretProjection {
                name,
                items,
                optional,
            }) = &source.secret
            {
                secret_payload(
                    node,
                    namespace,
                    name,
                    items.as_deref(),
                    default_mode,
                    optional.unwrap_or(false),
                )
                .await
            } else if let Some(d) = &source.downward_api {
                let items = d.items.as_deref().unwrap_or_default();
                projection::downward_api(pod, items, default_mode, &self.allocatable)
            } else if let Some(t) = &source.service_account_token {
                let mode = if has_fs_group {
                    projection::TOKEN_MODE_WITH_FS_GROUP
                } else {
                    default_mode
                };
                token(pod, node, t).await.map(|token| {
                    Payload::from([(
                        t.path.clone(),
                        writer::FileProjection {
                            data: token.into_bytes(),
                            mode,
                            gid: None,
                        },
                    )])
                })
            } else {
                Err("this projected volume source is not supported by this node".to_string())
            };
            match part {
                Ok(p) => payload.extend(p),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(payload)
        } else {
            Err(projection::aggregate(&errors))
        }
    }

    /// The eviction message of the first emptyDir over its `sizeLimit`, if any.
    async fn over_limit(&self, pod: &Pod, uid: &str, volumes: &PodVolumes) -> Option<String> {
        for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(limit) = volume
                .empty_dir
                .as_ref()
                .and_then(|e| e.size_limit.as_ref())
            else {
                continue;
            };
            let Some(bytes) = Quantity::parse(&limit.0).ok().and_then(|q| q.value()) else {
                continue;
            };
            if volumes
                .volumes
                .get(&volume.name)
                .is_none_or(|v| v.path.is_none())
            {
                continue;
            }
            let dir = self.volume_dir(uid, EMPTY_DIR, &volume.name);
            let used = blocking(move || emptydir::usage(&dir).map_err(|e| e.to_string())).await;
            match used {
                Ok(used) if used > u64::try_from(bytes).unwrap_or(0) => {
                    return Some(emptydir::eviction_message(
                        &volume.name,
                        &canonical_quantity(&limit.0),
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(pod = %uid, volume = %volume.name, error = %e, "measuring an emptyDir");
                }
            }
        }
        None
    }
}

fn ready(path: PathBuf, read_only: bool) -> PreparedVolume {
    PreparedVolume {
        path: Some(path),
        read_only,
        error: None,
    }
}

/// A pod uid is one path component: nothing the manager removes can be outside its root.
fn check_uid(uid: &str) -> Result<(), VolumeError> {
    if uid.is_empty() || uid.contains('/') || uid.starts_with('.') {
        return Err(VolumeError::BadUid(uid.to_string()));
    }
    Ok(())
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> VolumeError {
    let path = path.to_path_buf();
    move |source| VolumeError::Io { what, path, source }
}

/// Runs file-system work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(format!("volume set-up task failed: {e}")))
}

fn sources(node: &NodeContext) -> Result<&Sources, String> {
    node.sources
        .as_ref()
        .ok_or_else(|| "this node reads no API objects for its pods".to_string())
}

async fn config_map_payload(
    node: &NodeContext,
    namespace: &str,
    name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let found = sources(node)?.0.config_map(namespace, name).await?;
    let cm = match found {
        Some(cm) => cm,
        None if optional => ConfigMap::default(),
        None => return Err(format!("configmap {name:?} not found")),
    };
    projection::config_map(&cm, items, default_mode, optional)
}

async fn secret_payload(
    node: &NodeContext,
    namespace: &str,
    name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, String> {
    let found = sources(node)?.0.secret(namespace, name).await?;
    let secret = match found {
        Some(s) => s,
        None if optional => Secret::default(),
        None => return Err(format!("secret {name:?} not found")),
    };
    projection::secret(&secret, items, default_mode, optional)
}

async fn token(
    pod: &Pod,
    node: &NodeContext,
    source: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
) -> Result<String, String> {
    let request = TokenRequestFor {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        service_account: pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_string()),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        audience: source.audience.clone().unwrap_or_default(),
        expiration_seconds: source
            .expiration_seconds
            .unwrap_or(DEFAULT_TOKEN_SECONDS)
            .max(MIN_TOKEN_SECONDS),
    };
    Ok(sources(node)?.0.token(&request).await?.token)
}

/// The bound volume's path of the claim `namespace/name`, and its hostPath `type`. `Err`
/// is the kubelet's reason, to go after [`claim::claim_error`]'s prefix.
async fn claim_path(
    node: &NodeContext,
    namespace: &str,
    name: &str,
) -> Result<(PathBuf, Option<String>), String> {
    let sources = sources(node)?;
    let pvc = sources
        .0
        .claim(namespace, name)
        .await
        .map_err(|e| format!("failed to fetch PVC from API server: {e}"))?
        .ok_or_else(|| {
            format!(
                "failed to fetch PVC from API server: persistentvolumeclaims {name:?} not found"
            )
        })?;
    let pv_name = claim::bound_volume(&pvc)?;
    let pv = sources
        .0
        .volume(&pv_name)
        .await
        .map_err(|e| format!("failed to fetch PV {pv_name} from API server: {e}"))?
        .ok_or_else(|| {
            format!(
                "failed to fetch PV {pv_name} from API server: persistentvolumes {pv_name:?} not found"
            )
        })?;
    claim::volume_path(&pv, pvc.metadata.uid.as_deref())
}

/// The name of the volume source `volume` uses, as the API spells it.
fn source_kind(volume: &Volume) -> String {
    serde_json::to_value(volume)
        .ok()
        .and_then(|v| {
            v.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "(none)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{IssuedToken, ObjectSource, SourceFuture};
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, DownwardAPIProjection, DownwardAPIVolumeFile, EmptyDirVolumeSource,
        ObjectFieldSelector, PodSpec, ProjectedVolumeSource, ServiceAccountTokenProjection,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    #[derive(Default)]
    struct Fixed {
        config_maps: Mutex<BTreeMap<String, ConfigMap>>,
        tokens: Mutex<Vec<TokenRequestFor>>,
    }

    impl ObjectSource for Fixed {
        fn secret(&self, _: &str, _: &str) -> SourceFuture<Option<Secret>> {
            Box::pin(async { Ok(None) })
        }
        fn config_map(&self, _: &str, name: &str) -> SourceFuture<Option<ConfigMap>> {
            let found = self.config_maps.lock().get(name).cloned();
            Box::pin(async move { Ok(found) })
        }
        fn token(&self, request: &TokenRequestFor) -> SourceFuture<IssuedToken> {
            self.tokens.lock().push(request.clone());
            Box::pin(async {
                Ok(IssuedToken {
                    token: "tok".into(),
                    expires: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                })
            })
        }
    }

    fn pod(volumes: Vec<Volume>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("uid-1".into()),
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: Some(volumes),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn cm_volume(name: &str, cm: &str) -> Volume {
        Volume {
            name: name.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: cm.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn config_maps_are_written_updated_and_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let manager = VolumeManager::new(dir.path());
        let fixed = Arc::new(Fixed::default());
        let node = NodeContext {
            sources: Some(Sources(fixed.clone())),
            ..Default::default()
        };
        let p = pod(vec![cm_volume("config", "app")]);
        let v = manager.prepare(&p, &node).await.unwrap();
        assert_eq!(
            v.failures(),
            ["MountVolume.SetUp failed for volume \"config\" : configmap \"app\" not found"]
        );
        fixed.config_maps.lock().insert(
            "app".into(),
            ConfigMap {
                data: Some(BTreeMap::from([("k".to_string(), "v1".to_string())])),
                ..Default::default()
            },
        );
        let v = manager.prepare(&p, &node).await.unwrap();
        assert!(v.failures().is_empty());
        let path = dir
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~configmap/config");
        assert_eq!(std::fs::read_to_string(path.join("k")).unwrap(), "v1");
        fixed.config_maps.lock().get_mut("app").unwrap().data =
            Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
        manager.prepare(&p, &node).await.unwrap();
        assert_eq!(std::fs::read_to_string(path.join("k")).unwrap(), "v2");
        // Deleted: the last contents stay, the failure is reported.
        fixed.config_maps.lock().clear();
        let v = manager.prepare(&p, &node).await.unwrap();
        assert_eq!(v.failures().len(), 1);
        assert_eq!(std::fs::read_to_string(path.join("k")).unwrap(), "v2");
        assert_eq!(manager.pods_with_volumes(), ["uid-1"]);
        manager.cleanup("uid-1").unwrap();
        assert!(!dir.path().join("pods/uid-1").exists());
        assert!(manager.pods_with_volumes().is_empty());
    }

    #[tokio::test]
    async fn projected_volumes_hold_tokens_and_fields() {
        let dir = tempfile::tempdir().unwrap();
        let manager = VolumeManager::new(dir.path());
        let fixed = Arc::new(Fixed::default());
        let node = NodeContext {
            sources: Some(Sources(fixed.clone())),
            ..Default::default()
        };
        let volume = Volume {
            name: "api".into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o644),
                sources: Some(vec![
                    VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            audience: Some("vault".into()),
                            path: "token".into(),
                            expiration_seconds: None,
                        }),
                        ..Default::default()
                    },
                    VolumeProjection {
                        downward_api: Some(DownwardAPIProjection {
                            items: Some(vec![DownwardAPIVolumeFile {
                                path: "namespace".into(),
                                field_ref: Some(ObjectFieldSelector {
                                    field_path: "metadata.namespace".into(),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }]),
                        }),
                        ..Default::default()
                    },
                ]),
            }),
            ..Default::default()
        };
        let empty = Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        };
        let v = manager
            .prepare(&pod(vec![volume, empty]), &node)
            .await
            .unwrap();
        assert!(v.failures().is_empty(), "{:?}", v.failures());
        let path = dir
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~projected/api");
        assert_eq!(std::fs::read_to_string(path.join("token")).unwrap(), "tok");
        assert_eq!(
            std::fs::read_to_string(path.join("namespace")).unwrap(),
            "ns"
        );
        let asked = fixed.tokens.lock().clone();
        assert_eq!(asked[0].audience, "vault");
        assert_eq!(asked[0].expiration_seconds, 3600);
        assert_eq!(asked[0].service_account, "default");
        assert_eq!(asked[0].pod_uid, "uid-1");
        assert!(dir
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~empty-dir/scratch")
            .is_dir());
        assert_eq!(v.eviction(), None);
    }

    #[tokio::test]
    async fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit_detached_on_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        let manager = VolumeManager::new(dir.path());
        let memory = Volume {
            name: "cache".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                    "1Mi".into(),
                )),
            }),
            ..Default::default()
        };
        let p = pod(vec![memory]);
        let v = manager.prepare(&p, &NodeContext::default()).await.unwrap();
        if let Some(failure) = v.failures().first() {
            // Mounting needs CAP_SYS_ADMIN; without it the volume says so.
            assert!(failure.contains("not permitted"), "{failure}");
            return;
        }
        let path = dir
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
        assert!(emptydir::is_mount_point(&path).unwrap());
        // Set up again: the same mount, not a second one.
        manager.prepare(&p, &NodeContext::default()).await.unwrap();
        assert_eq!(emptydir::mounts_under(&path).len(), 1);
        // The tmpfs holds at most its limit.
        assert!(std::fs::write(path.join("big"), vec![1u8; 2 * 1024 * 1024]).is_err());
        manager.cleanup("uid-1").unwrap();
        assert!(emptydir::mounts_under(&path).is_empty());
        assert!(!dir.path().join("pods/uid-1").exists());
    }

    #[tokio::test]
    async fn an_empty_dir_over_its_limit_evicts_and_unknown_kinds_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let manager = VolumeManager::new(dir.path());
        let limited = Volume {
            name: "scratch".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                size_limit: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                    "64Ki".into(),
                )),
                ..Default::default()
            }),
            ..Default::default()
        };
        let nfs = Volume {
            name: "remote".into(),
            nfs: Some(Default::default()),
            ..Default::default()
        };
        let p = pod(vec![limited, nfs]);
        let node = NodeContext::default();
        let v = manager.prepare(&p, &node).await.unwrap();
        assert_eq!(v.eviction(), None);
        assert_eq!(
            v.failures(),
            ["MountVolume.SetUp failed for volume \"remote\" : volume type nfs is not supported by this node"]
        );
        let scratch = dir
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~empty-dir/scratch");
        std::fs::write(scratch.join("big"), vec![7u8; 128 * 1024]).unwrap();
        let v = manager.prepare(&p, &node).await.unwrap();
        assert_eq!(
            v.eviction(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"64Ki\". ")
        );
    }
}
