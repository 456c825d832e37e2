//! `setpoint chaos`: starts a cluster of separate `setpoint` processes, keeps a workload
//! changing on it, injects faults from a seeded schedule, and reports per fault the time the
//! cluster took to converge again, and every invariant a watch-based checker saw broken.
//!
//! `cluster` starts and signals the processes (`netns` gives some a network namespace of
//! their own, for partitions; `leftovers` removes what runs killed before left),
//! `workload` drives the objects, `schedule` is the seeded plan, `faults` injects,
//! `converge` measures, `recorder` watches, `invariants` checks what was recorded, `report`
//! prints, `events` writes each fault and the return to convergence as Events (which the
//! live view's timeline shows).

pub mod cluster;
pub mod converge;
pub mod etcd;
pub mod events;
pub mod faults;
pub mod invariants;
pub mod leftovers;
pub mod netns;
pub mod recorder;
pub mod report;
pub mod schedule;
pub mod workload;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use cluster::{Cluster, ClusterConfig, StoreKind};
use invariants::{Facts, Remaining};
use report::{FaultResult, RunReport};
use workload::{Workload, NAMESPACE};

/// How long the cluster may take to converge after a fault (or at the start) before the run
/// counts it as not converged.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(60);

/// How long the workload may take to converge at the start, before any fault: time for
/// `--background-pods` to start.
const START_DEADLINE: Duration = Duration::from_secs(300);

/// `setpoint chaos`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct ChaosArgs {
    /// The schedule's seed (default: chosen from the clock, and printed): the same seed and
    /// duration replay the same faults and changes.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds of faults: one fault per 8 s or so, each after a change of the workload.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Run this many schedules (seeds `seed`, `seed+1`, …), each on a fresh cluster, and
    /// report time-to-converge p50/p99 per fault type.
    #[arg(long, default_value_t = 1)]
    schedules: usize,
    /// Simulated nodes the agent hosts (110 pods each).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Also keep a Deployment of this many pods that the schedule never changes, so the
    /// faults hit a cluster of that size (give it `--nodes` enough for them).
    #[arg(long, default_value_t = 0)]
    background_pods: u32,
    /// What the API servers store in: `embedded` (one API server on its embedded store) or
    /// `etcd` (a three-member etcd cluster, from the `etcd` binary, and three API servers on
    /// it; etcd member kills join the faults).
    #[arg(long, value_enum, default_value_t = StoreKind::Embedded)]
    store: StoreKind,
    /// Draw only faults of these types, as the report names them (`--only "sigkill etcd
    /// member"`; repeat the flag for more); default: every type the cluster allows.
    #[arg(long)]
    only: Vec<String>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Where the clusters' data dirs and logs go (default: a new directory under the system's
    /// temporary directory). A run that fails keeps its directory for its logs.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Test only: once the workload has converged, create a pod beyond a ReplicaSet's
    /// replicas under its controller reference, as a misbehaving controller would, to show
    /// the checker reports it.
    #[arg(long, hide = true)]
    rogue_extra_pod: bool,
}

/// Runs the schedules and prints the report; an error when an invariant broke or the cluster
/// did not converge. Interrupted (SIGINT, SIGTERM), it stops the cluster's processes first.
pub async fn run(args: ChaosArgs) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Dropping the run drops its cluster, which kills every process it started.
    tokio::select! {
        r = run_schedules(args) => r,
        _ = tokio::signal::ctrl_c() => bail!("interrupted: the cluster's processes are stopped"),
        _ = term.recv() => bail!("terminated: the cluster's processes are stopped"),
    }
}

async fn run_schedules(args: ChaosArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000)
            .unwrap_or(0)
    });
    let base = match &args.data_dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!("setpoint-chaos-{}", std::process::id())),
    };
    let exe = std::env::current_exe().context("finding the setpoint binary")?;
    let mut runs = Vec::new();
    for i in 0..args.schedules.max(1) {
        let seed = seed.wrapping_add(i as u64);
        let dir = base.join(format!("seed-{seed}"));
        if dir.exists() {
            bail!("{} exists: choose another --data-dir", dir.display());
        }
        std::fs::create_dir_all(&dir)?;
        let dir = dir.canonicalize()?;
        eprintln!(
            "chaos: seed {seed}, {} s of faults, cluster in {}",
            args.duration,
            dir.display()
        );
        let config = ClusterConfig {
            exe: exe.clone(),
            dir: dir.clone(),
            nodes: args.nodes.max(1),
            store: args.store,
        };
        let report = run_one(
            &config,
            seed,
            Duration::from_secs(args.duration),
            args.background_pods.into(),
            args.rogue_extra_pod,
            &args.only,
        )
        .await?;
        if !args.json {
            print!("{}", report::table(&report));
        }
        if report.passed() {
            let _ = std::fs::remove_dir_all(&dir);
        } else {
            eprintln!(
                "chaos: seed {seed} failed; its processes' logs are in {}",
                dir.join("logs").display()
            );
        }
        runs.push(report);
    }
    if args.json {
        let out = json!({"runs": runs, "figures": report::figures(&runs)});
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if runs.len() > 1 {
        print!("{}", report::summary_table(&runs));
    }
    let failed: Vec<u64> = runs
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.seed)
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} schedules failed (seeds {failed:?}): an invariant broke or the cluster did not converge",
            failed.len(),
            runs.len()
        );
    }
    if args.data_dir.is_none() {
        let _ = std::fs::remove_dir(&base);
    }
    Ok(())
}

/// One schedule on a fresh cluster.
async fn run_one(
    config: &ClusterConfig,
    seed: u64,
    duration: Duration,
    background_pods: i64,
    rogue_extra_pod: bool,
    only: &[String],
) -> anyhow::Result<RunReport> {
    let started = Instant::now();
    let ms = |t: Instant| t.duration_since(started).as_millis() as u64;
    let mut cluster = Cluster::start(config).await?;
    let client = cluster.client.clone();
    let recorder = recorder::Recorder::start(&client, started);
    let mut workload = Workload::new(client.clone(), started);
    workload.create(background_pods).await?;
    if let Err(why) =
        converge::wait(&client, &workload.desired, Instant::now(), START_DEADLINE).await
    {
        bail!(
            "the workload did not converge before any fault ({why}); logs in {}",
            cluster.logs.display()
        );
    }
    if rogue_extra_pod {
        let pod = workload.create_rogue_pod().await?;
        eprintln!("chaos: created the extra pod {pod} (--rogue-extra-pod)");
    }
    let mut faults = Vec::new();
    // The run's own Events: [written, not written].
    let mut written = [0usize; 2];
    let mut count = |ok: bool| written[usize::from(!ok)] += 1;
    let t0 = Instant::now();
    if let Some(why) = &cluster.no_partitions {
        eprintln!("chaos: partitions are not drawn: {why}");
    }
    let can_partition = cluster.can_partition();
    let on_etcd = cluster.on_etcd();
    let drawn = |f: &schedule::Fault| {
        (can_partition || !f.needs_netns())
            && (on_etcd || !f.needs_etcd())
            && (only.is_empty() || only.contains(&f.label()))
    };
    if !schedule::FAULTS.iter().any(drawn) {
        bail!(
            "no fault type of --only {only:?} can be drawn on this cluster (types: {})",
            schedule::FAULTS.map(|f| f.label()).join(", ")
        );
    }
    for (fault_number, step) in schedule::schedule(seed, duration, drawn)
        .into_iter()
        .enumerate()
    {
        tokio::time::sleep_until((t0 + step.at).into()).await;
        workload.apply(&step.change).await?;
        let injected = faults::inject(&mut cluster, step.fault).await?;
        let label = step.fault.label();
        // Which fault of which schedule its Events are about (their annotations).
        let fault_ref = events::FaultRef {
            label: &label,
            index: fault_number + 1,
            seed,
        };
        count(
            events::record(
                &client,
                events::Happened::Injecting {
                    fault: fault_ref,
                    process: &injected.process,
                },
                injected.injected.elapsed(),
            )
            .await,
        );
        let converged = converge::wait(
            &client,
            &workload.desired,
            injected.recovered,
            CONVERGE_DEADLINE,
        )
        .await;
        let happened = match &converged {
            Ok(c) => events::Happened::Converged {
                fault: fault_ref,
                after: c.after,
            },
            Err(why) => events::Happened::NotConverged {
                fault: fault_ref,
                why: why.as_str(),
            },
        };
        count(events::record(&client, happened, Duration::ZERO).await);
        if let Ok(c) = &converged {
            // Each object the fault put out of convergence, at the time it returned.
            for (object, after) in &c.returned {
                let happened = events::Happened::ObjectConverged {
                    fault: fault_ref,
                    object,
                    after: *after,
                };
                count(events::record(&client, happened, c.after.saturating_sub(*after)).await);
            }
        }
        let objects_converged_ms = converged
            .as_ref()
            .map(|c| {
                c.returned
                    .iter()
                    .map(|(o, d)| (o.clone(), d.as_millis() as u64))
                    .collect()
            })
            .unwrap_or_default();
        let converged = converged.map(|c| c.after);
        let result = FaultResult {
            fault: step.fault,
            process: injected.process,
            change: step.change,
            injected_at_ms: ms(injected.injected),
            recovered_at_ms: ms(injected.recovered),
            time_to_converge_ms: converged.as_ref().ok().map(|d| d.as_millis() as u64),
            objects_converged_ms,
        };
        match &converged {
            Ok(d) => eprintln!(
                "chaos: {} on {}: converged {:.2}s after recovery",
                step.fault.label(),
                result.process,
                d.as_secs_f64()
            ),
            Err(why) => eprintln!(
                "chaos: {} on {}: not converged within {CONVERGE_DEADLINE:?}: {why}",
                step.fault.label(),
                result.process
            ),
        }
        faults.push(result);
    }
    let end = Instant::now();
    let final_converged = converge::wait(&client, &workload.desired, end, CONVERGE_DEADLINE)
        .await
        .ok()
        .map(|c| c.after);
    let (remaining, finals) = final_state(&cluster).await?;
    let events = recorder.stop();
    let at = ms(Instant::now());
    let mut violations = invariants::check_events(&events);
    violations.extend(invariants::orphans(at, &remaining));
    violations.extend(invariants::lost_writes(at, &workload.acked, &finals));
    violations.sort_by_key(|v| v.at_ms);
    cluster.stop();
    Ok(RunReport {
        seed,
        duration_seconds: duration.as_secs(),
        faults,
        final_time_to_converge_ms: final_converged.map(|d| d.as_millis() as u64),
        violations,
        events_recorded: events.len(),
        events_written: written[0],
        events_not_written: written[1],
        partitions_not_drawn: cluster.no_partitions.clone(),
    })
}

/// The workload's objects at the end: each with its facts, and the Deployments and
/// StatefulSets whole (`deployments/chaos/web-0` → object) for the lost-write check.
async fn final_state(
    cluster: &Cluster,
) -> anyhow::Result<(Vec<Remaining>, HashMap<String, Value>)> {
    let mut remaining = Vec::new();
    let mut finals = HashMap::new();
    for (resource, path) in recorder::watched() {
        if resource == "leases" {
            continue;
        }
        let list = cluster
            .client
            .request(http::Method::GET, &path, None, bytes::Bytes::new())
            .await
            .with_context(|| format!("listing {resource} at the end"))?;
        for item in list["items"].as_array().into_iter().flatten() {
            let facts = Facts::of(resource, item);
            finals.insert(
                format!("{resource}/{NAMESPACE}/{}", facts.name),
                item.clone(),
            );
            remaining.push(Remaining {
                resource: resource.to_string(),
                facts,
            });
        }
    }
    Ok((remaining, finals))
}
