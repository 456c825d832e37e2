//! Compaction of old revisions: on a store of its own the server compacts on its own clock;
//! on a shared store (etcd with several API servers) the servers take turns through
//! [`COMPACTION_GUARD_KEY`], as Kubernetes does on etcd.

use std::sync::Arc;

use setpoint_store::COMPACTION_GUARD_KEY;

use crate::state::ApiServer;

impl ApiServer {
    /// Every interval, compacts the store to the revision seen one interval earlier, so that
    /// watchers and paginated lists get at least one interval of history.
    ///
    /// A shared store (etcd with several API servers) uses [`Self::compact_if_first`] instead, so
    /// that the servers compact once per interval between them rather than each on its own
    /// clock.
    pub(crate) async fn compaction_loop(self: Arc<Self>) {
        let interval = self.config.compaction_interval;
        let shared = self.config.store.is_shared();
        let mut previous = None;
        let mut guard = GuardSeen::default();
        let mut stop = self.stopping.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if shared {
                self.compact_if_first(&mut guard).await;
                continue;
            }
            if let Some(rev) = previous {
                self.compact_to(rev).await;
            }
            previous = self.store.current_revision().await.ok();
        }
    }

    async fn compact_to(&self, rev: setpoint_store::Revision) {
        if let Err(e) = self.store.compact(rev).await {
            tracing::warn!(error = %e, revision = rev, "compaction failed");
        } else {
            tracing::debug!(revision = rev, "compacted");
        }
    }

    /// One compaction tick on a shared store, after the scheme Kubernetes uses on etcd.
    ///
    /// Every server remembers the `mod_revision` of [`COMPACTION_GUARD_KEY`] as it last saw it
    /// and the revision it saw it at. Each tick it rewrites the key with a compare-and-swap on
    /// that `mod_revision` (one etcd transaction):
    /// - if the swap succeeds, nobody has compacted since this server's previous tick, so it
    ///   compacts to the revision it remembered at its previous tick (one interval old), and
    ///   remembers the new one;
    /// - if it fails, another server swapped (and compacted) in the meantime: this server
    ///   adopts the key's new `mod_revision` and the current revision, and tries again next
    ///   tick.
    ///
    /// So at most one server compacts per interval, always to a revision at least one interval
    /// old, and when that server goes away another takes over after one more interval.
    async fn compact_if_first(&self, seen: &mut GuardSeen) {
        let precondition = match seen.mod_revision {
            Some(r) => setpoint_store::Precondition::ModRevision(r),
            None => setpoint_store::Precondition::NotExists,
        };
        let value = bytes::Bytes::from(seen.target.unwrap_or(0).to_string());
        match self
            .store
            .put(COMPACTION_GUARD_KEY, value, precondition)
            .await
        {
            Ok(kv) => {
                if let Some(target) = seen.target {
                    self.compact_to(target).await;
                }
                seen.mod_revision = Some(kv.mod_revision);
                seen.target = Some(kv.mod_revision);
            }
            Err(setpoint_store::StoreError::Conflict { current, .. }) => {
                seen.mod_revision = current.map(|kv| kv.mod_revision);
                seen.target = self.store.current_revision().await.ok();
            }
            Err(setpoint_store::StoreError::AlreadyExists { .. }) => {
                match self.store.get(COMPACTION_GUARD_KEY).await {
                    Ok(kv) => seen.mod_revision = kv.map(|kv| kv.mod_revision),
                    Err(e) => tracing::warn!(error = %e, "reading the compaction guard"),
                }
                seen.target = self.store.current_revision().await.ok();
            }
            Err(e) => tracing::warn!(error = %e, "compaction guard"),
        }
    }
}

/// What a server last saw of [`COMPACTION_GUARD_KEY`] (see `ApiServer::compact_if_first`).
#[derive(Debug, Default)]
struct GuardSeen {
    /// The key's `mod_revision` when this server last looked (`None`: absent).
    mod_revision: Option<setpoint_store::Revision>,
    /// The revision to compact to if this server's next swap succeeds: the one it saw at its
    /// previous tick, so one interval old by then.
    target: Option<setpoint_store::Revision>,
}
