//! `bench metrics-pipeline`: what the resource metrics pipeline costs the API server per
//! scrape of P pods. Each node's Summary is the document an agent serves (built by the agent's
//! own `stats::summary` from steered usage), and each scrape runs the API server's own code on
//! it (`resourcemetrics`): the body decoded, then the node's state rated against the previous
//! scrape's. Fetching over HTTPS and answering `kubectl top` are not in the figure.
//!
//! - CPU per scrape: this thread's CPU time over one scrape of every node (the API server
//!   scrapes a few nodes at once, so this is the total it spends, not the wall time it takes);
//! - memory held: the process's resident set after the scrapes, less before, with the
//!   Summaries' bytes dropped: the state the API server keeps between scrapes (approximate:
//!   the allocator keeps some freed memory).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use setpoint_apiserver::resourcemetrics::{ingest, NodeState, Summary};
use setpoint_node::runtime::RuntimePod;
use setpoint_node::stats::{self, ContainerStats, CpuRates, NodeUsage, PodStats, Usage};

use crate::procstat::parse_cpu_ms;
use crate::report::Percentiles;
use crate::BenchError;

/// How a run goes.
#[derive(Clone, Debug)]
pub struct MetricsPipelineConfig {
    /// Pods, one container each.
    pub pods: usize,
    /// Pods per node (the last node may have fewer).
    pub pods_per_node: usize,
    /// Scrapes measured, after the first (which only records the first samples).
    pub scrapes: usize,
    /// Millicores every container uses (what the figures must give back).
    pub millicores: u64,
}

/// The figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct MetricsPipelineReport {
    /// Pods scraped.
    pub pods: u64,
    /// Nodes they are on.
    pub nodes: u64,
    /// Bytes of all the nodes' Summaries of one scrape.
    pub summary_bytes: u64,
    /// CPU time of one scrape of every node, ms (10 ms resolution: the kernel's ticks).
    pub cpu_ms: Percentiles,
    /// Wall time of one scrape of every node on one thread, ms.
    pub wall_ms: Percentiles,
    /// Resident memory the pipeline's state holds after the scrapes, MiB (approximate).
    pub held_mib: f64,
    /// Pods whose CPU figure came back as the steered usage (every pod, in a good run).
    pub pods_with_figures: u64,
}

const SCRAPE_INTERVAL: Duration = Duration::from_secs(15);

fn thread_cpu_ms() -> Option<u64> {
    parse_cpu_ms(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Every node's Summary body at scrape `k`, as the agents would serve them: each container
/// has used `millicores` since `start`.
fn summaries(config: &MetricsPipelineConfig, start: Timestamp, k: usize) -> Vec<(String, Vec<u8>)> {
    let now = start + SignedDuration::from_secs(15 * (k as i64 + 1));
    let elapsed_ns = (now.as_nanosecond() - start.as_nanosecond()) as u64;
    let used = Usage {
        cpu_core_nanoseconds: elapsed_ns / 1000 * config.millicores,
        memory_working_set_bytes: 50 << 20,
    };
    let per = config.pods_per_node.max(1);
    let nodes = config.pods.div_ceil(per);
    (0..nodes)
        .map(|n| {
            let name = format!("bench-node-{n}");
            let pods: Vec<PodStats> = (n * per..((n + 1) * per).min(config.pods))
                .map(|i| PodStats {
                    pod: RuntimePod {
                        uid: format!("00000000-0000-0000-0000-{i:012}"),
                        namespace: "bench".into(),
                        name: format!("pod-{i}"),
                    },
                    start_time: start,
                    containers: vec![ContainerStats {
                        name: "app".into(),
                        start_time: start,
                        usage: used,
                    }],
                })
                .collect();
            let node = NodeUsage {
                start_time: start,
                usage: Usage {
                    cpu_core_nanoseconds: used.cpu_core_nanoseconds * pods.len() as u64,
                    memory_working_set_bytes: used.memory_working_set_bytes * pods.len() as u64,
                },
                memory_available_bytes: Some(1 << 34),
            };
            let body = stats::summary(&name, &node, &pods, now, &CpuRates::new());
            (name, serde_json::to_vec(&body).expect("a Summary"))
        })
        .collect()
}

/// Runs the benchmark on this thread (it is CPU-bound and measures this thread's CPU time).
pub fn run(config: &MetricsPipelineConfig) -> Result<MetricsPipelineReport, BenchError> {
    let start = Timestamp::from_second(chrono::Utc::now().timestamp() - 3600)
        .map_err(|e| BenchError::Setup(e.to_string()))?;
    let before = rss_kib().unwrap_or(0);
    let mut state: HashMap<String, NodeState> = HashMap::new();
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let mut summary_bytes = 0;
    for k in 0..=config.scrapes {
        let bodies = summaries(config, start, k);
        summary_bytes = bodies.iter().map(|(_, b)| b.len() as u64).sum();
        let (c0, t0) = (thread_cpu_ms(), Instant::now());
        for (node, body) in &bodies {
            let summary: Summary = serde_json::from_slice(body)?;
            let next = ingest(state.get(node), &summary);
            state.insert(node.clone(), next);
        }
        let elapsed = t0.elapsed();
        // The first scrape only records samples: there is nothing to rate yet.
        if k > 0 {
            wall.push(elapsed.as_micros() as u64);
            if let (Some(a), Some(b)) = (c0, thread_cpu_ms()) {
                cpu.push((b - a) * 1000);
            }
        }
    }
    let after = rss_kib().unwrap_or(before);
    let want = config.millicores * 1_000_000;
    let pods_with_figures = state
        .values()
        .flat_map(|s| s.pods.values())
        .filter(|containers| {
            containers.iter().all(|c| {
                c.point.cpu_nanocores.abs_diff(want) <= want / 100
                    && c.point.window == SCRAPE_INTERVAL
            })
        })
        .count() as u64;
    if config.scrapes > 0 && pods_with_figures != config.pods as u64 {
        return Err(BenchError::Setup(format!(
            "{pods_with_figures} of {} pods have the steered usage as their figure",
            config.pods
        )));
    }
    Ok(MetricsPipelineReport {
        pods: config.pods as u64,
        nodes: state.len() as u64,
        summary_bytes,
        cpu_ms: Percentiles::of_us(cpu),
        wall_ms: Percentiles::of_us(wall),
        held_mib: after.saturating_sub(before) as f64 / 1024.0,
        pods_with_figures,
    })
}

/// The report as a table.
pub fn table(r: &MetricsPipelineReport) -> String {
    let row = |what: &str, p: &Percentiles| {
        format!(
            "  {what:<22} {:>6} {:>10.1} {:>10.1} {:>10.1}\n",
            p.count, p.p50, p.p99, p.max
        )
    };
    format!(
        "metrics pipeline: {} pods on {} nodes, {:.1} MiB of Summaries a scrape\n  \
         {:<22} {:>6} {:>10} {:>10} {:>10}\n{}{}  \
         state held between scrapes: {:.1} MiB resident (approximate)\n",
        r.pods,
        r.nodes,
        r.summary_bytes as f64 / (1 << 20) as f64,
        "one scrape, every node",
        "count",
        "p50 ms",
        "p99 ms",
        "max ms",
        row("CPU", &r.cpu_ms),
        row("wall (one thread)", &r.wall_ms),
        r.held_mib,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pod_gets_the_steered_usage_back() {
        let config = MetricsPipelineConfig {
            pods: 25,
            pods_per_node: 10,
            scrapes: 2,
            millicores: 250,
        };
        let r = run(&config).unwrap();
        assert_eq!(r.nodes, 3);
        assert_eq!(r.pods_with_figures, 25);
        assert_eq!(r.wall_ms.count, 2);
        assert!(r.summary_bytes > 25 * 100, "{r:?}");
        assert!(table(&r).contains("25 pods on 3 nodes"));
    }
}
