//! `bench proxy`: how long the service proxy takes to program its rules for S Services of E
//! endpoints each, with the proxy's own code (`setpoint_network::proxy`): the Service map
//! read from Service and EndpointSlice objects, the desired ruleset, and the `nft -f`
//! transaction, into a private table of this run that is deleted at the end.
//!
//! - *full sync*: the whole table written in one transaction (what the proxy does at start and
//!   every hour), first into an empty table, then over the table as it stands;
//! - *one change*: one endpoint of one Service turns unready, then ready again, and only the
//!   difference is applied (the proxy's partial sync after an EndpointSlice update).
//!
//! The addresses are in 198.18.0.0/15 (set aside for benchmarks), so the rules, which the
//! kernel applies for as long as the run lasts, catch no traffic of anyone else.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;
use serde_json::json;
use setpoint_network::proxy::{self, model, rules, Nft, NodeInfo};

use crate::report::Percentiles;
use crate::BenchError;

/// How a proxy run goes.
#[derive(Clone, Debug)]
pub struct ProxyBenchConfig {
    /// Services (one TCP port each).
    pub services: usize,
    /// Endpoints per Service.
    pub endpoints: usize,
    /// Full syncs and changes measured (each figure is over this many).
    pub rounds: usize,
}

/// The figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ProxyBenchReport {
    /// Services programmed.
    pub services: u64,
    /// Endpoints per Service.
    pub endpoints: u64,
    /// Chains in the ruleset.
    pub chains: u64,
    /// Map and set elements in the ruleset.
    pub elements: u64,
    /// Commands of a full-sync transaction.
    pub full_sync_ops: u64,
    /// Commands of a one-endpoint change.
    pub change_ops: u64,
    /// The first full sync, into an empty table: Service map and ruleset built, ms.
    pub first_build_ms: f64,
    /// … and the transaction applied with `nft -f`, ms.
    pub first_apply_ms: f64,
    /// Full syncs over the programmed table: Service map and ruleset built, ms.
    pub full_build: Percentiles,
    /// … the table listed, the transaction computed and applied, ms.
    pub full_apply: Percentiles,
    /// One endpoint changed: Service map, ruleset and the partial transaction built, ms.
    pub change_build: Percentiles,
    /// … and applied, ms.
    pub change_apply: Percentiles,
}

/// The cluster IP of Service `i`: 198.18.0.0/16.
fn cluster_ip(i: usize) -> String {
    format!("198.18.{}.{}", (i / 250) % 256, i % 250 + 1)
}

/// The address of endpoint `j` of Service `i`: 198.19.0.0/16.
fn endpoint_ip(i: usize, j: usize, per: usize) -> String {
    let n = i * per + j;
    format!("198.19.{}.{}", (n / 250) % 256, n % 250 + 1)
}

/// `services` Services of one TCP port and one EndpointSlice each with `endpoints` ready
/// endpoints, all in namespace `bench`.
pub fn objects(services: usize, endpoints: usize) -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut svcs = Vec::with_capacity(services);
    let mut slices = Vec::with_capacity(services);
    for i in 0..services {
        let name = format!("svc-{i}");
        svcs.push(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "bench"},
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": cluster_ip(i),
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]
                }
            }))
            .expect("a Service"),
        );
        let eps: Vec<_> = (0..endpoints)
            .map(|j| {
                json!({
                    "addresses": [endpoint_ip(i, j, endpoints)],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": format!("node-{}", j % 10)
                })
            })
            .collect();
        slices.push(
            serde_json::from_value(json!({
                "metadata": {
                    "name": format!("{name}-abcde"),
                    "namespace": "bench",
                    "labels": {"kubernetes.io/service-name": name}
                },
                "addressType": "IPv4",
                "endpoints": eps,
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]
            }))
            .expect("an EndpointSlice"),
        );
    }
    (svcs, slices)
}

fn node() -> NodeInfo {
    // The proxy's defaults for a node: no cluster CIDR, so nothing but hairpin traffic is
    // masqueraded.
    proxy::ProxyConfig::new("node-0", "bench").node
}

fn build(services: &[Service], slices: &[EndpointSlice]) -> rules::Ruleset {
    let map = model::service_map(services.iter(), slices.iter());
    rules::desired(&map, &node())
}

fn us(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// Sets the readiness of the first endpoint of the first slice.
fn set_first_ready(slices: &mut [EndpointSlice], ready: bool) {
    if let Some(c) = slices
        .first_mut()
        .and_then(|s| s.endpoints.first_mut())
        .and_then(|e| e.conditions.as_mut())
    {
        c.ready = Some(ready);
        c.serving = Some(ready);
    }
}

/// Runs the benchmark in table `table` (created, replaced, and deleted at the end, also when
/// a step fails).
pub async fn run(config: ProxyBenchConfig, table: &str) -> Result<ProxyBenchReport, BenchError> {
    Nft::probe()
        .await
        .map_err(|e| BenchError::Setup(format!("nftables is not usable here: {e}")))?;
    let nft = Nft::new(table);
    let result = measure(&config, &nft).await;
    let cleaned = proxy::cleanup(table).await;
    let report = result?;
    cleaned.map_err(|e| BenchError::Setup(format!("deleting table {table}: {e}")))?;
    Ok(report)
}

async fn measure(config: &ProxyBenchConfig, nft: &Nft) -> Result<ProxyBenchReport, BenchError> {
    let failed = |e: proxy::NftError| BenchError::Setup(e.to_string());
    let (services, mut slices) = objects(config.services, config.endpoints);
    let rounds = config.rounds.max(1);
    // A leftover table of the same name would make the first sync not a first one.
    nft.delete_table().await.map_err(failed)?;

    let t = Instant::now();
    let ruleset = build(&services, &slices);
    let first_build = t.elapsed();
    let t = Instant::now();
    let full_sync_ops = proxy::full_sync(nft, &ruleset).await.map_err(failed)?;
    let first_apply = t.elapsed();

    let (mut full_build, mut full_apply) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let next = build(&services, &slices);
        full_build.push(us(t.elapsed()));
        let t = Instant::now();
        proxy::full_sync(nft, &next).await.map_err(failed)?;
        full_apply.push(us(t.elapsed()));
    }

    let (mut change_build, mut change_apply) = (Vec::new(), Vec::new());
    let mut applied = ruleset.clone();
    let mut change_ops = 0;
    for round in 0..rounds {
        // Unready on even rounds, ready again on odd ones: each a real change.
        set_first_ready(&mut slices, round % 2 == 1);
        let t = Instant::now();
        let next = build(&services, &slices);
        let ops = rules::partial_sync(&applied, &next);
        let script = rules::render(nft.table(), &ops);
        change_build.push(us(t.elapsed()));
        if ops.is_empty() {
            return Err(BenchError::Setup(
                "an endpoint's readiness changed but the rules did not".into(),
            ));
        }
        change_ops = ops.len();
        let t = Instant::now();
        nft.apply(&script).await.map_err(failed)?;
        change_apply.push(us(t.elapsed()));
        applied = next;
    }

    Ok(ProxyBenchReport {
        services: config.services as u64,
        endpoints: config.endpoints as u64,
        chains: ruleset.chains.len() as u64,
        elements: ruleset.sets.values().map(|s| s.elements.len() as u64).sum(),
        full_sync_ops: full_sync_ops as u64,
        change_ops: change_ops as u64,
        first_build_ms: first_build.as_secs_f64() * 1e3,
        first_apply_ms: first_apply.as_secs_f64() * 1e3,
        full_build: Percentiles::of_us(full_build),
        full_apply: Percentiles::of_us(full_apply),
        change_build: Percentiles::of_us(change_build),
        change_apply: Percentiles::of_us(change_apply),
    })
}

/// The report as a table.
pub fn table(r: &ProxyBenchReport) -> String {
    let row = |what: &str, p: &Percentiles| {
        format!(
            "  {what:<34} {:>6} {:>10.1} {:>10.1} {:>10.1}\n",
            p.count, p.p50, p.p99, p.max
        )
    };
    format!(
        "proxy rules: {} Services x {} endpoints: {} chains, {} map/set elements\n  \
         first full sync into an empty table ({} commands): built {:.1} ms, applied {:.1} ms\n  \
         {:<34} {:>6} {:>10} {:>10} {:>10}\n{}{}{}{}  one change is {} commands\n",
        r.services,
        r.endpoints,
        r.chains,
        r.elements,
        r.full_sync_ops,
        r.first_build_ms,
        r.first_apply_ms,
        "step",
        "count",
        "p50 ms",
        "p99 ms",
        "max ms",
        row("full sync: build", &r.full_build),
        row("full sync: list + apply", &r.full_apply),
        row("one endpoint changed: build", &r.change_build),
        row("one endpoint changed: apply", &r.change_apply),
        r.change_ops,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_give_one_routed_port_per_service_with_its_endpoints() {
        let (services, slices) = objects(300, 10);
        let map = model::service_map(services.iter(), slices.iter());
        assert_eq!(map.len(), 300);
        assert!(map.values().all(|(_, eps)| eps.len() == 10));
        // Addresses stay distinct past the 250 a /24 block holds here.
        let ips: std::collections::BTreeSet<_> =
            map.values().map(|(sp, _)| sp.cluster_ip).collect();
        assert_eq!(ips.len(), 300);
    }

    #[test]
    fn one_readiness_change_is_a_small_partial_sync() {
        let (services, mut slices) = objects(20, 3);
        let before = build(&services, &slices);
        set_first_ready(&mut slices, false);
        let after = build(&services, &slices);
        let ops = rules::partial_sync(&before, &after);
        assert!(!ops.is_empty());
        assert!(ops.len() < 10, "{ops:?}");
    }
}
