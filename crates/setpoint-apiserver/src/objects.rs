//! The generic storage semantics every resource shares: create, get, update (PUT), patch,
//! delete and deletecollection over the store, with optimistic concurrency.
//!
//! Objects are stored as JSON without `metadata.resourceVersion`; the key's `mod_revision` is
//! the resourceVersion and is filled in on every read. Updates re-read the stored object and
//! write with a compare-and-swap on its `mod_revision`, retrying on a race unless the client
//! named a resourceVersion (then a mismatch is 409).

use std::borrow::Cow;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use setpoint_api::{meta, ApiError, Cause};
use setpoint_store::{KeyValue, Precondition, RangeRequest, Revision, StoreError};

use crate::registry::ResourceDef;
use crate::state::ApiServer;
use crate::strategy::{self, View};
use crate::watchcache::{decode_object, served_json};

/// `fieldValidation`: what to do with unknown fields in a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Strict,
    #[default]
    Warn,
    Ignore,
}

/// The syntax of a request body, for [`ApiServer::check_duplicate_fields`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodySyntax {
    Json,
    Yaml,
    /// Protobuf and anything else without repeatable keys.
    Other,
}

/// The one place `fieldValidation` decides about problem fields of a write (`what` is `unknown`
/// or `duplicate`): a 400 for `Strict`, warnings for `Warn`, nothing for `Ignore`.
pub(crate) fn field_policy(
    res: &ResourceDef,
    fields: &[String],
    what: &str,
    opts: &WriteOptions,
) -> Result<Vec<String>, ApiError> {
    if opts.field_validation == FieldValidation::Ignore || fields.is_empty() {
        return Ok(vec![]);
    }
    let msgs: Vec<String> = fields
        .iter()
        .map(|f| format!("{what} field \"{f}\""))
        .collect();
    match opts.field_validation {
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
            res.kind,
            res.version,
            res.kind,
            msgs.join(", ")
        ))),
        _ => Ok(msgs),
    }
}

/// Options shared by writes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: everything but storing.
    pub dry_run: bool,
    /// `fieldValidation`: what unknown and duplicate fields cause.
    pub field_validation: FieldValidation,
    /// `fieldManager`, else the client's user agent.
    pub field_manager: Option<String>,
    /// Who writes (`None` for the server's own writes), for rules that depend on the caller.
    pub user: Option<std::sync::Arc<crate::authentication::UserInfo>>,
    /// The resource the client named, when the write goes to another's storage (a version
    /// of a custom resource it is not stored in, `autoscaling/v1` HPAs): admission webhooks
    /// match the request as made to it.
    pub requested: Option<std::sync::Arc<ResourceDef>>,
}

/// A successful write: the object as stored (or as it would be, for dry runs).
#[derive(Clone, Debug)]
pub struct Written {
    pub object: Value,
    pub warnings: Vec<String>,
    /// `object` as JSON, when the write stored it as it is: the stored bytes with the
    /// resourceVersion spliced in. A response sends these instead of serializing `object`
    /// again.
    pub json: Option<Bytes>,
}

/// `DeleteOptions`, from the body or the query.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation_policy: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
    pub dry_run: bool,
    /// Who deletes (NodeRestriction limits nodes to their own pods); `None` for the
    /// server's own deletes.
    pub user: Option<std::sync::Arc<crate::authentication::UserInfo>>,
    /// The resource the client named, when it is not the one deleted from (a version of a
    /// custom resource it is not stored in): admission webhooks match the request as made
    /// to it, as for other writes.
    pub requested: Option<std::sync::Arc<ResourceDef>>,
}

/// What a delete did.
#[derive(Clone, Debug)]
pub struct Deleted {
    /// The object: its last state if removed, or its new state if deletion is pending.
    pub object: Value,
    /// True if the object is gone; false if finalizers or a grace period hold it.
    pub removed: bool,
}

/// The field manager a write is recorded under.
/// How many times a write through a converted version is tried again when the object
/// changed (or appeared, or went) between its read and its write.
const CONVERTED_ATTEMPTS: usize = 16;

/// The version part of an `apiVersion` (`v1` of `example.com/v1`).
fn version_of(api_version: &str) -> &str {
    api_version.rsplit('/').next().unwrap_or(api_version)
}

fn manager(opts: &WriteOptions) -> &str {
    opts.field_manager
        .as_deref()
        .filter(|m| !m.is_empty())
        .unwrap_or(crate::apply::DEFAULT_MANAGER)
}

fn store_err(res: &ResourceDef, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::AlreadyExists { .. } => ApiError::already_exists(&res.group_resource(), name),
        StoreError::Conflict { .. } => ApiError::stale(&res.group_resource(), name),
        StoreError::NotFound { .. } => ApiError::not_found(&res.group_resource(), name),
        StoreError::TooLarge { .. } => object_too_large(),
        StoreError::Compacted {
            requested,
            compacted,
        } => ApiError::too_old_resource_version(requested, compacted + 1),
        StoreError::FutureRevision { requested, current } => {
            ApiError::too_large_resource_version(requested.max(0).unsigned_abs(), current)
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// Serializes an object for storage (without its resourceVersion), LZ4-compressed when that
/// makes it smaller (see `setpoint_store::compression`; readers go through [`decode_object`],
/// [`served_json`] or the watch cache's `CachedObject`, which accept either form).
///
/// The result lives as long as the object's version is kept (the store's latest value, its
/// recent history and the watch cache all share it, and the embedded store writes it to disk),
/// so it is compressed and allocated at its exact size. Serializing into a reused per-thread
/// buffer spares the growth's reallocations.
///
/// An object whose JSON is larger than [`MAX_OBJECT_BYTES`] is refused here, before anything is
/// written, whatever the write path: compression must not let a repetitive object of any size
/// in (it would be that size again in every reader's memory).
pub(crate) fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    /// Objects up to this size (most of them) reuse the buffer; a larger one's is dropped.
    const KEEP_BUFFER: usize = 64 * 1024;
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|buf| {
        buf.clear();
        let mut limited = LimitedWriter {
            buf: &mut *buf,
            limit: MAX_OBJECT_BYTES,
        };
        // Serializing a `Value` into memory fails only when the limit is reached.
        let stored = match serde_json::to_writer(&mut limited, &WithoutResourceVersion(obj)) {
            Ok(()) => Ok(setpoint_store::compression::compress(buf)),
            Err(_) => Err(object_too_large()),
        };
        if buf.capacity() > KEEP_BUFFER {
            *buf = Vec::new();
        }
        stored
    })
}

/// The most bytes an object may take as stored (its JSON without `resourceVersion`, before
/// compression): etcd's default request limit, 1.5 MiB, the largest object Kubernetes can store.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// 413 for an object over [`MAX_OBJECT_BYTES`], with the message etcd gives Kubernetes for a
/// request over its limit.
pub fn object_too_large() -> ApiError {
    ApiError::too_large("etcdserver: request is too large")
}

/// A buffer that refuses to grow past `limit`, so an oversized object is never serialized whole.
struct LimitedWriter<'a> {
    buf: &'a mut Vec<u8>,
    limit: usize,
}

impl std::io::Write for LimitedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            return Err(std::io::Error::other("object too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serializes an object as stored: everything but `metadata.resourceVersion`, without
/// copying the object.
struct WithoutResourceVersion<'a>(&'a Value);

impl serde::Serialize for WithoutResourceVersion<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Value::Object(map) = self.0 else {
            return self.0.serialize(s);
        };
        let mut out = s.serialize_map(Some(map.len()))?;
        for (k, v) in map {
            match v.as_object().filter(|_| k == "metadata") {
                Some(meta) => out.serialize_entry(k, &MetadataWithoutResourceVersion(meta))?,
                None => out.serialize_entry(k, v)?,
            }
        }
        out.end()
    }
}

struct MetadataWithoutResourceVersion<'a>(&'a serde_json::Map<String, Value>);

impl serde::Serialize for MetadataWithoutResourceVersion<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut out = s.serialize_map(None)?;
        for (k, v) in self
            .0
            .iter()
            .filter(|(k, _)| k.as_str() != "resourceVersion")
        {
            out.serialize_entry(k, v)?;
        }
        out.end()
    }
}

fn with_rv(mut obj: Value, rv: Revision) -> Value {
    meta::set_meta(&mut obj, "resourceVersion", json!(rv.to_string()));
    obj
}

/// Upstream's `checkName` for the object an update or patch produced: its name must be the
/// URL's, and its namespace the request's (an emptied namespace is the request's again).
fn check_name(
    res: &ResourceDef,
    obj: &mut Value,
    name: &str,
    namespace: &str,
) -> Result<(), ApiError> {
    let obj_name = meta::name(obj);
    if obj_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({obj_name}) does not match the name on the URL ({name})"
        )));
    }
    if res.namespaced {
        match meta::namespace(obj) {
            "" => meta::set_meta(obj, "namespace", json!(namespace)),
            ns if ns != namespace => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the object ({ns}) does not match the namespace on the request ({namespace})"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

fn same_ignoring_rv(a: &Value, b: &Value) -> bool {
    meta::eq_ignoring_meta(a, b, &["resourceVersion"])
}

impl ApiServer {
    async fn timed<T>(&self, op: &str, fut: impl std::future::Future<Output = T>) -> T {
        let start = Instant::now();
        let out = fut.await;
        self.metrics.store(op, start.elapsed());
        out
    }

    async fn read(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<(Value, KeyValue), ApiError> {
        let key = res.key(namespace, name);
        let kv = self
            .timed("get", self.store.get(&key))
            .await
            .map_err(|e| store_err(res, name, e))?
            .ok_or_else(|| ApiError::not_found(&res.group_resource(), name))?;
        let obj = decode_object(&kv.value, kv.mod_revision)
            .ok_or_else(|| ApiError::internal(format!("stored object {key} is not valid JSON")))?;
        Ok((obj, kv))
    }

    /// Writes `obj` if the key is still at `expected`; `Ok(None)` means someone else wrote
    /// first and the caller should re-read and retry.
    async fn cas_put(
        &self,
        res: &ResourceDef,
        key: &str,
        obj: &Value,
        expected: Revision,
    ) -> Result<Option<KeyValue>, ApiError> {
        match self
            .timed(
                "update",
                self.store
                    .put(key, encode(obj)?, Precondition::ModRevision(expected)),
            )
            .await
        {
            Ok(kv) => {
                let (ns, name) = (meta::namespace(obj), meta::name(obj));
                crate::trail::note(res, ns, name, Some(obj), kv.mod_revision, false);
                Ok(Some(kv))
            }
            Err(StoreError::Conflict { .. }) => Ok(None),
            Err(e) => Err(store_err(res, meta::name(obj), e)),
        }
    }

    /// Deletes the key if it is still at `expected`; `Ok(None)` means it changed (retry).
    async fn cas_delete(
        &self,
        res: &ResourceDef,
        key: &str,
        name: &str,
        expected: Revision,
    ) -> Result<Option<Revision>, ApiError> {
        match self
            .timed(
                "delete",
                self.store.delete(key, Precondition::ModRevision(expected)),
            )
            .await
        {
            Ok((_, rev)) => {
                // The key ends in `<namespace>/<name>` for namespaced resources.
                let ns = match res.namespaced {
                    true => key.rsplit('/').nth(1).unwrap_or_default(),
                    false => "",
                };
                crate::trail::note(res, ns, name, None, rev, true);
                Ok(Some(rev))
            }
            Err(StoreError::Conflict { .. }) => Ok(None),
            Err(StoreError::NotFound { .. }) => {
                Err(ApiError::not_found(&res.group_resource(), name))
            }
            Err(e) => Err(store_err(res, name, e)),
        }
    }

    /// GET of one object (a consistent read from the store).
    pub async fn get_object(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        Ok(self.read(res, namespace, name).await?.0)
    }

    /// Checks the namespace of a namespaced create exists and is not terminating.
    async fn check_namespace(&self, res: &ResourceDef, namespace: &str) -> Result<(), ApiError> {
        if !res.namespaced {
            return Ok(());
        }
        let ns_res = self
            .registry()
            .get("", "v1", "namespaces")
            .expect("namespaces are built in")
            .clone();
        let key = ns_res.key("", namespace);
        // Every create asks, so the cached namespace is not parsed beyond that one field.
        let cached = self
            .caches
            .get(&ns_res.storage_prefix())
            .get(&key)
            .map(|o| o.is_being_deleted());
        let terminating = match cached {
            Some(t) => t,
            None => {
                let ns = self.get_object(&ns_res, "", namespace).await?;
                meta::deletion_timestamp(&ns).is_some()
            }
        };
        if terminating {
            return Err(ApiError::forbidden(
                &res.group_resource(),
                "",
                &format!("unable to create new content in namespace {namespace} because it is being terminated"),
            ));
        }
        Ok(())
    }

    /// Rejects or warns about fields the kind does not know, per `fieldValidation`, and drops
    /// them from a built-in kind's `obj` (whatever `fieldValidation` says: Kubernetes decodes the
    /// body into the kind's type, which has nowhere to keep them). Custom resources are pruned by
    /// their schema later, in `crd::admit`.
    fn check_unknown_fields(
        &self,
        res: &ResourceDef,
        obj: &mut Value,
        opts: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        if res.is_converted() {
            return Ok(vec![]);
        }
        // The decode that finds unknown fields finds values of the wrong type too: those are
        // the decoder's 400, before anything else is looked at (a name of the wrong type is not
        // a name that differs from the URL's).
        if res.custom.is_some() {
            if let Some(e) = crate::decoding::custom_metadata_error(res, obj) {
                return Err(e);
            }
            if opts.field_validation == FieldValidation::Ignore {
                return Ok(vec![]);
            }
            let unknown = crate::crd::unknown_fields(res, obj);
            return self.unknown_field_policy(res, &unknown, opts);
        }
        let check =
            setpoint_kinds::validation::check_types(&res.group, &res.version, &res.kind, obj);
        if let Some(e) = crate::decoding::type_error(res, obj, &check.type_errors) {
            return Err(e);
        }
        check.drop_unknown(obj);
        self.unknown_field_policy(res, &check.unknown, opts)
    }

    /// Server-side apply's answer to fields the kind does not know in an apply configuration:
    /// always a 400, whatever `fieldValidation` says (an apply configuration is converted to the
    /// kind's schema to track ownership, and has no place for them), in Kubernetes' words:
    /// `failed to create typed patch object (ns/name; apps/v1, Kind=Deployment): .spec.foo:
    /// field not declared in schema`. (Kubernetes answers it with a 500 by mistake; a fix that
    /// makes it the 400 it is here is under review upstream.)
    fn check_apply_fields(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        config: &Value,
    ) -> Result<(), ApiError> {
        // A custom resource's every version has its schema; other converted resources are
        // checked in their storage form.
        if res.is_converted() && res.custom.is_none() {
            return Ok(());
        }
        let unknown = if res.custom.is_some() {
            crate::crd::unknown_fields(res, config)
        } else {
            setpoint_kinds::validation::unknown_fields(&res.group, &res.version, &res.kind, config)
        };
        if unknown.is_empty() {
            return Ok(());
        }
        let errors: Vec<String> = unknown
            .iter()
            .map(|f| {
                let at = crate::apply::display_path(res, config, f);
                format!("{at}: field not declared in schema")
            })
            .collect();
        let detail = match errors.as_slice() {
            [one] => one.clone(),
            many => format!("errors:\n  {}", many.join("\n  ")),
        };
        let gvk = if res.group.is_empty() {
            format!("/{}, Kind={}", res.version, res.kind)
        } else {
            format!("{}/{}, Kind={}", res.group, res.version, res.kind)
        };
        Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({namespace}/{name}; {gvk}): {detail}"
        )))
    }

    /// Turns unknown fields into a 400 (`Strict`) or warnings (`Warn`), or nothing (`Ignore`).
    fn unknown_field_policy(
        &self,
        res: &ResourceDef,
        unknown: &[String],
        opts: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        if res.is_converted() {
            return Ok(vec![]);
        }
        field_policy(res, unknown, "unknown", opts)
    }

    /// Rejects (`Strict`) or warns about (`Warn`) keys repeated in a request body of `syntax`;
    /// with `Ignore` the body is not even scanned (its decoder kept the last of repeated keys).
    pub fn check_duplicate_fields(
        &self,
        res: &ResourceDef,
        syntax: BodySyntax,
        body: &[u8],
        opts: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        if opts.field_validation == FieldValidation::Ignore {
            return Ok(vec![]);
        }
        let dups = match syntax {
            BodySyntax::Json => crate::dupfields::json(body),
            BodySyntax::Yaml => match std::str::from_utf8(body) {
                Ok(text) => crate::dupfields::yaml(text),
                Err(_) => vec![],
            },
            BodySyntax::Other => vec![],
        };
        field_policy(res, &dups, "duplicate", opts)
    }

    /// Validates the result of an update. Its `managedFields` were just written by the server
    /// (`apply::record_update`, or apply's own bookkeeping), so the typed decode that finds
    /// values of the wrong type skips them: on a pod they are much of the object, and what the
    /// server wrote needs no checking. They are set to null in place for the decode (keeping
    /// their position among the metadata keys) and put back.
    fn validate_update(
        &self,
        res: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
        status_write: bool,
    ) -> Result<(), ApiError> {
        let managed = obj
            .get_mut("metadata")
            .and_then(|m| m.get_mut("managedFields"))
            .map(Value::take);
        let (group, version, kind) = (&res.group, &res.version, &res.kind);
        // A status write takes all but `status` from the stored object, checked when written.
        let type_errors = if status_write {
            setpoint_kinds::validation::status_type_errors(group, version, kind, obj)
        } else {
            setpoint_kinds::validation::type_errors(group, version, kind, obj)
        };
        if let Some(m) = managed {
            obj["metadata"]["managedFields"] = m;
        }
        // A value of the wrong type is a decode error (400), before any other check.
        if let Some(e) = crate::decoding::type_error(res, obj, &type_errors)
            .or_else(|| crate::decoding::custom_metadata_error(res, obj))
        {
            return Err(e);
        }
        let mut causes = setpoint_kinds::validation::validate_with_type_errors(
            &res.group,
            &res.kind,
            obj,
            old,
            type_errors,
        );
        causes.extend(crate::crd::validate(res, obj, old));
        causes.extend(crate::admission::expressions::validate(res, obj));
        self.invalid_if_any(res, obj, causes)
    }

    /// 422 with `causes` (plus a missing namespace), or Ok when there are none.
    fn invalid_if_any(
        &self,
        res: &ResourceDef,
        obj: &Value,
        mut causes: Vec<Cause>,
    ) -> Result<(), ApiError> {
        if res.namespaced && meta::namespace(obj).is_empty() {
            causes.push(Cause::required("metadata.namespace", ""));
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &res.group,
                &res.kind,
                meta::name(obj),
                causes,
            ))
        }
    }

    /// Checks `apiVersion`/`kind` of a body against the URL (filling them in when absent) and
    /// the namespace against the request's.
    fn check_type_and_namespace(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: &mut Value,
    ) -> Result<(), ApiError> {
        crate::typemeta::check_body(res, obj)?;
        if res.namespaced {
            let body_ns = meta::namespace(obj).to_string();
            if body_ns.is_empty() {
                meta::set_meta(obj, "namespace", json!(namespace));
            } else if body_ns != namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        } else {
            meta::remove_meta(obj, "namespace");
        }
        Ok(())
    }

    /// POST: creates an object (with `generateName` support).
    pub async fn create(
        &self,
        res: &ResourceDef,
        namespace: &str,
        obj: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        self.create_tracked(res, namespace, obj, opts, true).await
    }

    /// Creates an object; with `track`, the creator's fields are recorded as an `Update` in
    /// `managedFields` (apply records its own `Apply` entry before calling this).
    async fn create_tracked(
        &self,
        res: &ResourceDef,
        namespace: &str,
        mut obj: Value,
        opts: &WriteOptions,
        track: bool,
    ) -> Result<Written, ApiError> {
        self.check_type_and_namespace(res, namespace, &mut obj)?;
        // One typed decode of the client's body finds both unknown fields and type errors;
        // the other rules run on the defaulted object below.
        let types = if res.is_converted() {
            setpoint_kinds::validation::TypeCheck::default()
        } else {
            setpoint_kinds::validation::check_types(&res.group, &res.version, &res.kind, &obj)
        };
        // A value of the wrong type is a decode error (400), before any other check.
        if let Some(e) = crate::decoding::type_error(res, &obj, &types.type_errors)
            .or_else(|| crate::decoding::custom_metadata_error(res, &obj))
        {
            return Err(e);
        }
        let unknown = if res.custom.is_some() {
            crate::crd::unknown_fields(res, &obj)
        } else {
            types.unknown.clone()
        };
        let mut warnings = self.unknown_field_policy(res, &unknown, opts)?;
        // Unknown fields of built-in kinds are never stored (custom resources are pruned by
        // their schema in `crd::admit`).
        types.drop_unknown(&mut obj);
        let generate = meta::generate_name(&obj).to_string();
        if meta::name(&obj).is_empty() && generate.is_empty() {
            return Err(ApiError::invalid(
                &res.group,
                &res.kind,
                "",
                vec![Cause::required(
                    "metadata.name",
                    "name or generateName is required",
                )],
            ));
        }
        if !meta::resource_version(&obj).is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let now = setpoint_api::time::now_rfc3339();
        strategy::prepare_for_create(res, &mut obj, &now);
        crate::certificates::prepare_for_create(res, &mut obj, opts.user.as_deref());
        setpoint_kinds::defaults::apply(&res.group, &res.kind, &mut obj);
        setpoint_kinds::defaults::on_create(&res.group, &res.kind, &mut obj);
        if crate::crd::is_crd(res) {
            crate::crd::on_create_crd(&mut obj);
        }
        if res.custom.as_ref().is_some_and(|c| c.terminating) {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "create not allowed while custom resource definition is terminating",
            ));
        }
        crate::crd::admit(res, &mut obj);
        crate::admission::admit(res, &mut obj, &self.config.admission());
        self.default_limits(res, namespace, &mut obj);
        // NamespaceLifecycle comes before ServiceAccount, as upstream orders its plugins: a
        // pod in a missing namespace is 404, not a missing `default` account.
        self.check_namespace(res, namespace).await?;
        self.admit_service_account(res, namespace, &mut obj).await?;
        self.admit_storage(res, &mut obj);
        let hook_options =
            crate::webhook::options("CreateOptions", opts.dry_run, opts.field_manager.as_deref());
        let created_name = meta::name(&obj).to_string();
        let call = crate::webhook::Call {
            res: opts.requested.as_deref().unwrap_or(res),
            subresource: "",
            operation: "CREATE",
            namespace,
            name: &created_name,
            old: None,
            dry_run: opts.dry_run,
            user: opts.user.as_deref(),
            options: &hook_options,
        };
        warnings.extend(self.mutating_webhooks(&call, Some(&mut obj)).await?);
        if track {
            self.record_write(res, None, &mut obj, opts, None, &now)
                .await;
        }
        // A generated name that collides is retried with a fresh suffix, as Kubernetes does.
        let attempts = if generate.is_empty() { 1 } else { 8 };
        for attempt in 0..attempts {
            if !generate.is_empty() && (attempt > 0 || meta::name(&obj).is_empty()) {
                let name = format!("{generate}{}", setpoint_api::names::generate_name_suffix());
                meta::set_meta(&mut obj, "name", json!(name));
            }
            strategy::prepare_named(res, &mut obj);
            let mut causes = setpoint_kinds::validation::validate_with_type_errors(
                &res.group,
                &res.kind,
                &obj,
                None,
                types.type_errors.clone(),
            );
            causes.extend(crate::crd::validate(res, &obj, None));
            causes.extend(crate::admission::expressions::validate(res, &obj));
            self.invalid_if_any(res, &obj, causes)?;
            self.check_escalation(res, namespace, &obj, opts)?;
            crate::admission::noderestriction::admit(
                res,
                namespace,
                &obj,
                None,
                false,
                opts.user.as_deref(),
            )?;
            // Validating admission (LimitRanger, PodSecurity, then ResourceQuota), charged
            // once however many names a generateName takes.
            if attempt == 0 {
                self.check_limits(res, namespace, &obj)?;
                warnings.extend(self.pod_security_on_create(res, namespace, &obj).await?);
                let name = meta::name(&obj).to_string();
                let call = crate::webhook::Call {
                    name: &name,
                    ..call
                };
                warnings.extend(self.validating_webhooks(&call, Some(&obj)).await?);
                self.charge_quotas(res, namespace, &obj, opts.dry_run)
                    .await?;
            }
            let reserved = if opts.dry_run {
                None
            } else {
                self.allocate_for(res, &mut obj).await?
            };
            if opts.dry_run {
                return Ok(Written {
                    object: obj,
                    warnings,
                    json: None,
                });
            }
            let key = res.key(namespace, meta::name(&obj));
            let value = match encode(&obj) {
                Ok(value) => value,
                Err(e) => {
                    if let Some(r) = &reserved {
                        self.release(r).await;
                    }
                    return Err(e);
                }
            };
            match self
                .timed(
                    "create",
                    self.store.put(&key, value, Precondition::NotExists),
                )
                .await
            {
                Ok(kv) => {
                    let name = meta::name(&obj);
                    crate::trail::note(res, namespace, name, Some(&obj), kv.mod_revision, false);
                    return Ok(Written {
                        object: with_rv(obj, kv.mod_revision),
                        warnings,
                        json: served_json(&kv.value, kv.mod_revision),
                    });
                }
                Err(e) => {
                    if let Some(r) = &reserved {
                        self.release(r).await;
                    }
                    let retry =
                        matches!(e, StoreError::AlreadyExists { .. }) && attempt + 1 < attempts;
                    if !retry {
                        return Err(store_err(res, meta::name(&obj), e));
                    }
                }
            }
        }
        unreachable!("the loop returns on its last attempt")
    }

    /// PUT: replaces an object (or writes a subresource).
    pub async fn update(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        if matches!(
            view,
            View::Main | View::Status | View::Finalize | View::Approval
        ) {
            self.check_type_and_namespace(res, namespace, &mut body)?;
        }
        let body_name = meta::name(&body);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        // A status write's body is the whole object too: what its status holds unknown is
        // dropped the same way.
        let warnings = if matches!(view, View::Main | View::Status) {
            self.check_unknown_fields(res, &mut body, opts)?
        } else {
            vec![]
        };
        let before = self.pod_security_before_update(res, name);
        let mut written = self
            .guaranteed_update(res, namespace, name, view, opts, true, |_cur| {
                Ok(Cow::Borrowed(&body))
            })
            .await?;
        written.warnings.splice(0..0, warnings);
        if view == View::Main {
            let ps = self.pod_security_after_update(res, namespace, &written.object, before);
            written.warnings.extend(ps);
        }
        Ok(written)
    }

    /// PATCH: applies a patch to the current object (or subresource view) and writes it.
    pub async fn patch(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        patch: &crate::patch::Patch,
        opts: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let mut warnings = Vec::new();
        let before = self.pod_security_before_update(res, name);
        let written = self
            .guaranteed_update(res, namespace, name, view, opts, true, |cur| {
                let mut patched = patch.apply(cur)?;
                // The Scale view is another type, of which only spec.replicas is taken.
                if view != View::Scale {
                    crate::typemeta::check_patched(res, patch, &mut patched)?;
                } else if !patched.is_object() {
                    return Err(ApiError::bad_request(
                        "the patched object is not a JSON object",
                    ));
                }
                if matches!(view, View::Main | View::Status) {
                    warnings = self.check_unknown_fields(res, &mut patched, opts)?;
                }
                Ok(Cow::Owned(patched))
            })
            .await?;
        warnings.extend(written.warnings);
        if view == View::Main {
            let ps = self.pod_security_after_update(res, namespace, &written.object, before);
            warnings.extend(ps);
        }
        Ok(Written {
            object: written.object,
            warnings,
            json: written.json,
        })
    }

    /// Server-side apply (`application/apply-patch+yaml`) of `config` by `opts.field_manager`
    /// through the main resource or `/status`; creates the object when it does not exist.
    /// Returns the write and whether it created the object.
    #[allow(clippy::too_many_arguments)]
    pub async fn apply(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        mut config: Value,
        force: bool,
        opts: &WriteOptions,
    ) -> Result<(Written, bool), ApiError> {
        let request =
            self.apply_request(res, namespace, name, view, &mut config, force, opts, false)?;
        // A create that races with another create of the same name is retried as an update.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let now = setpoint_api::time::now_rfc3339();
            let before = self.pod_security_before_update(res, name);
            let updated = self
                .guaranteed_update(res, namespace, name, view, opts, false, |cur| {
                    request.apply_to(res, cur, &now).map(Cow::Owned)
                })
                .await;
            match updated {
                Ok(mut w) => {
                    if view == View::Main {
                        let ps = self.pod_security_after_update(res, namespace, &w.object, before);
                        w.warnings.extend(ps);
                    }
                    return Ok((w, false));
                }
                Err(e) if e.code == 404 && view == View::Main && attempts < 3 => {
                    let obj = request.new_object(res, &now);
                    match self.create_tracked(res, namespace, obj, opts, false).await {
                        Ok(w) => return Ok((w, true)),
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The apply of `config` by `opts`' manager through `view`, once the configuration is
    /// checked ([`ApiServer::check_apply_config`]); `versioned` as in
    /// [`crate::apply::Apply::versioned`].
    #[allow(clippy::too_many_arguments)]
    fn apply_request<'a>(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        config: &'a mut Value,
        force: bool,
        opts: &'a WriteOptions,
        versioned: bool,
    ) -> Result<crate::apply::Apply<'a>, ApiError> {
        self.check_apply_config(res, namespace, name, view, config)?;
        Ok(crate::apply::Apply {
            manager: manager(opts),
            config,
            subresource: crate::apply::subresource(view),
            force,
            versioned,
        })
    }

    /// What an apply configuration must be before it is merged: for the main resource or
    /// `/status`, of the resource's type and namespace, named as the URL is (a configuration
    /// without a name takes the URL's), with only fields the schema declares.
    fn check_apply_config(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        config: &mut Value,
    ) -> Result<(), ApiError> {
        if !matches!(view, View::Main | View::Status) {
            return Err(ApiError::method_not_allowed());
        }
        self.check_type_and_namespace(res, namespace, config)?;
        match meta::name(config) {
            "" => meta::set_meta(config, "name", json!(name)),
            n if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )))
            }
            _ => {}
        }
        self.check_apply_fields(res, namespace, name, config)
    }

    /// Server-side apply through `res`, a version of a custom resource other than the one
    /// `sres` stores it in, or any version of one with a conversion webhook. The
    /// configuration is merged into the object as `res` shows it (converted by the CRD's
    /// webhook when it has one) and the applier's `Apply` entry records `res`'s version, as
    /// upstream records the version a manager used; entries of managers that wrote in
    /// another version are judged in theirs ([`crate::apply::Apply::settle_version`]), on
    /// the object before and after converted to it. The result is converted back and
    /// written if the object has not changed since it was read, else all again, as
    /// upstream's update loop does. Returns the write and whether it created the object.
    #[allow(clippy::too_many_arguments)]
    pub async fn apply_converted(
        &self,
        res: &ResourceDef,
        sres: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        mut config: Value,
        force: bool,
        opts: &WriteOptions,
    ) -> Result<(Written, bool), ApiError> {
        let request =
            self.apply_request(res, namespace, name, view, &mut config, force, opts, true)?;
        // A resourceVersion in the configuration is the client's precondition; without one
        // the write is conditional on the version the configuration was merged into.
        let precondition = !meta::resource_version(request.config).is_empty();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = setpoint_api::time::now_rfc3339();
            let cur = match self.get_object(sres, namespace, name).await {
                Ok(cur) => cur,
                Err(e) if e.code == 404 && view == View::Main && attempt < CONVERTED_ATTEMPTS => {
                    let obj = request.new_object(res, &now);
                    let obj = self.custom_to_storage(res, obj).await?;
                    match self.create_tracked(sres, namespace, obj, opts, false).await {
                        Ok(w) => return Ok((w, true)),
                        Err(e) if e.reason == "AlreadyExists" => continue,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            let rv = meta::resource_version(&cur).to_string();
            let shown = self.custom_from_storage(res, vec![cur.clone()]).await?;
            let shown = shown.into_iter().next().unwrap_or(Value::Null);
            let mut merged = request.apply_to(res, &shown, &now)?;
            for version in request.other_versions(res, &merged) {
                // A version no longer served cannot be shown: its entries stay as they are.
                let Some(def) = self
                    .registry()
                    .get(&res.group, version_of(&version), &res.plural)
                    .cloned()
                else {
                    continue;
                };
                let both = self
                    .custom_from_storage(&def, vec![cur.clone(), merged.clone()])
                    .await?;
                if let [live, applied] = both.as_slice() {
                    request.settle_version(res, &mut merged, &version, live, applied)?;
                }
            }
            if !precondition {
                meta::set_meta(&mut merged, "resourceVersion", Value::String(rv));
            }
            let stored = self.custom_to_storage(res, merged).await?;
            let written = self
                .guaranteed_update(sres, namespace, name, view, opts, false, |_| {
                    Ok(Cow::Borrowed(&stored))
                })
                .await;
            match written {
                Err(e) if e.code == 409 && !precondition && attempt < CONVERTED_ATTEMPTS => {}
                result => return result.map(|w| (w, false)),
            }
        }
    }

    /// Records the `Update` by `opts`' manager, through `subresource`, that turns `old`
    /// (`None` for a create) into `new`, both stored objects of `res`. A custom resource's is
    /// recorded as upstream records it: in the version the client wrote through, with the
    /// fields of the object as that version shows it, and the managers that wrote in other
    /// versions lose what the write changed as their versions show it (converted by the CRD's
    /// webhook when it has one). Nothing is converted when every entry is in the version
    /// written through and that is the stored one. A conversion that fails here leaves the
    /// entries it concerns to the stored version's paths (the write itself is not failed for
    /// its bookkeeping, as upstream's field manager does not fail it).
    async fn record_write(
        &self,
        res: &ResourceDef,
        old: Option<&Value>,
        new: &mut Value,
        opts: &WriteOptions,
        subresource: Option<&str>,
        now: &str,
    ) {
        let manager = manager(opts);
        let requested = opts
            .requested
            .as_deref()
            .filter(|r| r.custom.is_some() && r.group == res.group && r.plural == res.plural)
            .unwrap_or(res);
        let version = requested.api_version();
        let others = old
            .map(|o| crate::apply::versions_besides(o, &version))
            .unwrap_or_default();
        if res.custom.is_none() || (!requested.is_converted() && others.is_empty()) {
            crate::apply::record_update(res, old, new, manager, subresource, now);
            return;
        }
        let mut objects = vec![new.clone()];
        objects.extend(old.cloned());
        let shown = match self.custom_from_storage(requested, objects).await {
            Ok(shown) => shown,
            Err(e) => {
                tracing::warn!(error = %e.message, "managedFields recorded in the stored version");
                crate::apply::record_update(res, old, new, manager, subresource, now);
                return;
            }
        };
        let mut shown = shown.into_iter();
        let (Some(mut new_shown), old_shown) = (shown.next(), shown.next()) else {
            return;
        };
        crate::apply::record_update_in_version(
            requested,
            old_shown.as_ref(),
            &mut new_shown,
            manager,
            subresource,
            now,
        );
        match new_shown.pointer("/metadata/managedFields") {
            Some(m) => meta::set_meta(new, "managedFields", m.clone()),
            None => meta::remove_meta(new, "managedFields"),
        }
        let Some(old) = old else {
            return;
        };
        let registry = self.registry();
        for version in others {
            // A version no longer served cannot be shown: its entries stay as they are.
            let Some(def) = registry
                .get(&res.group, version_of(&version), &res.plural)
                .cloned()
            else {
                continue;
            };
            match self
                .custom_from_storage(&def, vec![old.clone(), new.clone()])
                .await
            {
                Ok(both) => {
                    if let [live, updated] = both.as_slice() {
                        crate::apply::settle_update(
                            &def,
                            new,
                            &version,
                            live,
                            updated,
                            subresource,
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e.message, %version, "managedFields of another version kept");
                }
            }
        }
    }

    /// The read-modify-write loop shared by PUT, PATCH and apply. `mutate` gets the current view
    /// (the object, or its Scale) and returns the desired view (borrowed when it is a request
    /// body, which a retry needs again: only what is kept of it is copied). With `track`, the
    /// write is recorded as an `Update` in `managedFields`; without, the desired object's
    /// `managedFields` (set by apply) are kept.
    #[allow(clippy::too_many_arguments)]
    async fn guaranteed_update<'b>(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        view: View,
        opts: &WriteOptions,
        track: bool,
        mut mutate: impl FnMut(&Value) -> Result<Cow<'b, Value>, ApiError>,
    ) -> Result<Written, ApiError> {
        let gr = res.group_resource();
        loop {
            let (cur, kv) = self.read(res, namespace, name).await?;
            let cur_rv = kv.mod_revision.to_string();
            let desired = if view == View::Scale {
                mutate(&strategy::scale_of(res, &cur))?
            } else {
                mutate(&cur)?
            };
            let desired_rv = meta::resource_version(&desired);
            if !desired_rv.is_empty() && desired_rv != cur_rv {
                return Err(ApiError::stale(&gr, name));
            }
            let desired_uid = meta::uid(&desired);
            if !desired_uid.is_empty() && desired_uid != meta::uid(&cur) {
                return Err(ApiError::conflict(
                    &gr,
                    name,
                    &format!("Precondition failed: UID in precondition: {desired_uid}, UID in object meta: {}", meta::uid(&cur)),
                ));
            }
            let desired_managed = if track {
                None
            } else {
                desired.pointer("/metadata/managedFields").cloned()
            };
            let mut new = match view {
                View::Main => {
                    let mut new = desired.into_owned();
                    check_name(res, &mut new, name, namespace)?;
                    strategy::prepare_for_update(res, &mut new, &cur);
                    setpoint_kinds::defaults::apply(&res.group, &res.kind, &mut new);
                    crate::allocation::carry_over(res, &mut new, &cur);
                    new
                }
                // Tracked writes record ownership from `cur`'s entries.
                View::Status => {
                    let mut new = strategy::apply_status(&cur, &desired, !track);
                    let now = setpoint_api::time::now_rfc3339();
                    crate::certificates::status_update(res, &mut new, &cur, &now);
                    new
                }
                View::Approval => crate::certificates::apply_approval(
                    &cur,
                    &desired,
                    &setpoint_api::time::now_rfc3339(),
                ),
                View::Finalize => strategy::apply_finalize(&cur, &desired),
                View::Scale => strategy::apply_scale(res, &cur, &desired)?,
            };
            if matches!(view, View::Main | View::Status) {
                crate::crd::admit(res, &mut new);
            }
            let now = setpoint_api::time::now_rfc3339();
            let sub = crate::apply::subresource(view);
            if track {
                self.record_write(res, Some(&cur), &mut new, opts, sub, &now)
                    .await;
            } else if let Some(mf) = desired_managed {
                meta::set_meta(&mut new, "managedFields", mf);
            }
            crate::apply::keep_times_if_unchanged(&cur, &mut new);
            crate::typemeta::own(res, &mut new);
            meta::set_meta(&mut new, "resourceVersion", json!(cur_rv));
            let hooked = matches!(view, View::Main | View::Status);
            let hook_options = crate::webhook::options(
                "UpdateOptions",
                opts.dry_run,
                opts.field_manager.as_deref(),
            );
            let call = crate::webhook::Call {
                res: opts.requested.as_deref().unwrap_or(res),
                subresource: if view == View::Status { "status" } else { "" },
                operation: "UPDATE",
                namespace,
                name,
                old: Some(&cur),
                dry_run: opts.dry_run,
                user: opts.user.as_deref(),
                options: &hook_options,
            };
            let mut hook_warnings = if hooked {
                self.mutating_webhooks(&call, Some(&mut new)).await?
            } else {
                vec![]
            };
            self.validate_update(res, &mut new, Some(&cur), view == View::Status)?;
            if matches!(view, View::Approval | View::Status) {
                let approving = view == View::Approval;
                self.check_csr_write(res, approving, &new, &cur, opts.user.as_ref())?;
            }
            if view == View::Main {
                self.check_escalation(res, namespace, &new, opts)?;
                self.pod_security_on_update(res, namespace, &new, &cur)?;
            }
            if matches!(view, View::Main | View::Status) {
                crate::admission::noderestriction::admit(
                    res,
                    namespace,
                    &new,
                    Some(&cur),
                    view == View::Status,
                    opts.user.as_deref(),
                )?;
                hook_warnings.extend(self.validating_webhooks(&call, Some(&new)).await?);
            }
            let respond = |obj: Value| {
                if view == View::Scale {
                    strategy::scale_of(res, &obj)
                } else {
                    obj
                }
            };
            if same_ignoring_rv(&new, &cur) {
                // A no-op write changes nothing: no new revision, no watch event.
                return Ok(Written {
                    object: respond(cur),
                    warnings: std::mem::take(&mut hook_warnings),
                    json: None,
                });
            }
            if opts.dry_run {
                return Ok(Written {
                    object: respond(new),
                    warnings: std::mem::take(&mut hook_warnings),
                    json: None,
                });
            }
            let key = res.key(namespace, name);
            if strategy::ready_to_remove(&new) {
                match self.cas_delete(res, &key, name, kv.mod_revision).await {
                    Ok(Some(rev)) => {
                        self.release_held(res, &new).await;
                        return Ok(Written {
                            object: respond(with_rv(new, rev)),
                            warnings: std::mem::take(&mut hook_warnings),
                            json: None,
                        });
                    }
                    Ok(None) => continue,
                    Err(e) if e.code == 404 => continue,
                    Err(e) => return Err(e),
                }
            }
            let reserved = if view == View::Main {
                self.allocate_for_update(res, &mut new, &cur).await?
            } else {
                None
            };
            // On a race, read again and re-apply (a client-named resourceVersion will then
            // mismatch and give 409).
            let put = match self.cas_put(res, &key, &new, kv.mod_revision).await {
                Ok(put) => put,
                Err(e) => {
                    if let Some(r) = &reserved {
                        self.release(r).await;
                    }
                    return Err(e);
                }
            };
            if put.is_none() {
                if let Some(r) = &reserved {
                    self.release(r).await;
                }
            }
            if let Some(put) = put {
                if view == View::Main {
                    self.release_unused(res, &cur, &new).await;
                }
                let rev = put.mod_revision;
                return Ok(Written {
                    object: respond(with_rv(new, rev)),
                    warnings: std::mem::take(&mut hook_warnings),
                    // The scale view is not the stored object.
                    json: (view != View::Scale)
                        .then(|| served_json(&put.value, rev))
                        .flatten(),
                });
            }
        }
    }

    /// DELETE of one object, honouring preconditions, finalizers, propagation policy and
    /// (for pods on a node) the grace period.
    pub async fn delete(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let gr = res.group_resource();
        loop {
            let (cur, kv) = self.read(res, namespace, name).await?;
            strategy::check_delete(res, name)?;
            crate::admission::noderestriction::admit_delete(res, &cur, opts.user.as_deref())?;
            if let Some(uid) = &opts.precondition_uid {
                if uid != meta::uid(&cur) {
                    return Err(ApiError::conflict(
                        &gr,
                        name,
                        &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", meta::uid(&cur)),
                    ));
                }
            }
            if let Some(rv) = &opts.precondition_resource_version {
                if *rv != kv.mod_revision.to_string() {
                    return Err(ApiError::conflict(
                        &gr,
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            kv.mod_revision
                        ),
                    ));
                }
            }
            let hook_options = crate::webhook::options("DeleteOptions", opts.dry_run, None);
            let call = crate::webhook::Call {
                res: opts.requested.as_deref().unwrap_or(res),
                subresource: "",
                operation: "DELETE",
                namespace,
                name,
                old: Some(&cur),
                dry_run: opts.dry_run,
                user: opts.user.as_deref(),
                options: &hook_options,
            };
            self.mutating_webhooks(&call, None).await?;
            self.validating_webhooks(&call, None).await?;
            let mut new = cur.clone();
            let mut finalizers: Vec<String> = meta::finalizers(&cur)
                .iter()
                .map(|s| s.to_string())
                .collect();
            match opts.propagation_policy.as_deref() {
                Some("Foreground") if !finalizers.iter().any(|f| f == "foregroundDeletion") => {
                    finalizers.push("foregroundDeletion".into())
                }
                Some("Orphan") if !finalizers.iter().any(|f| f == "orphan") => {
                    finalizers.push("orphan".into())
                }
                Some("Foreground") | Some("Orphan") | Some("Background") | None => {}
                Some(other) => {
                    return Err(ApiError::invalid(
                        "meta.k8s.io",
                        "DeleteOptions",
                        "",
                        vec![Cause::not_supported(
                            "propagationPolicy",
                            &json!(other),
                            &["Foreground", "Background", "Orphan"],
                        )],
                    ))
                }
            }
            let grace = strategy::grace_period(res, &cur, opts.grace_period_seconds);
            let pending =
                !finalizers.is_empty() || grace > 0 || strategy::awaits_finalization(res, &cur);
            if pending {
                let already = meta::deletion_timestamp(&cur).is_some();
                let cur_grace = meta::metadata(&cur)
                    .and_then(|m| m.get("deletionGracePeriodSeconds"))
                    .and_then(Value::as_i64);
                let now = chrono::Utc::now();
                if !already || cur_grace.is_some_and(|g| grace < g) {
                    let ts = now + chrono::Duration::seconds(grace);
                    meta::set_meta(
                        &mut new,
                        "deletionTimestamp",
                        json!(setpoint_api::time::format_time(ts)),
                    );
                    meta::set_meta(&mut new, "deletionGracePeriodSeconds", json!(grace));
                    if res.generation && !already {
                        let g = meta::generation(&cur) + 1;
                        meta::set_meta(&mut new, "generation", json!(g));
                    }
                }
                meta::set_meta(&mut new, "finalizers", json!(finalizers));
                if finalizers.is_empty() {
                    meta::remove_meta(&mut new, "finalizers");
                }
                strategy::mark_terminating(res, &mut new);
                if !strategy::ready_to_remove(&new) {
                    if same_ignoring_rv(&new, &cur) || opts.dry_run {
                        return Ok(Deleted {
                            object: new,
                            removed: false,
                        });
                    }
                    let key = res.key(namespace, name);
                    match self.cas_put(res, &key, &new, kv.mod_revision).await? {
                        Some(put) => {
                            return Ok(Deleted {
                                object: with_rv(new, put.mod_revision),
                                removed: false,
                            })
                        }
                        None => continue,
                    }
                }
            }
            if opts.dry_run {
                return Ok(Deleted {
                    object: cur,
                    removed: true,
                });
            }
            let key = res.key(namespace, name);
            if let Some(rev) = self.cas_delete(res, &key, name, kv.mod_revision).await? {
                self.release_held(res, &cur).await;
                return Ok(Deleted {
                    object: with_rv(cur, rev),
                    removed: true,
                });
            }
        }
    }

    /// Lists objects from the store at a revision, starting after a key, collecting up to
    /// `limit` objects that pass `filter`. Returns the objects, the revision, and the last key
    /// looked at when more remain.
    pub async fn list_from_store(
        &self,
        res: &ResourceDef,
        prefix: &str,
        start_after: Option<String>,
        revision: Option<Revision>,
        limit: usize,
        filter: &crate::watchcache::Filter,
    ) -> Result<(Vec<Value>, Revision, Option<String>, Option<usize>), ApiError> {
        let kind = crate::watchcache::stored_kind(&res.storage_prefix());
        let mut out = Vec::new();
        let mut after = start_after;
        let mut rev = revision;
        let mut remaining = None;
        loop {
            let want = limit.saturating_sub(out.len()).max(1);
            let resp = self
                .timed(
                    "list",
                    self.store.range(RangeRequest {
                        prefix: prefix.into(),
                        start_after: after.clone(),
                        revision: rev,
                        limit: Some(want),
                    }),
                )
                .await
                .map_err(|e| store_err(res, "", e))?;
            rev = Some(resp.revision);
            for kv in &resp.kvs {
                if let Some(obj) = decode_object(&kv.value, kv.mod_revision) {
                    if filter.matches(&crate::watchcache::Attrs::of(&obj, kind)) {
                        out.push(obj);
                    }
                }
                after = Some(kv.key.to_string());
            }
            if !resp.more {
                return Ok((out, resp.revision, None, None));
            }
            if out.len() >= limit {
                if filter.predicate.is_none() {
                    remaining = Some(resp.count - resp.kvs.len());
                }
                return Ok((out, resp.revision, after, remaining));
            }
        }
    }
}

/// The `n`th address of 10.96.0.0/12.
/// How long a consistent read waits for the watch cache to catch up before giving up.
pub const CACHE_WAIT: Duration = Duration::from_secs(3);

impl ApiServer {
    /// `pods/<name>/binding`: assigns a pod to a node exactly once (409 if it is already
    /// bound or being deleted) and marks it scheduled.
    pub async fn bind(
        &self,
        res: &ResourceDef,
        namespace: &str,
        name: &str,
        node: &str,
        opts: &WriteOptions,
    ) -> Result<(), ApiError> {
        let gr = res.group_resource();
        loop {
            let (pod, kv) = self.read(res, namespace, name).await?;
            let bound = pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !bound.is_empty() {
                return Err(ApiError::conflict(
                    &gr,
                    name,
                    &format!("pod {name} is already assigned to node \"{bound}\""),
                ));
            }
            if meta::deletion_timestamp(&pod).is_some() {
                return Err(ApiError::conflict(
                    &gr,
                    name,
                    &format!("pod {name} is being deleted, cannot be assigned to a host"),
                ));
            }
            let mut new = pod.clone();
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("nodeName".into(), json!(node));
            }
            let now = setpoint_api::time::now_rfc3339();
            if let Some(obj) = new.as_object_mut() {
                let status = obj.entry("status").or_insert_with(|| json!({}));
                if let Some(status) = status.as_object_mut() {
                    let conds = status.entry("conditions").or_insert_with(|| json!([]));
                    if let Some(list) = conds.as_array_mut() {
                        list.retain(|c| {
                            c.get("type").and_then(Value::as_str) != Some("PodScheduled")
                        });
                        list.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
                    }
                }
            }
            if opts.dry_run {
                return Ok(());
            }
            let key = res.key(namespace, name);
            if self
                .cas_put(res, &key, &new, kv.mod_revision)
                .await?
                .is_some()
            {
                return Ok(());
            }
        }
    }
}
