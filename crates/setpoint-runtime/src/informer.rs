//! Informers: a local, indexed, always-converging copy of one resource, plus change
//! notifications.
//!
//! An [`Informer`] LISTs a resource, then WATCHes it from the list's `resourceVersion`,
//! keeping a [`Store`] (the cache, with indexes) current and telling registered handlers what
//! changed as [`Event`]s. When the watch times out it resumes from the last `resourceVersion`
//! it saw (events and bookmarks both advance it); when the server answers 410 Gone, or the
//! watch fails, it relists and emits exactly the differences against its cache, so a handler
//! never misses a change — not even a delete that happened while the connection was down.
//!
//! An object that does not decode as the informer's type (a malformed stored object) is
//! skipped, whether it comes in a LIST or a watch event: it is absent from the cache until it
//! decodes again, logged once while it stays bad, and counted in
//! [`InformerMetrics`](crate::metrics::InformerMetrics) (see [`InformerOptions::metrics`]);
//! every other object keeps flowing.
//!
//! Events are hints ("this key changed"), which is all a level-triggered controller needs: its
//! handler enqueues keys and the reconcile reads current state from the [`Store`].
//!
//! [`SharedInformers`] hands out one informer per (resource, namespace, label selector, field
//! selector), however many controllers ask for it, so N controllers on pods open one watch.
//!
//! ```no_run
//! # async fn demo(client: setpoint_runtime::Client) -> Result<(), setpoint_runtime::informer::InformerError> {
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::Pod;
//! use setpoint_runtime::informer::{Event, Scope, SharedInformers};
//!
//! let informers = SharedInformers::new(client);
//! let pods = informers.typed::<Pod>(Scope::all());
//! // Handlers run on the informer's task and must not block: enqueue and return.
//! pods.subscribe(Arc::new(|event: &Event<Pod>| {
//!     println!("{} changed", event.key());
//! }));
//! pods.wait_synced().await?;
//! let store = pods.store();
//! for pod in store.by_node("node-1") {
//!     println!("{:?} runs on node-1", pod.metadata.name);
//! }
//! informers.shutdown().await;
//! # Ok(()) }
//! ```

mod backoff;
mod handle;
mod reflector;
mod shared;
mod store;

use std::sync::Arc;

use crate::object::{Object, ObjectKey};

pub use backoff::Backoff;
pub use handle::{Informer, InformerOptions};
pub use shared::{Scope, SharedInformers, StartPolicy};
pub use store::{IndexFn, Store, LABEL_INDEX, NAMESPACE_INDEX, NODE_INDEX, OWNER_INDEX};

/// A change to one object, as seen by the cache.
///
/// `Updated { old, new }` with `old` and `new` the same allocation ([`Event::is_resync`]) is a
/// periodic resync: nothing changed, the object is delivered again so that a handler that
/// dropped something gets another chance.
#[derive(Debug)]
pub enum Event<K> {
    /// The object appeared (created, or first seen: initial list, late subscription).
    Added(Arc<K>),
    /// The object changed (its `resourceVersion` differs), or a resync.
    Updated {
        /// The state the cache held before.
        old: Arc<K>,
        /// The state the cache holds now.
        new: Arc<K>,
    },
    /// The object is gone. After a relist this is the last state the cache held, because the
    /// final state of an object deleted while disconnected is unknown.
    Deleted(Arc<K>),
}

// Derived `Clone` would require `K: Clone`; cloning only bumps reference counts.
impl<K> Clone for Event<K> {
    fn clone(&self) -> Self {
        match self {
            Event::Added(o) => Event::Added(o.clone()),
            Event::Updated { old, new } => Event::Updated {
                old: old.clone(),
                new: new.clone(),
            },
            Event::Deleted(o) => Event::Deleted(o.clone()),
        }
    }
}

impl<K: Object> Event<K> {
    /// The object's current state (for a deletion: its last known state).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Event::Added(o) | Event::Deleted(o) => o,
            Event::Updated { new, .. } => new,
        }
    }

    /// The key of the object the event is about.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(self.object().as_ref())
    }

    /// Whether this is a periodic redelivery of an unchanged object.
    pub fn is_resync(&self) -> bool {
        matches!(self, Event::Updated { old, new } if Arc::ptr_eq(old, new))
    }
}

/// An event handler. It runs on the informer's task while the informer holds its dispatch
/// lock, so it must be quick and must not block (enqueue a key and return). It may read the
/// [`Store`], but must not subscribe or unsubscribe handlers from inside the call.
pub type Handler<K> = Arc<dyn Fn(&Event<K>) + Send + Sync>;

/// Identifies a registered handler, for [`Informer::unsubscribe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HandlerId(u64);

/// What can go wrong using an informer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InformerError {
    /// The informer was stopped (or its factory shut down or dropped) before its cache synced.
    #[error("the informer stopped before its cache synced (was its SharedInformers shut down or dropped?)")]
    Stopped,
    /// An index of that name is already registered.
    #[error("an index named {0:?} is already registered")]
    IndexExists(String),
}
