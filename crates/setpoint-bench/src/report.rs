//! Every figure of every benchmark, computed by pure functions of the raw log.
//!
//! Nothing here reads a clock or the network: [`density`], [`churn`] and [`api`] take the
//! entries a run recorded (in memory or read back from `--raw-log`) and return the report, so
//! the same log always gives the same report and the figures are unit-tested.
//!
//! Percentiles are nearest-rank (the smallest observed value with at least p% of observations
//! at or below it), so every percentile is a value that was actually observed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::record::{Entry, Mark, Record};
use crate::BenchError;

/// What "Running" means in every report.
pub const RUNNING_MEANS: &str = "phase Running and every container ready";

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// How many durations were observed (0: every figure below is 0).
    pub count: u64,
    /// The median, ms.
    pub p50: f64,
    /// The 90th percentile, ms.
    pub p90: f64,
    /// The 99th percentile, ms.
    pub p99: f64,
    /// The longest observed, ms.
    pub max: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of durations in microseconds (all zero when there are none).
    pub fn of_us(mut values: Vec<u64>) -> Self {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_unstable();
        let rank = |p: f64| {
            let n = values.len();
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            values[i] as f64 / 1000.0
        };
        Percentiles {
            count: values.len() as u64,
            p50: rank(0.50),
            p90: rank(0.90),
            p99: rank(0.99),
            max: values[values.len() - 1] as f64 / 1000.0,
        }
    }
}

/// Client-side latency of one verb on one resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiLatency {
    /// The client call (`create`, `get`, `list`, `watch`, `patch`, …).
    pub verb: String,
    /// The resource's plural name (`pods`, `configmaps`).
    pub resource: String,
    /// Requests sent (retries included).
    pub count: u64,
    /// Requests that failed (any error, including those then retried).
    pub errors: u64,
    /// Sent → answered (or failed), failures included.
    pub latency_ms: Percentiles,
}

/// CPU and memory of one local process over the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessUsage {
    /// The process id.
    pub pid: u32,
    /// The process as sampled: `setpoint` and its first arguments, or this process.
    pub name: String,
    /// What the process is, without the arguments that differ between clusters
    /// (`setpoint up`, `setpoint agent`, `benchmark`), so two runs' processes line up.
    #[serde(default)]
    pub role: String,
    /// Highest `VmHWM` sampled (the kernel's own peak RSS), MiB.
    pub peak_rss_mib: f64,
    /// Whether that peak is the run's: the sampler reset the process's peak when the run
    /// started. If not, it is the peak since the process started.
    #[serde(default)]
    pub peak_is_the_runs: bool,
    /// CPU seconds (user + system) between the first and the last sample.
    pub cpu_seconds: f64,
}

/// The first record of a log.
#[derive(Clone, Debug, PartialEq)]
struct Header {
    benchmark: String,
    run_id: String,
    unix_ms: i64,
    params: serde_json::Value,
}

fn header(entries: &[Entry], benchmark: &str) -> Result<Header, BenchError> {
    let h = entries.iter().find_map(|e| match &e.record {
        Record::Start {
            benchmark,
            run_id,
            unix_ms,
            params,
        } => Some(Header {
            benchmark: benchmark.clone(),
            run_id: run_id.clone(),
            unix_ms: *unix_ms,
            params: params.clone(),
        }),
        _ => None,
    });
    match h {
        Some(h) if h.benchmark == benchmark => Ok(h),
        Some(h) => Err(BenchError::Setup(format!(
            "the log is of a {} run, not {benchmark}",
            h.benchmark
        ))),
        None => Err(BenchError::Setup("the log has no start record".into())),
    }
}

fn param(h: &Header, name: &str) -> u64 {
    h.params.get(name).and_then(|v| v.as_u64()).unwrap_or(0)
}

fn mark(entries: &[Entry], m: Mark) -> Option<u64> {
    entries.iter().find_map(|e| match e.record {
        Record::Mark { mark } if mark == m => Some(e.t_us),
        _ => None,
    })
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// Per verb and resource, sorted by both; only requests for which `keep(t_us)` holds.
pub fn api_latencies(entries: &[Entry], keep: impl Fn(u64) -> bool) -> Vec<ApiLatency> {
    let mut by: BTreeMap<(String, String), (Vec<u64>, u64)> = BTreeMap::new();
    for e in entries {
        if let Record::Request {
            verb,
            resource,
            us,
            error,
        } = &e.record
        {
            if !keep(e.t_us) {
                continue;
            }
            let slot = by.entry((verb.clone(), resource.clone())).or_default();
            slot.0.push(*us);
            slot.1 += u64::from(error.is_some());
        }
    }
    by.into_iter()
        .map(|((verb, resource), (us, errors))| ApiLatency {
            verb,
            resource,
            count: us.len() as u64,
            errors,
            latency_ms: Percentiles::of_us(us),
        })
        .collect()
}

/// Peak RSS and CPU seconds per sampled process, by pid.
pub fn processes(entries: &[Entry]) -> Vec<ProcessUsage> {
    let mut by: BTreeMap<u32, (String, u64, u64, u64)> = BTreeMap::new();
    let reset: std::collections::HashSet<u32> = entries
        .iter()
        .filter_map(|e| match e.record {
            Record::PeakReset { pid, reset: true } => Some(pid),
            _ => None,
        })
        .collect();
    for e in entries {
        if let Record::Process {
            pid,
            name,
            hwm_kb,
            cpu_ms,
        } = &e.record
        {
            let s = by
                .entry(*pid)
                .or_insert_with(|| (name.clone(), 0, *cpu_ms, *cpu_ms));
            s.1 = s.1.max(*hwm_kb);
            s.2 = s.2.min(*cpu_ms);
            s.3 = s.3.max(*cpu_ms);
        }
    }
    by.into_iter()
        .map(|(pid, (name, hwm, lo, hi))| ProcessUsage {
            pid,
            role: role_of(&name),
            name,
            peak_rss_mib: hwm as f64 / 1024.0,
            peak_is_the_runs: reset.contains(&pid),
            cpu_seconds: (hi - lo) as f64 / 1000.0,
        })
        .collect()
}

/// The role of a sampled process from its name (see [`crate::procstat::setpoint_processes`]).
fn role_of(name: &str) -> String {
    if name.starts_with("this process") {
        return "benchmark".into();
    }
    name.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

fn count_retries(entries: &[Entry]) -> u64 {
    entries
        .iter()
        .filter(|e| matches!(e.record, Record::Retry { .. }))
        .count() as u64
}

fn missing(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|e| match &e.record {
            Record::Missing { what } => Some(what.clone()),
            _ => None,
        })
        .collect()
}

/// Per-pod phase latencies of a density run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseLatencies {
    /// First seen created → first seen with a node.
    pub created_to_scheduled: Percentiles,
    /// First seen with a node → first seen Running.
    pub scheduled_to_running: Percentiles,
    /// First seen created → first seen Running.
    pub created_to_running: Percentiles,
    /// Creates started → Deployment first seen Available (per Deployment).
    pub deployment_available: Percentiles,
}

/// The report of `bench density`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DensityReport {
    /// Which benchmark the report is of (`density`); `compare` refuses to compare different ones.
    pub benchmark: String,
    /// The run's random id; the run's namespaces are named after it (`bench-<id>…`).
    pub run_id: String,
    /// When the run started, wall clock, milliseconds since the Unix epoch.
    pub started_unix_ms: i64,
    /// Ready nodes pods could land on (simulated ones included).
    pub nodes: u64,
    /// Simulated nodes this run hosted.
    pub simulated_nodes: u64,
    /// Which workloads the run created (`Deployment`, `StatefulSet` or `DaemonSet`).
    #[serde(default = "deployment_kind")]
    pub kind: String,
    /// Workloads the run created (Deployments unless `kind` says otherwise).
    pub deployments: u64,
    /// `spec.replicas` of each of them.
    pub replicas: u64,
    /// Pods asked for: deployments × replicas.
    pub pods: u64,
    /// Deployment creates started per second, when the run paced them (else as fast as the
    /// cluster answered).
    #[serde(default)]
    pub create_rate: Option<f64>,
    /// What counts as Running in the figures ([`RUNNING_MEANS`]), so a report read alone says.
    pub running_means: String,
    /// Creates started → every pod Running and every Deployment Available (or the last one
    /// seen, when the run timed out).
    pub total_seconds: f64,
    /// Pods seen Running / `total_seconds`.
    pub pods_running_per_second: f64,
    /// Creates started → every Deployment create answered.
    pub create_seconds: Option<f64>,
    /// Namespace deletes sent → namespaces gone (`None` with `--keep` or when it did not end).
    pub deletion_seconds: Option<f64>,
    /// Pods of the run seen at all.
    pub pods_created: u64,
    /// Pods seen bound to a node.
    pub pods_scheduled: u64,
    /// Pods seen Running (as [`RUNNING_MEANS`] says).
    pub pods_running: u64,
    /// Deployments seen with every replica available.
    pub deployments_available: u64,
    /// Whether the wait for readiness gave up before everything was Running and Available.
    pub timed_out: bool,
    /// What was still missing when a wait gave up, one line each; empty when nothing was.
    pub missing: Vec<String>,
    /// Per-pod and per-Deployment phase latencies.
    pub latency_ms: PhaseLatencies,
    /// Requests sent (retries included).
    pub requests: u64,
    /// Requests that failed, whatever the error.
    pub errors: u64,
    /// Requests that were retried after a transient failure.
    pub retries: u64,
    /// Latency per verb and resource, over the whole run.
    pub api: Vec<ApiLatency>,
    /// CPU and peak memory of each local process sampled.
    pub processes: Vec<ProcessUsage>,
    /// Sum of the processes' peak RSS, MiB.
    pub peak_rss_mib_total: f64,
    /// Sum of the processes' CPU seconds.
    pub cpu_seconds_total: f64,
    /// `[seconds since creates started, pods Running]`, at most 101 evenly spaced points.
    pub running_over_time: Vec<(f64, u64)>,
}

/// The kind of reports written before runs could create other workloads.
fn deployment_kind() -> String {
    "Deployment".into()
}

/// Computes the density report from its raw log.
pub fn density(entries: &[Entry]) -> Result<DensityReport, BenchError> {
    let h = header(entries, "density")?;
    let origin = mark(entries, Mark::CreatesStarted).unwrap_or(0);
    let mut created: HashMap<&str, u64> = HashMap::new();
    let mut scheduled: HashMap<&str, u64> = HashMap::new();
    let mut running: HashMap<&str, u64> = HashMap::new();
    let mut available: HashMap<&str, u64> = HashMap::new();
    for e in entries {
        // The recorder already keeps only first sightings; `or_insert` makes that hold even
        // for a hand-edited log.
        match &e.record {
            Record::PodCreated { pod } => {
                created.entry(pod).or_insert(e.t_us);
            }
            Record::PodScheduled { pod, .. } => {
                scheduled.entry(pod).or_insert(e.t_us);
            }
            Record::PodRunning { pod } => {
                running.entry(pod).or_insert(e.t_us);
            }
            Record::DeploymentAvailable { deployment } => {
                available.entry(deployment).or_insert(e.t_us);
            }
            _ => {}
        }
    }
    let between = |from: &HashMap<&str, u64>, to: &HashMap<&str, u64>| {
        Percentiles::of_us(
            to.iter()
                .filter_map(|(k, t)| from.get(k).map(|f| t.saturating_sub(*f)))
                .collect(),
        )
    };
    let end = mark(entries, Mark::AllReady).unwrap_or_else(|| {
        running
            .values()
            .chain(available.values())
            .copied()
            .max()
            .unwrap_or(origin)
    });
    let total_us = end.saturating_sub(origin);
    let total_seconds = secs(total_us);
    let mut running_times: Vec<u64> = running.values().copied().collect();
    running_times.sort_unstable();
    let running_over_time = (0..=100u64)
        .map(|i| {
            let at = origin + total_us * i / 100;
            let n = running_times.partition_point(|t| *t <= at) as u64;
            (secs(at - origin), n)
        })
        .collect();
    let procs = processes(entries);
    let api = api_latencies(entries, |_| true);
    let deployments = param(&h, "deployments");
    let replicas = param(&h, "replicas");
    Ok(DensityReport {
        benchmark: h.benchmark.clone(),
        run_id: h.run_id.clone(),
        started_unix_ms: h.unix_ms,
        nodes: param(&h, "nodes"),
        simulated_nodes: param(&h, "simulated_nodes"),
        kind: h
            .params
            .get("kind")
            .and_then(|v| v.as_str())
            .map_or_else(deployment_kind, str::to_string),
        deployments,
        replicas,
        pods: deployments * replicas,
        create_rate: h.params.get("create_rate").and_then(|v| v.as_f64()),
        running_means: RUNNING_MEANS.into(),
        total_seconds,
        pods_running_per_second: if total_us > 0 {
            running.len() as f64 / total_seconds
        } else {
            0.0
        },
        create_seconds: mark(entries, Mark::CreatesDone).map(|t| secs(t.saturating_sub(origin))),
        deletion_seconds: match (
            mark(entries, Mark::DeleteStarted),
            mark(entries, Mark::Deleted),
        ) {
            (Some(a), Some(b)) => Some(secs(b.saturating_sub(a))),
            _ => None,
        },
        pods_created: created.len() as u64,
        pods_scheduled: scheduled.len() as u64,
        pods_running: running.len() as u64,
        deployments_available: available.len() as u64,
        timed_out: mark(entries, Mark::TimedOut).is_some(),
        missing: missing(entries),
        latency_ms: PhaseLatencies {
            created_to_scheduled: between(&created, &scheduled),
            scheduled_to_running: between(&scheduled, &running),
            created_to_running: between(&created, &running),
            deployment_available: Percentiles::of_us(
                available
                    .values()
                    .map(|t| t.saturating_sub(origin))
                    .collect(),
            ),
        },
        requests: api.iter().map(|a| a.count).sum(),
        errors: api.iter().map(|a| a.errors).sum(),
        retries: count_retries(entries),
        api,
        peak_rss_mib_total: procs.iter().map(|p| p.peak_rss_mib).sum(),
        cpu_seconds_total: procs.iter().map(|p| p.cpu_seconds).sum(),
        processes: procs,
        running_over_time,
    })
}

/// One 5-second window of a churn run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChurnWindow {
    /// Window start, seconds since the load started.
    pub start_seconds: f64,
    /// Requests sent in the window.
    pub sent: u64,
    /// Requests sent in the window that failed.
    pub errors: u64,
    /// Operations that were due but not sent because every slot was busy.
    pub skipped: u64,
    /// Latency of the requests sent in the window.
    pub latency_ms: Percentiles,
}

/// Length of a churn window.
pub const CHURN_WINDOW_US: u64 = 5_000_000;

/// The report of `bench churn`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChurnReport {
    /// Which benchmark the report is of (`churn`); `compare` refuses to compare different ones.
    pub benchmark: String,
    /// The run's random id; the run's namespaces are named after it (`bench-<id>…`).
    pub run_id: String,
    /// When the run started, wall clock, milliseconds since the Unix epoch.
    pub started_unix_ms: i64,
    /// Operations per second asked for.
    pub requested_rate: f64,
    /// Length of the load phase as run.
    pub duration_seconds: f64,
    /// Operations due over the load phase.
    pub due: u64,
    /// Requests sent during the load.
    pub sent: u64,
    /// Requests answered with success.
    pub succeeded: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Operations due but not sent because `max_in_flight` were outstanding.
    pub skipped: u64,
    /// Succeeded operations per second of load.
    pub achieved_rate: f64,
    /// At the end of the load: operations skipped plus those sent but not yet answered.
    pub backlog: u64,
    /// Nothing skipped and at least 95 % of the requested rate succeeded.
    pub kept_up: bool,
    /// With nodes to run pods on: whether what the load left settled (Deployments Available,
    /// pods Running, deleted pods gone) before the timeout. `None` without nodes.
    #[serde(default)]
    pub settled: Option<bool>,
    /// End of the load → settled.
    #[serde(default)]
    pub settle_seconds: Option<f64>,
    /// Latency per verb and resource, during the load.
    pub api: Vec<ApiLatency>,
    /// The load phase in consecutive windows of [`CHURN_WINDOW_US`].
    pub windows: Vec<ChurnWindow>,
    /// CPU and peak memory of each local process sampled.
    pub processes: Vec<ProcessUsage>,
}

/// Computes the churn report from its raw log.
pub fn churn(entries: &[Entry]) -> Result<ChurnReport, BenchError> {
    let h = header(entries, "churn")?;
    let origin = mark(entries, Mark::CreatesStarted).unwrap_or(0);
    let end = mark(entries, Mark::LoadDone)
        .unwrap_or_else(|| entries.last().map(|e| e.t_us).unwrap_or(origin));
    let in_load = |t: u64| t >= origin && t < end;
    let rate = h.params.get("rate").and_then(|v| v.as_f64()).unwrap_or(0.0);
    let duration_seconds = secs(end.saturating_sub(origin));
    let (mut sent, mut ok, mut errors, mut skipped, mut in_flight) = (0, 0, 0, 0, 0);
    let n_windows = end.saturating_sub(origin).div_ceil(CHURN_WINDOW_US) as usize;
    let mut windows: Vec<(Vec<u64>, u64, u64)> = vec![Default::default(); n_windows];
    for e in entries.iter().filter(|e| in_load(e.t_us)) {
        let w = ((e.t_us - origin) / CHURN_WINDOW_US) as usize;
        match &e.record {
            Record::Request { us, error, .. } => {
                sent += 1;
                if error.is_some() {
                    errors += 1;
                    windows[w].1 += 1;
                } else {
                    ok += 1;
                }
                if e.t_us + us > end {
                    in_flight += 1;
                }
                windows[w].0.push(*us);
            }
            Record::Skipped { .. } => {
                skipped += 1;
                windows[w].2 += 1;
            }
            _ => {}
        }
    }
    let achieved_rate = if duration_seconds > 0.0 {
        ok as f64 / duration_seconds
    } else {
        0.0
    };
    Ok(ChurnReport {
        benchmark: h.benchmark.clone(),
        run_id: h.run_id.clone(),
        started_unix_ms: h.unix_ms,
        requested_rate: rate,
        duration_seconds,
        due: sent + skipped,
        sent,
        succeeded: ok,
        errors,
        skipped,
        achieved_rate,
        backlog: skipped + in_flight,
        kept_up: skipped == 0 && achieved_rate >= 0.95 * rate,
        settled: (param(&h, "simulated_nodes") > 0).then(|| mark(entries, Mark::Settled).is_some()),
        settle_seconds: mark(entries, Mark::Settled).map(|t| secs(t.saturating_sub(end))),
        api: api_latencies(entries, in_load),
        windows: windows
            .into_iter()
            .enumerate()
            .map(|(i, (us, errors, skipped))| ChurnWindow {
                start_seconds: secs(i as u64 * CHURN_WINDOW_US),
                sent: us.len() as u64,
                errors,
                skipped,
                latency_ms: Percentiles::of_us(us),
            })
            .collect(),
        processes: processes(entries),
    })
}

/// The report of `bench api`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiReport {
    /// Which benchmark the report is of (`api`); `compare` refuses to compare different ones.
    pub benchmark: String,
    /// The run's random id; the run's namespaces are named after it (`bench-<id>…`).
    pub run_id: String,
    /// When the run started, wall clock, milliseconds since the Unix epoch.
    pub started_unix_ms: i64,
    /// Workers, each with one request in flight.
    pub concurrency: u64,
    /// Bytes of payload per ConfigMap.
    pub object_size: u64,
    /// Watchers on the run's namespace.
    pub watchers: u64,
    /// Length of the load phase as run, seconds.
    pub duration_seconds: f64,
    /// Requests sent (retries included).
    pub requests: u64,
    /// Requests that failed, whatever the error.
    pub errors: u64,
    /// All requests answered per second of load.
    pub requests_per_second: f64,
    /// Requests per second, per verb.
    pub per_second: BTreeMap<String, f64>,
    /// Latency per verb and resource, during the load.
    pub api: Vec<ApiLatency>,
    /// Successful writes (create, update, patch) during the load.
    pub writes: u64,
    /// Events the watchers received (each write should reach every watcher once).
    pub deliveries: u64,
    /// Writer sent the change → a watcher received it.
    pub delivery_ms: Percentiles,
    /// CPU and peak memory of each local process sampled.
    pub processes: Vec<ProcessUsage>,
}

/// Computes the api report from its raw log.
pub fn api(entries: &[Entry]) -> Result<ApiReport, BenchError> {
    let h = header(entries, "api")?;
    let origin = mark(entries, Mark::CreatesStarted).unwrap_or(0);
    let end = mark(entries, Mark::LoadDone)
        .unwrap_or_else(|| entries.last().map(|e| e.t_us).unwrap_or(origin));
    let in_load = |t: u64| t >= origin && t < end;
    let duration_seconds = secs(end.saturating_sub(origin));
    let api = api_latencies(entries, in_load);
    let per = |n: u64| {
        if duration_seconds > 0.0 {
            n as f64 / duration_seconds
        } else {
            0.0
        }
    };
    let mut per_verb: BTreeMap<String, u64> = BTreeMap::new();
    for a in &api {
        *per_verb.entry(a.verb.clone()).or_default() += a.count;
    }
    let mut writes = 0;
    let mut delivered = Vec::new();
    for e in entries {
        match &e.record {
            Record::Request {
                verb, error: None, ..
            } if in_load(e.t_us) && matches!(verb.as_str(), "create" | "update" | "patch") => {
                writes += 1
            }
            Record::Delivery { us, .. } => delivered.push(*us),
            _ => {}
        }
    }
    let requests = api.iter().map(|a| a.count).sum();
    Ok(ApiReport {
        benchmark: h.benchmark.clone(),
        run_id: h.run_id.clone(),
        started_unix_ms: h.unix_ms,
        concurrency: param(&h, "concurrency"),
        object_size: param(&h, "object_size"),
        watchers: param(&h, "watchers"),
        duration_seconds,
        requests,
        errors: api.iter().map(|a| a.errors).sum(),
        requests_per_second: per(requests),
        per_second: per_verb.into_iter().map(|(v, n)| (v, per(n))).collect(),
        api,
        writes,
        deliveries: delivered.len() as u64,
        delivery_ms: Percentiles::of_us(delivered),
        processes: processes(entries),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn e(t_us: u64, record: Record) -> Entry {
        Entry { t_us, record }
    }

    fn start(benchmark: &str, params: serde_json::Value) -> Entry {
        e(
            0,
            Record::Start {
                benchmark: benchmark.into(),
                run_id: "r1".into(),
                unix_ms: 42,
                params,
            },
        )
    }

    fn request(t_us: u64, verb: &str, us: u64, error: Option<&str>) -> Entry {
        e(
            t_us,
            Record::Request {
                verb: verb.into(),
                resource: "pods".into(),
                us,
                error: error.map(str::to_string),
            },
        )
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of_us((1..=100).map(|i| i * 1000).collect());
        assert_eq!(
            (p.count, p.p50, p.p90, p.p99, p.max),
            (100, 50.0, 90.0, 99.0, 100.0)
        );
        let one = Percentiles::of_us(vec![2500]);
        assert_eq!((one.p50, one.p99, one.max), (2.5, 2.5, 2.5));
        // Unsorted input; p50 of 4 values is the 2nd.
        let p = Percentiles::of_us(vec![4000, 1000, 3000, 2000]);
        assert_eq!((p.p50, p.p90, p.max), (2.0, 4.0, 4.0));
        assert_eq!(Percentiles::of_us(vec![]), Percentiles::default());
    }

    fn density_log() -> Vec<Entry> {
        let mut log = vec![
            start(
                "density",
                json!({"nodes": 2, "simulated_nodes": 2, "deployments": 1, "replicas": 2}),
            ),
            e(
                1_000_000,
                Record::Mark {
                    mark: Mark::CreatesStarted,
                },
            ),
            request(1_000_000, "create", 4_000, None),
            request(1_000_000, "create", 8_000, Some("503")),
            e(
                1_010_000,
                Record::Retry {
                    verb: "create".into(),
                    resource: "pods".into(),
                    reason: "503".into(),
                },
            ),
            e(
                1_100_000,
                Record::Mark {
                    mark: Mark::CreatesDone,
                },
            ),
        ];
        for (i, (c, s, r)) in [
            (1_200_000, 1_300_000, 1_700_000),
            (1_250_000, 1_500_000, 2_000_000),
        ]
        .into_iter()
        .enumerate()
        {
            let pod = format!("ns/p{i}");
            log.push(e(c, Record::PodCreated { pod: pod.clone() }));
            log.push(e(
                s,
                Record::PodScheduled {
                    pod: pod.clone(),
                    node: "n".into(),
                },
            ));
            log.push(e(r, Record::PodRunning { pod }));
        }
        // A repeated sighting must not move the first one.
        log.push(e(
            2_500_000,
            Record::PodRunning {
                pod: "ns/p0".into(),
            },
        ));
        log.push(e(
            2_100_000,
            Record::DeploymentAvailable {
                deployment: "ns/d".into(),
            },
        ));
        log.push(e(
            2_100_000,
            Record::Mark {
                mark: Mark::AllReady,
            },
        ));
        log.push(e(
            2_200_000,
            Record::Mark {
                mark: Mark::DeleteStarted,
            },
        ));
        log.push(e(
            3_700_000,
            Record::Mark {
                mark: Mark::Deleted,
            },
        ));
        for (t, hwm, cpu) in [
            (1_000_000, 100, 1000),
            (2_000_000, 3072, 1500),
            (3_000_000, 2048, 4000),
        ] {
            log.push(e(
                t,
                Record::Process {
                    pid: 7,
                    name: "setpoint up".into(),
                    hwm_kb: hwm,
                    cpu_ms: cpu,
                },
            ));
        }
        log.sort_by_key(|e| e.t_us);
        log
    }

    #[test]
    fn density_figures_come_from_the_log() {
        let r = density(&density_log()).unwrap();
        assert_eq!((r.pods, r.nodes, r.deployments, r.replicas), (2, 2, 1, 2));
        assert!((r.total_seconds - 1.1).abs() < 1e-9);
        assert!((r.pods_running_per_second - 2.0 / 1.1).abs() < 1e-9);
        assert_eq!(r.create_seconds, Some(0.1));
        assert_eq!(r.deletion_seconds, Some(1.5));
        assert_eq!(
            (r.pods_created, r.pods_scheduled, r.pods_running),
            (2, 2, 2)
        );
        assert_eq!(r.deployments_available, 1);
        assert!(!r.timed_out);
        let l = &r.latency_ms;
        // p0: 100 ms to schedule, 400 ms to run; p1: 250 ms, 500 ms.
        assert_eq!(
            (l.created_to_scheduled.p50, l.created_to_scheduled.max),
            (100.0, 250.0)
        );
        assert_eq!(
            (l.scheduled_to_running.p50, l.scheduled_to_running.max),
            (400.0, 500.0)
        );
        assert_eq!(
            (l.created_to_running.p50, l.created_to_running.max),
            (500.0, 750.0)
        );
        assert_eq!(l.deployment_available.max, 1100.0);
        assert_eq!((r.requests, r.errors, r.retries), (2, 1, 1));
        assert_eq!(r.api.len(), 1);
        assert_eq!(r.api[0].latency_ms.max, 8.0);
        assert_eq!(r.processes.len(), 1);
        assert_eq!(r.processes[0].peak_rss_mib, 3.0);
        assert_eq!(r.processes[0].cpu_seconds, 3.0);
        assert_eq!(r.running_over_time.first(), Some(&(0.0, 0)));
        assert_eq!(r.running_over_time.last(), Some(&(1.1, 2)));
        assert_eq!(r.running_over_time.len(), 101);
    }

    #[test]
    fn density_without_all_ready_is_timed_out_and_ends_at_the_last_sighting() {
        let mut log: Vec<Entry> = density_log()
            .into_iter()
            .filter(|x| {
                !matches!(
                    x.record,
                    Record::Mark {
                        mark: Mark::AllReady
                    } | Record::DeploymentAvailable { .. }
                )
            })
            .collect();
        log.push(e(
            2_050_000,
            Record::Mark {
                mark: Mark::TimedOut,
            },
        ));
        log.push(e(
            2_050_000,
            Record::Missing {
                what: "Deployments Available 0/1".into(),
            },
        ));
        let r = density(&log).unwrap();
        assert!(r.timed_out);
        assert_eq!(r.missing, vec!["Deployments Available 0/1".to_string()]);
        // The last first-sighting is p1 Running at 2.0 s (the repeat at 2.5 s does not count).
        assert!((r.total_seconds - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_log_of_another_benchmark_is_refused() {
        assert!(density(&[start("churn", json!({}))]).is_err());
        assert!(churn(&[]).is_err());
    }

    #[test]
    fn churn_windows_rate_and_backlog() {
        let mut log = vec![
            start("churn", json!({"rate": 2.0})),
            e(
                0,
                Record::Mark {
                    mark: Mark::CreatesStarted,
                },
            ),
        ];
        // 10 s of load: 18 requests ok (one still in flight at the end), 1 error, 1 skip.
        for i in 0..19u64 {
            let error = (i == 3).then_some("500");
            let us = if i == 18 { 2_000_000 } else { 10_000 };
            log.push(request(i * 500_000 + 1, "create", us, error));
        }
        log.push(e(
            9_600_000,
            Record::Skipped {
                op: "create pod".into(),
            },
        ));
        log.push(e(
            10_000_000,
            Record::Mark {
                mark: Mark::LoadDone,
            },
        ));
        log.push(request(10_500_000, "delete", 1, None));
        log.sort_by_key(|e| e.t_us);
        let r = churn(&log).unwrap();
        assert_eq!(
            (r.sent, r.succeeded, r.errors, r.skipped, r.due),
            (19, 18, 1, 1, 20)
        );
        assert!((r.achieved_rate - 1.8).abs() < 1e-9);
        assert_eq!(r.backlog, 2);
        assert!(!r.kept_up);
        // No nodes in the parameters: settling is not judged.
        assert_eq!((r.settled, r.settle_seconds), (None, None));
        let mut with_nodes = log.clone();
        with_nodes[0] = start("churn", json!({"rate": 2.0, "simulated_nodes": 2}));
        let r = churn(&with_nodes).unwrap();
        assert_eq!((r.settled, r.settle_seconds), (Some(false), None));
        with_nodes.push(e(
            12_500_000,
            Record::Mark {
                mark: Mark::Settled,
            },
        ));
        let r = churn(&with_nodes).unwrap();
        assert_eq!((r.settled, r.settle_seconds), (Some(true), Some(2.5)));
        assert_eq!(r.windows.len(), 2);
        assert_eq!((r.windows[0].sent, r.windows[0].errors), (10, 1));
        assert_eq!((r.windows[1].sent, r.windows[1].skipped), (9, 1));
        assert_eq!(r.windows[1].latency_ms.max, 2000.0);
        // The delete after the load is not part of it.
        assert!(r.api.iter().all(|a| a.verb != "delete"));
    }

    #[test]
    fn api_throughput_and_delivery() {
        let mut log = vec![
            start(
                "api",
                json!({"concurrency": 2, "watchers": 2, "object_size": 10}),
            ),
            e(
                0,
                Record::Mark {
                    mark: Mark::CreatesStarted,
                },
            ),
            request(1, "create", 100, None),
            request(2, "get", 100, None),
            request(3, "patch", 100, None),
            request(4, "update", 100, Some("409")),
            e(
                10,
                Record::Delivery {
                    watcher: 0,
                    us: 3000,
                },
            ),
            e(
                11,
                Record::Delivery {
                    watcher: 1,
                    us: 1000,
                },
            ),
            e(
                2_000_000,
                Record::Mark {
                    mark: Mark::LoadDone,
                },
            ),
        ];
        log.sort_by_key(|e| e.t_us);
        let r = api(&log).unwrap();
        assert_eq!((r.requests, r.errors, r.writes, r.deliveries), (4, 1, 2, 2));
        assert_eq!(r.requests_per_second, 2.0);
        assert_eq!(r.per_second["get"], 0.5);
        assert_eq!((r.delivery_ms.p50, r.delivery_ms.max), (1.0, 3.0));
        assert_eq!((r.concurrency, r.watchers, r.object_size), (2, 2, 10));
    }
}
