//! Resource usage, as the kubelet reports it: cumulative CPU (core-nanoseconds) and the
//! memory working set per container, per pod and for the node, and the two documents the
//! agent serves from them: the Summary API (`/stats/summary`, [`summary`]) and the resource
//! metrics (`/metrics/resource`, [`resource_metrics`], Prometheus text with upstream's names
//! and labels). The runtimes measure ([`crate::runtime::PodRuntime::stats`]); this module
//! only shapes what they measured, and reads the host's `/proc` ([`procfs`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::runtime::RuntimePod;

/// The annotation giving a simulated container's CPU usage (a quantity: `140m`), on the pod
/// (or its template). Every running container of the pod uses that much.
pub const SIMULATED_CPU_ANNOTATION: &str = "setpoint.dev/simulated-cpu";
/// The annotation giving a simulated container's memory working set (a quantity: `64Mi`).
pub const SIMULATED_MEMORY_ANNOTATION: &str = "setpoint.dev/simulated-memory";
/// The annotation giving the CPU (a quantity: `420m`) shared by the running simulated pods of
/// one controller (the same controller ownerReference uid), on the pod template: each uses
/// this total divided by how many are running, so utilization falls as replicas are added.
pub const SIMULATED_CPU_TOTAL_ANNOTATION: &str = "setpoint.dev/simulated-cpu-total";
/// The memory working set shared the same way as [`SIMULATED_CPU_TOTAL_ANNOTATION`]'s CPU.
pub const SIMULATED_MEMORY_TOTAL_ANNOTATION: &str = "setpoint.dev/simulated-memory-total";

/// What one container, pod or node used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time consumed since it started, in core-nanoseconds (`usageCoreNanoSeconds`).
    pub cpu_core_nanoseconds: u64,
    /// Memory in use that cannot be reclaimed without I/O (`workingSetBytes`).
    pub memory_working_set_bytes: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            cpu_core_nanoseconds: self.cpu_core_nanoseconds + o.cpu_core_nanoseconds,
            memory_working_set_bytes: self.memory_working_set_bytes + o.memory_working_set_bytes,
        }
    }
}

/// One running container's usage.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerStats {
    /// The container's name.
    pub name: String,
    /// When its current run started.
    pub start_time: Timestamp,
    /// What it used.
    pub usage: Usage,
}

/// One pod's usage: its running containers.
#[derive(Clone, Debug, PartialEq)]
pub struct PodStats {
    /// The pod.
    pub pod: RuntimePod,
    /// When the runtime started it.
    pub start_time: Timestamp,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
}

impl PodStats {
    /// The pod's usage: the sum of its containers'.
    pub fn usage(&self) -> Usage {
        self.containers
            .iter()
            .fold(Usage::default(), |a, c| a + c.usage)
    }
}

/// The node's own usage.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeUsage {
    /// When the node started (its boot, or the simulated node's start).
    pub start_time: Timestamp,
    /// What the whole node used.
    pub usage: Usage,
    /// Memory still available (`availableBytes`), when known.
    pub memory_available_bytes: Option<u64>,
}

/// What a runtime measured at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeStats {
    /// The pods it holds with running containers.
    pub pods: Vec<PodStats>,
    /// The node's usage when the runtime stands for the whole node (a simulated node);
    /// `None` when the node is the host, which the agent measures itself ([`procfs`]).
    pub node: Option<NodeUsage>,
    /// Pods whose figures could not be read, and why (reported as `scrape_error`).
    pub errors: Vec<String>,
}

/// The previous cumulative CPU figures of a node's series, so the Summary API can give an
/// instantaneous rate (`usageNanoCores`) as the kubelet does. Holds only the series of the
/// latest sample, so it never grows past what the node runs.
#[derive(Default)]
pub struct CpuRates {
    last: Mutex<HashMap<String, (Timestamp, u64)>>,
}

impl CpuRates {
    /// A fresh tracker.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Records this sample of every series and returns each one's rate since its previous
    /// sample in nanocores (`None` for a new series, or one that went backwards: restarted).
    fn rates(&self, now: Timestamp, series: &[(String, u64)]) -> HashMap<String, u64> {
        let mut last = self.last.lock();
        let mut out = HashMap::new();
        let mut next = HashMap::with_capacity(series.len());
        for (key, cum) in series {
            if let Some(&(t, prev)) = last.get(key) {
                let dt = now.as_nanosecond() - t.as_nanosecond();
                if dt > 0 && *cum >= prev {
                    let rate = ((*cum - prev) as i128 * 1_000_000_000 / dt) as u64;
                    out.insert(key.clone(), rate);
                } else if dt <= 0 {
                    // The same instant asked twice: keep the older sample to rate against.
                    next.insert(key.clone(), (t, prev));
                    continue;
                }
            }
            next.insert(key.clone(), (now, *cum));
        }
        *last = next;
        out
    }
}

fn cpu_json(time: &str, cum: u64, rate: Option<u64>) -> Value {
    let mut v = json!({"time": time, "usageCoreNanoSeconds": cum});
    if let Some(r) = rate {
        v["usageNanoCores"] = json!(r);
    }
    v
}

fn memory_json(time: &str, usage: &Usage, available: Option<u64>) -> Value {
    let mut v = json!({
        "time": time,
        "workingSetBytes": usage.memory_working_set_bytes,
        // What is measured is the working set; usage is at least that.
        "usageBytes": usage.memory_working_set_bytes,
    });
    if let Some(a) = available {
        v["availableBytes"] = json!(a);
    }
    v
}

/// The Summary API document (`stats/v1alpha1` `Summary`) of `node_name`: the node's CPU and
/// memory, and per pod its containers', each with the sample `time`. CPU rates
/// (`usageNanoCores`) are against the previous call's sample of the same series.
pub fn summary(
    node_name: &str,
    node: &NodeUsage,
    pods: &[PodStats],
    now: Timestamp,
    rates: &CpuRates,
) -> Value {
    let mut series = vec![("node".to_string(), node.usage.cpu_core_nanoseconds)];
    for p in pods {
        series.push((format!("pod/{}", p.pod.uid), p.usage().cpu_core_nanoseconds));
        for c in &p.containers {
            series.push((
                format!("container/{}/{}/{}", p.pod.uid, c.name, c.start_time),
                c.usage.cpu_core_nanoseconds,
            ));
        }
    }
    let rates = rates.rates(now, &series);
    // Sample times keep their fraction (RFC 3339 allows it, and metav1.Time parses it): a
    // rate over a window of a few seconds needs more than whole seconds.
    let time = now.to_string();
    let pods: Vec<Value> = pods
        .iter()
        .map(|p| {
            let usage = p.usage();
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|c| {
                    let key = format!("container/{}/{}/{}", p.pod.uid, c.name, c.start_time);
                    json!({
                        "name": c.name,
                        "startTime": setpoint_time(c.start_time),
                        "cpu": cpu_json(&time, c.usage.cpu_core_nanoseconds, rates.get(&key).copied()),
                        "memory": memory_json(&time, &c.usage, None),
                    })
                })
                .collect();
            json!({
                "podRef": {"name": p.pod.name, "namespace": p.pod.namespace, "uid": p.pod.uid},
                "startTime": setpoint_time(p.start_time),
                "containers": containers,
                "cpu": cpu_json(&time, usage.cpu_core_nanoseconds, rates.get(&format!("pod/{}", p.pod.uid)).copied()),
                "memory": memory_json(&time, &usage, None),
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": node_name,
            "startTime": setpoint_time(node.start_time),
            "cpu": cpu_json(&time, node.usage.cpu_core_nanoseconds, rates.get("node").copied()),
            "memory": memory_json(&time, &node.usage, node.memory_available_bytes),
        },
        "pods": pods,
    })
}

/// RFC 3339 with seconds, as `metav1.Time` serializes.
fn setpoint_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn seconds(ns: u64) -> String {
    format!("{}", ns as f64 / 1e9)
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The kubelet's `/metrics/resource` exposition (Prometheus text 0.0.4): upstream's metric
/// names, help texts and labels, each sample stamped with `now` in milliseconds.
/// `scrape_error` is 1 when some figures could not be read.
pub fn resource_metrics(
    node: &NodeUsage,
    pods: &[PodStats],
    now: Timestamp,
    scrape_error: bool,
) -> String {
    let ts = now.as_millisecond();
    let mut out = String::new();
    let header = |out: &mut String, name: &str, help: &str, kind: &str| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
    };
    let per_container = |out: &mut String, name: &str, v: &dyn Fn(&ContainerStats) -> String| {
        for p in pods {
            for c in &p.containers {
                let _ = writeln!(
                    out,
                    "{name}{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}} {} {ts}",
                    label(&c.name),
                    label(&p.pod.namespace),
                    label(&p.pod.name),
                    v(c)
                );
            }
        }
    };
    header(
        &mut out,
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    );
    per_container(&mut out, "container_cpu_usage_seconds_total", &|c| {
        seconds(c.usage.cpu_core_nanoseconds)
    });
    header(
        &mut out,
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
    );
    per_container(&mut out, "container_memory_working_set_bytes", &|c| {
        c.usage.memory_working_set_bytes.to_string()
    });
    header(
        &mut out,
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
    );
    per_container(&mut out, "container_start_time_seconds", &|c| {
        format!("{}", c.start_time.as_nanosecond() as f64 / 1e9)
    });
    header(
        &mut out,
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    );
    let _ = writeln!(
        out,
        "node_cpu_usage_seconds_total {} {ts}",
        seconds(node.usage.cpu_core_nanoseconds)
    );
    header(
        &mut out,
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
    );
    let _ = writeln!(
        out,
        "node_memory_working_set_bytes {} {ts}",
        node.usage.memory_working_set_bytes
    );
    let per_pod = |out: &mut String, name: &str, v: &dyn Fn(&Usage) -> String| {
        for p in pods {
            let _ = writeln!(
                out,
                "{name}{{namespace=\"{}\",pod=\"{}\"}} {} {ts}",
                label(&p.pod.namespace),
                label(&p.pod.name),
                v(&p.usage())
            );
        }
    };
    header(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    );
    per_pod(&mut out, "pod_cpu_usage_seconds_total", &|u| {
        seconds(u.cpu_core_nanoseconds)
    });
    header(
        &mut out,
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
    );
    per_pod(&mut out, "pod_memory_working_set_bytes", &|u| {
        u.memory_working_set_bytes.to_string()
    });
    header(
        &mut out,
        "scrape_error",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    );
    let _ = writeln!(out, "scrape_error {}", u8::from(scrape_error));
    out
}

/// The figures of a container runtime's running containers, from its CRI
/// `ListContainerStats` (which containerd answers from the containers' cgroups: CPU from
/// `cpu.stat`'s usage, the working set as usage less `inactive_file`, as the kubelet's
/// cAdvisor computes it) and the running containers of `ListContainers` (for their start
/// time and to leave exited ones out). Containers are grouped into pods by the kubelet's
/// `io.kubernetes.pod.*` labels; a pod's start time is its earliest running container's.
pub fn from_cri(
    stats: &[setpoint_cri_proto::ContainerStats],
    running: &[setpoint_cri_proto::Container],
) -> Vec<PodStats> {
    use crate::cri::sandbox::{
        CONTAINER_NAME_LABEL, POD_NAMESPACE_LABEL, POD_NAME_LABEL, POD_UID_LABEL,
    };
    let started: HashMap<&str, i64> = running
        .iter()
        .filter(|c| c.state == setpoint_cri_proto::ContainerState::ContainerRunning as i32)
        .map(|c| (c.id.as_str(), c.created_at))
        .collect();
    let mut pods: std::collections::BTreeMap<String, PodStats> = Default::default();
    for s in stats {
        let Some(attrs) = &s.attributes else { continue };
        let Some(&created) = started.get(attrs.id.as_str()) else {
            continue;
        };
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let uid = label(POD_UID_LABEL);
        if uid.is_empty() {
            continue; // not a pod's container (the runtime may run others)
        }
        let name = attrs
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| label(CONTAINER_NAME_LABEL));
        let start = Timestamp::from_nanosecond(created as i128).unwrap_or(Timestamp::UNIX_EPOCH);
        let usage = Usage {
            cpu_core_nanoseconds: s
                .cpu
                .as_ref()
                .and_then(|c| c.usage_core_nano_seconds.as_ref())
                .map_or(0, |v| v.value),
            memory_working_set_bytes: s
                .memory
                .as_ref()
                .and_then(|m| m.working_set_bytes.as_ref())
                .map_or(0, |v| v.value),
        };
        let pod = pods.entry(uid.clone()).or_insert_with(|| PodStats {
            pod: RuntimePod {
                uid,
                namespace: label(POD_NAMESPACE_LABEL),
                name: label(POD_NAME_LABEL),
            },
            start_time: start,
            containers: Vec::new(),
        });
        pod.start_time = pod.start_time.min(start);
        pod.containers.push(ContainerStats {
            name,
            start_time: start,
            usage,
        });
    }
    pods.into_values().collect()
}

/// The host's figures from `/proc`: the node's CPU and memory, and the usage of a process
/// tree (a process pod's container).
pub mod procfs {
    use std::collections::HashMap;

    use k8s_openapi::jiff::Timestamp;

    use super::{NodeUsage, Usage};

    /// Clock ticks per second (`USER_HZ`), the unit of `/proc` CPU times.
    #[allow(unsafe_code)]
    fn ticks_per_second() -> u64 {
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 {
            t as u64
        } else {
            100
        }
    }

    #[allow(unsafe_code)]
    fn page_size() -> u64 {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as u64
        } else {
            4096
        }
    }

    /// Non-idle CPU time of the whole machine from `/proc/stat`'s `cpu` line, in ticks:
    /// user, nice, system, irq, softirq and steal (idle and iowait are not usage; guest time
    /// is already inside user).
    pub fn parse_stat_busy_ticks(stat: &str) -> Option<u64> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Some(at(0) + at(1) + at(2) + at(5) + at(6) + at(7))
    }

    /// The boot time (`btime`, Unix seconds) from `/proc/stat`.
    pub fn parse_boot_time(stat: &str) -> Option<i64> {
        stat.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// `/proc/meminfo`'s values in bytes, by key.
    pub fn parse_meminfo(meminfo: &str) -> HashMap<&str, u64> {
        meminfo
            .lines()
            .filter_map(|l| {
                let (k, rest) = l.split_once(':')?;
                let mut parts = rest.split_whitespace();
                let n: u64 = parts.next()?.parse().ok()?;
                let scale = if parts.next() == Some("kB") { 1024 } else { 1 };
                Some((k, n * scale))
            })
            .collect()
    }

    /// The node's working set as the kubelet computes it for the root cgroup: memory in use
    /// (total − free) less the inactive file cache, which the kernel reclaims without
    /// writing anything; and what is available (`MemAvailable`).
    pub fn node_memory(meminfo: &str) -> (u64, Option<u64>) {
        let m = parse_meminfo(meminfo);
        let total = m.get("MemTotal").copied().unwrap_or(0);
        let free = m.get("MemFree").copied().unwrap_or(0);
        let inactive_file = m.get("Inactive(file)").copied().unwrap_or(0);
        let working_set = total.saturating_sub(free).saturating_sub(inactive_file);
        (working_set, m.get("MemAvailable").copied())
    }

    /// The host's usage now: CPU from `/proc/stat`, memory from `/proc/meminfo`.
    pub fn host_usage() -> std::io::Result<NodeUsage> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let meminfo = std::fs::read_to_string("/proc/meminfo")?;
        let ticks = parse_stat_busy_ticks(&stat)
            .ok_or_else(|| std::io::Error::other("/proc/stat has no cpu line"))?;
        let (working_set, available) = node_memory(&meminfo);
        let start_time = parse_boot_time(&stat)
            .and_then(|s| Timestamp::from_second(s).ok())
            .unwrap_or(Timestamp::UNIX_EPOCH);
        Ok(NodeUsage {
            start_time,
            usage: Usage {
                cpu_core_nanoseconds: ticks * (1_000_000_000 / ticks_per_second()),
                memory_working_set_bytes: working_set,
            },
            memory_available_bytes: available,
        })
    }

    /// One process as `/proc/<pid>/stat` and `statm` show it.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct Proc {
        /// The parent's pid.
        pub ppid: i32,
        /// Its start time, in ticks since boot.
        pub start: u64,
        /// utime + stime + cutime + cstime, in ticks: its own CPU and that of the children
        /// it has waited for.
        pub cpu_ticks: u64,
        /// Resident pages.
        pub rss_pages: u64,
    }

    /// Parses `/proc/<pid>/stat` (the command may hold spaces and parentheses: fields are
    /// counted after the last `)`).
    pub fn parse_pid_stat(stat: &str) -> Option<Proc> {
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // f[0] is field 3 (state).
        let num = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
        Some(Proc {
            ppid: f.get(1)?.parse().ok()?,
            cpu_ticks: num(14)? + num(15)? + num(16)? + num(17)?,
            start: num(22)?,
            rss_pages: num(24)?,
        })
    }

    /// Every process of the host at one moment, for measuring process trees.
    #[derive(Debug, Default)]
    pub struct ProcTable {
        procs: HashMap<i32, Proc>,
        children: HashMap<i32, Vec<i32>>,
    }

    impl ProcTable {
        /// Reads `/proc`; processes that exit while it is read are left out.
        pub fn read() -> Self {
            let mut table = Vec::new();
            if let Ok(dir) = std::fs::read_dir("/proc") {
                for e in dir.flatten() {
                    let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())
                    else {
                        continue;
                    };
                    if let Some(p) = std::fs::read_to_string(e.path().join("stat"))
                        .ok()
                        .and_then(|s| parse_pid_stat(&s))
                    {
                        table.push((pid, p));
                    }
                }
            }
            Self::from_procs(table)
        }

        /// A table of the given processes.
        pub fn from_procs(procs: impl IntoIterator<Item = (i32, Proc)>) -> Self {
            let mut t = ProcTable::default();
            for (pid, p) in procs {
                t.children.entry(p.ppid).or_default().push(pid);
                t.procs.insert(pid, p);
            }
            t
        }

        /// The usage of the tree rooted at `pid`, if that process is alive and started at
        /// `start` (a reused pid is another process). Approximations, said here once: CPU is
        /// what the tree's live processes used plus what the children they waited for used
        /// (a child that was re-parented away, or that exited unwaited, is not counted, so
        /// the figure can fall when such a process exits); the working set is the sum of the
        /// processes' resident pages, which counts pages they share once per process and
        /// does not count page cache, where a cgroup's working set counts active file pages
        /// once.
        pub fn tree_usage(&self, pid: i32, start: Option<u64>) -> Option<Usage> {
            let root = self.procs.get(&pid)?;
            if start.is_some_and(|s| s != root.start) {
                return None;
            }
            let tick_ns = 1_000_000_000 / ticks_per_second();
            let page = page_size();
            let mut usage = Usage::default();
            let mut stack = vec![pid];
            let mut seen = 0usize;
            while let Some(p) = stack.pop() {
                seen += 1;
                if seen > self.procs.len() {
                    break; // a cycle cannot happen in /proc, but never loop forever
                }
                if let Some(proc) = self.procs.get(&p) {
                    usage.cpu_core_nanoseconds += proc.cpu_ticks * tick_ns;
                    usage.memory_working_set_bytes += proc.rss_pages * page;
                }
                if let Some(kids) = self.children.get(&p) {
                    stack.extend(kids.iter().copied().filter(|k| *k != p));
                }
            }
            Some(usage)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::procfs::*;
    use super::*;

    #[test]
    fn cri_stats_are_grouped_by_pod_and_only_running_containers_count() {
        use setpoint_cri_proto as cri;
        let labels = |pod: &str, c: &str| {
            HashMap::from([
                ("io.kubernetes.pod.uid".to_string(), format!("uid-{pod}")),
                ("io.kubernetes.pod.name".to_string(), pod.to_string()),
                ("io.kubernetes.pod.namespace".to_string(), "ns".to_string()),
                ("io.kubernetes.container.name".to_string(), c.to_string()),
            ])
        };
        let stat = |id: &str, pod: &str, c: &str, cpu: u64, mem: u64| cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: id.into(),
                metadata: Some(cri::ContainerMetadata {
                    name: c.into(),
                    attempt: 0,
                }),
                labels: labels(pod, c),
                annotations: HashMap::new(),
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: 1,
                usage_core_nano_seconds: Some(cri::UInt64Value { value: cpu }),
                ..Default::default()
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: 1,
                working_set_bytes: Some(cri::UInt64Value { value: mem }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let container = |id: &str, running: bool, created: i64| cri::Container {
            id: id.into(),
            state: if running {
                cri::ContainerState::ContainerRunning as i32
            } else {
                cri::ContainerState::ContainerExited as i32
            },
            created_at: created,
            ..Default::default()
        };
        let pods = from_cri(
            &[
                stat("a", "web", "app", 10, 100),
                stat("b", "web", "side", 5, 50),
                stat("c", "web", "old", 99, 99),
                stat("d", "db", "db", 7, 70),
            ],
            &[
                container("a", true, 2_000_000_000),
                container("b", true, 1_000_000_000),
                container("c", false, 0),
                container("d", true, 3_000_000_000),
            ],
        );
        assert_eq!(pods.len(), 2);
        let web = pods.iter().find(|p| p.pod.name == "web").unwrap();
        assert_eq!(web.pod.uid, "uid-web");
        assert_eq!(web.containers.len(), 2, "the exited container is left out");
        assert_eq!(
            web.usage(),
            Usage {
                cpu_core_nanoseconds: 15,
                memory_working_set_bytes: 150
            }
        );
        assert_eq!(web.start_time, Timestamp::from_second(1).unwrap());
    }

    #[test]
    fn proc_stat_fields() {
        let s = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 70 30 5 5 20 0 1 0 4242 1000000 256 18446744073709551615";
        let p = parse_pid_stat(s).unwrap();
        assert_eq!(p.ppid, 1);
        assert_eq!(p.cpu_ticks, 110);
        assert_eq!(p.start, 4242);
        assert_eq!(p.rss_pages, 256);
        assert!(parse_pid_stat("garbage").is_none());
    }

    #[test]
    fn node_cpu_and_memory() {
        let stat = "cpu  100 10 50 1000 40 3 2 1 7 0\ncpu0 1 2 3\nbtime 1700000000\n";
        // user + nice + system + irq + softirq + steal.
        assert_eq!(parse_stat_busy_ticks(stat), Some(166));
        assert_eq!(parse_boot_time(stat), Some(1_700_000_000));
        let meminfo =
            "MemTotal: 1000 kB\nMemFree: 200 kB\nMemAvailable: 600 kB\nInactive(file): 300 kB\n";
        assert_eq!(node_memory(meminfo), (500 * 1024, Some(600 * 1024)));
    }

    #[test]
    #[allow(unsafe_code)]
    fn a_tree_sums_its_live_descendants_and_checks_the_root_start() {
        let p = |ppid, start, cpu, rss| Proc {
            ppid,
            start,
            cpu_ticks: cpu,
            rss_pages: rss,
        };
        let t = ProcTable::from_procs([
            (10, p(1, 5, 1, 1)),
            (11, p(10, 6, 2, 2)),
            (12, p(11, 7, 4, 4)),
            (20, p(1, 8, 100, 100)),
        ]);
        let u = t.tree_usage(10, Some(5)).unwrap();
        let tick_ns = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        assert_eq!(u.cpu_core_nanoseconds, 7 * tick_ns);
        assert!(t.tree_usage(10, Some(6)).is_none(), "pid reused");
        assert!(t.tree_usage(99, None).is_none());
    }

    fn pod(uid: &str, cpu: u64, mem: u64) -> PodStats {
        PodStats {
            pod: RuntimePod {
                uid: uid.into(),
                namespace: "ns".into(),
                name: format!("p-{uid}"),
            },
            start_time: Timestamp::from_second(1_700_000_000).unwrap(),
            containers: vec![ContainerStats {
                name: "c".into(),
                start_time: Timestamp::from_second(1_700_000_001).unwrap(),
                usage: Usage {
                    cpu_core_nanoseconds: cpu,
                    memory_working_set_bytes: mem,
                },
            }],
        }
    }

    #[test]
    fn summary_rates_against_the_previous_sample() {
        let node = NodeUsage {
            start_time: Timestamp::from_second(1_600_000_000).unwrap(),
            usage: Usage {
                cpu_core_nanoseconds: 10_000_000_000,
                memory_working_set_bytes: 1 << 30,
            },
            memory_available_bytes: Some(1 << 31),
        };
        let rates = CpuRates::default();
        let t0 = Timestamp::from_second(1_700_000_100).unwrap();
        let s = summary("n1", &node, &[pod("u1", 1_000_000_000, 4096)], t0, &rates);
        assert_eq!(s["node"]["nodeName"], "n1");
        assert_eq!(s["node"]["cpu"]["usageCoreNanoSeconds"], 10_000_000_000u64);
        assert!(s["node"]["cpu"].get("usageNanoCores").is_none());
        assert_eq!(s["node"]["memory"]["availableBytes"], 1u64 << 31);
        assert_eq!(s["pods"][0]["podRef"]["uid"], "u1");
        assert_eq!(
            s["pods"][0]["containers"][0]["memory"]["workingSetBytes"],
            4096
        );
        assert_eq!(s["pods"][0]["startTime"], "2023-11-14T22:13:20Z");
        // 10 s later the pod used 1.4 more core-seconds: 140m.
        let t1 = Timestamp::from_second(1_700_000_110).unwrap();
        let s = summary("n1", &node, &[pod("u1", 15_000_000_000, 4096)], t1, &rates);
        assert_eq!(s["pods"][0]["cpu"]["usageNanoCores"], 1_400_000_000u64);
        assert_eq!(
            s["pods"][0]["containers"][0]["cpu"]["usageNanoCores"],
            1_400_000_000u64
        );
        assert_eq!(s["node"]["cpu"]["usageNanoCores"], 0);
        // A pod gone from the node is forgotten.
        summary("n1", &node, &[], t1, &rates);
        assert_eq!(rates.last.lock().len(), 1);
    }

    #[test]
    fn resource_metrics_names_labels_and_timestamps() {
        let node = NodeUsage {
            start_time: Timestamp::UNIX_EPOCH,
            usage: Usage {
                cpu_core_nanoseconds: 2_500_000_000,
                memory_working_set_bytes: 100,
            },
            memory_available_bytes: None,
        };
        let t = Timestamp::from_millisecond(1_700_000_000_123).unwrap();
        let text = resource_metrics(&node, &[pod("u1", 1_500_000_000, 64)], t, false);
        for line in [
            "node_cpu_usage_seconds_total 2.5 1700000000123",
            "node_memory_working_set_bytes 100 1700000000123",
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p-u1\"} 1.5 1700000000123",
            "container_memory_working_set_bytes{container=\"c\",namespace=\"ns\",pod=\"p-u1\"} 64 1700000000123",
            "container_start_time_seconds{container=\"c\",namespace=\"ns\",pod=\"p-u1\"} 1700000001 1700000000123",
            "pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"p-u1\"} 1.5 1700000000123",
            "pod_memory_working_set_bytes{namespace=\"ns\",pod=\"p-u1\"} 64 1700000000123",
            "# TYPE container_cpu_usage_seconds_total counter",
            "scrape_error 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(resource_metrics(&node, &[], t, true).contains("scrape_error 1\n"));
    }
}
