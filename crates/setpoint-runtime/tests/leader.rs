//! Leader election against a real in-process API server, in real time with short timings
//! (lease 1 s, renew deadline 600 ms, retry 100 ms). Every wait is a condition with a deadline.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;
use setpoint_runtime::client::{
    Api, ApiResource, Body, DynamicObject, ServiceTransport, Transport,
};
use setpoint_runtime::leader::{LeaderConfig, LeaderElector, LeaderHandle, LeaseLock};
use setpoint_runtime::{Client, ClientError};
use setpoint_testing::TestCluster;

const NAMESPACE: &str = "kube-system";
const LEASE: &str = "kube-controller-manager";

fn config() -> LeaderConfig {
    LeaderConfig {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
        release_on_shutdown: true,
    }
}

/// Fails writes to Leases while switched on, like a partition between one replica and the
/// API server; reads still work.
struct FailingTransport<T> {
    inner: T,
    fail: Arc<AtomicBool>,
}

#[async_trait]
impl<T: Transport> Transport for FailingTransport<T> {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let write = matches!(
            *req.method(),
            http::Method::PUT | http::Method::PATCH | http::Method::POST
        );
        if write && req.uri().path().contains("/leases") && self.fail.load(Ordering::SeqCst) {
            return Err(ClientError::Transport(
                "injected: lease writes are failing".into(),
            ));
        }
        self.inner.send(req).await
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The value of `is_leader()`.
    Watch,
    /// The leader's work future running (started / dropped).
    Work,
}

/// (when, candidate, source, leading)
type Log = Arc<Mutex<Vec<(Instant, &'static str, Source, bool)>>>;

struct WorkStopped(&'static str, Log);

impl Drop for WorkStopped {
    fn drop(&mut self) {
        self.1
            .lock()
            .push((Instant::now(), self.0, Source::Work, false));
    }
}

struct Candidate {
    name: &'static str,
    handle: LeaderHandle,
}

/// Starts a candidate that logs every change of `is_leader()` and runs work that logs when it
/// starts and when it is dropped.
fn candidate(client: Client, name: &'static str, log: &Log) -> Candidate {
    let lock = LeaseLock::new(NAMESPACE, LEASE)
        .with_identity(format!("{name}_{:08x}", rand::random::<u32>()));
    let handle = LeaderElector::new(client, lock, config())
        .expect("valid config")
        .start();

    let mut leading = handle.is_leader();
    let watch_log = log.clone();
    tokio::spawn(async move {
        while leading.changed().await.is_ok() {
            let now = *leading.borrow_and_update();
            watch_log
                .lock()
                .push((Instant::now(), name, Source::Watch, now));
        }
    });

    let (h, work_log) = (handle.clone(), log.clone());
    tokio::spawn(async move {
        h.run_while_leading(|leadership| {
            let log = work_log.clone();
            async move {
                // Hold the term's token for as long as the work runs, as real work does: a
                // graceful shutdown waits for outstanding tokens before releasing the lease.
                let _leadership = leadership;
                log.lock().push((Instant::now(), name, Source::Work, true));
                let _stopped = WorkStopped(name, log);
                std::future::pending::<()>().await
            }
        })
        .await
    });
    Candidate { name, handle }
}

async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {limit:?}"))
}

/// Polls until `cond` holds, failing after `limit`.
async fn until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    within(limit, what, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// At no moment did two candidates lead, by either measure; a candidate's periods are
/// `(start, end)` pairs from the log.
fn assert_never_two_leaders(log: &Log) {
    let entries = log.lock().clone();
    for source in [Source::Watch, Source::Work] {
        let mut leader: Option<&str> = None;
        for (at, name, _, leading) in entries.iter().filter(|e| e.2 == source) {
            if *leading {
                assert!(
                    leader.is_none() || leader == Some(name),
                    "{source:?}: {name} leads at {at:?} while {leader:?} does: {entries:#?}"
                );
                leader = Some(name);
            } else if leader == Some(name) {
                leader = None;
            }
        }
    }
}

fn first(log: &Log, name: &str, source: Source, leading: bool) -> Option<Instant> {
    log.lock()
        .iter()
        .find(|e| e.1 == name && e.2 == source && e.3 == leading)
        .map(|e| e.0)
}

async fn lease(client: &Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get(LEASE)
        .await
        .expect("lease")
}

fn holder(l: &Lease) -> String {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

fn transitions(l: &Lease) -> i32 {
    l.spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0)
}

/// Starts `a` alone and waits until it leads, then starts `b` as its standby.
async fn leader_and_standby(
    a_client: Client,
    b_client: Client,
    log: &Log,
) -> (Candidate, Candidate) {
    let a = candidate(a_client, "a", log);
    within(Duration::from_secs(5), "a leading", a.handle.acquired())
        .await
        .expect("a leads");
    // The work runs on its own task, so it starts a moment after the term begins; a term
    // that ended before then would never have polled (nor logged) it.
    until(Duration::from_secs(5), "a's work starting", || async {
        first(log, "a", Source::Work, true).is_some()
    })
    .await;
    let b = candidate(b_client, "b", log);
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_candidates_exactly_one_leads() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let log: Log = Arc::default();
    let a = candidate(client.clone(), "a", &log);
    let b = candidate(client.clone(), "b", &log);
    let leader = within(Duration::from_secs(5), "a leader", async {
        tokio::select! {
            l = a.handle.acquired() => { l.expect("a"); &a }
            l = b.handle.acquired() => { l.expect("b"); &b }
        }
    })
    .await;
    let standby = if leader.name == "a" { &b } else { &a };

    // The leader keeps renewing for several lease durations, so the standby, which polls
    // all along, would have taken over had it seen the lease go stale.
    until(
        Duration::from_secs(10),
        "three lease durations of renewals",
        || async {
            let l = lease(&client).await;
            let s = l.spec.clone().unwrap_or_default();
            let held = s.renew_time.unwrap().0.as_microsecond()
                - s.acquire_time.unwrap().0.as_microsecond();
            held > 3_000_000
        },
    )
    .await;
    let l = lease(&client).await;
    assert_eq!(holder(&l), leader.handle.identity());
    assert_eq!(transitions(&l), 0);
    assert_eq!(l.spec.as_ref().unwrap().lease_duration_seconds, Some(1));
    assert!(leader.handle.is_leading());
    assert!(!standby.handle.is_leading());
    let work_starts = log
        .lock()
        .iter()
        .filter(|e| e.2 == Source::Work && e.3)
        .count();
    assert_eq!(work_starts, 1, "{:#?}", log.lock());
    assert_never_two_leaders(&log);

    // Times are written as MicroTime.
    let raw =
        Api::<DynamicObject>::dynamic(client.clone(), &ApiResource::of::<Lease>(), Some(NAMESPACE))
            .get(LEASE)
            .await
            .unwrap();
    for field in ["acquireTime", "renewTime"] {
        let t = raw.0["spec"][field].as_str().unwrap();
        assert_eq!(t.len(), "2026-01-01T00:00:00.000000Z".len(), "{field}: {t}");
        assert!(t.ends_with('Z') && t.as_bytes()[19] == b'.', "{field}: {t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_after_its_lease_expires() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let log: Log = Arc::default();
    let (a, b) = leader_and_standby(client.clone(), client.clone(), &log).await;

    a.handle.abort();
    let killed = Instant::now();
    within(
        config().lease_duration + Duration::from_secs(2),
        "b taking over",
        b.handle.acquired(),
    )
    .await
    .expect("b leads");
    let waited = killed.elapsed();
    // B respected the lease: A's last renewal was at most a retry period before the kill.
    assert!(
        waited >= config().lease_duration - config().retry_period * 3,
        "took over after only {waited:?}"
    );
    let l = lease(&client).await;
    assert_eq!(holder(&l), b.handle.identity());
    assert_eq!(transitions(&l), 1);
    assert_never_two_leaders(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_stops_before_its_lease_expires() {
    let cluster = TestCluster::start().await;
    let fail = Arc::new(AtomicBool::new(false));
    let inner = ServiceTransport::new(setpoint_apiserver::http::router(cluster.server().clone()));
    let a_client = Client::new(FailingTransport {
        inner,
        fail: fail.clone(),
    });
    let log: Log = Arc::default();
    let (a, b) = leader_and_standby(a_client, cluster.client(), &log).await;

    fail.store(true, Ordering::SeqCst);
    let failing_since = Instant::now();
    within(Duration::from_secs(5), "b taking over", b.handle.acquired())
        .await
        .expect("b leads");
    assert!(!a.handle.is_leading());
    // The work runs on its own task, so it starts a moment after the term begins.
    until(Duration::from_secs(5), "b's work starting", || async {
        first(&log, "b", Source::Work, true).is_some()
    })
    .await;

    let a_stopped = first(&log, "a", Source::Work, false).expect("a's work was dropped");
    let a_unset = first(&log, "a", Source::Watch, false).expect("a's is_leader went false");
    let b_started = first(&log, "b", Source::Work, true).expect("b's work started");
    // A's last successful renewal was sent at most a retry period (plus one request) before
    // the failures began, so for nobody can its lease expire earlier than a lease duration
    // minus a retry period after that. A stops a renew deadline after that renewal.
    let stopped_after = a_stopped - failing_since;
    assert!(
        stopped_after < config().lease_duration - config().retry_period,
        "a stopped {stopped_after:?} after renewals began failing"
    );
    assert!(
        a_unset < b_started && a_stopped < b_started,
        "{:#?}",
        log.lock()
    );
    assert_never_two_leaders(&log);

    let l = lease(&cluster.client()).await;
    assert_eq!(holder(&l), b.handle.identity());
    assert_eq!(transitions(&l), 1);

    // A recovers as a standby and does not disturb B.
    fail.store(false, Ordering::SeqCst);
    let rv = l.metadata.resource_version.clone();
    until(Duration::from_secs(5), "b renewing", || async {
        lease(&cluster.client()).await.metadata.resource_version != rv
    })
    .await;
    assert!(!a.handle.is_leading());
    assert!(b.handle.is_leading());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_hands_over_quickly() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    let log: Log = Arc::default();
    let (a, b) = leader_and_standby(client.clone(), client.clone(), &log).await;

    let started = Instant::now();
    within(
        Duration::from_secs(2),
        "a shutting down",
        a.handle.shutdown(),
    )
    .await;
    // The work had stopped before shutdown() returned (and before the release was written).
    assert!(first(&log, "a", Source::Work, false).is_some());
    within(
        config().lease_duration / 2,
        "b taking over after the release",
        b.handle.acquired(),
    )
    .await
    .expect("b leads");
    let waited = started.elapsed();
    assert!(waited < config().lease_duration / 2, "{waited:?}");
    let l = lease(&client).await;
    assert_eq!(holder(&l), b.handle.identity());
    assert_eq!(transitions(&l), 1);
    assert_never_two_leaders(&log);
    assert!(
        a.handle.acquired().await.is_none(),
        "a shut-down candidate never leads again"
    );
}
