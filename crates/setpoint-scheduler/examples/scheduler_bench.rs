//! Scheduler throughput: binds per second of a burst of pending pods onto many nodes.
//!
//! ```text
//! cargo run --release -p setpoint-scheduler --example scheduler_bench -- [--nodes 1000] [--pods 30000]
//!     [--parallelism 256] [--percentage 0] [--no-scheduled-events]
//! ```
//!
//! First the decision alone is timed: the same pods placed on the same nodes in memory,
//! with no API in the way. Then the real thing: the API server runs in this process
//! (in-memory store, in-process transport: the same request pipeline as HTTPS without
//! sockets or TLS, sharing this process's CPU with the scheduler). Nodes are created Ready
//! first, then every pod is created (concurrently), then the scheduler starts; the clock runs
//! from its start until an independent watcher (its own informer, as a node agent would
//! have) has seen every pod bound. Each node has 4 CPUs and 16Gi, each pod requests 100m
//! and 128Mi, so the cluster has room for 40 pods per node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;
use setpoint_runtime::client::{Api, Client, Patch, PatchParams, PostParams};
use setpoint_runtime::informer::{Event, Scope, SharedInformers};
use setpoint_runtime::ObjectKey;
use setpoint_scheduler::cache::Cache;
use setpoint_scheduler::decision::{PodFacts, Rng};
use setpoint_scheduler::SchedulerConfig;
use setpoint_testing::TestCluster;
use tokio::sync::{oneshot, Notify};

struct Args {
    nodes: usize,
    pods: usize,
    config: SchedulerConfig,
}

fn args() -> Args {
    let mut a = Args {
        nodes: 1000,
        pods: 30_000,
        config: SchedulerConfig::default(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{flag} needs a number"))
        };
        match flag.as_str() {
            "--nodes" => a.nodes = value(),
            "--pods" => a.pods = value(),
            "--parallelism" => a.config.parallelism = value(),
            "--percentage" => a.config.percentage_of_nodes_to_score = value() as u32,
            "--no-scheduled-events" => a.config.scheduled_events = false,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

async fn create_nodes(client: &Client, n: usize) {
    let nodes: Api<Node> = Api::all(client.clone());
    stream::iter(0..n)
        .for_each_concurrent(64, |i| {
            let nodes = nodes.clone();
            async move {
                let node = node_object(i);
                let name = node.metadata.name.clone().unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
                let r: serde_json::Value = serde_json::from_str(NODE_RESOURCES).unwrap();
                let status = json!({"status": {"capacity": r, "allocatable": r,
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                nodes
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .unwrap();
            }
        })
        .await;
}

async fn create_pods(client: &Client, n: usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    stream::iter(0..n)
        .for_each_concurrent(128, |i| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod_object(i))
                    .await
                    .unwrap();
            }
        })
        .await;
}

fn pod_object(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": "default", "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }))
    .unwrap()
}

fn node_object(i: usize) -> Node {
    let name = format!("node-{i:05}");
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }))
    .unwrap()
}

const NODE_RESOURCES: &str = r#"{"cpu": "4", "memory": "16Gi", "pods": "110"}"#;

/// The decision alone, in memory: how fast the cache places the same pods on the same nodes
/// with no API in the way (an upper bound for the whole loop).
fn decisions_only(args: &Args) {
    let mut cache = Cache::new();
    let r: serde_json::Value = serde_json::from_str(NODE_RESOURCES).unwrap();
    for i in 0..args.nodes {
        let mut n = node_object(i);
        n.status = Some(
            serde_json::from_value(json!({"allocatable": r,
                "conditions": [{"type": "Ready", "status": "True"}]}))
            .unwrap(),
        );
        cache.set_node(&n);
    }
    let pods: Vec<Pod> = (0..args.pods).map(pod_object).collect();
    let mut rng = Rng::new(42);
    let t = Instant::now();
    for p in &pods {
        let key = ObjectKey::of(p);
        cache
            .schedule(
                &key,
                &PodFacts::of(p),
                args.config.percentage_of_nodes_to_score,
                &mut rng,
            )
            .expect("room for every pod");
    }
    let elapsed = t.elapsed();
    println!(
        "decisions alone (in memory, no API): {} pods in {:.2?}, {:.0} pods/s",
        args.pods,
        elapsed,
        args.pods as f64 / elapsed.as_secs_f64()
    );
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = args();
    decisions_only(&args);
    let cluster = TestCluster::start().await;
    let client = cluster.client();

    let t = Instant::now();
    create_nodes(&client, args.nodes).await;
    println!("{} Ready nodes created in {:.2?}", args.nodes, t.elapsed());
    let t = Instant::now();
    create_pods(&client, args.pods).await;
    let created = t.elapsed();
    println!(
        "{} pending pods created in {:.2?} ({:.0}/s)",
        args.pods,
        created,
        args.pods as f64 / created.as_secs_f64()
    );

    // An independent observer: counts pods it sees go from unbound to bound.
    let observer = SharedInformers::new(client.clone());
    let pods = observer.typed::<Pod>(Scope::all().labels("app=bench"));
    let bound = Arc::new(AtomicUsize::new(0));
    let all_bound = Arc::new(Notify::new());
    let first_bind = Arc::new(OnceLock::<Instant>::new());
    let target = args.pods;
    pods.subscribe(Arc::new({
        let (bound, all_bound, first_bind) = (bound.clone(), all_bound.clone(), first_bind.clone());
        move |e: &Event<Pod>| {
            let node = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
            let newly = match e {
                Event::Added(p) => node(p).is_some(),
                Event::Updated { old, new } => node(old).is_none() && node(new).is_some(),
                Event::Deleted(_) => false,
            };
            if newly {
                first_bind.get_or_init(Instant::now);
                if bound.fetch_add(1, Ordering::Relaxed) + 1 == target {
                    all_bound.notify_one();
                }
            }
        }
    }));
    pods.wait_synced().await.unwrap();

    let (stop, stopped) = oneshot::channel::<()>();
    let start = Instant::now();
    let scheduler = tokio::spawn(setpoint_scheduler::run(
        client.clone(),
        args.config.clone(),
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    let progress = {
        let bound = bound.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                println!(
                    "  {:>6.1}s: {} bound",
                    start.elapsed().as_secs_f64(),
                    bound.load(Ordering::Relaxed)
                );
            }
        })
    };
    if bound.load(Ordering::Relaxed) < target {
        tokio::time::timeout(Duration::from_secs(600), all_bound.notified())
            .await
            .expect("every pod bound within 10 minutes");
    }
    let elapsed = start.elapsed();
    let end = Instant::now();
    progress.abort();
    println!(
        "scheduled {} pods onto {} nodes in {:.2?}: {:.0} pods/s (parallelism {}, events {})",
        target,
        args.nodes,
        elapsed,
        target as f64 / elapsed.as_secs_f64(),
        args.config.parallelism,
        if args.config.scheduled_events {
            "on"
        } else {
            "off"
        },
    );
    if let Some(first) = first_bind.get() {
        let binding = end.duration_since(*first);
        println!(
            "first bind {:.2?} after start (the scheduler's informers LIST every pod first); \
             from first to last bind: {:.2?}, {:.0} pods/s",
            first.duration_since(start),
            binding,
            target as f64 / binding.as_secs_f64()
        );
    }

    // Check the result: nothing overcommitted.
    let mut per_node = std::collections::HashMap::<String, usize>::new();
    for p in pods.store().list() {
        if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
            *per_node.entry(n).or_default() += 1;
        }
    }
    let max = per_node.values().copied().max().unwrap_or(0);
    let min = per_node.values().copied().min().unwrap_or(0);
    println!(
        "nodes used: {}, pods per node: min {min}, max {max} (cpu allows 40)",
        per_node.len()
    );
    assert!(max <= 40, "a node was overcommitted");

    let _ = stop.send(());
    scheduler.await.unwrap();
    observer.shutdown().await;
    cluster.stop().await;
}
