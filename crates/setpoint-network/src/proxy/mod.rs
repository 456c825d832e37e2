//! The service proxy: kube-proxy's job, in the model of its nftables mode.
//!
//! [`model`] reads Services and EndpointSlices into Service ports and endpoints, [`rules`]
//! turns them into the node's ruleset and the transaction from the last one (both pure), and
//! [`nft`] applies transactions. [`run`] ties them to the informers: every change wakes the
//! sync loop, which waits out the minimum interval since its last sync, computes the whole
//! desired ruleset and applies only the difference (a full replacement at start, after a
//! failure, and every `full_sync_interval`).

pub mod bridge;
pub mod localnet;
pub mod model;
pub mod nft;
pub mod rules;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use setpoint_runtime::client::Client;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter};
use setpoint_runtime::informer::{Event, Scope, SharedInformers};
use tokio::sync::Notify;
use tracing::Instrument;

pub use nft::{Nft, NftError};
pub use rules::NodeInfo;

/// The component name the proxy's Events carry, as kube-proxy's.
pub const COMPONENT: &str = "kube-proxy";

/// How the proxy runs on one node.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// The node's name and pod network.
    pub node: NodeInfo,
    /// The nftables table (family `ip`) the proxy owns; see [`table_name`].
    pub table: String,
    /// Changes closer together than this are applied together (kube-proxy's
    /// `--min-sync-period`; short, so an endpoint that stops being ready leaves the rules
    /// well within a second).
    pub min_sync_interval: Duration,
    /// A full replacement of the table this often, repairing anything changed behind the
    /// proxy's back (kube-proxy: hourly).
    pub full_sync_interval: Duration,
}

impl ProxyConfig {
    /// The defaults for `node_name`, with the table named after `identity`.
    pub fn new(node_name: &str, identity: &str) -> ProxyConfig {
        ProxyConfig {
            node: NodeInfo {
                node_name: node_name.into(),
                cluster_cidr: None,
                // Until the proxy has made sure of them at start.
                bridge_netfilter: false,
                route_localnet: false,
            },
            table: table_name(identity),
            min_sync_interval: Duration::from_millis(100),
            full_sync_interval: Duration::from_secs(3600),
        }
    }
}

/// The table of the proxy identified by `identity` (its node's state directory, say):
/// `setpoint-<hash>`, so that two clusters or two agents on one machine each own a table and
/// never touch each other's rules, and a restarted agent finds its own again.
pub fn table_name(identity: &str) -> String {
    format!("setpoint-{}", rules::short_hash(identity).to_lowercase())
}

/// Why the proxy stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The informers could not sync.
    #[error("proxy informers: {0}")]
    Informer(#[from] setpoint_runtime::informer::InformerError),
}

/// Runs the service proxy until `shutdown`: programs `config.table` from the Services and
/// EndpointSlices `client` can list and watch. When this process cannot program nftables
/// (no `nft`, or no `CAP_NET_ADMIN`), it says so in its log and in a Warning Event on the
/// Node, and waits for `shutdown` doing nothing else. At `shutdown` the table is deleted
/// ([`cleanup`]): connections already established keep their translation (it lives in
/// conntrack), and a stopped cluster's table must not keep catching the addresses another
/// cluster on this machine hands out (`10.96.0.1` is every cluster's). A node killed without
/// a shutdown leaves its table, which its next start replaces.
pub async fn run(
    client: Client,
    config: ProxyConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let span = tracing::info_span!("proxy", node = %config.node.node_name, table = %config.table);
    run_in(client, config, shutdown).instrument(span).await
}

async fn run_in(
    client: Client,
    config: ProxyConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ProxyError> {
    let recorder = EventRecorder::new(client.clone(), Reporter::new(COMPONENT));
    let node_ref = ObjectReference {
        kind: Some("Node".into()),
        api_version: Some("v1".into()),
        name: Some(config.node.node_name.clone()),
        ..ObjectReference::default()
    };
    if let Err(e) = Nft::probe().await {
        let message = format!(
            "the service proxy cannot program nftables ({e}); Services are not routed on this node"
        );
        tracing::warn!(error = %e, "{message}");
        recorder.publish(&node_ref, EventType::Warning, "ProxyUnavailable", &message);
        recorder.flush().await;
        shutdown.await;
        return Ok(());
    }
    let mut config = config;
    config.node.bridge_netfilter = match bridge::ensure().await {
        Ok(()) => true,
        Err(e) => {
            match &config.node.cluster_cidr {
                Some(cidr) => tracing::warn!(
                    error = %e,
                    "bridged pod traffic does not pass nftables; traffic from {cidr} to Service endpoints is masqueraded instead"
                ),
                None => tracing::warn!(
                    error = %e,
                    "bridged pod traffic does not pass nftables and no --cluster-cidr is known: pods cannot reach a Service's endpoints on their own bridge"
                ),
            }
            false
        }
    };
    config.node.route_localnet = match localnet::ensure().await {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "node ports do not answer on 127.0.0.0/8, and a load balancer there reaches only endpoints on the loopback"
            );
            false
        }
    };
    let informers = SharedInformers::lean(client);
    let services = informers.typed::<Service>(Scope::all());
    let slices = informers.typed::<EndpointSlice>(Scope::all());
    let wake = Arc::new(Notify::new());
    let on_service = {
        let wake = wake.clone();
        Arc::new(move |_: &Event<Service>| wake.notify_one())
    };
    let on_slice = {
        let wake = wake.clone();
        Arc::new(move |_: &Event<EndpointSlice>| wake.notify_one())
    };
    services.subscribe(on_service);
    slices.subscribe(on_slice);
    informers.start();
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        r = informers.wait_synced() => r?,
        () = &mut shutdown => {
            informers.shutdown().await;
            remove_table(&config.table).await;
            return Ok(());
        }
    }
    recorder.publish(
        &node_ref,
        EventType::Normal,
        "Starting",
        "Starting kube-proxy.",
    );
    let nft = Nft::new(&config.table);
    let mut applied: Option<rules::Ruleset> = None;
    let mut last_full = Instant::now();
    let mut last_sync: Option<tokio::time::Instant> = None;
    let mut failures = 0u32;
    loop {
        if let Some(last) = last_sync {
            // Coalesce a burst of changes into one transaction.
            tokio::select! {
                () = tokio::time::sleep_until(last + config.min_sync_interval) => {}
                () = &mut shutdown => break,
            }
        }
        last_sync = Some(tokio::time::Instant::now());
        let map = model::service_map(
            services.store().list().iter().map(|s| &**s),
            slices.store().list().iter().map(|s| &**s),
        );
        let next = rules::desired(&map, &config.node);
        let full = applied.is_none() || last_full.elapsed() >= config.full_sync_interval;
        let started = Instant::now();
        let result = match (&applied, full) {
            (Some(prev), false) => {
                let ops = rules::partial_sync(prev, &next);
                if ops.is_empty() {
                    Ok(0)
                } else {
                    nft.apply(&rules::render(&config.table, &ops))
                        .await
                        .map(|()| ops.len())
                }
            }
            _ => full_sync(&nft, &next).await,
        };
        match result {
            Ok(ops) => {
                if full {
                    last_full = Instant::now();
                }
                if ops > 0 {
                    tracing::debug!(
                        full,
                        services = map.len(),
                        ops,
                        elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                        "rules synced"
                    );
                }
                applied = Some(next);
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                tracing::error!(error = %e, full, "syncing the service rules failed; a full sync follows");
                // What the kernel holds is unknown now: the next sync replaces it all.
                applied = None;
                let backoff = Duration::from_millis(100 * 2u64.pow(failures.min(7)));
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut shutdown => break,
                }
                continue;
            }
        }
        let until_full = config
            .full_sync_interval
            .saturating_sub(last_full.elapsed());
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(until_full) => {}
            () = &mut shutdown => break,
        }
    }
    informers.shutdown().await;
    remove_table(&config.table).await;
    Ok(())
}

/// Deletes the node's table at shutdown; a failure is logged (the next start replaces it).
async fn remove_table(table: &str) {
    match cleanup(table).await {
        Ok(()) => tracing::info!("service rules removed"),
        Err(e) => tracing::warn!(error = %e, "removing the service rules failed"),
    }
}

/// Replaces the table's contents with `next` in one transaction; the number of commands.
pub async fn full_sync(nft: &Nft, next: &rules::Ruleset) -> Result<usize, NftError> {
    let (chains, sets) = match nft.list().await? {
        Some(listing) => rules::parse_listing(&listing),
        None => Default::default(),
    };
    let ops = rules::full_sync(next, &chains, &sets);
    nft.apply(&rules::render(nft.table(), &ops)).await?;
    Ok(ops.len())
}

/// Removes the proxy's table: what `setpoint agent --proxy-mode=cleanup` does, as
/// kube-proxy's `--cleanup`.
pub async fn cleanup(table: &str) -> Result<(), NftError> {
    Nft::new(table).delete_table().await
}
