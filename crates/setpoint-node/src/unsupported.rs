//! What a container may ask for that no runtime of this node gives it yet: an environment
//! variable whose `valueFrom` names a source this node does not know (volume mounts:
//! [`crate::volumes::unsupported_mounts`]); and what only the CRI runtime gives (lifecycle
//! hooks and `stdin`, [`in_process`]).
//!
//! Both the process and the CRI runtime ask [`unsupported`] before they create a container,
//! so a container that needs one of these waits with `CreateContainerConfigError` and a
//! message naming what is missing, instead of running with an empty variable or without the
//! files it expects. ConfigMaps, Secrets, resource and pod fields, and `envFrom` are given
//! ([`crate::process::expand::container_env`]).

use k8s_openapi::api::core::v1::Container;

/// Why `container` cannot be created on this node, if it asks for something not given yet.
pub fn unsupported(container: &Container) -> Option<String> {
    for var in container.env.iter().flatten() {
        let Some(source) = &var.value_from else {
            continue;
        };
        let known = source.field_ref.is_some()
            || source.resource_field_ref.is_some()
            || source.config_map_key_ref.is_some()
            || source.secret_key_ref.is_some();
        if !known {
            return Some(format!(
                "env var {}: this valueFrom source is not supported by this node",
                var.name
            ));
        }
    }
    None
}

/// Why the process runtime cannot run `container`: its lifecycle hooks (`postStart`,
/// `preStop`) need a container to run in, and `stdin` a stream the workload keeps open,
/// which only the CRI runtime has (process workloads read `/dev/null`). Refused rather than
/// ignored, so a pod that counts on them never runs without them.
pub fn in_process(container: &Container) -> Option<String> {
    if container.stdin == Some(true) {
        return Some(
            "stdin is not supported by the process runtime; use --container-runtime cri"
                .to_string(),
        );
    }
    let lifecycle = container.lifecycle.as_ref()?;
    let names: Vec<&str> = [
        lifecycle.post_start.as_ref().map(|_| "postStart"),
        lifecycle.pre_stop.as_ref().map(|_| "preStop"),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!names.is_empty()).then(|| {
        format!(
            "lifecycle hooks ({}) are not supported by the process runtime; use --container-runtime cri",
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    };

    fn var(name: &str, source: EnvVarSource) -> EnvVar {
        EnvVar {
            name: name.into(),
            value_from: Some(source),
            ..Default::default()
        }
    }

    #[test]
    fn field_refs_and_plain_values_are_given() {
        let c = Container {
            name: "c".into(),
            env: Some(vec![
                EnvVar {
                    name: "A".into(),
                    value: Some("1".into()),
                    ..Default::default()
                },
                var(
                    "B",
                    EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.name".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ),
            ]),
            ..Default::default()
        };
        assert_eq!(unsupported(&c), None);
    }

    #[test]
    fn the_process_runtime_names_the_hooks_it_refuses() {
        use k8s_openapi::api::core::v1::{Lifecycle, LifecycleHandler, SleepAction};
        let handler = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 1 }),
            ..Default::default()
        };
        let mut c = Container {
            name: "c".into(),
            ..Default::default()
        };
        assert_eq!(in_process(&c), None);
        c.lifecycle = Some(Lifecycle::default());
        assert_eq!(in_process(&c), None);
        c.lifecycle = Some(Lifecycle {
            post_start: Some(handler.clone()),
            pre_stop: Some(handler),
        });
        assert_eq!(
            in_process(&c).unwrap(),
            "lifecycle hooks (postStart, preStop) are not supported by the process runtime; use --container-runtime cri"
        );
        c.lifecycle = None;
        c.stdin = Some(false);
        assert_eq!(in_process(&c), None);
        c.stdin = Some(true);
        assert_eq!(
            in_process(&c).unwrap(),
            "stdin is not supported by the process runtime; use --container-runtime cri"
        );
    }

    #[test]
    fn config_sources_are_given_and_an_empty_source_is_named() {
        let mut c = Container {
            name: "c".into(),
            env: Some(vec![var(
                "X",
                EnvVarSource {
                    config_map_key_ref: Some(ConfigMapKeySelector {
                        name: "cm".into(),
                        key: "k".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )]),
            env_from: Some(vec![EnvFromSource::default()]),
            ..Default::default()
        };
        assert_eq!(unsupported(&c), None);
        c.env = Some(vec![var("Y", EnvVarSource::default())]);
        assert_eq!(
            unsupported(&c).unwrap(),
            "env var Y: this valueFrom source is not supported by this node"
        );
    }
}
