//! `subPath` and `subPathExpr`: a path inside a volume mounted instead of the whole volume,
//! checked as the kubelet checks it (relative, no `..`, and inside the volume once symlinks
//! are resolved) and created as a directory when missing.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, VolumeMount};

use crate::process::expand;

/// The mount's sub-path: `subPath` as written, or `subPathExpr` expanded with the
/// container's environment (a variable it does not define, or defines empty, is an error,
/// as the kubelet's `missing value for ...`). Empty when the mount has neither.
pub fn sub_path(mount: &VolumeMount, env: &[(String, String)]) -> Result<String, String> {
    if let Some(p) = mount.sub_path.as_deref().filter(|p| !p.is_empty()) {
        return Ok(p.to_string());
    }
    let Some(expr) = mount.sub_path_expr.as_deref().filter(|p| !p.is_empty()) else {
        return Ok(String::new());
    };
    let missing = std::cell::RefCell::new(BTreeSet::new());
    let expanded = expand::expand(expr, |name| {
        let value = env
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone());
        if value.as_deref().unwrap_or_default().is_empty() {
            missing.borrow_mut().insert(name.to_string());
        }
        Some(value.unwrap_or_default())
    });
    let missing = missing.into_inner();
    if !missing.is_empty() {
        return Err(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(expanded)
}

/// Checks a sub-path's form as the kubelet does before it touches the disk. `Err` is its
/// message.
pub fn validate(sub_path: &str) -> Result<(), String> {
    if sub_path.starts_with('/') {
        return Err(format!(
            "error SubPath `{sub_path}` must not be an absolute path"
        ));
    }
    if sub_path.split('/').any(|p| p == "..") {
        return Err(format!(
            "unable to provision SubPath `{sub_path}`: must not contain '..'"
        ));
    }
    Ok(())
}

/// The path of the node to mount for `sub_path` of the volume at `volume` (which exists):
/// each existing component resolved (symlinks included) and required to stay inside the
/// volume, each missing one created as a directory with the volume's mode. `Err` is the
/// kubelet's message naming the mount and the container; the detail is logged only, as the
/// kubelet keeps the node's layout from the pod.
pub fn resolve(
    volume: &Path,
    sub_path: &str,
    mount: &VolumeMount,
    container: &Container,
) -> Result<PathBuf, String> {
    validate(sub_path)?;
    let base = volume
        .canonicalize()
        .map_err(|e| prepare_error(mount, container, &e))?;
    let mode = std::fs::metadata(&base)
        .map_err(|e| prepare_error(mount, container, &e))?
        .permissions()
        .mode()
        & 0o7777;
    let mut current = base.clone();
    for component in Path::new(sub_path).components() {
        let Component::Normal(name) = component else {
            continue;
        };
        let next = current.join(name);
        match std::fs::symlink_metadata(&next) {
            Ok(_) => {
                let real = next
                    .canonicalize()
                    .map_err(|e| prepare_error(mount, container, &e))?;
                if !real.starts_with(&base) {
                    tracing::warn!(container = %container.name, mount = %mount.name, path = %real.display(), "subPath leaves its volume");
                    return Err(prepare_message(mount, container));
                }
                current = real;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let made = std::fs::DirBuilder::new().mode(mode).create(&next);
                if let Err(e) = made.and_then(|()| {
                    std::fs::set_permissions(&next, std::fs::Permissions::from_mode(mode))
                }) {
                    tracing::warn!(container = %container.name, mount = %mount.name, error = %e, "creating a subPath directory");
                    return Err(format!(
                        "failed to create subPath directory for volumeMount {:?} of container {:?}",
                        mount.name, container.name
                    ));
                }
                current = next;
            }
            Err(e) => return Err(prepare_error(mount, container, &e)),
        }
    }
    Ok(current)
}

fn prepare_message(mount: &VolumeMount, container: &Container) -> String {
    format!(
        "failed to prepare subPath for volumeMount {:?} of container {:?}",
        mount.name, container.name
    )
}

fn prepare_error(mount: &VolumeMount, container: &Container, e: &io::Error) -> String {
    tracing::warn!(container = %container.name, mount = %mount.name, error = %e, "preparing a subPath");
    prepare_message(mount, container)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(sub: Option<&str>, expr: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            sub_path: sub.map(Into::into),
            sub_path_expr: expr.map(Into::into),
            ..Default::default()
        }
    }

    fn container() -> Container {
        Container {
            name: "app".into(),
            ..Default::default()
        }
    }

    #[test]
    fn sub_path_expressions_expand_from_the_environment() {
        let env = vec![
            ("POD".to_string(), "web-1".to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        assert_eq!(sub_path(&mount(Some("a/b"), None), &env).unwrap(), "a/b");
        assert_eq!(
            sub_path(&mount(None, Some("logs/$(POD)")), &env).unwrap(),
            "logs/web-1"
        );
        assert_eq!(sub_path(&mount(None, None), &env).unwrap(), "");
        assert_eq!(
            sub_path(&mount(None, Some("$(NOPE)/$(EMPTY)")), &env).unwrap_err(),
            "missing value for EMPTY, NOPE"
        );
    }

    #[test]
    fn sub_paths_stay_relative_and_inside() {
        assert_eq!(
            validate("/etc").unwrap_err(),
            "error SubPath `/etc` must not be an absolute path"
        );
        assert_eq!(
            validate("a/../../b").unwrap_err(),
            "unable to provision SubPath `a/../../b`: must not contain '..'"
        );
        assert_eq!(validate("a/..b"), Ok(()));

        let dir = tempfile::tempdir().unwrap();
        let volume = dir.path().join("vol");
        std::fs::create_dir(&volume).unwrap();
        std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o750)).unwrap();
        let outside = dir.path().join("secret");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, volume.join("escape")).unwrap();
        std::os::unix::fs::symlink("inner", volume.join("ok")).unwrap();
        std::fs::create_dir(volume.join("inner")).unwrap();

        let (m, c) = (mount(Some("x"), None), container());
        let made = resolve(&volume, "new/deeper", &m, &c).unwrap();
        assert_eq!(made, volume.canonicalize().unwrap().join("new/deeper"));
        assert!(made.is_dir());
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750);
        assert_eq!(
            resolve(&volume, "ok", &m, &c).unwrap(),
            volume.canonicalize().unwrap().join("inner")
        );
        assert_eq!(
            resolve(&volume, "escape/x", &m, &c).unwrap_err(),
            "failed to prepare subPath for volumeMount \"data\" of container \"app\""
        );
        assert!(!outside.join("x").exists());
    }
}
