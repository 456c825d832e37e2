//! End to end: the StatefulSet controller with the real `kubectl` against `setpoint up`.
//!
//! The set's containers name only an image, so the local node runs them as simulated
//! containers (Running and Ready at once), and its claim templates are not mounted by any
//! container (the node agent does not mount volumes yet): the claims are still made per pod,
//! named by the pods' volumes, provisioned by the default `local-path` class on the pod's node
//! and bound. A watch through the API records every pod change, so the order the controller
//! acts in is checked on the exact sequence of events, not on samples.
//!
//! A second test runs the controller alone in `setpoint controller-manager
//! --use-service-account-credentials` against `setpoint server`, so it holds only what
//! upstream's `system:controller:statefulset-controller` role grants.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use setpoint_runtime::client::{Api, Client, Kubeconfig, ListParams, WatchEvent, WatchParams};

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(60);

const WEB: &str = r#"apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: nginx
        image: nginx:1.25
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: [ReadWriteOnce]
      resources:
        requests:
          storage: 1Gi
"#;

/// One pod change as the watch saw it.
#[derive(Clone, Debug)]
struct Seen {
    name: String,
    deleted: bool,
    ready: bool,
    terminating: bool,
    revision: String,
}

fn seen(p: &Pod, deleted: bool) -> Seen {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    Seen {
        name: p.metadata.name.clone().unwrap_or_default(),
        deleted,
        ready,
        terminating: p.metadata.deletion_timestamp.is_some(),
        revision: p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("controller-revision-hash").cloned())
            .unwrap_or_default(),
    }
}

/// Records every change of the `app=web` pods, in order, from an empty start; `watching` is
/// set once the watch is open (with the number of pods there were then).
fn watch_pods(
    runtime: &tokio::runtime::Runtime,
    client: Client,
    log: Arc<Mutex<Vec<Seen>>>,
    watching: Arc<Mutex<Option<usize>>>,
) -> tokio::task::JoinHandle<()> {
    runtime.spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client, "default");
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        let params = WatchParams {
            label_selector: Some("app=web".into()),
            ..WatchParams::default()
        };
        let mut stream = pods.watch(&params, &list.resource_version).await.unwrap();
        *watching.lock().unwrap() = Some(list.items.len());
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { break };
            let entry = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => seen(&p, false),
                WatchEvent::Deleted(p) => seen(&p, true),
                _ => continue,
            };
            log.lock().unwrap().push(entry);
        }
    })
}

/// Replays `log`: calls `check` with the live pods (by name) after each entry, and the entry
/// that led there.
fn replay(log: &[Seen], mut check: impl FnMut(&HashMap<String, Seen>, &Seen)) {
    let mut state: HashMap<String, Seen> = HashMap::new();
    for e in log {
        if e.deleted {
            state.remove(&e.name);
        } else {
            state.insert(e.name.clone(), e.clone());
        }
        check(&state, e);
    }
}

fn jsonpath(s: &Setpoint, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &p]);
    s.ok(&args).trim().to_string()
}

/// The set's pods, by name, once exactly `names` exist, are Ready and are at `revision`
/// (any revision when empty).
fn settled(s: &Setpoint, names: &[&str], revision: &str) -> Option<()> {
    let out = s.ok(&[
        "get", "pods", "-l", "app=web", "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.controller-revision-hash} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]);
    let rows = lines(&out);
    let ok = rows.len() == names.len()
        && rows.iter().all(|r| {
            let cells: Vec<&str> = r.split_whitespace().collect();
            cells.len() == 3
                && names.contains(&cells[0])
                && (revision.is_empty() || cells[1] == revision)
                && cells[2] == "True"
        });
    ok.then_some(())
}

fn status(s: &Setpoint, field: &str) -> String {
    jsonpath(s, &["statefulset", "web"], &format!("{{.status.{field}}}"))
}

#[test]
fn statefulset_walkthrough_with_kubectl() {
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
    let log = Arc::new(Mutex::new(Vec::new()));
    let watching = Arc::new(Mutex::new(None));
    let watcher = watch_pods(&runtime, client, log.clone(), watching.clone());
    let before = eventually("the pod watch", WAIT, || *watching.lock().unwrap());
    assert_eq!(before, 0, "pods before the set exists");

    // Created in order: web-1 only after web-0 is Ready, web-2 only after web-1.
    s.apply(WEB);
    eventually("three Ready pods", WAIT, || {
        settled(&s, &["web-0", "web-1", "web-2"], "")
    });
    let rollout = s.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
    assert!(rollout.contains("complete"), "{rollout}");
    let first_revision = status(&s, "updateRevision");
    assert!(first_revision.starts_with("web-"), "{first_revision}");
    assert_eq!(status(&s, "currentRevision"), first_revision);
    {
        let log = log.lock().unwrap();
        let mut created = Vec::new();
        replay(&log, |state, e| {
            if !e.deleted && !created.contains(&e.name) {
                created.push(e.name.clone());
                if let Some(n) = e
                    .name
                    .strip_prefix("web-")
                    .and_then(|n| n.parse::<i32>().ok())
                {
                    if n > 0 {
                        let before = state.get(&format!("web-{}", n - 1));
                        assert!(
                            before.is_some_and(|b| b.ready && !b.terminating),
                            "{} was created before web-{} was Ready: {log:?}",
                            e.name,
                            n - 1
                        );
                    }
                }
            }
        });
        assert_eq!(created, ["web-0", "web-1", "web-2"]);
    }

    // Identity: labels, hostname and subdomain, the claim each pod's volume names, bound.
    for i in 0..3 {
        let pod = format!("web-{i}");
        assert_eq!(
            jsonpath(
                &s,
                &["pod", &pod],
                r#"{.metadata.labels.statefulset\.kubernetes\.io/pod-name} {.metadata.labels.apps\.kubernetes\.io/pod-index} {.spec.hostname} {.spec.subdomain} {.spec.volumes[?(@.name=="www")].persistentVolumeClaim.claimName} {.metadata.ownerReferences[0].kind}"#
            ),
            format!("{pod} {i} {pod} web www-web-{i} StatefulSet")
        );
        let claim = format!("www-web-{i}");
        eventually(&format!("{claim} bound"), WAIT, || {
            (jsonpath(&s, &["pvc", &claim], "{.status.phase}") == "Bound").then_some(())
        });
    }
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web",
        "-o",
        r#"jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}"#,
    ]);
    for want in [
        "SuccessfulCreate: create Claim www-web-0 Pod web-0 in StatefulSet web success",
        "SuccessfulCreate: create Pod web-0 in StatefulSet web successful",
        "SuccessfulCreate: create Pod web-2 in StatefulSet web successful",
    ] {
        assert!(events.contains(want), "no {want:?} in\n{events}");
    }
    let claim_uid = jsonpath(&s, &["pvc", "www-web-1"], "{.metadata.uid}");

    // Scale down through the scale subresource: web-2 goes first, entirely, then web-1; the
    // claims stay.
    let mark = log.lock().unwrap().len();
    s.ok(&["scale", "statefulset", "web", "--replicas=1"]);
    eventually("one pod left", WAIT, || settled(&s, &["web-0"], ""));
    eventually("status of one replica", WAIT, || {
        (status(&s, "replicas") == "1").then_some(())
    });
    {
        let log = log.lock().unwrap();
        replay(&log, |state, e| {
            if e.name == "web-1" && (e.terminating || e.deleted) {
                assert!(
                    !state.contains_key("web-2"),
                    "web-1 went while web-2 was still there: {:?}",
                    &log[mark..]
                );
            }
        });
    }
    let claims = s.ok(&["get", "pvc", "-o", "name"]);
    for i in 0..3 {
        assert!(claims.contains(&format!("www-web-{i}")), "{claims}");
    }
    let sts = s.ok(&["get", "statefulset", "web"]);
    assert!(
        sts.lines().nth(1).is_some_and(|l| l.contains("1/1")),
        "{sts}"
    );

    // Scale up again: the same claims come back to the same ordinals.
    s.ok(&["scale", "statefulset", "web", "--replicas=3"]);
    eventually("three pods again", WAIT, || {
        settled(&s, &["web-0", "web-1", "web-2"], "")
    });
    assert_eq!(
        jsonpath(&s, &["pvc", "www-web-1"], "{.metadata.uid}"),
        claim_uid
    );

    // A rolling update with partition 2 updates only web-2.
    s.ok(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":2}}}}"#,
    ]);
    s.ok(&["set", "image", "statefulset/web", "nginx=nginx:1.26"]);
    let second_revision = eventually("a new update revision", WAIT, || {
        let r = status(&s, "updateRevision");
        (r != first_revision && !r.is_empty()).then_some(r)
    });
    eventually("web-2 updated", WAIT, || {
        (jsonpath(
            &s,
            &["pod", "web-2"],
            "{.metadata.labels.controller-revision-hash}",
        ) == second_revision)
            .then_some(())
    });
    let partitioned = s.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
    assert!(
        partitioned.contains("partitioned roll out complete"),
        "{partitioned}"
    );
    for pod in ["web-0", "web-1"] {
        assert_eq!(
            jsonpath(
                &s,
                &["pod", pod],
                "{.metadata.labels.controller-revision-hash} {.spec.containers[0].image}"
            ),
            format!("{first_revision} nginx:1.25")
        );
    }
    assert_eq!(status(&s, "currentRevision"), first_revision);

    // Partition 0: the rest follow in reverse order, and the update revision becomes current.
    let mark = log.lock().unwrap().len();
    s.ok(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    ]);
    let rollout = s.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
    assert!(rollout.contains("complete"), "{rollout}");
    eventually("all pods updated", WAIT, || {
        settled(&s, &["web-0", "web-1", "web-2"], &second_revision)
    });
    eventually("the update revision current", WAIT, || {
        (status(&s, "currentRevision") == second_revision).then_some(())
    });
    {
        let log = log.lock().unwrap();
        let mut going: Vec<String> = Vec::new();
        for e in &log[mark..] {
            // Only pods still at the old revision are deleted.
            assert!(
                !(e.terminating && e.revision == second_revision),
                "an updated pod was deleted: {:?}",
                &log[mark..]
            );
            if (e.terminating || e.deleted) && !going.contains(&e.name) {
                going.push(e.name.clone());
            }
        }
        assert_eq!(going, ["web-1", "web-0"], "{:?}", &log[mark..]);
    }

    // History and rollback.
    let history = s.ok(&["rollout", "history", "statefulset/web"]);
    let revisions: Vec<String> = lines(&history)
        .iter()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert_eq!(revisions, ["1", "2"], "{history}");
    let undo = s.ok(&["rollout", "undo", "statefulset/web"]);
    assert!(undo.contains("rolled back"), "{undo}");
    s.ok(&["rollout", "status", "statefulset/web", "--timeout=60s"]);
    eventually("back to the first revision", WAIT, || {
        settled(&s, &["web-0", "web-1", "web-2"], &first_revision)
    });
    assert_eq!(
        jsonpath(&s, &["pod", "web-0"], "{.spec.containers[0].image}"),
        "nginx:1.25"
    );
    let history = s.ok(&["rollout", "history", "statefulset/web"]);
    let revisions: Vec<String> = lines(&history)
        .iter()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert_eq!(revisions, ["2", "3"], "{history}");

    // A deleted pod comes back under its name, with its claim.
    let old_uid = jsonpath(&s, &["pod", "web-1"], "{.metadata.uid}");
    // Not waited for by kubectl: the replacement takes the name at once, and the uid check
    // below is what shows the old pod gone.
    s.ok(&["delete", "pod", "web-1", "--wait=false"]);
    eventually("web-1 recreated", WAIT, || {
        let uid = jsonpath(&s, &["pod", "web-1"], "{.metadata.uid}");
        (!uid.is_empty() && uid != old_uid).then_some(())
    });
    eventually("three Ready pods after the delete", WAIT, || {
        settled(&s, &["web-0", "web-1", "web-2"], &first_revision)
    });
    assert_eq!(
        jsonpath(
            &s,
            &["pod", "web-1"],
            r#"{.spec.volumes[?(@.name=="www")].persistentVolumeClaim.claimName}"#
        ),
        "www-web-1"
    );
    assert_eq!(
        jsonpath(&s, &["pvc", "www-web-1"], "{.metadata.uid}"),
        claim_uid
    );

    watcher.abort();
    s.stop();
}

/// A `setpoint controller-manager` in the background, killed when dropped.
struct ControllerManager(std::process::Child);

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn statefulset_controller_runs_on_its_own_account() {
    if !support::kubectl_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // Only the StatefulSet and garbage collector controllers run, so no `default`
    // ServiceAccount exists: as upstream's integration tests do, the server admits pods
    // without one.
    let s = Setpoint::start(
        &["server", "--disable-admission-plugins=ServiceAccount"],
        &data,
    );
    let kubeconfig = data
        .canonicalize()
        .unwrap()
        .join("controller-manager.kubeconfig");
    let _cm = ControllerManager(
        std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                "controller-manager",
                "--leader-elect=false",
                "--secure-port",
                "0",
                "--use-service-account-credentials",
                "--controllers",
                "statefulset,garbagecollector",
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the controller manager"),
    );

    // No node runs: the pods stay unscheduled, but every write the controller makes goes
    // through its role: revisions, claims (owned by the set), pods, status, events, deletes.
    s.apply(&WEB.replace(
        "  serviceName: web\n",
        "  serviceName: web\n  podManagementPolicy: Parallel\n  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete}\n",
    ));
    eventually("three pods and their claims", WAIT, || {
        let pods = lines(&s.ok(&["get", "pods", "-o", "name"]));
        let claims = lines(&s.ok(&["get", "pvc", "-o", "name"]));
        (pods.len() == 3 && claims.len() == 3).then_some(())
    });
    eventually("the status of three replicas", WAIT, || {
        (status(&s, "replicas") == "3" && status(&s, "updateRevision").starts_with("web-"))
            .then_some(())
    });
    assert_eq!(
        jsonpath(
            &s,
            &["pvc", "www-web-2"],
            "{.metadata.ownerReferences[0].kind}"
        ),
        "StatefulSet"
    );
    s.ok(&["scale", "statefulset", "web", "--replicas=1"]);
    eventually("one pod left", WAIT, || {
        (lines(&s.ok(&["get", "pods", "-o", "name"])) == ["pod/web-0"]).then_some(())
    });
    s.ok(&[
        "-n",
        "kube-system",
        "get",
        "serviceaccount",
        "statefulset-controller",
    ]);
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web",
        "-o",
        r#"jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}"#,
    ]);
    assert!(
        events.contains("SuccessfulDelete: delete Pod web-2 in StatefulSet web successful"),
        "{events}"
    );
    assert!(!events.contains("Failed"), "{events}");
    s.stop();
}
