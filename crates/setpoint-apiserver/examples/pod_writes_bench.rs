//! CPU cost of the writes that bring one pod to Running, inside the API server.
//!
//! Run with
//!
//! ```text
//! cargo run --release -p setpoint-apiserver --example pod_writes_bench -- [pods] [rounds]
//! ```
//!
//! A density run spends most of the server's CPU in four writes per pod, each sent as the
//! built-in components send it: the ReplicaSet controller's create (`POST pods`, with
//! `generateName`, labels and an owner reference, the template already defaulted), the
//! scheduler's `POST pods/binding`, the node agent's `PUT pods/status` (the cached pod with a
//! Running status) and an Event (`POST events`, as the event recorder writes them). This bench
//! sends `pods` (default 5,000) of each, phase by phase, to an API server on the in-memory store
//! through its router (no sockets, no TLS), on a one-thread runtime that also runs the watch
//! cache, so what it reports is the whole server-side cost of a write: decoding, defaulting,
//! validation, field ownership, the store and the watch cache.
//!
//! For each phase it prints the CPU time per write of the whole process (user + system), the
//! median of `rounds` (default 5) rounds, each on a fresh server. Nothing else should run on
//! the machine; compare builds by alternating runs. Run it with `MIMALLOC_PURGE_DELAY=1000`,
//! the setting `setpoint` starts with, for figures comparable to the server's.

// CPU time comes from `getrusage`, a system call.
#![allow(unsafe_code)]

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use setpoint_apiserver::{ApiServer, ServerConfig};
use tower::ServiceExt;

/// The allocator the `setpoint` binary uses: allocation is a large part of a write's cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const NAMESPACE: &str = "bench";
const OWNER_UID: &str = "e179bccd-628b-475f-b791-0b14d7d4bae0";

/// CPU seconds (user + system) this process has used so far.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc_rusage::Rusage = unsafe { std::mem::zeroed() };
    unsafe { libc_rusage::getrusage(0, &mut usage) };
    let tv = |t: libc_rusage::Timeval| t.sec as f64 + t.usec as f64 / 1e6;
    tv(usage.utime) + tv(usage.stime)
}

/// The two fields of `struct rusage` this bench reads, without a libc dependency.
mod libc_rusage {
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Timeval {
        pub sec: i64,
        pub usec: i64,
    }
    #[repr(C)]
    pub struct Rusage {
        pub utime: Timeval,
        pub stime: Timeval,
        pub rest: [i64; 14],
    }
    extern "C" {
        pub fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    }
}

/// The pod the ReplicaSet controller posts: its defaulted template, a generated name.
fn pod_create() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "bench-0-6ccf7fb478-",
            "namespace": NAMESPACE,
            "labels": {"app": "bench-0", "pod-template-hash": "6ccf7fb478", "setpoint-bench-run": "e48039"},
            "ownerReferences": [{"apiVersion": "apps/v1", "blockOwnerDeletion": true, "controller": true,
                "kind": "ReplicaSet", "name": "bench-0-6ccf7fb478", "uid": OWNER_UID}]
        },
        "spec": {
            "containers": [{"image": "nginx:1.25", "imagePullPolicy": "IfNotPresent", "name": "app",
                "resources": {}, "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File"}],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
            "securityContext": {}, "terminationGracePeriodSeconds": 30
        }
    })
}

fn binding(pod: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod, "namespace": NAMESPACE},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    })
}

/// The node agent's status write: the pod as its cache holds it (no `managedFields`), with a
/// Running status.
fn running(mut pod: Value) -> Value {
    pod["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("managedFields");
    let t = pod["metadata"]["creationTimestamp"].clone();
    let cond = |ty: &str| json!({"lastTransitionTime": t, "status": "True", "type": ty});
    pod["status"] = json!({
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"),
            cond("ContainersReady"), cond("PodScheduled")],
        "containerStatuses": [{"containerID": "simulated://10.64.0.2/app/0", "image": "nginx:1.25",
            "imageID": "simulated://nginx:1.25", "name": "app", "ready": true, "restartCount": 0,
            "started": true, "state": {"running": {"startedAt": t}}}],
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "message": "containers are simulated by setpoint: no processes run",
        "phase": "Running", "podIP": "10.64.0.2", "podIPs": [{"ip": "10.64.0.2"}],
        "qosClass": "BestEffort", "startTime": t
    });
    pod
}

fn event(pod: &Value, i: usize) -> Value {
    let m = &pod["metadata"];
    let name = m["name"].as_str().expect("name");
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{i:016x}"), "namespace": NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": NAMESPACE,
            "resourceVersion": m["resourceVersion"], "uid": m["uid"]},
        "type": "Normal", "reason": "Started", "message": "Started container app",
        "source": {"component": "kubelet"}, "reportingComponent": "kubelet",
        "reportingInstance": "bench-node-0", "count": 1,
        "firstTimestamp": "2026-11-22T22:20:47Z", "lastTimestamp": "2026-11-22T22:20:47Z",
        "eventTime": "2026-11-22T22:20:47.174302Z"
    })
}

/// Sends one request; returns the response body. Bodies are serialized before the timed
/// loops and responses parsed after them, so that only the server's work is timed.
async fn send(router: &axum::Router, method: Method, path: &str, body: Bytes) -> Bytes {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("router");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(
        status == StatusCode::OK || status == StatusCode::CREATED,
        "{path}: {status} {}",
        String::from_utf8_lossy(&bytes)
    );
    bytes
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).expect("json"))
}

fn parse(b: &Bytes) -> Value {
    serde_json::from_slice(b).expect("response JSON")
}

/// One round on a fresh server: CPU seconds per phase.
async fn round(pods: usize) -> [f64; 4] {
    let server = ApiServer::new(
        ServerConfig::default(),
        ApiServer::open_store(&ServerConfig::default())
            .await
            .expect("store"),
    )
    .await
    .expect("server");
    let router = setpoint_apiserver::http::router(Arc::clone(&server));
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    send(
        &router,
        Method::POST,
        "/api/v1/namespaces",
        to_bytes(&namespace),
    )
    .await;
    let base = format!("/api/v1/namespaces/{NAMESPACE}");

    let create = to_bytes(&pod_create());
    let path = format!("{base}/pods");
    let mut responses = Vec::with_capacity(pods);
    let start = cpu_seconds();
    for _ in 0..pods {
        responses.push(send(&router, Method::POST, &path, create.clone()).await);
    }
    let t_create = cpu_seconds() - start;
    let names: Vec<String> = responses
        .drain(..)
        .map(|b| {
            parse(&b)["metadata"]["name"]
                .as_str()
                .expect("name")
                .to_string()
        })
        .collect();

    let bindings: Vec<(String, Bytes)> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let body = binding(name, &format!("node-{}", i % 100));
            (format!("{base}/pods/{name}/binding"), to_bytes(&body))
        })
        .collect();
    let start = cpu_seconds();
    for (path, body) in bindings {
        send(&router, Method::POST, &path, body).await;
    }
    let t_bind = cpu_seconds() - start;

    let mut statuses = Vec::with_capacity(pods);
    let mut events = Vec::with_capacity(pods);
    for (i, name) in names.iter().enumerate() {
        let path = format!("{base}/pods/{name}");
        let bound = parse(&send(&router, Method::GET, &path, Bytes::new()).await);
        events.push(to_bytes(&event(&bound, i)));
        statuses.push((format!("{path}/status"), to_bytes(&running(bound))));
    }
    let start = cpu_seconds();
    for (path, body) in statuses {
        send(&router, Method::PUT, &path, body).await;
    }
    let t_status = cpu_seconds() - start;

    let path = format!("{base}/events");
    let start = cpu_seconds();
    for e in events {
        send(&router, Method::POST, &path, e).await;
    }
    let t_event = cpu_seconds() - start;
    server.stop().await;
    [t_create, t_bind, t_status, t_event]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pods: usize = args.next().map_or(5000, |a| a.parse().expect("pods"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("rounds"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results: Vec<[f64; 4]> = Vec::new();
    for r in 0..rounds {
        let res = rt.block_on(round(pods));
        eprintln!(
            "round {}: {:?} µs/write",
            r + 1,
            res.map(|s| (s / pods as f64 * 1e6).round())
        );
        results.push(res);
    }
    println!("CPU per write, median of {rounds} rounds of {pods} pods:");
    let names = [
        "POST pods (create)",
        "POST pods/binding",
        "PUT pods/status",
        "POST events",
    ];
    for (i, name) in names.iter().enumerate() {
        let mut v: Vec<f64> = results.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        println!(
            "  {name:<20} {:>7.1} µs",
            v[v.len() / 2] / pods as f64 * 1e6
        );
    }
}
