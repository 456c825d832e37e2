//! `bench endpointslices`: how fast a Service's EndpointSlices follow its pods. A Deployment of
//! R replicas behind one Service is created on N simulated nodes; a watch on the pods records
//! when each pod was first seen Ready with its address, a watch on the Service's slices when
//! that address was first listed `ready: true`, and the figure is the distribution of the
//! difference, pod Ready → slice updated. Then the Deployment is scaled to 0 and the same is
//! measured the other way: pod deleted (its `deletionTimestamp` seen) → its address no longer
//! ready in any slice (listed `ready: false, terminating: true`, or gone).
//!
//! Both watches run in this process against the same API server, so their clocks agree; the
//! slice controller's own work, its writes and the watch delivery are all in the figure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use setpoint_node::SimulatedConfig;
use setpoint_runtime::client::{Api, Client, Patch, PatchParams, PostParams, WatchParams};
use tokio::sync::watch;

use crate::density::{create_namespace, delete_namespace, ready_nodes, run_id, wait_until, Nodes};
use crate::placement::Placement;
use crate::record::Recorder;
use crate::report::Percentiles;
use crate::BenchError;

/// How an endpointslices run goes.
#[derive(Clone, Debug)]
pub struct EndpointSlicesConfig {
    /// Simulated nodes to host in this process.
    pub nodes: usize,
    /// Pods behind the Service.
    pub replicas: i32,
    /// How long to wait for each phase.
    pub timeout: Duration,
}

/// The figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct EndpointSlicesReport {
    /// The run's id (its namespace is `bench-<id>`).
    pub run_id: String,
    /// Nodes the pods went to.
    pub nodes: u64,
    /// Pods behind the Service.
    pub pods: u64,
    /// Pod first seen Ready → its address first seen ready in a slice, ms.
    pub ready_to_slice: Percentiles,
    /// Pod deleted (seen by the watch) → its address no longer ready in any slice, ms.
    pub deleted_to_removed: Percentiles,
    /// Deployment created → every pod's address ready in the slices, seconds.
    pub all_ready_seconds: f64,
    /// Slices the Service had with every pod ready.
    pub slices: u64,
}

/// What the watches saw, in microseconds since the run's start.
#[derive(Default)]
struct Seen {
    /// Pod name → (address, when first seen Ready).
    pod_ready: HashMap<String, (String, u64)>,
    /// Pod name → when its deletion was first seen.
    pod_gone: HashMap<String, u64>,
    /// Address → when first listed ready.
    slice_ready: HashMap<String, u64>,
    /// Address → when it last left every slice.
    slice_gone: HashMap<String, u64>,
    /// Slice name → the ready addresses it lists now.
    slices: HashMap<String, Vec<String>>,
}

impl Seen {
    fn see_pod(&mut self, pod: &Pod, deleted: bool, at: u64) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if deleted || pod.metadata.deletion_timestamp.is_some() {
            self.pod_gone.entry(name).or_insert(at);
            return;
        }
        let status = pod.status.as_ref();
        let ip = status.and_then(|s| s.pod_ip.clone()).unwrap_or_default();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready && !ip.is_empty() {
            self.pod_ready.entry(name).or_insert((ip, at));
        }
    }

    fn see_slice(&mut self, slice: &EndpointSlice, deleted: bool, at: u64) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let ready: Vec<String> = if deleted {
            vec![]
        } else {
            slice
                .endpoints
                .iter()
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .flat_map(|e| e.addresses.iter().cloned())
                .collect()
        };
        for ip in &ready {
            self.slice_ready.entry(ip.clone()).or_insert(at);
        }
        let before = self.slices.insert(name, ready).unwrap_or_default();
        for ip in before {
            if !self.slices.values().any(|ips| ips.contains(&ip)) {
                self.slice_gone.insert(ip, at);
            }
        }
    }

    fn ready_addresses(&self) -> usize {
        self.slices.values().map(Vec::len).sum()
    }
}

/// Pod Ready → slice ready latencies, and pod deleted → address removed ones (µs).
fn latencies(seen: &Seen) -> (Vec<u64>, Vec<u64>) {
    let mut ready = vec![];
    let mut removed = vec![];
    for (pod, (ip, ready_at)) in &seen.pod_ready {
        if let Some(listed) = seen.slice_ready.get(ip) {
            // Two watches: the slice event can arrive first; that is no delay at all.
            ready.push(listed.saturating_sub(*ready_at));
        }
        if let (Some(gone), Some(removed_at)) = (seen.pod_gone.get(pod), seen.slice_gone.get(ip)) {
            removed.push(removed_at.saturating_sub(*gone));
        }
    }
    (ready, removed)
}

/// Runs the benchmark against the cluster behind `client`.
pub async fn run(
    client: Client,
    config: EndpointSlicesConfig,
) -> Result<EndpointSlicesReport, BenchError> {
    let rec = Recorder::new();
    let id = run_id();
    let ns = format!("bench-{id}");
    let placement = Placement::RunNodes(id.clone());
    let nodes = Nodes::start(&client, config.nodes, &id, 250, SimulatedConfig::default());
    let eligible = placement.node_selector();
    let want = config.nodes as u64;
    let up = wait_until(config.timeout, Duration::from_millis(250), || async {
        Ok(ready_nodes(&client, &rec, eligible.as_deref()).await? >= want)
    })
    .await?;
    if !up {
        let _ = nodes.stop().await;
        return Err(BenchError::Setup(format!(
            "{} simulated nodes were not Ready within {:?}",
            config.nodes, config.timeout
        )));
    }
    create_namespace(&client, &rec, &ns, &id).await?;
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    }))?;
    Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await?;

    let start = Instant::now();
    let at = move || start.elapsed().as_micros() as u64;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop, stopped) = watch::channel(false);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns).skipping_managed_fields();
    let params = WatchParams::default();
    let first = pods.watch(&params, "").await?;
    let s = seen.clone();
    let pod_task = tokio::spawn(crate::observe::follow_events(
        pods,
        params.clone(),
        first,
        stopped.clone(),
        move |p: Pod, deleted| s.lock().see_pod(&p, deleted, at()),
    ));
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), &ns).skipping_managed_fields();
    let slice_params = WatchParams {
        label_selector: Some("kubernetes.io/service-name=web".into()),
        ..Default::default()
    };
    let first = slices.watch(&slice_params, "").await?;
    let s = seen.clone();
    let slice_task = tokio::spawn(crate::observe::follow_events(
        slices,
        slice_params,
        first,
        stopped,
        move |e: EndpointSlice, deleted| s.lock().see_slice(&e, deleted, at()),
    ));

    let mut spec = json!({
        "replicas": config.replicas,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}},
                     "spec": placement.pod_spec("nginx:1.25")}
    });
    spec["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 8080}]);
    let deployment: Deployment =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec}))?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let created = Instant::now();
    deployments
        .create(&PostParams::default(), &deployment)
        .await?;
    let pods_wanted = config.replicas.max(0) as usize;
    let all_ready = wait_until(config.timeout, Duration::from_millis(10), || {
        let seen = seen.clone();
        async move { Ok(seen.lock().ready_addresses() >= pods_wanted) }
    })
    .await?;
    let all_ready_seconds = created.elapsed().as_secs_f64();
    let slice_count = seen
        .lock()
        .slices
        .values()
        .filter(|s| !s.is_empty())
        .count() as u64;
    let mut scaled_down = false;
    if all_ready {
        let patch = json!({"spec": {"replicas": 0}});
        deployments
            .patch("web", &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        scaled_down = wait_until(config.timeout, Duration::from_millis(10), || {
            let seen = seen.clone();
            async move { Ok(seen.lock().ready_addresses() == 0) }
        })
        .await?;
    }
    let _ = stop.send(true);
    let _ = pod_task.await;
    let _ = slice_task.await;
    let _ = delete_namespace(&client, &rec, &ns, config.timeout).await;
    let _ = nodes.stop().await;
    let _ = crate::density::delete_nodes(
        &client,
        &rec,
        &format!("{}={id}", crate::density::RUN_LABEL),
    )
    .await;
    if !all_ready || !scaled_down {
        return Err(BenchError::Setup(format!(
            "the Service's slices did not follow its {} pods within {:?}",
            config.replicas, config.timeout
        )));
    }
    let (ready, removed) = latencies(&seen.lock());
    Ok(EndpointSlicesReport {
        run_id: id,
        nodes: want,
        pods: pods_wanted as u64,
        ready_to_slice: Percentiles::of_us(ready),
        deleted_to_removed: Percentiles::of_us(removed),
        all_ready_seconds,
        slices: slice_count,
    })
}

/// The report as a table.
pub fn table(r: &EndpointSlicesReport) -> String {
    let row = |what: &str, p: &Percentiles| {
        format!(
            "  {what:<28} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>10.1}\n",
            p.count, p.p50, p.p90, p.p99, p.max
        )
    };
    format!(
        "endpointslices run {}: a Service of {} pods on {} nodes, {} slices\n  \
         Deployment created -> every address ready in the slices  {:.2} s\n  \
         {:<28} {:>6} {:>10} {:>10} {:>10} {:>10}\n{}{}",
        r.run_id,
        r.pods,
        r.nodes,
        r.slices,
        r.all_ready_seconds,
        "latency",
        "count",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        row("pod Ready -> slice ready", &r.ready_to_slice),
        row("pod deleted -> not ready", &r.deleted_to_removed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "status": {"podIP": ip, "conditions": [{"type": "Ready",
                "status": if ready { "True" } else { "False" }}]}}))
        .unwrap()
    }

    fn slice(name: &str, ready: &[&str], unready: &[&str]) -> EndpointSlice {
        let mut endpoints: Vec<_> = ready
            .iter()
            .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
            .collect();
        endpoints.extend(
            unready
                .iter()
                .map(|ip| json!({"addresses": [ip], "conditions": {"ready": false}})),
        );
        serde_json::from_value(json!({"metadata": {"name": name}, "addressType": "IPv4",
            "endpoints": endpoints}))
        .unwrap()
    }

    #[test]
    fn latencies_pair_a_pods_readiness_with_its_address_in_the_slices() {
        let mut seen = Seen::default();
        seen.see_pod(&pod("a", "10.0.0.1", false), false, 10);
        seen.see_slice(&slice("s1", &[], &["10.0.0.1"]), false, 20);
        seen.see_pod(&pod("a", "10.0.0.1", true), false, 100);
        seen.see_pod(&pod("b", "10.0.0.2", true), false, 110);
        seen.see_slice(&slice("s1", &["10.0.0.1"], &[]), false, 150);
        // b's slice event arrived before its pod event: no delay, not a negative one.
        seen.see_slice(&slice("s2", &["10.0.0.2"], &[]), false, 105);
        assert_eq!(seen.ready_addresses(), 2);
        let (mut ready, removed) = latencies(&seen);
        ready.sort();
        assert_eq!(ready, vec![0, 50]);
        assert!(removed.is_empty());
        seen.see_pod(&pod("a", "10.0.0.1", true), true, 200);
        seen.see_slice(&slice("s1", &[], &[]), false, 230);
        let (_, removed) = latencies(&seen);
        assert_eq!(removed, vec![30]);
        assert_eq!(seen.ready_addresses(), 1);
        // An address that moves between slices has not left.
        seen.see_slice(&slice("s1", &["10.0.0.2"], &[]), false, 240);
        seen.see_slice(&slice("s2", &[], &[]), true, 250);
        assert!(!seen.slice_gone.contains_key("10.0.0.2"));
    }
}
