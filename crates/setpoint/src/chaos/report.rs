//! What a run reports: per fault its type, target, time and time-to-converge; every
//! violation with the seed that reproduces it; over several schedules, time-to-converge
//! p50/p99 per fault type.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::invariants::Violation;
use super::schedule::{Change, Fault};

/// One fault as it happened.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultResult {
    pub fault: Fault,
    /// The process it hit (`controller-manager-1`).
    pub process: String,
    /// The workload change made just before.
    pub change: Change,
    /// When it was injected and when the target was back (restarted or thawed), in
    /// milliseconds since the run started.
    pub injected_at_ms: u64,
    pub recovered_at_ms: u64,
    /// From recovery until every object had converged; `None`: not within the deadline.
    pub time_to_converge_ms: Option<u64>,
    /// Each workload object seen out of convergence after the fault
    /// (`deployments/<ns>/<name>`, `statefulsets/…`, `jobs/…`) and when it was converged again,
    /// in milliseconds from recovery (empty when the cluster did not converge).
    pub objects_converged_ms: std::collections::BTreeMap<String, u64>,
}

/// One run of one schedule.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    pub seed: u64,
    pub duration_seconds: u64,
    pub faults: Vec<FaultResult>,
    /// From the end of the last fault until the whole workload had converged.
    pub final_time_to_converge_ms: Option<u64>,
    pub violations: Vec<Violation>,
    /// Watch events recorded (all watchers).
    pub events_recorded: usize,
    /// The run's own Events (each fault, and each return to convergence) the API server
    /// accepted, and those it did not (each logged with the reason).
    pub events_written: usize,
    pub events_not_written: usize,
    /// Why the schedule drew no partitions (the machine could not make network namespaces);
    /// `None`: they were drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions_not_drawn: Option<String>,
}

impl RunReport {
    /// Whether the run passed: everything converged and no invariant broke.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
            && self.final_time_to_converge_ms.is_some()
            && self.faults.iter().all(|f| f.time_to_converge_ms.is_some())
    }
}

fn ms(v: Option<u64>) -> String {
    v.map(|m| format!("{:.2}s", m as f64 / 1000.0))
        .unwrap_or_else(|| "not converged".into())
}

fn change_text(c: &Change) -> String {
    match c {
        Change::ScaleDeployment { name, replicas } => {
            format!("scale deployment/{name} to {replicas}")
        }
        Change::DeploymentImage { name, image } => format!("deployment/{name} image {image}"),
        Change::ScaleStatefulSet { name, replicas } => {
            format!("scale statefulset/{name} to {replicas}")
        }
        Change::StatefulSetImage { name, image } => format!("statefulset/{name} image {image}"),
        Change::CreateJob {
            name,
            completions,
            parallelism,
        } => format!("create job/{name} ({completions} completions, {parallelism} at a time)"),
    }
}

/// The run as a table.
pub fn table(r: &RunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "seed {} · {} s · {} watch events recorded · {} Events written, {} not",
        r.seed, r.duration_seconds, r.events_recorded, r.events_written, r.events_not_written
    );
    if let Some(why) = &r.partitions_not_drawn {
        let _ = writeln!(out, "partitions not drawn: {why}");
    }
    let _ = writeln!(
        out,
        "{:>8}  {:<9}  {:<28}  {:<22}  {:>14}  CHANGE BEFORE IT",
        "AT", "FAULT", "TARGET", "PROCESS", "CONVERGED IN"
    );
    for f in &r.faults {
        let _ = writeln!(
            out,
            "{:>7.1}s  {:<9}  {:<28}  {:<22}  {:>14}  {}",
            f.injected_at_ms as f64 / 1000.0,
            f.fault.kind.name(),
            f.fault.target.name(),
            f.process,
            ms(f.time_to_converge_ms),
            change_text(&f.change)
        );
    }
    let _ = writeln!(
        out,
        "after the last fault: converged in {}",
        ms(r.final_time_to_converge_ms)
    );
    if r.violations.is_empty() {
        let _ = writeln!(out, "invariants: no violation");
    } else {
        let _ = writeln!(
            out,
            "invariants: {} violation(s) (reproduce with --seed {}):",
            r.violations.len(),
            r.seed
        );
        for v in &r.violations {
            let _ = writeln!(
                out,
                "  {:.1}s  {}  {}: {}",
                v.at_ms as f64 / 1000.0,
                v.invariant,
                v.object,
                v.evidence
            );
        }
    }
    out
}

/// The `q`-quantile (0–1) of sorted `values`, nearest rank.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Time-to-converge figures of one fault type over several runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultFigures {
    pub fault: String,
    pub count: usize,
    pub not_converged: usize,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    pub max_ms: Option<u64>,
}

/// Per fault type over `runs`: how many, how many never converged, p50/p99/max.
pub fn figures(runs: &[RunReport]) -> Vec<FaultFigures> {
    let mut by: BTreeMap<String, (Vec<u64>, usize)> = BTreeMap::new();
    for f in runs.iter().flat_map(|r| &r.faults) {
        let e = by.entry(f.fault.label()).or_default();
        match f.time_to_converge_ms {
            Some(t) => e.0.push(t),
            None => e.1 += 1,
        }
    }
    by.into_iter()
        .map(|(fault, (mut t, not_converged))| {
            t.sort_unstable();
            FaultFigures {
                fault,
                count: t.len() + not_converged,
                not_converged,
                p50_ms: quantile(&t, 0.5),
                p99_ms: quantile(&t, 0.99),
                max_ms: t.last().copied(),
            }
        })
        .collect()
}

/// Several runs as a table of figures and the seeds that failed.
pub fn summary_table(runs: &[RunReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{} schedules", runs.len());
    let _ = writeln!(
        out,
        "{:<36}  {:>5}  {:>9}  {:>9}  {:>9}  NOT CONVERGED",
        "FAULT", "N", "P50", "P99", "MAX"
    );
    for f in figures(runs) {
        let _ = writeln!(
            out,
            "{:<36}  {:>5}  {:>9}  {:>9}  {:>9}  {}",
            f.fault,
            f.count,
            ms(f.p50_ms),
            ms(f.p99_ms),
            ms(f.max_ms),
            f.not_converged
        );
    }
    let violations: usize = runs.iter().map(|r| r.violations.len()).sum();
    let _ = writeln!(out, "invariant violations: {violations}");
    for r in runs.iter().filter(|r| !r.passed()) {
        let _ = writeln!(
            out,
            "  seed {} failed ({} violation(s){}): reproduce with --seed {} --duration {}",
            r.seed,
            r.violations.len(),
            if r.final_time_to_converge_ms.is_none() {
                ", did not converge"
            } else {
                ""
            },
            r.seed,
            r.duration_seconds
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::schedule::{FaultKind, Target};

    fn run(seed: u64, times: &[Option<u64>]) -> RunReport {
        RunReport {
            seed,
            duration_seconds: 60,
            faults: times
                .iter()
                .map(|t| FaultResult {
                    fault: Fault {
                        kind: FaultKind::Kill,
                        target: Target::Agent,
                    },
                    process: "agent-0".into(),
                    change: Change::ScaleDeployment {
                        name: "web-0".into(),
                        replicas: 2,
                    },
                    injected_at_ms: 1000,
                    recovered_at_ms: 1500,
                    time_to_converge_ms: *t,
                    objects_converged_ms: Default::default(),
                })
                .collect(),
            final_time_to_converge_ms: Some(10),
            violations: Vec::new(),
            events_recorded: 0,
            events_written: 0,
            events_not_written: 0,
            partitions_not_drawn: None,
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn figures_group_by_fault_and_count_what_never_converged() {
        let runs = [run(1, &[Some(300), Some(100)]), run(2, &[None, Some(200)])];
        let f = figures(&runs);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].fault, "sigkill agent");
        assert_eq!((f[0].count, f[0].not_converged), (4, 1));
        assert_eq!((f[0].p50_ms, f[0].p99_ms), (Some(200), Some(300)));
        assert!(!runs[1].passed() && runs[0].passed());
        let t = summary_table(&runs);
        assert!(
            t.contains("seed 2 failed") && t.contains("--seed 2 --duration 60"),
            "{t}"
        );
        assert!(table(&runs[1]).contains("not converged"));
    }
}
