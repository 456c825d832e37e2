//! Controllers: a [`Reconciler`] driven by a work queue that informers feed.
//!
//! A reconcile gets a key (`namespace/name`), reads current state (from caches), acts on the
//! whole gap and returns an [`Action`]. It never depends on which event woke it. Errors are
//! retried with per-key exponential backoff unless marked terminal; a panic in one reconcile is
//! caught, counted and retried and never stops the controller; a reconcile that exceeds its
//! timeout is cancelled and retried.
//!
//! ```no_run
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use setpoint_runtime::controller::{Action, Context, Controller, ReconcileError, Reconciler};
//! use setpoint_runtime::informer::SharedInformers;
//! use setpoint_runtime::ObjectKey;
//!
//! struct Echo;
//! #[async_trait::async_trait]
//! impl Reconciler for Echo {
//!     async fn reconcile(&self, _ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError> {
//!         println!("reconciling {key}");
//!         Ok(Action::Done)
//!     }
//! }
//! # async fn demo(client: setpoint_runtime::Client) {
//! let informers = SharedInformers::new(client);
//! let controller = Controller::for_type::<ConfigMap>("echo", &informers, None).build(Arc::new(Echo));
//! controller.run(std::future::pending()).await;
//! # }
//! ```

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::Instrument;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::client::{ApiResource, ClientError};
use crate::decision::{ObjectRef, Trigger};
use crate::informer::{Event, Handler, Informer, Scope, SharedInformers};
use crate::leader::{LeaderHandle, Leadership};
use crate::object::{Object, ObjectKey};
use crate::workqueue::{WorkItem, WorkQueue, WorkQueueBuilder, WorkQueueMetrics};

/// What to do after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing more until something changes.
    Done,
    /// Check again after this long (a timed re-check, not a retry: backoff is reset).
    RequeueAfter(Duration),
}

/// A failed reconcile.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ReconcileError {
    /// What went wrong, as logged and recorded.
    pub message: String,
    /// Retrying cannot help (e.g. an invalid spec): don't requeue; record it in status and an
    /// event instead of hammering the API.
    pub terminal: bool,
}

impl ReconcileError {
    /// A failure worth retrying with backoff.
    pub fn retry(e: impl std::fmt::Display) -> Self {
        ReconcileError {
            message: e.to_string(),
            terminal: false,
        }
    }
    /// A failure retrying cannot fix.
    pub fn terminal(e: impl std::fmt::Display) -> Self {
        ReconcileError {
            message: e.to_string(),
            terminal: true,
        }
    }
}

impl From<ClientError> for ReconcileError {
    fn from(e: ClientError) -> Self {
        ReconcileError::retry(e)
    }
}

/// What a reconcile knows about its invocation.
#[derive(Clone, Debug)]
pub struct Context {
    /// The controller's name.
    pub controller: Arc<str>,
    /// Failures recorded for this key since its last success.
    pub retries: u32,
    /// The leadership term this reconcile runs in (a controller run with
    /// [`Controller::with_leader`]).
    leadership: Option<Leadership>,
}

impl Context {
    /// Whether this reconcile may still act: always without leader election; with it, while
    /// its term lasts and its renew deadline has not passed by the local clock. Checked
    /// between batches of writes, so a reconcile whose term ends stops cleanly; writes are
    /// also refused by the client once the term is over ([`Leadership::fence`]).
    pub fn may_act(&self) -> bool {
        self.leadership.as_ref().is_none_or(Leadership::is_valid)
    }

    /// The number of the leadership term this reconcile runs in (`None` without leader
    /// election).
    pub fn term(&self) -> Option<u64> {
        self.leadership.as_ref().map(Leadership::term)
    }

    /// The term's number if it took over from another replica
    /// ([`Leadership::follows_another`]): what this replica's caches show can then lag writes
    /// the other one made just before it stopped. `None` without leader election, and in a
    /// term that followed nobody (this replica created the Lease, or held it throughout).
    pub fn successor_term(&self) -> Option<u64> {
        self.leadership
            .as_ref()
            .filter(|l| l.follows_another())
            .map(Leadership::term)
    }

    /// Adds a summary of the state this reconcile observed (e.g. `3 desired, 2 active, 1
    /// terminating`) to its decision record ([`crate::decision`]).
    pub fn observe(&self, summary: impl Into<String>) {
        crate::decision::observe(summary);
    }

    /// Records an action this reconcile took and the rule that chose it (e.g. `create 1
    /// pod`, `fewer active pods than desired`).
    pub fn action(&self, what: impl Into<String>, rule: impl Into<String>) {
        crate::decision::action(what, rule);
    }

    /// Whether this reconcile keeps a decision record (false when records are off): compute
    /// summaries only for one.
    pub fn recording(&self) -> bool {
        crate::decision::recording()
    }

    /// This reconcile's decision id, which its writes carry (`None` when records are off).
    pub fn decision_id(&self) -> Option<String> {
        crate::decision::current_id()
    }
}

/// What woke each queued key since it was last taken, per controller: the decision record's
/// triggers. Bounded by the queue (one entry per queued key, a few triggers each).
#[derive(Clone, Default)]
struct Triggers(Arc<parking_lot::Mutex<std::collections::HashMap<ObjectKey, Vec<Trigger>>>>);

impl Triggers {
    /// Notes that `ev` (about an object of `kind`) queued `key`.
    fn note<K: Object>(&self, key: &ObjectKey, kind: &str, ev: &Event<K>) {
        if !crate::decision::enabled() {
            return;
        }
        let mut map = self.0.lock();
        let list = map.entry(key.clone()).or_default();
        if list.len() < crate::decision::MAX_TRIGGERS {
            // An update can queue one key twice (through its old and new state).
            let t = trigger_of(kind, ev);
            if !list.contains(&t) {
                list.push(t);
            }
        }
    }

    fn take(&self, key: &ObjectKey) -> Vec<Trigger> {
        if !crate::decision::enabled() {
            return Vec::new();
        }
        self.0.lock().remove(key).unwrap_or_default()
    }
}

/// The trigger a watch event makes; an update that keeps the resourceVersion is a resync.
fn trigger_of<K: Object>(kind: &str, ev: &Event<K>) -> Trigger {
    let (reason, obj) = match ev {
        Event::Added(o) => ("ADDED", o),
        Event::Updated { old, new } if old.resource_version() == new.resource_version() => {
            ("resync", new)
        }
        Event::Updated { new, .. } => ("MODIFIED", new),
        Event::Deleted(o) => ("DELETED", o),
    };
    Trigger::event(
        reason,
        ObjectRef::new(kind, &obj.namespace().unwrap_or_default(), &obj.name()),
        obj.resource_version(),
    )
}

/// The decision-and-act step of a controller.
#[async_trait::async_trait]
pub trait Reconciler: Send + Sync + 'static {
    /// Brings the object named by `key` to its desired state. Must be idempotent.
    async fn reconcile(&self, ctx: &Context, key: &ObjectKey) -> Result<Action, ReconcileError>;

    /// Called when a reconcile of `key` did not run to its end: cancelled because leadership
    /// was lost, timed out, or panicked. Writes it had started may or may not have happened.
    /// A controller that keeps in-memory expectations of its writes forgets them for `key`
    /// here, as upstream lowers them when a write fails; otherwise the next reconcile of
    /// `key` (in this replica's next term, say) would wait for writes that were never sent
    /// until the expectations time out.
    fn interrupted(&self, key: &ObjectKey) {
        let _ = key;
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.00001, 2.0, 24,
    ))
}

/// `controller_runtime_*` metrics, shared by all controllers of a manager.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    total: Family<ResultLabels, Counter>,
    errors: Family<ControllerLabel, Counter>,
    panics: Family<ControllerLabel, Counter>,
    time: Family<ControllerLabel, Histogram, fn() -> Histogram>,
    /// Work queue metrics for the controllers' queues.
    pub queue: WorkQueueMetrics,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Creates the metrics without registering them.
    pub fn new() -> Self {
        ControllerMetrics {
            total: Family::default(),
            errors: Family::default(),
            panics: Family::default(),
            time: Family::new_with_constructor(reconcile_histogram),
            queue: WorkQueueMetrics::new(),
        }
    }

    /// Registers every series (and the work queue's) into `registry`, once.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "controller_runtime_reconcile",
            "Reconciles by controller and result",
            self.total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that returned an error",
            self.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_panics",
            "Reconciles that panicked",
            self.panics.clone(),
        );
        registry.register_with_unit(
            "controller_runtime_reconcile_time",
            "Time per reconcile",
            prometheus_client::registry::Unit::Seconds,
            self.time.clone(),
        );
        self.queue.register(registry);
    }

    fn record(&self, controller: &str, result: &str, elapsed: Duration) {
        self.total
            .get_or_create(&ResultLabels {
                controller: controller.into(),
                result: result.into(),
            })
            .inc();
        self.time
            .get_or_create(&ControllerLabel {
                controller: controller.into(),
            })
            .observe(elapsed.as_secs_f64());
        match result {
            "error" => {
                self.errors
                    .get_or_create(&ControllerLabel {
                        controller: controller.into(),
                    })
                    .inc();
            }
            "panic" => {
                self.errors
                    .get_or_create(&ControllerLabel {
                        controller: controller.into(),
                    })
                    .inc();
                self.panics
                    .get_or_create(&ControllerLabel {
                        controller: controller.into(),
                    })
                    .inc();
            }
            _ => {}
        }
    }
}

/// A source of keys: registers itself with informers and adds keys to the queue.
pub type Source =
    Box<dyn FnOnce(WorkQueue<ObjectKey>) -> futures::future::BoxFuture<'static, ()> + Send>;

/// Options of a controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Concurrent reconciles (different keys). Default: number of cores.
    pub workers: usize,
    /// A reconcile running longer than this is cancelled and retried.
    pub reconcile_timeout: Option<Duration>,
    /// Every object is reconciled again at about this period (with jitter), even without
    /// events — the safety net of a level-triggered design.
    pub resync: Option<Duration>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2),
            reconcile_timeout: Some(Duration::from_secs(60)),
            resync: Some(Duration::from_secs(10 * 3600)),
        }
    }
}

/// A built controller: a queue, its sources, and a reconciler. Run it with [`Controller::run`].
pub struct Controller {
    name: Arc<str>,
    /// The kind of the objects its keys name (empty if unknown), for decision records.
    kind: Arc<str>,
    triggers: Triggers,
    queue: WorkQueue<ObjectKey>,
    sources: Vec<Source>,
    reconciler: Arc<dyn Reconciler>,
    options: ControllerOptions,
    metrics: ControllerMetrics,
    leader: Option<watch::Receiver<bool>>,
    /// The election itself, when known: reconciles then run in a term's [`Leadership`].
    handle: Option<LeaderHandle>,
    informers: Option<SharedInformers>,
}

impl Controller {
    /// Assembles a controller from parts ([`Controller::for_type`] and its builder are the usual way).
    pub fn from_parts(
        name: &str,
        queue: WorkQueueBuilder<ObjectKey>,
        sources: Vec<Source>,
        reconciler: Arc<dyn Reconciler>,
        options: ControllerOptions,
        metrics: ControllerMetrics,
    ) -> Self {
        let queue = queue.metrics(&metrics.queue).build();
        Controller {
            name: name.into(),
            kind: "".into(),
            triggers: Triggers::default(),
            queue,
            sources,
            reconciler,
            options,
            metrics,
            leader: None,
            handle: None,
            informers: None,
        }
    }

    /// Reconcile only while this is true (leader election); sources keep caches warm anyway.
    pub fn with_leadership(mut self, leader: watch::Receiver<bool>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// Reconcile only while `handle` leads, each reconcile in its term: it is cancelled when
    /// the term ends or its renew deadline passes by the local clock (even if the elector
    /// task has not run since), its writes are fenced by the term
    /// ([`Leadership::fence`]), and [`Context::may_act`] and [`Context::term`] tell it
    /// where it stands. Preferred to [`Controller::with_leadership`], whose signal flips
    /// only when the elector task runs.
    pub fn with_leader(mut self, handle: LeaderHandle) -> Self {
        self.leader = Some(handle.is_leader());
        self.handle = Some(handle);
        self
    }

    /// Records into `metrics` (reconciles and the queue's series) instead of the metrics the
    /// controller was built with; a controller manager hands one shared set to every
    /// controller it builds this way.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.queue.record_metrics(&metrics.queue);
        self.metrics = metrics;
        self
    }

    /// Sets the number of concurrent reconciles of a built controller (a controller manager
    /// configures the controllers it builds this way).
    pub fn with_workers(mut self, n: usize) -> Self {
        self.options.workers = n.max(1);
        self
    }

    /// The queue (e.g. to enqueue keys from outside, or for tests).
    pub fn queue(&self) -> &WorkQueue<ObjectKey> {
        &self.queue
    }

    /// Runs until `shutdown` completes, then drains in-flight reconciles.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let Controller {
            name,
            kind,
            triggers,
            queue,
            sources,
            reconciler,
            options,
            metrics,
            leader,
            handle,
            informers,
        } = self;
        let mut source_tasks = Vec::new();
        for s in sources {
            source_tasks.push(tokio::spawn(s(queue.clone())));
        }
        // Reconciles read caches: don't start before they hold a full LIST.
        if let Some(i) = &informers {
            // Decision records reach the API server this controller talks to.
            crate::decision::publish(i.client());
            if let Err(e) = i.wait_synced().await {
                tracing::error!(controller = %name, error = %e, "informers did not sync");
            }
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut workers = Vec::new();
        for _ in 0..options.workers.max(1) {
            let w = Worker {
                name: name.clone(),
                kind: kind.clone(),
                triggers: triggers.clone(),
                queue: queue.clone(),
                reconciler: reconciler.clone(),
                timeout: options.reconcile_timeout,
                metrics: metrics.clone(),
                leader: leader.clone(),
                handle: handle.clone(),
                stop: stop_rx.clone(),
            };
            workers.push(tokio::spawn(w.run()));
        }
        shutdown.await;
        tracing::info!(controller = %name, "shutting down");
        for t in &source_tasks {
            t.abort();
        }
        let _ = stop_tx.send(true);
        queue.shutdown_with_drain().await;
        for w in workers {
            let _ = w.await;
        }
    }
}

struct Worker {
    name: Arc<str>,
    kind: Arc<str>,
    triggers: Triggers,
    queue: WorkQueue<ObjectKey>,
    reconciler: Arc<dyn Reconciler>,
    timeout: Option<Duration>,
    metrics: ControllerMetrics,
    leader: Option<watch::Receiver<bool>>,
    handle: Option<LeaderHandle>,
    stop: watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self) {
        loop {
            if let Some(l) = &mut self.leader {
                // Standby: wait for leadership (or shutdown) before taking work.
                tokio::select! {
                    r = l.wait_for(|lead| *lead) => if r.is_err() { return },
                    _ = self.stop.wait_for(|s| *s) => return,
                }
            }
            let Some(item) = self.queue.get().await else {
                return;
            };
            if self.leader.as_ref().is_some_and(|l| !*l.borrow()) {
                // Leadership was lost while this worker waited for work: a replica that is
                // not the leader must not start a reconcile. The key waits for whoever leads.
                item.requeue_after(Duration::ZERO);
                continue;
            }
            let term = match &self.handle {
                Some(h) => match h.leadership() {
                    Some(t) => Some(t),
                    None => {
                        // The term ended (or its deadline passed) before the elector said so.
                        item.requeue_after(Duration::ZERO);
                        continue;
                    }
                },
                None => None,
            };
            self.process(item, term).await;
        }
    }

    async fn process(&mut self, item: WorkItem<ObjectKey>, term: Option<Leadership>) {
        let key = item.key().clone();
        let ctx = Context {
            controller: self.name.clone(),
            retries: item.num_requeues(),
            leadership: term.clone(),
        };
        let start = Instant::now();
        let span = tracing::info_span!("reconcile", controller = %self.name, key = %key);
        let decision = if crate::decision::enabled() {
            let mut woken = self.triggers.take(&key);
            if woken.is_empty() {
                // No watch event queued it: a retry after a failure, or a timed requeue (or
                // a key added from outside).
                let reason = if ctx.retries > 0 { "backoff" } else { "queued" };
                woken.push(Trigger::reason(reason));
            }
            let object = ObjectRef::new(
                &self.kind,
                key.namespace.as_deref().unwrap_or_default(),
                &key.name,
            );
            crate::decision::Scope::begin(&self.name, object, woken)
        } else {
            crate::decision::Scope::begin(&self.name, ObjectRef::default(), Vec::new())
        };
        let reconcile = decision.enter(self.reconciler.reconcile(&ctx, &key));
        let fut = AssertUnwindSafe(async {
            match &term {
                Some(t) => t.fence(reconcile).await,
                None => reconcile.await,
            }
        })
        .catch_unwind();
        // Losing leadership cancels the reconcile at once: a replica that is not the leader
        // must not act. A term's token also wakes at its renew deadline by itself.
        let leader = self.leader.clone();
        let lost = async {
            match (&term, leader) {
                (Some(t), _) => t.lost().await,
                (None, Some(mut l)) => {
                    let _ = l.wait_for(|lead| !*lead).await;
                }
                (None, None) => std::future::pending::<()>().await,
            }
        };
        let outcome = tokio::select! {
            biased;
            _ = lost => None,
            r = async {
                match self.timeout {
                    Some(t) => tokio::time::timeout(t, fut).await.map_err(|_| ()),
                    None => Ok(fut.await),
                }
            }.instrument(span) => Some(r),
        };
        let elapsed = start.elapsed();
        decision.finish(match &outcome {
            None => "cancelled: leadership lost".to_string(),
            Some(Ok(Ok(Ok(Action::Done)))) => "success".to_string(),
            Some(Ok(Ok(Ok(Action::RequeueAfter(d))))) => format!("requeue after {d:?}"),
            Some(Ok(Ok(Err(e)))) => format!("error: {e}"),
            Some(Ok(Err(_))) => "panic".to_string(),
            Some(Err(())) => "timed out".to_string(),
        });
        match outcome {
            None => {
                // Not leader any more: put the key back for whoever leads next.
                self.reconciler.interrupted(&key);
                item.requeue_after(Duration::ZERO);
            }
            Some(Ok(Ok(Ok(Action::Done)))) => {
                self.metrics.record(&self.name, "success", elapsed);
                item.forget();
                item.done();
            }
            Some(Ok(Ok(Ok(Action::RequeueAfter(d))))) => {
                self.metrics.record(&self.name, "requeue_after", elapsed);
                item.forget();
                item.requeue_after(d);
            }
            Some(Ok(Ok(Err(e)))) => {
                self.metrics.record(&self.name, "error", elapsed);
                if e.terminal {
                    tracing::warn!(controller = %self.name, key = %key, error = %e, "reconcile failed (terminal, not retried)");
                    item.forget();
                    item.done();
                } else {
                    tracing::warn!(controller = %self.name, key = %key, error = %e, retries = ctx.retries, "reconcile failed; retrying with backoff");
                    item.retry();
                }
            }
            Some(Ok(Err(panic))) => {
                self.metrics.record(&self.name, "panic", elapsed);
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(controller = %self.name, key = %key, panic = %msg, "reconcile panicked; retrying with backoff");
                self.reconciler.interrupted(&key);
                item.retry();
            }
            Some(Err(())) => {
                self.metrics.record(&self.name, "error", elapsed);
                tracing::warn!(controller = %self.name, key = %key, "reconcile timed out; retrying with backoff");
                self.reconciler.interrupted(&key);
                item.retry();
            }
        }
    }
}

/// Builds a [`Controller`]: what it reconciles, what it owns, what else it watches.
pub struct ControllerBuilder {
    name: String,
    informers: SharedInformers,
    /// The primary type's kind.
    kind: String,
    triggers: Triggers,
    /// The primary type's source, completed with the resync period at build time.
    primary: Box<dyn FnOnce(Option<Duration>, Triggers) -> Source + Send>,
    sources: Vec<Source>,
    options: ControllerOptions,
    queue: WorkQueueBuilder<ObjectKey>,
    metrics: ControllerMetrics,
}

/// A subscription that ends (unsubscribes) when the source task is aborted.
struct Subscription<K: Object> {
    informer: Informer<K>,
    id: Option<crate::informer::HandlerId>,
}

impl<K: Object> Drop for Subscription<K> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.informer.unsubscribe(id);
        }
    }
}

/// Subscribes `handler` to `informer` and holds the subscription until the task is dropped.
fn subscribe_until_stopped<K: Object>(
    informer: Informer<K>,
    resync: Option<Duration>,
    handler: Handler<K>,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        let id = informer.subscribe_with_resync(handler, resync);
        let _sub = Subscription {
            informer,
            id: Some(id),
        };
        std::future::pending::<()>().await;
    })
}

fn with_jitter(d: Duration) -> Duration {
    // Up to +10% so that many objects (and replicas) don't resync in lockstep.
    d + d.mul_f64(rand::random::<f64>() * 0.1)
}

/// The source of the primary type: every event enqueues the object's own key.
fn primary_source<K: Object>(
    informer: Informer<K>,
    kind: String,
) -> Box<dyn FnOnce(Option<Duration>, Triggers) -> Source + Send> {
    Box::new(move |resync, triggers| {
        Box::new(move |queue: WorkQueue<ObjectKey>| {
            let handler: Handler<K> = Arc::new(move |ev: &Event<K>| {
                let key = ev.key();
                triggers.note(&key, &kind, ev);
                queue.add(key)
            });
            subscribe_until_stopped(informer, resync, handler)
        })
    })
}

impl Controller {
    fn builder(
        name: &str,
        informers: &SharedInformers,
        kind: &str,
        primary: Box<dyn FnOnce(Option<Duration>, Triggers) -> Source + Send>,
    ) -> ControllerBuilder {
        ControllerBuilder {
            name: name.into(),
            informers: informers.clone(),
            kind: kind.into(),
            triggers: Triggers::default(),
            primary,
            sources: Vec::new(),
            options: ControllerOptions::default(),
            queue: WorkQueue::<ObjectKey>::builder(name),
            metrics: ControllerMetrics::new(),
        }
    }

    /// Starts building a controller that reconciles objects of `K` (in `scope`, default all
    /// namespaces). Keys are the objects' `namespace/name`.
    pub fn for_type<K>(
        name: &str,
        informers: &SharedInformers,
        scope: Option<Scope>,
    ) -> ControllerBuilder
    where
        K: k8s_openapi::Resource + Object,
        K::Scope: 'static,
    {
        let informer = informers.typed::<K>(scope.unwrap_or_else(Scope::all));
        Controller::builder(
            name,
            informers,
            K::KIND,
            primary_source(informer, K::KIND.to_string()),
        )
    }

    /// Like [`Controller::for_type`] for a resource known only at run time.
    pub fn for_dynamic(
        name: &str,
        informers: &SharedInformers,
        resource: &ApiResource,
        scope: Option<Scope>,
    ) -> ControllerBuilder {
        let informer = informers.dynamic(resource, scope.unwrap_or_else(Scope::all));
        Controller::builder(
            name,
            informers,
            &resource.kind,
            primary_source(informer, resource.kind.clone()),
        )
    }
}

/// Whether an owner reference points at an object of this group and kind.
fn owner_matches(r: &OwnerReference, group: &str, kind: &str) -> bool {
    let (g, _) = setpoint_api::resource::split_api_version(&r.api_version);
    r.kind == kind && g == group
}

impl ControllerBuilder {
    /// Sets the options (workers, reconcile timeout, resync).
    pub fn options(mut self, options: ControllerOptions) -> Self {
        self.options = options;
        self
    }

    /// Sets the number of concurrent reconciles.
    pub fn workers(mut self, n: usize) -> Self {
        self.options.workers = n.max(1);
        self
    }

    /// Configures the work queue (backoff, rate limit).
    pub fn queue(mut self, queue: WorkQueueBuilder<ObjectKey>) -> Self {
        self.queue = queue;
        self
    }

    /// Records into these metrics (share one set across a manager's controllers).
    pub fn metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Reconciles the controlling owner (of kind `P`, the primary) when an owned `C` changes:
    /// the owner reference with `controller: true` maps the child to its owner's key.
    pub fn owns<P, C>(mut self, scope: Option<Scope>) -> Self
    where
        P: k8s_openapi::Resource,
        P::Scope: 'static,
        C: k8s_openapi::Resource + Object,
        C::Scope: 'static,
    {
        let informer = self.informers.typed::<C>(scope.unwrap_or_else(Scope::all));
        let (group, kind) = (P::GROUP.to_string(), P::KIND.to_string());
        let triggers = self.triggers.clone();
        // A cluster-scoped owner (e.g. a Namespace or Node) has a key without a namespace.
        let owner_namespaced = ApiResource::of::<P>().namespaced;
        self.sources
            .push(Box::new(move |queue: WorkQueue<ObjectKey>| {
                let handler: Handler<C> = Arc::new(move |ev: &Event<C>| {
                    let enqueue = |obj: &C| {
                        for r in obj.owner_references() {
                            if r.controller == Some(true) && owner_matches(&r, &group, &kind) {
                                let ns = if owner_namespaced {
                                    obj.namespace()
                                } else {
                                    None
                                };
                                let key = ObjectKey::new(ns.as_deref(), &r.name);
                                triggers.note(&key, C::KIND, ev);
                                queue.add(key);
                            }
                        }
                    };
                    // A changed controller reference must wake the old owner too.
                    if let Event::Updated { old, .. } = ev {
                        enqueue(old);
                    }
                    enqueue(ev.object());
                });
                subscribe_until_stopped(informer, None, handler)
            }));
        self
    }

    /// Reconciles the keys `map` returns whenever an `O` changes (e.g. pods → the nodes they
    /// run on, or a config map → every object that references it).
    pub fn watches<O>(
        mut self,
        scope: Option<Scope>,
        map: impl Fn(&O) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) -> Self
    where
        O: k8s_openapi::Resource + Object,
        O::Scope: 'static,
    {
        let informer = self.informers.typed::<O>(scope.unwrap_or_else(Scope::all));
        let triggers = self.triggers.clone();
        self.sources
            .push(Box::new(move |queue: WorkQueue<ObjectKey>| {
                let handler: Handler<O> = Arc::new(move |ev: &Event<O>| {
                    if let Event::Updated { old, .. } = ev {
                        for k in map(old) {
                            triggers.note(&k, O::KIND, ev);
                            queue.add(k);
                        }
                    }
                    for k in map(ev.object()) {
                        triggers.note(&k, O::KIND, ev);
                        queue.add(k);
                    }
                });
                subscribe_until_stopped(informer, None, handler)
            }));
        self
    }

    /// Finishes the controller with its reconciler.
    pub fn build(self, reconciler: Arc<dyn Reconciler>) -> Controller {
        let ControllerBuilder {
            name,
            informers,
            kind,
            triggers,
            primary,
            mut sources,
            options,
            queue,
            metrics,
        } = self;
        sources.insert(
            0,
            primary(options.resync.map(with_jitter), triggers.clone()),
        );
        let mut c = Controller::from_parts(&name, queue, sources, reconciler, options, metrics);
        c.informers = Some(informers);
        c.kind = kind.into();
        c.triggers = triggers;
        c
    }
}
