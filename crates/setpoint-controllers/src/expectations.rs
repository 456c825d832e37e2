//! Expectations: the creates and deletes a controller has sent but not yet seen in its
//! informer cache. While an owner still waits for its own writes to show up, it is not resized
//! again — so a stale cache never causes double creates or deletes. Kept in memory only:
//! after a restart they start empty and the cache is fresh.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use setpoint_runtime::client::{Api, DeleteParams, Patch, PatchParams, PostParams};
use setpoint_runtime::events::{EventRecorder, EventType};
use setpoint_runtime::informer::{Event, HandlerId, Informer, Scope, SharedInformers, Store};
use setpoint_runtime::{ClientError, Object, ObjectKey};

/// How long unobserved expectations are trusted before the cache is believed instead.
pub const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How long the expectations of an interrupted reconcile are still trusted: long enough for
/// a write it did send to show up in the cache, after which the cache is believed (the
/// writes it never sent never will show up).
pub const INTERRUPTED_GRACE: Duration = Duration::from_secs(15);

#[derive(Debug)]
struct Expected {
    creates: i64,
    deletes: HashSet<String>,
    /// When the cache is believed instead, observed or not.
    until: Instant,
}

/// In-flight creates and deletes per ReplicaSet key, lowered as the informer observes them.
#[derive(Debug, Default)]
pub struct Expectations {
    inner: Mutex<HashMap<ObjectKey, Expected>>,
    /// Owners with a create whose outcome is unknown since their pods were last counted from
    /// the server ([`Expectations::outcome_unknown`]).
    unsure: Mutex<HashSet<ObjectKey>>,
}

impl Expectations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Expected>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `key` may be resized: nothing in flight, or the expectations expired.
    pub fn satisfied(&self, key: &ObjectKey) -> bool {
        match self.lock().get(key) {
            None => true,
            Some(e) => (e.creates <= 0 && e.deletes.is_empty()) || Instant::now() >= e.until,
        }
    }

    /// Whether `key` may be resized, checked before `read` reads the pod cache, and what
    /// `read` returned. The order is what makes a satisfied answer safe to act on: the
    /// informer updates its cache before it lowers the expectations, so every pod whose
    /// observation satisfied them is in what `read` sees. Read the other way round, the last
    /// pods of a batch can land between the two (the cache read without them, their events
    /// then satisfying the expectations), and the owner creates them again; a 1,000-pod
    /// ReplicaSet got 1,002 pods so. Upstream's controllers check expectations first too.
    pub fn satisfied_then<T>(&self, key: &ObjectKey, read: impl FnOnce() -> T) -> (bool, T) {
        let satisfied = self.satisfied(key);
        (satisfied, read())
    }

    /// How long until `key`'s unobserved expectations expire, if it has any.
    pub fn expires_in(&self, key: &ObjectKey) -> Option<Duration> {
        let map = self.lock();
        let e = map.get(key)?;
        (e.creates > 0 || !e.deletes.is_empty())
            .then(|| e.until.saturating_duration_since(Instant::now()))
    }

    /// Expects `creates` pods and the deletion of the pods `deletes` (by uid).
    pub fn expect(&self, key: &ObjectKey, creates: usize, deletes: HashSet<String>) {
        self.lock().insert(
            key.clone(),
            Expected {
                creates: creates as i64,
                deletes,
                until: Instant::now() + EXPECTATIONS_TIMEOUT,
            },
        );
    }

    /// A create was observed (or will never be: it failed or was skipped).
    pub fn creation_observed(&self, key: &ObjectKey, n: usize) {
        if let Some(e) = self.lock().get_mut(key) {
            e.creates -= n as i64;
        }
    }

    /// The deletion of the pod with `uid` was observed (or will never be).
    pub fn deletion_observed(&self, key: &ObjectKey, uid: &str) {
        if let Some(e) = self.lock().get_mut(key) {
            e.deletes.remove(uid);
        }
    }

    /// Forgets a ReplicaSet that is gone.
    pub fn forget(&self, key: &ObjectKey) {
        self.lock().remove(key);
        self.unsure_set().remove(key);
    }

    fn unsure_set(&self) -> std::sync::MutexGuard<'_, HashSet<ObjectKey>> {
        self.unsure.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reconcile of `key` was interrupted (cancelled when leadership was lost, timed out,
    /// panicked) with writes in flight: those it sent will be observed, those it never sent
    /// will not. Its expectations are trusted for [`INTERRUPTED_GRACE`] more at most, rather
    /// than forgotten at once (a stale cache would create again what is in flight) or kept
    /// for [`EXPECTATIONS_TIMEOUT`] (the owner would wait minutes for writes never sent).
    pub fn interrupted(&self, key: &ObjectKey) {
        if let Some(e) = self.lock().get_mut(key) {
            e.until = e.until.min(Instant::now() + INTERRUPTED_GRACE);
        }
    }

    /// A create for `key` failed in a way that leaves its outcome unknown (the connection
    /// was lost after it was sent, it timed out: [`ClientError::outcome_unknown`]). Neither
    /// the cache nor the expectations can tell whether it happened: lowering the expectation
    /// as for a refused write let a cache that had not yet seen the pod (the API server
    /// restarted, the watch not yet resumed) create it a second time, and keeping it
    /// expected held the owner still for [`INTERRUPTED_GRACE`] when it had not. So it is no
    /// longer waited for, and the owner is [`unsure`](Self::unsure) until its pods are
    /// counted from the server before its next create.
    ///
    /// [`ClientError::outcome_unknown`]: setpoint_runtime::ClientError::outcome_unknown
    pub fn outcome_unknown(&self, key: &ObjectKey) {
        self.creation_observed(key, 1);
        self.unsure_set().insert(key.clone());
    }

    /// Whether a create for `key` had an unknown outcome since its pods were last counted
    /// from the server: its next create must count them there first, not in the cache.
    pub fn unsure(&self, key: &ObjectKey) -> bool {
        self.unsure_set().contains(key)
    }

    /// `key`'s pods were counted from the server: the cache's count is to be trusted again
    /// once its expectations are met.
    pub fn recounted(&self, key: &ObjectKey) {
        self.unsure_set().remove(key);
    }
}

/// The owners whose pods have been counted from the server, not the cache, in the current
/// leadership term. A replica that takes over from another may have caches behind the
/// other's last creates (its watch lags a loaded server), and its expectations know only its
/// own writes: so before its first create for an owner in such a term
/// ([`Context::successor_term`](setpoint_runtime::controller::Context::successor_term)), it
/// counts the owner's pods with a consistent LIST and creates no more than that count says
/// are missing. One LIST per owner per term, only for an owner about to get pods, and none
/// in a term that followed nobody (a new cluster's first leader). An owner one of whose
/// creates had an unknown outcome ([`Expectations::unsure`]) is counted likewise
/// ([`OwnedPods::count_from_server`]).
#[derive(Debug, Default)]
pub struct FreshCounts {
    counted: Mutex<HashMap<ObjectKey, u64>>,
}

impl FreshCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, u64>> {
        self.counted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `key`'s pods must be counted from the server before creating any in `term`
    /// (`None` without leader election or in a term that followed nobody: this replica's own
    /// writes are all there were).
    pub fn needed(&self, key: &ObjectKey, term: Option<u64>) -> bool {
        term.is_some_and(|t| self.lock().get(key) != Some(&t))
    }

    /// `key`'s pods were counted from the server in `term`.
    pub fn counted(&self, key: &ObjectKey, term: Option<u64>) {
        if let Some(t) = term {
            self.lock().insert(key.clone(), t);
        }
    }

    /// Forgets an owner that is gone.
    pub fn forget(&self, key: &ObjectKey) {
        self.lock().remove(key);
    }
}

/// The kind of controller whose pods an [`Expectations`] follows.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// The owner's API group (`apps`, `batch`; empty for the core group).
    pub group: &'static str,
    /// The owner's kind (`ReplicaSet`, `Job`).
    pub kind: &'static str,
}

/// The key of the `owner`-kind object controlling `pod`, if one does.
fn owner_key(pod: &Pod, owner: Owner) -> Option<ObjectKey> {
    let r = pod
        .owner_references()
        .into_iter()
        .find(|r| r.controller == Some(true))?;
    // The core group (a ReplicationController's `v1`) has no `group/` prefix.
    let (group, _) = setpoint_api::resource::split_api_version(&r.api_version);
    (r.kind == owner.kind && group == owner.group)
        .then(|| ObjectKey::new(pod.namespace().as_deref(), &r.name))
}

/// The pods of a pod-owning controller (ReplicaSet, Job): the shared pod cache, and the
/// expectations its pod events lower. Dropping it stops the observation.
pub struct OwnedPods {
    /// Every pod, from the shared informer.
    pub pods: Store<Pod>,
    /// The creations and deletions the controller waits to see.
    pub expectations: Arc<Expectations>,
    /// The owners counted from the server in the current leadership term.
    pub fresh: FreshCounts,
    informer: Informer<Pod>,
    subscription: Option<HandlerId>,
}

impl OwnedPods {
    /// Starts observing the pods controlled by `owner`-kind objects.
    pub fn watch(informers: &SharedInformers, owner: Owner) -> OwnedPods {
        let informer = informers.typed::<Pod>(Scope::all());
        let expectations = Arc::new(Expectations::default());
        let observed = expectations.clone();
        let subscription = informer.subscribe(Arc::new(move |ev: &Event<Pod>| {
            observe(&observed, ev, owner)
        }));
        OwnedPods {
            pods: informer.store(),
            expectations,
            fresh: FreshCounts::default(),
            informer,
            subscription: Some(subscription),
        }
    }

    /// Whether `key`'s pods must be counted from the server, not the cache, before its next
    /// create in `term`: the first create of a term taken over from another replica
    /// ([`FreshCounts`]), or the first after a create whose outcome is unknown
    /// ([`Expectations::unsure`]).
    pub fn count_from_server(&self, key: &ObjectKey, term: Option<u64>) -> bool {
        self.fresh.needed(key, term) || self.expectations.unsure(key)
    }

    /// `key`'s pods were counted from the server in `term`.
    pub fn counted_from_server(&self, key: &ObjectKey, term: Option<u64>) {
        self.fresh.counted(key, term);
        self.expectations.recounted(key);
    }
}

impl Drop for OwnedPods {
    fn drop(&mut self) {
        if let Some(id) = self.subscription.take() {
            self.informer.unsubscribe(id);
        }
    }
}

/// Lowers the expectations of `owner`-kind controllers as pod events arrive.
pub fn observe(expectations: &Expectations, ev: &Event<Pod>, owner: Owner) {
    match ev {
        Event::Added(p) => {
            if let Some(k) = owner_key(p, owner) {
                if p.metadata.deletion_timestamp.is_some() {
                    expectations.deletion_observed(&k, &p.uid().unwrap_or_default());
                } else {
                    expectations.creation_observed(&k, 1);
                }
            }
        }
        Event::Updated { old, new } => {
            if new.metadata.deletion_timestamp.is_some()
                && old.metadata.deletion_timestamp.is_none()
            {
                for k in [owner_key(old, owner), owner_key(new, owner)]
                    .into_iter()
                    .flatten()
                {
                    expectations.deletion_observed(&k, &new.uid().unwrap_or_default());
                }
            }
        }
        Event::Deleted(p) => {
            if let Some(k) = owner_key(p, owner) {
                expectations.deletion_observed(&k, &p.uid().unwrap_or_default());
            }
        }
    }
}

/// Creates `n` copies of `pod` for the owner `key` in slow-start batches (1, 2, 4, 8 …), with
/// a `SuccessfulCreate` or `FailedCreate` event on `owner` for each. The caller has already
/// expected the `n` creates; the ones that failed or are skipped after a failed batch are
/// marked observed here, since no event may ever bring them, and an unknown outcome makes the
/// owner's next create count its pods from the server ([`Expectations::outcome_unknown`]).
/// Returns the first error.
pub async fn create_in_batches(
    api: &Api<Pod>,
    pod: &Pod,
    n: usize,
    expectations: &Expectations,
    key: &ObjectKey,
    events: &EventRecorder,
    owner: &ObjectReference,
) -> Option<String> {
    let always = || std::future::ready(true);
    match create_in_batches_while(api, pod, n, expectations, key, events, owner, always).await {
        BatchesEnd::Failed(msg) => Some(msg),
        BatchesEnd::Done | BatchesEnd::Stopped { .. } => None,
    }
}

/// Sets an object's owner references (adopting or releasing it), failing if it changed
/// since it was read: the uid and resourceVersion in the patch are preconditions. A failure
/// is logged as `what` and left to the next pass, which reads the object again.
pub async fn patch_owner_references<K>(
    api: &Api<K>,
    obj: &K,
    refs: Vec<serde_json::Value>,
    what: &str,
) -> bool
where
    K: k8s_openapi::Resource
        + Object
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + Send
        + 'static,
{
    let patch = Patch::Merge(serde_json::json!({"metadata": {
        "uid": obj.uid(),
        "resourceVersion": obj.resource_version(),
        "ownerReferences": refs,
    }}));
    match api
        .patch(&obj.name(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(object = %obj.name(), error = %e, "{what} failed");
            false
        }
    }
}

/// Deletes `pods` (key, uid: the delete is preconditioned on the uid, so a pod recreated
/// under the name is left alone) in slow-start batches, with a `SuccessfulDelete` or
/// `FailedDelete` Event about `owner` for each, as upstream's pod control words them. A
/// delete that fails lowers the owner's expectations (its deletion will never be observed);
/// a pod already gone is what was wanted. Returns the first error.
pub async fn delete_in_batches(
    api: &Api<Pod>,
    pods: &[(ObjectKey, String)],
    expectations: &Expectations,
    key: &ObjectKey,
    events: &EventRecorder,
    owner: &ObjectReference,
) -> Option<String> {
    let mut failed = None;
    let mut rest = pods;
    for size in crate::replicaset::batches(pods.len()) {
        let (batch, tail) = rest.split_at(size);
        rest = tail;
        let results = futures::future::join_all(batch.iter().map(|(k, uid)| async move {
            let params = DeleteParams {
                precondition_uid: Some(uid.clone()),
                ..Default::default()
            };
            (k, uid, api.delete(&k.name, &params).await)
        }))
        .await;
        for (k, uid, r) in results {
            match r {
                Ok(_) => events.publish(
                    owner,
                    EventType::Normal,
                    "SuccessfulDelete",
                    &format!("Deleted pod: {}", k.name),
                ),
                Err(e) => {
                    expectations.deletion_observed(key, uid);
                    if !e.is_not_found() {
                        events.publish(
                            owner,
                            EventType::Warning,
                            "FailedDelete",
                            &format!("Error deleting: {e}"),
                        );
                        failed.get_or_insert(e.to_string());
                    }
                }
            }
        }
    }
    failed
}

/// Accounts for a create for `key` that failed with `e`: one refused or never sent will not
/// be observed; one that may have happened makes the owner count its pods from the server
/// before its next create.
fn create_failed(expectations: &Expectations, key: &ObjectKey, e: &ClientError) {
    if e.outcome_unknown() {
        expectations.outcome_unknown(key);
    } else {
        expectations.creation_observed(key, 1);
    }
}

/// How [`create_in_batches_while`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchesEnd {
    /// Every pod was created.
    Done,
    /// `proceed` said no before a batch; `created` pods had been created by then.
    Stopped {
        /// The pods created before it stopped.
        created: usize,
    },
    /// A create failed (the first error); the batches after it were skipped.
    Failed(String),
}

/// [`create_in_batches`] that asks `proceed` before each batch (the first included) whether
/// the owner still wants pods, and stops if not: an owner deleted while its pods are being
/// created gets at most the batch in flight, not all `n`. The creates it skips are marked
/// observed, as after a failure.
#[allow(clippy::too_many_arguments)]
pub async fn create_in_batches_while<F, Fut>(
    api: &Api<Pod>,
    pod: &Pod,
    n: usize,
    expectations: &Expectations,
    key: &ObjectKey,
    events: &EventRecorder,
    owner: &ObjectReference,
    proceed: F,
) -> BatchesEnd
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let pods = vec![pod.clone(); n];
    create_each_in_batches_while(api, &pods, expectations, key, events, owner, proceed).await
}

/// [`create_in_batches_while`] for pods that differ from one another (an Indexed Job's, one
/// per index): `pods` are created in order, in the same slow-start batches.
pub async fn create_each_in_batches_while<F, Fut>(
    api: &Api<Pod>,
    pods: &[Pod],
    expectations: &Expectations,
    key: &ObjectKey,
    events: &EventRecorder,
    owner: &ObjectReference,
    mut proceed: F,
) -> BatchesEnd
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let params = PostParams::default();
    let n = pods.len();
    let mut left = n;
    for size in crate::replicaset::batches(n) {
        if !proceed().await {
            // Never sent, so never observed.
            expectations.creation_observed(key, left);
            return BatchesEnd::Stopped { created: n - left };
        }
        let batch = &pods[n - left..n - left + size];
        // Only the created pod's name is used: its metadata is all that is decoded.
        let results =
            futures::future::join_all(batch.iter().map(|pod| api.create_metadata(&params, pod)))
                .await;
        left -= size;
        let mut failed = None;
        for r in results {
            match r {
                Ok(meta) => events.publish(
                    owner,
                    EventType::Normal,
                    "SuccessfulCreate",
                    &format!("Created pod: {}", meta.name.as_deref().unwrap_or_default()),
                ),
                Err(e) => {
                    create_failed(expectations, key, &e);
                    let msg = e.to_string();
                    events.publish(
                        owner,
                        EventType::Warning,
                        "FailedCreate",
                        &format!("Error creating: {msg}"),
                    );
                    failed.get_or_insert(msg);
                }
            }
        }
        if let Some(msg) = failed {
            // Slow start: the rest are skipped, and so never observed.
            expectations.creation_observed(key, left);
            return BatchesEnd::Failed(msg);
        }
    }
    BatchesEnd::Done
}

#[cfg(test)]
mod tests {
    use super::*;
    use setpoint_runtime::client::api_error_from_status;

    fn api(code: u16, reason: &str) -> ClientError {
        ClientError::Api(api_error_from_status(
            &serde_json::json!({"code": code, "reason": reason, "message": reason}),
            code,
        ))
    }

    #[test]
    fn a_create_that_may_have_happened_is_counted_from_the_server_before_the_next() {
        let k = ObjectKey::new(Some("default"), "web");
        for (e, unsure) in [
            // Sent, and the connection went before an answer (an API server restart).
            (ClientError::Transport("connection reset".into()), true),
            (api(504, "Timeout"), true),
            // Never sent, or refused: nothing to wait for.
            (ClientError::NotSent("the leadership has ended".into()), false),
            (
                ClientError::Transport(
                    "hyper_util::client::legacy::Error(Connect, ConnectError(\"tcp connect error\", Os { code: 111, kind: ConnectionRefused }))"
                        .into(),
                ),
                false,
            ),
            (api(422, "Invalid"), false),
            (api(500, "InternalError"), false),
            (api(409, "AlreadyExists"), false),
        ] {
            let x = Expectations::default();
            x.expect(&k, 2, HashSet::new());
            create_failed(&x, &k, &e);
            // Not waited for either way: the owner is not held still for a grace ...
            assert!(!x.satisfied(&k), "{e}");
            x.creation_observed(&k, 1);
            assert!(x.satisfied(&k), "{e}");
            // ... but after an unknown outcome its next create counts from the server.
            assert_eq!(x.unsure(&k), unsure, "{e}");
            x.recounted(&k);
            assert!(!x.unsure(&k), "{e}");
        }
        // A forgotten owner is forgotten whole.
        let x = Expectations::default();
        x.expect(&k, 1, HashSet::new());
        x.outcome_unknown(&k);
        x.forget(&k);
        assert!(!x.unsure(&k));
    }

    fn rs_pod(i: usize) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": format!("filler-{i}"), "namespace": "default",
                    "uid": format!("u{i}"), "resourceVersion": format!("{}", i + 1),
                    "ownerReferences": [{
                        "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "filler",
                        "uid": "rs", "controller": true,
                    }],
                },
            }))
            .unwrap(),
        )
    }

    #[test]
    fn expectations_are_checked_before_the_cache_is_read() {
        let owner = Owner {
            group: "apps",
            kind: "ReplicaSet",
        };
        let k = ObjectKey::new(Some("default"), "filler");
        let x = Expectations::default();
        x.expect(&k, 1000, HashSet::new());
        let pods: Vec<Arc<Pod>> = (0..1000).map(rs_pod).collect();
        // 998 creates observed: in the cache, and lowering the expectations.
        let store = Store::from_objects(pods[..998].iter().map(|p| (**p).clone()));
        for p in &pods[..998] {
            observe(&x, &Event::Added(p.clone()), owner);
        }
        let (satisfied, cached) = x.satisfied_then(&k, || {
            let cached = store.len();
            // The last two land right after the reconcile read the cache.
            for p in &pods[998..] {
                observe(&x, &Event::Added(p.clone()), owner);
            }
            cached
        });
        assert_eq!(cached, 998);
        assert!(
            !satisfied,
            "a cache read without 2 of the pods created must not be acted on"
        );
        // The next reconcile may act, and its read has them all.
        assert!(x.satisfied(&k));
    }

    #[test]
    fn owners_are_counted_from_the_server_once_per_term() {
        let f = FreshCounts::default();
        let k = ObjectKey::new(Some("default"), "web");
        // Without leader election there is no other replica to have written.
        assert!(!f.needed(&k, None));
        assert!(f.needed(&k, Some(1)));
        f.counted(&k, Some(1));
        assert!(!f.needed(&k, Some(1)));
        assert!(f.needed(&ObjectKey::new(Some("default"), "db"), Some(1)));
        // A later term follows whoever led in between.
        assert!(f.needed(&k, Some(2)));
        f.counted(&k, Some(2));
        f.forget(&k);
        assert!(f.needed(&k, Some(2)));
    }
}
