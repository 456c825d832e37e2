//! Real processes on one node: how long from creating pods to their processes Running, and
//! how long a deleted pod's replacement process takes to run.
//!
//! `cargo run --release -p setpoint-node --example process_pods_bench -- [PODS] [REPLACEMENTS]`
//! (defaults 1,000 and 100). An in-process cluster with the built-in controllers, the scheduler
//! and one agent on the process runtime; a Deployment of PODS replicas of `sleep 3600`. Prints
//! p50/p99 of create → Running (creationTimestamp has whole seconds, so this is measured from
//! when the watch saw each pod created) and of delete → replacement Running.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use setpoint_node::process::ProcessRuntime;
use setpoint_node::runtime::PodRuntime;
use setpoint_node::AgentConfig;
use setpoint_runtime::client::{
    Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams,
};
use setpoint_testing::TestCluster;
use tokio::sync::Mutex;

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
            })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let replacements: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let cluster = TestCluster::start_with_controllers().await;
    let client = cluster.client();
    let state = tempfile::tempdir().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let scheduler = tokio::spawn(setpoint_scheduler::run(
        client.clone(),
        Default::default(),
        None,
        stopped(stop_rx.clone()),
    ));
    let runtime = Arc::new(ProcessRuntime::new(state.path()).unwrap());
    let mut config = AgentConfig::local("bench-node");
    config.address = "127.0.0.1".into();
    config.server_listen = "127.0.0.1:0".parse().unwrap();
    config.capacity.pods = (pods + 10) as u32;
    config.pod_workers = 16;
    let agent = tokio::spawn(setpoint_node::run_agent(
        client.clone(),
        config,
        runtime.clone(),
        stopped(stop_rx.clone()),
    ));

    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let watcher = {
        let seen = seen.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let list = api.list(&ListParams::default()).await.unwrap();
            let params = WatchParams {
                label_selector: Some("app=sleeper".into()),
                ..WatchParams::default()
            };
            let mut stream = api.watch(&params, &list.resource_version).await.unwrap();
            while let Some(Ok(ev)) = stream.next().await {
                let (WatchEvent::Added(p) | WatchEvent::Modified(p)) = ev else {
                    continue;
                };
                let name = p.metadata.name.clone().unwrap_or_default();
                let now = Instant::now();
                let mut s = seen.lock().await;
                s.created.entry(name.clone()).or_insert(now);
                if running(&p) {
                    s.running.entry(name).or_insert(now);
                }
            }
        })
    };

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "sleeper"},
        "spec": {"replicas": pods, "selector": {"matchLabels": {"app": "sleeper"}},
                 "template": {"metadata": {"labels": {"app": "sleeper"}},
                     "spec": {"terminationGracePeriodSeconds": 1,
                              "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}]}}}
    }))
    .unwrap();
    let started = Instant::now();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    loop {
        if seen.lock().await.running.len() >= pods {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "pods did not all run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_running = started.elapsed();
    let mut to_running: Vec<Duration> = {
        let s = seen.lock().await;
        s.running
            .iter()
            .filter_map(|(n, r)| s.created.get(n).map(|c| r.saturating_duration_since(*c)))
            .collect()
    };
    to_running.sort();

    // Delete pods one at a time; time until a new pod's process runs.
    let mut replace: Vec<Duration> = Vec::new();
    for _ in 0..replacements {
        let victim = {
            let s = seen.lock().await;
            s.running.keys().next().cloned().unwrap()
        };
        let before: usize = seen.lock().await.running.len();
        let t0 = Instant::now();
        api.delete(&victim, &DeleteParams::default()).await.unwrap();
        loop {
            if seen.lock().await.running.len() > before {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no replacement ran");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        replace.push(t0.elapsed());
        seen.lock().await.running.remove(&victim);
    }
    replace.sort();

    println!("process pods on one node: {pods}");
    println!(
        "all Running after:            {:.2} s ({:.0} pods/s)",
        all_running.as_secs_f64(),
        pods as f64 / all_running.as_secs_f64()
    );
    println!(
        "created → Running:            p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        percentile(&to_running, 0.5).as_secs_f64() * 1000.0,
        percentile(&to_running, 0.99).as_secs_f64() * 1000.0,
        to_running.last().copied().unwrap_or_default().as_secs_f64() * 1000.0
    );
    println!(
        "deleted → replacement Running: p50 {:.0} ms, p99 {:.0} ms ({replacements} deletions)",
        percentile(&replace, 0.5).as_secs_f64() * 1000.0,
        percentile(&replace, 0.99).as_secs_f64() * 1000.0
    );

    // Clean up: the Deployment's pods are stopped by the agent before it exits.
    deployments
        .delete("sleeper", &DeleteParams::default())
        .await
        .unwrap();
    let t0 = Instant::now();
    while !runtime.pods().await.is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "pods were not all stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watcher.abort();
    let _ = stop_tx.send(true);
    let _ = scheduler.await;
    let _ = agent.await;
    cluster.stop().await;
}
