//! What one validating admission webhook adds to a write: ConfigMap creates one at a time
//! over HTTPS against a `TestCluster` (a real API server on an in-memory store in this
//! process), alternating between a namespace no webhook matches and one whose writes a
//! validating webhook (served by this process over HTTPS, `setpoint-testing`'s
//! `WebhookServer`, answering `allowed: true`) must approve, so drift on a shared machine hits
//! both alike. Prints nearest-rank p50/p90/p99 of each and the difference.
//!
//! `cargo run -p setpoint-bench --example webhook_latency -- [writes per side (2000)]`
//! (`bench/webhook_latency.sh` runs it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use serde_json::json;
use setpoint_bench::report::Percentiles;
use setpoint_runtime::client::{Api, PostParams};
use setpoint_testing::webhook::WebhookServer;
use setpoint_testing::TestCluster;

fn namespace(name: &str, hooked: bool) -> Namespace {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.into());
    if hooked {
        ns.metadata.labels = Some([("webhook".to_string(), "on".to_string())].into());
    }
    ns
}

fn config_map(i: usize) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(format!("cm-{i}"));
    // About 1 KiB, as `setpoint bench api` writes.
    cm.data = Some([("payload".to_string(), "x".repeat(1024))].into());
    cm
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let writes: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => 2000,
    };
    let cluster = TestCluster::start_https().await;
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let hooks = WebhookServer::start(move |_path, _request| {
        counted.fetch_add(1, Ordering::Relaxed);
        json!({"allowed": true})
    })
    .await;
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    for (name, hooked) in [("plain", false), ("hooked", true)] {
        namespaces
            .create(&PostParams::default(), &namespace(name, hooked))
            .await?;
    }
    let configuration = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "bench"},
        "webhooks": [{
            "name": "allow.bench.example.com",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1/validate"},
            "namespaceSelector": {"matchLabels": {"webhook": "on"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}]
        }]
    });
    cluster.install_webhooks(&hooks, &[configuration]).await?;
    let plain: Api<ConfigMap> = Api::namespaced(cluster.client(), "plain");
    let hooked: Api<ConfigMap> = Api::namespaced(cluster.client(), "hooked");
    let params = PostParams::default();
    // A few writes of each first, so connections and caches are warm.
    for i in 0..20 {
        plain.create(&params, &config_map(writes + i)).await?;
        hooked.create(&params, &config_map(writes + i)).await?;
    }
    let before = calls.load(Ordering::Relaxed);
    let (mut without, mut with) = (Vec::with_capacity(writes), Vec::with_capacity(writes));
    for i in 0..writes {
        // Alternate which side goes first, so neither always follows the other.
        for side in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
            let (api, out) = if side == 0 {
                (&plain, &mut without)
            } else {
                (&hooked, &mut with)
            };
            let t = Instant::now();
            api.create(&params, &config_map(i)).await?;
            out.push(t.elapsed().as_micros() as u64);
        }
    }
    let called = calls.load(Ordering::Relaxed) - before;
    assert_eq!(called, writes as u64, "the webhook saw every hooked write");
    let (a, b) = (Percentiles::of_us(without), Percentiles::of_us(with));
    println!("ConfigMap creates, one at a time, {writes} per side (webhook called {called} times)");
    println!("| | p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, p) in [("no webhook", &a), ("one validating webhook", &b)] {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.1} |",
            p.p50, p.p90, p.p99, p.max
        );
    }
    println!(
        "| added by the webhook | {:+.2} | {:+.2} | {:+.2} | |",
        b.p50 - a.p50,
        b.p90 - a.p90,
        b.p99 - a.p99
    );
    drop(hooks);
    cluster.stop().await;
    Ok(())
}
