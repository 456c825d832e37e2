//! Leader election on `coordination.k8s.io/v1` Leases: of several replicas of a controller,
//! exactly one acts at a time, and a replica that cannot prove it still holds the lease stops
//! acting before anyone else can take over.
//!
//! ```no_run
//! # async fn demo(client: setpoint_runtime::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use setpoint_runtime::leader::{LeaderConfig, LeaderElector, LeaseLock};
//! use setpoint_runtime::metrics::LeaderMetrics;
//!
//! let mut registry = prometheus_client::registry::Registry::default();
//! let metrics = LeaderMetrics::new(&mut registry);
//! let lock = LeaseLock::new("kube-system", "my-operator");
//! let handle = LeaderElector::new(client, lock, LeaderConfig::default())?
//!     .with_metrics(metrics)
//!     .start();
//!
//! // Every replica starts its informers now, so a new leader's caches are already warm.
//! let leader = handle.clone();
//! tokio::spawn(async move {
//!     leader
//!         .run_while_leading(|leadership| async move {
//!             // Reconcile loops go here. This future is dropped the moment leadership is
//!             // lost; `leadership.is_valid()` can also be checked before a write.
//!             let _ = leadership;
//!             std::future::pending::<()>().await
//!         })
//!         .await;
//! });
//!
//! tokio::signal::ctrl_c().await?;
//! // Stops the work, then hands the lease to a standby at once instead of letting it expire.
//! handle.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # How it decides
//!
//! - A candidate reads the Lease every retry period (with a little jitter). It writes itself in
//!   as holder when the Lease is absent (create), names it already, has an empty holder (a
//!   graceful release), or has not changed for a whole `leaseDurationSeconds`. Every write
//!   carries the resourceVersion it read, so of two candidates racing for the same expired
//!   Lease only one write succeeds; the other gets 409 and stays a standby.
//! - Expiry is judged with the local monotonic clock, never the `renewTime` in the object: a
//!   candidate remembers when it *first saw* the current record, and the holder counts as dead
//!   once that record has stayed unchanged for the lease duration. Clock differences between
//!   machines therefore do not matter, only clock rates.
//! - The holder renews every retry period. Its leadership is valid until `renew_deadline`
//!   after it *sent* its last successful write. Any other candidate saw that write no earlier
//!   than it was sent, and waits a full lease duration from then, so with
//!   `renew_deadline < lease_duration` the old leader has stopped before a new one can win;
//!   the difference is the safety margin for clock rates and scheduling delays.
//! - When leadership ends — deadline passed, lease taken, shutdown — the state flips to "not
//!   leading" first; [`Leadership::lost`] resolves and work run through
//!   [`Leadership::run`] / [`LeaderHandle::run_while_leading`] is dropped. Tokens also check
//!   the deadline themselves, so work stops on time even if the elector task is starved.
//! - On [`LeaderHandle::shutdown`] the elector waits for outstanding [`Leadership`] tokens to
//!   be dropped (bounded by the lease validity), then writes an empty holder so a standby can
//!   take over on its next poll (client-go's `ReleaseOnCancel`).
//! - After losing leadership a replica keeps campaigning and can lead again later.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::{Api, Client, ClientError, PostParams};
use crate::metrics::LeaderMetrics;

/// Which Lease to hold, and who we are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLock {
    /// The Lease's namespace, e.g. `kube-system`.
    pub namespace: String,
    /// The Lease's name, e.g. `kube-controller-manager`.
    pub name: String,
    /// Unique per process: two replicas with the same identity would both believe they lead.
    pub identity: String,
}

impl LeaseLock {
    /// A lock on `namespace/name` with a fresh [`default_identity`].
    pub fn new(namespace: &str, name: &str) -> Self {
        LeaseLock {
            namespace: namespace.into(),
            name: name.into(),
            identity: default_identity(),
        }
    }

    /// Replaces the identity (e.g. with the pod name).
    pub fn with_identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }
}

/// `<hostname>_<random UUID>`, the form kube-controller-manager and kube-scheduler write:
/// readable in `kubectl get lease`, and unique even when a restarted process comes back on the
/// same host before its old lease expired.
pub fn default_identity() -> String {
    format!("{}_{}", hostname(), uuid::Uuid::new_v4())
}

/// The host's name, for identities and event reporters.
pub(crate) fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Timing of an election. The defaults are client-go's (15 s / 10 s / 2 s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// How long standbys wait after the last change of the Lease before taking it over.
    /// Written as whole seconds (rounded up) into `leaseDurationSeconds`.
    pub lease_duration: Duration,
    /// How long the leader keeps acting after sending its last successful renewal. Must be
    /// less than `lease_duration`; the difference is the safety margin.
    pub renew_deadline: Duration,
    /// How often the leader renews and standbys poll.
    pub retry_period: Duration,
    /// On [`LeaderHandle::shutdown`], clear the holder so a standby takes over at once.
    pub release_on_shutdown: bool,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            release_on_shutdown: true,
        }
    }
}

impl LeaderConfig {
    /// Checks the ordering `retry_period < renew_deadline < lease_duration` that makes the
    /// election safe (see the module docs).
    pub fn validate(&self) -> Result<(), LeaderElectionError> {
        let bad = |m: String| Err(LeaderElectionError::InvalidConfig(m));
        if self.lease_duration < Duration::from_secs(1) {
            return bad(format!(
                "lease duration {:?} is below the Lease's 1 s resolution",
                self.lease_duration
            ));
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return bad(format!(
                "lease duration {:?} is too long",
                self.lease_duration
            ));
        }
        if self.renew_deadline >= self.lease_duration {
            return bad(format!(
                "renew deadline {:?} must be less than the lease duration {:?}, or the old \
                 leader could still be acting when a standby takes over",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return bad(format!(
                "retry period {:?} must be positive and less than the renew deadline {:?}, or \
                 the leader gets no second try before its deadline",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// `leaseDurationSeconds`: rounded up, so standbys never wait less than configured.
    fn lease_seconds(&self) -> i32 {
        let secs =
            self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// What can be wrong with an election's setup (runtime failures are retried, not returned).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaderElectionError {
    /// The [`LeaderConfig`] durations are out of range (the lease under 1 s or beyond an
    /// `i32` of seconds) or break `0 < retry_period < renew_deadline < lease_duration`.
    #[error("invalid leader election configuration: {0}")]
    InvalidConfig(String),
    /// The lock's namespace, name or identity is empty; says which.
    #[error("invalid lease lock: {0}")]
    InvalidLock(String),
}

/// A candidate, ready to [`start`](LeaderElector::start).
pub struct LeaderElector {
    api: Api<Lease>,
    lock: LeaseLock,
    config: LeaderConfig,
    metrics: Option<LeaderMetrics>,
}

impl LeaderElector {
    /// Checks the configuration and the lock; nothing is sent until [`start`](Self::start).
    pub fn new(
        client: Client,
        lock: LeaseLock,
        config: LeaderConfig,
    ) -> Result<Self, LeaderElectionError> {
        config.validate()?;
        for (what, v) in [
            ("namespace", &lock.namespace),
            ("name", &lock.name),
            ("identity", &lock.identity),
        ] {
            if v.is_empty() {
                return Err(LeaderElectionError::InvalidLock(format!("{what} is empty")));
            }
        }
        Ok(LeaderElector {
            api: Api::namespaced(client, &lock.namespace),
            lock,
            config,
            metrics: None,
        })
    }

    /// Reports `leader_election_master_status{name=<lease name>}`.
    pub fn with_metrics(mut self, metrics: LeaderMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Starts campaigning on a background task (needs a Tokio runtime). The task runs until
    /// [`LeaderHandle::shutdown`] or [`LeaderHandle::abort`], or until every handle is dropped
    /// (which shuts down gracefully, releasing the lease).
    pub fn start(self) -> LeaderHandle {
        let (leading_tx, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            lease: format!("{}/{}", self.lock.namespace, self.lock.name),
            state: Mutex::new(State {
                term: 0,
                successor: false,
                leading: false,
                valid_until: Instant::now(),
                guard: None,
                stopped: false,
            }),
            leading_tx,
            metrics: self.metrics.map(|m| (m, self.lock.name.clone())),
        });
        shared.report(false);
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let identity = self.lock.identity.clone();
        let elector = Elector {
            api: self.api,
            lock: self.lock,
            config: self.config,
            shared: shared.clone(),
            observed: None,
            successor: false,
        };
        let task = tokio::spawn(elector.run(shutdown_rx));
        LeaderHandle {
            inner: Arc::new(HandleInner {
                shared,
                identity,
                shutdown_tx,
                task: Mutex::new(Some(task)),
            }),
        }
    }
}

/// Control of a running candidate; cheap to clone.
#[derive(Clone)]
pub struct LeaderHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    shared: Arc<Shared>,
    identity: String,
    // Dropped with the last handle, which the elector takes as a graceful shutdown.
    shutdown_tx: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for LeaderHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderHandle")
            .field("lease", &self.inner.shared.lease)
            .field("identity", &self.inner.identity)
            .field("leading", &self.is_leading())
            .finish()
    }
}

impl LeaderHandle {
    /// This candidate's holder identity.
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// `true` while leading. The value flips to `false` as soon as leadership is lost, before
    /// any release is written.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.inner.shared.leading_tx.subscribe()
    }

    /// Whether this candidate leads now (and its renew deadline has not passed).
    pub fn is_leading(&self) -> bool {
        self.inner.shared.token().is_some()
    }

    /// A token for the current term, if leading.
    pub fn leadership(&self) -> Option<Leadership> {
        self.inner.shared.token()
    }

    /// Waits until this candidate leads; `None` once the elector has stopped.
    pub async fn acquired(&self) -> Option<Leadership> {
        // Subscribing before checking means a change between the check and the wait is not
        // missed: it marks the receiver as changed.
        let mut rx = self.inner.shared.leading_tx.subscribe();
        loop {
            if let Some(l) = self.inner.shared.token() {
                return Some(l);
            }
            if self.inner.shared.state.lock().stopped {
                return None;
            }
            if rx.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Runs `work` in every term this candidate leads, dropping its future the moment the
    /// term ends, until the elector stops. Work that finishes on its own is not restarted
    /// before the next term, so a one-shot job runs once per term rather than in a loop.
    pub async fn run_while_leading<F, Fut>(&self, mut work: F)
    where
        F: FnMut(Leadership) -> Fut,
        Fut: Future<Output = ()>,
    {
        while let Some(leadership) = self.acquired().await {
            let watcher = leadership.clone();
            watcher.run(work(leadership)).await;
            watcher.lost().await;
        }
    }

    /// Stops campaigning: ends the current term (work stops), waits for its tokens to be
    /// dropped, releases the lease if configured, and returns when all that is done.
    pub async fn shutdown(&self) {
        self.inner.shutdown_tx.send_replace(true);
        self.inner.shared.wait_stopped().await;
    }

    /// Stops at once without touching the Lease, as if the process had been killed: the
    /// lease stays with this identity until it expires. For tests and fatal errors.
    pub fn abort(&self) {
        if let Some(task) = self.inner.task.lock().take() {
            task.abort();
        }
        self.inner.shared.stop();
    }
}

/// Proof of leading in one term. Cloneable; while any clone exists a graceful shutdown
/// waits (up to the end of the lease's validity) before releasing the lease.
#[derive(Clone)]
pub struct Leadership {
    shared: Arc<Shared>,
    term: u64,
    successor: bool,
    // Counted by the term's guard sender: see `Elector::release`.
    _guard: watch::Receiver<()>,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("lease", &self.shared.lease)
            .field("term", &self.term)
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Leadership {
    /// Counts terms led by this process, from 1.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Whether this term took the Lease over from another holder (or from a released one):
    /// another replica may have acted just before, and this one's caches may not show all
    /// it wrote yet. False when this candidate created the Lease or still held it.
    pub fn follows_another(&self) -> bool {
        self.successor
    }

    /// Whether this term is still current and within its renew deadline.
    pub fn is_valid(&self) -> bool {
        self.valid_until().is_some()
    }

    fn valid_until(&self) -> Option<Instant> {
        let s = self.shared.state.lock();
        (s.leading && s.term == self.term && Instant::now() < s.valid_until)
            .then_some(s.valid_until)
    }

    /// Resolves when this term ends: lost, released, or past its renew deadline.
    pub async fn lost(&self) {
        let mut rx = self.shared.leading_tx.subscribe();
        while let Some(until) = self.valid_until() {
            // Waking at the deadline on our own (not only when the elector says so) keeps the
            // guarantee even if the elector task is starved; a renewal in the meantime just
            // moves the deadline and we sleep again.
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The Lease this term is on (`namespace/name`).
    pub fn lease(&self) -> &str {
        &self.shared.lease
    }

    /// Runs `work` fenced by this term: every write the [`Client`] would send from inside it
    /// (on this task, not tasks it spawns) once the term has ended is refused without being
    /// sent ([`ClientError::NotSent`]). The check is made after the client's rate limiter,
    /// right before the request goes out, and reads the local clock itself, so a reconcile
    /// that was frozen, starved or kept waiting for a token past its renew deadline cannot
    /// write after another replica may have taken over, whether or not the elector task has
    /// run in the meantime.
    pub async fn fence<F: Future>(&self, work: F) -> F::Output {
        FENCE.scope(self.clone(), work).await
    }

    /// Runs `work` until it completes (`Some`) or this term ends (`None`, `work` dropped).
    pub async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.lost() => None,
            out = work => Some(out),
        }
    }
}

tokio::task_local! {
    /// The term the current task's writes are fenced by ([`Leadership::fence`]).
    static FENCE: Leadership;
}

/// If the current task runs fenced by a term that has ended, why a write must not be sent.
pub(crate) fn fenced_out() -> Option<String> {
    FENCE
        .try_with(|l| {
            (!l.is_valid()).then(|| {
                format!(
                    "the leadership of {} (term {}) has ended or passed its renew deadline",
                    l.shared.lease, l.term
                )
            })
        })
        .ok()
        .flatten()
}

/// State shared by the elector task, handles and tokens.
struct Shared {
    lease: String,
    state: Mutex<State>,
    leading_tx: watch::Sender<bool>,
    metrics: Option<(LeaderMetrics, String)>,
}

struct State {
    term: u64,
    /// Whether the current term took the Lease from another holder.
    successor: bool,
    leading: bool,
    valid_until: Instant,
    /// Per term; tokens hold receivers, so `closed()` tells when all of them are gone.
    guard: Option<watch::Sender<()>>,
    stopped: bool,
}

impl Shared {
    fn report(&self, leading: bool) {
        if let Some((m, name)) = &self.metrics {
            m.set_leading(name, leading);
        }
    }

    fn token(self: &Arc<Self>) -> Option<Leadership> {
        let s = self.state.lock();
        if !s.leading || s.stopped || Instant::now() >= s.valid_until {
            return None;
        }
        Some(Leadership {
            shared: self.clone(),
            term: s.term,
            successor: s.successor,
            _guard: s.guard.as_ref()?.subscribe(),
        })
    }

    fn begin_term(&self, valid_until: Instant, successor: bool) -> u64 {
        let term = {
            let mut s = self.state.lock();
            s.term += 1;
            s.successor = successor;
            s.leading = true;
            s.valid_until = valid_until;
            s.guard = Some(watch::channel(()).0);
            s.term
        };
        self.leading_tx.send_replace(true);
        self.report(true);
        term
    }

    fn extend(&self, valid_until: Instant) {
        self.state.lock().valid_until = valid_until;
    }

    /// Marks the term over (state first, then the watch, so anyone woken by the watch sees
    /// it) and returns its guard and the end of its validity.
    fn end_term(&self) -> Option<(watch::Sender<()>, Instant)> {
        let ended = {
            let mut s = self.state.lock();
            if !s.leading {
                return None;
            }
            s.leading = false;
            s.guard.take().map(|g| (g, s.valid_until))
        };
        self.leading_tx.send_replace(false);
        self.report(false);
        ended
    }

    fn stop(&self) {
        {
            let mut s = self.state.lock();
            s.leading = false;
            s.guard = None;
            s.stopped = true;
        }
        // `send_modify` notifies even when the value was already false, which wakes
        // `acquired()` and `shutdown()` waiters so they can see `stopped`.
        self.leading_tx.send_modify(|v| *v = false);
        self.report(false);
    }

    async fn wait_stopped(&self) {
        let mut rx = self.leading_tx.subscribe();
        while !self.state.lock().stopped {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Marks the election stopped however the task ends: return, panic or abort.
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The result of one read-and-write of the Lease.
enum Attempt {
    /// We hold the lease; the successful write was sent at this instant.
    Holding(Instant),
    /// Someone else holds a lease that has not expired.
    HeldBy(String),
    /// The read or write failed (including 409: another writer got there first).
    Failed(ClientError),
}

enum TermEnd {
    Lost(String),
    Shutdown,
}

struct Elector {
    api: Api<Lease>,
    lock: LeaseLock,
    config: LeaderConfig,
    shared: Arc<Shared>,
    /// The last Lease spec we saw and when we first saw it (local monotonic time).
    observed: Option<(LeaseSpec, Instant)>,
    /// Whether our last successful write took the Lease from another (or an empty) holder.
    successor: bool,
}

/// Resolves when shutdown was asked for or every handle is gone.
async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

fn micro_now() -> MicroTime {
    let micros = chrono::Utc::now().timestamp_micros();
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_microsecond(micros)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

impl Elector {
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let _stop = StopOnDrop(self.shared.clone());
        let mut ended = None;
        loop {
            let Some(valid_until) = self.acquire(&mut shutdown).await else {
                break;
            };
            let term = self.shared.begin_term(valid_until, self.successor);
            tracing::info!(lease = %self.shared.lease, identity = %self.lock.identity, term, "became leader");
            let end = self.hold(&mut shutdown, valid_until).await;
            let this_term = self.shared.end_term();
            match end {
                TermEnd::Lost(why) => {
                    tracing::warn!(lease = %self.shared.lease, identity = %self.lock.identity, term, "lost leadership: {why}");
                }
                TermEnd::Shutdown => {
                    tracing::info!(lease = %self.shared.lease, identity = %self.lock.identity, term, "stopped leading: shutting down");
                    ended = this_term;
                    break;
                }
            }
        }
        // Either way, `shutdown()` returns only once the last term's work has stopped.
        let work_stopped = match ended {
            Some((guard, valid_until)) => tokio::time::timeout_at(valid_until, guard.closed())
                .await
                .is_ok(),
            None => true,
        };
        if !work_stopped {
            tracing::warn!(lease = %self.shared.lease, "leader work still running at the end of the lease's validity; not releasing");
        } else if self.config.release_on_shutdown {
            self.release().await;
        }
    }

    /// Campaigns until we hold the lease (returns the end of its validity) or shutdown.
    async fn acquire(&mut self, shutdown: &mut watch::Receiver<bool>) -> Option<Instant> {
        loop {
            // Bounded so a hung request cannot wedge the campaign; a write that lands after
            // we gave up is harmless (the lease names us but nobody acts until we renew it).
            let attempt = tokio::select! {
                biased;
                _ = shutdown_requested(shutdown) => return None,
                r = tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()) => r,
            };
            match attempt {
                Ok(Attempt::Holding(sent)) => {
                    let valid_until = sent + self.config.renew_deadline;
                    if Instant::now() < valid_until {
                        return Some(valid_until);
                    }
                }
                Ok(Attempt::HeldBy(holder)) => {
                    tracing::trace!(lease = %self.shared.lease, %holder, "lease held by another candidate");
                }
                Ok(Attempt::Failed(e)) if e.is_conflict() || e.is_already_exists() => {
                    tracing::debug!(lease = %self.shared.lease, "lost a race for the lease: {e}");
                }
                Ok(Attempt::Failed(e)) => {
                    tracing::warn!(lease = %self.shared.lease, "failed to acquire the lease: {e}");
                }
                Err(_) => {
                    tracing::warn!(lease = %self.shared.lease, "acquiring the lease timed out");
                }
            }
            // Jitter (as client-go's 1.2 factor) so standbys that started together do not
            // poll in lockstep.
            let pause = self
                .config
                .retry_period
                .mul_f64(1.0 + 0.2 * rand::random::<f64>());
            tokio::select! {
                biased;
                _ = shutdown_requested(shutdown) => return None,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Renews while leading; returns why the term ended.
    async fn hold(
        &mut self,
        shutdown: &mut watch::Receiver<bool>,
        mut valid_until: Instant,
    ) -> TermEnd {
        let deadline_passed = || TermEnd::Lost("could not renew before the renew deadline".into());
        loop {
            tokio::select! {
                biased;
                _ = shutdown_requested(shutdown) => return TermEnd::Shutdown,
                _ = tokio::time::sleep_until(valid_until) => return deadline_passed(),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            // The deadline is raced against the request itself: a renewal still in flight at
            // the deadline does not count, because standbys may already be counting down.
            let attempt = tokio::select! {
                biased;
                _ = shutdown_requested(shutdown) => return TermEnd::Shutdown,
                _ = tokio::time::sleep_until(valid_until) => return deadline_passed(),
                r = self.try_acquire_or_renew() => r,
            };
            match attempt {
                Attempt::Holding(sent) => {
                    valid_until = sent + self.config.renew_deadline;
                    self.shared.extend(valid_until);
                }
                Attempt::HeldBy(holder) => {
                    return TermEnd::Lost(format!("the lease is now held by {holder}"))
                }
                Attempt::Failed(e) => {
                    tracing::warn!(lease = %self.shared.lease, "failed to renew the lease, retrying until the renew deadline: {e}");
                }
            }
        }
    }

    /// Remembers when the record last changed, by our clock.
    fn observe(&mut self, spec: &LeaseSpec, now: Instant) {
        if self.observed.as_ref().map(|(s, _)| s) != Some(spec) {
            self.observed = Some((spec.clone(), now));
        }
    }

    /// Whether the observed record has gone unchanged for its lease duration.
    fn observed_expired(&self, now: Instant) -> bool {
        let Some((spec, seen)) = &self.observed else {
            return false;
        };
        let secs = spec
            .lease_duration_seconds
            .filter(|s| *s > 0)
            .unwrap_or_else(|| self.config.lease_seconds());
        *seen + Duration::from_secs(secs.unsigned_abs().into()) < now
    }

    /// One read of the Lease and, if we may hold it, one conditional write.
    async fn try_acquire_or_renew(&mut self) -> Attempt {
        let current = match self.api.get_opt(&self.lock.name).await {
            Ok(l) => l,
            Err(e) => return Attempt::Failed(e),
        };
        let now_wall = micro_now();
        let Some(lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lock.name.clone()),
                    namespace: Some(self.lock.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.lock.identity.clone()),
                    lease_duration_seconds: Some(self.config.lease_seconds()),
                    acquire_time: Some(now_wall.clone()),
                    renew_time: Some(now_wall),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observed = Some((created.spec.unwrap_or_default(), Instant::now()));
                    self.successor = false;
                    Attempt::Holding(sent)
                }
                Err(e) => Attempt::Failed(e),
            };
        };

        let old = lease.spec.clone().unwrap_or_default();
        let now = Instant::now();
        self.observe(&old, now);
        let holder = old.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.lock.identity;
        if !ours && !holder.is_empty() && !self.observed_expired(now) {
            return Attempt::HeldBy(holder);
        }
        let transitions = old.lease_transitions.unwrap_or(0);
        let spec = LeaseSpec {
            holder_identity: Some(self.lock.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_seconds()),
            acquire_time: if ours {
                old.acquire_time.clone().or_else(|| Some(now_wall.clone()))
            } else {
                Some(now_wall.clone())
            },
            renew_time: Some(now_wall),
            lease_transitions: Some(if ours {
                transitions
            } else {
                transitions.saturating_add(1)
            }),
            // Keep fields we do not manage (preferredHolder, strategy).
            ..old
        };
        let mut next = lease;
        next.spec = Some(spec);
        // `next` carries the resourceVersion we read: the write is conditional on it.
        let sent = Instant::now();
        match self
            .api
            .replace(&self.lock.name, &PostParams::default(), &next)
            .await
        {
            Ok(updated) => {
                self.observed = Some((updated.spec.unwrap_or_default(), Instant::now()));
                self.successor = !ours;
                Attempt::Holding(sent)
            }
            Err(e) => Attempt::Failed(e),
        }
    }

    /// Clears the holder if it is still us (called once no work of ours is running).
    async fn release(&mut self) {
        let release = async {
            let Some(lease) = self.api.get_opt(&self.lock.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.lock.identity.as_str()) {
                return Ok(false);
            }
            let now = micro_now();
            let mut next = lease;
            next.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                // What client-go writes, so candidates that ignore an empty holder still
                // take over within a second.
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            });
            self.api
                .replace(&self.lock.name, &PostParams::default(), &next)
                .await
                .map(|_| true)
        };
        match tokio::time::timeout(self.config.renew_deadline, release).await {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.shared.lease, identity = %self.lock.identity, "released the lease")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.shared.lease, "failed to release the lease: {e}")
            }
            Err(_) => tracing::warn!(lease = %self.shared.lease, "releasing the lease timed out"),
        }
    }
}

#[cfg(test)]
mod tests;
