//! Container lifecycle hooks (`lifecycle.postStart` and `lifecycle.preStop`) as the kubelet
//! runs them: `exec` through CRI `ExecSync` in the container, `httpGet` against the pod's
//! address (or the host it names), `sleep` on the agent's side.
//!
//! - postStart runs right after the container started; a failure kills the run (which then
//!   restarts as `restartPolicy` says) and is reported as a `FailedPostStartHook` Event
//!   (message `PostStartHook failed`: the hook's own output may hold secrets, so it goes only
//!   to the container's waiting message, `PostStartHookError`, and the agent's log).
//! - preStop runs before the stop signal, within the grace period, whenever the agent stops
//!   a running container (pod deletion, liveness failure, a changed image, a failed
//!   postStart); a failure is a `FailedPreStopHook` Event (`PreStopHook failed`) and the stop
//!   goes on. What is left of the grace period, at least 2 s, is the container's to exit.
//!
//! The preStop handler and the container's ports are kept in the container's annotations
//! (the kubelet's `io.kubernetes.container.preStopHandler` and
//! `io.kubernetes.container.ports`), so a container can be stopped with its hook after an
//! agent restart or once its pod is gone from the API.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction, LifecycleHandler};

use super::client::CriClient;
use crate::process::probe::{self, ProbeTarget};

/// The annotation holding a container's preStop handler as JSON (the kubelet's name).
pub const PRE_STOP_ANNOTATION: &str = "io.kubernetes.container.preStopHandler";

/// The annotation holding a container's ports as JSON (the kubelet's name), for the named
/// port of a preStop `httpGet`.
pub const PORTS_ANNOTATION: &str = "io.kubernetes.container.ports";

/// The waiting reason of a container whose postStart hook failed (the kubelet's
/// `ErrPostStartHook`).
pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";

/// The kubelet never gives a container less than this to exit after its preStop hook.
pub const MINIMUM_GRACE: Duration = Duration::from_secs(2);

/// A pod as the kubelet's messages name it (`format.Pod`): `name_namespace(uid)`.
pub fn pod_display(name: &str, namespace: &str, uid: &str) -> String {
    format!("{name}_{namespace}({uid})")
}

/// The grace left to a container after its preStop hook took `spent` of `grace`.
pub fn grace_after_hook(grace: Duration, spent: Duration) -> Duration {
    grace.saturating_sub(spent).max(MINIMUM_GRACE)
}

/// Where a hook runs.
pub struct HookTarget<'a> {
    /// The CRI runtime, for `exec`.
    pub client: Option<&'a CriClient>,
    /// The CRI id of the container.
    pub container_id: &'a str,
    /// The container's name, for messages.
    pub container_name: &'a str,
    /// The pod as messages name it ([`pod_display`]).
    pub pod: &'a str,
    /// The pod's address, the host of an `httpGet` that names none.
    pub pod_ip: &'a str,
    /// The container's ports, for named ports.
    pub ports: &'a [ContainerPort],
}

/// Go's `%v` of a string slice: `[a b c]`.
fn go_slice(words: &[String]) -> String {
    format!("[{}]", words.join(" "))
}

/// Runs `handler`; `Err` is the kubelet's message for the failure.
pub async fn run(handler: &LifecycleHandler, target: &HookTarget<'_>) -> Result<(), String> {
    if let Some(exec) = &handler.exec {
        let command = exec.command.clone().unwrap_or_default();
        let Some(client) = target.client else {
            return Err("Cannot run handler: exec hooks need the container runtime".to_string());
        };
        let (error, output) = match client
            .exec_sync(target.container_id, command.clone(), None)
            .await
        {
            Ok(out) if out.exit_code == 0 => return Ok(()),
            Ok(out) => {
                let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
                let mut output = out.stdout.clone();
                output.extend_from_slice(&out.stderr);
                (
                    format!(
                        "command '{}' exited with {}: {stderr}",
                        command.join(" "),
                        out.exit_code
                    ),
                    String::from_utf8_lossy(&output).into_owned(),
                )
            }
            Err(e) => (e.message(), String::new()),
        };
        return Err(format!(
            "Exec lifecycle hook ({}) for Container {:?} in Pod {:?} failed - error: {error}, message: {output:?}",
            go_slice(&command),
            target.container_name,
            target.pod
        ));
    }
    if let Some(http) = &handler.http_get {
        return http_hook(http, target).await;
    }
    if let Some(sleep) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Err("Cannot run handler: invalid handler: the hook names no action".to_string())
}

/// An `httpGet` hook. Any answer will do: the kubelet does not judge a hook's HTTP status.
async fn http_hook(http: &HTTPGetAction, target: &HookTarget<'_>) -> Result<(), String> {
    let probe_target = ProbeTarget {
        pod_ip: target.pod_ip.to_string(),
        ports: target.ports.to_vec(),
        env: Vec::new(),
        workdir: std::env::temp_dir(),
    };
    probe::http_get(http, &probe_target)
        .await
        .map(drop)
        .map_err(|e| {
            format!(
                "HTTP lifecycle hook ({}) for Container {:?} in Pod {:?} failed - error: {e}",
                http.path.as_deref().unwrap_or_default(),
                target.container_name,
                target.pod
            )
        })
}

/// The annotations that let a container be stopped with its preStop hook later.
pub fn annotations(
    lifecycle_pre_stop: Option<&LifecycleHandler>,
    ports: &[ContainerPort],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(handler) = lifecycle_pre_stop {
        if let Ok(json) = serde_json::to_string(handler) {
            out.push((PRE_STOP_ANNOTATION.to_string(), json));
        }
    }
    if !ports.is_empty() {
        if let Ok(json) = serde_json::to_string(ports) {
            out.push((PORTS_ANNOTATION.to_string(), json));
        }
    }
    out
}

/// The preStop handler and ports a container was created with (from its annotations).
pub fn pre_stop_of(
    annotations: &std::collections::HashMap<String, String>,
) -> Option<(LifecycleHandler, Vec<ContainerPort>)> {
    let handler = serde_json::from_str(annotations.get(PRE_STOP_ANNOTATION)?).ok()?;
    let ports = annotations
        .get(PORTS_ANNOTATION)
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_default();
    Some((handler, ports))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ExecAction, SleepAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    #[test]
    fn grace_left_after_a_hook_is_at_least_two_seconds() {
        let s = Duration::from_secs;
        assert_eq!(grace_after_hook(s(30), s(10)), s(20));
        assert_eq!(grace_after_hook(s(30), s(29)), s(2));
        assert_eq!(grace_after_hook(s(5), s(40)), s(2));
    }

    #[test]
    fn pod_display_is_the_kubelets() {
        assert_eq!(pod_display("web", "default", "u1"), "web_default(u1)");
    }

    #[test]
    fn pre_stop_round_trips_through_annotations() {
        let handler = LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/quit".into()),
                port: IntOrString::String("http".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ports = vec![ContainerPort {
            name: Some("http".into()),
            container_port: 8080,
            ..Default::default()
        }];
        let map: std::collections::HashMap<String, String> =
            annotations(Some(&handler), &ports).into_iter().collect();
        let (back, back_ports) = pre_stop_of(&map).unwrap();
        assert_eq!(back, handler);
        assert_eq!(back_ports, ports);
        assert!(pre_stop_of(&Default::default()).is_none());
        assert!(annotations(None, &[]).is_empty());
    }

    #[tokio::test]
    async fn http_and_sleep_hooks() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = vec![0; 1024];
                let _ = s.read(&mut buf).await;
                // A 500 is still an answer: hooks do not judge the status.
                let _ = s
                    .write_all(b"HTTP/1.1 500 X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        let target = HookTarget {
            client: None,
            container_id: "c1",
            container_name: "app",
            pod: "p_default(u1)",
            pod_ip: "127.0.0.1",
            ports: &[],
        };
        let http = |port: u16| LifecycleHandler {
            http_get: Some(HTTPGetAction {
                path: Some("/hook".into()),
                port: IntOrString::Int(i32::from(port)),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(run(&http(port), &target).await, Ok(()));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = run(&http(closed), &target).await.unwrap_err();
        assert!(
            err.starts_with(
                "HTTP lifecycle hook (/hook) for Container \"app\" in Pod \"p_default(u1)\" failed - error: "
            ),
            "{err}"
        );
        let sleep = LifecycleHandler {
            sleep: Some(SleepAction { seconds: 0 }),
            ..Default::default()
        };
        assert_eq!(run(&sleep, &target).await, Ok(()));
        assert!(run(&LifecycleHandler::default(), &target).await.is_err());
        let exec = LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        };
        assert!(run(&exec, &target).await.is_err());
    }
}
