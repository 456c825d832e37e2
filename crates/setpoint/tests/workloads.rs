//! End to end: the workload controllers with the real `kubectl` against `setpoint up`, whose
//! local node runs the pods (image-only containers as simulated containers): the walkthrough
//! of creating, healing, rolling out, rolling back, pausing and deleting a Deployment.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use setpoint_runtime::client::{Api, Client, Kubeconfig, ListParams, WatchEvent, WatchParams};

mod support;

use support::{eventually, Setpoint};

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What a watcher of the `app=demo` pods saw: the fewest ready and the most live pods at any
/// moment once it started counting.
#[derive(Default)]
struct Extremes {
    counting: bool,
    min_ready: usize,
    max_live: usize,
}

/// Watches `app=demo` pods through the API in the background, recording extremes.
fn watch_pods(
    runtime: &tokio::runtime::Runtime,
    client: Client,
    extremes: Arc<Mutex<Extremes>>,
) -> tokio::task::JoinHandle<()> {
    runtime.spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let mut seen: HashMap<String, Pod> = HashMap::new();
        let list = pods
            .list(&ListParams::default().labels("app=demo"))
            .await
            .unwrap();
        for p in list.items {
            seen.insert(p.metadata.name.clone().unwrap(), p);
        }
        let mut stream = pods
            .watch(
                &WatchParams {
                    label_selector: Some("app=demo".into()),
                    ..WatchParams::default()
                },
                &list.resource_version,
            )
            .await
            .unwrap();
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { break };
            let (kind, pod) = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => ("put", p),
                WatchEvent::Deleted(p) => ("delete", p),
                _ => continue,
            };
            let name = pod.metadata.name.clone().unwrap();
            if kind == "put" {
                seen.insert(name, pod);
            } else {
                seen.remove(&name);
            }
            let live: Vec<&Pod> = seen
                .values()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let ready = live.iter().filter(|p| is_ready(p)).count();
            let mut e = extremes.lock().unwrap();
            if e.counting {
                e.min_ready = e.min_ready.min(ready);
                e.max_live = e.max_live.max(live.len());
            }
        }
    })
}

fn pod_names(s: &Setpoint, selector: &str) -> Vec<String> {
    lines(&s.ok(&["get", "pods", "-l", selector, "-o", "name"]))
}

fn ready_count(s: &Setpoint, selector: &str) -> usize {
    lines(&s.ok(&[
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#,
    ]))
    .iter()
    .filter(|l| *l == "True")
    .count()
}

fn images(s: &Setpoint) -> Vec<String> {
    let mut v = lines(&s.ok(&[
        "get",
        "rs",
        "-l",
        "app=demo",
        "-o",
        r#"jsonpath={range .items[*]}{.spec.template.spec.containers[0].image}{"\n"}{end}"#,
    ]));
    v.sort();
    v
}

#[test]
fn deployment_walkthrough_with_kubectl() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        Client::from_kubeconfig(&Kubeconfig::read(&s.kubeconfig).unwrap()).unwrap()
    });

    // Create: three pods, Running and Ready on the local node.
    s.ok(&[
        "create",
        "deployment",
        "demo",
        "--image=nginx:1.25",
        "--replicas=3",
    ]);
    eventually("3 ready pods", Duration::from_secs(60), || {
        (ready_count(&s, "app=demo") == 3).then_some(())
    });

    // Delete a pod: the ReplicaSet replaces it within a second.
    let before = pod_names(&s, "app=demo");
    let victim = before[0].trim_start_matches("pod/").to_string();
    // The replacement is timed by a watch opened before the delete: its ADDED event.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let replaced_after = runtime.block_on(async {
        let rv = pods
            .list(&ListParams::default().labels("app=demo"))
            .await
            .unwrap()
            .resource_version;
        let params = WatchParams {
            label_selector: Some("app=demo".into()),
            ..WatchParams::default()
        };
        let stream = pods.watch(&params, &rv).await.unwrap();
        futures::pin_mut!(stream);
        s.ok(&["delete", "pod", &victim, "--wait=false"]);
        let deleted = Instant::now();
        let fresh = async {
            while let Some(ev) = stream.next().await {
                if let Ok(WatchEvent::Added(p)) = ev {
                    let name = format!("pod/{}", p.metadata.name.as_deref().unwrap_or(""));
                    if !before.contains(&name) {
                        return deleted.elapsed();
                    }
                }
            }
            panic!("the watch ended before a replacement appeared");
        };
        tokio::time::timeout(Duration::from_secs(10), fresh)
            .await
            .expect("a replacement pod within 10 s")
    });
    eprintln!(
        "replacement pod created {:.0} ms after the delete",
        replaced_after.as_secs_f64() * 1000.0
    );
    assert!(
        replaced_after < Duration::from_secs(1),
        "replacement took {replaced_after:?}"
    );
    eventually("3 ready pods again", Duration::from_secs(30), || {
        (ready_count(&s, "app=demo") == 3).then_some(())
    });
    let described = s.ok(&["describe", "replicaset", "-l", "app=demo"]);
    assert!(
        described.contains("SuccessfulCreate") && described.contains("Created pod: demo-"),
        "{described}"
    );

    // Status: every field, Available=True, generation observed.
    let yaml = eventually(
        "the Deployment's status to settle",
        Duration::from_secs(30),
        || {
            let y = s.ok(&["get", "deployment", "demo", "-o", "yaml"]);
            (y.contains("availableReplicas: 3") && y.contains("updatedReplicas: 3")).then_some(y)
        },
    );
    for field in [
        "replicas: 3",
        "readyReplicas: 3",
        "observedGeneration:",
        "type: Available",
        "MinimumReplicasAvailable",
        "NewReplicaSetAvailable",
    ] {
        assert!(yaml.contains(field), "{field} missing:\n{yaml}");
    }
    let gens = s.ok(&[
        "get",
        "deployment",
        "demo",
        "-o",
        "jsonpath={.metadata.generation} {.status.observedGeneration}",
    ]);
    let g: Vec<&str> = gens.split(' ').collect();
    assert_eq!(g[0], g[1], "generation observed: {gens}");

    // Rolling update 1.25 → 1.26 with maxSurge 1 / maxUnavailable 0.
    s.ok(&[
        "patch",
        "deployment",
        "demo",
        "-p",
        r#"{"spec":{"strategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}"#,
    ]);
    let extremes = Arc::new(Mutex::new(Extremes::default()));
    let watcher = watch_pods(&runtime, client.clone(), extremes.clone());
    // Count from a settled state.
    eventually(
        "the watcher to see 3 ready pods",
        Duration::from_secs(10),
        || {
            let ok = ready_count(&s, "app=demo") == 3;
            if ok {
                let mut e = extremes.lock().unwrap();
                *e = Extremes {
                    counting: true,
                    min_ready: 3,
                    max_live: 3,
                };
            }
            ok.then_some(())
        },
    );
    s.ok(&["set", "image", "deployment/demo", "nginx=nginx:1.26"]);
    let status = s.ok(&["rollout", "status", "deployment/demo", "--timeout=120s"]);
    assert!(status.contains("successfully rolled out"), "{status}");
    {
        let e = extremes.lock().unwrap();
        assert!(
            e.min_ready >= 3,
            "available pods dropped to {}",
            e.min_ready
        );
        assert!(e.max_live <= 4, "{} pods at once", e.max_live);
        eprintln!(
            "rolling update: never fewer than {} ready, never more than {} pods",
            e.min_ready, e.max_live
        );
    }
    watcher.abort();
    assert_eq!(images(&s), vec!["nginx:1.25", "nginx:1.26"]);
    let history = s.ok(&["rollout", "history", "deployment/demo"]);
    assert!(history.contains('1') && history.contains('2'), "{history}");

    // Undo restores the previous template.
    s.ok(&["rollout", "undo", "deployment/demo"]);
    s.ok(&["rollout", "status", "deployment/demo", "--timeout=120s"]);
    let image = s.ok(&[
        "get",
        "deployment",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, "nginx:1.25");

    // Pause stops progress; resume continues.
    s.ok(&["rollout", "pause", "deployment/demo"]);
    s.ok(&["set", "image", "deployment/demo", "nginx=nginx:1.27"]);
    eventually(
        "the paused change to be observed",
        Duration::from_secs(30),
        || {
            let g = s.ok(&[
                "get",
                "deployment",
                "demo",
                "-o",
                "jsonpath={.metadata.generation} {.status.observedGeneration}",
            ]);
            let parts: Vec<&str> = g.split(' ').collect();
            (parts.len() == 2 && parts[0] == parts[1]).then_some(())
        },
    );
    assert!(
        !images(&s).contains(&"nginx:1.27".to_string()),
        "a paused Deployment rolled out"
    );
    let conditions = s.ok(&[
        "get",
        "deployment",
        "demo",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Progressing")].reason}"#,
    ]);
    assert_eq!(conditions, "DeploymentPaused");
    s.ok(&["rollout", "resume", "deployment/demo"]);
    s.ok(&["rollout", "status", "deployment/demo", "--timeout=120s"]);
    assert!(images(&s).contains(&"nginx:1.27".to_string()));

    // A template that never becomes ready: ProgressDeadlineExceeded.
    s.apply("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: stuck\nspec:\n  replicas: 1\n  progressDeadlineSeconds: 3\n  selector:\n    matchLabels: {app: stuck}\n  template:\n    metadata:\n      labels: {app: stuck}\n    spec:\n      containers:\n      - name: c\n        image: busybox\n        command: [sleep, '1000']\n        readinessProbe:\n          exec: {command: ['false']}\n          periodSeconds: 1\n");
    let reason = eventually("ProgressDeadlineExceeded", Duration::from_secs(60), || {
        let r = s.ok(&[
            "get",
            "deployment",
            "stuck",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Progressing")].reason}"#,
        ]);
        (r == "ProgressDeadlineExceeded").then_some(r)
    });
    assert_eq!(reason, "ProgressDeadlineExceeded");
    let err = s.fails(&["rollout", "status", "deployment/stuck", "--timeout=30s"]);
    assert!(err.contains("exceeded its progress deadline"), "{err}");
    s.ok(&["delete", "deployment", "stuck"]);

    // Cascading deletion: orphan keeps the ReplicaSet (without owner), foreground removes the
    // pods before the Deployment, background removes everything.
    s.ok(&[
        "create",
        "deployment",
        "orphaned",
        "--image=nginx:1.25",
        "--replicas=2",
    ]);
    eventually("2 orphaned pods", Duration::from_secs(60), || {
        (ready_count(&s, "app=orphaned") == 2).then_some(())
    });
    s.ok(&["delete", "deployment", "orphaned", "--cascade=orphan"]);
    let owners = s.ok(&[
        "get",
        "rs",
        "-l",
        "app=orphaned",
        "-o",
        "jsonpath={.items[*].metadata.ownerReferences}",
    ]);
    assert!(owners.trim().is_empty(), "{owners}");
    assert_eq!(pod_names(&s, "app=orphaned").len(), 2);
    s.ok(&["delete", "rs", "-l", "app=orphaned"]);

    s.ok(&[
        "delete",
        "deployment",
        "demo",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    assert!(
        pod_names(&s, "app=demo").is_empty(),
        "pods outlived their foreground-deleted Deployment"
    );
    assert!(lines(&s.ok(&["get", "rs", "-l", "app=demo", "-o", "name"])).is_empty());

    // A namespace with Deployments inside is deleted completely.
    s.ok(&["create", "namespace", "team"]);
    s.ok(&[
        "-n",
        "team",
        "create",
        "deployment",
        "api",
        "--image=nginx:1.25",
        "--replicas=2",
    ]);
    eventually("team pods", Duration::from_secs(60), || {
        (lines(&s.ok(&["-n", "team", "get", "pods", "-o", "name"])).len() == 2).then_some(())
    });
    s.ok(&["delete", "namespace", "team", "--timeout=60s"]);
    let err = s.fails(&["get", "namespace", "team"]);
    assert!(err.contains("NotFound"), "{err}");
    s.stop();
}
