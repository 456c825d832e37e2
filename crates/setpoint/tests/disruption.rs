//! End to end with the real kubectl: PodDisruptionBudgets, `pods/eviction` and `kubectl
//! cordon`/`uncordon`/`drain` against `setpoint up --simulate 3` (the local node and three
//! simulated ones).
//!
//! Cordoning places a Deployment's three pods two on one node and one on another. A budget of
//! `minAvailable: 2` then allows one disruption; an eviction the budget forbids answers 429
//! with upstream's Status, two budgets over one pod answer 500, and `kubectl drain` of the
//! node with two pods evicts one, retries the other until the first one's replacement is
//! Ready, then evicts it. A watch of the pods checks on every change that the budget held:
//! no pod started terminating while fewer than two others were Ready.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use setpoint_runtime::client::{Api, Client, Kubeconfig, ListParams, WatchEvent, WatchParams};

mod support;

use support::{eventually, lines, Setpoint};

const WAIT: Duration = Duration::from_secs(90);

const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: busybox:1
"#;

const BUDGET: &str = r#"apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: web}
"#;

/// `name node ready terminating` of each `app=web` pod.
fn pods(s: &Setpoint) -> Vec<(String, String, bool, bool)> {
    let out = s.ok(&[
        "get", "pods", "-l", "app=web", "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ]);
    lines(&out)
        .iter()
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            (
                c[0].to_string(),
                c.get(1).unwrap_or(&"").to_string(),
                c.get(2) == Some(&"True"),
                c.len() > 3,
            )
        })
        .collect()
}

/// The ready, live `app=web` pods per node, once there are exactly `n` of them.
fn ready_by_node(s: &Setpoint, n: usize) -> Option<HashMap<String, Vec<String>>> {
    let all = pods(s);
    if all.len() != n
        || !all
            .iter()
            .all(|(_, node, ready, term)| *ready && !term && !node.is_empty())
    {
        return None;
    }
    let mut by: HashMap<String, Vec<String>> = HashMap::new();
    for (name, node, _, _) in all {
        by.entry(node).or_default().push(name);
    }
    Some(by)
}

fn pdb_status(s: &Setpoint) -> String {
    s.ok(&[
        "get", "pdb", "web", "-o",
        r#"jsonpath={.status.currentHealthy} {.status.desiredHealthy} {.status.expectedPods} {.status.disruptionsAllowed} {.status.conditions[?(@.type=="DisruptionAllowed")].reason}"#,
    ])
    .trim()
    .to_string()
}

/// One pod change as the watch saw it: name, ready, terminating, deleted.
type Seen = (String, bool, bool, bool);

fn seen(p: &Pod, deleted: bool) -> Seen {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    (
        p.metadata.name.clone().unwrap_or_default(),
        ready,
        p.metadata.deletion_timestamp.is_some(),
        deleted,
    )
}

/// POSTs a policy/v1 Eviction of `pod`.
async fn evict(
    client: &Client,
    pod: &str,
) -> Result<serde_json::Value, setpoint_runtime::ClientError> {
    let body = serde_json::json!({
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "default"}
    });
    client
        .request(
            http::Method::POST,
            &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
            Some("application/json"),
            Bytes::from(serde_json::to_vec(&body).unwrap()),
        )
        .await
}

#[test]
fn drain_respects_the_disruption_budget() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &[
            "up",
            "--simulate",
            "3",
            "--node-prefix",
            "dr-",
            "--start-delay-ms",
            "50",
            "--ready-delay-ms",
            "50",
        ],
        &data.path().join("data"),
    );
    let nodes = eventually("4 nodes", WAIT, || {
        let n = lines(&s.ok(&["get", "nodes", "-o", "name"]));
        (n.len() == 4).then_some(n)
    });
    let nodes: Vec<String> = nodes
        .iter()
        .map(|n| n.trim_start_matches("node/").to_string())
        .collect();
    let (x, y) = ("dr-0", "dr-1");

    // Two pods on x: every other node cordoned.
    for n in nodes.iter().filter(|n| *n != x) {
        let out = s.ok(&["cordon", n]);
        assert!(out.contains(&format!("node/{n} cordoned")), "{out}");
    }
    assert_eq!(
        s.ok(&["get", "node", y, "-o", "jsonpath={.spec.unschedulable}"])
            .trim(),
        "true"
    );
    s.apply(WEB);
    eventually("two ready pods on the one schedulable node", WAIT, || {
        ready_by_node(&s, 2).filter(|by| by.get(x).map(Vec::len) == Some(2))
    });
    // A third on y.
    s.ok(&["cordon", x]);
    let out = s.ok(&["uncordon", y]);
    assert!(out.contains(&format!("node/{y} uncordoned")), "{out}");
    s.ok(&["scale", "deployment", "web", "--replicas=3"]);
    let placed = eventually("two pods on x and one on y", WAIT, || {
        ready_by_node(&s, 3)
            .filter(|by| by.get(x).map(Vec::len) == Some(2) && by.get(y).map(Vec::len) == Some(1))
    });
    let on_x = placed[x].clone();
    for n in nodes.iter().filter(|n| *n != x) {
        s.ok(&["uncordon", n]);
    }

    s.apply(BUDGET);
    eventually("the budget allows one disruption", WAIT, || {
        (pdb_status(&s) == "3 2 3 1 SufficientPods").then_some(())
    });
    let table = s.ok(&["get", "pdb"]);
    let rows = lines(&table);
    assert!(
        rows[0].split_whitespace().collect::<Vec<_>>()
            == [
                "NAME",
                "MIN",
                "AVAILABLE",
                "MAX",
                "UNAVAILABLE",
                "ALLOWED",
                "DISRUPTIONS",
                "AGE"
            ],
        "{table}"
    );
    assert!(
        rows[1].split_whitespace().take(4).collect::<Vec<_>>() == ["web", "2", "N/A", "1"],
        "{table}"
    );

    // Discovery and the OpenAPI schema, as kubectl reads them.
    let resources = s.ok(&["api-resources", "--api-group=policy"]);
    assert!(
        lines(&resources)
            .iter()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == [
                    "poddisruptionbudgets",
                    "pdb",
                    "policy/v1",
                    "true",
                    "PodDisruptionBudget"
                ]),
        "{resources}"
    );
    let explain = s.ok(&["explain", "pdb.spec.unhealthyPodEvictionPolicy"]);
    assert!(explain.contains("IfHealthyBudget"), "{explain}");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client = runtime.block_on(async {
        Client::from_kubeconfig(&Kubeconfig::read(&s.kubeconfig).unwrap()).unwrap()
    });

    // A budget needing all three allows nothing: a direct eviction gets 429.
    s.ok(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":3}}"#,
    ]);
    eventually("the budget allows nothing", WAIT, || {
        (pdb_status(&s) == "3 3 3 0 InsufficientPods").then_some(())
    });
    let err = runtime
        .block_on(evict(&client, &on_x[0]))
        .expect_err("an eviction the budget forbids");
    let setpoint_runtime::ClientError::Api(status) = &err else {
        panic!("{err}");
    };
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget."
        )
    );
    let causes: Vec<(String, String)> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| (c.reason.clone(), c.message.clone()))
        .collect();
    assert_eq!(
        causes,
        [(
            "DisruptionBudget".to_string(),
            "The disruption budget web needs 3 healthy pods and has 3 currently".to_string()
        )]
    );
    // Two budgets over one pod: upstream's 500.
    s.apply(&BUDGET.replace("name: web", "name: web-2"));
    let err = runtime
        .block_on(evict(&client, &on_x[0]))
        .expect_err("two budgets");
    assert_eq!(err.code(), Some(500), "{err}");
    assert!(
        err.to_string()
            .contains("This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."),
        "{err}"
    );
    s.ok(&["delete", "pdb", "web-2"]);
    s.ok(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":2}}"#,
    ]);
    eventually("the budget allows one disruption again", WAIT, || {
        (pdb_status(&s) == "3 2 3 1 SufficientPods").then_some(())
    });
    assert_eq!(pods(&s).len(), 3, "no pod was evicted");

    // Every pod change from here on, in order.
    let log: Arc<Mutex<Vec<Seen>>> = Arc::new(Mutex::new(Vec::new()));
    let watching = Arc::new(Mutex::new(false));
    let (l, w, c) = (log.clone(), watching.clone(), client.clone());
    let watcher = runtime.spawn(async move {
        let api: Api<Pod> = Api::namespaced(c, "default");
        let list = api
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap();
        for p in &list.items {
            l.lock().unwrap().push(seen(p, false));
        }
        let params = WatchParams {
            label_selector: Some("app=web".into()),
            ..WatchParams::default()
        };
        let mut stream = api.watch(&params, &list.resource_version).await.unwrap();
        *w.lock().unwrap() = true;
        while let Some(Ok(ev)) = stream.next().await {
            let e = match ev {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => seen(&p, false),
                WatchEvent::Deleted(p) => seen(&p, true),
                _ => continue,
            };
            l.lock().unwrap().push(e);
        }
    });
    eventually("the pod watch", WAIT, || {
        watching.lock().unwrap().then_some(())
    });

    let drained = s.kubectl(&[
        "drain",
        x,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=120s",
    ]);
    let out = support::expect_success("kubectl drain", &drained);
    // kubectl reports a refused eviction, and that it retries, on stderr.
    let err = String::from_utf8_lossy(&drained.stderr).to_string();
    for pod in &on_x {
        assert!(
            out.contains(&format!("evicting pod default/{pod}")),
            "{out}"
        );
        assert!(out.contains(&format!("pod/{pod} evicted")), "{out}");
    }
    assert!(
        err.contains("(will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget."),
        "the second eviction waited on the budget: {out}\n{err}"
    );
    assert!(out.contains(&format!("node/{x} drained")), "{out}");
    assert_eq!(
        s.ok(&["get", "node", x, "-o", "jsonpath={.spec.unschedulable}"])
            .trim(),
        "true"
    );
    let after = eventually("three ready pods, none on x", WAIT, || {
        ready_by_node(&s, 3).filter(|by| !by.contains_key(x))
    });
    assert!(after.values().flatten().all(|p| !on_x.contains(p)));
    eventually(
        "the budget allows one disruption after the drain",
        WAIT,
        || (pdb_status(&s) == "3 2 3 1 SufficientPods").then_some(()),
    );

    // Replayed: whenever a pod started terminating, at least two others were Ready.
    let log = log.lock().unwrap().clone();
    let mut state: HashMap<String, (bool, bool)> = HashMap::new();
    let mut evicted = Vec::new();
    for (name, ready, terminating, deleted) in &log {
        let was_terminating = state.get(name).is_some_and(|(_, t)| *t);
        if *deleted {
            state.remove(name);
        } else {
            state.insert(name.clone(), (*ready, *terminating));
        }
        if *terminating && !was_terminating {
            evicted.push(name.clone());
            let others_ready = state
                .iter()
                .filter(|(n, (r, t))| *n != name && *r && !*t)
                .count();
            assert!(
                others_ready >= 2,
                "{name} started terminating with {others_ready} other pods Ready: {log:?}"
            );
        }
    }
    evicted.sort();
    let mut want = on_x.clone();
    want.sort();
    assert_eq!(evicted, want, "{log:?}");

    let out = s.ok(&["uncordon", x]);
    assert!(out.contains(&format!("node/{x} uncordoned")), "{out}");
    watcher.abort();
    s.stop();
}
