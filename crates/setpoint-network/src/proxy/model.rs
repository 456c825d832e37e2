//! What the proxy needs of Services and EndpointSlices, read out of the API objects: one
//! [`ServicePort`] per port of a Service that has virtual addresses, and its endpoints as the
//! slices list them. kube-proxy's `ServicePortInfo` and `Endpoint`, reduced to what the rules
//! use.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service port's transport protocol, as nftables names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// `TCP` (the default).
    Tcp,
    /// `UDP`.
    Udp,
    /// `SCTP`.
    Sctp,
}

impl Protocol {
    /// The Service's `protocol` value; `None` (absent) is TCP, as the API defaults it.
    pub fn parse(value: Option<&str>) -> Option<Protocol> {
        match value.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The name nftables uses (`meta l4proto tcp`).
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// Identifies one port of one Service: `<namespace>/<name>:<port name>` as kube-proxy's
/// `ServicePortName`, plus the protocol.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The port's name (empty for a Service's single unnamed port).
    pub port_name: String,
    /// The port's protocol.
    pub protocol: Protocol,
}

impl PortKey {
    /// `ns/name/tcp/portname`, the readable part of the chain names (kube-proxy's form).
    pub fn chain_suffix(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.namespace,
            self.name,
            self.protocol.nft(),
            self.port_name
        )
    }
}

/// One port of a Service the proxy routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// Which port of which Service.
    pub key: PortKey,
    /// `spec.clusterIP` (absent for headless Services, which are not routed at all).
    pub cluster_ip: Ipv4Addr,
    /// `spec.ports[].port`.
    pub port: u16,
    /// `spec.ports[].nodePort`, for `NodePort` and `LoadBalancer` Services.
    pub node_port: Option<u16>,
    /// `spec.externalIPs` and `status.loadBalancer.ingress[].ip`: addresses that reach the
    /// Service from outside as its node port does.
    pub external_ips: Vec<Ipv4Addr>,
    /// `sessionAffinity: ClientIP`'s `timeoutSeconds` (10800 by default), `None` without affinity.
    pub affinity_timeout: Option<u32>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `externalTrafficPolicy: Local` (only for Services reachable from outside).
    pub external_local: bool,
}

impl ServicePort {
    /// Whether anything reaches this port from outside the cluster (node port or external
    /// addresses), which is when `externalTrafficPolicy` applies.
    pub fn is_external(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty()
    }
}

/// One endpoint of a Service port, from an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// The endpoint's address.
    pub ip: Ipv4Addr,
    /// The port traffic goes to (the resolved `targetPort`).
    pub port: u16,
    /// `conditions.ready` (absent counts as ready, as upstream reads it).
    pub ready: bool,
    /// `conditions.serving` (absent: as `ready`).
    pub serving: bool,
    /// `conditions.terminating` (absent: not terminating).
    pub terminating: bool,
    /// `nodeName`, which the `Local` traffic policies compare with the proxy's node.
    pub node_name: Option<String>,
}

impl Endpoint {
    /// `ip/port`, the readable part of the endpoint's chain name.
    pub fn chain_suffix(&self) -> String {
        format!("{}/{}", self.ip, self.port)
    }
}

/// The proxy's whole input: every routed Service port with its endpoints.
pub type ServiceMap = BTreeMap<PortKey, (ServicePort, Vec<Endpoint>)>;

/// The ports of `service` that the proxy routes: Services with an IPv4 cluster IP (not
/// headless, not `ExternalName`), with a known protocol.
pub fn service_ports(service: &Service) -> Vec<ServicePort> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Vec::new();
    }
    let Some(cluster_ip) = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return Vec::new();
    };
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let name = service.metadata.name.clone().unwrap_or_default();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let mut external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    if type_ == "LoadBalancer" {
        external_ips.extend(
            service
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.as_deref()?.parse::<Ipv4Addr>().ok()),
        );
    }
    external_ips.sort();
    external_ips.dedup();
    let with_node_ports = matches!(type_, "NodePort" | "LoadBalancer");
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let external_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let mut out = Vec::new();
    for p in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            continue;
        };
        let Ok(port) = u16::try_from(p.port) else {
            continue;
        };
        let node_port = if with_node_ports {
            p.node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0)
        } else {
            None
        };
        let sp = ServicePort {
            key: PortKey {
                namespace: namespace.clone(),
                name: name.clone(),
                port_name: p.name.clone().unwrap_or_default(),
                protocol,
            },
            cluster_ip,
            port,
            node_port,
            external_ips: external_ips.clone(),
            affinity_timeout,
            internal_local,
            external_local: false,
        };
        let external_local = external_local && sp.is_external();
        out.push(ServicePort {
            external_local,
            ..sp
        });
    }
    out
}

/// `sessionAffinityConfig.clientIP.timeoutSeconds`' default: three hours.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10800;

/// The endpoints `slice` lists for `key` (IPv4 slices only; the slice's port of the same name
/// and protocol; each endpoint's first address, as kube-proxy takes it).
pub fn slice_endpoints(slice: &EndpointSlice, key: &PortKey) -> Vec<Endpoint> {
    if slice.address_type != "IPv4" {
        return Vec::new();
    }
    let port = slice.ports.iter().flatten().find(|p| {
        p.name.as_deref().unwrap_or("") == key.port_name
            && Protocol::parse(p.protocol.as_deref()) == Some(key.protocol)
    });
    let Some(port) = port
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
    else {
        return Vec::new();
    };
    slice
        .endpoints
        .iter()
        .filter_map(|e| {
            let ip = e.addresses.first()?.parse::<Ipv4Addr>().ok()?;
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            Some(Endpoint {
                ip,
                port,
                ready,
                serving: c.and_then(|c| c.serving).unwrap_or(ready),
                terminating: c.and_then(|c| c.terminating).unwrap_or(false),
                node_name: e.node_name.clone(),
            })
        })
        .collect()
}

/// Every routed Service port with its endpoints, from the Services and EndpointSlices the
/// informers hold. An endpoint listed by two slices (as during a slice's rewrite) counts once.
pub fn service_map<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> ServiceMap {
    let mut by_service: BTreeMap<(String, String), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        let Some(svc) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
        else {
            continue;
        };
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        by_service.entry((ns, svc.clone())).or_default().push(slice);
    }
    let mut map = ServiceMap::new();
    for service in services {
        for sp in service_ports(service) {
            let slices = by_service
                .get(&(sp.key.namespace.clone(), sp.key.name.clone()))
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut endpoints: Vec<Endpoint> = slices
                .iter()
                .flat_map(|s| slice_endpoints(s, &sp.key))
                .collect();
            endpoints.sort();
            endpoints.dedup_by(|a, b| a.ip == b.ip && a.port == b.port);
            map.insert(sp.key.clone(), (sp, endpoints));
        }
    }
    map
}

/// The endpoints traffic may go to, as upstream's `CategorizeEndpoints` picks them: the ready
/// ones; when none is ready, the ones still serving while terminating (so a Service whose pods
/// are all shutting down keeps answering until they stop).
pub fn usable<'a>(endpoints: impl IntoIterator<Item = &'a Endpoint> + Clone) -> Vec<&'a Endpoint> {
    let ready: Vec<&Endpoint> = endpoints.clone().into_iter().filter(|e| e.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    endpoints
        .into_iter()
        .filter(|e| e.serving && e.terminating)
        .collect()
}
