//! Kubernetes audit logging: kube-apiserver's `--audit-policy-file` and `--audit-log-*`.
//!
//! Every authenticated request is matched against the [`policy`]; at a level other than
//! `None` it writes `audit.k8s.io/v1` [`event`]s at its stages (`RequestReceived`,
//! `ResponseStarted` for long-running requests, `ResponseComplete`, `Panic`) to the
//! [`sink`]. Bodies are captured only when the level needs them. When auditing is off (no
//! policy or no log path, the default) a request pays for nothing but its `Audit-Id`.
//!
//! Not audited: requests whose authentication fails (they are answered before this hook).

pub mod event;
pub mod policy;
pub mod sink;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::request::Parts;
use http::{HeaderValue, Method};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;

use crate::authentication::UserInfo;
use crate::authorization::{Attributes, Decision as AuthzDecision};
use event::{Event, ObjectRef, ResponseStatus, User};
use policy::{Level, Policy, Stage};
use sink::{Batch, Output, Rotation};

/// The response header (and request header) that carries a request's audit id.
pub const AUDIT_ID_HEADER: &str = "audit-id";

/// Response bodies larger than this are logged without `responseObject` (the event keeps its
/// status): a LIST of everything must not make one event of unbounded size.
const MAX_CAPTURED_RESPONSE: usize = 10 * 1024 * 1024;

/// The events' format (`--audit-log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// One JSON `Event` a line.
    #[default]
    Json,
}

/// How events reach the log (`--audit-log-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Written by the request before it answers (upstream's default for the log backend).
    #[default]
    Blocking,
    /// Queued (at most `--audit-log-batch-buffer-size` events) for a writer thread; a full
    /// queue drops the event and counts it in `apiserver_audit_error_total{plugin="buffered"}`.
    Batch,
}

/// The audit flags, as kube-apiserver names them.
#[derive(Clone, Debug, Default)]
pub struct AuditOptions {
    /// `--audit-policy-file`: without it nothing is audited.
    pub policy_file: Option<PathBuf>,
    /// `--audit-log-path`: the log, `-` for standard output; without it nothing is audited.
    pub log_path: Option<PathBuf>,
    /// `--audit-log-maxsize`, `--audit-log-maxbackup`, `--audit-log-maxage`.
    pub rotation: Rotation,
    /// `--audit-log-format`.
    pub format: Format,
    /// `--audit-log-mode`.
    pub mode: Mode,
    /// `--audit-log-batch-buffer-size`: the batch mode's queue.
    pub batch_buffer_size: usize,
}

/// Upstream's default `--audit-log-batch-buffer-size`.
pub const DEFAULT_BATCH_BUFFER_SIZE: usize = 10_000;

/// Why auditing could not start.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The policy file could not be read.
    #[error("reading audit policy file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The policy is not valid.
    #[error("loading audit policy file: {0}")]
    Policy(#[from] policy::PolicyError),
    /// The log could not be opened.
    #[error("opening audit log {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LevelLabel {
    level: String,
}

/// Upstream's audit metrics.
#[derive(Clone, Default)]
struct AuditMetrics {
    events: Counter,
    errors: Family<PluginLabel, Counter>,
    levels: Family<LevelLabel, Counter>,
}

impl AuditMetrics {
    fn registry(&self) -> prometheus_client::registry::Registry {
        let mut r = prometheus_client::registry::Registry::default();
        r.register(
            "apiserver_audit_event",
            "Counter of audit events generated and sent to the audit backend.",
            self.events.clone(),
        );
        r.register(
            "apiserver_audit_error",
            "Counter of audit events that failed to be audited properly. Plugin identifies the plugin affected by the error.",
            self.errors.clone(),
        );
        r.register(
            "apiserver_audit_level",
            "Counter of policy levels for audit events (1 per request).",
            self.levels.clone(),
        );
        r
    }

    fn error(&self, plugin: &str, n: u64) {
        self.errors
            .get_or_create(&PluginLabel {
                plugin: plugin.into(),
            })
            .inc_by(n);
    }
}

enum Writer {
    Blocking(parking_lot::Mutex<Output>),
    Batch(Batch),
}

/// The server's audit backend: the policy and where events go.
pub struct Auditor {
    policy: Policy,
    writer: Writer,
    metrics: AuditMetrics,
}

impl Auditor {
    /// Loads the policy and opens the log. `Ok(None)` when auditing is off: no log path, or no
    /// policy (which upstream also takes to mean "record nothing", with a warning).
    pub fn start(
        options: &AuditOptions,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Option<Arc<Auditor>>, AuditError> {
        let Some(log_path) = &options.log_path else {
            return Ok(None);
        };
        let Some(policy_file) = &options.policy_file else {
            tracing::warn!("no audit policy file provided, no events will be recorded");
            return Ok(None);
        };
        let text = std::fs::read_to_string(policy_file).map_err(|source| AuditError::Read {
            path: policy_file.clone(),
            source,
        })?;
        let (policy, unknown) = policy::parse(&text)?;
        if !unknown.is_empty() {
            tracing::warn!(
                fields = ?unknown,
                "audit policy contains unknown fields, which are ignored"
            );
        }
        let output =
            Output::open(log_path, options.rotation).map_err(|source| AuditError::Open {
                path: log_path.clone(),
                source,
            })?;
        let audit_metrics = AuditMetrics::default();
        let writer = match options.mode {
            Mode::Blocking => Writer::Blocking(parking_lot::Mutex::new(output)),
            Mode::Batch => {
                let m = audit_metrics.clone();
                let buffer = if options.batch_buffer_size == 0 {
                    DEFAULT_BATCH_BUFFER_SIZE
                } else {
                    options.batch_buffer_size
                };
                let batch =
                    Batch::start(output, buffer, move |n| m.error("log", n)).map_err(|source| {
                        AuditError::Open {
                            path: log_path.clone(),
                            source,
                        }
                    })?;
                Writer::Batch(batch)
            }
        };
        metrics.include(Arc::new(audit_metrics.registry()));
        tracing::info!(
            policy = %policy_file.display(),
            log = %log_path.display(),
            rules = policy.rules.len(),
            mode = ?options.mode,
            "audit logging on"
        );
        Ok(Some(Arc::new(Auditor {
            policy,
            writer,
            metrics: audit_metrics,
        })))
    }

    /// Starts auditing a request: `None` when the policy says `None`. `attributes` are the
    /// authenticated user's (before impersonation), as upstream evaluates the policy.
    pub fn begin(
        self: &Arc<Self>,
        attributes: &Attributes,
        parts: &Parts,
        audit_id: &str,
    ) -> Option<Recorder> {
        let decision = self.policy.evaluate(attributes);
        self.metrics
            .levels
            .get_or_create(&LevelLabel {
                level: decision.level.as_str().into(),
            })
            .inc();
        if decision.level == Level::None {
            return None;
        }
        let a = attributes;
        let object_ref = a.resource_request.then(|| ObjectRef {
            resource: a.resource.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
            api_group: a.api_group.clone(),
            api_version: a.api_version.clone(),
            subresource: a.subresource.clone(),
            ..Default::default()
        });
        let peer = parts
            .extensions
            .get::<crate::connection::PeerAddr>()
            .map(|p| p.0.ip());
        let received = setpoint_api::time::now_micro();
        let event = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: decision.level.as_str(),
            audit_id: audit_id.to_string(),
            stage: Stage::RequestReceived.as_str(),
            request_uri: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
            verb: a.verb.clone(),
            user: User::from(&*a.user),
            impersonated_user: None,
            source_ips: event::source_ips(&parts.headers, peer),
            user_agent: parts
                .headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string(),
            object_ref,
            response_status: None,
            request_object: None,
            response_object: None,
            request_received_timestamp: received.clone(),
            stage_timestamp: received,
            annotations: Default::default(),
        };
        let long_running = a.verb == "watch"
            || ["attach", "exec", "proxy", "log", "portforward"].contains(&a.subresource.as_str());
        // Bodies of these are relayed streams, not API objects.
        let streamed_body =
            ["attach", "exec", "proxy", "portforward"].contains(&a.subresource.as_str());
        let rec = Recorder {
            auditor: self.clone(),
            event,
            level: decision.level,
            omit_stages: decision.omit_stages,
            omit_managed_fields: decision.omit_managed_fields,
            long_running,
            streamed_body,
        };
        rec.emit(Stage::RequestReceived);
        Some(rec)
    }

    fn write(&self, event: &Event) {
        let mut line = match serde_json::to_vec(event) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "encoding an audit event");
                self.metrics.error("log", 1);
                return;
            }
        };
        line.push(b'\n');
        self.metrics.events.inc();
        match &self.writer {
            Writer::Blocking(output) => {
                if let Err(e) = output.lock().write_lines(&line) {
                    tracing::error!(error = %e, audit_id = %event.audit_id, "writing the audit log");
                    self.metrics.error("log", 1);
                }
            }
            Writer::Batch(batch) => {
                if !batch.push(line) {
                    tracing::warn!(audit_id = %event.audit_id, "audit buffer queue blocked: event dropped");
                    self.metrics.error("buffered", 1);
                }
            }
        }
    }
}

tokio::task_local! {
    /// The annotations admission adds to the audit event of the request being handled
    /// (upstream's `Attributes.AddAnnotation`), while [`collect_annotations`] runs it.
    static ANNOTATIONS: Arc<parking_lot::Mutex<BTreeMap<String, String>>>;
}

/// Adds an annotation to the audit event of the request being handled, as admission plugins
/// and webhooks do upstream; the first value of a key stays. Does nothing when the request
/// is not audited.
pub(crate) fn annotate(key: &str, value: &str) {
    let _ = ANNOTATIONS.try_with(|notes| {
        notes
            .lock()
            .entry(key.to_string())
            .or_insert_with(|| value.to_string());
    });
}

/// Runs `handler` collecting the annotations [`annotate`] adds while it runs.
pub async fn collect_annotations<T>(
    handler: impl std::future::Future<Output = T>,
) -> (T, BTreeMap<String, String>) {
    let notes = Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
    let out = ANNOTATIONS.scope(notes.clone(), handler).await;
    let collected = std::mem::take(&mut *notes.lock());
    (out, collected)
}

/// The id of a request: the client's `Audit-ID` header if it sent one, else a new random
/// UUID. Every response carries it, audited or not, as upstream's; its bytes come from the
/// thread's RNG rather than the OS, so a request without auditing pays no system call for it.
pub fn audit_id(headers: &http::HeaderMap) -> HeaderValue {
    match headers.get(AUDIT_ID_HEADER) {
        Some(v) if !v.is_empty() => v.clone(),
        _ => {
            let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
            let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
            let text = id.hyphenated().encode_lower(&mut text);
            HeaderValue::from_str(text).expect("a UUID is ASCII")
        }
    }
}

/// One audited request: the event so far, and what the policy chose for it.
pub struct Recorder {
    auditor: Arc<Auditor>,
    event: Event,
    level: Level,
    omit_stages: Vec<Stage>,
    omit_managed_fields: bool,
    long_running: bool,
    streamed_body: bool,
}

impl Recorder {
    fn emit(&self, stage: Stage) {
        if self.omit_stages.contains(&stage) {
            return;
        }
        let mut ev = self.event.clone();
        ev.stage = stage.as_str();
        ev.stage_timestamp = setpoint_api::time::now_micro();
        self.auditor.write(&ev);
    }

    /// Records the user the request acts as, when impersonation changed it.
    pub fn impersonated(&mut self, user: &UserInfo) {
        self.event.impersonated_user = Some(User::from(user));
    }

    /// Records the authorizers' decision as upstream's annotations.
    pub fn authorized(&mut self, decision: &AuthzDecision) {
        let (verdict, reason) = match decision {
            AuthzDecision::Allow => ("allow", ""),
            AuthzDecision::Deny(reason) => ("forbid", reason.as_str()),
            AuthzDecision::NoOpinion => ("forbid", ""),
        };
        let notes = &mut self.event.annotations;
        notes.insert("authorization.k8s.io/decision".into(), verdict.into());
        notes.insert("authorization.k8s.io/reason".into(), reason.into());
    }

    /// Records the annotations admission added (see [`annotate`]).
    pub fn admission_annotations(&mut self, notes: BTreeMap<String, String>) {
        for (key, value) in notes {
            self.event.annotations.entry(key).or_insert(value);
        }
    }

    /// Reads the request's body when the level records it, and hands back an equal body.
    pub async fn capture_request(
        &mut self,
        server: &crate::state::ApiServer,
        parts: &Parts,
        body: Body,
    ) -> Result<Body, setpoint_api::ApiError> {
        let writes = matches!(
            parts.method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if self.level < Level::Request || !writes || self.streamed_body {
            return Ok(body);
        }
        let bytes = crate::connection::read_body(
            body,
            server.config.max_body_bytes,
            server.config.connection.body_read_timeout,
        )
        .await?;
        if let Some(mut obj) = decode_body(&parts.headers, &bytes) {
            if self.omit_managed_fields {
                event::omit_managed_fields(&mut obj);
            }
            // Upstream completes the reference from the object the request carries.
            if let Some(r) = self.event.object_ref.as_mut() {
                let meta = &obj["metadata"];
                let fill = |field: &mut String, key: &str| {
                    if field.is_empty() {
                        *field = meta[key].as_str().unwrap_or("").to_string();
                    }
                };
                fill(&mut r.namespace, "namespace");
                fill(&mut r.name, "name");
                fill(&mut r.uid, "uid");
                fill(&mut r.resource_version, "resourceVersion");
            }
            self.event.request_object = Some(obj);
        }
        Ok(Body::from(bytes))
    }

    /// Writes the response's stages and hands the response back. A long-running response
    /// writes `ResponseStarted` now and `ResponseComplete` when its body ends (or is dropped).
    pub async fn finish(mut self, response: Response) -> Response {
        let code = response.status().as_u16();
        if self.long_running {
            self.event.response_status = Some(ResponseStatus::of(code, None));
            self.emit(Stage::ResponseStarted);
            let guard = CompleteOnDrop(Some(self));
            return response.map(|body| {
                Body::from_stream(body.into_data_stream().map(move |chunk| {
                    let _alive = &guard;
                    chunk
                }))
            });
        }
        let json = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        let wants_body = self.level == Level::RequestResponse
            || code >= 400
            || self.event.verb == "delete"
            || self.event.verb == "deletecollection";
        let (response, parsed) = if json && wants_body {
            let (parts, body) = response.into_parts();
            let (body, bytes) = capture(body, MAX_CAPTURED_RESPONSE).await;
            let parsed = bytes.and_then(|b| serde_json::from_slice::<Value>(&b).ok());
            (Response::from_parts(parts, body), parsed)
        } else {
            (response, None)
        };
        self.event.response_status = Some(ResponseStatus::of(code, parsed.as_ref()));
        if self.level == Level::RequestResponse {
            self.event.response_object = parsed.map(|mut v| {
                if self.omit_managed_fields {
                    event::omit_managed_fields(&mut v);
                }
                v
            });
        }
        self.emit(Stage::ResponseComplete);
        response
    }

    /// Writes the `Panic` stage of a handler that panicked.
    pub fn panicked(mut self, panic: &(dyn std::any::Any + Send)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        self.event.response_status = Some(ResponseStatus {
            code: 500,
            status: "Failure".into(),
            reason: "InternalError".into(),
            message: format!("APIServer panic'd: {what}"),
            ..Default::default()
        });
        self.emit(Stage::Panic);
    }
}

/// Writes `ResponseComplete` when a long-running response's body is finished or dropped.
struct CompleteOnDrop(Option<Recorder>);

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        if let Some(rec) = self.0.take() {
            rec.emit(Stage::ResponseComplete);
        }
    }
}

/// The request's body as an object, from JSON, YAML or Kubernetes protobuf (as kubectl sends
/// built-in kinds); a body that does not decode is not logged.
fn decode_body(headers: &http::HeaderMap, bytes: &Bytes) -> Option<Value> {
    if bytes.is_empty() {
        return None;
    }
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if content_type.contains("yaml") {
        let text = std::str::from_utf8(bytes).ok()?;
        return crate::yamlbody::decode(text).ok();
    }
    if content_type.contains("json") {
        return serde_json::from_slice(bytes).ok();
    }
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return setpoint_protobuf::decode(bytes).ok();
    }
    None
}

/// Reads a response body up to `cap` bytes: the body handed back is equal to the original;
/// the bytes are returned only when the whole body fit.
async fn capture(body: Body, cap: usize) -> (Body, Option<Bytes>) {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(c) => {
                buf.extend_from_slice(&c);
                if buf.len() > cap {
                    let head = buf.freeze();
                    let rest = futures::stream::once(async move { Ok::<_, axum::Error>(head) })
                        .chain(stream);
                    return (Body::from_stream(rest), None);
                }
            }
            Err(e) => {
                let head = buf.freeze();
                let rest = futures::stream::iter([Ok(head), Err(e)]);
                return (Body::from_stream(rest), None);
            }
        }
    }
    let bytes = buf.freeze();
    (Body::from(bytes.clone()), Some(bytes))
}
