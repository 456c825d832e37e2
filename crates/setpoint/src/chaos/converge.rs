//! Convergence: every object of the workload at what was last written — generation
//! observed, every replica updated, ready and available, no pod beyond them — every Job
//! complete with none of its pods still running, and how long the cluster takes to get there,
//! as a whole and object by object.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use setpoint_runtime::client::Client;

use super::workload::{jobs_path, Desired, NAMESPACE};

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// Whether `pod`'s controller is a Job: its pods stay after they succeed, so they are not
/// counted against the replicas of the others.
fn of_job(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["controller"].as_bool() == Some(true) && r["kind"] == "Job")
}

/// Why Job `o` is not complete with `completions` succeeded pods, or `None`.
fn job_not_complete(o: &Value, completions: i64) -> Option<String> {
    let name = o["metadata"]["name"].as_str().unwrap_or_default();
    let status = &o["status"];
    let complete = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Complete" && c["status"] == "True");
    let succeeded = int(&status["succeeded"]);
    if !complete || succeeded < completions {
        return Some(format!(
            "jobs/{NAMESPACE}/{name}: {succeeded} of {completions} completions, {}",
            if complete { "complete" } else { "not complete" }
        ));
    }
    None
}

/// Why the objects read are not converged on `desired`, or `None` when they are. Pure: the
/// objects are LIST items of the workload's namespace. ([`check`] reads the pods only once
/// the rest pass.)
#[cfg(test)]
fn not_converged(
    desired: &Desired,
    deployments: &[Value],
    statefulsets: &[Value],
    jobs: &[Value],
    pods: &[Value],
) -> Option<String> {
    each_not_converged(desired, deployments, statefulsets, jobs)
        .into_values()
        .next()
        .or_else(|| pods_not_converged(desired, pods))
}

/// Each workload object of `desired` that is not converged on its own
/// (`deployments/<ns>/<name>`, `statefulsets/…`, `jobs/…`), with why.
fn each_not_converged(
    desired: &Desired,
    deployments: &[Value],
    statefulsets: &[Value],
    jobs: &[Value],
) -> BTreeMap<String, String> {
    let find = |items: &[Value], name: &str| {
        items
            .iter()
            .find(|o| o["metadata"]["name"].as_str() == Some(name))
            .cloned()
    };
    let mut out = BTreeMap::new();
    for (object, (replicas, image)) in &desired.objects {
        let mut parts = object.splitn(3, '/');
        let (resource, name) = (parts.next().unwrap_or(""), parts.nth(1).unwrap_or(""));
        let items = if resource == "deployments" {
            deployments
        } else {
            statefulsets
        };
        let why = match find(items, name) {
            None => Some(format!("{object} does not exist")),
            Some(o) => object_not_converged(object, resource, &o, *replicas, image),
        };
        if let Some(why) = why {
            out.insert(object.clone(), why);
        }
    }
    for (name, completions) in &desired.jobs {
        let object = format!("jobs/{NAMESPACE}/{name}");
        let why = match find(jobs, name) {
            None => Some(format!("{object} does not exist")),
            Some(o) => job_not_complete(&o, *completions),
        };
        if let Some(why) = why {
            out.insert(object, why);
        }
    }
    out
}

/// Why Deployment or StatefulSet `o` (`resource`) is not converged on `replicas` of `image`.
fn object_not_converged(
    object: &str,
    resource: &str,
    o: &Value,
    replicas: i64,
    image: &str,
) -> Option<String> {
    let (spec, status) = (&o["spec"], &o["status"]);
    if int(&spec["replicas"]) != replicas
        || spec["template"]["spec"]["containers"][0]["image"].as_str() != Some(image)
    {
        return Some(format!(
            "{object} is not as last written ({replicas} replicas of {image})"
        ));
    }
    if int(&o["metadata"]["generation"]) != int(&status["observedGeneration"]) {
        return Some(format!("{object}: generation not observed yet"));
    }
    let counts = [
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
    ];
    if let Some(c) = counts.iter().find(|c| int(&status[**c]) != replicas) {
        return Some(format!(
            "{object}: status.{c} is {}, not {replicas}",
            int(&status[*c])
        ));
    }
    if resource == "statefulsets" && status["currentRevision"] != status["updateRevision"] {
        return Some(format!("{object}: the update has not completed"));
    }
    None
}

/// Why the pods read are not converged on `desired` (one per replica, none beyond them, every
/// Job's finished), or `None`.
fn pods_not_converged(desired: &Desired, pods: &[Value]) -> Option<String> {
    let want_pods: i64 = desired.objects.values().map(|(replicas, _)| replicas).sum();
    let (job_pods, pods): (Vec<&Value>, Vec<&Value>) = pods.iter().partition(|p| of_job(p));
    // Every Job is complete: none of its pods may still be running.
    if let Some(p) = job_pods
        .iter()
        .find(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
    {
        return Some(format!(
            "pod {} of a complete Job is not finished",
            p["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    let live = pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .count() as i64;
    if live != want_pods || pods.len() as i64 != want_pods {
        return Some(format!(
            "{} pods ({live} not being deleted), not {want_pods}",
            pods.len()
        ));
    }
    None
}

async fn list(client: &Client, path: &str) -> Option<Vec<Value>> {
    let v = client
        .request(http::Method::GET, path, None, bytes::Bytes::new())
        .await
        .ok()?;
    v["items"].as_array().cloned()
}

/// One look at the cluster: why it is not converged (`None` when it is), and which workload
/// objects are not on their own (`None` when they could not be read).
struct Poll {
    why: Option<String>,
    objects: Option<BTreeSet<String>>,
}

/// Looks at the cluster once.
///
/// The pods are listed only once the workloads' statuses say converged: with a large
/// `--background-pods` a LIST of every pod is by far the costliest read, and a poll that lists
/// them while a status still says otherwise only slows the machine it measures (the
/// workloads' statuses are what lag; the pods are checked before anything counts as
/// converged all the same).
async fn check(client: &Client, desired: &Desired) -> Poll {
    const NO_ANSWER: &str = "the API server does not answer";
    let unread = Poll {
        why: Some(NO_ANSWER.into()),
        objects: None,
    };
    let apps = format!("/apis/apps/v1/namespaces/{NAMESPACE}");
    let (Some(d), Some(s), Some(j)) = (
        list(client, &format!("{apps}/deployments")).await,
        list(client, &format!("{apps}/statefulsets")).await,
        list(client, &jobs_path()).await,
    ) else {
        return unread;
    };
    let each = each_not_converged(desired, &d, &s, &j);
    let objects = Some(each.keys().cloned().collect());
    if let Some(why) = each.into_values().next() {
        return Poll {
            why: Some(why),
            objects,
        };
    }
    let Some(p) = list(client, &format!("/api/v1/namespaces/{NAMESPACE}/pods")).await else {
        return unread;
    };
    Poll {
        why: pods_not_converged(desired, &p),
        objects,
    }
}

/// The cluster converged: how long it took, and each workload object that was seen out of
/// convergence meanwhile with how long it took to return (the last time it did).
#[derive(Debug, PartialEq)]
pub struct Converged {
    /// From `since` until every object and pod was converged.
    pub after: Duration,
    /// `deployments/<ns>/<name>` (or `statefulsets/…`, `jobs/…`) and when it returned, from
    /// `since`; objects never seen out of convergence are not listed.
    pub returned: BTreeMap<String, Duration>,
}

/// What one object seen out of convergence did: left, or returned after how long.
#[derive(Default)]
struct Returns {
    out: BTreeSet<String>,
    returned: BTreeMap<String, Duration>,
}

impl Returns {
    /// A poll `at` from `since` found `unconverged` out of convergence.
    fn seen(&mut self, unconverged: &BTreeSet<String>, at: Duration) {
        for o in unconverged {
            self.returned.remove(o);
            self.out.insert(o.clone());
        }
        let back: Vec<String> = self.out.difference(unconverged).cloned().collect();
        for o in back {
            self.out.remove(&o);
            self.returned.insert(o, at);
        }
    }
}

/// Polls until converged: the time it took from `since` and each object's return, or `Err`
/// with the last reason after `within`.
pub async fn wait(
    client: &Client,
    desired: &Desired,
    since: Instant,
    within: Duration,
) -> Result<Converged, String> {
    let deadline = since + within;
    let mut returns = Returns::default();
    loop {
        let poll = check(client, desired).await;
        let at = since.elapsed();
        if let Some(objects) = &poll.objects {
            returns.seen(objects, at);
        }
        let why = match poll.why {
            None => {
                return Ok(Converged {
                    after: at,
                    returned: returns.returned,
                })
            }
            Some(why) => why,
        };
        if Instant::now() > deadline {
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn desired() -> Desired {
        let mut d = Desired::default();
        d.objects
            .insert("deployments/chaos/web-0".into(), (2, "nginx:1.26".into()));
        d
    }

    fn deployment(generation: i64, observed: i64, ready: i64) -> Value {
        json!({"metadata": {"name": "web-0", "generation": generation},
               "spec": {"replicas": 2, "template": {"spec": {"containers": [{"image": "nginx:1.26"}]}}},
               "status": {"observedGeneration": observed, "replicas": 2, "updatedReplicas": 2,
                          "readyReplicas": ready, "availableReplicas": ready}})
    }

    fn pods(n: usize) -> Vec<Value> {
        vec![json!({"metadata": {}}); n]
    }

    #[test]
    fn converged_means_observed_ready_and_no_extra_pods() {
        let d = desired();
        assert_eq!(
            not_converged(&d, &[deployment(3, 3, 2)], &[], &[], &pods(2)),
            None
        );
        assert!(
            not_converged(&d, &[deployment(3, 2, 2)], &[], &[], &pods(2))
                .unwrap()
                .contains("generation not observed")
        );
        assert!(
            not_converged(&d, &[deployment(3, 3, 1)], &[], &[], &pods(2))
                .unwrap()
                .contains("status.readyReplicas is 1")
        );
        assert!(
            not_converged(&d, &[deployment(3, 3, 2)], &[], &[], &pods(3))
                .unwrap()
                .contains("3 pods")
        );
        assert!(not_converged(&d, &[], &[], &[], &pods(2))
            .unwrap()
            .contains("does not exist"));
        let mut old = deployment(3, 3, 2);
        old["spec"]["replicas"] = json!(3);
        assert!(not_converged(&d, &[old], &[], &[], &pods(2))
            .unwrap()
            .contains("not as last written"));
    }

    #[test]
    fn each_object_out_of_convergence_is_named_and_its_return_timed() {
        let mut d = desired();
        d.objects
            .insert("statefulsets/chaos/db-0".into(), (1, "nginx:1.26".into()));
        // The StatefulSet does not exist; the Deployment is converged.
        let each = each_not_converged(&d, &[deployment(3, 3, 2)], &[], &[]);
        assert_eq!(
            each.keys().collect::<Vec<_>>(),
            vec!["statefulsets/chaos/db-0"]
        );
        let ms = Duration::from_millis;
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let mut r = Returns::default();
        r.seen(&set(&["a", "b"]), ms(100));
        r.seen(&set(&["b"]), ms(200));
        assert_eq!(r.returned, BTreeMap::from([("a".to_string(), ms(200))]));
        // An object that leaves again returns at its last return only.
        r.seen(&set(&["a"]), ms(300));
        r.seen(&set(&[]), ms(400));
        assert_eq!(
            r.returned,
            BTreeMap::from([("a".to_string(), ms(400)), ("b".to_string(), ms(300))])
        );
        // One never out of convergence is not listed.
        assert!(!r.returned.contains_key("c"));
    }

    #[test]
    fn jobs_converge_when_complete_with_no_pod_running() {
        let mut d = desired();
        d.jobs.insert("batch-0".into(), 2);
        let job = |succeeded: i64, complete: bool| {
            json!({"metadata": {"name": "batch-0"},
                   "status": {"succeeded": succeeded, "conditions": [
                       {"type": "Complete", "status": if complete { "True" } else { "False" }}]}})
        };
        let job_pod = |phase: &str| {
            json!({"metadata": {"ownerReferences": [{"kind": "Job", "name": "batch-0", "controller": true}]},
                   "status": {"phase": phase}})
        };
        let mut all = pods(2);
        all.extend([job_pod("Succeeded"), job_pod("Succeeded")]);
        let rest = [deployment(3, 3, 2)];
        assert_eq!(not_converged(&d, &rest, &[], &[job(2, true)], &all), None);
        assert!(not_converged(&d, &rest, &[], &[], &all)
            .unwrap()
            .contains("jobs/chaos/batch-0 does not exist"));
        assert!(not_converged(&d, &rest, &[], &[job(1, false)], &all)
            .unwrap()
            .contains("1 of 2 completions, not complete"));
        all.push(job_pod("Running"));
        assert!(not_converged(&d, &rest, &[], &[job(2, true)], &all)
            .unwrap()
            .contains("of a complete Job is not finished"));
    }
}
