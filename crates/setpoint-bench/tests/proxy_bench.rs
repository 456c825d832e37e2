//! `bench proxy` at a tiny size on the real kernel: every round is measured, the figures
//! agree with the ruleset asked for, and the run's table is gone afterwards. Needs root and
//! `nft`; skipped without them unless `SETPOINT_REQUIRE_NFT` is set.

use setpoint_bench::proxy::{self, ProxyBenchConfig};
use setpoint_network::proxy::Nft;

#[tokio::test]
async fn proxy_run_measures_every_round_and_removes_its_table() {
    if let Err(e) = Nft::probe().await {
        if std::env::var_os("SETPOINT_REQUIRE_NFT").is_some() {
            panic!("SETPOINT_REQUIRE_NFT is set but nftables cannot be programmed: {e}");
        }
        eprintln!("skipping: nftables cannot be programmed here ({e})");
        return;
    }
    let table = format!("setpoint-bench-test-{}", std::process::id());
    let r = proxy::run(
        ProxyBenchConfig {
            services: 5,
            endpoints: 2,
            rounds: 3,
        },
        &table,
    )
    .await
    .expect("proxy bench");
    for p in [
        &r.full_build,
        &r.full_apply,
        &r.change_build,
        &r.change_apply,
    ] {
        assert_eq!(p.count, 3);
        assert!(p.p50 <= p.max);
    }
    assert!(r.first_apply_ms > 0.0);
    // Per Service port a service chain, per endpoint an endpoint chain, plus the base ones.
    assert!(r.chains >= 5 + 5 * 2, "{r:?}");
    assert!(r.change_ops > 0 && r.change_ops < r.full_sync_ops, "{r:?}");
    assert!(
        Nft::new(&table).list().await.unwrap().is_none(),
        "the run's table is left behind"
    );
    let text = proxy::table(&r);
    assert!(text.contains("5 Services x 2 endpoints"), "{text}");
}
