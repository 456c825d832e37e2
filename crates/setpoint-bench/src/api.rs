//! `bench api`: raw API throughput and latency on ConfigMaps — C workers each looping create,
//! get, list, update, patch and delete of their own objects for a duration — and watch
//! fan-out: W watchers on the same namespace, each timing every change from the moment its
//! writer sent the request to the moment the watcher received the event.
//!
//! The writer puts its send time (this process's clock, which the watchers share) in an
//! annotation, so delivery latency needs no coordination between tasks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use setpoint_runtime::client::{
    Api, Client, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use tokio::sync::watch;

use crate::density::{create_namespace, delete_namespace, run_id, Outcome, RUN_LABEL};
use crate::procstat::Sampler;
use crate::progress::{self, Progress};
use crate::record::{Mark, Record, Recorder};
use crate::report::{self, ApiReport};
use crate::timed::once;
use crate::BenchError;

/// The annotation carrying a write's send time (microseconds on the run's clock).
pub const SENT_ANNOTATION: &str = "setpoint-bench/sent-us";

/// How an api run goes.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Workers, each with one request in flight.
    pub concurrency: usize,
    /// How long the load phase lasts.
    pub duration: Duration,
    /// Bytes of payload per ConfigMap.
    pub object_size: usize,
    /// Watchers on the namespace.
    pub watchers: usize,
    /// How long to wait for deliveries and deletion at the end.
    pub timeout: Duration,
    /// Whether to show the progress line on stderr while the run goes.
    pub progress: bool,
    /// Where to also write the raw event log (JSON lines), from which the report can be
    /// recomputed; `None` writes none.
    pub raw_log: Option<PathBuf>,
    /// Which local processes to sample (besides this one).
    pub processes: crate::procstat::Scope,
    /// An existing namespace to run in, which the run neither creates nor deletes (so a user
    /// allowed only ConfigMaps in one namespace can run it); `None` runs in a namespace of
    /// its own, created for the run and deleted after it.
    pub namespace: Option<String>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            concurrency: 16,
            duration: Duration::from_secs(30),
            object_size: 1024,
            watchers: 4,
            timeout: Duration::from_secs(60),
            progress: true,
            raw_log: None,
            processes: Default::default(),
            namespace: None,
        }
    }
}

/// The namespace a run uses, and whether the run owns it (creates and deletes it): the one
/// asked for, which it does not own, else `bench-<run id>`, which it does.
pub fn run_namespace(asked: Option<&str>, run_id: &str) -> (String, bool) {
    match asked {
        Some(ns) => (ns.to_string(), false),
        None => (format!("bench-{run_id}"), true),
    }
}

fn config_map(name: &str, run: &str, payload: &str, sent_us: u64) -> ConfigMap {
    ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(RUN_LABEL.into(), run.into())])),
            annotations: Some(BTreeMap::from([(
                SENT_ANNOTATION.into(),
                sent_us.to_string(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("payload".into(), payload.into())])),
        ..Default::default()
    }
}

/// One worker: the cycle on its own objects until `end`.
async fn worker(
    w: usize,
    api: Api<ConfigMap>,
    rec: Recorder,
    run: String,
    size: usize,
    end: tokio::time::Instant,
    writes: Arc<AtomicU64>,
) {
    let payload_a = "a".repeat(size);
    let payload_b = "b".repeat(size);
    let list = ListParams::default()
        .labels(&format!("{RUN_LABEL}={run}"))
        .limit(50);
    let mut i = 0u64;
    while tokio::time::Instant::now() < end {
        let name = format!("w{w}-{i}");
        i += 1;
        let cm = config_map(&name, &run, &payload_a, rec.now_us());
        if once(
            &rec,
            "create",
            "configmaps",
            api.create(&PostParams::default(), &cm),
        )
        .await
        .is_err()
        {
            continue;
        }
        writes.fetch_add(1, Ordering::Relaxed);
        let got = once(&rec, "get", "configmaps", api.get(&name)).await;
        let _ = once(&rec, "list", "configmaps", api.list(&list)).await;
        if let Ok(mut cm) = got {
            cm.data = Some(BTreeMap::from([("payload".into(), payload_b.clone())]));
            cm.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(SENT_ANNOTATION.into(), rec.now_us().to_string());
            if once(
                &rec,
                "update",
                "configmaps",
                api.replace(&name, &PostParams::default(), &cm),
            )
            .await
            .is_ok()
            {
                writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        let patch = Patch::Merge(json!({
            "metadata": {"annotations": {SENT_ANNOTATION: rec.now_us().to_string()}},
            "data": {"patched": i.to_string()}
        }));
        if once(
            &rec,
            "patch",
            "configmaps",
            api.patch(&name, &PatchParams::default(), &patch),
        )
        .await
        .is_ok()
        {
            writes.fetch_add(1, Ordering::Relaxed);
        }
        let _ = once(
            &rec,
            "delete",
            "configmaps",
            api.delete(&name, &DeleteParams::default()),
        )
        .await;
    }
}

/// One watcher: records a delivery for every added or modified ConfigMap until stopped.
async fn watcher(
    k: u32,
    stream: impl futures::Stream<Item = Result<WatchEvent<ConfigMap>, setpoint_runtime::ClientError>>,
    rec: Recorder,
    delivered: Arc<AtomicU64>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut stream = std::pin::pin!(stream);
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = stopped.wait_for(|s| *s) => return,
        };
        let cm = match ev {
            Some(Ok(WatchEvent::Added(cm))) | Some(Ok(WatchEvent::Modified(cm))) => cm,
            Some(Ok(_)) => continue,
            // A watch that ends early shows as missing deliveries in the report.
            Some(Err(_)) | None => return,
        };
        let now = rec.now_us();
        let sent = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SENT_ANNOTATION))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(sent) = sent {
            delivered.fetch_add(1, Ordering::Relaxed);
            rec.record_at(
                now,
                Record::Delivery {
                    watcher: k,
                    us: now.saturating_sub(sent),
                },
            );
        }
    }
}

/// Deletes the run's ConfigMaps a worker left behind (its delete failed) in a namespace the
/// run does not own; what cannot be deleted is recorded as missing.
async fn delete_leftovers(api: &Api<ConfigMap>, rec: &Recorder, run: &str) {
    let list = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
    let left = match once(rec, "list", "configmaps", api.list(&list)).await {
        Ok(l) => l.items,
        Err(e) => {
            rec.record(Record::Missing {
                what: format!("the run's ConfigMaps could not be listed for cleanup: {e}"),
            });
            return;
        }
    };
    for cm in left {
        let Some(name) = cm.metadata.name else {
            continue;
        };
        let deleted = once(
            rec,
            "delete",
            "configmaps",
            api.delete(&name, &DeleteParams::default()),
        )
        .await;
        if let Err(e) = deleted.map(|_| ()) {
            if !e.is_not_found() {
                rec.record(Record::Missing {
                    what: format!("ConfigMap {name} left behind: {e}"),
                });
            }
        }
    }
}

/// Runs the api benchmark against the cluster behind `client`.
pub async fn run(client: Client, config: ApiConfig) -> Result<Outcome<ApiReport>, BenchError> {
    let rec = Recorder::new();
    let id = run_id();
    let (ns, own_namespace) = run_namespace(config.namespace.as_deref(), &id);
    rec.record_at(
        0,
        Record::Start {
            benchmark: "api".into(),
            run_id: id.clone(),
            unix_ms: chrono::Utc::now().timestamp_millis(),
            params: json!({
                "concurrency": config.concurrency,
                "duration_seconds": config.duration.as_secs_f64(),
                "object_size": config.object_size,
                "watchers": config.watchers,
                "namespace": config.namespace,
            }),
        },
    );
    if own_namespace {
        create_namespace(&client, &rec, &ns, &id).await?;
    }
    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let (stop, stopped) = watch::channel(false);
    let delivered = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let params = WatchParams {
        label_selector: Some(format!("{RUN_LABEL}={id}")),
        ..Default::default()
    };
    let mut watchers = Vec::new();
    for k in 0..config.watchers {
        let stream = once(&rec, "watch", "configmaps", api.watch(&params, "")).await?;
        watchers.push(tokio::spawn(watcher(
            k as u32,
            stream,
            rec.clone(),
            delivered.clone(),
            stopped.clone(),
        )));
    }
    let sampler = Sampler::start(
        rec.clone(),
        config.processes.clone(),
        Duration::from_secs(1),
    );
    let progress = config.progress.then(|| {
        let (writes, delivered) = (writes.clone(), delivered.clone());
        let (began, duration) = (std::time::Instant::now(), config.duration);
        Progress::start(move || {
            format!(
                "{} writes {}  deliveries {}",
                progress::time_bar(began, duration),
                writes.load(Ordering::Relaxed),
                delivered.load(Ordering::Relaxed)
            )
        })
    });
    rec.record(Record::Mark {
        mark: Mark::CreatesStarted,
    });
    let end = tokio::time::Instant::now() + config.duration;
    let workers: Vec<_> = (0..config.concurrency.max(1))
        .map(|w| {
            tokio::spawn(worker(
                w,
                api.clone(),
                rec.clone(),
                id.clone(),
                config.object_size,
                end,
                writes.clone(),
            ))
        })
        .collect();
    for w in workers {
        let _ = w.await;
    }
    rec.record(Record::Mark {
        mark: Mark::LoadDone,
    });
    // Every write should reach every watcher; wait for the stragglers, up to the timeout.
    let want = writes.load(Ordering::Relaxed) * config.watchers as u64;
    let deadline = tokio::time::Instant::now() + config.timeout;
    while delivered.load(Ordering::Relaxed) < want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    for w in watchers {
        let _ = w.await;
    }
    if let Some(p) = progress {
        p.stop().await;
    }
    if own_namespace {
        if !delete_namespace(&client, &rec, &ns, config.timeout).await? {
            rec.record(Record::Missing {
                what: format!("namespace {ns} still there after {:?}", config.timeout),
            });
        }
    } else {
        delete_leftovers(&api, &rec, &id).await;
    }
    sampler.stop().await;
    let log = rec.snapshot();
    if let Some(path) = &config.raw_log {
        crate::record::write_log(&log, std::fs::File::create(path)?)?;
    }
    let report = report::api(&log)?;
    Ok(Outcome { report, log })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_namespace_is_used_and_not_owned() {
        assert_eq!(
            run_namespace(Some("team"), "r1"),
            ("team".to_string(), false)
        );
        assert_eq!(run_namespace(None, "r1"), ("bench-r1".to_string(), true));
    }
}
