//! `metrics.k8s.io/v1beta1`, the resource metrics API, served as metrics-server serves it:
//! every node's agent is scraped on an interval (the resolution, metrics-server's
//! `--metric-resolution`, 15 s by default: [`crate::ServerConfig::metric_resolution`]) for
//! its Summary API (`/stats/summary?node=<name>`), CPU is the rate between the two latest
//! cumulative samples of a series (the `window` is their distance, the `timestamp` the later
//! one), memory the latest working set, and the latest figures are kept in memory and served
//! as `NodeMetrics` and `PodMetrics` (get, and list with label and field selectors, in a
//! namespace or all of them).
//!
//! Memory is bounded by what runs: each scrape replaces a node's figures whole, nodes no
//! longer in the API are dropped at the next scrape, and a pod is served only while the API
//! still has it (its labels come from there, as metrics-server's do). A pod appears once
//! every container has two samples, so a new pod shows no figures for one resolution, as
//! with metrics-server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use futures::StreamExt;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use rustls::pki_types::ServerName;
use serde::Deserialize;
use serde_json::{json, Value};
use setpoint_api::resource::GroupResource;
use setpoint_api::selector::{FieldSelector, LabelSelector};
use setpoint_api::ApiError;

use crate::request::{PathTarget, Query};
use crate::response::value_response;
use crate::state::ApiServer;
use crate::watchcache::{Attrs, Filter};

/// The API group.
pub const GROUP: &str = "metrics.k8s.io";
/// Its one version.
pub const VERSION: &str = "v1beta1";
/// metrics-server's default `--metric-resolution`.
pub const DEFAULT_RESOLUTION: Duration = Duration::from_secs(15);
/// How long one agent may take to answer (metrics-server's `--kubelet-request-timeout`).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest Summary document read from an agent.
const MAX_SUMMARY_BYTES: usize = 256 * 1024 * 1024;
/// Agents scraped at once.
const SCRAPE_CONCURRENCY: usize = 32;

const NODES: &str = "/registry/core/nodes/";
const PODS: &str = "/registry/core/pods/";

/// The resources of the group: (plural, kind, namespaced).
pub const RESOURCES: &[(&str, &str, bool)] = &[
    ("nodes", "NodeMetrics", false),
    ("pods", "PodMetrics", true),
];

/// The subset of the kubelet's Summary that metrics are computed from.
#[derive(Debug, Deserialize)]
pub struct Summary {
    /// The node's own figures.
    pub node: NodeSummary,
    /// Its pods'.
    #[serde(default)]
    pub pods: Vec<PodSummary>,
}

/// `Summary.node`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    /// The node's name.
    pub node_name: String,
    /// Cumulative CPU.
    pub cpu: Option<CpuSummary>,
    /// Memory.
    pub memory: Option<MemorySummary>,
}

/// `Summary.pods[]`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSummary {
    /// Which pod.
    pub pod_ref: PodRef,
    /// Its containers.
    #[serde(default)]
    pub containers: Vec<ContainerSummary>,
}

/// `podRef`.
#[derive(Debug, Deserialize)]
pub struct PodRef {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

/// `containers[]`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSummary {
    /// Its name.
    pub name: String,
    /// When its current run started (a new start is a new series).
    #[serde(default)]
    pub start_time: String,
    /// Cumulative CPU.
    pub cpu: Option<CpuSummary>,
    /// Memory.
    pub memory: Option<MemorySummary>,
}

/// `cpu`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuSummary {
    /// When it was sampled.
    pub time: String,
    /// Core-nanoseconds since the start.
    pub usage_core_nano_seconds: Option<u64>,
}

/// `memory`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemorySummary {
    /// The working set.
    pub working_set_bytes: Option<u64>,
}

/// A cumulative CPU sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    /// Unix nanoseconds.
    at: i128,
    core_ns: u64,
}

/// Usage over a window, what the API serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Point {
    /// The later sample's time, Unix nanoseconds.
    pub timestamp: i128,
    /// The distance between the two samples.
    pub window: Duration,
    /// CPU in nanocores.
    pub cpu_nanocores: u64,
    /// Memory working set in bytes.
    pub memory_bytes: u64,
}

/// One container's latest figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPoint {
    /// The container's name.
    pub name: String,
    /// Its usage.
    pub point: Point,
}

/// A node's state between scrapes: the latest samples of each series and what they give.
#[derive(Debug, Default)]
pub struct NodeState {
    node_sample: Option<Sample>,
    /// (namespace, pod, container, start time) → the latest sample.
    container_samples: HashMap<(String, String, String, String), Sample>,
    /// The node's figures, once it has two samples.
    pub node: Option<Point>,
    /// (namespace, pod) → its containers' figures, for pods all of whose containers have two
    /// samples.
    pub pods: HashMap<(String, String), Vec<ContainerPoint>>,
}

fn unix_nanos(t: &str) -> Option<i128> {
    let t = chrono::DateTime::parse_from_rfc3339(t).ok()?;
    Some(t.timestamp_nanos_opt()? as i128)
}

/// The rate between two samples, if the later one is later and not lower (a counter that fell
/// restarted: it starts a new series).
fn rate(prev: Option<Sample>, now: Sample, memory: u64) -> Option<Point> {
    let prev = prev?;
    let dt = now.at - prev.at;
    if dt <= 0 || now.core_ns < prev.core_ns {
        return None;
    }
    Some(Point {
        timestamp: now.at,
        window: Duration::from_nanos(dt as u64),
        cpu_nanocores: ((now.core_ns - prev.core_ns) as i128 * 1_000_000_000 / dt) as u64,
        memory_bytes: memory,
    })
}

/// A node's next state from its previous one and a new Summary: the pure half of a scrape.
pub fn ingest(prev: Option<&NodeState>, summary: &Summary) -> NodeState {
    let mut next = NodeState::default();
    let node_sample = summary.node.cpu.as_ref().and_then(|c| {
        Some(Sample {
            at: unix_nanos(&c.time)?,
            core_ns: c.usage_core_nano_seconds?,
        })
    });
    if let Some(s) = node_sample {
        let memory = summary
            .node
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes)
            .unwrap_or(0);
        // A repeated sample (the agent answered from the same instant) keeps the older one.
        let keep = prev
            .and_then(|p| p.node_sample)
            .filter(|p| p.at == s.at)
            .is_some();
        next.node = rate(prev.and_then(|p| p.node_sample), s, memory)
            .or_else(|| prev.and_then(|p| p.node.clone()).filter(|_| keep));
        next.node_sample = if keep {
            prev.and_then(|p| p.node_sample)
        } else {
            Some(s)
        };
    }
    for pod in &summary.pods {
        let mut points = Vec::with_capacity(pod.containers.len());
        let mut complete = !pod.containers.is_empty();
        for c in &pod.containers {
            let key = (
                pod.pod_ref.namespace.clone(),
                pod.pod_ref.name.clone(),
                c.name.clone(),
                c.start_time.clone(),
            );
            let sample = c.cpu.as_ref().and_then(|cpu| {
                Some(Sample {
                    at: unix_nanos(&cpu.time)?,
                    core_ns: cpu.usage_core_nano_seconds?,
                })
            });
            let Some(sample) = sample else {
                complete = false;
                continue;
            };
            let memory = c
                .memory
                .as_ref()
                .and_then(|m| m.working_set_bytes)
                .unwrap_or(0);
            let before = prev.and_then(|p| p.container_samples.get(&key).copied());
            match rate(before, sample, memory) {
                Some(point) => points.push(ContainerPoint {
                    name: c.name.clone(),
                    point,
                }),
                None => complete = false,
            }
            let kept = before.filter(|b| b.at == sample.at).unwrap_or(sample);
            next.container_samples.insert(key, kept);
        }
        if complete {
            next.pods.insert(
                (pod.pod_ref.namespace.clone(), pod.pod_ref.name.clone()),
                points,
            );
        } else if let Some(old) = prev.and_then(|p| {
            p.pods
                .get(&(pod.pod_ref.namespace.clone(), pod.pod_ref.name.clone()))
        }) {
            // The same instant sampled again: what was served stays served.
            if pod.containers.iter().all(|c| {
                c.cpu
                    .as_ref()
                    .and_then(|cpu| unix_nanos(&cpu.time))
                    .is_some_and(|t| old.iter().all(|o| o.point.timestamp == t))
            }) {
                next.pods.insert(
                    (pod.pod_ref.namespace.clone(), pod.pod_ref.name.clone()),
                    old.clone(),
                );
            }
        }
    }
    next
}

/// The latest figures of every node, in memory.
#[derive(Default)]
pub struct ResourceMetrics {
    nodes: parking_lot::RwLock<HashMap<String, Arc<NodeState>>>,
}

impl ResourceMetrics {
    /// Records a node's new Summary.
    pub fn record(&self, node: &str, summary: &Summary) {
        let prev = self.nodes.read().get(node).cloned();
        let next = Arc::new(ingest(prev.as_deref(), summary));
        self.nodes.write().insert(node.to_string(), next);
    }

    /// Keeps only the nodes `keep` names.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.nodes.write().retain(|n, _| keep(n));
    }

    fn node(&self, name: &str) -> Option<Arc<NodeState>> {
        self.nodes.read().get(name).cloned()
    }
}

/// Scrapes every node's agent each `resolution` until the server stops.
pub(crate) async fn scrape_loop(server: Arc<ApiServer>) {
    let mut stopping = server.stopping_signal();
    let resolution = server.config.metric_resolution;
    let mut tick = tokio::time::interval(resolution);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopping.changed() => return,
        }
        if server.is_stopping() {
            return;
        }
        scrape_all(&server).await;
    }
}

/// One round: every node the API has, at most [`SCRAPE_CONCURRENCY`] at once.
#[tracing::instrument(skip_all)]
pub(crate) async fn scrape_all(server: &Arc<ApiServer>) {
    let Some(tls) = server.agent_tls.read().clone() else {
        return;
    };
    let (nodes, _) = server.caches.get(NODES).list(NODES, &Filter::all());
    let nodes: Vec<Value> = nodes.iter().map(|n| n.object()).collect();
    let names: std::collections::HashSet<String> = nodes
        .iter()
        .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str))
        .map(String::from)
        .collect();
    server.resource_metrics.retain(|n| names.contains(n));
    futures::stream::iter(nodes)
        .for_each_concurrent(SCRAPE_CONCURRENCY, |node| {
            let tls = tls.clone();
            async move {
                let name = node
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                match tokio::time::timeout(SCRAPE_TIMEOUT, fetch_summary(tls, &node, &name)).await
                {
                    Ok(Ok(summary)) => server.resource_metrics.record(&name, &summary),
                    Ok(Err(e)) => {
                        tracing::debug!(node = %name, error = %e, "scraping the node's resource usage")
                    }
                    Err(_) => tracing::debug!(node = %name, "scraping the node timed out"),
                }
            }
        })
        .await;
}

/// GETs the node's Summary from its agent.
async fn fetch_summary(
    tls: Arc<rustls::ClientConfig>,
    node: &Value,
    name: &str,
) -> Result<Summary, String> {
    let (host, port) = crate::podlogs::agent_address(node).map_err(|e| e.message)?;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = format!(
        "/stats/summary?{}",
        form_urlencoded::Serializer::new(String::new())
            .append_pair("node", name)
            .finish()
    );
    let req = http::Request::get(&path)
        .header(http::header::HOST, format!("{host}:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = http_body_util::Limited::new(resp.into_body(), MAX_SUMMARY_BYTES)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(format!(
            "{status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(1024)])
        ));
    }
    let summary: Summary = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    // An agent serving several nodes answers for the one asked; anything else is not this
    // node's figures.
    if summary.node.node_name != name {
        return Err(format!(
            "the agent answered for node {:?}",
            summary.node.node_name
        ));
    }
    Ok(summary)
}

/// A Go `time.Duration` as `String()` prints it (`15.002s`, `1m0.5s`, `500ms`).
pub fn go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let trim = |whole: u128, frac: u128, digits: usize| {
        let f = format!("{frac:0digits$}");
        let f = f.trim_end_matches('0');
        if f.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{f}")
        }
    };
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", trim(ns / 1_000, ns % 1_000, 3));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", trim(ns / 1_000_000, ns % 1_000_000, 6));
    }
    let secs = ns / 1_000_000_000;
    let s = trim(secs % 60, ns % 1_000_000_000, 9);
    let (h, m) = (secs / 3600, secs / 60 % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, m) => format!("{m}m{s}s"),
        (h, m) => format!("{h}h{m}m{s}s"),
    }
}

/// Memory as metrics-server prints it (a binary-SI quantity: `64Mi`, else plain bytes).
fn memory_quantity(bytes: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    let mut v = bytes;
    let mut i = 0;
    let suffixes = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    while v % 1024 == 0 && i < suffixes.len() - 1 {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", suffixes[i])
}

/// CPU as a canonical decimal quantity from nanocores (`140m`, `1234567n`).
fn cpu_quantity(nanocores: u64) -> String {
    setpoint_api::quantity::canonical_quantity(&format!("{nanocores}n"))
}

fn rfc3339(unix_nanos: i128) -> String {
    let secs = unix_nanos.div_euclid(1_000_000_000) as i64;
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn usage(p: &Point) -> Value {
    json!({"cpu": cpu_quantity(p.cpu_nanocores), "memory": memory_quantity(p.memory_bytes)})
}

fn metadata(obj: &Value, now: &str) -> Value {
    let mut m = json!({"name": obj.pointer("/metadata/name"), "creationTimestamp": now});
    if let Some(ns) = obj.pointer("/metadata/namespace") {
        m["namespace"] = ns.clone();
    }
    if let Some(l) = obj.pointer("/metadata/labels") {
        m["labels"] = l.clone();
    }
    m
}

fn node_metrics(server: &ApiServer, node: &Value, now: &str) -> Option<Value> {
    let name = node.pointer("/metadata/name")?.as_str()?;
    let p = server.resource_metrics.node(name)?.node.clone()?;
    Some(json!({
        "kind": "NodeMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata(node, now),
        "timestamp": rfc3339(p.timestamp), "window": go_duration(p.window),
        "usage": usage(&p),
    }))
}

fn pod_metrics(server: &ApiServer, pod: &Value, now: &str) -> Option<Value> {
    let node = pod.pointer("/spec/nodeName")?.as_str()?;
    let ns = pod.pointer("/metadata/namespace")?.as_str()?;
    let name = pod.pointer("/metadata/name")?.as_str()?;
    let state = server.resource_metrics.node(node)?;
    let containers = state.pods.get(&(ns.to_string(), name.to_string()))?;
    let first = &containers.first()?.point;
    let items: Vec<Value> = containers
        .iter()
        .map(|c| json!({"name": c.name, "usage": usage(&c.point)}))
        .collect();
    Some(json!({
        "kind": "PodMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata(pod, now),
        "timestamp": rfc3339(first.timestamp), "window": go_duration(first.window),
        "containers": items,
    }))
}

fn selectors(q: &Query, plural: &str) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    for r in fields.requirements() {
        let ok =
            r.field == "metadata.name" || (plural == "pods" && r.field == "metadata.namespace");
        if !ok {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {}",
                r.field
            )));
        }
    }
    Ok((labels, fields))
}

fn not_found(plural: &str, name: &str) -> ApiError {
    let resource = if plural == "nodes" {
        "nodemetrics"
    } else {
        "podmetrics"
    };
    ApiError::not_found(
        &GroupResource {
            group: GROUP.into(),
            resource: resource.into(),
        },
        name,
    )
}

/// Serves a request for the group's resources, or `None` when the target is not one.
pub(crate) fn serve(
    server: &ApiServer,
    method: &Method,
    target: &PathTarget,
    q: &Query,
) -> Option<Result<Response, ApiError>> {
    let (group, version, plural, namespace, name) = match target {
        PathTarget::Collection {
            group,
            version,
            plural,
            namespace,
        } => (group, version, plural, namespace, None),
        PathTarget::Object {
            group,
            version,
            plural,
            namespace,
            name,
            subresource: None,
        } => (group, version, plural, namespace, Some(name)),
        _ => return None,
    };
    if group != GROUP {
        return None;
    }
    Some(answer(
        server,
        method,
        version,
        plural,
        namespace.as_deref(),
        name.map(String::as_str),
        q,
    ))
}

fn answer(
    server: &ApiServer,
    method: &Method,
    version: &str,
    plural: &str,
    namespace: Option<&str>,
    name: Option<&str>,
    q: &Query,
) -> Result<Response, ApiError> {
    let Some((_, kind, namespaced)) = RESOURCES.iter().find(|(p, _, _)| *p == plural) else {
        return Err(ApiError::not_found_path());
    };
    if version != VERSION || (namespace.is_some() && !namespaced) {
        return Err(ApiError::not_found_path());
    }
    if method != Method::GET {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    if crate::request::bool_param(q, "watch") {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ));
    }
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let (cache, prefix) = if plural == "nodes" {
        (NODES, NODES.to_string())
    } else {
        (
            PODS,
            namespace.map_or(PODS.to_string(), |ns| format!("{PODS}{ns}/")),
        )
    };
    let metrics_of = |obj: &Value| {
        if plural == "nodes" {
            node_metrics(server, obj, &now)
        } else {
            pod_metrics(server, obj, &now)
        }
    };
    if let Some(name) = name {
        let key = format!("{prefix}{name}");
        let obj = server
            .caches
            .get(cache)
            .get(&key)
            .map(|o| o.object())
            .ok_or_else(|| not_found(plural, name))?;
        let m = metrics_of(&obj).ok_or_else(|| not_found(plural, name))?;
        return Ok(value_response(StatusCode::OK, &m));
    }
    let (labels, fields) = selectors(q, plural)?;
    // Selected on the attributes the cache keeps parsed, so that only the objects served are
    // decoded: an autoscaler lists the few pods of its target among a namespace's thousands,
    // every sync period.
    let filter = Filter {
        namespace: None,
        name: None,
        predicate: Some(Box::new(move |a: &Attrs| {
            labels.matches(|k| a.label(k)) && fields.matches(|f| a.field(f).to_string())
        })),
    };
    let (objects, _) = server.caches.get(cache).list(&prefix, &filter);
    let items: Vec<Value> = objects
        .iter()
        .filter_map(|o| metrics_of(&o.object()))
        .collect();
    Ok(value_response(
        StatusCode::OK,
        &json!({
            "kind": format!("{kind}List"), "apiVersion": format!("{GROUP}/{VERSION}"),
            "metadata": {}, "items": items,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(t: &str, node_cpu: u64, pod_cpu: u64, start: &str) -> Summary {
        serde_json::from_value(json!({
            "node": {"nodeName": "n1", "cpu": {"time": t, "usageCoreNanoSeconds": node_cpu},
                     "memory": {"time": t, "workingSetBytes": 1u64 << 30}},
            "pods": [{"podRef": {"name": "web", "namespace": "default", "uid": "u"},
                      "containers": [{"name": "c", "startTime": start,
                                      "cpu": {"time": t, "usageCoreNanoSeconds": pod_cpu},
                                      "memory": {"time": t, "workingSetBytes": 64u64 << 20}}]}]
        }))
        .unwrap()
    }

    #[test]
    fn cpu_is_the_rate_between_two_samples_over_their_window() {
        let first = ingest(None, &summary("2026-01-01T00:00:00Z", 10, 1_000, "s1"));
        assert!(
            first.node.is_none() && first.pods.is_empty(),
            "one sample gives no rate"
        );
        let second = ingest(
            Some(&first),
            &summary(
                "2026-01-01T00:00:15Z",
                10 + 30_000_000_000,
                1_000 + 2_100_000_000,
                "s1",
            ),
        );
        let node = second.node.clone().unwrap();
        assert_eq!(node.cpu_nanocores, 2_000_000_000);
        assert_eq!(node.window, Duration::from_secs(15));
        assert_eq!(node.memory_bytes, 1 << 30);
        let pod = &second.pods[&("default".into(), "web".into())];
        assert_eq!(pod[0].point.cpu_nanocores, 140_000_000);
        assert_eq!(cpu_quantity(pod[0].point.cpu_nanocores), "140m");
        assert_eq!(memory_quantity(pod[0].point.memory_bytes), "64Mi");
        // A restarted container is a new series: no rate until it has two samples.
        let third = ingest(
            Some(&second),
            &summary("2026-01-01T00:00:30Z", 10 + 60_000_000_000, 5, "s2"),
        );
        assert!(third.pods.is_empty());
        assert_eq!(
            third.container_samples.len(),
            1,
            "the old series is dropped"
        );
        // A pod gone from the node is gone from the figures.
        let mut empty = summary("2026-01-01T00:00:45Z", 10 + 90_000_000_000, 0, "s2");
        empty.pods.clear();
        let fourth = ingest(Some(&third), &empty);
        assert!(fourth.container_samples.is_empty() && fourth.pods.is_empty());
        assert_eq!(fourth.node.unwrap().cpu_nanocores, 2_000_000_000);
    }

    #[test]
    fn the_same_instant_twice_keeps_what_was_served() {
        let a = ingest(None, &summary("2026-01-01T00:00:00Z", 0, 0, "s"));
        let b = ingest(
            Some(&a),
            &summary("2026-01-01T00:00:10Z", 10_000_000_000, 1_000_000_000, "s"),
        );
        let c = ingest(
            Some(&b),
            &summary("2026-01-01T00:00:10Z", 10_000_000_000, 1_000_000_000, "s"),
        );
        assert_eq!(c.node, b.node);
        assert_eq!(c.pods, b.pods);
    }

    #[test]
    fn go_durations_and_quantities() {
        assert_eq!(go_duration(Duration::from_secs(15)), "15s");
        assert_eq!(go_duration(Duration::from_millis(15_002)), "15.002s");
        assert_eq!(go_duration(Duration::from_millis(60_500)), "1m0.5s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(memory_quantity(1536), "1536");
        assert_eq!(memory_quantity(1 << 30), "1Gi");
        assert_eq!(cpu_quantity(1_234_567), "1234567n");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
    }
}
