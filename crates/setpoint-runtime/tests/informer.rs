//! Informer acceptance tests against a real in-process API server, with a fault-injecting
//! transport between the informer and the server.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Namespace, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use setpoint_runtime::client::{
    Api, Body, BoxError, Client, ClientError, DeleteParams, ListParams, Patch, PatchParams,
    PostParams, ServiceTransport, Transport,
};
use setpoint_runtime::informer::{
    Backoff, Event, Handler, Informer, InformerOptions, Scope, SharedInformers,
};
use setpoint_runtime::{Object, ObjectKey};
use setpoint_testing::TestCluster;
use tokio::sync::{watch, Notify};
use tokio::time::{timeout, Instant};

// ---------------------------------------------------------------------------------------------
// Fault injection

/// How to end the watch bodies that are open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// End cleanly at a line boundary (like a server-side timeout).
    Clean,
    /// Fail the body (connection reset).
    Error,
    /// Send an ERROR event with a 410 Status, then end.
    Gone,
    /// Send half an event line, then end.
    Partial,
}

struct Faults {
    /// Bumped with the kind of cut to apply to every open watch body.
    cut: watch::Sender<(u64, Cut)>,
    /// The next N watch requests get `200` with an ERROR 410 line, as the server answers a
    /// watch from a compacted resourceVersion.
    gone_event_next: AtomicUsize,
    /// The next N watch requests get HTTP 410.
    gone_http_next: AtomicUsize,
    /// Every request fails with a transport error.
    offline: AtomicBool,
    lists: AtomicUsize,
    watches: AtomicUsize,
    failed: AtomicUsize,
    /// The resourceVersion of every watch request, in order.
    watch_rvs: Mutex<Vec<String>>,
}

impl Faults {
    fn new() -> Arc<Faults> {
        Arc::new(Faults {
            cut: watch::channel((0, Cut::Clean)).0,
            gone_event_next: AtomicUsize::new(0),
            gone_http_next: AtomicUsize::new(0),
            offline: AtomicBool::new(false),
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            watch_rvs: Mutex::new(Vec::new()),
        })
    }
    fn cut_watches(&self, how: Cut) {
        self.cut.send_modify(|(generation, kind)| {
            *generation += 1;
            *kind = how;
        });
    }
}

struct FaultyTransport {
    inner: Box<dyn Transport>,
    faults: Arc<Faults>,
}

fn status_410() -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "too old resource version (injected)", "reason": "Expired", "code": 410
    })
}

fn gone_line() -> Bytes {
    let line = serde_json::json!({"type": "ERROR", "object": status_410()});
    Bytes::from(format!("{line}\n"))
}

fn body_of(bytes: Bytes) -> Body {
    http_body_util::Full::new(bytes)
        .map_err(|e| -> BoxError { match e {} })
        .boxed_unsync()
}

#[async_trait]
impl Transport for FaultyTransport {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let f = &self.faults;
        let query = req.uri().query().unwrap_or("").to_string();
        let is_watch = query.split('&').any(|p| p == "watch=true");
        if f.offline.load(Ordering::SeqCst) {
            f.failed.fetch_add(1, Ordering::SeqCst);
            return Err(ClientError::Transport(
                "injected: connection refused".into(),
            ));
        }
        if !is_watch {
            // Count LISTs, not their pages.
            if req.method() == http::Method::GET && !query.contains("continue=") {
                f.lists.fetch_add(1, Ordering::SeqCst);
            }
            return self.inner.send(req).await;
        }
        f.watches.fetch_add(1, Ordering::SeqCst);
        let rv = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "resourceVersion")
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
        f.watch_rvs.lock().push(rv);
        let take = |n: &AtomicUsize| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok()
        };
        if take(&f.gone_event_next) {
            return Ok(http::Response::builder()
                .status(200)
                .body(body_of(gone_line()))
                .unwrap());
        }
        if take(&f.gone_http_next) {
            let body = Bytes::from(serde_json::to_vec(&status_410()).unwrap());
            return Ok(http::Response::builder()
                .status(410)
                .body(body_of(body))
                .unwrap());
        }
        let mut cut = f.cut.subscribe();
        cut.mark_unchanged();
        let resp = self.inner.send(req).await?;
        let (parts, body) = resp.into_parts();
        let frames = futures::stream::unfold(Some((body, cut)), |state| async move {
            let (mut body, mut cut) = state?;
            tokio::select! {
                changed = cut.changed() => {
                    let how = if changed.is_ok() { cut.borrow_and_update().1 } else { Cut::Clean };
                    match how {
                        Cut::Clean => None,
                        Cut::Error => Some((Err::<Frame<Bytes>, BoxError>("injected: connection reset".into()), None)),
                        Cut::Gone => Some((Ok(Frame::data(gone_line())), None)),
                        Cut::Partial => Some((Ok(Frame::data(Bytes::from_static(b"{\"type\":\"MODIFIED\",\"obj"))), None)),
                    }
                }
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => Some((Ok(frame), Some((body, cut)))),
                    Some(Err(e)) => Some((Err(e), None)),
                    None => None,
                },
            }
        });
        Ok(http::Response::from_parts(
            parts,
            StreamBody::new(frames).boxed_unsync(),
        ))
    }
}

fn faulty_client(cluster: &TestCluster) -> (Client, Arc<Faults>) {
    let faults = Faults::new();
    let inner = ServiceTransport::new(setpoint_apiserver::http::router(cluster.server().clone()));
    (
        Client::new(FaultyTransport {
            inner: Box::new(inner),
            faults: faults.clone(),
        }),
        faults,
    )
}

/// Fast retries so fault tests take milliseconds; the default policy has its own test.
fn fast_options() -> InformerOptions {
    InformerOptions {
        backoff: Backoff {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(20),
            jitter: 0.5,
        },
        page_size: Some(7),
        ..InformerOptions::default()
    }
}

// ---------------------------------------------------------------------------------------------
// A subscriber that checks the event stream is a consistent history

#[derive(Default)]
struct View {
    /// key → resourceVersion, rebuilt from events only.
    objects: BTreeMap<ObjectKey, String>,
    /// Every inconsistency seen (duplicate Added, gap, unknown delete).
    errors: Vec<String>,
    log: Vec<String>,
    deleted: BTreeSet<ObjectKey>,
}

struct Recorder {
    view: Mutex<View>,
    changed: Notify,
}

fn rv<K: Object>(o: &K) -> String {
    o.resource_version().unwrap_or_default()
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            view: Mutex::new(View::default()),
            changed: Notify::new(),
        })
    }

    fn handler<K: Object>(self: &Arc<Self>) -> Handler<K> {
        let me = self.clone();
        Arc::new(move |ev: &Event<K>| {
            me.apply(ev);
            me.changed.notify_one();
        })
    }

    fn apply<K: Object>(&self, ev: &Event<K>) {
        let mut v = self.view.lock();
        let key = ev.key();
        match ev {
            Event::Added(o) => {
                if let Some(prev) = v.objects.insert(key.clone(), rv(o.as_ref())) {
                    v.errors.push(format!(
                        "Added {key}@{} while holding @{prev}",
                        rv(o.as_ref())
                    ));
                }
                v.log.push(format!("added {key}"));
            }
            Event::Updated { old, new } => {
                let problem = match v.objects.get(&key) {
                    None => Some(format!("Updated {key} never added")),
                    Some(have) if *have != rv(old.as_ref()) => Some(format!(
                        "gap on {key}: old @{} but saw @{have}",
                        rv(old.as_ref())
                    )),
                    _ => None,
                };
                v.errors.extend(problem);
                v.objects.insert(key.clone(), rv(new.as_ref()));
                if !ev.is_resync() {
                    v.log.push(format!("updated {key}"));
                }
            }
            Event::Deleted(_) => {
                if v.objects.remove(&key).is_none() {
                    v.errors.push(format!("Deleted {key} never added"));
                }
                v.deleted.insert(key.clone());
                v.log.push(format!("deleted {key}"));
            }
        }
    }

    fn objects(&self) -> BTreeMap<ObjectKey, String> {
        self.view.lock().objects.clone()
    }

    fn errors(&self) -> Vec<String> {
        self.view.lock().errors.clone()
    }

    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut self.view.lock().log)
    }

    /// Waits until `cond` holds for the view, re-checking on each event.
    async fn wait_for(&self, what: &str, mut cond: impl FnMut(&View) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let notified = self.changed.notified();
            if cond(&self.view.lock()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "timed out waiting for {what}; view: {:?}",
                    self.view.lock().objects
                );
            }
        }
    }
}

fn snapshot<K: Object>(objects: impl IntoIterator<Item = Arc<K>>) -> BTreeMap<ObjectKey, String> {
    objects
        .into_iter()
        .map(|o| (ObjectKey::of(o.as_ref()), rv(o.as_ref())))
        .collect()
}

async fn fresh_list<K: Object>(api: &Api<K>) -> BTreeMap<ObjectKey, String> {
    let list = api.list_all(&ListParams::default()).await.unwrap();
    list.items
        .iter()
        .map(|o| (ObjectKey::of(o), rv(o)))
        .collect()
}

/// Waits until the informer's cache and every recorder equal a fresh LIST.
async fn wait_converged<K: Object>(
    api: &Api<K>,
    informer: &Informer<K>,
    recorders: &[&Arc<Recorder>],
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let expected = fresh_list(api).await;
        let cache = snapshot(informer.store().list());
        if cache == expected && recorders.iter().all(|r| r.objects() == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not converged:\nlist  {expected:?}\ncache {cache:?}"
        );
        // Wake on the next event, or re-list shortly (the change may have landed already).
        let _ = timeout(Duration::from_millis(50), recorders[0].changed.notified()).await;
    }
}

/// Polls a condition that has no notification (server metrics, fault counters).
async fn poll_until(what: &str, cond: impl FnMut() -> bool) {
    poll_until_within(Duration::from_secs(10), what, cond).await
}

async fn poll_until_within(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.data = Some([("v".to_string(), value.to_string())].into());
    c
}

/// Creates a ConfigMap `name` with `v: "1"` for each name.
async fn create_config_maps(api: &Api<ConfigMap>, names: &[&str]) {
    for name in names {
        api.create(&PostParams::default(), &config_map(name, "1"))
            .await
            .unwrap();
    }
}

fn merge_data(value: &str) -> Patch {
    Patch::Merge(serde_json::json!({"data": {"v": value}}))
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_converges_through_watch_drops_and_forced_410s() {
    let cluster = TestCluster::start().await;
    let (client, faults) = faulty_client(&cluster);
    let informer = Informer::new(
        Api::<ConfigMap>::namespaced(client, "default"),
        fast_options(),
    );
    let rec = Recorder::new();
    informer.subscribe(rec.handler());
    informer.start();
    informer.wait_synced().await.unwrap();

    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let mut rng = StdRng::seed_from_u64(20240611);
    let mut injected = 0;
    for i in 0..400 {
        let name = format!("cm-{}", rng.random_range(0..30));
        let result = match rng.random_range(0..3) {
            0 => api
                .create(&PostParams::default(), &config_map(&name, &i.to_string()))
                .await
                .map(drop),
            1 => api
                .patch(&name, &PatchParams::default(), &merge_data(&i.to_string()))
                .await
                .map(drop),
            _ => api.delete(&name, &DeleteParams::default()).await.map(drop),
        };
        if let Err(e) = result {
            assert!(
                e.is_not_found() || e.is_already_exists(),
                "write failed: {e}"
            );
        }
        if i % 10 == 5 {
            injected += 1;
            let watches = faults.watches.load(Ordering::SeqCst);
            match rng.random_range(0..6) {
                0 => faults.cut_watches(Cut::Clean),
                1 => faults.cut_watches(Cut::Error),
                2 => faults.cut_watches(Cut::Gone),
                3 => faults.cut_watches(Cut::Partial),
                4 => {
                    faults.gone_event_next.fetch_add(1, Ordering::SeqCst);
                    faults.cut_watches(Cut::Clean);
                }
                _ => {
                    faults.gone_http_next.fetch_add(1, Ordering::SeqCst);
                    faults.cut_watches(Cut::Clean);
                }
            }
            // Writes go on while the informer recovers, but the next fault waits for a new
            // watch, so that every fault hits a live watch rather than piling up.
            poll_until("the informer to watch again", || {
                faults.watches.load(Ordering::SeqCst) > watches
            })
            .await;
        }
    }
    // Every forced 410 must have been consumed by a watch request.
    poll_until("injected 410s consumed", || {
        faults.gone_event_next.load(Ordering::SeqCst) == 0
            && faults.gone_http_next.load(Ordering::SeqCst) == 0
    })
    .await;
    wait_converged(&api, &informer, &[&rec]).await;

    assert_eq!(
        rec.errors(),
        Vec::<String>::new(),
        "the handler saw an inconsistent history"
    );
    let lists = faults.lists.load(Ordering::SeqCst);
    let watches = faults.watches.load(Ordering::SeqCst);
    assert!(lists > 1, "410s must cause relists (lists: {lists})");
    assert!(
        watches > lists,
        "clean ends re-watch without relisting (lists {lists}, watches {watches})"
    );
    assert!(
        !rec.view.lock().deleted.is_empty(),
        "deletions were observed"
    );
    println!("{injected} faults injected: {lists} lists, {watches} watches");
    informer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test]
async fn relist_after_disconnect_emits_exactly_the_differences() {
    let cluster = TestCluster::start().await;
    let (client, faults) = faulty_client(&cluster);
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    create_config_maps(&api, &["a", "b", "c"]).await;
    let informer = Informer::new(
        Api::<ConfigMap>::namespaced(client, "default"),
        fast_options(),
    );
    let rec = Recorder::new();
    informer.subscribe(rec.handler());
    informer.start();
    informer.wait_synced().await.unwrap();
    assert_eq!(
        rec.take_log(),
        ["added default/a", "added default/b", "added default/c"]
    );
    let b_cached = informer
        .store()
        .get(&ObjectKey::new(Some("default"), "b"))
        .unwrap();

    // Disconnect: the open watch breaks and every retry fails until we reconnect.
    faults.offline.store(true, Ordering::SeqCst);
    faults.cut_watches(Cut::Error);
    poll_until("the informer to notice", || {
        faults.failed.load(Ordering::SeqCst) >= 2
    })
    .await;

    api.delete("b", &DeleteParams::default()).await.unwrap();
    api.patch("c", &PatchParams::default(), &merge_data("2"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("d", "1"))
        .await
        .unwrap();
    // Back with a 410 for the watch that resumes (its history gone, as after a compaction):
    // a refused watch alone is retried from where it was, without a relist.
    faults.gone_http_next.fetch_add(1, Ordering::SeqCst);
    faults.offline.store(false, Ordering::SeqCst);

    rec.wait_for("the relist", |v| {
        v.objects.len() == 3 && v.deleted.len() == 1
    })
    .await;
    wait_converged(&api, &informer, &[&rec]).await;
    // Exactly the differences, nothing for the unchanged `a`.
    assert_eq!(
        rec.take_log(),
        ["updated default/c", "added default/d", "deleted default/b"]
    );
    assert_eq!(rec.errors(), Vec::<String>::new());
    // A relist-detected deletion carries the last state the cache held.
    assert!(rec
        .view
        .lock()
        .deleted
        .contains(&ObjectKey::of(b_cached.as_ref())));
    informer.shutdown().await;
}

#[tokio::test]
async fn stripped_managed_fields_stay_on_the_server_through_updates_from_the_cache() {
    let cluster = TestCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let as_manager = |m: &str| PostParams {
        field_manager: Some(m.into()),
        ..PostParams::default()
    };
    api.create(&as_manager("creator"), &config_map("x", "1"))
        .await
        .unwrap();
    let informer = Informer::new(
        api.clone(),
        InformerOptions {
            strip_managed_fields: true,
            ..fast_options()
        },
    );
    informer.start();
    informer.wait_synced().await.unwrap();
    let key = ObjectKey::new(Some("default"), "x");
    let listed = informer.store().get(&key).expect("x is listed");
    assert_eq!(listed.metadata.managed_fields, None, "stripped on LIST");

    // An update built from the cached copy carries no managedFields; the server keeps the
    // creator's entry and adds the updater's.
    let mut changed = (*listed).clone();
    changed
        .data
        .get_or_insert_default()
        .insert("k".to_string(), "2".to_string());
    api.replace("x", &as_manager("updater"), &changed)
        .await
        .unwrap();
    poll_until("the update in the cache", || {
        informer.store().get(&key).is_some_and(|x| {
            x.data.as_ref().and_then(|d| d.get("k")).map(String::as_str) == Some("2")
        })
    })
    .await;
    assert_eq!(
        informer.store().get(&key).unwrap().metadata.managed_fields,
        None,
        "stripped on WATCH"
    );
    let managers: BTreeSet<String> = api
        .get("x")
        .await
        .unwrap()
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.manager)
        .collect();
    assert_eq!(
        managers,
        BTreeSet::from(["creator".to_string(), "updater".to_string()])
    );
    informer.shutdown().await;
}

#[tokio::test]
async fn idle_objects_are_packed_and_come_back_unchanged_through_reads_and_updates() {
    let cluster = TestCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    create_config_maps(&api, &["a", "b", "c"]).await;
    let informer = Informer::new(
        api.clone(),
        InformerOptions {
            compact_idle: Some(Duration::from_millis(100)),
            ..fast_options()
        },
    );
    // (key, old resourceVersion, new resourceVersion) of every update.
    let updates: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let seen = updates.clone();
    informer.subscribe(Arc::new(move |event: &Event<ConfigMap>| {
        if let Event::Updated { old, new } = event {
            seen.lock()
                .push((event.key().to_string(), rv(old.as_ref()), rv(new.as_ref())));
        }
    }));
    informer.start();
    informer.wait_synced().await.unwrap();
    let store = informer.store();
    // Owned copies: holding the cache's own objects would keep them from being packed.
    let before: Vec<ConfigMap> = store.list().iter().map(|o| (**o).clone()).collect();
    poll_until("all three objects packed", || store.packed_len() == 3).await;
    let after: Vec<ConfigMap> = store.list().iter().map(|o| (**o).clone()).collect();
    assert_eq!(after, before);

    let old_rv = rv(&before[1]);
    let updated = api
        .patch("b", &PatchParams::default(), &merge_data("2"))
        .await
        .unwrap();
    poll_until("the update delivered", || !updates.lock().is_empty()).await;
    assert_eq!(
        *updates.lock(),
        [("default/b".to_string(), old_rv, rv(&updated))]
    );
    let key = ObjectKey::new(Some("default"), "b");
    assert_eq!(*store.get(&key).unwrap(), updated);
    informer.shutdown().await;
}

#[tokio::test]
async fn a_watch_that_ends_or_is_cut_off_resumes_from_the_last_resource_version() {
    let cluster = TestCluster::start().await;
    let (client, faults) = faulty_client(&cluster);
    let informer = Informer::new(
        Api::<ConfigMap>::namespaced(client, "default"),
        fast_options(),
    );
    let rec = Recorder::new();
    informer.subscribe(rec.handler());
    informer.start();
    informer.wait_synced().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");

    let x = api
        .create(&PostParams::default(), &config_map("x", "1"))
        .await
        .unwrap();
    rec.wait_for("x", |v| v.objects.len() == 1).await;
    let lists = faults.lists.load(Ordering::SeqCst);
    faults.cut_watches(Cut::Clean);
    poll_until("a new watch", || faults.watches.load(Ordering::SeqCst) >= 2).await;
    api.create(&PostParams::default(), &config_map("y", "1"))
        .await
        .unwrap();
    rec.wait_for("y", |v| v.objects.len() == 2).await;

    assert_eq!(
        faults.lists.load(Ordering::SeqCst),
        lists,
        "a clean end must not relist"
    );
    let rvs = faults.watch_rvs.lock().clone();
    let resumed: u64 = rvs[1]
        .parse()
        .expect("the second watch resumes from a resourceVersion");
    assert!(
        resumed >= rv(&x).parse::<u64>().unwrap(),
        "resumed from {resumed}, before x"
    );

    // Cut off mid-stream (a connection reset): also resumed, not relisted.
    faults.cut_watches(Cut::Error);
    poll_until("a third watch", || {
        faults.watches.load(Ordering::SeqCst) >= 3
    })
    .await;
    let z = api
        .create(&PostParams::default(), &config_map("z", "1"))
        .await
        .unwrap();
    rec.wait_for("z", |v| v.objects.len() == 3).await;
    assert_eq!(
        faults.lists.load(Ordering::SeqCst),
        lists,
        "a watch cut off must not relist"
    );
    let rvs = faults.watch_rvs.lock().clone();
    let resumed: u64 = rvs[2].parse().expect("the third watch resumes too");
    assert!(resumed >= rv(&x).parse::<u64>().unwrap() && resumed < rv(&z).parse::<u64>().unwrap());

    // Cut off, then refused while the server is away (a restart): watched again from the
    // last resourceVersion once it answers, still without a relist.
    faults.offline.store(true, Ordering::SeqCst);
    faults.cut_watches(Cut::Error);
    poll_until("refused watches", || {
        faults.failed.load(Ordering::SeqCst) >= 2
    })
    .await;
    api.create(&PostParams::default(), &config_map("w", "1"))
        .await
        .unwrap();
    faults.offline.store(false, Ordering::SeqCst);
    rec.wait_for("w", |v| v.objects.len() == 4).await;
    assert_eq!(
        faults.lists.load(Ordering::SeqCst),
        lists,
        "a refused watch is retried, not relisted"
    );
    let last: u64 = faults.watch_rvs.lock().last().unwrap().parse().unwrap();
    assert!(last >= rv(&z).parse::<u64>().unwrap());
    assert_eq!(rec.errors(), Vec::<String>::new());
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_subscribers_get_a_consistent_snapshot_then_live_events() {
    let cluster = TestCluster::start().await;
    let informers = SharedInformers::new(cluster.client());
    let informer = informers.typed::<ConfigMap>(Scope::namespace("default"));
    let early = Recorder::new();
    let early_handler = early.handler::<ConfigMap>();
    // A handler that takes a moment per event keeps the informer inside "apply, then
    // dispatch" most of the time, which is exactly where a snapshot taken outside the
    // dispatch lock would miss or repeat an event. (It stands for work; nothing waits on it.)
    informer.subscribe(Arc::new(move |ev: &Event<ConfigMap>| {
        std::thread::sleep(Duration::from_micros(200));
        early_handler(ev);
    }));
    informer.wait_synced().await.unwrap();

    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(99);
            for i in 1..=500usize {
                let name = format!("late-{}", rng.random_range(0..40));
                let r = match rng.random_range(0..4) {
                    0 | 1 => api
                        .create(&PostParams::default(), &config_map(&name, &i.to_string()))
                        .await
                        .map(drop),
                    2 => api
                        .patch(&name, &PatchParams::default(), &merge_data(&i.to_string()))
                        .await
                        .map(drop),
                    _ => api.delete(&name, &DeleteParams::default()).await.map(drop),
                };
                if let Err(e) = r {
                    assert!(
                        e.is_not_found() || e.is_already_exists(),
                        "write failed: {e}"
                    );
                }
            }
        })
    };
    let mut late = Vec::new();
    // Join while the informer is busy delivering: after it has delivered 10, 20, … events.
    for at in (1..=12).map(|i| i * 10) {
        early
            .wait_for("informer progress", |v| v.log.len() >= at)
            .await;
        // Same informer, whichever handle is used.
        let handle = informers.typed::<ConfigMap>(Scope::namespace("default"));
        assert!(handle.ptr_eq(&informer));
        let rec = Recorder::new();
        handle.subscribe(rec.handler());
        late.push(rec);
    }
    writer.await.unwrap();

    let mut all = vec![&early];
    all.extend(late.iter());
    wait_converged(&api, &informer, &all).await;
    for (i, rec) in all.iter().enumerate() {
        assert_eq!(
            rec.errors(),
            Vec::<String>::new(),
            "subscriber {i} saw an inconsistent history"
        );
    }
    assert_eq!(informers.len(), 1);
    informers.shutdown().await;
}

fn pod(
    name: &str,
    node: Option<&str>,
    labels: &[(&str, &str)],
    owner: Option<&str>,
    image: &str,
) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p.metadata.owner_references = owner.map(|uid| {
        vec![OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: format!("rs-{uid}"),
            uid: uid.into(),
            ..OwnerReference::default()
        }]
    });
    p.spec = Some(PodSpec {
        node_name: node.map(String::from),
        containers: vec![Container {
            name: "main".into(),
            image: Some(image.into()),
            ..Container::default()
        }],
        ..PodSpec::default()
    });
    p
}

async fn create_namespace(client: &Client, name: &str) {
    let mut ns = Namespace::default();
    ns.metadata.name = Some(name.into());
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

#[tokio::test]
async fn three_subscribers_share_one_pod_watch() {
    let cluster = TestCluster::start().await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
    for i in 0..3 {
        pods.create(
            &PostParams::default(),
            &pod(&format!("p{i}"), None, &[], None, "nginx"),
        )
        .await
        .unwrap();
    }
    let informers = SharedInformers::new(cluster.client());
    let recs: Vec<_> = (0..3).map(|_| Recorder::new()).collect();
    let first = informers.typed::<Pod>(Scope::all());
    first.subscribe(recs[0].handler());
    first.wait_synced().await.unwrap();
    // The other two controllers ask after it started.
    for rec in &recs[1..] {
        let informer = informers.typed::<Pod>(Scope::all());
        assert!(informer.ptr_eq(&first));
        informer.subscribe(rec.handler());
    }
    let watchers = |n: usize| format!("apiserver_registered_watchers{{resource=\"pods\"}} {n}");
    poll_until("one pod watch", || {
        cluster.server().metrics().render().contains(&watchers(1))
    })
    .await;
    pods.create(&PostParams::default(), &pod("p3", None, &[], None, "nginx"))
        .await
        .unwrap();
    for rec in &recs {
        rec.wait_for("4 pods", |v| v.objects.len() == 4).await;
    }
    let metrics = cluster.server().metrics().render();
    assert!(
        metrics.contains(&watchers(1)),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("watchers"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(informers.len(), 1);

    // A different scope is a different informer (and watch).
    let namespaced = informers.typed::<Pod>(Scope::namespace("default"));
    assert!(!namespaced.ptr_eq(&first));
    namespaced.wait_synced().await.unwrap();
    poll_until("two pod watches", || {
        cluster.server().metrics().render().contains(&watchers(2))
    })
    .await;

    // Shutting the factory down ends the watches.
    informers.shutdown().await;
    poll_until("no pod watch", || {
        cluster.server().metrics().render().contains(&watchers(0))
    })
    .await;
    assert_eq!(
        informers.typed::<Pod>(Scope::all()).wait_synced().await,
        Ok(()),
        "already synced before shutdown"
    );
    let late = informers.typed::<Pod>(Scope::all().labels("app=x"));
    assert!(
        late.wait_synced().await.is_err(),
        "informers requested after shutdown come back stopped"
    );
}

#[tokio::test]
async fn indexes_by_namespace_owner_node_label_and_custom_function() {
    let cluster = TestCluster::start().await;
    let client = cluster.client();
    create_namespace(&client, "ns-a").await;
    create_namespace(&client, "ns-b").await;
    let a: Api<Pod> = Api::namespaced(client.clone(), "ns-a");
    let b: Api<Pod> = Api::namespaced(client.clone(), "ns-b");
    a.create(
        &PostParams::default(),
        &pod(
            "p1",
            Some("node-1"),
            &[("app", "web")],
            Some("owner-1"),
            "nginx:1",
        ),
    )
    .await
    .unwrap();
    a.create(
        &PostParams::default(),
        &pod("p2", Some("node-2"), &[("app", "db")], None, "postgres:16"),
    )
    .await
    .unwrap();
    b.create(
        &PostParams::default(),
        &pod(
            "p3",
            Some("node-1"),
            &[("app", "web")],
            Some("owner-1"),
            "nginx:1",
        ),
    )
    .await
    .unwrap();

    let informers = SharedInformers::with_options(
        client.clone(),
        InformerOptions::default(),
        setpoint_runtime::informer::StartPolicy::Explicit,
    );
    let informer = informers.typed::<Pod>(Scope::all());
    // Registered before start, as a controller does while being built.
    informer
        .add_index(
            "image",
            Arc::new(|p: &Pod| {
                p.spec
                    .iter()
                    .flat_map(|s| s.containers.iter().filter_map(|c| c.image.clone()))
                    .collect()
            }),
        )
        .unwrap();
    assert!(!informer.has_synced());
    informers.start();
    informers.wait_synced().await.unwrap();
    let store = informer.store();
    let names = |pods: Vec<Arc<Pod>>| pods.iter().map(|p| p.name()).collect::<Vec<_>>();

    assert_eq!(names(store.by_namespace("ns-a")), ["p1", "p2"]);
    assert_eq!(names(store.by_owner("owner-1")), ["p1", "p3"]);
    assert_eq!(names(store.by_node("node-1")), ["p1", "p3"]);
    assert_eq!(names(store.by_label("app", "web")), ["p1", "p3"]);
    assert_eq!(names(store.by_index("image", "postgres:16")), ["p2"]);
    assert_eq!(store.index_values("image"), ["nginx:1", "postgres:16"]);

    // An index added after sync covers what is cached already.
    informer
        .add_index(
            "first-letter-of-node",
            Arc::new(|p: &Pod| {
                p.spec
                    .iter()
                    .filter_map(|s| s.node_name.clone())
                    .map(|n| n[..1].to_string())
                    .collect()
            }),
        )
        .unwrap();
    assert_eq!(store.by_index("first-letter-of-node", "n").len(), 3);

    // Indexes follow changes.
    let rec = Recorder::new();
    informer.subscribe(rec.handler());
    a.patch(
        "p1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": "api"}}})),
    )
    .await
    .unwrap();
    b.delete(
        "p3",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    rec.wait_for("p1 relabelled and p3 gone", |v| {
        v.deleted.len() == 1 && v.log.iter().any(|l| l == "updated ns-a/p1")
    })
    .await;
    assert!(store.by_label("app", "web").is_empty());
    assert_eq!(names(store.by_label("app", "api")), ["p1"]);
    assert_eq!(names(store.by_owner("owner-1")), ["p1"]);
    assert_eq!(names(store.by_namespace("ns-b")), Vec::<String>::new());
    informers.shutdown().await;
}

#[tokio::test]
async fn resync_redelivers_every_object_as_an_unchanged_update() {
    let cluster = TestCluster::start().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    create_config_maps(&api, &["r1", "r2"]).await;
    let informers = SharedInformers::new(cluster.client());
    let informer = informers.typed::<ConfigMap>(Scope::namespace("default"));
    informer.wait_synced().await.unwrap();
    let resyncs = Arc::new(Mutex::new(Vec::new()));
    let notify = Arc::new(Notify::new());
    let (r, n) = (resyncs.clone(), notify.clone());
    informer.subscribe_with_resync(
        Arc::new(move |ev: &Event<ConfigMap>| {
            if ev.is_resync() {
                r.lock().push(ev.key().to_string());
                n.notify_one();
            }
        }),
        Some(Duration::from_millis(50)),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while resyncs.lock().len() < 4 {
        tokio::time::timeout_at(deadline, notify.notified())
            .await
            .expect("two resync rounds");
    }
    assert_eq!(
        resyncs.lock()[..4],
        ["default/r1", "default/r2", "default/r1", "default/r2"]
    );
    informers.shutdown().await;
}

#[tokio::test]
async fn informer_works_over_https() {
    let cluster = TestCluster::start_https().await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.create(&PostParams::default(), &config_map("over-tls", "1"))
        .await
        .unwrap();
    let informers = SharedInformers::new(cluster.client());
    let informer = informers.typed::<ConfigMap>(Scope::namespace("default"));
    let rec = Recorder::new();
    informer.subscribe(rec.handler());
    informer.wait_synced().await.unwrap();
    api.patch("over-tls", &PatchParams::default(), &merge_data("2"))
        .await
        .unwrap();
    api.delete("over-tls", &DeleteParams::default())
        .await
        .unwrap();
    rec.wait_for("the delete", |v| !v.deleted.is_empty()).await;
    assert_eq!(
        rec.take_log(),
        [
            "added default/over-tls",
            "updated default/over-tls",
            "deleted default/over-tls"
        ]
    );
    informers.shutdown().await;
    cluster.stop().await;
}

/// Answers LISTs with an empty list once `list_ok` is set, fails everything else.
struct ScriptedTransport {
    list_ok: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<(Instant, bool)>>>,
}

#[async_trait]
impl Transport for ScriptedTransport {
    async fn send(&self, req: http::Request<Bytes>) -> Result<http::Response<Body>, ClientError> {
        let is_watch = req.uri().query().unwrap_or("").contains("watch=true");
        self.requests.lock().push((Instant::now(), is_watch));
        if !is_watch && self.list_ok.load(Ordering::SeqCst) {
            let list = serde_json::json!({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"}, "items": []});
            return Ok(http::Response::builder()
                .status(200)
                .body(body_of(Bytes::from(list.to_string())))
                .unwrap());
        }
        Err(ClientError::Transport("injected: unreachable".into()))
    }
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_back_off_from_800ms_to_30s_and_reset_after_a_list() {
    let list_ok = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let client = Client::new(ScriptedTransport {
        list_ok: list_ok.clone(),
        requests: requests.clone(),
    });
    let informer = Informer::new(Api::<ConfigMap>::all(client), InformerOptions::default());
    informer.start();
    let start = Instant::now();

    // Nine failed lists: gaps of 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30 s, each plus ≤ 50 %.
    // The clock is paused (and jumps ahead when idle): this deadline is virtual time.
    poll_until_within(Duration::from_secs(300), "nine lists", || {
        requests.lock().len() >= 9
    })
    .await;
    let times: Vec<Instant> = requests.lock().iter().map(|(t, _)| *t).collect();
    let expected = [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000];
    for (i, base) in expected.iter().enumerate() {
        let gap = times[i + 1] - times[i];
        let base = Duration::from_millis(*base);
        assert!(
            gap >= base && gap <= base.mul_f64(1.5) + Duration::from_millis(5),
            "gap {i}: {gap:?}, base {base:?}"
        );
    }
    assert!(!informer.has_synced());

    // A successful list resets the backoff: the failing watch after it waits ~800 ms again.
    list_ok.store(true, Ordering::SeqCst);
    informer.wait_synced().await.unwrap();
    let synced_at = Instant::now();
    poll_until("relist after the failed watch", || {
        requests
            .lock()
            .iter()
            .filter(|(t, w)| !w && *t > synced_at)
            .count()
            >= 1
    })
    .await;
    let relist = requests.lock().iter().rev().find(|(_, w)| !w).unwrap().0;
    let gap = relist - synced_at;
    assert!(
        gap >= Duration::from_millis(800) && gap <= Duration::from_millis(1205),
        "after reset: {gap:?}"
    );
    assert!(start.elapsed() > Duration::from_secs(110));
    informer.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Objects that do not decode

/// A Deployment as stored (no `resourceVersion`), with `replicas` as given: a number decodes,
/// a string does not (k8s-openapi's `replicas` is an `i32`).
fn stored_deployment(name: &str, replicas: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2024-01-01T00:00:00Z", "generation": 1},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap()
}

fn deployment_key(name: &str) -> String {
    format!("/registry/apps/deployments/default/{name}")
}

fn names<K: Object>(store: &setpoint_runtime::Store<K>) -> BTreeSet<String> {
    store.list().iter().map(|o| o.name()).collect()
}

/// The value of `informer_decode_errors_total{resource="<resource>"}` in a Prometheus text
/// exposition, 0 if absent.
fn decode_errors_in(text: &str, resource: &str) -> u64 {
    let series = format!("informer_decode_errors_total{{resource=\"{resource}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test]
async fn an_object_that_does_not_decode_is_skipped_counted_and_the_rest_keep_flowing() {
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;
    use setpoint_runtime::metrics::{InformerMetrics, Registry};

    let cluster = TestCluster::start().await;
    for name in ["good-1", "good-2"] {
        cluster
            .put_raw(&deployment_key(name), &stored_deployment(name, json!(1)))
            .await;
    }
    cluster
        .put_raw(
            &deployment_key("bad"),
            &stored_deployment("bad", json!("three")),
        )
        .await;

    let mut registry = Registry::default();
    let metrics = InformerMetrics::new(&mut registry);
    let render = |registry: &Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    };
    let informer = Informer::new(
        Api::<Deployment>::all(cluster.client()),
        InformerOptions {
            metrics: Some(metrics.clone()),
            ..fast_options()
        },
    );
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let l = log.clone();
    informer.subscribe(Arc::new(move |e: &Event<Deployment>| {
        let what = match e {
            Event::Added(_) => "added",
            Event::Updated { .. } => "updated",
            Event::Deleted(_) => "deleted",
        };
        l.lock().push(format!("{what} {}", e.object().name()));
    }));
    informer.start();
    // Before, the whole LIST failed to decode and the informer never synced.
    timeout(Duration::from_secs(10), informer.wait_synced())
        .await
        .expect("the informer syncs despite the bad object")
        .unwrap();
    let store = informer.store();
    assert_eq!(
        names(&store),
        BTreeSet::from(["good-1".into(), "good-2".into()])
    );
    assert_eq!(metrics.decode_errors("deployments.apps"), 1);
    assert_eq!(decode_errors_in(&render(&registry), "deployments.apps"), 1);

    // The watch keeps flowing: an object created through the API arrives.
    let api: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    let fresh: Deployment = serde_json::from_slice(&stored_deployment("good-3", json!(2))).unwrap();
    api.create(&PostParams::default(), &fresh).await.unwrap();
    poll_until("good-3 in the cache", || names(&store).contains("good-3")).await;

    // A cached object that turns bad leaves the cache (the next relist would drop it too),
    // and is counted.
    cluster
        .put_raw(
            &deployment_key("good-1"),
            &stored_deployment("good-1", json!("x")),
        )
        .await;
    poll_until("good-1 out of the cache", || {
        !names(&store).contains("good-1")
    })
    .await;
    assert_eq!(metrics.decode_errors("deployments.apps"), 2);
    // Modified again while still bad: counted again, still absent, nothing delivered.
    cluster
        .put_raw(
            &deployment_key("good-1"),
            &stored_deployment("good-1", json!("y")),
        )
        .await;
    poll_until("the second bad event counted", || {
        metrics.decode_errors("deployments.apps") == 3
    })
    .await;

    // Fixed objects come back: the one that broke, and the one bad from the start.
    cluster
        .put_raw(
            &deployment_key("good-1"),
            &stored_deployment("good-1", json!(1)),
        )
        .await;
    cluster
        .put_raw(&deployment_key("bad"), &stored_deployment("bad", json!(3)))
        .await;
    poll_until("both fixed objects in the cache", || {
        names(&store).len() == 4
    })
    .await;
    assert_eq!(
        store
            .get(&ObjectKey::new(Some("default"), "bad"))
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .replicas,
        Some(3)
    );

    // A bad object that is cached nowhere and then deleted: its DELETED event does not decode
    // either, and removes nothing else.
    cluster
        .put_raw(
            &deployment_key("good-2"),
            &stored_deployment("good-2", json!([])),
        )
        .await;
    poll_until("good-2 out of the cache", || {
        !names(&store).contains("good-2")
    })
    .await;
    cluster.delete_raw(&deployment_key("good-2")).await;
    poll_until("the delete counted", || {
        metrics.decode_errors("deployments.apps") == 5
    })
    .await;
    assert_eq!(
        names(&store),
        BTreeSet::from(["bad".into(), "good-1".into(), "good-3".into()])
    );
    assert_eq!(decode_errors_in(&render(&registry), "deployments.apps"), 5);
    let events = log.lock().clone();
    assert_eq!(
        events,
        [
            "added good-1",
            "added good-2",
            "added good-3",
            "deleted good-1",
            "added good-1",
            "added bad",
            "deleted good-2"
        ],
        "handlers see the bad object leave and come back, nothing else"
    );
    informer.shutdown().await;
    cluster.stop().await;
}

#[tokio::test]
async fn controllers_reconcile_every_other_object_and_the_api_server_serves_the_count() {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
    use serde_json::json;
    use setpoint_runtime::metrics::{InformerMetrics, Registry};

    let mut cluster = TestCluster::start().await;
    cluster
        .put_raw(
            &deployment_key("broken"),
            &stored_deployment("broken", json!("two")),
        )
        .await;
    // As `setpoint up` does: the in-process components' runtime metrics are served at the
    // API server's `/metrics`.
    let mut registry = Registry::default();
    let metrics = InformerMetrics::new(&mut registry);
    cluster.server().metrics().include(Arc::new(registry));
    let informers = SharedInformers::with_options(
        cluster.client(),
        InformerOptions {
            metrics: Some(metrics),
            ..InformerOptions::lean()
        },
        setpoint_runtime::informer::StartPolicy::OnRequest,
    );
    cluster.start_controllers_on(Default::default(), informers.clone());

    let api: Api<Deployment> = Api::namespaced(cluster.client(), "default");
    for name in ["web", "api"] {
        let d: Deployment = serde_json::from_slice(&stored_deployment(name, json!(2))).unwrap();
        api.create(&PostParams::default(), &d).await.unwrap();
    }
    // Both are reconciled: each gets its ReplicaSet and then its status.
    let replicasets: Api<ReplicaSet> = Api::namespaced(cluster.client(), "default");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let owners: BTreeSet<String> = replicasets
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .flat_map(|rs| rs.metadata.owner_references.clone().unwrap_or_default())
            .map(|o| o.name)
            .collect();
        let observed = {
            let mut all = true;
            for name in ["web", "api"] {
                let d = api.get(name).await.unwrap();
                all &= d.status.and_then(|s| s.observed_generation) == Some(1);
            }
            all
        };
        if owners == BTreeSet::from(["api".into(), "web".into()]) && observed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "deployments not reconciled: ReplicaSets owned by {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let response = cluster
        .client()
        .send(http::Method::GET, "/metrics", None, Bytes::new())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    // Every informer of Deployments skipped it at least once (the controllers share one).
    assert!(
        decode_errors_in(&text, "deployments.apps") >= 1,
        "no decode error counted in:\n{text}"
    );
    // One exposition in Prometheus' text format: the server's and the components' families.
    assert_eq!(
        text.matches("# TYPE apiserver_request_total counter")
            .count(),
        1,
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    cluster.stop().await;
    informers.shutdown().await;
}
