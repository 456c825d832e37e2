//! Injecting a fault: finding the process the target names (a leader by its Lease), then
//! SIGKILL and a new process in its place, or SIGSTOP for longer than the lease duration and
//! SIGCONT, or its packets to and from the API server dropped for as long and let through
//! again.

use std::time::{Duration, Instant};

use anyhow::Context;
use setpoint_apiserver::faults::{Expiry, FaultRequest, Latency, FAULTS_PATH};

use super::cluster::{Cluster, LEASE_DURATION};
use super::schedule::{Fault, FaultKind, Target};

/// How long to wait for a Lease to have a holder of this run (after an earlier fault on the
/// same component, the standby may not have taken over yet).
const LEADER_DEADLINE: Duration = Duration::from_secs(30);

/// A frozen (or partitioned) process stays stopped (cut off) this much longer than a lease
/// lasts, so a standby has surely taken over before it wakes (is reachable again).
const FREEZE_MARGIN: Duration = Duration::from_secs(2);

/// How long every watch that names a resourceVersion is answered 410 (`expire-watches`).
const EXPIRY: Duration = Duration::from_secs(2);

/// The latency added to every request (`latency`), and for how long: as long as a freeze.
const LATENCY: Duration = Duration::from_millis(250);
const LATENCY_FOR: Duration = Duration::from_secs(5);

/// Asks the fault-injection switch of the API server `server` (the run starts each with
/// `--enable-fault-injection`) for `request`.
async fn api_fault(cluster: &Cluster, server: &str, request: &FaultRequest) -> anyhow::Result<()> {
    cluster
        .server_client(server)?
        .request(
            http::Method::POST,
            FAULTS_PATH,
            Some("application/json"),
            bytes::Bytes::from(serde_json::to_vec(request)?),
        )
        .await
        .with_context(|| format!("the API server's fault-injection switch ({FAULTS_PATH})"))?;
    Ok(())
}

/// What was done.
pub struct Injected {
    pub process: String,
    pub injected: Instant,
    /// When the target was back: restarted (for the API server: answering), thawed or
    /// reachable again.
    pub recovered: Instant,
}

/// Injects `fault` into `cluster`.
pub async fn inject(cluster: &mut Cluster, fault: Fault) -> anyhow::Result<Injected> {
    let process = match fault.target {
        Target::ApiServer => cluster.next_api_server(),
        Target::EtcdMember => cluster.next_etcd_member()?,
        Target::Agent => "agent-0".to_string(),
        Target::LeadingControllerManager => {
            cluster
                .leader("kube-controller-manager", LEADER_DEADLINE)
                .await?
        }
        Target::LeadingScheduler => cluster.leader("kube-scheduler", LEADER_DEADLINE).await?,
    };
    let injected = Instant::now();
    tracing::info!(fault = %fault.label(), %process, "injecting");
    match fault.kind {
        FaultKind::Kill => {
            cluster.restart(&process)?;
            match fault.target {
                Target::ApiServer => cluster.wait_for_server(&process).await?,
                Target::EtcdMember => cluster.wait_for_etcd(&process).await?,
                _ => {}
            }
        }
        FaultKind::Freeze => {
            let p = cluster
                .process_mut(&process)
                .ok_or_else(|| anyhow::anyhow!("no process {process}"))?;
            p.signal("STOP")?;
            tokio::time::sleep(LEASE_DURATION + FREEZE_MARGIN).await;
            p.signal("CONT")?;
        }
        FaultKind::WatchDrop => {
            api_fault(
                cluster,
                &process,
                &FaultRequest {
                    drop_watches: true,
                    ..Default::default()
                },
            )
            .await?;
        }
        FaultKind::ExpireWatches => {
            api_fault(
                cluster,
                &process,
                &FaultRequest {
                    drop_watches: true,
                    expire_watches: Some(Expiry {
                        count: None,
                        seconds: Some(EXPIRY.as_secs()),
                    }),
                    ..Default::default()
                },
            )
            .await?;
            tokio::time::sleep(EXPIRY).await;
        }
        FaultKind::Latency => {
            api_fault(
                cluster,
                &process,
                &FaultRequest {
                    latency: Some(Latency {
                        milliseconds: LATENCY.as_millis() as u64,
                        seconds: LATENCY_FOR.as_secs(),
                    }),
                    ..Default::default()
                },
            )
            .await?;
            tokio::time::sleep(LATENCY_FOR).await;
        }
        FaultKind::Partition => {
            cluster.partition(&process)?;
            tokio::time::sleep(LEASE_DURATION + FREEZE_MARGIN).await;
            cluster.heal(&process)?;
        }
    }
    Ok(Injected {
        process,
        injected,
        recovered: Instant::now(),
    })
}
