//! The client: typed ([`Api<K>`] over k8s-openapi types and user types) and dynamic
//! ([`Api<DynamicObject>`] with an [`ApiResource`]) access to any Kubernetes-compatible API
//! server, over HTTPS from a kubeconfig or in-process through any `tower::Service`.
//!
//! Requests carry a `User-Agent` in client-go's form, named for the program unless
//! [`Client::with_user_agent`] names it; the server records writes that name no field manager
//! under that name.
//!
//! ```no_run
//! # async fn demo() -> Result<(), setpoint_runtime::client::ClientError> {
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use setpoint_runtime::client::{Api, Client, PostParams};
//! let client = Client::try_default()?;
//! let cms: Api<ConfigMap> = Api::namespaced(client, "default");
//! let mut cm = ConfigMap::default();
//! cm.metadata.name = Some("settings".into());
//! cms.create(&PostParams::default(), &cm).await?;
//! # Ok(()) }
//! ```

mod api;
mod kubeconfig;
mod params;
mod ratelimit;
mod resource;
mod skip_managed;
mod transport;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use setpoint_api::ApiError;

pub use api::{Api, DynamicObject, ObjectList};
pub use kubeconfig::{Kubeconfig, SERVICE_ACCOUNT_DIR};
pub use params::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
pub use ratelimit::TokenBucket;
pub use resource::ApiResource;
pub use transport::{Body, BoxError, HttpsTransport, ServiceTransport, Transport};

/// The media type requests accept unless they ask for another form.
pub(crate) const JSON: &str = "application/json";

/// A request as the [`Client`] sends it.
pub(crate) struct Outgoing<'a> {
    pub(crate) method: http::Method,
    pub(crate) path: &'a str,
    /// The `Accept` header.
    pub(crate) accept: &'a str,
    pub(crate) content_type: Option<&'a str>,
    pub(crate) body: Bytes,
    /// Request extensions, which only an in-process server sees.
    pub(crate) extensions: http::Extensions,
}

impl<'a> Outgoing<'a> {
    /// A request without extensions.
    pub(crate) fn new(
        method: http::Method,
        path: &'a str,
        accept: &'a str,
        content_type: Option<&'a str>,
        body: Bytes,
    ) -> Self {
        Outgoing {
            method,
            path,
            accept,
            content_type,
            body,
            extensions: http::Extensions::new(),
        }
    }

    /// A GET of `path` accepting `accept`.
    pub(crate) fn get(path: &'a str, accept: &'a str) -> Self {
        Outgoing::new(http::Method::GET, path, accept, None, Bytes::new())
    }
}

/// What can go wrong talking to the API.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with a `Status` error.
    #[error("{0}")]
    Api(ApiError),
    /// The request did not get an answer (connection, TLS, protocol).
    #[error("transport: {0}")]
    Transport(String),
    /// The answer could not be decoded.
    #[error("decoding the response: {0}")]
    Decode(String),
    /// The client is misconfigured (kubeconfig, certificates).
    #[error("configuration: {0}")]
    Config(String),
    /// The request was refused before it was sent, so it certainly had no effect: a write
    /// from work fenced by a leadership term that has ended
    /// ([`Leadership::fence`](crate::leader::Leadership::fence)).
    #[error("not sent: {0}")]
    NotSent(String),
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Api(e) => Some(e.code),
            _ => None,
        }
    }
    /// 404 Not Found: the object (or resource) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }
    /// 409 Conflict (stale resourceVersion) — not AlreadyExists.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Api(e) if e.code == 409 && e.reason == "Conflict")
    }
    /// 409 AlreadyExists: a create named an object that exists.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ClientError::Api(e) if e.code == 409 && e.reason == "AlreadyExists")
    }
    /// 410 Gone / Expired: relist.
    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }
    /// Whether a write that failed this way may still have been applied by the server: the
    /// request may have gone out and no answer came back (connection lost, timed out), or
    /// the server answered 504, which says it may still finish the request. A write refused
    /// before sending (no connection could be made, or [`ClientError::NotSent`]), or
    /// answered with any other error, did not happen.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            // hyper's connection errors read `Error(Connect, ..)`: nothing was sent.
            ClientError::Transport(text) => !text.contains("Error(Connect,"),
            ClientError::Api(e) => e.code == 504,
            _ => false,
        }
    }
}

/// Converts a `Status` JSON object into an [`ApiError`].
pub fn api_error_from_status(status: &Value, http_code: u16) -> ApiError {
    let code = status
        .get("code")
        .and_then(Value::as_u64)
        .map(|c| c as u16)
        .unwrap_or(http_code);
    let reason = status
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let message = status
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut e = ApiError::new(code, &reason, message);
    if let Some(d) = status.get("details") {
        let causes = d
            .get("causes")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        setpoint_api::Cause::new(
                            c.get("reason").and_then(Value::as_str).unwrap_or(""),
                            c.get("field").and_then(Value::as_str).unwrap_or(""),
                            c.get("message").and_then(Value::as_str).unwrap_or(""),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        e.details = Some(Box::new(setpoint_api::status::Details {
            name: d.get("name").and_then(Value::as_str).unwrap_or("").into(),
            group: d.get("group").and_then(Value::as_str).unwrap_or("").into(),
            kind: d.get("kind").and_then(Value::as_str).unwrap_or("").into(),
            uid: d.get("uid").and_then(Value::as_str).unwrap_or("").into(),
            causes,
            retry_after_seconds: d
                .get("retryAfterSeconds")
                .and_then(Value::as_u64)
                .map(|r| r as u32),
        }));
    }
    e
}

/// An object of a LIST page or a watch event that did not decode as the requested type:
/// which object it is (read leniently from its `metadata`) and why. Informers skip such an
/// object instead of failing the whole LIST or watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Undecodable {
    pub namespace: Option<String>,
    pub name: String,
    pub resource_version: Option<String>,
    pub error: String,
}

impl Undecodable {
    /// Who `object` is, as far as its metadata says, and `error`.
    pub(crate) fn of(object: &Value, error: impl std::fmt::Display) -> Self {
        let text = |field: &str| {
            object
                .get("metadata")
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(String::from)
        };
        Undecodable {
            namespace: text("namespace"),
            name: text("name").unwrap_or_default(),
            resource_version: text("resourceVersion"),
            error: error.to_string(),
        }
    }
}

/// One event from a watch stream, untyped.
#[derive(Clone, Debug, PartialEq)]
pub enum WatchEvent<T> {
    /// The object was created, or is part of the initial state the watch started from.
    Added(T),
    /// The object changed; this is its new state.
    Modified(T),
    /// The object was deleted; this is its last state.
    Deleted(T),
    /// Progress: everything up to this resourceVersion has been delivered.
    Bookmark {
        /// The bookmark's `metadata.resourceVersion`.
        resource_version: String,
        /// The `k8s.io/initial-events-end` annotation: the initial events of a `sendInitialEvents`
        /// watch have all been sent.
        initial_events_end: bool,
    },
    /// The server ended the watch with an error (410 means: relist).
    Error(ApiError),
}

/// A handle to an API server; cheap to clone.
#[derive(Clone)]
pub struct Client {
    transport: Arc<dyn Transport>,
    limiter: Option<Arc<TokenBucket>>,
    metrics: Option<Arc<crate::metrics::ClientMetrics>>,
    default_namespace: String,
    user_agent: http::HeaderValue,
}

/// client-go's default `User-Agent`: `<program>/<version> (<os>/<arch>) …`. The server takes
/// the part before the first `/` as the field manager of writes that name none, so an
/// operator's writes are recorded under its program's name, as a Go controller's are.
fn default_user_agent() -> http::HeaderValue {
    static UA: std::sync::OnceLock<http::HeaderValue> = std::sync::OnceLock::new();
    UA.get_or_init(|| {
        let program = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default();
        user_agent_for(&program)
    })
    .clone()
}

/// `<program>/<version> (<os>/<arch>) setpoint-runtime`, with the program name cut to what a
/// header and a field manager can carry (`unknown` if nothing is left).
fn user_agent_for(program: &str) -> http::HeaderValue {
    let program: String = program
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '/')
        .take(64)
        .collect();
    let program = if program.is_empty() {
        "unknown"
    } else {
        &program
    };
    let ua = format!(
        "{program}/v{} ({}/{}) setpoint-runtime",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    http::HeaderValue::from_str(&ua).unwrap_or_else(|_| http::HeaderValue::from_static("unknown"))
}

impl Client {
    /// A client over any transport, without rate limiting.
    pub fn new(transport: impl Transport) -> Self {
        Client {
            transport: Arc::new(transport),
            limiter: None,
            metrics: None,
            default_namespace: "default".into(),
            user_agent: default_user_agent(),
        }
    }

    /// A client for the server in a kubeconfig. Rate limited by default like client-go
    /// (50 qps, burst 100) so that a runaway controller cannot flood a shared server.
    pub fn from_kubeconfig(kc: &Kubeconfig) -> Result<Self, ClientError> {
        let mut c = Client::new(HttpsTransport::from_kubeconfig(kc)?).with_rate_limit(50.0, 100);
        if let Some(ns) = &kc.namespace {
            c.default_namespace = ns.clone();
        }
        Ok(c)
    }

    /// A client from `$KUBECONFIG` or `~/.kube/config`, else, in a pod, from the in-cluster
    /// configuration: the API server of `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`,
    /// the pod's service-account token (re-read every minute, as the node refreshes it) and
    /// CA, and the pod's namespace as the default namespace ([`Kubeconfig::infer`]).
    pub fn try_default() -> Result<Self, ClientError> {
        Client::from_kubeconfig(&Kubeconfig::infer()?)
    }

    /// Limits requests to `qps` per second with bursts of `burst` (watch requests count once).
    pub fn with_rate_limit(mut self, qps: f64, burst: u32) -> Self {
        self.limiter = Some(Arc::new(TokenBucket::new(qps, burst)));
        self
    }

    /// Removes any client-side rate limit.
    pub fn without_rate_limit(mut self) -> Self {
        self.limiter = None;
        self
    }

    /// Sends `<name>/<version> (<os>/<arch>) setpoint-runtime` as the `User-Agent` instead of
    /// the program's file name; the server records writes that name no field manager under
    /// `name` (as `kube-controller-manager` is recorded for Kubernetes' controllers).
    pub fn with_user_agent(mut self, name: &str) -> Self {
        self.user_agent = user_agent_for(name);
        self
    }

    /// Records request latency into these metrics.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::ClientMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The namespace of the kubeconfig's context (`default` otherwise).
    pub fn default_namespace(&self) -> &str {
        &self.default_namespace
    }

    /// Sends a request and returns the raw response (status checked by the caller).
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<http::Response<Body>, ClientError> {
        self.send_outgoing(Outgoing::new(method, path, JSON, content_type, body))
            .await
    }

    /// Whether requests reach an API server in this process as they are, extensions
    /// included ([`Transport::in_process`]).
    pub fn in_process(&self) -> bool {
        self.transport.in_process()
    }

    /// Sends `req` and returns the raw response (status checked by the caller).
    async fn send_outgoing(&self, req: Outgoing<'_>) -> Result<http::Response<Body>, ClientError> {
        let Outgoing {
            method,
            path,
            accept,
            content_type,
            body,
            extensions,
        } = req;
        if let Some(l) = &self.limiter {
            l.acquire().await;
        }
        let mut b = http::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::ACCEPT, accept)
            .header(http::header::USER_AGENT, self.user_agent.clone());
        if let Some(ct) = content_type {
            b = b.header(http::header::CONTENT_TYPE, ct);
        }
        // A write made during a reconcile names its decision, so the API server's write
        // trail links it to the reconcile that made it.
        if method != http::Method::GET && method != http::Method::HEAD {
            if let Some((id, controller)) = crate::decision::current_headers() {
                b = b
                    .header(crate::decision::DECISION_ID_HEADER, id)
                    .header(crate::decision::CONTROLLER_HEADER, controller);
            }
        }
        let mut req = b
            .body(body)
            .map_err(|e| ClientError::Config(format!("request: {e}")))?;
        *req.extensions_mut() = extensions;
        // Checked last, after the rate limiter's wait: a leader's write must not leave once
        // its term may be over in the other replicas' eyes.
        if method != http::Method::GET && method != http::Method::HEAD {
            if let Some(why) = crate::leader::fenced_out() {
                return Err(ClientError::NotSent(why));
            }
        }
        let start = Instant::now();
        let resp = self.transport.send(req).await;
        if let Some(m) = &self.metrics {
            let code = resp
                .as_ref()
                .map(|r| r.status().as_u16().to_string())
                .unwrap_or_else(|_| "<error>".into());
            m.observe(method.as_str(), &code, start.elapsed());
        }
        resp
    }

    /// Sends a request and decodes a JSON answer; non-2xx answers become [`ClientError::Api`].
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Value, ClientError> {
        let bytes = self
            .request_bytes(Outgoing::new(method, path, JSON, content_type, body))
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Sends a request and returns the body of a successful answer undecoded, so that typed
    /// callers decode it once, straight into their type; an error answer becomes
    /// [`ClientError::Api`].
    pub(crate) async fn request_bytes(&self, req: Outgoing<'_>) -> Result<Bytes, ClientError> {
        let resp = self.send_outgoing(req).await?;
        let status = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ClientError::Transport(e.to_string()))?
            .to_bytes();
        if status >= 400 {
            let error = match serde_json::from_slice::<Value>(&bytes) {
                Ok(v) => api_error_from_status(&v, status),
                Err(_) => ApiError::new(status, "", String::from_utf8_lossy(&bytes).into_owned()),
            };
            return Err(ClientError::Api(error));
        }
        Ok(bytes)
    }

    /// Opens a watch (`path` must carry `watch=true`) and yields its events.
    pub async fn watch_raw(
        &self,
        path: &str,
    ) -> Result<
        impl Stream<Item = Result<WatchEvent<Value>, ClientError>> + Send + 'static,
        ClientError,
    > {
        self.watch_typed(path, JSON, false).await
    }

    /// Opens a watch and decodes each event's object straight into `K` (no intermediate
    /// JSON tree: informers decode every event, so this is on their hot path). With
    /// `skip_managed_fields`, objects come without `metadata.managedFields`.
    pub(crate) async fn watch_typed<K: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        accept: &str,
        skip_managed_fields: bool,
    ) -> Result<impl Stream<Item = Result<WatchEvent<K>, ClientError>> + Send + 'static, ClientError>
    {
        self.watch_parsed(path, accept, skip_managed_fields, parse_event::<K>)
            .await
    }

    /// Like [`Client::watch_typed`], but an event whose object does not decode as `K` is
    /// yielded as its [`Undecodable`] rather than ending the stream with an error, so one bad
    /// object does not stop a watcher from seeing the others.
    pub(crate) async fn watch_lenient<K: DeserializeOwned + Send + 'static>(
        &self,
        path: &str,
        accept: &str,
        skip_managed_fields: bool,
    ) -> Result<
        impl Stream<Item = Result<WatchEvent<Result<K, Undecodable>>, ClientError>> + Send + 'static,
        ClientError,
    > {
        self.watch_parsed(path, accept, skip_managed_fields, parse_event_lenient::<K>)
            .await
    }

    /// Opens a watch and turns each line into an item with `parse`.
    async fn watch_parsed<T: Send + 'static>(
        &self,
        path: &str,
        accept: &str,
        skip_managed_fields: bool,
        parse: fn(&[u8], bool) -> Result<WatchEvent<T>, ClientError>,
    ) -> Result<impl Stream<Item = Result<WatchEvent<T>, ClientError>> + Send + 'static, ClientError>
    {
        let resp = self.send_outgoing(Outgoing::get(path, accept)).await?;
        let status = resp.status().as_u16();
        if status >= 400 {
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| ClientError::Transport(e.to_string()))?
                .to_bytes();
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            return Err(ClientError::Api(api_error_from_status(&v, status)));
        }
        let body = resp.into_body();
        let lines = futures::stream::unfold(
            (body, Lines::default(), false),
            move |(mut body, mut buf, done)| async move {
                loop {
                    if let Some(line) = buf.next_line() {
                        if line.iter().all(u8::is_ascii_whitespace) {
                            continue;
                        }
                        return Some((parse(&line, skip_managed_fields), (body, buf, done)));
                    }
                    if done {
                        let rest = buf.rest()?;
                        return Some((parse(&rest, skip_managed_fields), (body, buf, true)));
                    }
                    match body.frame().await {
                        Some(Ok(f)) => {
                            if let Ok(d) = f.into_data() {
                                buf.push(d);
                                // Bound the buffer: a single event line is at most a few MiB.
                                if buf.pending() > 16 * 1024 * 1024 {
                                    return Some((
                                        Err(ClientError::Decode(
                                            "watch event larger than 16 MiB".into(),
                                        )),
                                        (body, Lines::default(), true),
                                    ));
                                }
                            }
                        }
                        Some(Err(e)) => {
                            return Some((
                                Err(ClientError::Transport(e.to_string())),
                                (body, Lines::default(), true),
                            ))
                        }
                        None => {
                            let rest = buf.rest()?;
                            return Some((parse(&rest, skip_managed_fields), (body, buf, true)));
                        }
                    }
                }
            },
        );
        Ok(lines.boxed())
    }
}

/// Splits a watch body into its lines as chunks arrive, however the chunks fall: a chunk may
/// hold many events (the server joins the ready ones) or part of one. A line within one chunk
/// is a slice of it, not a copy; only a line that spans chunks is put together.
#[derive(Default)]
struct Lines {
    /// The unread part of the last chunk.
    chunk: Bytes,
    /// The start of a line that continues in the next chunk (holds no newline).
    partial: bytes::BytesMut,
}

impl Lines {
    /// Takes the next chunk; call once [`Lines::next_line`] has no more lines.
    fn push(&mut self, chunk: Bytes) {
        debug_assert!(self.chunk.is_empty());
        self.chunk = chunk;
    }

    /// Bytes held that are not yet a whole line.
    fn pending(&self) -> usize {
        self.partial.len() + self.chunk.len()
    }

    /// The next whole line, newline included.
    fn next_line(&mut self) -> Option<Bytes> {
        match self.chunk.iter().position(|b| *b == b'\n') {
            Some(at) => {
                let head = self.chunk.split_to(at + 1);
                if self.partial.is_empty() {
                    return Some(head);
                }
                self.partial.extend_from_slice(&head);
                Some(self.partial.split().freeze())
            }
            None => {
                self.partial.extend_from_slice(&self.chunk);
                self.chunk = Bytes::new();
                None
            }
        }
    }

    /// What is left once the body ended, if it is more than whitespace.
    fn rest(&mut self) -> Option<Bytes> {
        self.partial.extend_from_slice(&self.chunk);
        self.chunk = Bytes::new();
        let rest = self.partial.split().freeze();
        (!rest.iter().all(u8::is_ascii_whitespace)).then_some(rest)
    }
}

fn parse_event<K: DeserializeOwned>(
    line: &[u8],
    skip_managed_fields: bool,
) -> Result<WatchEvent<K>, ClientError> {
    let strict = |o: Result<K, Undecodable>| {
        o.map_err(|u| ClientError::Decode(format!("watch event: {}", u.error)))
    };
    Ok(match parse_event_lenient::<K>(line, skip_managed_fields)? {
        WatchEvent::Added(o) => WatchEvent::Added(strict(o)?),
        WatchEvent::Modified(o) => WatchEvent::Modified(strict(o)?),
        WatchEvent::Deleted(o) => WatchEvent::Deleted(strict(o)?),
        WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        } => WatchEvent::Bookmark {
            resource_version,
            initial_events_end,
        },
        WatchEvent::Error(e) => WatchEvent::Error(e),
    })
}

/// Parses one watch line. A line that is not a watch event is an error; an event whose object
/// does not decode as `K` carries that object's [`Undecodable`] instead.
fn parse_event_lenient<K: DeserializeOwned>(
    line: &[u8],
    skip_managed_fields: bool,
) -> Result<WatchEvent<Result<K, Undecodable>>, ClientError> {
    /// One watch line, with the object left as raw JSON until its type is known.
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow)]
        object: Option<&'a serde_json::value::RawValue>,
    }
    let line: Line<'_> = serde_json::from_slice(line)
        .map_err(|e| ClientError::Decode(format!("watch event: {e}")))?;
    let raw = line.object.map(|o| o.get()).unwrap_or("null");
    let untyped = || serde_json::from_str::<Value>(raw).unwrap_or(Value::Null);
    let typed = || {
        if skip_managed_fields {
            skip_managed::from_str::<K>(raw)
        } else {
            serde_json::from_str::<K>(raw)
        }
        // Only a failure pays for reading the object a second time, to say which it is.
        .map_err(|e| Undecodable::of(&untyped(), e))
    };
    match line.kind.as_deref() {
        Some("ADDED") => Ok(WatchEvent::Added(typed())),
        Some("MODIFIED") => Ok(WatchEvent::Modified(typed())),
        Some("DELETED") => Ok(WatchEvent::Deleted(typed())),
        Some("BOOKMARK") => {
            let obj = untyped();
            Ok(WatchEvent::Bookmark {
                resource_version: obj
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                initial_events_end: obj
                    .pointer("/metadata/annotations/k8s.io~1initial-events-end")
                    .and_then(Value::as_str)
                    == Some("true"),
            })
        }
        Some("ERROR") => Ok(WatchEvent::Error(api_error_from_status(&untyped(), 500))),
        other => Err(ClientError::Decode(format!(
            "unknown watch event type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn lines_come_out_whole_however_the_chunks_fall() {
        let body = b"{\"a\":1}\n\n{\"b\":22}\n  \n{\"c\":333}\n{\"tail\":4}".to_vec();
        let want: Vec<&[u8]> = vec![
            b"{\"a\":1}\n",
            b"\n",
            b"{\"b\":22}\n",
            b"  \n",
            b"{\"c\":333}\n",
        ];
        for size in 1..=body.len() {
            let mut lines = Lines::default();
            let mut got = Vec::new();
            for chunk in body.chunks(size) {
                lines.push(Bytes::copy_from_slice(chunk));
                while let Some(l) = lines.next_line() {
                    got.push(l.to_vec());
                }
            }
            assert_eq!(got, want, "chunks of {size}");
            assert_eq!(
                lines.rest().as_deref(),
                Some(&b"{\"tail\":4}"[..]),
                "chunks of {size}"
            );
            assert!(lines.rest().is_none());
        }
        let mut blank = Lines::default();
        blank.push(Bytes::from_static(b"\n  "));
        assert!(blank.next_line().is_some());
        assert!(blank.rest().is_none(), "whitespace is no event");
    }

    #[test]
    fn watch_lines_decode_straight_into_the_type() {
        let line = br#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a\"b","resourceVersion":"7"},"spec":{"containers":[]}}}"#;
        match parse_event::<Pod>(line, false).unwrap() {
            WatchEvent::Added(p) => assert_eq!(p.metadata.name.as_deref(), Some("a\"b")),
            other => panic!("{other:?}"),
        }
        let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        match parse_event::<Pod>(bookmark, false).unwrap() {
            WatchEvent::Bookmark {
                resource_version,
                initial_events_end,
            } => assert_eq!(
                (resource_version.as_str(), initial_events_end),
                ("12", true)
            ),
            other => panic!("{other:?}"),
        }
        let error = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}}"#;
        match parse_event::<Pod>(error, false).unwrap() {
            WatchEvent::Error(e) => assert_eq!(e.code, 410),
            other => panic!("{other:?}"),
        }
        // An object that is not a Pod, an unknown type and a broken line are errors, not panics.
        assert!(parse_event::<Pod>(br#"{"type":"ADDED","object":{"metadata":7}}"#, false).is_err());
        assert!(parse_event::<Pod>(br#"{"type":"RENAMED","object":{}}"#, false).is_err());
        assert!(parse_event::<Pod>(br#"{"type":"ADDED","obj"#, false).is_err());
    }
}
