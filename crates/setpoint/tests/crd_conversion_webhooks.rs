//! End to end with the real kubectl: a CustomResourceDefinition with versions v1 and v2 and a
//! conversion webhook served by this test over HTTPS (`setpoint_testing::webhook`), in v2 the
//! v1 field `spec.cronSpec` is `spec.schedule.expression`.
//!
//! - objects created as v1 read as v2 and back; an object created as v2 is stored as v1;
//! - lists in both versions, one `ConversionReview` for a whole list;
//! - a watch in v2 of objects stored as v1 gets converted events;
//! - switching the storage version to v2 adds it to `status.storedVersions`, and new writes
//!   are stored as v2 while older objects stay v1 and still read in both versions;
//! - server-side apply through v2 of objects stored as v1 creates and updates them, recording
//!   the applier's entry in v2; an apply through v1 that changes a field a v2 manager owns is
//!   a conflict named in v2, and forcing it takes the field from that manager;
//! - ValidatingAdmissionPolicies for v1 once v2 is stored: one matching writes through v2
//!   (`matchPolicy: Equivalent`) sees the object converted to v1 and denies on its v1 field,
//!   one for v1 only (`Exact`) judges a write through v1 stored as v2 but not one through v2;
//! - a mutating admission webhook registered for v1 with `matchPolicy: Equivalent` gets a
//!   write through v2 as v1 (converted by the conversion webhook), and its patch, made in v1,
//!   is stored in v2;
//! - a webhook refusing a conversion is upstream's `conversion webhook for … failed: …`, for
//!   reads, and it ends a watch with an ERROR event; metadata-only reads (GET and a paged
//!   LIST) call no conversion webhook, so they answer for that object.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, ApiResource, DynamicObject, ListParams};
use setpoint_testing::webhook::{conversion_response, WebhookServer};
use setpoint_testing::TestCluster;

mod support;

use support::{eventually, expect_failure, expect_success, kubectl_available};

const GROUP: &str = "stable.example.com";
const NS: &str = "conversion";

/// The test's conversion: v1 `spec.cronSpec` ⇄ v2 `spec.schedule.expression`. An object
/// labelled `convert: refuse` cannot be converted.
fn convert(mut obj: Value, desired: &str) -> Result<Value, String> {
    if obj.pointer("/metadata/labels/convert") == Some(&json!("refuse")) {
        return Err(format!(
            "cannot convert {} to {desired}",
            obj["metadata"]["name"].as_str().unwrap_or("")
        ));
    }
    let spec = obj["spec"].as_object_mut().ok_or("no spec")?;
    match desired {
        "stable.example.com/v2" => {
            if let Some(c) = spec.remove("cronSpec") {
                spec.insert("schedule".into(), json!({"expression": c}));
            }
        }
        "stable.example.com/v1" => {
            if let Some(e) = spec
                .remove("schedule")
                .and_then(|s| s.get("expression").cloned())
            {
                spec.insert("cronSpec".into(), e);
            }
        }
        other => return Err(format!("unknown version {other}")),
    }
    Ok(obj)
}

fn crd(conversion: Value) -> Value {
    let schema = |spec: Value| {
        json!({"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": spec}}}})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("crontabs.{GROUP}")},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "crontabs", "singular": "crontab", "kind": "CronTab"},
            "conversion": conversion,
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": schema(json!({"cronSpec": {"type": "string"},
                                         "image": {"type": "string"}}))},
                {"name": "v2", "served": true, "storage": false,
                 "schema": schema(json!({"schedule": {"type": "object", "properties": {
                                             "expression": {"type": "string"}}},
                                         "image": {"type": "string"}}))}
            ]
        }
    })
}

fn crontab(version: &str, name: &str, schedule: &str, labels: Value) -> Value {
    let spec = if version == "v1" {
        json!({"cronSpec": schedule, "image": "busybox"})
    } else {
        json!({"schedule": {"expression": schedule}, "image": "busybox"})
    };
    json!({"apiVersion": format!("{GROUP}/{version}"), "kind": "CronTab",
           "metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec})
}

/// kubectl with the cluster's kubeconfig and a throwaway HOME.
struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(kubeconfig: &str) -> Kubectl {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        Kubectl { dir }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.args(args)
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .env("HOME", self.dir.path())
            .env("KUBECACHEDIR", self.dir.path().join("cache"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        expect_success(&format!("kubectl {}", args.join(" ")), &self.run(args))
    }

    fn get_json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    fn create(&self, obj: &Value) {
        let file = self.dir.path().join(format!(
            "{}.json",
            obj["metadata"]["name"].as_str().unwrap()
        ));
        std::fs::write(&file, obj.to_string()).unwrap();
        self.ok(&["create", "-f", file.to_str().unwrap()]);
    }

    /// `kubectl apply --server-side` of `obj` by `manager`, with `extra` flags.
    fn apply(&self, obj: &Value, manager: &str, extra: &[&str]) -> Output {
        let file = self.dir.path().join("applied.json");
        std::fs::write(&file, obj.to_string()).unwrap();
        let manager = format!("--field-manager={manager}");
        let mut args = vec![
            "apply",
            "--server-side",
            &manager,
            "-f",
            file.to_str().unwrap(),
        ];
        args.extend(extra);
        self.run(&args)
    }
}

/// The `managedFields` entry of `manager` in `obj`.
fn entry<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    obj["metadata"]["managedFields"]
        .as_array()
        .and_then(|es| es.iter().find(|e| e["manager"] == manager))
        .unwrap_or_else(|| panic!("no entry of {manager} in {obj}"))
}

/// `kubectl get <resource> --watch` of the namespace: its lines (JSON events), read in the
/// background until it ends; it is killed when dropped.
struct Watch {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Watch {
    fn start(k: &Kubectl, resource: &str) -> Watch {
        let mut child = k
            .command(&[
                "get",
                resource,
                "-n",
                NS,
                "--watch-only",
                "--output-watch-events",
                "-o",
                "json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Watch { child, lines }
    }

    /// Waits until the output holds `needle` (one compact JSON event a line), or panics.
    fn wait_for(&self, needle: &str) {
        eventually(needle, Duration::from_secs(20), || {
            let text = self.lines.lock().unwrap().join("\n");
            text.contains(needle).then_some(())
        });
    }

    /// Whether kubectl has exited.
    fn ended(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The object under `key` as the store holds it.
async fn stored(cluster: &TestCluster, name: &str) -> Value {
    let key = format!("/registry/{GROUP}/crontabs/{NS}/{name}");
    let kv = cluster
        .server()
        .store()
        .get(&key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{key} is stored"));
    let plain = setpoint_store::compression::plain(&kv.value).unwrap();
    serde_json::from_slice(&plain).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversion_webhook_serves_both_versions_and_honours_the_storage_version() {
    if !kubectl_available() {
        return;
    }
    let cluster = TestCluster::start_https().await;
    let reviews = Arc::new(AtomicUsize::new(0));
    let largest = Arc::new(AtomicUsize::new(0));
    let admitted: Arc<Mutex<Vec<Value>>> = Arc::default();
    let (r, l, a) = (reviews.clone(), largest.clone(), admitted.clone());
    let hooks = WebhookServer::start(move |path, request| {
        if path == "/delete" {
            a.lock().unwrap().push(request.clone());
            return json!({"allowed": true});
        }
        if path == "/mutate" {
            // Registered for v1: sets v1's field, which a v2 object does not have.
            a.lock().unwrap().push(request.clone());
            let ops = json!([{"op": "replace", "path": "/spec/cronSpec", "value": "9 9 * * *"}]);
            return json!({"allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(ops.to_string())});
        }
        assert_eq!(path, "/convert");
        r.fetch_add(1, Ordering::SeqCst);
        let n = request["objects"].as_array().map_or(0, Vec::len);
        l.fetch_max(n, Ordering::SeqCst);
        conversion_response(request, convert)
    })
    .await;
    let k = Kubectl::new(&cluster.kubeconfig().unwrap());
    k.ok(&["create", "namespace", NS]);
    let mut definition = crd(hooks.conversion("/convert"));
    k.create(&definition);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=20s",
        &format!("crd/crontabs.{GROUP}"),
    ]);
    let v1 = format!("crontabs.v1.{GROUP}");
    let v2 = format!("crontabs.v2.{GROUP}");

    // Created as v1: stored as v1 without a call, read as v2 through the webhook.
    k.create(&crontab("v1", "a", "*/5 * * * *", json!({})));
    k.create(&crontab("v1", "b", "0 * * * *", json!({})));
    assert_eq!(
        reviews.load(Ordering::SeqCst),
        0,
        "v1 is the storage version"
    );
    let a2 = k.get_json(&["get", &v2, "a", "-n", NS]);
    assert_eq!(a2["apiVersion"], "stable.example.com/v2");
    assert_eq!(a2["spec"]["schedule"]["expression"], "*/5 * * * *");
    assert!(a2["spec"].get("cronSpec").is_none(), "{a2}");
    assert!(reviews.load(Ordering::SeqCst) >= 1);

    // Created as v2: converted to v1 before it is stored, and read back in both versions.
    k.create(&crontab("v2", "c", "30 2 * * *", json!({})));
    let raw = stored(&cluster, "c").await;
    assert_eq!(raw["apiVersion"], "stable.example.com/v1");
    assert_eq!(raw["spec"]["cronSpec"], "30 2 * * *");
    let c1 = k.get_json(&["get", &v1, "c", "-n", NS]);
    assert_eq!(c1["spec"]["cronSpec"], "30 2 * * *");
    let c2 = k.get_json(&["get", &v2, "c", "-n", NS, "--show-managed-fields"]);
    assert_eq!(c2["spec"]["schedule"]["expression"], "30 2 * * *");
    // The creator's entry is in the version it wrote in, with that version's paths.
    let creator = entry(&c2, "kubectl-create");
    assert_eq!(creator["apiVersion"], "stable.example.com/v2", "{c2}");
    assert!(
        creator
            .pointer("/fieldsV1/f:spec/f:schedule/f:expression")
            .is_some(),
        "{creator}"
    );
    assert_eq!(c2["metadata"]["uid"], c1["metadata"]["uid"]);

    // Lists: v2 converts the whole page in one review, v1 needs none.
    let before = reviews.load(Ordering::SeqCst);
    let list2 = k.get_json(&["get", &v2, "-n", NS]);
    assert_eq!(
        reviews.load(Ordering::SeqCst),
        before + 1,
        "one review a list"
    );
    assert_eq!(largest.load(Ordering::SeqCst), 3, "all three objects in it");
    let expressions: Vec<&str> = list2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["spec"]["schedule"]["expression"].as_str().unwrap())
        .collect();
    assert_eq!(expressions, ["*/5 * * * *", "0 * * * *", "30 2 * * *"]);
    let list1 = k.get_json(&["get", &v1, "-n", NS]);
    assert!(list1["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["spec"]["cronSpec"].is_string()));
    assert_eq!(reviews.load(Ordering::SeqCst), before + 1);

    // A merge patch through v2 applies to the object as v2 shows it and is stored as v1.
    k.ok(&[
        "patch",
        &v2,
        "b",
        "-n",
        NS,
        "--type=merge",
        "-p",
        r#"{"spec":{"schedule":{"expression":"7 7 * * *"}}}"#,
    ]);
    let raw = stored(&cluster, "b").await;
    assert_eq!(raw["apiVersion"], "stable.example.com/v1");
    assert_eq!(raw["spec"]["cronSpec"], "7 7 * * *", "{raw}");
    assert!(raw["spec"].get("schedule").is_none(), "{raw}");
    // The patcher's Update entry is in v2 with v2's paths; the creator's, in v1, lost the
    // field the patch changed as v1 shows it.
    let b2 = k.get_json(&["get", &v2, "b", "-n", NS, "--show-managed-fields"]);
    let patcher = entry(&b2, "kubectl-patch");
    assert_eq!(patcher["apiVersion"], "stable.example.com/v2", "{b2}");
    assert_eq!(
        patcher["fieldsV1"],
        json!({"f:spec": {"f:schedule": {"f:expression": {}}}})
    );
    let creator = entry(&b2, "kubectl-create");
    assert_eq!(creator["apiVersion"], "stable.example.com/v1", "{b2}");
    assert!(
        creator.pointer("/fieldsV1/f:spec/f:cronSpec").is_none()
            && creator.pointer("/fieldsV1/f:spec/f:image").is_some(),
        "{creator}"
    );

    // Server-side apply through v2 creates and updates an object stored as v1; the
    // applier's entry is in v2.
    let mut applied = crontab("v2", "s", "5 5 * * *", json!({}));
    expect_success("apply through v2", &k.apply(&applied, "ssa-v2", &[]));
    applied["spec"]["schedule"]["expression"] = json!("6 6 * * *");
    expect_success("apply through v2", &k.apply(&applied, "ssa-v2", &[]));
    let raw = stored(&cluster, "s").await;
    assert_eq!(raw["apiVersion"], "stable.example.com/v1");
    assert_eq!(raw["spec"]["cronSpec"], "6 6 * * *", "{raw}");
    let s2 = k.get_json(&["get", &v2, "s", "-n", NS, "--show-managed-fields"]);
    let mine = entry(&s2, "ssa-v2");
    assert_eq!(mine["operation"], "Apply");
    assert_eq!(mine["apiVersion"], "stable.example.com/v2");
    assert!(
        mine.pointer("/fieldsV1/f:spec/f:schedule/f:expression")
            .is_some(),
        "{mine}"
    );
    // Through v1, the same field is v1's cronSpec: a conflict with the v2 manager, named in
    // v2, until forced.
    let through_v1 = crontab("v1", "s", "7 7 * * *", json!({}));
    let err = expect_failure(
        "apply through v1 of a field a v2 manager owns",
        &k.apply(&through_v1, "ssa-v1", &[]),
    );
    assert!(
        err.contains(
            r#"conflict with "ssa-v2" using stable.example.com/v2: .spec.schedule.expression"#
        ),
        "{err}"
    );
    expect_success(
        "forced apply through v1",
        &k.apply(&through_v1, "ssa-v1", &["--force-conflicts"]),
    );
    assert_eq!(stored(&cluster, "s").await["spec"]["cronSpec"], "7 7 * * *");
    let s1 = k.get_json(&["get", &v1, "s", "-n", NS, "--show-managed-fields"]);
    assert_eq!(entry(&s1, "ssa-v1")["apiVersion"], "stable.example.com/v1");
    let theirs = entry(&s1, "ssa-v2");
    assert!(
        theirs.pointer("/fieldsV1/f:spec/f:schedule").is_none()
            && theirs.pointer("/fieldsV1/f:spec/f:image").is_some(),
        "{theirs}"
    );

    // Watches in both versions see a v1 object created as each of them shows it.
    let w2 = Watch::start(&k, &v2);
    let w1 = Watch::start(&k, &v1);
    // kubectl has opened its watches once a write after it shows up in both (each poke a
    // new value, so each is a change).
    let mut poke = 0;
    eventually("both watches open", Duration::from_secs(20), || {
        poke += 1;
        let value = format!("poke=p{poke}");
        k.ok(&["annotate", "--overwrite", &v1, "a", "-n", NS, &value]);
        let seen = |w: &Watch| {
            let text = w.lines.lock().unwrap().join("\n");
            text.contains(&format!("\"p{poke}\""))
        };
        (seen(&w1) && seen(&w2)).then_some(())
    });
    k.create(&crontab("v1", "d", "15 15 * * *", json!({})));
    w2.wait_for("\"expression\":\"15 15 * * *\"");
    w1.wait_for("\"cronSpec\":\"15 15 * * *\"");
    drop(w2);

    // The storage version becomes v2: storedVersions keeps v1 and adds v2.
    definition = k.get_json(&["get", "crd", &format!("crontabs.{GROUP}")]);
    definition["spec"]["versions"][0]["storage"] = json!(false);
    definition["spec"]["versions"][1]["storage"] = json!(true);
    let file = k.dir.path().join("crd-v2.json");
    std::fs::write(&file, definition.to_string()).unwrap();
    k.ok(&["replace", "-f", file.to_str().unwrap()]);
    eventually("storedVersions [v1, v2]", Duration::from_secs(20), || {
        let crd = k.get_json(&["get", "crd", &format!("crontabs.{GROUP}")]);
        (crd["status"]["storedVersions"] == json!(["v1", "v2"])).then_some(())
    });
    // New writes in v1 are converted and stored as v2; older objects stay v1 and still read
    // in both versions.
    let attempt = AtomicUsize::new(0);
    setpoint_testing::eventually_within(Duration::from_secs(20), "writes stored as v2", || {
        let name = format!("e{}", attempt.fetch_add(1, Ordering::SeqCst));
        k.create(&crontab("v1", &name, "1 1 * * *", json!({})));
        let cluster = &cluster;
        async move {
            let raw = stored(cluster, &name).await;
            (raw["apiVersion"] == "stable.example.com/v2").then_some(())
        }
    })
    .await;
    assert_eq!(
        stored(&cluster, "a").await["apiVersion"],
        "stable.example.com/v1"
    );
    let a1 = k.get_json(&["get", &v1, "a", "-n", NS]);
    assert_eq!(a1["spec"]["cronSpec"], "*/5 * * * *");
    let a2 = k.get_json(&["get", &v2, "a", "-n", NS]);
    assert_eq!(a2["spec"]["schedule"]["expression"], "*/5 * * * *");
    let mixed = k.get_json(&["get", &v1, "-n", NS]);
    assert!(mixed["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["apiVersion"] == "stable.example.com/v1" && o["spec"]["cronSpec"].is_string()));

    // ValidatingAdmissionPolicies written against v1, no longer the storage version. One
    // matching writes through v2 as equivalent sees them in v1 (converted by the webhook);
    // one for v1 only (Exact) judges writes through v1, stored as v2, and not those through
    // v2. Server-side dry runs, so nothing is left behind.
    let policy = |name: &str, match_policy: &str, reserved: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "matchConstraints": {"matchPolicy": match_policy,
                    "objectSelector": {"matchLabels": {"policy": "yes"}},
                    "resourceRules": [{"operations": ["CREATE"], "apiGroups": [GROUP],
                                       "apiVersions": ["v1"], "resources": ["crontabs"]}]},
                "validations": [{
                    "expression": format!("object.spec.cronSpec != '{reserved}'"),
                    "messageExpression": format!(
                        "'{reserved} is reserved (' + request.resource.version + ' through ' \
                         + request.requestResource.version + ', ' + object.apiVersion + ')'"
                    )}]}
        })
    };
    let binding = |name: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"]}})
    };
    k.create(
        &json!({"apiVersion": "v1", "kind": "List", "metadata": {"name": "policies"},
        "items": [policy("midnight-v1", "Equivalent", "0 0 * * *"),
                  policy("four-v1-only", "Exact", "4 4 * * *"),
                  binding("midnight-v1"), binding("four-v1-only")]}),
    );
    let dry_run = |version: &str, schedule: &str| {
        let file = k.dir.path().join("judged.json");
        let obj = crontab(version, "judged", schedule, json!({"policy": "yes"}));
        std::fs::write(&file, obj.to_string()).unwrap();
        k.run(&["create", "--dry-run=server", "-f", file.to_str().unwrap()])
    };
    // The policies and bindings are read from the watch cache a moment after the write;
    // once the last binding is seen, the others are too.
    let err = eventually(
        "the v1-only policy in force",
        Duration::from_secs(20),
        || {
            let out = dry_run("v1", "4 4 * * *");
            (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
        },
    );
    assert!(
        err.contains(
            "ValidatingAdmissionPolicy 'four-v1-only' with binding 'four-v1-only' denied request: \
             4 4 * * * is reserved (v1 through v1, stable.example.com/v1)"
        ),
        "{err}"
    );
    let err = expect_failure(
        "a reserved schedule through v2",
        &dry_run("v2", "0 0 * * *"),
    );
    assert!(
        err.contains(
            "ValidatingAdmissionPolicy 'midnight-v1' with binding 'midnight-v1' denied request: \
             0 0 * * * is reserved (v1 through v2, stable.example.com/v1)"
        ),
        "{err}"
    );
    // Through v2 the v1-only policy does not apply, and the equivalent one sees cronSpec.
    expect_success("a v1-only schedule through v2", &dry_run("v2", "4 4 * * *"));

    // A mutating webhook registered for v1, matching writes through v2 as equivalent, sees
    // the object in v1 and patches it in v1; the result is stored in v2.
    let mutating = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "crontabs-v1"},
        "webhooks": [{"name": "crontabs-v1.stable.example.com", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "matchPolicy": "Equivalent",
            "clientConfig": {"url": "https://x/mutate"},
            "objectSelector": {"matchLabels": {"mutate": "yes"}},
            "rules": [{"operations": ["CREATE"], "apiGroups": [GROUP],
                       "apiVersions": ["v1"], "resources": ["crontabs"]}]},
            {"name": "crontabs-delete-v1.stable.example.com", "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "matchPolicy": "Exact",
            "clientConfig": {"url": "https://x/delete"},
            "objectSelector": {"matchLabels": {"mutate": "yes"}},
            "rules": [{"operations": ["DELETE"], "apiGroups": [GROUP],
                       "apiVersions": ["v1"], "resources": ["crontabs"]}]}]
    });
    cluster.install_webhooks(&hooks, &[mutating]).await.unwrap();
    k.create(&crontab("v2", "m", "3 3 * * *", json!({"mutate": "yes"})));
    let seen = admitted
        .lock()
        .unwrap()
        .pop()
        .expect("the mutating webhook was called");
    assert_eq!(
        seen["kind"],
        json!({"group": GROUP, "version": "v1", "kind": "CronTab"})
    );
    assert_eq!(seen["requestKind"]["version"], "v2");
    assert_eq!(seen["object"]["apiVersion"], "stable.example.com/v1");
    assert_eq!(seen["object"]["spec"]["cronSpec"], "3 3 * * *", "{seen}");
    let raw = stored(&cluster, "m").await;
    assert_eq!(raw["apiVersion"], "stable.example.com/v2");
    assert_eq!(raw["spec"]["schedule"]["expression"], "9 9 * * *", "{raw}");
    // A DELETE through v1 of that v2 object is admitted as made through v1: the webhook
    // registered for v1 only (Exact) matches it and sees the old object in v1.
    k.ok(&["delete", &v1, "m", "-n", NS, "--wait=false"]);
    let seen = admitted
        .lock()
        .unwrap()
        .pop()
        .expect("the DELETE webhook was called");
    assert_eq!(seen["operation"], "DELETE");
    assert_eq!(seen["resource"]["version"], "v1");
    assert_eq!(seen["requestKind"]["version"], "v1");
    assert_eq!(seen["oldObject"]["spec"]["cronSpec"], "9 9 * * *", "{seen}");

    // A conversion the webhook refuses (of an object created as v2, stored as v2 without
    // one): upstream's message for a read in v1, and the v1 watch ends with an ERROR event.
    k.create(&crontab(
        "v2",
        "refused",
        "2 2 * * *",
        json!({"convert": "refuse"}),
    ));
    let err = expect_failure(
        "get of an object the webhook cannot convert",
        &k.run(&["get", &v1, "refused", "-n", NS]),
    );
    assert!(
        err.contains(
            "conversion webhook for stable.example.com/v2, Kind=CronTab failed: cannot convert refused to stable.example.com/v1"
        ),
        "{err}"
    );
    w1.wait_for("conversion webhook for stable.example.com/v2, Kind=CronTab failed");
    let mut w1 = w1;
    eventually("the v1 watch to end", Duration::from_secs(20), || {
        w1.ended().then_some(())
    });
    drop(w1);
    // With nothing else converting: metadata-only reads in v1 (a GET and a paged LIST, as
    // metadata informers and the garbage collector make them) call no conversion webhook, so
    // they answer for the object it refuses.
    let before = reviews.load(Ordering::SeqCst);
    let resource = ApiResource::new(GROUP, "v1", "CronTab", "crontabs", true);
    let metadata: Api<DynamicObject> = Api::metadata(cluster.client(), &resource, Some(NS));
    let partial = metadata.get("refused").await.unwrap().0;
    assert_eq!(partial["kind"], "PartialObjectMetadata");
    assert_eq!(partial["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(partial["metadata"]["name"], "refused");
    let mut names = Vec::new();
    let mut params = ListParams {
        limit: Some(4),
        ..ListParams::default()
    };
    loop {
        let page = metadata.list(&params).await.unwrap();
        names.extend(page.items.iter().map(|o| o.0["metadata"]["name"].clone()));
        assert!(page
            .items
            .iter()
            .all(|o| o.0["kind"] == "PartialObjectMetadata"));
        match page.continue_token {
            Some(c) => params.continue_token = Some(c),
            None => break,
        }
    }
    assert!(names.contains(&json!("refused")), "{names:?}");
    assert_eq!(reviews.load(Ordering::SeqCst), before, "no conversion");
    drop(hooks);
    cluster.stop().await;
}
