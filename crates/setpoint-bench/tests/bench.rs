//! The benchmarks against an in-process cluster (API server, built-in controllers and the
//! scheduler): each run's report must equal the report recomputed from the raw log it wrote,
//! and its figures must be consistent with what was asked for.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node};
use setpoint_bench::api::ApiConfig;
use setpoint_bench::churn::ChurnConfig;
use setpoint_bench::density::{DensityConfig, RUN_LABEL};
use setpoint_bench::record::{read_log, Record};
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
async fn churn_run_keeps_a_modest_rate() {
    let c = cluster().await;
    let outcome = setpoint_bench::churn::run(
        c.cluster.client(),
        ChurnConfig {
            rate: 20.0,
            duration: Duration::from_secs(1),
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
    assert!(r
        .api
        .iter()
        .any(|a| a.verb == "create" && a.resource == "pods"));
    c.stop().await;
}
