//! `setpoint bench`: load a Kubernetes-compatible cluster through its public API and report
//! figures (`density`, `churn`, `api`, `endpointslices`), and put two reports side by side (`compare`). The
//! logic lives in `setpoint-bench`; this wires flags and files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use setpoint_bench::{api, churn, compare, density, svg, table};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// D Deployments × R replicas onto N simulated nodes hosted here: time to all Running,
    /// per-pod phase latencies, API latency, deletion time, CPU and memory.
    Density(DensityArgs),
    /// Two JSON reports side by side, with b/a for every figure.
    Compare {
        /// The baseline report.
        a: PathBuf,
        /// The report to compare with it.
        b: PathBuf,
    },
    /// Creates, patches and deletes of pods and Deployments at a fixed rate: latency per 5 s
    /// window and whether the cluster kept up.
    Churn(ChurnArgs),
    /// Raw API throughput and latency on ConfigMaps, and watch fan-out delivery latency.
    Api(ApiArgs),
    /// A Service of R pods on N simulated nodes hosted here: how long from a pod Ready to its
    /// address ready in the Service's EndpointSlices, and from a pod deleted to its address
    /// gone.
    Endpointslices(EndpointSlicesArgs),
}

#[derive(clap::Args, Clone)]
pub struct EndpointSlicesArgs {
    /// Kubeconfig of the cluster (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Give up waiting (for nodes, each phase) after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// Simulated nodes to host in this process.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Pods behind the Service.
    #[arg(long, default_value_t = 1000)]
    replicas: i32,
}

/// Flags every load benchmark shares.
#[derive(clap::Args, Clone)]
pub struct Common {
    /// Kubeconfig of the cluster (default: `$KUBECONFIG`, then `~/.kube/config`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write every observation here, one JSON line each (the report is computed from it).
    #[arg(long)]
    raw_log: Option<PathBuf>,
    /// Give up waiting (for nodes, readiness, deletion) after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
    /// No progress line on stderr.
    #[arg(long)]
    quiet: bool,
}

/// `bench density --kind`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Kind {
    /// Deployments.
    Deployment,
    /// StatefulSets.
    Statefulset,
    /// DaemonSets.
    Daemonset,
}

#[derive(clap::Args, Clone)]
pub struct DensityArgs {
    #[command(flatten)]
    common: Common,
    /// Simulated nodes to host in this process (0: use the cluster's nodes).
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Host no nodes: wait for `--nodes` Ready simulated nodes the cluster already has (from
    /// `setpoint up --simulate N` or `setpoint agent --simulate N`) and use them.
    #[arg(long)]
    reuse_nodes: bool,
    /// Which workloads to create: Deployments, StatefulSets (of `--replicas` pods each,
    /// `podManagementPolicy: Parallel`) or DaemonSets (one pod per node; `--replicas` unused).
    #[arg(long, value_enum, default_value = "deployment")]
    kind: Kind,
    /// Workloads to create (Deployments unless `--kind` says otherwise).
    #[arg(long, default_value_t = 10)]
    deployments: usize,
    #[arg(long, default_value_t = 10)]
    replicas: i32,
    /// One namespace per Deployment instead of one for the run.
    #[arg(long)]
    namespace_per_deployment: bool,
    /// Deployment creates in flight at once.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Deployment creates started per second (`50` or `50/s`); default: as fast as the
    /// cluster answers, `--create-concurrency` at a time.
    #[arg(long, value_parser = parse_rate)]
    create_rate: Option<f64>,
    /// Write an SVG chart (pods Running over time, latency percentiles) here.
    #[arg(long)]
    svg: Option<PathBuf>,
    #[arg(long, default_value = "nginx:1.25")]
    image: String,
    /// Leave the namespaces, Deployments and pods in place.
    #[arg(long)]
    keep: bool,
    /// Pods each simulated node takes.
    #[arg(long, default_value_t = 110)]
    node_pods: u32,
    /// Simulated containers start this many milliseconds after their pod arrives.
    #[arg(long, default_value_t = 0)]
    start_delay_ms: u64,
    /// … and turn ready this many milliseconds after starting.
    #[arg(long, default_value_t = 0)]
    ready_delay_ms: u64,
}

#[derive(clap::Args, Clone)]
pub struct ChurnArgs {
    #[command(flatten)]
    common: Common,
    /// Operations per second (`100` or `100/s`).
    #[arg(long, value_parser = parse_rate)]
    rate: f64,
    /// Seconds of load (`60` or `60s`).
    #[arg(long, value_parser = parse_seconds)]
    duration: Duration,
    /// Simulated nodes to host here, so churned pods get scheduled and run.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    /// Operations outstanding at most; operations due beyond it are skipped (backlog).
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
}

#[derive(clap::Args, Clone)]
pub struct ApiArgs {
    #[command(flatten)]
    common: Common,
    /// Workers, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds of load (`30` or `30s`).
    #[arg(long, value_parser = parse_seconds, default_value = "30")]
    duration: Duration,
    /// Payload bytes per ConfigMap.
    #[arg(long, default_value_t = 1024)]
    object_size: usize,
    /// Watchers on the written objects.
    #[arg(long, default_value_t = 4)]
    watchers: usize,
    /// Run in this existing namespace, neither creating nor deleting it (the run's
    /// ConfigMaps are deleted): a user allowed only ConfigMaps in one namespace can run it.
    /// Default: a namespace of the run's own, created and deleted.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let n = s.strip_suffix("/s").unwrap_or(s);
    match n.parse::<f64>() {
        Ok(r) if r > 0.0 && r.is_finite() => Ok(r),
        _ => Err(format!("`{s}` is not a positive rate like 100/s")),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let n = s.strip_suffix('s').unwrap_or(s);
    match n.parse::<f64>() {
        Ok(d) if d > 0.0 && d.is_finite() => Ok(Duration::from_secs_f64(d)),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

/// A client for the cluster, and which local processes serve it.
fn client(
    path: Option<&Path>,
) -> anyhow::Result<(
    setpoint_runtime::client::Client,
    setpoint_bench::procstat::Scope,
)> {
    let (client, kubeconfig) = crate::leadership::connect(path, "setpoint-bench")?;
    // The file `connect` read: the flag, else the first `$KUBECONFIG` entry, else ~/.kube/config.
    let file = path
        .map(Path::to_path_buf)
        .or_else(|| match std::env::var_os("KUBECONFIG") {
            Some(p) if !p.is_empty() => std::env::split_paths(&p).next(),
            _ => std::env::var_os("HOME").map(|h| Path::new(&h).join(".kube").join("config")),
        });
    let scope = setpoint_bench::procstat::Scope::for_cluster(&kubeconfig.server, file.as_deref());
    // A benchmark measures the server, not a client-side limiter.
    Ok((client.without_rate_limit(), scope))
}

fn write_json(path: &Option<PathBuf>, report: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(p) = path {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// `setpoint bench …`.
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Density(a) => {
            let c = a.common;
            let (client, processes) = client(c.kubeconfig.as_deref())?;
            let outcome = density::run(
                client,
                density::DensityConfig {
                    kind: match a.kind {
                        Kind::Deployment => density::WorkloadKind::Deployment,
                        Kind::Statefulset => density::WorkloadKind::StatefulSet,
                        Kind::Daemonset => density::WorkloadKind::DaemonSet,
                    },
                    nodes: a.nodes,
                    reuse_nodes: a.reuse_nodes,
                    deployments: a.deployments,
                    replicas: a.replicas,
                    namespace_per_deployment: a.namespace_per_deployment,
                    create_concurrency: a.create_concurrency.max(1),
                    create_rate: a.create_rate,
                    image: a.image,
                    keep: a.keep,
                    timeout: Duration::from_secs(c.timeout_seconds.max(1)),
                    node_pods: a.node_pods,
                    start_delay: Duration::from_millis(a.start_delay_ms),
                    ready_delay: Duration::from_millis(a.ready_delay_ms),
                    progress: !c.quiet,
                    raw_log: c.raw_log,
                    processes,
                },
            )
            .await?;
            let r = outcome.report;
            print!("{}", table::density(&r));
            write_json(&c.json, &r)?;
            if let Some(p) = &a.svg {
                std::fs::write(p, svg::density(&r))
                    .with_context(|| format!("writing {}", p.display()))?;
            }
            if r.timed_out {
                anyhow::bail!("timed out: {}", r.missing.join("; "));
            }
        }
        BenchCommand::Endpointslices(a) => {
            let (client, _) = client(a.kubeconfig.as_deref())?;
            let r = setpoint_bench::endpointslices::run(
                client,
                setpoint_bench::endpointslices::EndpointSlicesConfig {
                    nodes: a.nodes.max(1),
                    replicas: a.replicas.max(1),
                    timeout: Duration::from_secs(a.timeout_seconds.max(1)),
                },
            )
            .await?;
            print!("{}", setpoint_bench::endpointslices::table(&r));
            write_json(&a.json, &r)?;
        }
        BenchCommand::Churn(a) => {
            let c = a.common;
            let (client, processes) = client(c.kubeconfig.as_deref())?;
            let outcome = churn::run(
                client,
                churn::ChurnConfig {
                    rate: a.rate,
                    duration: a.duration,
                    nodes: a.nodes,
                    max_in_flight: a.max_in_flight.max(1),
                    timeout: Duration::from_secs(c.timeout_seconds.max(1)),
                    progress: !c.quiet,
                    raw_log: c.raw_log,
                    processes,
                    ..Default::default()
                },
            )
            .await?;
            print!("{}", table::churn(&outcome.report));
            write_json(&c.json, &outcome.report)?;
        }
        BenchCommand::Api(a) => {
            let c = a.common;
            let (client, processes) = client(c.kubeconfig.as_deref())?;
            let outcome = api::run(
                client,
                api::ApiConfig {
                    concurrency: a.concurrency.max(1),
                    duration: a.duration,
                    object_size: a.object_size,
                    watchers: a.watchers,
                    timeout: Duration::from_secs(c.timeout_seconds.max(1)),
                    progress: !c.quiet,
                    raw_log: c.raw_log,
                    processes,
                    namespace: a.namespace,
                },
            )
            .await?;
            print!("{}", table::api(&outcome.report));
            write_json(&c.json, &outcome.report)?;
        }
        BenchCommand::Compare { a, b } => {
            let (ja, jb) = (read_json(&a)?, read_json(&b)?);
            compare::same_benchmark(&ja, &jb).map_err(anyhow::Error::msg)?;
            let rows = compare::rows(&ja, &jb);
            print!(
                "{}",
                compare::render(&rows, &a.display().to_string(), &b.display().to_string())
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations_parse_with_or_without_units() {
        assert_eq!(parse_rate("100/s"), Ok(100.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_seconds("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_seconds("-1").is_err());
    }
}
