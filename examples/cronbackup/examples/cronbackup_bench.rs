//! How fast the CronBackup operator reconciles: N CronBackups on an in-process cluster.
//!
//! `cargo run --release -p cronbackup --example cronbackup_bench -- [N]` (default 5,000).
//! Prints the time from creating the CRD to its first object being accepted, the first sync
//! (every CronBackup gets its CronJob and status) and a steady-state pass (every CronBackup
//! changed once more), as reconciles per second.

use std::time::{Duration, Instant};

use cronbackup::{CronBackup, CronBackupSpec};
use k8s_openapi::api::batch::v1::CronJob;
use serde_json::json;
use setpoint_runtime::client::{Api, ListParams, Patch, PatchParams, PostParams};
use setpoint_runtime::informer::SharedInformers;
use setpoint_testing::TestCluster;

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5000);
    let cluster = TestCluster::start().await;
    let client = cluster.client();

    let started = Instant::now();
    cronbackup::install_crd(&client).await.unwrap();
    let backups: Api<CronBackup> = Api::namespaced(client.clone(), "default");
    let spec = |i: usize| CronBackupSpec {
        schedule: "0 2 * * *".into(),
        database: format!("db-{i}"),
        retention_days: 30,
    };
    wait_for("the first object to be accepted", async || {
        backups
            .create(&PostParams::default(), &CronBackup::new("cb-0", spec(0)))
            .await
            .is_ok()
    })
    .await;
    let first_object = started.elapsed();

    let create = Instant::now();
    let mut pending = Vec::new();
    for i in 1..n {
        let api = backups.clone();
        let obj = CronBackup::new(&format!("cb-{i}"), spec(i));
        pending.push(tokio::spawn(async move {
            api.create(&PostParams::default(), &obj).await.unwrap();
        }));
        if pending.len() >= 64 {
            for p in pending.drain(..) {
                p.await.unwrap();
            }
        }
    }
    for p in pending {
        p.await.unwrap();
    }
    let created = create.elapsed();

    let informers = SharedInformers::new(client.clone());
    let controller = cronbackup::controller(client.clone(), &informers);
    let sync = Instant::now();
    let task = tokio::spawn(controller.run(std::future::pending()));
    let cronjobs: Api<CronJob> = Api::namespaced(client.clone(), "default");
    let synced = |generation: i64| {
        let backups = backups.clone();
        let cronjobs = cronjobs.clone();
        async move {
            let jobs = cronjobs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .len();
            let done = backups
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|b| {
                    b.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
                })
                .count();
            jobs == n && done == n
        }
    };
    wait_for("the first sync", async || synced(1).await).await;
    let first_sync = sync.elapsed();

    let steady = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let mut tasks = Vec::new();
        for i in chunk {
            let api = backups.clone();
            let name = format!("cb-{i}");
            tasks.push(tokio::spawn(async move {
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"schedule": "0 3 * * *"}})),
                )
                .await
                .unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    }
    wait_for("the steady-state pass", async || synced(2).await).await;
    let steady_pass = steady.elapsed();
    task.abort();

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!("CronBackups:                        {n}");
    println!(
        "CRD created → first object accepted: {:.1} ms",
        first_object.as_secs_f64() * 1000.0
    );
    println!(
        "creating the CronBackups:            {:.2} s",
        created.as_secs_f64()
    );
    println!(
        "first sync (CronJob + status each):  {:.2} s, {:.0} reconciles/s",
        first_sync.as_secs_f64(),
        rate(first_sync)
    );
    println!("steady state (one change each):      {:.2} s, {:.0} reconciles/s (includes the {n} patches)", steady_pass.as_secs_f64(), rate(steady_pass));
    cluster.stop().await;
}
