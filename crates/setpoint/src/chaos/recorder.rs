//! The watchers whose events the invariants are checked on: two per resource, each a LIST
//! then a WATCH from the list's resourceVersion with bookmarks, resumed from the last version
//! seen when the connection drops and relisted after a 410, every event recorded with the
//! time it arrived.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use setpoint_runtime::client::{Client, WatchEvent};
use tokio::task::JoinHandle;

use super::invariants::{Facts, Kind, Observed};
use super::workload::NAMESPACE;

/// What is watched: the resource's plural and its collection path.
pub fn watched() -> Vec<(&'static str, String)> {
    let apps = format!("/apis/apps/v1/namespaces/{NAMESPACE}");
    vec![
        ("pods", format!("/api/v1/namespaces/{NAMESPACE}/pods")),
        ("replicasets", format!("{apps}/replicasets")),
        ("deployments", format!("{apps}/deployments")),
        ("statefulsets", format!("{apps}/statefulsets")),
        ("jobs", super::workload::jobs_path()),
        (
            "leases",
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases".to_string(),
        ),
    ]
}

/// Watchers per resource: the gap check compares each with the others.
pub const WATCHERS: usize = 2;

/// The running watchers and what they recorded.
pub struct Recorder {
    pub events: Arc<Mutex<Vec<Observed>>>,
    tasks: Vec<JoinHandle<()>>,
}

fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl Recorder {
    /// Starts every watcher.
    pub fn start(client: &Client, started: Instant) -> Recorder {
        let events = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (resource, path) in watched() {
            for i in 0..WATCHERS {
                let w = Watcher {
                    client: client.clone(),
                    name: format!("{resource}#{i}"),
                    resource,
                    path: path.clone(),
                    started,
                    events: events.clone(),
                };
                tasks.push(tokio::spawn(w.run()));
            }
        }
        Recorder { events, tasks }
    }

    /// Stops the watchers and returns what they saw.
    pub fn stop(self) -> Vec<Observed> {
        for t in &self.tasks {
            t.abort();
        }
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Watcher {
    client: Client,
    name: String,
    resource: &'static str,
    path: String,
    started: Instant,
    events: Arc<Mutex<Vec<Observed>>>,
}

impl Watcher {
    fn record(&self, kind: Kind, rv: u64, obj: Option<&Value>) {
        let e = Observed {
            at_ms: self.started.elapsed().as_millis() as u64,
            watcher: self.name.clone(),
            resource: self.resource.to_string(),
            kind,
            rv,
            object: obj.map(|o| Facts::of(self.resource, o)),
        };
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(e);
    }

    /// LIST, then WATCH until a 410; again, for as long as the task runs.
    async fn run(self) {
        loop {
            let list = self
                .client
                .request(http::Method::GET, &self.path, None, bytes::Bytes::new())
                .await;
            let list = match list {
                Ok(l) => l,
                Err(_) => {
                    // The server is down: try again shortly.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mut rv = rv_of(&list);
            self.record(Kind::ListStart, rv, None);
            for item in list["items"].as_array().into_iter().flatten() {
                self.record(Kind::Listed, rv_of(item), Some(item));
            }
            self.watch_from(&mut rv).await;
            self.record(Kind::Gone, rv, None);
            // A server answering every watch 410 for a while (`expire-watches`) is not
            // relisted from in a busy loop, as client-go's reflector backs off too.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Watches from `rv`, resuming after dropped connections, until the server answers 410.
    async fn watch_from(&self, rv: &mut u64) {
        loop {
            let path = format!(
                "{}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}",
                self.path
            );
            let stream = match self.client.watch_raw(&path).await {
                Ok(s) => s,
                Err(e) if e.is_gone() => return,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let (kind, obj) = match event {
                    Ok(WatchEvent::Added(o)) => (Kind::Added, o),
                    Ok(WatchEvent::Modified(o)) => (Kind::Modified, o),
                    Ok(WatchEvent::Deleted(o)) => (Kind::Deleted, o),
                    Ok(WatchEvent::Bookmark {
                        resource_version, ..
                    }) => {
                        if let Ok(b) = resource_version.parse() {
                            *rv = b;
                            self.record(Kind::Bookmark, b, None);
                        }
                        continue;
                    }
                    Ok(WatchEvent::Error(e)) if e.code == 410 => return,
                    // Another error, or the connection broke: resume from `rv`.
                    Ok(WatchEvent::Error(_)) | Err(_) => break,
                };
                let v = rv_of(&obj);
                *rv = v;
                self.record(kind, v, Some(&obj));
            }
        }
    }
}
