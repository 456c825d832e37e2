//! The fault schedule: a pure function of the seed and the run's duration, so that a seed
//! replays the same run (the same workload changes, the same faults on the same targets at
//! the same offsets).

use std::time::Duration;

use serde::Serialize;

/// The Deployments the workload keeps (`web-0`, `web-1`, …).
pub const DEPLOYMENTS: usize = 2;
/// The StatefulSets the workload keeps (`db-0`, …).
pub const STATEFULSETS: usize = 1;
/// The images changes choose from (never pulled: the pods run on simulated nodes).
pub const IMAGES: [&str; 3] = ["nginx:1.25", "nginx:1.26", "nginx:1.27"];

/// A change of the workload, made just before a fault so that the fault meets work in
/// progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "camelCase")]
pub enum Change {
    /// A new Job of simulated pods that each run a moment and succeed.
    CreateJob {
        name: String,
        completions: i64,
        parallelism: i64,
    },
    /// `spec.replicas` of a Deployment.
    ScaleDeployment { name: String, replicas: i64 },
    /// The container image of a Deployment (a rollout).
    DeploymentImage { name: String, image: String },
    /// `spec.replicas` of a StatefulSet.
    ScaleStatefulSet { name: String, replicas: i64 },
    /// The container image of a StatefulSet (a rolling update, highest ordinal first).
    StatefulSetImage { name: String, image: String },
}

/// A component a fault can hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The API server (the one on the embedded store; on etcd, each of the three in turn).
    ApiServer,
    /// The controller manager holding the `kube-controller-manager` Lease.
    LeadingControllerManager,
    /// The scheduler holding the `kube-scheduler` Lease.
    LeadingScheduler,
    /// The agent hosting the simulated nodes.
    Agent,
    /// A member of the etcd cluster (each of the three in turn), on `--store etcd`.
    EtcdMember,
}

impl Target {
    /// The name a report shows.
    pub fn name(self) -> &'static str {
        match self {
            Target::ApiServer => "api-server",
            Target::LeadingControllerManager => "leading controller-manager",
            Target::LeadingScheduler => "leading scheduler",
            Target::Agent => "agent",
            Target::EtcdMember => "etcd member",
        }
    }
}

/// What happens to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL, then a new process in its place (same data dir, same address).
    Kill,
    /// SIGSTOP for longer than the lease duration, then SIGCONT: a leader frozen while a
    /// standby takes its Lease over, which then wakes up believing it still leads.
    Freeze,
    /// Every packet between the target and the API server dropped (in the target's network
    /// namespace) for longer than the lease duration, then let through again: the process runs
    /// on, cut off, with its connections open.
    Partition,
    /// Every open watch of the API server cut off at once through its fault-injection switch,
    /// as a restart would, while the server runs on: watchers resume from where they were.
    WatchDrop,
    /// Every open watch of the API server cut off, and every watch that names a
    /// resourceVersion answered 410 Expired for a while: watchers relist.
    ExpireWatches,
    /// Latency added to every request of the API server for a while.
    Latency,
}

impl FaultKind {
    /// The name a report shows.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "sigkill",
            FaultKind::Freeze => "sigstop",
            FaultKind::Partition => "partition",
            FaultKind::WatchDrop => "watch-drop",
            FaultKind::ExpireWatches => "expire-watches",
            FaultKind::Latency => "latency",
        }
    }
}

/// One fault on one target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub target: Target,
}

impl Fault {
    /// `kind/target`, the type the figures are grouped by.
    pub fn label(&self) -> String {
        format!("{} {}", self.kind.name(), self.target.name())
    }
}

/// A step of the run: at `at` after the start, make `change`, then inject `fault`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Step {
    #[serde(rename = "atMillis", serialize_with = "millis")]
    pub at: Duration,
    pub change: Change,
    pub fault: Fault,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis() as u64)
}

/// Every fault the harness can inject (freezing the API server is left out: to its clients it
/// is a slower restart). Partitions and etcd member kills come last, so a run where they
/// cannot be drawn (see [`schedule`]) has the schedule a run without them always had.
pub const FAULTS: [Fault; 13] = [
    Fault {
        kind: FaultKind::Kill,
        target: Target::ApiServer,
    },
    Fault {
        kind: FaultKind::Kill,
        target: Target::LeadingControllerManager,
    },
    Fault {
        kind: FaultKind::Freeze,
        target: Target::LeadingControllerManager,
    },
    Fault {
        kind: FaultKind::Kill,
        target: Target::LeadingScheduler,
    },
    Fault {
        kind: FaultKind::Freeze,
        target: Target::LeadingScheduler,
    },
    Fault {
        kind: FaultKind::Kill,
        target: Target::Agent,
    },
    Fault {
        kind: FaultKind::Freeze,
        target: Target::Agent,
    },
    Fault {
        kind: FaultKind::WatchDrop,
        target: Target::ApiServer,
    },
    Fault {
        kind: FaultKind::ExpireWatches,
        target: Target::ApiServer,
    },
    Fault {
        kind: FaultKind::Latency,
        target: Target::ApiServer,
    },
    Fault {
        kind: FaultKind::Partition,
        target: Target::Agent,
    },
    Fault {
        kind: FaultKind::Partition,
        target: Target::LeadingControllerManager,
    },
    Fault {
        kind: FaultKind::Kill,
        target: Target::EtcdMember,
    },
];

impl Fault {
    /// Whether the fault needs the target in a network namespace of its own.
    pub fn needs_netns(&self) -> bool {
        self.kind == FaultKind::Partition
    }

    /// Whether the fault needs the API servers on etcd.
    pub fn needs_etcd(&self) -> bool {
        self.target == Target::EtcdMember
    }
}

/// How far apart steps are on average: room for a fault (a freeze lasts longer than a lease)
/// and the cluster's return to convergence.
pub const STEP_SPACING: Duration = Duration::from_secs(8);

/// SplitMix64: a tiny generator whose output is fixed by its definition, so a seed means the
/// same schedule in every build (a library generator may change its stream between versions).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The schedule of a run of `duration` from `seed`: one step per [`STEP_SPACING`] (at least
/// one), each at a jittered offset, every fault kind `drawn` accepts used before any repeats so
/// that even a short run covers them all (a run that cannot partition leaves partitions out).
pub fn schedule(seed: u64, duration: Duration, drawn: impl Fn(&Fault) -> bool) -> Vec<Step> {
    let mut rng = SplitMix64(seed);
    let steps = (duration.as_millis() / STEP_SPACING.as_millis()).max(1) as usize;
    // A shuffled round of every fault, then another, …
    let mut faults = Vec::with_capacity(steps);
    // Nothing to draw: no steps (rather than rounds without end).
    let any = FAULTS.iter().any(&drawn);
    while any && faults.len() < steps {
        let mut round: Vec<Fault> = FAULTS.into_iter().filter(|f| drawn(f)).collect();
        for i in (1..round.len()).rev() {
            round.swap(i, rng.below(i as u64 + 1) as usize);
        }
        faults.extend(round);
    }
    faults.truncate(steps);
    let spacing = duration / steps as u32;
    faults
        .into_iter()
        .enumerate()
        .map(|(i, fault)| {
            // Up to a quarter of the spacing late, so the offsets are not a fixed grid.
            let jitter = rng.below(spacing.as_millis() as u64 / 4 + 1);
            let at = spacing * i as u32 + Duration::from_millis(jitter);
            Step {
                at,
                change: change(&mut rng, i),
                fault,
            }
        })
        .collect()
}

/// The change of step `step`.
fn change(rng: &mut SplitMix64, step: usize) -> Change {
    let image = IMAGES[rng.below(IMAGES.len() as u64) as usize].to_string();
    match rng.below(5) {
        // Named by its step, so each is new.
        4 => Change::CreateJob {
            name: format!("batch-step-{step}"),
            completions: 1 + rng.below(3) as i64,
            parallelism: 1 + rng.below(2) as i64,
        },
        0 => Change::ScaleDeployment {
            name: format!("web-{}", rng.below(DEPLOYMENTS as u64)),
            replicas: 1 + rng.below(6) as i64,
        },
        1 => Change::DeploymentImage {
            name: format!("web-{}", rng.below(DEPLOYMENTS as u64)),
            image,
        },
        2 => Change::ScaleStatefulSet {
            name: format!("db-{}", rng.below(STATEFULSETS as u64)),
            replicas: 1 + rng.below(4) as i64,
        },
        _ => Change::StatefulSetImage {
            name: format!("db-{}", rng.below(STATEFULSETS as u64)),
            image,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &Fault) -> bool {
        true
    }

    #[test]
    fn a_seed_gives_the_same_schedule() {
        let d = Duration::from_secs(60);
        assert_eq!(schedule(7, d, all), schedule(7, d, all));
        assert_ne!(schedule(7, d, all), schedule(8, d, all));
    }

    #[test]
    fn steps_are_ordered_within_the_duration_and_cover_every_fault() {
        let d = Duration::from_secs(60);
        for seed in 0..50 {
            let s = schedule(seed, d, all);
            assert_eq!(s.len(), 7);
            assert!(s.windows(2).all(|w| w[0].at < w[1].at), "{s:?}");
            assert!(s.iter().all(|step| step.at < d));
        }
        let d = STEP_SPACING * FAULTS.len() as u32;
        for seed in 0..50 {
            let s = schedule(seed, d, all);
            assert_eq!(s.len(), FAULTS.len());
            for f in FAULTS {
                assert!(s.iter().any(|step| step.fault == f), "seed {seed}: {f:?}");
            }
        }
        assert_eq!(schedule(1, Duration::from_secs(1), all).len(), 1);
    }

    #[test]
    fn faults_left_out_are_never_drawn_and_the_rest_still_all_are() {
        let kept: Vec<Fault> = FAULTS.into_iter().filter(|f| !f.needs_netns()).collect();
        let d = STEP_SPACING * kept.len() as u32;
        for seed in 0..50 {
            let s = schedule(seed, d, |f| !f.needs_netns());
            assert_eq!(s.len(), kept.len());
            for f in &kept {
                assert!(s.iter().any(|step| step.fault == *f), "seed {seed}: {f:?}");
            }
        }
    }

    #[test]
    fn nothing_drawable_is_no_step() {
        assert!(schedule(1, Duration::from_secs(60), |_| false).is_empty());
        let only = schedule(1, Duration::from_secs(24), |f| f.needs_etcd());
        assert_eq!(only.len(), 3);
        assert!(only.iter().all(|s| s.fault.target == Target::EtcdMember));
    }

    #[test]
    fn the_generator_is_splitmix64() {
        // The reference output of SplitMix64 seeded with 0: a seed must mean the same run
        // in every build.
        let mut r = SplitMix64(0);
        assert_eq!(r.next(), 0xe220_a839_7b1d_cdaf);
    }
}
