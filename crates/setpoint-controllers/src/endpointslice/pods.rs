//! The rules that decide whether and how a pod backs a Service, shared by the EndpointSlice
//! and the Endpoints controllers (upstream's `podutil.IsPodReady`, `podutil.FindPort`,
//! `endpointsliceutil.ShouldPodBeInEndpoints` and `ShouldSetHostname`).

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use setpoint_api::selector::LabelSelector;

/// The label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The label a headless Service's endpoints carry.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The node label holding its zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The annotation recording when the change an endpoints object reflects happened.
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Whether the pod's `Ready` condition is `True`.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// When the pod's `Ready` condition last changed, as RFC 3339 (upstream's pod trigger time).
pub fn ready_transition(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// The pod's IPv4 address, if it has one (`status.podIPs`, then `status.podIP`).
pub fn ipv4(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let listed = status.pod_ips.iter().flatten().map(|p| p.ip.as_str());
    listed
        .chain(status.pod_ip.as_deref())
        .find(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
}

fn terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether a pod belongs in a Service's endpoints at all: it has an address, has not
/// finished, and is not terminating unless `include_terminating`.
pub fn should_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    if ipv4(pod).is_none() || terminal(pod) {
        return false;
    }
    include_terminating || pod.metadata.deletion_timestamp.is_none()
}

/// Whether the pod's endpoint names its `hostname`: it has one and its `subdomain` is the
/// Service's name (in the Service's namespace).
pub fn should_set_hostname(pod: &Pod, service: &Service) -> bool {
    let spec = pod.spec.as_ref();
    let hostname = spec.and_then(|s| s.hostname.as_deref()).unwrap_or_default();
    let subdomain = spec
        .and_then(|s| s.subdomain.as_deref())
        .unwrap_or_default();
    !hostname.is_empty()
        && Some(subdomain) == service.metadata.name.as_deref()
        && pod.metadata.namespace == service.metadata.namespace
}

/// The container port a Service port's `targetPort` means on this pod: a number as it is
/// (the Service's `port` when unset), a name looked up among the pod's containers' ports
/// with the same protocol. `None` when the name is not found.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => match name.parse::<i32>() {
            Ok(n) => Some(n),
            Err(_) => pod
                .spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port),
        },
    }
}

/// The Service's pod selector, `None` when it has none (such a Service's endpoints are
/// managed by its user and the controllers leave them alone).
pub fn selector(service: &Service) -> Option<LabelSelector> {
    let labels = service.spec.as_ref()?.selector.as_ref()?;
    if labels.is_empty() {
        return None;
    }
    let v = serde_json::json!({ "matchLabels": labels });
    LabelSelector::from_label_selector_json(&v).ok()
}

/// Whether the selector picks this pod (in the Service's namespace).
pub fn selects(selector: &LabelSelector, service: &Service, pod: &Pod) -> bool {
    if pod.metadata.namespace != service.metadata.namespace {
        return false;
    }
    let labels = pod.metadata.labels.as_ref();
    selector.matches(|k| labels.and_then(|l| l.get(k)).map(String::as_str))
}

/// Whether the Service is headless (`clusterIP: None`).
pub fn is_headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// Whether the Service publishes the addresses of pods that are not ready.
pub fn publish_not_ready(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn named_ports_resolve_per_pod_and_protocol() {
        let p = pod(json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "ports": [{"name": "http", "containerPort": 8080},
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]}}));
        let port = |v: serde_json::Value| -> ServicePort { serde_json::from_value(v).unwrap() };
        assert_eq!(
            find_port(&p, &port(json!({"port": 80, "targetPort": "http"}))),
            Some(8080)
        );
        assert_eq!(
            find_port(&p, &port(json!({"port": 80, "targetPort": 9000}))),
            Some(9000)
        );
        assert_eq!(find_port(&p, &port(json!({"port": 80}))), Some(80));
        assert_eq!(
            find_port(&p, &port(json!({"port": 53, "targetPort": "dns"}))),
            None
        );
        assert_eq!(
            find_port(
                &p,
                &port(json!({"port": 53, "protocol": "UDP", "targetPort": "dns"}))
            ),
            Some(53)
        );
        assert_eq!(
            find_port(&p, &port(json!({"port": 80, "targetPort": "nope"}))),
            None
        );
    }

    #[test]
    fn only_addressed_unfinished_pods_are_endpoints() {
        let running = pod(json!({"metadata": {"name": "a"}, "status": {"podIP": "10.0.0.1"}}));
        assert!(should_be_in_endpoints(&running, false));
        let no_ip = pod(json!({"metadata": {"name": "a"}, "status": {}}));
        assert!(!should_be_in_endpoints(&no_ip, true));
        let done = pod(json!({"metadata": {"name": "a"},
            "status": {"podIP": "10.0.0.1", "phase": "Succeeded"}}));
        assert!(!should_be_in_endpoints(&done, true));
        let going = pod(
            json!({"metadata": {"name": "a", "deletionTimestamp": "2024-01-01T00:00:00Z"},
            "status": {"podIP": "10.0.0.1"}}),
        );
        assert!(should_be_in_endpoints(&going, true));
        assert!(!should_be_in_endpoints(&going, false));
    }
}
