//! The node's half of the local-path provisioner: the directories of this node's local-path
//! volumes.
//!
//! The provisioner (in the controller manager) creates a `hostPath` volume under the directory
//! this component publishes on its Node (`setpoint.io/local-path-dir`), with node affinity to
//! this node. Here, each such volume's directory is created; once the volume is `Released`
//! with reclaim policy `Delete`, its directory is removed and then the volume deleted, as
//! k3s's local-path provisioner does with a helper pod on the node. Only paths inside the
//! published directory are ever touched.
//!
//! [`plan`] is the pure decision; [`run`] does the I/O.

use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use serde_json::{json, Value};
use setpoint_api::storage as st;
use setpoint_runtime::client::{Api, Client, DeleteParams, Patch, PatchParams};
use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
use setpoint_runtime::informer::{Scope, SharedInformers, Store};
use setpoint_runtime::ObjectKey;

/// The controller's name (work queue, logs).
pub const NAME: &str = "local-path";

/// What to do about one volume on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Not this node's local-path volume, or nothing to do.
    Nothing,
    /// Make sure the directory exists.
    Create(PathBuf),
    /// Remove the directory, then delete the volume.
    Remove(PathBuf),
}

/// The node names a volume's required node affinity allows by `kubernetes.io/hostname In`.
fn affinity_nodes(pv: &Value) -> Vec<&str> {
    pv.pointer("/spec/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("matchExpressions").and_then(Value::as_array))
        .flatten()
        .filter(|e| {
            e.get("key").and_then(Value::as_str) == Some(st::HOSTNAME_LABEL)
                && e.get("operator").and_then(Value::as_str) == Some("In")
        })
        .filter_map(|e| e.get("values").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// `path` if it lies strictly inside `root` without `..` or other tricks.
fn inside(root: &Path, path: &str) -> Option<PathBuf> {
    let p = Path::new(path);
    let rest = p.strip_prefix(root).ok()?;
    let plain = rest.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && rest.components().next().is_some()).then(|| p.to_path_buf())
}

/// The pure decision for a volume, on node `node` whose local-path directory is `root`.
pub fn plan(pv: &Value, node: &str, root: &Path) -> Plan {
    let provisioned_here = pv
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(st::PROVISIONED_BY_ANNOTATION))
        .and_then(Value::as_str)
        == Some(st::LOCAL_PATH_PROVISIONER);
    if !provisioned_here || !affinity_nodes(pv).contains(&node) {
        return Plan::Nothing;
    }
    let Some(path) = pv
        .pointer("/spec/hostPath/path")
        .and_then(Value::as_str)
        .and_then(|p| inside(root, p))
    else {
        return Plan::Nothing;
    };
    let phase = pv.pointer("/status/phase").and_then(Value::as_str);
    let policy = pv
        .pointer("/spec/persistentVolumeReclaimPolicy")
        .and_then(Value::as_str);
    let deleting = pv
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    if phase == Some("Released") && policy == Some("Delete") {
        Plan::Remove(path)
    } else if deleting {
        Plan::Nothing
    } else {
        Plan::Create(path)
    }
}

struct LocalPath {
    client: Client,
    node: String,
    root: PathBuf,
    volumes: Store<PersistentVolume>,
}

#[async_trait::async_trait]
impl Reconciler for LocalPath {
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
        let Some(pv) = self.volumes.get(key) else {
            ctx.observe("the PersistentVolume is gone");
            return Ok(Action::Done);
        };
        let value = serde_json::to_value(pv.as_ref()).unwrap_or(Value::Null);
        match plan(&value, &self.node, &self.root) {
            Plan::Nothing => {
                ctx.observe(format!(
                    "not a local-path volume of node {} (or being deleted): nothing to do",
                    self.node
                ));
                Ok(Action::Done)
            }
            Plan::Create(path) => {
                let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
                ctx.observe(format!(
                    "local-path volume of node {} at {}, phase {}",
                    self.node,
                    path.display(),
                    phase.unwrap_or("none")
                ));
                // `create_dir` leaves an existing directory alone: only a missing one is an action.
                if !path.is_dir() {
                    ctx.action(
                        format!("create directory {}", path.display()),
                        "a local-path volume of this node has no directory yet",
                    );
                }
                create_dir(&path).map_err(|e| {
                    ReconcileError::retry(format!("creating {}: {e}", path.display()))
                })?;
                Ok(Action::Done)
            }
            Plan::Remove(path) => {
                ctx.observe(format!(
                    "local-path volume of node {} at {}, phase Released, reclaim policy Delete",
                    self.node,
                    path.display()
                ));
                ctx.action(
                    format!(
                        "remove directory {}, then delete volume {}",
                        path.display(),
                        key.name
                    ),
                    "Released (its claim is gone) with reclaim policy Delete",
                );
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(ReconcileError::retry(format!(
                            "removing {}: {e}",
                            path.display()
                        )))
                    }
                }
                tracing::info!(volume = %key.name, path = %path.display(), "removed a released local-path volume");
                let api: Api<PersistentVolume> = Api::all(self.client.clone());
                let params = DeleteParams {
                    precondition_uid: pv.metadata.uid.clone(),
                    ..Default::default()
                };
                match api.delete(&key.name, &params).await {
                    Ok(_) => Ok(Action::Done),
                    Err(e) if e.is_not_found() || e.is_conflict() => Ok(Action::Done),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

/// Creates a volume directory writable by any user of the pod, as k3s's provisioner does
/// (pods may run as any uid).
fn create_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if path.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))
}

/// Publishes `root` on the Node (retrying until the agent has registered it).
async fn publish(client: &Client, node: &str, root: &Path) {
    let api: Api<Node> = Api::all(client.clone());
    let patch = Patch::Merge(json!({"metadata": {"annotations": {
        st::LOCAL_PATH_DIR_ANNOTATION: root.display().to_string()
    }}}));
    let mut wait = std::time::Duration::from_millis(100);
    loop {
        match api.patch(node, &PatchParams::default(), &patch).await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(error = %e, "publishing the local-path directory; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(5));
            }
        }
    }
}

/// Runs the local-path component for `node`, whose volumes live under `root`, until
/// `shutdown` resolves.
pub async fn run(
    client: Client,
    node: String,
    root: PathBuf,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    std::fs::create_dir_all(&root)?;
    let root = root.canonicalize()?;
    let informers = SharedInformers::new(client.clone());
    let volumes = informers.typed::<PersistentVolume>(Scope::all()).store();
    let controller = Controller::for_type::<PersistentVolume>(NAME, &informers, None).build(
        Arc::new(LocalPath {
            client: client.clone(),
            node: node.clone(),
            root: root.clone(),
            volumes,
        }),
    );
    let work = async {
        publish(&client, &node, &root).await;
        controller.run(std::future::pending()).await;
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
    informers.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(node: &str, path: &str, phase: &str, policy: &str) -> Value {
        json!({"metadata": {"name": "pvc-1", "annotations": {st::PROVISIONED_BY_ANNOTATION: st::LOCAL_PATH_PROVISIONER}},
               "spec": {"hostPath": {"path": path}, "persistentVolumeReclaimPolicy": policy,
                        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                            {"key": st::HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}}},
               "status": {"phase": phase}})
    }

    #[test]
    fn only_this_nodes_volumes_inside_the_root() {
        let root = Path::new("/data/storage");
        assert_eq!(
            plan(
                &pv("n1", "/data/storage/pvc-1_ns_c", "Bound", "Delete"),
                "n1",
                root
            ),
            Plan::Create("/data/storage/pvc-1_ns_c".into())
        );
        assert_eq!(
            plan(&pv("n2", "/data/storage/x", "Bound", "Delete"), "n1", root),
            Plan::Nothing
        );
        assert_eq!(
            plan(&pv("n1", "/etc", "Released", "Delete"), "n1", root),
            Plan::Nothing
        );
        assert_eq!(
            plan(
                &pv("n1", "/data/storage/../x", "Released", "Delete"),
                "n1",
                root
            ),
            Plan::Nothing
        );
        assert_eq!(
            plan(&pv("n1", "/data/storage", "Released", "Delete"), "n1", root),
            Plan::Nothing
        );
        let mut other = pv("n1", "/data/storage/x", "Bound", "Delete");
        other["metadata"]["annotations"] = json!({});
        assert_eq!(plan(&other, "n1", root), Plan::Nothing);
    }

    #[test]
    fn released_delete_volumes_are_removed_retain_ones_kept() {
        let root = Path::new("/data/storage");
        assert_eq!(
            plan(
                &pv("n1", "/data/storage/a", "Released", "Delete"),
                "n1",
                root
            ),
            Plan::Remove("/data/storage/a".into())
        );
        assert_eq!(
            plan(
                &pv("n1", "/data/storage/a", "Released", "Retain"),
                "n1",
                root
            ),
            Plan::Create("/data/storage/a".into())
        );
    }
}
