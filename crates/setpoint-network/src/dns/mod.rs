//! The cluster DNS server: the model of CoreDNS's `kubernetes` plugin.
//!
//! - [`records`]: what the cluster zone answers, a pure function of the Service and
//!   EndpointSlice caches (A/AAAA, SRV, PTR, CNAME for ExternalName, `pods insecure`,
//!   NXDOMAIN vs NODATA as CoreDNS answers).
//! - [`server`]: UDP and TCP on one address, forwarding every other name to the host's
//!   resolvers, with bounded sizes and concurrency.
//! - [`resolvconf`]: the host's `resolv.conf` read, and a pod's composed from its `dnsPolicy`
//!   and `dnsConfig` as the kubelet composes it.
//! - [`node`]: the server as a node runs it: its addresses, and what its pods are told.
//! - [`kubedns`]: the `kube-dns` Service and the EndpointSlices nodes publish for it.
//! - [`client`]: one question to one server, for tests and checks.

pub mod client;
pub mod kubedns;
pub mod node;
pub mod records;
pub mod resolvconf;
pub mod server;

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use setpoint_runtime::informer::Scope;
use setpoint_runtime::SharedInformers;

/// The DNS wire-format crate the server and [`client`] speak, for callers naming its types.
pub use hickory_proto as proto;
pub use records::{Directory, Zone};
pub use resolvconf::{ClusterDns, PodDns, ResolvConf};
pub use server::{DnsServer, Upstreams};

/// The default cluster domain (the kubelet's `--cluster-domain` in kubeadm clusters).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// Errors starting the DNS server.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The zone or the caches' indexes.
    #[error(transparent)]
    Records(#[from] records::RecordsError),
    /// Binding the listeners.
    #[error(transparent)]
    Server(#[from] server::ServerError),
}

/// Starts the DNS server on `listen`, answering for `domain` from Service and EndpointSlice
/// informers of `informers` (shared with whatever else the process runs on them; started here
/// if they were not yet) and forwarding the rest to `upstreams`.
pub async fn start(
    informers: &SharedInformers,
    listen: SocketAddr,
    domain: &str,
    upstreams: Upstreams,
) -> Result<DnsServer, DnsError> {
    Ok(start_parts(informers, listen, domain, upstreams).await?.0)
}

/// [`start`], also returning the directory and zone, so more listeners can share them.
async fn start_parts(
    informers: &SharedInformers,
    listen: SocketAddr,
    domain: &str,
    upstreams: Upstreams,
) -> Result<(DnsServer, Directory, Zone), DnsError> {
    let services = informers.typed::<Service>(Scope::all());
    let slices = informers.typed::<EndpointSlice>(Scope::all());
    let directory = Directory::new(services.store(), slices.store())?;
    services.start();
    slices.start();
    let nameserver: Option<IpAddr> = (!listen.ip().is_unspecified()).then_some(listen.ip());
    let serial = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or_default();
    let zone = Zone::new(domain, nameserver)?.with_serial(serial);
    let server = DnsServer::start(listen, directory.clone(), zone.clone(), upstreams).await?;
    Ok((server, directory, zone))
}
