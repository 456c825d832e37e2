//! The workload a run keeps the cluster busy with: Deployments and StatefulSets in the
//! `chaos` namespace, scaled and rolled to new images during the run, and Jobs created during
//! the run, whose simulated pods each run a moment and succeed. (No Job from the start: a
//! controller manager that loses its Lease while starting and takes it again stalls a Job in
//! flight for the expectations' 5 minutes, longer than the start may take.)
//! Every write the server acknowledges is recorded, so the end of the run can check none was
//! lost.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Value};
use setpoint_runtime::client::Client;

use super::invariants::AckedWrite;
use super::schedule::{Change, DEPLOYMENTS, IMAGES, STATEFULSETS};

/// The namespace everything of the workload lives in.
pub const NAMESPACE: &str = "chaos";

/// How long a write may keep failing (the API server being restarted) before the run gives up.
const WRITE_DEADLINE: Duration = Duration::from_secs(60);

/// How long each simulated pod of a Job runs before it succeeds.
const JOB_POD_RUN: Duration = Duration::from_millis(1000);

/// What the workload wants: per object (`deployments/chaos/web-0`) its replicas and image, as
/// last acknowledged; and the Jobs, by name, with their completions, each to complete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub objects: BTreeMap<String, (i64, String)>,
    pub jobs: BTreeMap<String, i64>,
}

/// The driver: a client, the time the run started, and what it wrote.
pub struct Workload {
    client: Client,
    started: Instant,
    pub desired: Desired,
    pub acked: Vec<AckedWrite>,
}

fn collection(resource: &str) -> String {
    format!("/apis/apps/v1/namespaces/{NAMESPACE}/{resource}")
}

/// Where the workload's Jobs are.
pub fn jobs_path() -> String {
    format!("/apis/batch/v1/namespaces/{NAMESPACE}/jobs")
}

/// A Job of `completions` pods, `parallelism` at a time, each running [`JOB_POD_RUN`] on a
/// simulated node and exiting 0.
fn job(name: &str, completions: i64, parallelism: i64) -> Value {
    use setpoint_node::simulated::SIMULATED_SUCCEED_AFTER_ANNOTATION as RUN;
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": completions,
            "parallelism": parallelism,
            "template": {
                "metadata": {
                    "labels": {"job": name},
                    "annotations": {RUN: JOB_POD_RUN.as_millis().to_string()},
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container(IMAGES[0])],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        }
    })
}

fn container(image: &str) -> Value {
    json!({"name": "c", "image": image})
}

fn template(app: &str, image: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {"containers": [container(image)], "terminationGracePeriodSeconds": 0}
    })
}

impl Workload {
    pub fn new(client: Client, started: Instant) -> Workload {
        Workload {
            client,
            started,
            desired: Desired::default(),
            acked: Vec::new(),
        }
    }

    fn ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Sends a request until the server answers it (retrying while it is down), failing on
    /// an error answer other than a conflict of a create that already happened.
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        content_type: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<Value> {
        let deadline = Instant::now() + WRITE_DEADLINE;
        loop {
            let answer = self
                .client
                .request(
                    method.clone(),
                    path,
                    content_type,
                    // `null`: a request without a body (a GET).
                    if body.is_null() {
                        bytes::Bytes::new()
                    } else {
                        bytes::Bytes::from(serde_json::to_vec(body)?)
                    },
                )
                .await;
            match answer {
                Ok(v) => return Ok(v),
                // A create whose first answer was lost with a restarting server.
                Err(e) if method == http::Method::POST && e.code() == Some(409) => {
                    return Ok(Value::Null)
                }
                // 5xx and no answer: the server is restarting.
                Err(e) if e.code().is_none_or(|c| c >= 500 || c == 429) => {
                    if Instant::now() > deadline {
                        bail!("{method} {path}: no answer within {WRITE_DEADLINE:?}: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => bail!("{method} {path}: {e}"),
            }
        }
    }

    /// Creates the namespace, the Deployments (3 replicas, maxSurge 1, maxUnavailable 0) and
    /// the StatefulSets (3 replicas), and with `background_pods` > 0 the Deployment `filler`
    /// of that many replicas, which the schedule never changes: a cluster of that size for
    /// the others' changes and the faults to happen in.
    pub async fn create(&mut self, background_pods: i64) -> anyhow::Result<()> {
        self.send(
            http::Method::POST,
            "/api/v1/namespaces",
            Some("application/json"),
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        .await?;
        let image = IMAGES[0];
        let deployments = (0..DEPLOYMENTS)
            .map(|i| (format!("web-{i}"), 3))
            .chain((background_pods > 0).then(|| ("filler".to_string(), background_pods)));
        for (name, replicas) in deployments {
            let d = json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                    "template": template(&name, image),
                }
            });
            let answer = self
                .send(
                    http::Method::POST,
                    &collection("deployments"),
                    Some("application/json"),
                    &d,
                )
                .await?;
            self.record_created(
                &format!("deployments/{NAMESPACE}/{name}"),
                &answer,
                replicas,
                image,
            );
        }
        for i in 0..STATEFULSETS {
            let name = format!("db-{i}");
            let s = json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 3,
                    "serviceName": name,
                    "selector": {"matchLabels": {"app": name}},
                    "template": template(&name, image),
                }
            });
            let answer = self
                .send(
                    http::Method::POST,
                    &collection("statefulsets"),
                    Some("application/json"),
                    &s,
                )
                .await?;
            self.record_created(
                &format!("statefulsets/{NAMESPACE}/{name}"),
                &answer,
                3,
                image,
            );
        }
        Ok(())
    }

    /// Creates a Job and wants it complete.
    async fn create_job(
        &mut self,
        name: &str,
        completions: i64,
        parallelism: i64,
    ) -> anyhow::Result<()> {
        self.send(
            http::Method::POST,
            &jobs_path(),
            Some("application/json"),
            &job(name, completions, parallelism),
        )
        .await?;
        self.desired.jobs.insert(name.to_string(), completions);
        Ok(())
    }

    /// Records a created object's replicas and image as wanted, and, when the create's
    /// answer arrived (a create retried after a lost answer has none), as acknowledged.
    fn record_created(&mut self, object: &str, answer: &Value, replicas: i64, image: &str) {
        self.desired
            .objects
            .insert(object.to_string(), (replicas, image.to_string()));
        let Some(rv) = answer["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
        else {
            return;
        };
        for (field, value) in [
            ("/spec/replicas", json!(replicas)),
            ("/spec/template/spec/containers/0/image", json!(image)),
        ] {
            self.acked.push(AckedWrite {
                at_ms: self.ms(),
                object: object.to_string(),
                field: field.to_string(),
                value,
                rv,
            });
        }
    }

    /// Makes `change`: a new Job, or a merge patch whose acknowledged value is recorded.
    pub async fn apply(&mut self, change: &Change) -> anyhow::Result<()> {
        let (resource, name, field, value, patch) = match change {
            Change::CreateJob {
                name,
                completions,
                parallelism,
            } => return self.create_job(name, *completions, *parallelism).await,
            Change::ScaleDeployment { name, replicas } => (
                "deployments",
                name,
                "/spec/replicas",
                json!(replicas),
                json!({"spec": {"replicas": replicas}}),
            ),
            Change::ScaleStatefulSet { name, replicas } => (
                "statefulsets",
                name,
                "/spec/replicas",
                json!(replicas),
                json!({"spec": {"replicas": replicas}}),
            ),
            Change::DeploymentImage { name, image } => (
                "deployments",
                name,
                "/spec/template/spec/containers/0/image",
                json!(image),
                json!({"spec": {"template": {"spec": {"containers": [container(image)]}}}}),
            ),
            Change::StatefulSetImage { name, image } => (
                "statefulsets",
                name,
                "/spec/template/spec/containers/0/image",
                json!(image),
                json!({"spec": {"template": {"spec": {"containers": [container(image)]}}}}),
            ),
        };
        let path = format!("{}/{name}", collection(resource));
        let answer = self
            .send(
                http::Method::PATCH,
                &path,
                Some("application/merge-patch+json"),
                &patch,
            )
            .await?;
        let rv = answer["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let object = format!("{resource}/{NAMESPACE}/{name}");
        self.acked.push(AckedWrite {
            at_ms: self.ms(),
            object: object.clone(),
            field: field.to_string(),
            value: value.clone(),
            rv,
        });
        let entry = self.desired.objects.entry(object).or_default();
        match value {
            Value::Number(n) => entry.0 = n.as_i64().unwrap_or(entry.0),
            Value::String(s) => entry.1 = s,
            _ => {}
        }
        Ok(())
    }
}

impl Workload {
    /// Test only (`--rogue-extra-pod`): creates, as a misbehaving controller would, one pod
    /// beyond the replicas of `web-0`'s current ReplicaSet, under that ReplicaSet's
    /// controller reference. The ReplicaSet controller deletes it again; the invariant
    /// checker must report it. Returns the pod's name.
    pub async fn create_rogue_pod(&self) -> anyhow::Result<String> {
        let list = self
            .send(
                http::Method::GET,
                &format!("{}?labelSelector=app%3Dweb-0", collection("replicasets")),
                None,
                &Value::Null,
            )
            .await?;
        let Some(rs) = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["spec"]["replicas"].as_i64().unwrap_or(0) > 0)
        else {
            bail!("web-0 has no ReplicaSet with replicas to add a pod to");
        };
        let name = format!(
            "{}-rogue",
            rs["metadata"]["name"].as_str().unwrap_or("web-0")
        );
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": rs["spec"]["template"]["metadata"]["labels"],
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                    "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": rs["spec"]["template"]["spec"],
        });
        pod["metadata"]["namespace"] = json!(NAMESPACE);
        self.send(
            http::Method::POST,
            &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
            Some("application/json"),
            &pod,
        )
        .await?;
        Ok(name)
    }
}
