//! What a pod asks for and what a node offers, in integers, computed as Kubernetes does.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// CPU assumed for a container that requests none, when scoring (not when filtering), so
/// that best-effort pods still spread: Kubernetes' `DefaultMilliCPURequest`.
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
/// Memory assumed for a container that requests none, when scoring: `DefaultMemoryRequest`.
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

/// An amount of CPU and memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// Millicores.
    pub milli_cpu: i64,
    /// Bytes.
    pub memory: i64,
}

impl Resources {
    /// `self + other`, saturating (quantities are validated, but a sum must never wrap).
    pub fn plus(self, other: Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.saturating_add(other.milli_cpu),
            memory: self.memory.saturating_add(other.memory),
        }
    }

    /// `self - other`, saturating.
    pub fn minus(self, other: Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.saturating_sub(other.milli_cpu),
            memory: self.memory.saturating_sub(other.memory),
        }
    }

    /// The larger of each resource.
    pub fn max(self, other: Resources) -> Resources {
        Resources {
            milli_cpu: self.milli_cpu.max(other.milli_cpu),
            memory: self.memory.max(other.memory),
        }
    }
}

/// What a pod needs from a node: requests for fitting, and requests with defaults for
/// missing ones, for scoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodRequests {
    /// The effective requests (Kubernetes' `PodRequests`).
    pub requested: Resources,
    /// The same with [`DEFAULT_MILLI_CPU_REQUEST`] / [`DEFAULT_MEMORY_REQUEST`] for each
    /// container that does not name the resource (Kubernetes' non-zero requests).
    pub non_zero: Resources,
}

fn cpu_of(map: Option<&BTreeMap<String, Quantity>>) -> Option<i64> {
    // A malformed quantity cannot get past the API server's validation; count it as zero
    // rather than refuse to schedule.
    map?.get("cpu")
        .map(|q| quantity::milli_cpu(&q.0).unwrap_or(0))
}

fn memory_of(map: Option<&BTreeMap<String, Quantity>>) -> Option<i64> {
    map?.get("memory")
        .map(|q| quantity::units(&q.0).unwrap_or(0))
}

/// A container's requests. A resource with a limit but no request requests its limit, as
/// the API server's defaulting makes it; `non_zero` fills the scoring defaults for resources
/// named in neither.
fn container_requests(c: &Container, non_zero: bool) -> Resources {
    let req = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let lim = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let (cpu_default, mem_default) = if non_zero {
        (DEFAULT_MILLI_CPU_REQUEST, DEFAULT_MEMORY_REQUEST)
    } else {
        (0, 0)
    };
    Resources {
        milli_cpu: cpu_of(req).or_else(|| cpu_of(lim)).unwrap_or(cpu_default),
        memory: memory_of(req)
            .or_else(|| memory_of(lim))
            .unwrap_or(mem_default),
    }
}

fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn aggregate(pod: &Pod, non_zero: bool) -> Resources {
    let Some(spec) = pod.spec.as_ref() else {
        return Resources::default();
    };
    let containers = spec.containers.iter().fold(Resources::default(), |acc, c| {
        acc.plus(container_requests(c, non_zero))
    });
    // Init containers run one at a time before the app containers, so the pod needs the
    // largest of them; sidecars (restartable init containers) keep running, so they add to
    // every init container started after them and to the app containers.
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c, non_zero);
        let during = if is_sidecar(c) {
            sidecars = sidecars.plus(r);
            sidecars
        } else {
            r.plus(sidecars)
        };
        init_peak = init_peak.max(during);
    }
    let mut total = containers.plus(sidecars).max(init_peak);
    // The runtime's own cost of the pod (RuntimeClass overhead) is charged on top.
    if let Some(o) = spec.overhead.as_ref() {
        total = total.plus(Resources {
            milli_cpu: cpu_of(Some(o)).unwrap_or(0),
            memory: memory_of(Some(o)).unwrap_or(0),
        });
    }
    total
}

impl PodRequests {
    /// The requests of a pod.
    pub fn of(pod: &Pod) -> PodRequests {
        PodRequests {
            requested: aggregate(pod, false),
            non_zero: aggregate(pod, true),
        }
    }
}

/// What a node can hold in total (`status.allocatable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Allocatable {
    /// CPU and memory.
    pub resources: Resources,
    /// The most pods.
    pub pods: i64,
}

impl Allocatable {
    /// A node's `status.allocatable`, or its `status.capacity` when it reports no
    /// allocatable at all (what is left before the node agent reports reservations).
    pub fn of(node: &Node) -> Allocatable {
        let status = node.status.as_ref();
        let map = status
            .and_then(|s| s.allocatable.as_ref())
            .or_else(|| status.and_then(|s| s.capacity.as_ref()));
        Allocatable {
            resources: Resources {
                milli_cpu: cpu_of(map).unwrap_or(0),
                memory: memory_of(map).unwrap_or(0),
            },
            pods: map
                .and_then(|m| m.get("pods"))
                .map(|q| quantity::units(&q.0).unwrap_or(0))
                .unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn c(requests: serde_json::Value) -> serde_json::Value {
        json!({"name": "c", "resources": {"requests": requests}})
    }

    #[test]
    fn containers_add_up() {
        let p = pod(json!({"containers": [
            c(json!({"cpu": "100m", "memory": "128Mi"})),
            c(json!({"cpu": "1", "memory": "1Gi"})),
        ]}));
        let r = PodRequests::of(&p);
        assert_eq!(
            r.requested,
            Resources {
                milli_cpu: 1100,
                memory: (128 + 1024) << 20
            }
        );
        assert_eq!(r.non_zero, r.requested);
    }

    #[test]
    fn init_containers_take_the_max() {
        let p = pod(json!({
            "initContainers": [c(json!({"cpu": "2", "memory": "64Mi"})), c(json!({"cpu": "500m", "memory": "2Gi"}))],
            "containers": [c(json!({"cpu": "1", "memory": "1Gi"}))],
        }));
        assert_eq!(
            PodRequests::of(&p).requested,
            Resources {
                milli_cpu: 2000,
                memory: 2 << 30
            }
        );
    }

    #[test]
    fn sidecars_add_to_later_init_containers_and_to_the_app() {
        let p = pod(json!({
            "initContainers": [
                c(json!({"cpu": "1"})),
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
                c(json!({"cpu": "1200m"})),
            ],
            "containers": [c(json!({"cpu": "200m"}))],
        }));
        // init peak: max(1000, 500, 1200 + 500) = 1700; app: 200 + 500 = 700.
        assert_eq!(PodRequests::of(&p).requested.milli_cpu, 1700);
        let small_init = pod(json!({
            "initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}],
            "containers": [c(json!({"cpu": "2"}))],
        }));
        assert_eq!(PodRequests::of(&small_init).requested.milli_cpu, 2500);
    }

    #[test]
    fn overhead_is_added() {
        let p = pod(json!({
            "containers": [c(json!({"cpu": "1"}))],
            "overhead": {"cpu": "250m", "memory": "120Mi"},
        }));
        assert_eq!(
            PodRequests::of(&p).requested,
            Resources {
                milli_cpu: 1250,
                memory: 120 << 20
            }
        );
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        let p = pod(json!({"containers": [
            {"name": "c", "resources": {"limits": {"cpu": "300m", "memory": "1Gi"}, "requests": {"memory": "512Mi"}}}
        ]}));
        assert_eq!(
            PodRequests::of(&p).requested,
            Resources {
                milli_cpu: 300,
                memory: 512 << 20
            }
        );
    }

    #[test]
    fn best_effort_pods_request_nothing_but_score_with_defaults() {
        let p = pod(json!({"containers": [{"name": "a"}, c(json!({"cpu": "0"}))]}));
        let r = PodRequests::of(&p);
        assert_eq!(r.requested, Resources::default());
        // The explicit zero stays zero; the unnamed resources get defaults.
        assert_eq!(
            r.non_zero,
            Resources {
                milli_cpu: DEFAULT_MILLI_CPU_REQUEST,
                memory: 2 * DEFAULT_MEMORY_REQUEST
            }
        );
    }

    #[test]
    fn allocatable_falls_back_to_capacity() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "3800m", "memory": "7Gi", "pods": "110"},
                       "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }))
        .unwrap();
        assert_eq!(
            Allocatable::of(&n),
            Allocatable {
                resources: Resources {
                    milli_cpu: 3800,
                    memory: 7 << 30
                },
                pods: 110
            }
        );
        let cap_only: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "10"}}
        }))
        .unwrap();
        assert_eq!(Allocatable::of(&cap_only).pods, 10);
        assert_eq!(Allocatable::of(&Node::default()), Allocatable::default());
    }
}
