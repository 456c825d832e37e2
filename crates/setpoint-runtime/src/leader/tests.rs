//! Election timing under a paused clock, against a fake Lease endpoint that keeps one Lease
//! with resourceVersion preconditions, so the default 15 s / 10 s / 2 s timings run in
//! milliseconds and the arithmetic can be checked exactly. Tests against the real API server
//! are in `tests/leader.rs`.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

use super::*;
use crate::client::{Body, Transport};

#[derive(Default)]
struct FakeLeases {
    lease: Mutex<Option<Value>>,
    revision: Mutex<u64>,
}

struct FakeTransport {
    server: Arc<FakeLeases>,
    fail_writes: Arc<AtomicBool>,
}

fn respond(code: u16, v: &Value) -> Result<http::Response<Body>, ClientError> {
    let body = Full::new(Bytes::from(serde_json::to_vec(v).expect("json")))
        .map_err(|never| match never {})
        .boxed_unsync();
    Ok(http::Response::builder()
        .status(code)
        .body(body)
        .expect("response"))
}

fn status(code: u16, reason: &str) -> Result<http::Response<Body>, ClientError> {
    respond(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": reason}),
    )
}

#[async_trait]
impl Transport for FakeTransport {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let write = req.method() != http::Method::GET;
        if write && self.fail_writes.load(Ordering::SeqCst) {
            return Err(ClientError::Transport("injected failure".into()));
        }
        let mut lease = self.server.lease.lock();
        let mut rev = self.server.revision.lock();
        let body = || serde_json::from_slice::<Value>(req.body()).expect("request body");
        match *req.method() {
            http::Method::GET => match &*lease {
                Some(l) => respond(200, l),
                None => status(404, "NotFound"),
            },
            http::Method::POST => {
                if lease.is_some() {
                    return status(409, "AlreadyExists");
                }
                *rev += 1;
                let mut l = body();
                l["metadata"]["resourceVersion"] = json!(rev.to_string());
                *lease = Some(l.clone());
                respond(201, &l)
            }
            http::Method::PUT => {
                let Some(cur) = &*lease else {
                    return status(404, "NotFound");
                };
                let mut l = body();
                if l["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                    return status(409, "Conflict");
                }
                *rev += 1;
                l["metadata"]["resourceVersion"] = json!(rev.to_string());
                *lease = Some(l.clone());
                respond(200, &l)
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }
}

/// What happened, in (virtual) time order.
#[derive(Clone, Debug, PartialEq)]
enum Mark {
    Start(&'static str),
    Stop(&'static str),
}

type Log = Arc<Mutex<Vec<(Instant, Mark)>>>;

struct StopMark(&'static str, Log);

impl Drop for StopMark {
    fn drop(&mut self) {
        self.1.lock().push((Instant::now(), Mark::Stop(self.0)));
    }
}

struct Candidate {
    handle: LeaderHandle,
    fail_writes: Arc<AtomicBool>,
}

/// Starts a candidate whose "work" logs when it starts and when it is dropped.
fn candidate(server: &Arc<FakeLeases>, name: &'static str, log: &Log) -> Candidate {
    let fail_writes = Arc::new(AtomicBool::new(false));
    let client = Client::new(FakeTransport {
        server: server.clone(),
        fail_writes: fail_writes.clone(),
    });
    let lock = LeaseLock::new("kube-system", "controller").with_identity(name);
    let handle = LeaderElector::new(client, lock, LeaderConfig::default())
        .expect("config")
        .start();
    let (h, log) = (handle.clone(), log.clone());
    tokio::spawn(async move {
        h.run_while_leading(|_| {
            let log = log.clone();
            async move {
                log.lock().push((Instant::now(), Mark::Start(name)));
                let _stop = StopMark(name, log);
                std::future::pending::<()>().await
            }
        })
        .await
    });
    Candidate {
        handle,
        fail_writes,
    }
}

/// The work intervals of each candidate never overlap.
fn assert_no_overlap(log: &Log) {
    let mut leading: Option<&'static str> = None;
    for (at, mark) in log.lock().iter() {
        match mark {
            Mark::Start(n) => {
                assert!(
                    leading.is_none(),
                    "{n} started at {at:?} while {leading:?} was leading: {:?}",
                    log.lock()
                );
                leading = Some(n);
            }
            Mark::Stop(n) => {
                assert_eq!(leading, Some(*n), "{n} stopped without leading");
                leading = None;
            }
        }
    }
}

/// When `mark` was logged, waiting for it without letting (virtual) time pass: the work
/// runs on its own task, a moment after the term begins.
async fn logged(log: &Log, mark: Mark) -> Instant {
    loop {
        if let Some((at, _)) = log.lock().iter().find(|(_, m)| *m == mark) {
            return *at;
        }
        tokio::task::yield_now().await;
    }
}

fn stops(log: &Log, name: &'static str) -> Vec<Instant> {
    log.lock()
        .iter()
        .filter(|(_, m)| *m == Mark::Stop(name))
        .map(|(t, _)| *t)
        .collect()
}

fn holder(server: &FakeLeases) -> (String, i64) {
    let l = server.lease.lock().clone().expect("lease exists");
    (
        l["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        l["spec"]["leaseTransitions"].as_i64().unwrap_or(0),
    )
}

/// Waits (in virtual time) for whichever candidate leads first.
async fn first_leader(a: &Candidate, b: &Candidate) -> &'static str {
    tokio::select! {
        l = a.handle.acquired() => { l.expect("a leads"); "a" }
        l = b.handle.acquired() => { l.expect("b leads"); "b" }
    }
}

#[tokio::test(start_paused = true)]
async fn exactly_one_of_two_candidates_leads_and_keeps_leading() {
    let server = Arc::new(FakeLeases::default());
    let log: Log = Arc::default();
    let a = candidate(&server, "a", &log);
    let b = candidate(&server, "b", &log);
    let first = first_leader(&a, &b).await;
    // A minute of virtual time: 30 renewals, four lease durations.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (h, transitions) = holder(&server);
    assert_eq!(h, first);
    assert_eq!(transitions, 0);
    assert_eq!(a.handle.is_leading(), first == "a");
    assert_eq!(b.handle.is_leading(), first == "b");
    assert_eq!(log.lock().len(), 1, "{:?}", log.lock());
    let l = server.lease.lock().clone().unwrap();
    assert_eq!(l["spec"]["leaseDurationSeconds"], json!(15));
    assert!(l["spec"]["renewTime"].as_str().unwrap().ends_with('Z'));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_at_its_deadline_before_anyone_takes_over() {
    let config = LeaderConfig::default();
    let server = Arc::new(FakeLeases::default());
    let log: Log = Arc::default();
    let a = candidate(&server, "a", &log);
    let first = a.handle.acquired().await.expect("a leads alone");
    // A created the Lease: nobody led before it.
    assert!(!first.follows_another());
    drop(first);
    let b = candidate(&server, "b", &log);
    tokio::time::sleep(Duration::from_secs(7)).await;
    a.fail_writes.store(true, Ordering::SeqCst);
    let failed_at = Instant::now();

    let taken = b.handle.acquired().await.expect("b takes over");
    assert!(taken.follows_another());
    drop(taken);
    assert_no_overlap(&log);
    let a_stop = logged(&log, Mark::Stop("a")).await;
    let b_start = logged(&log, Mark::Start("b")).await;
    // The last good renewal was sent at most one retry period before the failures began.
    assert!(
        a_stop <= failed_at + config.renew_deadline,
        "{:?}",
        a_stop - failed_at
    );
    assert!(
        a_stop > failed_at + config.renew_deadline - config.retry_period,
        "{:?}",
        a_stop - failed_at
    );
    // B waited a whole lease duration from seeing that renewal, which A sent before then.
    assert!(
        b_start - a_stop >= config.lease_duration - config.renew_deadline,
        "{:?}",
        b_start - a_stop
    );
    assert_eq!(holder(&server), ("b".to_string(), 1));

    // A recovers as a standby: B's renewals keep the lease alive.
    a.fail_writes.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!a.handle.is_leading());
    assert!(b.handle.is_leading());
    assert_no_overlap(&log);
}

#[tokio::test(start_paused = true)]
async fn a_killed_leader_is_replaced_within_the_lease_duration() {
    let config = LeaderConfig::default();
    let server = Arc::new(FakeLeases::default());
    let log: Log = Arc::default();
    let a = candidate(&server, "a", &log);
    a.handle.acquired().await.expect("a leads alone");
    let b = candidate(&server, "b", &log);
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.handle.abort();
    let killed_at = Instant::now();
    b.handle.acquired().await.expect("b takes over");
    let waited = Instant::now() - killed_at;
    // A's last renewal is at most one retry period old; B notices it within one jittered
    // poll and takes over on its first poll after a lease duration.
    let bound = config.lease_duration + config.retry_period.mul_f64(2.4);
    assert!(
        waited > config.lease_duration - config.retry_period,
        "{waited:?}"
    );
    assert!(waited <= bound, "{waited:?} > {bound:?}");
    assert_eq!(holder(&server), ("b".to_string(), 1));
    assert_no_overlap(&log);
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_hands_over_on_the_next_poll() {
    let config = LeaderConfig::default();
    let server = Arc::new(FakeLeases::default());
    let log: Log = Arc::default();
    let a = candidate(&server, "a", &log);
    a.handle.acquired().await.expect("a leads alone");
    let b = candidate(&server, "b", &log);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let started = Instant::now();
    a.handle.shutdown().await;
    // The work had stopped before the release was written.
    assert_eq!(stops(&log, "a").len(), 1);
    assert_eq!(holder(&server).0, "");
    b.handle.acquired().await.expect("b takes over");
    let waited = Instant::now() - started;
    assert!(waited <= config.retry_period.mul_f64(1.2), "{waited:?}");
    assert_eq!(holder(&server), ("b".to_string(), 1));
    assert_no_overlap(&log);
    // A shut-down candidate reports that it will never lead again.
    assert!(a.handle.acquired().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_releases_the_lease() {
    let server = Arc::new(FakeLeases::default());
    let client = Client::new(FakeTransport {
        server: server.clone(),
        fail_writes: Arc::default(),
    });
    let lock = LeaseLock::new("kube-system", "controller").with_identity("a");
    let handle = LeaderElector::new(client, lock, LeaderConfig::default())
        .unwrap()
        .start();
    let leadership = handle.acquired().await.unwrap();
    let mut leading = handle.is_leader();
    assert!(*leading.borrow_and_update());
    drop(handle);
    leadership.lost().await;
    assert!(!leadership.is_valid());
    drop(leadership);
    leading.wait_for(|l| !*l).await.unwrap();
    // Released once the last token was dropped.
    tokio::time::timeout(Duration::from_secs(1), async {
        while !holder(&server).0.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("released");
}

#[tokio::test(start_paused = true)]
async fn tokens_expire_at_the_renew_deadline_on_their_own() {
    let server = Arc::new(FakeLeases::default());
    let fail = Arc::new(AtomicBool::new(false));
    let client = Client::new(FakeTransport {
        server: server.clone(),
        fail_writes: fail.clone(),
    });
    let lock = LeaseLock::new("kube-system", "controller").with_identity("a");
    let handle = LeaderElector::new(client, lock, LeaderConfig::default())
        .unwrap()
        .start();
    let leadership = handle.acquired().await.unwrap();
    assert_eq!(leadership.term(), 1);
    fail.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let out = leadership.run(std::future::pending::<()>()).await;
    assert_eq!(out, None);
    assert!(Instant::now() - t0 <= Duration::from_secs(10));
    assert!(!handle.is_leading());
    // Writes work again: the same process may lead again, in a new term.
    fail.store(false, Ordering::SeqCst);
    let again = handle.acquired().await.unwrap();
    assert_eq!(again.term(), 2);
    // Nobody else held the Lease in between.
    assert!(!again.follows_another());
    assert_eq!(holder(&server), ("a".to_string(), 0));
}

/// Counts the writes that reach it, noting whether the term was still valid when each did.
struct Writes {
    term: Leadership,
    sent: Mutex<Vec<(Instant, bool)>>,
}

#[async_trait]
impl Transport for Arc<Writes> {
    async fn send(&self, _req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        self.sent
            .lock()
            .push((Instant::now(), self.term.is_valid()));
        respond(201, &json!({"metadata": {"name": "x"}}))
    }
}

#[tokio::test(start_paused = true)]
async fn a_fenced_batch_stops_writing_when_the_term_lapses_mid_way() {
    // A leader starts a batch of creates that a rate limit spreads over 30 s (one a second),
    // then can no longer renew: the creates still queued at its renew deadline are refused
    // without being sent, though they were all started while it led.
    let server = Arc::new(FakeLeases::default());
    let fail = Arc::new(AtomicBool::new(false));
    let client = Client::new(FakeTransport {
        server: server.clone(),
        fail_writes: fail.clone(),
    });
    let lock = LeaseLock::new("kube-system", "controller").with_identity("a");
    let handle = LeaderElector::new(client, lock, LeaderConfig::default())
        .unwrap()
        .start();
    let term = handle.acquired().await.unwrap();
    let writes = Arc::new(Writes {
        term: term.clone(),
        sent: Mutex::new(Vec::new()),
    });
    let work = Client::new(writes.clone()).with_rate_limit(1.0, 1);
    fail.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let results = term
        .fence(futures::future::join_all((0..30).map(|_| {
            work.request(
                http::Method::POST,
                "/api/v1/namespaces/a/pods",
                None,
                Bytes::new(),
            )
        })))
        .await;
    let sent = writes.sent.lock().clone();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(ClientError::NotSent(_))))
        .count();
    assert!(sent.iter().all(|(_, valid)| *valid), "{sent:?}");
    // The last renewal was sent at most a retry period before the failures began, so the
    // deadline falls 8–10 s in: 8–10 creates went out, the other 20 or more did not.
    assert!((8..=10).contains(&sent.len()), "{}", sent.len());
    assert_eq!(sent.len() + refused, 30);
    assert!(sent
        .iter()
        .all(|(at, _)| *at - t0 < LeaderConfig::default().renew_deadline));
    // Only work inside the fence is refused.
    assert!(work
        .request(
            http::Method::POST,
            "/api/v1/namespaces/a/pods",
            None,
            Bytes::new()
        )
        .await
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn metric_reports_leading() {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = LeaderMetrics::new(&mut registry);
    let server = Arc::new(FakeLeases::default());
    let client = Client::new(FakeTransport {
        server,
        fail_writes: Arc::default(),
    });
    let lock = LeaseLock::new("kube-system", "controller");
    let handle = LeaderElector::new(client, lock, LeaderConfig::default())
        .unwrap()
        .with_metrics(metrics)
        .start();
    let encode = |registry: &prometheus_client::registry::Registry| {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, registry).unwrap();
        s
    };
    handle.acquired().await.unwrap();
    assert!(
        encode(&registry).contains("leader_election_master_status{name=\"controller\"} 1"),
        "{}",
        encode(&registry)
    );
    handle.shutdown().await;
    assert!(
        encode(&registry).contains("leader_election_master_status{name=\"controller\"} 0"),
        "{}",
        encode(&registry)
    );
}

#[test]
fn config_must_order_retry_renew_and_lease() {
    assert!(LeaderConfig::default().validate().is_ok());
    let c = |l: u64, r: u64, p: u64| LeaderConfig {
        lease_duration: Duration::from_millis(l),
        renew_deadline: Duration::from_millis(r),
        retry_period: Duration::from_millis(p),
        release_on_shutdown: true,
    };
    assert!(c(1000, 600, 100).validate().is_ok());
    assert!(c(1000, 1000, 100).validate().is_err());
    assert!(c(1000, 600, 600).validate().is_err());
    assert!(c(1000, 600, 0).validate().is_err());
    assert!(c(500, 300, 100).validate().is_err());
    assert_eq!(c(1500, 600, 100).lease_seconds(), 2);
    assert_eq!(LeaderConfig::default().lease_seconds(), 15);
    let client = Client::new(FakeTransport {
        server: Arc::default(),
        fail_writes: Arc::default(),
    });
    let lock = LeaseLock::new("kube-system", "x").with_identity("");
    assert!(matches!(
        LeaderElector::new(client, lock, LeaderConfig::default()),
        Err(LeaderElectionError::InvalidLock(_))
    ));
}

#[test]
fn default_identities_are_unique() {
    let (a, b) = (default_identity(), default_identity());
    assert_ne!(a, b);
    assert!(a.starts_with(&hostname()));
}

#[tokio::test(start_paused = true)]
async fn without_release_shutdown_still_stops_the_work_but_keeps_the_lease() {
    let server = Arc::new(FakeLeases::default());
    let client = Client::new(FakeTransport {
        server: server.clone(),
        fail_writes: Arc::default(),
    });
    let lock = LeaseLock::new("kube-system", "controller").with_identity("a");
    let config = LeaderConfig {
        release_on_shutdown: false,
        ..LeaderConfig::default()
    };
    let handle = LeaderElector::new(client, lock, config).unwrap().start();
    let log: Log = Arc::default();
    let (h, work_log) = (handle.clone(), log.clone());
    tokio::spawn(async move {
        h.run_while_leading(|_| {
            let log = work_log.clone();
            async move {
                log.lock().push((Instant::now(), Mark::Start("a")));
                let _stop = StopMark("a", log);
                std::future::pending::<()>().await
            }
        })
        .await
    });
    handle.acquired().await.unwrap();
    logged(&log, Mark::Start("a")).await;
    handle.shutdown().await;
    assert_eq!(
        stops(&log, "a").len(),
        1,
        "shutdown returned before the work stopped"
    );
    assert_eq!(holder(&server), ("a".to_string(), 0));
}
