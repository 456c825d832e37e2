//! A pod's volumes on the node: prepared once per sync into directories of the node, then
//! mounted into each container by its runtime (bind mounts in the process runtime's mount
//! namespace, CRI mounts in the CRI runtime).

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Container;

/// The volumes of one pod as prepared for one sync: each volume's directory on the node.
#[derive(Clone, Debug, Default)]
pub struct PodVolumes {}

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

/// Why `container`'s volume mounts cannot be given on this node, if they cannot: both
/// runtimes check this before they create a container, so a container never runs without
/// the files it expects.
pub fn unsupported_mounts(container: &Container) -> Option<String> {
    let mount = container.volume_mounts.iter().flatten().next()?;
    Some(format!(
        "volume {:?} (mounted at {}): volume mounts are not supported by this node yet",
        mount.name, mount.mount_path
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::VolumeMount;

    #[test]
    fn mounts_are_named_while_they_are_refused() {
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(unsupported_mounts(&c), None);
        c.volume_mounts = Some(vec![VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        }]);
        assert_eq!(
            unsupported_mounts(&c).unwrap(),
            "volume \"data\" (mounted at /data): volume mounts are not supported by this node yet"
        );
    }
}
