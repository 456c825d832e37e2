//! The benchmarks against an in-process cluster (API server, built-in controllers and the
//! scheduler): each run's report must equal the report recomputed from the raw log it wrote,
//! and its figures must be consistent with what was asked for.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use setpoint_bench::api::ApiConfig;
use setpoint_bench::churn::ChurnConfig;
use setpoint_bench::density::{DensityConfig, RUN_LABEL};
use setpoint_bench::record::{read_log, Entry, Mark, Record};
use setpoint_bench::report::{self, Percentiles};
use setpoint_runtime::client::{Api, ListParams};
use setpoint_testing::TestCluster;
use tokio::sync::oneshot;

struct Cluster {
    cluster: TestCluster,
    stop_scheduler: oneshot::Sender<()>,
    scheduler: tokio::task::JoinHandle<()>,
}

async fn cluster() -> Cluster {
    let cluster = TestCluster::start_with_controllers().await;
    let (stop_scheduler, stopped) = oneshot::channel::<()>();
    let scheduler = tokio::spawn(setpoint_scheduler::run(
        cluster.client(),
        Default::default(),
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    Cluster {
        cluster,
        stop_scheduler,
        scheduler,
    }
}

impl Cluster {
    async fn stop(self) {
        let _ = self.stop_scheduler.send(());
        let _ = self.scheduler.await;
        self.cluster.stop().await;
    }
}

fn ordered(p: &Percentiles, count: u64) {
    assert_eq!(p.count, count, "{p:?}");
    assert!(p.p50 <= p.p90 && p.p90 <= p.p99 && p.p99 <= p.max, "{p:?}");
}

/// Time of the first entry of each pod that `pick` matches, by pod.
fn first_seen(log: &[Entry], pick: impl Fn(&Record) -> Option<&str>) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for e in log {
        if let Some(pod) = pick(&e.record) {
            out.entry(pod.to_string()).or_insert(e.t_us);
        }
    }
    out
}

/// The report's percentiles of `from` → `to`, recomputed here without the report's code:
/// sort the per-pod durations, take the value at rank ⌈p·n⌉.
fn recomputed(from: &HashMap<String, u64>, to: &HashMap<String, u64>) -> Percentiles {
    let mut d: Vec<f64> = to
        .iter()
        .map(|(pod, t)| (t - from[pod]) as f64 / 1000.0)
        .collect();
    d.sort_by(f64::total_cmp);
    let at = |p: f64| d[((p * d.len() as f64).ceil() as usize).max(1) - 1];
    Percentiles {
        count: d.len() as u64,
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: *d.last().unwrap(),
    }
}

fn mark_at(log: &[Entry], mark: Mark) -> u64 {
    log.iter()
        .find_map(|e| match e.record {
            Record::Mark { mark: m } if m == mark => Some(e.t_us),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {mark:?} in the log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn density_run_reports_what_its_raw_log_says() {
    let c = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("events.jsonl");
    let outcome = setpoint_bench::density::run(
        c.cluster.client(),
        DensityConfig {
            nodes: 3,
            deployments: 5,
            replicas: 4,
            timeout: Duration::from_secs(120),
            progress: false,
            raw_log: Some(log_path.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = &outcome.report;

    let written = read_log(std::io::BufReader::new(
        std::fs::File::open(&log_path).unwrap(),
    ))
    .unwrap();
    assert_eq!(written, outcome.log);
    assert_eq!(&report::density(&written).unwrap(), r);

    // The figures, recomputed from the written log by this test's own arithmetic.
    let created = first_seen(&written, |r| match r {
        Record::PodCreated { pod } => Some(pod),
        _ => None,
    });
    let scheduled = first_seen(&written, |r| match r {
        Record::PodScheduled { pod, .. } => Some(pod),
        _ => None,
    });
    let running = first_seen(&written, |r| match r {
        Record::PodRunning { pod } => Some(pod),
        _ => None,
    });
    let l = &r.latency_ms;
    assert_eq!(l.created_to_scheduled, recomputed(&created, &scheduled));
    assert_eq!(l.scheduled_to_running, recomputed(&scheduled, &running));
    assert_eq!(l.created_to_running, recomputed(&created, &running));
    let total_us = mark_at(&written, Mark::AllReady) - mark_at(&written, Mark::CreatesStarted);
    assert_eq!(r.total_seconds, total_us as f64 / 1e6);
    let deployment_creates = written
        .iter()
        .filter(|e| {
            matches!(&e.record, Record::Request { verb, resource, .. }
                if verb == "create" && resource == "deployments")
        })
        .count() as u64;
    let reported = r
        .api
        .iter()
        .find(|a| a.verb == "create" && a.resource == "deployments")
        .unwrap();
    assert_eq!(reported.count, deployment_creates);

    assert!(!r.timed_out, "{:?}", r.missing);
    assert_eq!((r.pods, r.deployments, r.replicas), (20, 5, 4));
    assert_eq!((r.nodes, r.simulated_nodes), (3, 3));
    assert_eq!(
        (r.pods_created, r.pods_scheduled, r.pods_running),
        (20, 20, 20)
    );
    assert_eq!(r.deployments_available, 5);
    let l = &r.latency_ms;
    ordered(&l.created_to_scheduled, 20);
    ordered(&l.scheduled_to_running, 20);
    ordered(&l.created_to_running, 20);
    ordered(&l.deployment_available, 5);
    // Created → Running is the sum of its phases, pod by pod, so its max bounds theirs.
    assert!(
        l.created_to_running.max
            >= l.created_to_scheduled.max.max(l.scheduled_to_running.max) - 1e-9
    );
    assert!(r.total_seconds > 0.0);
    assert!((r.pods_running_per_second - 20.0 / r.total_seconds).abs() < 1e-9);
    assert!(r.create_seconds.unwrap() <= r.total_seconds);
    assert!(r.deletion_seconds.is_some());
    let creates = r
        .api
        .iter()
        .find(|a| a.verb == "create" && a.resource == "deployments")
        .unwrap();
    assert_eq!(creates.count - creates.errors, 5);
    ordered(&creates.latency_ms, creates.count);
    assert!(r
        .processes
        .iter()
        .any(|p| p.pid == std::process::id() && p.peak_rss_mib > 0.0));
    assert_eq!(r.running_over_time.last().unwrap().1, 20);
    // Every pod landed on one of the run's simulated nodes.
    let prefix = format!("bench-{}-", r.run_id);
    assert!(written.iter().all(|e| match &e.record {
        Record::PodScheduled { node, .. } => node.starts_with(&prefix),
        _ => true,
    }));

    // Cleaned up: the namespace and the run's nodes are gone.
    let selector = ListParams::default().labels(&format!("{RUN_LABEL}={}", r.run_id));
    let client = c.cluster.client();
    assert!(Api::<Namespace>::all(client.clone())
        .list(&selector)
        .await
        .unwrap()
        .items
        .is_empty());
    assert!(Api::<Node>::all(client)
        .list(&selector)
        .await
        .unwrap()
        .items
        .is_empty());

    let text = setpoint_bench::table::density(r);
    assert!(text.contains("pods Running per second"));
    let svg = setpoint_bench::svg::density(r);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    c.stop().await;
}

/// With `keep`, what the log says it saw is what the cluster holds at the end: the same pods,
/// on the same nodes, all Running; and none on the node the cluster had before the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn density_log_matches_the_cluster_it_observed() {
    let c = cluster().await;
    let client = c.cluster.client();
    // A node of the cluster's own, Ready and untainted: the run's pods must not go to it.
    let (stop_own, own_stopped) = oneshot::channel::<()>();
    let own = tokio::spawn(setpoint_node::run_simulated(
        client.clone(),
        setpoint_node::SimulationConfig {
            name_prefix: "own-".into(),
            ..Default::default()
        },
        async move {
            let _ = own_stopped.await;
        },
    ));
    let nodes = Api::<Node>::all(client.clone());
    setpoint_testing::eventually_within(
        Duration::from_secs(60),
        "the cluster's own node is Ready",
        || async {
            let n = nodes.get_opt("own-0").await.ok().flatten()?;
            n.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
                .then_some(())
        },
    )
    .await;
    let outcome = setpoint_bench::density::run(
        client.clone(),
        DensityConfig {
            nodes: 2,
            deployments: 3,
            replicas: 3,
            keep: true,
            create_rate: Some(50.0),
            timeout: Duration::from_secs(120),
            progress: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = &outcome.report;
    assert!(!r.timed_out, "{:?}", r.missing);
    assert_eq!(r.nodes, 2, "only the run's own nodes are usable");
    assert_eq!(r.create_rate, Some(50.0));
    let mut logged: Vec<(String, String)> = outcome
        .log
        .iter()
        .filter_map(|e| match &e.record {
            Record::PodScheduled { pod, node } => Some((pod.clone(), node.clone())),
            _ => None,
        })
        .collect();
    logged.sort();

    let selector = ListParams::default().labels(&format!("{RUN_LABEL}={}", r.run_id));
    let pods = Api::<Pod>::all(client.clone())
        .list(&selector)
        .await
        .unwrap()
        .items;
    let mut held: Vec<(String, String)> = pods
        .iter()
        .map(|p| {
            let ns = p.metadata.namespace.clone().unwrap();
            let name = p.metadata.name.clone().unwrap();
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
            (format!("{ns}/{name}"), node)
        })
        .collect();
    held.sort();
    assert_eq!(logged, held);
    assert_eq!(held.len(), 9);
    let prefix = format!("bench-{}-", r.run_id);
    assert!(
        held.iter().all(|(_, node)| node.starts_with(&prefix)),
        "{held:?}"
    );
    assert!(pods
        .iter()
        .all(|p| { p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") }));
    // Creates were paced: at 50/s the third is due 40 ms after the first was (unpaced, all
    // three start at once); the first may itself start a little after its due time.
    let starts: Vec<u64> = outcome
        .log
        .iter()
        .filter(|e| {
            matches!(&e.record, Record::Request { verb, resource, .. }
            if verb == "create" && resource == "deployments")
        })
        .map(|e| e.t_us)
        .collect();
    assert_eq!(starts.len(), 3);
    assert!(starts[2] - starts[0] >= 30_000, "{starts:?}");
    let _ = stop_own.send(());
    let _ = own.await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_run_delivers_every_write_to_every_watcher() {
    let c = cluster().await;
    let outcome = setpoint_bench::api::run(
        c.cluster.client(),
        ApiConfig {
            concurrency: 2,
            duration: Duration::from_millis(500),
            object_size: 256,
            watchers: 3,
            timeout: Duration::from_secs(60),
            progress: false,
            raw_log: None,
            processes: Default::default(),
            namespace: None,
        },
    )
    .await
    .unwrap();
    let r = &outcome.report;
    assert_eq!(&report::api(&outcome.log).unwrap(), r);
    assert_eq!(r.errors, 0, "{:?}", r.api);
    assert!(r.writes > 0);
    assert_eq!(r.deliveries, r.writes * 3);
    ordered(&r.delivery_ms, r.deliveries);
    for verb in ["create", "get", "list", "update", "patch"] {
        assert!(
            r.per_second.get(verb).copied().unwrap_or(0.0) > 0.0,
            "{verb}"
        );
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_run_in_a_given_namespace_leaves_it_and_nothing_in_it() {
    let c = cluster().await;
    let namespaces = Api::<Namespace>::all(c.cluster.client());
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "given"}})).unwrap();
    namespaces.create(&Default::default(), &ns).await.unwrap();
    let outcome = setpoint_bench::api::run(
        c.cluster.client(),
        ApiConfig {
            concurrency: 2,
            duration: Duration::from_millis(300),
            object_size: 64,
            watchers: 1,
            timeout: Duration::from_secs(60),
            progress: false,
            namespace: Some("given".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = &outcome.report;
    assert_eq!(r.errors, 0, "{:?}", r.api);
    assert!(r.writes > 0);
    // No namespace of the run's own was created or deleted.
    assert!(!outcome.log.iter().any(|e| matches!(&e.record,
        Record::Request { resource, .. } if resource == "namespaces")));
    let given = namespaces.get("given").await.unwrap();
    assert!(given.metadata.deletion_timestamp.is_none());
    let left =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.cluster.client(), "given")
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", r.run_id)))
            .await
            .unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churn_run_keeps_a_modest_rate() {
    let c = cluster().await;
    let outcome = setpoint_bench::churn::run(
        c.cluster.client(),
        ChurnConfig {
            rate: 20.0,
            duration: Duration::from_secs(1),
            nodes: 2,
            timeout: Duration::from_secs(60),
            progress: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let r = &outcome.report;
    assert_eq!(&report::churn(&outcome.log).unwrap(), r);
    // 20/s for 1 s: 20 due (the first tick is immediate), all answered.
    assert_eq!(r.due, 20);
    assert_eq!(r.sent + r.skipped, r.due);
    assert_eq!(r.windows.len(), 1);
    assert_eq!(r.windows[0].sent, r.sent);
    // The controllers, scheduler and nodes caught up with what the load left.
    assert_eq!(r.settled, Some(true), "{:?}", outcome.log);
    assert!(r.settle_seconds.is_some());
    assert!(r
        .api
        .iter()
        .any(|a| a.verb == "create" && a.resource == "pods"));
    c.stop().await;
}
