//! The resource metrics pipeline's CPU per scrape of many pods, on one thread: a simulated
//! node's runtime holding `PODS` running pods (default 10,000; one container each, steered to
//! 140m and 64Mi) measured and written as the kubelet Summary the agent serves (the agent's
//! half), then that document parsed and folded into the API server's in-memory figures, CPU
//! rated against the previous round (the API server's half). Each half's CPU time is the
//! thread's own (`/proc/thread-self/schedstat`), over `ROUNDS` rounds (default 20) after one
//! warm-up round. The TLS connection and the HTTP framing between the two are not included.
//!
//! `cargo run --release -p setpoint --example resource_metrics_bench` (or
//! `bench/resource_metrics.sh`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use setpoint_apiserver::resourcemetrics::{ResourceMetrics, Summary};
use setpoint_node::runtime::{NodeContext, PodRuntime};
use setpoint_node::simulated::{SimulatedConfig, SimulatedRuntime};
use setpoint_node::stats::{CpuRates, SIMULATED_CPU_ANNOTATION, SIMULATED_MEMORY_ANNOTATION};

/// CPU this thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .expect("/proc/thread-self/schedstat")
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(i: usize) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("web-{i}")),
            namespace: Some("bench".into()),
            uid: Some(format!("uid-{i}")),
            annotations: Some(BTreeMap::from([
                (SIMULATED_CPU_ANNOTATION.to_string(), "140m".to_string()),
                (SIMULATED_MEMORY_ANNOTATION.to_string(), "64Mi".to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("nginx:1.25".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pods = env_or("PODS", 10_000);
    let rounds = env_or("ROUNDS", 20);
    let runtime = SimulatedRuntime::new(SimulatedConfig {
        start_delay: Duration::ZERO,
        ready_delay: Duration::ZERO,
        ..SimulatedConfig::default()
    });
    let node = NodeContext {
        node_name: "bench-node".into(),
        host_ip: "127.0.0.1".into(),
        sources: None,
    };
    for i in 0..pods {
        runtime.sync_pod(&pod(i), &node).await.expect("sync");
    }
    let rates = CpuRates::new();
    let figures = ResourceMetrics::default();
    let (mut agent_ns, mut api_ns, mut bytes) = (0u64, 0u64, 0usize);
    for round in 0..=rounds {
        // Samples a little apart, as scrapes are.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t0 = thread_cpu_ns();
        let stats = runtime.stats().await.expect("stats");
        let node_usage = stats.node.clone().expect("a simulated node reports itself");
        let now = k8s_openapi::jiff::Timestamp::from_microsecond(now_micros()).expect("now");
        let doc =
            setpoint_node::stats::summary("bench-node", &node_usage, &stats.pods, now, &rates);
        let body = serde_json::to_vec(&doc).expect("serialize");
        let t1 = thread_cpu_ns();
        let summary: Summary = serde_json::from_slice(&body).expect("parse");
        figures.record("bench-node", &summary);
        let t2 = thread_cpu_ns();
        assert_eq!(summary.pods.len(), pods);
        if round > 0 {
            agent_ns += t1 - t0;
            api_ns += t2 - t1;
            bytes = body.len();
        }
    }
    let per = |ns: u64| ns as f64 / rounds as f64 / 1e6 * (10_000.0 / pods as f64);
    println!("pods per scrape:                    {pods}");
    println!("rounds:                             {rounds}");
    println!(
        "summary size:                       {:.1} MiB",
        bytes as f64 / (1 << 20) as f64
    );
    println!(
        "agent CPU per 10,000 pods:          {:.1} ms (measure + Summary JSON)",
        per(agent_ns)
    );
    println!(
        "API server CPU per 10,000 pods:     {:.1} ms (parse + rates + store)",
        per(api_ns)
    );
    println!(
        "pipeline CPU per 10,000 pods:       {:.1} ms per scrape; at the 15 s resolution {:.2} % of a core",
        per(agent_ns + api_ns),
        per(agent_ns + api_ns) / 15_000.0 * 100.0
    );
}

/// Wall-clock microseconds since the epoch.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
