//! A container's CRI configuration, as the kubelet builds it: image, `command`/`args` with
//! `$(VAR)` expansion, environment, working directory, the labels the agent finds it by
//! again (`io.kubernetes.container.name` and the pod's), the restart count as an
//! annotation, the log path `<container>/<attempt>.log` under the sandbox's log directory,
//! Linux resources from requests and limits, and the security context.
//!
//! Volume mounts are the pod's prepared volumes ([`crate::volumes::PodVolumes::mounts_for`]),
//! bind-mounted with private propagation; a mount that cannot be given (a bad `subPath`)
//! keeps the container from being created: it waits with `CreateContainerConfigError` and
//! the kubelet's message.
//!
//! The environment is [`expand::container_env`]'s (ConfigMaps, Secrets, resource and pod
//! fields, Services; `docs/environment.md`); what it cannot give keeps the container from
//! being created, waiting with `CreateContainerConfigError` and the kubelet's message.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use setpoint_cri_proto as cri;

use super::resources::{self, LinuxResources};
use super::sandbox::{self, CONTAINER_NAME_LABEL};
use crate::process::expand::{self, FieldContext};
use crate::volumes::ContainerMount;

/// The annotation carrying the container's restart count.
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";

/// The annotation carrying the image the container was created for: the one field of a
/// container an update may change, after which the container is restarted with the new
/// image, as the kubelet restarts containers whose definition changed.
pub const IMAGE_ANNOTATION: &str = "io.kubernetes.container.image";

/// The log path of a container's `attempt`-th run, relative to the sandbox's log directory.
pub fn log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}

fn to_cri(r: LinuxResources) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit,
        oom_score_adj: r.oom_score_adj,
        ..Default::default()
    }
}

/// A volume mount as CRI takes it: private propagation, the only kind this node gives
/// ([`crate::volumes::PodVolumes::mounts_for`] refuses the others).
fn to_cri_mount(m: ContainerMount) -> cri::Mount {
    cri::Mount {
        container_path: m.container_path,
        host_path: m.host_path.to_string_lossy().into_owned(),
        readonly: m.read_only,
        propagation: cri::MountPropagation::PropagationPrivate as i32,
        ..Default::default()
    }
}

/// The container's security context: the container's settings over the pod's.
fn security_context(
    pod: &Pod,
    container: &Container,
) -> Result<cri::LinuxContainerSecurityContext, String> {
    let psc = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.clone())
        .unwrap_or_default();
    let csc = container.security_context.clone().unwrap_or_default();
    let caps = csc.capabilities.clone().unwrap_or_default();
    Ok(cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged: csc.privileged.unwrap_or(false),
        namespace_options: Some(sandbox::namespace_options(pod)),
        run_as_user: csc
            .run_as_user
            .or(psc.run_as_user)
            .map(|value| cri::Int64Value { value }),
        run_as_group: csc
            .run_as_group
            .or(psc.run_as_group)
            .map(|value| cri::Int64Value { value }),
        readonly_rootfs: csc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: psc
            .supplemental_groups
            .clone()
            .unwrap_or_default()
            .into_iter()
            .chain(psc.fs_group)
            .collect(),
        no_new_privs: csc.allow_privilege_escalation == Some(false),
        seccomp: Some(seccomp(pod, Some(container))?),
        ..Default::default()
    })
}

/// The seccomp profile of a container (its own, else the pod's) or of the sandbox
/// (`container` `None`: the pod's): `RuntimeDefault`, or `Unconfined` when none is set, as
/// the kubelet does without `seccompDefault`. Localhost profiles are not supported yet.
pub fn seccomp(pod: &Pod, container: Option<&Container>) -> Result<cri::SecurityProfile, String> {
    let profile = container
        .and_then(|c| c.security_context.as_ref())
        .and_then(|s| s.seccomp_profile.clone())
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.seccomp_profile.clone())
        });
    let kind = match profile.as_ref().map(|p| p.type_.as_str()) {
        Some("RuntimeDefault") => cri::security_profile::ProfileType::RuntimeDefault,
        None | Some("Unconfined") => cri::security_profile::ProfileType::Unconfined,
        Some("Localhost") => {
            return Err(
                "seccompProfile type Localhost is not supported by the CRI runtime yet".to_string(),
            )
        }
        Some(other) => return Err(format!("unknown seccompProfile type {other:?}")),
    };
    Ok(cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: String::new(),
    })
}

/// The kubelet's `runAsNonRoot` check, given the user the image runs as (`uid`, or a user
/// name when it is not numeric; an image naming neither runs as root). `Err` is the
/// `CreateContainerConfigError` message.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = container.security_context.as_ref();
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or_else(|| psc.and_then(|s| s.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (name, namespace, uid) = sandbox::identity(pod);
    let who = format!(
        "(pod: \"{name}_{namespace}({uid})\", container: {})",
        container.name
    );
    let run_as = csc
        .and_then(|s| s.run_as_user)
        .or_else(|| psc.and_then(|s| s.run_as_user));
    if let Some(user) = run_as {
        return if user == 0 {
            Err(format!(
                "container's runAsUser breaks non-root policy {who}"
            ))
        } else {
            Ok(())
        };
    }
    let image_uid = image_uid.or((image_user.is_empty()).then_some(0));
    match image_uid {
        Some(0) => Err(format!(
            "container has runAsNonRoot and image will run as root {who}"
        )),
        None => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root {who}"
        )),
        Some(_) => Ok(()),
    }
}

/// The CRI configuration of `container`'s `attempt`-th run in `pod`, whose sandbox has the
/// address in `ctx`. An error is the `CreateContainerConfigError` message.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    attempt: u32,
    ctx: &FieldContext,
    node_memory: i64,
) -> Result<cri::ContainerConfig, String> {
    let env = expand::container_env(pod, container, ctx)?;
    let mounts = ctx.volumes.mounts_for(container, &env)?;
    let lookup = |name: &str| env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let expand_all = |words: &Option<Vec<String>>| -> Vec<String> {
        words
            .iter()
            .flatten()
            .map(|w| expand::expand(w, lookup))
            .collect()
    };
    let qos = crate::status::qos_class(pod);
    let resources = resources::linux_resources(container, qos, node_memory)?;
    let mut labels = sandbox::pod_labels(pod);
    labels.insert(CONTAINER_NAME_LABEL.to_string(), container.name.clone());
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let mut annotations = HashMap::from([
        (RESTART_COUNT_ANNOTATION.to_string(), attempt.to_string()),
        (
            IMAGE_ANNOTATION.to_string(),
            container.image.clone().unwrap_or_default(),
        ),
        (
            "io.kubernetes.container.terminationMessagePath".to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".to_string()),
        ),
        (
            "io.kubernetes.pod.terminationGracePeriod".to_string(),
            grace.to_string(),
        ),
    ]);
    // A container is stopped with its preStop hook even when its pod is no longer at hand.
    annotations.extend(super::hooks::annotations(
        container
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref()),
        container.ports.as_deref().unwrap_or_default(),
    ));
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: container.image.clone().unwrap_or_default(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        labels,
        annotations,
        log_path: log_path(&container.name, attempt),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        mounts: mounts.into_iter().map(to_cri_mount).collect(),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(to_cri(resources)),
            security_context: Some(security_context(pod, container)?),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Capabilities, ConfigMapKeySelector, EnvVar, EnvVarSource, PodSpec, ResourceRequirements,
        SecurityContext,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(container: Container) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn container() -> Container {
        Container {
            name: "app".into(),
            image: Some("busybox:1".into()),
            command: Some(vec!["sh".into(), "-c".into()]),
            args: Some(vec!["echo $(GREETING) $$(X)".into()]),
            env: Some(vec![EnvVar {
                name: "GREETING".into(),
                value: Some("hello".into()),
                ..Default::default()
            }]),
            working_dir: Some("/tmp".into()),
            resources: Some(ResourceRequirements {
                limits: Some([("memory".to_string(), Quantity("16Mi".into()))].into()),
                ..Default::default()
            }),
            security_context: Some(SecurityContext {
                run_as_user: Some(1000),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities {
                    add: Some(vec!["NET_ADMIN".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn container_config_as_the_kubelet_builds_it() {
        let c = container();
        let cfg =
            container_config(&pod(c.clone()), &c, 3, &FieldContext::default(), 1 << 30).unwrap();
        assert_eq!(cfg.metadata.as_ref().unwrap().attempt, 3);
        assert_eq!(cfg.image.as_ref().unwrap().image, "busybox:1");
        assert_eq!(cfg.command, ["sh", "-c"]);
        assert_eq!(cfg.args, ["echo hello $(X)"]);
        assert_eq!(cfg.working_dir, "/tmp");
        assert_eq!(cfg.envs[0].key, "GREETING");
        assert_eq!(cfg.labels[CONTAINER_NAME_LABEL], "app");
        assert_eq!(cfg.labels[sandbox::POD_UID_LABEL], "u-1");
        assert_eq!(cfg.annotations[RESTART_COUNT_ANNOTATION], "3");
        assert_eq!(cfg.annotations[IMAGE_ANNOTATION], "busybox:1");
        assert_eq!(cfg.log_path, "app/3.log");
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.resources.unwrap().memory_limit_in_bytes, 16 << 20);
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert!(sc.readonly_rootfs);
        let caps = sc.capabilities.unwrap();
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
        );
    }

    #[test]
    fn seccomp_and_run_as_non_root() {
        let mut c = container();
        let p = pod(c.clone());
        assert_eq!(
            seccomp(&p, Some(&c)).unwrap().profile_type,
            cri::security_profile::ProfileType::Unconfined as i32
        );
        c.security_context.as_mut().unwrap().seccomp_profile =
            Some(k8s_openapi::api::core::v1::SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            });
        assert_eq!(
            seccomp(&p, Some(&c)).unwrap().profile_type,
            cri::security_profile::ProfileType::RuntimeDefault as i32
        );
        // runAsUser 1000 satisfies runAsNonRoot whatever the image says.
        c.security_context.as_mut().unwrap().run_as_non_root = Some(true);
        assert_eq!(verify_run_as_non_root(&p, &c, Some(0), ""), Ok(()));
        c.security_context.as_mut().unwrap().run_as_user = None;
        assert_eq!(
            verify_run_as_non_root(&p, &c, None, ""),
            Err("container has runAsNonRoot and image will run as root (pod: \"web_shop(u-1)\", container: app)".into())
        );
        assert_eq!(
            verify_run_as_non_root(&p, &c, None, "nobody"),
            Err("container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root (pod: \"web_shop(u-1)\", container: app)".into())
        );
        assert_eq!(verify_run_as_non_root(&p, &c, Some(65534), ""), Ok(()));
        c.security_context.as_mut().unwrap().run_as_user = Some(0);
        assert!(verify_run_as_non_root(&p, &c, Some(65534), "")
            .unwrap_err()
            .starts_with("container's runAsUser breaks non-root policy"));
    }

    #[test]
    fn missing_config_maps_are_config_errors() {
        let mut c = container();
        c.env = Some(vec![EnvVar {
            name: "X".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: "cm".into(),
                    key: "k".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        let mut inputs = crate::env::EnvInputs::default();
        inputs
            .config_maps
            .insert("cm".into(), crate::env::Read::Missing);
        let ctx = FieldContext {
            env: std::sync::Arc::new(inputs),
            ..Default::default()
        };
        let err = container_config(&pod(c.clone()), &c, 0, &ctx, 0).unwrap_err();
        assert_eq!(err, "configmap \"cm\" not found");
    }
}
