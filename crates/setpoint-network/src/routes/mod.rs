//! host-gw routing, flannel's `host-gw` backend's job: every node routes each other node's
//! pod range (`spec.podCIDRs`, handed out by the node IPAM controller) through that node's
//! `InternalIP`, so pods on two machines on one link reach each other directly, with no
//! encapsulation and no extra software.
//!
//! [`plan`] is pure: the routes wanted from the Nodes, and the changes from the routes held.
//! [`ip`] reads and changes the kernel's routes with iproute2. [`run`] ties them to a Node
//! informer: every change wakes a sync that lists the routes this node owns, computes the
//! wanted ones and applies the difference (and a periodic sync repairs what changed behind
//! its back). The routes it owns are those of the main table with its own `proto` number
//! ([`proto_number`]), so it never touches another program's routes; at a clean stop it
//! deletes them all.

pub mod ip;
pub mod plan;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use setpoint_runtime::client::Client;
use setpoint_runtime::events::{EventRecorder, EventType, Reporter};
use setpoint_runtime::informer::{Event, Scope, SharedInformers};
use tokio::sync::Notify;
use tracing::Instrument;

pub use ip::RouteError;
pub use plan::Route;

/// The reason of the Warning Event a node that cannot install routes records on itself.
pub const ROUTES_UNAVAILABLE: &str = "PodRoutesUnavailable";

/// How often the routes are synced with no change seen (repairing routes removed behind the
/// node's back, as when a link went down and up).
const RESYNC: Duration = Duration::from_secs(30);

/// The route protocol numbers nodes choose theirs from: 200–249, above the numbers
/// iproute2's `rt_protos` names for routing daemons (up to 192, `eigrp`).
const PROTO_BASE: u8 = 200;
const PROTO_SPAN: u8 = 50;

/// The route protocol number of the node identified by `identity` (its state directory,
/// say): stable across restarts, so a restarted agent finds and replaces its own routes,
/// and different for most pairs of nodes sharing one network namespace (two clusters on one
/// machine each own their routes).
pub fn proto_number(identity: &str) -> u8 {
    // FNV-1a, as the proxy's table names: stable across builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in identity.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    PROTO_BASE + (h % u64::from(PROTO_SPAN)) as u8
}

/// How one node routes.
#[derive(Clone, Debug)]
pub struct RoutesConfig {
    /// The node's name (its own range is not routed).
    pub node_name: String,
    /// The `proto` number of the routes it owns.
    pub proto: u8,
}

/// Runs host-gw routing until `shutdown`. Without `CAP_NET_ADMIN` (or `ip`), it says so
/// in its log and in a Warning Event on the Node, and waits for `shutdown`.
pub async fn run(client: Client, config: RoutesConfig, shutdown: impl Future<Output = ()> + Send) {
    let span = tracing::info_span!("routes", node = %config.node_name, proto = config.proto);
    run_in(client, config, shutdown).instrument(span).await
}

async fn run_in(client: Client, config: RoutesConfig, shutdown: impl Future<Output = ()> + Send) {
    if let Err(e) = ip::probe().await {
        let message = format!(
            "cannot install routes to other nodes' pod ranges ({e}); pods on other nodes are not reachable by pod IP from this node"
        );
        tracing::warn!(error = %e, "{message}");
        let recorder = EventRecorder::new(client, Reporter::new("setpoint-agent"));
        let node_ref = ObjectReference {
            kind: Some("Node".into()),
            api_version: Some("v1".into()),
            name: Some(config.node_name.clone()),
            ..ObjectReference::default()
        };
        recorder.publish(&node_ref, EventType::Warning, ROUTES_UNAVAILABLE, &message);
        recorder.flush().await;
        shutdown.await;
        return;
    }
    let informers = SharedInformers::lean(client);
    let nodes = informers.typed::<Node>(Scope::all());
    let wake = Arc::new(Notify::new());
    {
        let wake = wake.clone();
        nodes.subscribe(Arc::new(move |_: &Event<Node>| wake.notify_one()));
    }
    informers.start();
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        r = informers.wait_synced() => if let Err(e) = r {
            tracing::error!(error = %e, "node informer failed; no routes installed");
            informers.shutdown().await;
            return;
        },
        () = &mut shutdown => {
            informers.shutdown().await;
            return;
        }
    }
    let mut failures = 0u32;
    loop {
        let wanted = {
            let list = nodes.store().list();
            let local = ip::local_addresses().await.unwrap_or_default();
            plan::desired(&config.node_name, list.iter().map(|n| &**n), &local)
        };
        let wait = match sync(&wanted, config.proto).await {
            Ok(()) => {
                failures = 0;
                RESYNC
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "syncing the routes to other nodes' pods failed; retrying");
                Duration::from_millis(200 * 2u64.pow(failures.min(7)))
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            () = &mut shutdown => break,
        }
    }
    informers.shutdown().await;
    match sync(&Default::default(), config.proto).await {
        Ok(()) => tracing::info!("routes to other nodes' pods removed"),
        Err(e) => tracing::warn!(error = %e, "removing the routes to other nodes' pods failed"),
    }
}

/// Makes this node's routes (those of `proto`) exactly `wanted`; every change is tried,
/// the first failure returned.
pub async fn sync(wanted: &std::collections::BTreeSet<Route>, proto: u8) -> Result<(), RouteError> {
    let current = ip::list(proto).await?;
    let changes = plan::diff(&current, wanted);
    let mut first_error = None;
    for route in &changes.delete {
        match ip::delete(route, proto).await {
            Ok(()) => tracing::info!(dst = %route.dst, via = %route.via, "route removed"),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    for route in &changes.replace {
        match ip::replace(route, proto).await {
            Ok(()) => tracing::info!(dst = %route.dst, via = %route.via, "route installed"),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto_numbers_are_stable_and_in_their_band() {
        assert_eq!(proto_number("/var/lib/a"), proto_number("/var/lib/a"));
        for id in ["a", "b", "/tmp/x/node", ""] {
            let p = proto_number(id);
            assert!((PROTO_BASE..PROTO_BASE + PROTO_SPAN).contains(&p), "{p}");
        }
    }
}
