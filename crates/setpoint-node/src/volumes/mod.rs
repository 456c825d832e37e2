//! A pod's volumes on the node: prepared on every sync into directories of the node
//! ([`VolumeManager`]), then mounted into each container by its runtime (bind mounts in the
//! process runtime's mount namespace, CRI mounts in the CRI runtime) as
//! [`PodVolumes::mounts_for`] lists them.
//!
//! - [`writer`]: the kubelet's atomic writer (`..data` swapped by a rename).
//! - [`projection`]: the payloads of `configMap`, `secret`, `downwardAPI` and `projected`
//!   volumes; [`downward`]: the pod's fields and resources as those files hold them.
//! - [`emptydir`], [`hostpath`], [`claim`]: the other kinds.
//! - [`subpath`]: `subPath` and `subPathExpr`.
//! - [`manager`]: the I/O, per sync and per removed pod.
//!
//! docs/volumes.md says what each kind does on this node and what is refused.

pub mod claim;
pub mod downward;
pub mod emptydir;
pub mod hostpath;
pub mod manager;
pub mod projection;
pub mod subpath;
pub mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;

pub use manager::VolumeManager;

/// What keeps the manager from handling a pod at all (a single volume's failure is not one:
/// it is reported in [`PodVolumes`]).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The pod's uid cannot name a directory.
    #[error("pod uid {0:?} cannot name a volume directory")]
    BadUid(String),
    /// The file system refused.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// One volume as the latest sync left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedVolume {
    /// The node's directory (or file) holding it; `None` while it was never set up.
    pub path: Option<PathBuf>,
    /// The volume itself is read-only (ConfigMap, Secret, downwardAPI and projected
    /// volumes always are; a claim when its source says `readOnly`).
    pub read_only: bool,
    /// Why the latest set-up failed, as the kubelet's `FailedMount` event words it.
    pub error: Option<String>,
}

/// The volumes of one pod as prepared for one sync: each volume's directory on the node.
#[derive(Clone, Debug, Default)]
pub struct PodVolumes {
    volumes: BTreeMap<String, PreparedVolume>,
    eviction: Option<String>,
}

/// One mount of a container: a path of the node at a path of the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerMount {
    /// What is mounted: a volume's directory, or a file or directory inside it (`subPath`).
    pub host_path: PathBuf,
    /// Where the container sees it (`mountPath`).
    pub container_path: String,
    /// Mounted read-only (`readOnly` of the mount, or of the volume source).
    pub read_only: bool,
}

impl PodVolumes {
    /// One volume by name.
    pub fn get(&self, name: &str) -> Option<&PreparedVolume> {
        self.volumes.get(name)
    }

    /// The `FailedMount` messages of the volumes whose latest set-up failed, by volume name.
    pub fn failures(&self) -> Vec<&str> {
        self.volumes
            .values()
            .filter_map(|v| v.error.as_deref())
            .collect()
    }

    /// The kubelet's eviction message when an emptyDir is over its `sizeLimit`: the pod is
    /// to be stopped and fail with reason `Evicted` ([`emptydir::EVICTED_REASON`]).
    pub fn eviction(&self) -> Option<&str> {
        self.eviction.as_deref()
    }

    /// The `FailedMount` message of the first volume `container` mounts that was never set
    /// up: the container waits (`ContainerCreating`, as the kubelet waits for a pod's
    /// volumes) until it is. A volume that was set up before and whose update failed is not
    /// waited for: it keeps its last contents, as a volume the kubelet has mounted does.
    pub fn waiting_for(&self, container: &Container) -> Option<&str> {
        container
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| self.volumes.get(&m.name))
            .find(|v| v.path.is_none())
            .and_then(|v| v.error.as_deref())
    }

    /// The mounts of `container`, whose environment is `env` (for `subPathExpr`), in the
    /// order of its `volumeMounts`. `Err` says why the container cannot be created yet: a
    /// volume that was never set up (its `FailedMount` message), a bad `subPath`, or a
    /// mount this node does not give (`mountPropagation` other than `None`).
    pub fn mounts_for(
        &self,
        container: &Container,
        env: &[(String, String)],
    ) -> Result<Vec<ContainerMount>, String> {
        let mut out = Vec::new();
        for mount in container.volume_mounts.iter().flatten() {
            if let Some(why) = unsupported_mount(mount) {
                return Err(why);
            }
            let volume = self.volumes.get(&mount.name).ok_or_else(|| {
                format!(
                    "volume {:?} (mounted at {}) is not a volume of the pod",
                    mount.name, mount.mount_path
                )
            })?;
            let Some(path) = &volume.path else {
                return Err(volume
                    .error
                    .clone()
                    .unwrap_or_else(|| format!("volume {:?} is not set up", mount.name)));
            };
            let sub = subpath::sub_path(mount, env)?;
            let host_path = if sub.is_empty() {
                path.clone()
            } else {
                subpath::resolve(path, &sub, mount, container)?
            };
            out.push(ContainerMount {
                host_path,
                container_path: mount.mount_path.clone(),
                read_only: mount.read_only.unwrap_or(false) || volume.read_only,
            });
        }
        Ok(out)
    }
}

/// Why this node cannot give one volume mount as asked: a `mountPropagation` other than
/// `None` (the mount's own, private propagation is all either runtime gives).
fn unsupported_mount(mount: &k8s_openapi::api::core::v1::VolumeMount) -> Option<String> {
    match mount.mount_propagation.as_deref() {
        None | Some("") | Some("None") => None,
        Some(other) => Some(format!(
            "mountPropagation {other} is not supported by this node"
        )),
    }
}

/// Why `container`'s volume mounts cannot be given on this node, if they cannot (a
/// `mountPropagation` other than `None`): both runtimes check this before they create a
/// container, so a container never runs without the mounts it expects.
pub fn unsupported_mounts(container: &Container) -> Option<String> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .find_map(unsupported_mount)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::VolumeMount;

    #[test]
    fn only_mount_propagation_is_refused() {
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(unsupported_mounts(&c), None);
        let mut shared = VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        };
        c.volume_mounts = Some(vec![shared.clone()]);
        assert_eq!(unsupported_mounts(&c), None);
        shared.mount_propagation = Some("Bidirectional".into());
        c.volume_mounts = Some(vec![shared]);
        assert_eq!(
            unsupported_mounts(&c).unwrap(),
            "mountPropagation Bidirectional is not supported by this node"
        );
    }

    fn volumes(dir: &std::path::Path) -> PodVolumes {
        PodVolumes {
            volumes: BTreeMap::from([
                (
                    "config".to_string(),
                    PreparedVolume {
                        path: Some(dir.to_path_buf()),
                        read_only: true,
                        error: None,
                    },
                ),
                (
                    "broken".to_string(),
                    PreparedVolume {
                        path: None,
                        read_only: false,
                        error: Some("MountVolume.SetUp failed for volume \"broken\" : configmap \"x\" not found".into()),
                    },
                ),
            ]),
            eviction: None,
        }
    }

    fn container(mounts: Vec<VolumeMount>) -> Container {
        Container {
            name: "app".into(),
            volume_mounts: Some(mounts),
            ..Default::default()
        }
    }

    fn mount(name: &str, at: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: at.into(),
            ..Default::default()
        }
    }

    #[test]
    fn mounts_name_their_volume_paths_and_refuse_what_is_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.conf"), "x").unwrap();
        let v = volumes(dir.path());
        let mut sub = mount("config", "/etc/app.conf");
        sub.sub_path = Some("app.conf".into());
        let got = v
            .mounts_for(&container(vec![mount("config", "/etc/app"), sub]), &[])
            .unwrap();
        assert_eq!(got[0].host_path, dir.path());
        assert!(got[0].read_only);
        assert_eq!(got[0].container_path, "/etc/app");
        assert_eq!(
            got[1].host_path,
            dir.path().canonicalize().unwrap().join("app.conf")
        );
        assert_eq!(
            v.waiting_for(&container(vec![mount("config", "/etc/app")])),
            None
        );
        assert_eq!(
            v.waiting_for(&container(vec![
                mount("config", "/a"),
                mount("broken", "/b")
            ])),
            Some("MountVolume.SetUp failed for volume \"broken\" : configmap \"x\" not found")
        );
        assert_eq!(
            v.mounts_for(&container(vec![mount("broken", "/b")]), &[])
                .unwrap_err(),
            "MountVolume.SetUp failed for volume \"broken\" : configmap \"x\" not found"
        );
        let mut shared = mount("config", "/etc/app");
        shared.mount_propagation = Some("HostToContainer".into());
        assert_eq!(
            v.mounts_for(&container(vec![shared]), &[]).unwrap_err(),
            "mountPropagation HostToContainer is not supported by this node"
        );
        let mut none = mount("config", "/etc/app");
        none.mount_propagation = Some("None".into());
        assert!(v.mounts_for(&container(vec![none]), &[]).is_ok());
    }
}
