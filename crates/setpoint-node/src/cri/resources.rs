//! Requests and limits as CRI Linux resources, and the cgroup a pod's sandbox goes under,
//! with the kubelet's formulas (cgroupfs driver):
//!
//! - CPU shares = milliCPU request × 1024 / 1000, at least 2 (the limit stands in for a
//!   missing request);
//! - CPU quota = milliCPU limit × period / 1000 with a period of 100 000 µs, at least 1000;
//! - memory limit = the limit in bytes;
//! - OOM score adjustment by QoS class: Guaranteed −997, BestEffort 1000, Burstable
//!   1000 − 1000 × request / node memory, kept within 2..=999;
//! - cgroup parent `/kubepods/pod<uid>` (Guaranteed), `/kubepods/burstable/pod<uid>`,
//!   `/kubepods/besteffort/pod<uid>`.

use k8s_openapi::api::core::v1::Container;
use setpoint_api::quantity;

/// The CFS period the kubelet uses, in microseconds.
pub const CPU_PERIOD: i64 = 100_000;
/// The smallest CPU shares value the kernel accepts.
pub const MIN_SHARES: i64 = 2;
/// The smallest CFS quota the kubelet sets, in microseconds.
pub const MIN_QUOTA: i64 = 1_000;

/// A container's CRI Linux resources, before they are put in the CRI message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinuxResources {
    /// `cpu_shares`.
    pub cpu_shares: i64,
    /// `cpu_quota` (0: no limit).
    pub cpu_quota: i64,
    /// `cpu_period` (0 when there is no quota).
    pub cpu_period: i64,
    /// `memory_limit_in_bytes` (0: no limit).
    pub memory_limit: i64,
    /// `oom_score_adj`.
    pub oom_score_adj: i64,
}

/// Shares for a CPU request in millicores.
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    (milli * 1024 / 1000).max(MIN_SHARES)
}

/// CFS quota for a CPU limit in millicores over `period` µs (0: no limit).
pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    (milli * period / 1000).max(MIN_QUOTA)
}

fn get(container: &Container, limits: bool, name: &str) -> Result<Option<String>, String> {
    let res = container.resources.as_ref();
    let map = if limits {
        res.and_then(|r| r.limits.as_ref())
    } else {
        res.and_then(|r| r.requests.as_ref())
    };
    Ok(map.and_then(|m| m.get(name)).map(|q| q.0.clone()))
}

fn milli(q: Option<String>) -> Result<i64, String> {
    q.map_or(Ok(0), |s| {
        quantity::milli_cpu(&s).map_err(|e| format!("cpu quantity {s:?}: {e}"))
    })
}

fn bytes(q: Option<String>) -> Result<i64, String> {
    q.map_or(Ok(0), |s| {
        quantity::units(&s).map_err(|e| format!("memory quantity {s:?}: {e}"))
    })
}

/// The container's Linux resources, for a pod of QoS class `qos` on a node with
/// `node_memory` bytes. An unparsable quantity is an error (the API would have refused it).
pub fn linux_resources(
    container: &Container,
    qos: &str,
    node_memory: i64,
) -> Result<LinuxResources, String> {
    let cpu_request = milli(get(container, false, "cpu")?)?;
    let cpu_limit = milli(get(container, true, "cpu")?)?;
    let memory_request = bytes(get(container, false, "memory")?)?;
    let memory_limit = bytes(get(container, true, "memory")?)?;
    let cpu_shares = if cpu_request == 0 && cpu_limit > 0 {
        milli_cpu_to_shares(cpu_limit)
    } else {
        milli_cpu_to_shares(cpu_request)
    };
    let cpu_quota = milli_cpu_to_quota(cpu_limit, CPU_PERIOD);
    Ok(LinuxResources {
        cpu_shares,
        cpu_quota,
        cpu_period: if cpu_quota > 0 { CPU_PERIOD } else { 0 },
        memory_limit,
        oom_score_adj: oom_score_adj(qos, memory_request, node_memory),
    })
}

/// The OOM score adjustment of a container of class `qos` requesting `memory_request`
/// bytes on a node with `node_memory` bytes.
pub fn oom_score_adj(qos: &str, memory_request: i64, node_memory: i64) -> i64 {
    match qos {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            if node_memory <= 0 {
                return 999;
            }
            let adj = 1000 - (1000 * i128::from(memory_request) / i128::from(node_memory)) as i64;
            adj.clamp(2, 999)
        }
    }
}

/// The cgroup parent of a pod's sandbox (and so of its containers) by QoS class.
pub fn cgroup_parent(qos: &str, uid: &str) -> String {
    match qos {
        "Guaranteed" => format!("/kubepods/pod{uid}"),
        "BestEffort" => format!("/kubepods/besteffort/pod{uid}"),
        _ => format!("/kubepods/burstable/pod{uid}"),
    }
}

/// The node's memory in bytes (`MemTotal` of `/proc/meminfo`), 0 when unknown.
pub fn node_memory() -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn container(req: &[(&str, &str)], lim: &[(&str, &str)]) -> Container {
        let m = |v: &[(&str, &str)]| {
            Some(
                v.iter()
                    .map(|(k, q)| (k.to_string(), Quantity(q.to_string())))
                    .collect(),
            )
        };
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: m(req),
                limits: m(lim),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn kubelet_formulas() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_quota(0, CPU_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(5, CPU_PERIOD), 1000);
        assert_eq!(milli_cpu_to_quota(250, CPU_PERIOD), 25_000);
        assert_eq!(milli_cpu_to_quota(2000, CPU_PERIOD), 200_000);
    }

    #[test]
    fn requests_and_limits_become_linux_resources() {
        let c = container(
            &[("cpu", "250m"), ("memory", "64Mi")],
            &[("cpu", "500m"), ("memory", "128Mi")],
        );
        let r = linux_resources(&c, "Burstable", 1 << 30).unwrap();
        assert_eq!(
            r,
            LinuxResources {
                cpu_shares: 256,
                cpu_quota: 50_000,
                cpu_period: 100_000,
                memory_limit: 128 << 20,
                oom_score_adj: 938,
            }
        );
        // Only a limit: the shares follow it.
        let c = container(&[], &[("cpu", "1"), ("memory", "16Mi")]);
        let r = linux_resources(&c, "Guaranteed", 1 << 30).unwrap();
        assert_eq!((r.cpu_shares, r.memory_limit), (1024, 16 << 20));
        assert_eq!(r.oom_score_adj, -997);
        // Nothing: minimal shares, no quota, no memory limit.
        let r = linux_resources(&container(&[], &[]), "BestEffort", 1 << 30).unwrap();
        assert_eq!(
            r,
            LinuxResources {
                cpu_shares: 2,
                oom_score_adj: 1000,
                ..Default::default()
            }
        );
        assert!(linux_resources(&container(&[("cpu", "lots")], &[]), "Burstable", 1).is_err());
    }

    #[test]
    fn burstable_oom_score_is_clamped() {
        assert_eq!(oom_score_adj("Burstable", 0, 1000), 999);
        assert_eq!(oom_score_adj("Burstable", 1000, 1000), 2);
        assert_eq!(oom_score_adj("Burstable", 500, 1000), 500);
    }

    #[test]
    fn cgroup_parents_by_qos() {
        assert_eq!(cgroup_parent("Guaranteed", "u1"), "/kubepods/podu1");
        assert_eq!(
            cgroup_parent("Burstable", "u1"),
            "/kubepods/burstable/podu1"
        );
        assert_eq!(
            cgroup_parent("BestEffort", "u1"),
            "/kubepods/besteffort/podu1"
        );
    }
}
