//! Request options: list, watch, create/update, patch and delete parameters.

use serde_json::Value;

fn push(q: &mut form_urlencoded::Serializer<'_, String>, k: &str, v: &str) {
    q.append_pair(k, v);
}

/// Options of a LIST.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListParams {
    /// `labelSelector`: only objects whose labels match, e.g. `app=web,tier!=db`.
    pub label_selector: Option<String>,
    /// `fieldSelector`: only objects whose selectable fields match, e.g. `spec.nodeName=n1`.
    pub field_selector: Option<String>,
    /// `limit`: at most this many items per page; the rest follow through `continue_token`.
    pub limit: Option<u32>,
    /// `continue`: the token of the previous page's
    /// [`ObjectList::continue_token`](super::ObjectList::continue_token), to read the next page.
    pub continue_token: Option<String>,
    /// `"0"` allows a cached answer; unset asks for the latest (consistent) state.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`NotOlderThan` or `Exact`): how `resource_version` is interpreted.
    pub resource_version_match: Option<String>,
}

impl ListParams {
    /// Sets the label selector.
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.into());
        self
    }
    /// Sets the field selector.
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.into());
        self
    }
    /// Sets the page size.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }
    pub(crate) fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(s) = &self.label_selector {
            push(&mut q, "labelSelector", s);
        }
        if let Some(s) = &self.field_selector {
            push(&mut q, "fieldSelector", s);
        }
        if let Some(l) = self.limit {
            push(&mut q, "limit", &l.to_string());
        }
        if let Some(c) = &self.continue_token {
            push(&mut q, "continue", c);
        }
        if let Some(rv) = &self.resource_version {
            push(&mut q, "resourceVersion", rv);
        }
        if let Some(m) = &self.resource_version_match {
            push(&mut q, "resourceVersionMatch", m);
        }
        q.finish()
    }
}

/// Options of a WATCH.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchParams {
    /// `labelSelector`: only events of objects whose labels match.
    pub label_selector: Option<String>,
    /// `fieldSelector`: only events of objects whose selectable fields match.
    pub field_selector: Option<String>,
    /// Server-side timeout; the stream ends cleanly after it.
    pub timeout_seconds: Option<u32>,
    /// `allowWatchBookmarks`: ask for BOOKMARK events carrying progress (default true).
    pub bookmarks: bool,
    /// `sendInitialEvents` (with `resourceVersionMatch=NotOlderThan`): the watch starts with the
    /// current objects as ADDED events, then a bookmark marking their end (default false).
    pub send_initial_events: bool,
}

impl Default for WatchParams {
    fn default() -> Self {
        WatchParams {
            label_selector: None,
            field_selector: None,
            timeout_seconds: Some(290),
            bookmarks: true,
            send_initial_events: false,
        }
    }
}

impl WatchParams {
    pub(crate) fn query(&self, resource_version: &str) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        push(&mut q, "watch", "true");
        if !resource_version.is_empty() {
            push(&mut q, "resourceVersion", resource_version);
        }
        if let Some(s) = &self.label_selector {
            push(&mut q, "labelSelector", s);
        }
        if let Some(s) = &self.field_selector {
            push(&mut q, "fieldSelector", s);
        }
        if let Some(t) = self.timeout_seconds {
            push(&mut q, "timeoutSeconds", &t.to_string());
        }
        if self.bookmarks {
            push(&mut q, "allowWatchBookmarks", "true");
        }
        if self.send_initial_events {
            push(&mut q, "sendInitialEvents", "true");
            push(&mut q, "resourceVersionMatch", "NotOlderThan");
        }
        q.finish()
    }
}

/// Options of a create or update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PostParams {
    /// `dryRun=All`: validate and admit, but persist nothing.
    pub dry_run: bool,
    /// `fieldManager`: the manager the write's fields are recorded under in `managedFields`.
    pub field_manager: Option<String>,
}

impl PostParams {
    pub(crate) fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if self.dry_run {
            push(&mut q, "dryRun", "All");
        }
        if let Some(m) = &self.field_manager {
            push(&mut q, "fieldManager", m);
        }
        q.finish()
    }
}

/// A patch body, by type.
#[derive(Clone, Debug, PartialEq)]
pub enum Patch {
    /// RFC 7386 JSON merge patch.
    Merge(Value),
    /// RFC 6902 JSON patch (an array of operations).
    Json(Value),
    /// Kubernetes strategic merge patch (built-in kinds).
    Strategic(Value),
    /// Server-side apply (needs a field manager).
    Apply(Value),
}

impl Patch {
    pub(crate) fn content_type(&self) -> &'static str {
        match self {
            Patch::Merge(_) => "application/merge-patch+json",
            Patch::Json(_) => "application/json-patch+json",
            Patch::Strategic(_) => "application/strategic-merge-patch+json",
            Patch::Apply(_) => "application/apply-patch+yaml",
        }
    }
    pub(crate) fn body(&self) -> &Value {
        match self {
            Patch::Merge(v) | Patch::Json(v) | Patch::Strategic(v) | Patch::Apply(v) => v,
        }
    }
}

/// Options of a patch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PatchParams {
    /// `dryRun=All`: validate and admit, but persist nothing.
    pub dry_run: bool,
    /// `fieldManager`: the manager the patch's fields are recorded under; required for server-side
    /// apply.
    pub field_manager: Option<String>,
    /// `force`: server-side apply takes over fields other managers own instead of failing with a
    /// conflict.
    pub force: bool,
}

impl PatchParams {
    /// Server-side apply as `manager`.
    pub fn apply(manager: &str) -> Self {
        PatchParams {
            field_manager: Some(manager.into()),
            ..Default::default()
        }
    }
    pub(crate) fn query(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if self.dry_run {
            push(&mut q, "dryRun", "All");
        }
        if let Some(m) = &self.field_manager {
            push(&mut q, "fieldManager", m);
        }
        if self.force {
            push(&mut q, "force", "true");
        }
        q.finish()
    }
}

/// Options of a delete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeleteParams {
    /// `gracePeriodSeconds`: how long a pod's containers get to stop; 0 deletes at once; unset uses
    /// the object's own period.
    pub grace_period_seconds: Option<i64>,
    /// `Foreground`, `Background` or `Orphan`.
    pub propagation_policy: Option<String>,
    /// `preconditions.uid`: delete only if the object still has this uid (409 otherwise).
    pub precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`: delete only if the object is still at this version (409
    /// otherwise).
    pub precondition_resource_version: Option<String>,
    /// `dryRun=All`: check the delete, but change nothing.
    pub dry_run: bool,
}

impl DeleteParams {
    /// `propagationPolicy: Foreground`: the object stays (with the `foregroundDeletion` finalizer)
    /// until its dependents are gone.
    pub fn foreground() -> Self {
        DeleteParams {
            propagation_policy: Some("Foreground".into()),
            ..Default::default()
        }
    }
    /// `propagationPolicy: Background`: the object goes now; the garbage collector deletes its
    /// dependents afterwards.
    pub fn background() -> Self {
        DeleteParams {
            propagation_policy: Some("Background".into()),
            ..Default::default()
        }
    }
    /// `propagationPolicy: Orphan`: the object goes; its dependents stay, with their owner
    /// references to it removed.
    pub fn orphan() -> Self {
        DeleteParams {
            propagation_policy: Some("Orphan".into()),
            ..Default::default()
        }
    }
    pub(crate) fn body(&self) -> Value {
        let mut v = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1"});
        if let Some(g) = self.grace_period_seconds {
            v["gracePeriodSeconds"] = g.into();
        }
        if let Some(p) = &self.propagation_policy {
            v["propagationPolicy"] = p.clone().into();
        }
        if self.precondition_uid.is_some() || self.precondition_resource_version.is_some() {
            let mut pre = serde_json::Map::new();
            if let Some(u) = &self.precondition_uid {
                pre.insert("uid".into(), u.clone().into());
            }
            if let Some(r) = &self.precondition_resource_version {
                pre.insert("resourceVersion".into(), r.clone().into());
            }
            v["preconditions"] = Value::Object(pre);
        }
        if self.dry_run {
            v["dryRun"] = serde_json::json!(["All"]);
        }
        v
    }
}
