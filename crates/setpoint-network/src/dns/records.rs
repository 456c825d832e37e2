//! What the cluster zone answers: the record rules of CoreDNS's `kubernetes` plugin (and of the
//! Kubernetes DNS-based service discovery specification), as a pure function of the Service
//! and EndpointSlice caches. No I/O: the server asks [`Directory::resolve`] and sends the
//! result, or forwards the question when the name is not the cluster's.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use setpoint_runtime::informer::IndexFn;
use setpoint_runtime::{ObjectKey, Store};

/// CoreDNS's default TTL for the records of its `kubernetes` plugin, in seconds.
pub const DEFAULT_TTL: u32 = 5;

/// The version of the Kubernetes DNS specification served at `dns-version.<domain>` (TXT).
pub const SCHEMA_VERSION: &str = "1.1.0";

/// The label tying an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Index of Services by each of their cluster IPs.
const CLUSTER_IP_INDEX: &str = "dns.clusterIP";
/// Index of EndpointSlices by each address of their endpoints.
const ADDRESS_INDEX: &str = "dns.address";

/// Errors building a [`Directory`] or a [`Zone`].
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// The cluster domain is not a valid DNS name.
    #[error("invalid cluster domain {domain:?}: {reason}")]
    Domain {
        /// The domain as given.
        domain: String,
        /// Why it was refused.
        reason: String,
    },
    /// The caches already carry an index of the same name (a second directory on them).
    #[error("cannot index the caches: {0}")]
    Index(String),
}

/// The cluster's zone: its domain and the values of its records that do not come from objects.
#[derive(Clone, Debug)]
pub struct Zone {
    domain: Name,
    ttl: u32,
    nameserver: Option<IpAddr>,
    serial: u32,
}

impl Zone {
    /// The zone of `domain` (e.g. `cluster.local`), TTL [`DEFAULT_TTL`]. `nameserver` is the
    /// address `ns.dns.<domain>` resolves to (the server's own), as CoreDNS answers it.
    pub fn new(domain: &str, nameserver: Option<IpAddr>) -> Result<Zone, RecordsError> {
        let refuse = |reason: String| RecordsError::Domain {
            domain: domain.to_string(),
            reason,
        };
        let trimmed = domain.trim_end_matches('.');
        if trimmed.is_empty() {
            return Err(refuse("must not be empty".into()));
        }
        let mut name = Name::from_ascii(trimmed).map_err(|e| refuse(e.to_string()))?;
        name.set_fqdn(true);
        Ok(Zone {
            domain: name.to_lowercase(),
            ttl: DEFAULT_TTL,
            nameserver,
            serial: 0,
        })
    }

    /// The same zone with this SOA serial (the server uses the time it started, as CoreDNS
    /// uses the time its caches last changed).
    pub fn with_serial(mut self, serial: u32) -> Zone {
        self.serial = serial;
        self
    }

    /// The zone's domain, fully qualified and lowercase.
    pub fn domain(&self) -> &Name {
        &self.domain
    }

    /// The TTL of every record the zone answers.
    pub fn ttl(&self) -> u32 {
        self.ttl
    }

    /// `<labels>.<domain>`.
    fn name(&self, labels: &[&str]) -> Name {
        let mut name = self.domain.clone();
        for label in labels.iter().rev() {
            // Labels come from object names, validated as DNS labels by the API server.
            if let Ok(n) = name.prepend_label(*label) {
                name = n;
            }
        }
        name
    }

    /// The SOA record of the zone, as CoreDNS writes it: `ns.dns.<domain>`,
    /// `hostmaster.<domain>`, refresh 7200, retry 1800, expire 86400, minimum the TTL.
    pub fn soa(&self) -> Record {
        let soa = SOA::new(
            self.name(&["ns", "dns"]),
            self.name(&["hostmaster"]),
            self.serial,
            7200,
            1800,
            86400,
            self.ttl,
        );
        Record::from_rdata(self.domain.clone(), self.ttl, RData::SOA(soa))
    }
}

/// What the cluster zone says about one question.
#[derive(Debug, Default)]
pub struct Resolution {
    /// NOERROR (records, or none of this type: NODATA) or NXDOMAIN.
    pub code: Option<ResponseCode>,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The additional section (the addresses of SRV targets).
    pub additionals: Vec<Record>,
    /// Whether the authority section gets the zone's SOA (NODATA and NXDOMAIN answers).
    pub soa: bool,
    /// An ExternalName's target outside the zone, to be resolved upstream and appended, as
    /// CoreDNS does for the CNAME it answers.
    pub chase: Option<Name>,
}

impl Resolution {
    fn records(answers: Vec<Record>) -> Resolution {
        if answers.is_empty() {
            return Resolution::nodata();
        }
        Resolution {
            code: Some(ResponseCode::NoError),
            answers,
            ..Resolution::default()
        }
    }

    fn nodata() -> Resolution {
        Resolution {
            code: Some(ResponseCode::NoError),
            soa: true,
            ..Resolution::default()
        }
    }

    fn nxdomain() -> Resolution {
        Resolution {
            code: Some(ResponseCode::NXDomain),
            soa: true,
            ..Resolution::default()
        }
    }
}

/// The objects the zone is made of: the Service and EndpointSlice caches (an informer's, or
/// fixtures), with the reverse indexes PTR answers read.
#[derive(Clone)]
pub struct Directory {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
}

impl Directory {
    /// A directory over these caches. It adds its indexes to them, so build it before the
    /// informers start (it works after too, at the cost of one indexing pass).
    pub fn new(
        services: Store<Service>,
        slices: Store<EndpointSlice>,
    ) -> Result<Directory, RecordsError> {
        let by_ip: IndexFn<Service> = Arc::new(|s: &Service| {
            let Some(spec) = s.spec.as_ref() else {
                return Vec::new();
            };
            let mut ips: BTreeSet<String> = spec.cluster_ips.iter().flatten().cloned().collect();
            ips.extend(spec.cluster_ip.iter().cloned());
            ips.into_iter()
                .filter_map(|ip| ip.parse::<IpAddr>().ok())
                .map(|ip| ip.to_string())
                .collect()
        });
        let by_address: IndexFn<EndpointSlice> = Arc::new(|s: &EndpointSlice| {
            let ips: BTreeSet<String> = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.iter())
                .filter_map(|a| a.parse::<IpAddr>().ok())
                .map(|ip| ip.to_string())
                .collect();
            ips.into_iter().collect()
        });
        services
            .add_index(CLUSTER_IP_INDEX, by_ip)
            .map_err(|e| RecordsError::Index(e.to_string()))?;
        slices
            .add_index(ADDRESS_INDEX, by_address)
            .map_err(|e| RecordsError::Index(e.to_string()))?;
        Ok(Directory { services, slices })
    }

    /// Whether both caches hold their first LIST.
    pub fn has_synced(&self) -> bool {
        self.services.has_synced() && self.slices.has_synced()
    }

    /// The answer to `name`/`qtype`, or `None` when the name is not the cluster's (nor a
    /// reverse name of one of its addresses): the server forwards those, as CoreDNS's
    /// `fallthrough in-addr.arpa ip6.arpa` and `forward . /etc/resolv.conf` do.
    pub fn resolve(&self, zone: &Zone, name: &Name, qtype: RecordType) -> Option<Resolution> {
        let name = name.to_lowercase();
        if is_reverse(&name) {
            return self.reverse(zone, &name, qtype);
        }
        if !zone.domain.zone_of(&name) {
            return None;
        }
        let relative = name.num_labels() - zone.domain.num_labels();
        let labels: Vec<String> = name
            .iter()
            .take(relative as usize)
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        let l: Vec<&str> = labels.iter().map(String::as_str).collect();
        Some(match l.as_slice() {
            [] => apex(zone, qtype),
            ["dns-version"] => match qtype {
                RecordType::TXT => Resolution::records(vec![Record::from_rdata(
                    name.clone(),
                    zone.ttl,
                    RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_string()])),
                )]),
                _ => Resolution::nodata(),
            },
            ["ns", "dns"] => match (qtype, zone.nameserver) {
                (_, None) => Resolution::nxdomain(),
                (t, Some(ip)) => Resolution::records(address_records(&name, zone.ttl, t, [ip])),
            },
            // The structural names exist (they have names beneath them) but hold no records.
            ["dns"] | ["svc"] | ["pod"] => Resolution::nodata(),
            [namespace, "svc"] => {
                if self.services.by_namespace(namespace).is_empty() {
                    Resolution::nxdomain()
                } else {
                    Resolution::nodata()
                }
            }
            [service, namespace, "svc"] => self.service(zone, &name, namespace, service, qtype),
            [endpoint, service, namespace, "svc"] => {
                self.endpoint(zone, &name, namespace, service, endpoint, qtype)
            }
            [port, proto, service, namespace, "svc"]
                if port.starts_with('_') && proto.starts_with('_') =>
            {
                if qtype != RecordType::SRV {
                    // CoreDNS answers a port name's only records, SRV; other types: no data.
                    match self.srv(
                        zone,
                        &name,
                        namespace,
                        service,
                        Some((&port[1..], &proto[1..])),
                    ) {
                        Some(_) => Resolution::nodata(),
                        None => Resolution::nxdomain(),
                    }
                } else {
                    self.srv(
                        zone,
                        &name,
                        namespace,
                        service,
                        Some((&port[1..], &proto[1..])),
                    )
                    .unwrap_or_else(Resolution::nxdomain)
                }
            }
            [_namespace, "pod"] => Resolution::nodata(),
            [dashed, _namespace, "pod"] => pod(zone, &name, dashed, qtype),
            _ => Resolution::nxdomain(),
        })
    }

    fn service_object(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.get(&ObjectKey::new(Some(namespace), name))
    }

    /// The ready addresses of a Service's endpoints, with the name each is known by
    /// (`hostname`, else the address with dashes), deduplicated, in a stable order.
    fn ready_endpoints(&self, namespace: &str, service: &str) -> Vec<(String, IpAddr)> {
        let mut seen = BTreeSet::new();
        let mut slices: Vec<Arc<EndpointSlice>> = self
            .slices
            .by_label(SERVICE_NAME_LABEL, service)
            .into_iter()
            .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
            .collect();
        slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut out = Vec::new();
        for slice in slices {
            for endpoint in &slice.endpoints {
                // A missing `ready` means ready (the API's documented reading); the
                // EndpointSlice controller already sets it for `publishNotReadyAddresses`.
                let ready = endpoint
                    .conditions
                    .as_ref()
                    .and_then(|c| c.ready)
                    .unwrap_or(true);
                if !ready {
                    continue;
                }
                for address in &endpoint.addresses {
                    let Ok(ip) = address.parse::<IpAddr>() else {
                        continue;
                    };
                    if seen.insert(ip) {
                        let label = endpoint.hostname.clone().unwrap_or_else(|| dashed(ip));
                        out.push((label, ip));
                    }
                }
            }
        }
        out
    }

    fn service(
        &self,
        zone: &Zone,
        name: &Name,
        namespace: &str,
        service: &str,
        qtype: RecordType,
    ) -> Resolution {
        let Some(svc) = self.service_object(namespace, service) else {
            return Resolution::nxdomain();
        };
        let spec = svc.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some("ExternalName") {
            return external_name(zone, name, spec.external_name.as_deref(), qtype);
        }
        if qtype == RecordType::SRV {
            return self
                .srv(zone, name, namespace, service, None)
                .unwrap_or_else(Resolution::nxdomain);
        }
        if is_headless(&svc) {
            let endpoints = self.ready_endpoints(namespace, service);
            // A headless Service without ready endpoints has no name at all: NXDOMAIN, as
            // kube-dns and CoreDNS answer (the DNS specification was amended to match).
            if endpoints.is_empty() {
                return Resolution::nxdomain();
            }
            return Resolution::records(address_records(
                name,
                zone.ttl,
                qtype,
                endpoints.into_iter().map(|(_, ip)| ip),
            ));
        }
        Resolution::records(address_records(name, zone.ttl, qtype, cluster_ips(&svc)))
    }

    fn endpoint(
        &self,
        zone: &Zone,
        name: &Name,
        namespace: &str,
        service: &str,
        endpoint: &str,
        qtype: RecordType,
    ) -> Resolution {
        if self.service_object(namespace, service).is_none() {
            return Resolution::nxdomain();
        }
        let ips: Vec<IpAddr> = self
            .ready_endpoints(namespace, service)
            .into_iter()
            .filter(|(label, _)| label.eq_ignore_ascii_case(endpoint))
            .map(|(_, ip)| ip)
            .collect();
        if ips.is_empty() {
            return Resolution::nxdomain();
        }
        Resolution::records(address_records(name, zone.ttl, qtype, ips))
    }

    /// SRV records of a Service: of one named port (`port` = `(name, protocol)`) or of all
    /// its ports. `None` when the Service, or the named port, does not exist.
    fn srv(
        &self,
        zone: &Zone,
        name: &Name,
        namespace: &str,
        service: &str,
        port: Option<(&str, &str)>,
    ) -> Option<Resolution> {
        let svc = self.service_object(namespace, service)?;
        let spec = svc.spec.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some("ExternalName") {
            return Some(external_name(
                zone,
                name,
                spec.external_name.as_deref(),
                RecordType::SRV,
            ));
        }
        let matches = |port_name: Option<&str>, protocol: Option<&str>| match port {
            None => true,
            Some((want, want_proto)) => {
                port_name.is_some_and(|n| n.eq_ignore_ascii_case(want))
                    && protocol.unwrap_or("TCP").eq_ignore_ascii_case(want_proto)
            }
        };
        let service_name = zone.name(&[service, namespace, "svc"]);
        // (target, port, address of the target)
        let mut targets: Vec<(Name, u16, IpAddr)> = Vec::new();
        if is_headless(&svc) {
            let mut ports: BTreeSet<u16> = BTreeSet::new();
            for slice in self.slices.by_label(SERVICE_NAME_LABEL, service) {
                if slice.metadata.namespace.as_deref() != Some(namespace) {
                    continue;
                }
                for p in slice.ports.iter().flatten() {
                    if matches(p.name.as_deref(), p.protocol.as_deref()) {
                        if let Some(n) = p.port.and_then(|n| u16::try_from(n).ok()) {
                            ports.insert(n);
                        }
                    }
                }
            }
            let endpoints = self.ready_endpoints(namespace, service);
            if port.is_some() && (ports.is_empty() || endpoints.is_empty()) {
                return None;
            }
            for (label, ip) in endpoints {
                for p in &ports {
                    targets.push((zone.name(&[&label, service, namespace, "svc"]), *p, ip));
                }
            }
        } else {
            let ips = cluster_ips(&svc);
            for p in spec.ports.iter().flatten() {
                if matches(p.name.as_deref(), p.protocol.as_deref()) {
                    if let Ok(n) = u16::try_from(p.port) {
                        for ip in &ips {
                            targets.push((service_name.clone(), n, *ip));
                        }
                    }
                }
            }
            if port.is_some() && targets.is_empty() {
                return None;
            }
        }
        // Every record has priority 0 and they share a weight of 100 (CoreDNS's split).
        let mut seen = BTreeSet::new();
        targets.retain(|(target, p, _)| seen.insert((target.clone(), *p)));
        let weight = if targets.is_empty() {
            0
        } else {
            (100 / targets.len()) as u16
        };
        let mut resolution = Resolution::records(
            targets
                .iter()
                .map(|(target, p, _)| {
                    Record::from_rdata(
                        name.clone(),
                        zone.ttl,
                        RData::SRV(SRV::new(0, weight, *p, target.clone())),
                    )
                })
                .collect(),
        );
        let mut added = BTreeSet::new();
        for (target, _, ip) in targets {
            if added.insert((target.clone(), ip)) {
                let rtype = if ip.is_ipv4() {
                    RecordType::A
                } else {
                    RecordType::AAAA
                };
                resolution
                    .additionals
                    .extend(address_records(&target, zone.ttl, rtype, [ip]));
            }
        }
        Some(resolution)
    }

    /// PTR for a Service's cluster IP or an endpoint's address; `None` (forwarded) for any
    /// other address, as CoreDNS's default `fallthrough in-addr.arpa ip6.arpa`.
    fn reverse(&self, zone: &Zone, name: &Name, qtype: RecordType) -> Option<Resolution> {
        let ip = reverse_ip(name)?;
        let key = ip.to_string();
        let mut targets: BTreeSet<Name> = BTreeSet::new();
        for svc in self.services.by_index(CLUSTER_IP_INDEX, &key) {
            if let (Some(ns), Some(n)) = (&svc.metadata.namespace, &svc.metadata.name) {
                if !is_headless(&svc) {
                    targets.insert(zone.name(&[n, ns, "svc"]));
                }
            }
        }
        for slice in self.slices.by_index(ADDRESS_INDEX, &key) {
            let (Some(ns), Some(service)) = (
                slice.metadata.namespace.as_deref(),
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL)),
            ) else {
                continue;
            };
            for (label, addr) in self.ready_endpoints(ns, service) {
                if addr == ip {
                    targets.insert(zone.name(&[&label, service, ns, "svc"]));
                }
            }
        }
        if targets.is_empty() {
            return None;
        }
        if qtype != RecordType::PTR {
            return Some(Resolution::nodata());
        }
        Some(Resolution::records(
            targets
                .into_iter()
                .map(|t| Record::from_rdata(name.clone(), zone.ttl, RData::PTR(PTR(t))))
                .collect(),
        ))
    }
}

/// The zone apex: SOA and NS (`ns.dns.<domain>`); other types have no data.
fn apex(zone: &Zone, qtype: RecordType) -> Resolution {
    match qtype {
        RecordType::SOA => Resolution::records(vec![zone.soa()]),
        RecordType::NS => Resolution::records(vec![Record::from_rdata(
            zone.domain.clone(),
            zone.ttl,
            RData::NS(NS(zone.name(&["ns", "dns"]))),
        )]),
        _ => Resolution::nodata(),
    }
}

/// An ExternalName Service: a CNAME to its target, whatever the type asked (the resolver
/// follows it), and the target's records chased when the type is not CNAME itself.
fn external_name(zone: &Zone, name: &Name, target: Option<&str>, qtype: RecordType) -> Resolution {
    let Some(target) = target
        .map(|t| t.trim_end_matches('.'))
        .filter(|t| !t.is_empty())
        .and_then(|t| Name::from_ascii(t).ok())
    else {
        return Resolution::nxdomain();
    };
    let mut target = target;
    target.set_fqdn(true);
    let mut resolution = Resolution::records(vec![Record::from_rdata(
        name.clone(),
        zone.ttl,
        RData::CNAME(CNAME(target.clone())),
    )]);
    if qtype != RecordType::CNAME {
        resolution.chase = Some(target);
    }
    resolution
}

/// `<a-b-c-d>.<namespace>.pod.<domain>`: CoreDNS's `pods insecure`, the address read from the
/// name without looking for the pod.
fn pod(zone: &Zone, name: &Name, dashed: &str, qtype: RecordType) -> Resolution {
    let ip = if dashed.contains("--") || dashed.matches('-').count() > 3 {
        dashed
            .replace('-', ":")
            .parse::<Ipv6Addr>()
            .ok()
            .map(IpAddr::V6)
    } else {
        dashed
            .replace('-', ".")
            .parse::<Ipv4Addr>()
            .ok()
            .map(IpAddr::V4)
    };
    match ip {
        Some(ip) => Resolution::records(address_records(name, zone.ttl, qtype, [ip])),
        None => Resolution::nxdomain(),
    }
}

/// A and AAAA records of `name` for the addresses of the family `qtype` asks; none for other
/// types (so the caller answers NODATA).
fn address_records(
    name: &Name,
    ttl: u32,
    qtype: RecordType,
    ips: impl IntoIterator<Item = IpAddr>,
) -> Vec<Record> {
    ips.into_iter()
        .filter_map(|ip| match (qtype, ip) {
            (RecordType::A, IpAddr::V4(v4)) => Some(RData::A(A(v4))),
            (RecordType::AAAA, IpAddr::V6(v6)) => Some(RData::AAAA(AAAA(v6))),
            _ => None,
        })
        .map(|rdata| Record::from_rdata(name.clone(), ttl, rdata))
        .collect()
}

/// A Service is headless when its cluster IP is `None`.
fn is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// A Service's cluster IPs (`clusterIPs`, else `clusterIP`).
fn cluster_ips(svc: &Service) -> Vec<IpAddr> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<IpAddr> = spec
        .cluster_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    spec.cluster_ip
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// An address as a DNS label: `10-1-2-3`, or the IPv6 text with `:` as `-`.
pub fn dashed(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

fn is_reverse(name: &Name) -> bool {
    let labels: Vec<&[u8]> = name.iter().collect();
    labels.len() >= 2
        && labels[labels.len() - 1].eq_ignore_ascii_case(b"arpa")
        && (labels[labels.len() - 2].eq_ignore_ascii_case(b"in-addr")
            || labels[labels.len() - 2].eq_ignore_ascii_case(b"ip6"))
}

/// The address a full reverse name stands for (`4.3.2.1.in-addr.arpa` is `1.2.3.4`); `None`
/// for a partial name (a network), which no Service or endpoint owns.
fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let labels: Vec<String> = name
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    let (body, kind) = labels.split_at(labels.len().checked_sub(2)?);
    if kind[0] == "in-addr" {
        if body.len() != 4 {
            return None;
        }
        let mut octets = [0u8; 4];
        for (i, l) in body.iter().rev().enumerate() {
            octets[i] = l.parse().ok()?;
        }
        return Some(IpAddr::V4(Ipv4Addr::from(octets)));
    }
    if body.len() != 32 {
        return None;
    }
    let mut value: u128 = 0;
    for l in body.iter().rev() {
        if l.len() != 1 {
            return None;
        }
        value = (value << 4) | u128::from(u8::from_str_radix(l, 16).ok()?);
    }
    Some(IpAddr::V6(Ipv6Addr::from(value)))
}

#[cfg(test)]
mod tests;
