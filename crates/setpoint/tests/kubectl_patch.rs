//! End to end: strategic merge patch, JSON merge patch, JSON patch and client-side `kubectl
//! apply` with the real `kubectl` against `setpoint up`.
//!
//! After every command the stored object is read back with `kubectl get -o json` and compared
//! with what Kubernetes stores for the same sequence: the expected values below follow from the
//! patch semantics (merge keys, `$setElementOrder`, `$retainKeys`, deletions) plus the server's
//! defaulting, not from recordings.
//!
//! Skipped (with a message) when no kubectl is installed; CI installs it.

use std::path::Path;

use serde_json::{json, Value};

mod support;

use support::Setpoint;

/// `kubectl apply -f` of `yaml`, returning kubectl's one-line verdict.
fn apply(c: &Setpoint, dir: &Path, yaml: &str) -> String {
    let file = dir.join("manifest.yaml");
    std::fs::write(&file, yaml).unwrap();
    c.ok(&["apply", "-f", file.to_str().unwrap()])
        .trim()
        .to_string()
}

/// Deployment `name` in namespace `smp`, as stored.
fn get(c: &Setpoint, name: &str) -> Value {
    let out = c.ok(&["-n", "smp", "get", "deployment", name, "-o", "json"]);
    serde_json::from_str(&out).unwrap()
}

/// A container as the server stores it: the fields the manifest sets plus defaulting.
fn stored_container(mut c: Value) -> Value {
    let obj = c.as_object_mut().unwrap();
    obj.insert("imagePullPolicy".into(), json!("IfNotPresent"));
    obj.insert("resources".into(), json!({}));
    obj.insert(
        "terminationMessagePath".into(),
        json!("/dev/termination-log"),
    );
    obj.insert("terminationMessagePolicy".into(), json!("File"));
    if let Some(Value::Array(ports)) = obj.get_mut("ports") {
        for p in ports {
            p["protocol"] = json!("TCP");
        }
    }
    c
}

fn containers(d: &Value) -> &Value {
    &d["spec"]["template"]["spec"]["containers"]
}

const V1: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: smp
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.25
        ports:
        - containerPort: 80
        - containerPort: 443
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
      - name: side
        image: busybox:1.36
        args: [sleep, infinity]
"#;

/// V1 with: more replicas, a new image, an env var added, port 443 removed, the strategy block
/// deleted.
const V2: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: smp
  labels: {app: web}
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.28
        ports:
        - containerPort: 80
        env:
        - {name: A, value: "1"}
        - {name: B, value: "2"}
        - {name: C, value: "3"}
      - name: side
        image: busybox:1.36
        args: [sleep, infinity]
"#;

/// V2 with: the Recreate strategy, the sidecar removed, env var B removed.
const V3: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: smp
  labels: {app: web}
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  strategy:
    type: Recreate
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: nginx:1.28
        ports:
        - containerPort: 80
        env:
        - {name: A, value: "1"}
        - {name: C, value: "3"}
"#;

#[test]
fn kubectl_patch_and_client_side_apply() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // No node: this test is about patch semantics, and with pods Pending the controllers'
    // status writes settle, so resourceVersions move only when the test writes.
    let c = Setpoint::start(&["up", "--no-node"], data.path());
    c.ok(&["create", "namespace", "smp"]);

    // --- client-side apply creates, and a second apply changes nothing.
    assert_eq!(apply(&c, dir.path(), V1), "deployment.apps/web created");
    let v1 = get(&c, "web");
    let web_v1 = stored_container(json!({
        "name": "web", "image": "nginx:1.25",
        "ports": [{"containerPort": 80}, {"containerPort": 443}],
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
    }));
    let side = stored_container(
        json!({"name": "side", "image": "busybox:1.36", "args": ["sleep", "infinity"]}),
    );
    assert_eq!(containers(&v1), &json!([web_v1, side]));
    assert_eq!(
        v1["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    assert!(
        v1["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|s| s.contains("nginx:1.25"))
    );
    assert_eq!(apply(&c, dir.path(), V1), "deployment.apps/web unchanged");

    // --- kubectl patch (strategic by default): only that container's image changes.
    let out = c.ok(&[
        "-n",
        "smp",
        "patch",
        "deployment",
        "web",
        "--type=strategic",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","image":"nginx:1.26"}]}}}}"#,
    ]);
    assert!(out.contains("deployment.apps/web patched"), "{out}");
    let patched = get(&c, "web");
    let mut expected = v1["spec"].clone();
    expected["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.26");
    assert_eq!(patched["spec"], expected);

    // --- kubectl set image: $setElementOrder keeps both containers in place.
    c.ok(&[
        "-n",
        "smp",
        "set",
        "image",
        "deployment/web",
        "web=nginx:1.27",
    ]);
    let set = get(&c, "web");
    expected["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.27");
    assert_eq!(set["spec"], expected);

    // --- rollout pause / resume / restart are strategic merge patches of the spec.
    c.ok(&["-n", "smp", "rollout", "pause", "deployment/web"]);
    assert_eq!(get(&c, "web")["spec"]["paused"], json!(true));
    c.ok(&["-n", "smp", "rollout", "resume", "deployment/web"]);
    let resumed = get(&c, "web");
    assert!(resumed["spec"].get("paused").is_none(), "{resumed}");
    assert_eq!(resumed["spec"], expected);
    c.ok(&["-n", "smp", "rollout", "restart", "deployment/web"]);
    let restarted = get(&c, "web");
    let restarted_at = restarted["spec"]["template"]["metadata"]["annotations"]
        ["kubectl.kubernetes.io/restartedAt"]
        .clone();
    assert!(restarted_at.is_string(), "{restarted}");
    expected["template"]["metadata"]["annotations"] =
        json!({"kubectl.kubernetes.io/restartedAt": restarted_at});
    assert_eq!(restarted["spec"], expected);

    // --- a label added by hand survives re-applies (it is not in last-applied).
    c.ok(&["-n", "smp", "label", "deployment", "web", "tier=front"]);

    // --- re-apply with edits: replicas, image, env added, a port removed, strategy deleted.
    assert_eq!(apply(&c, dir.path(), V2), "deployment.apps/web configured");
    let v2 = get(&c, "web");
    assert_eq!(
        v2["metadata"]["labels"],
        json!({"app": "web", "tier": "front"})
    );
    assert_eq!(v2["spec"]["replicas"], json!(3));
    // The deleted strategy is removed, then defaulted again, as Kubernetes does.
    assert_eq!(
        v2["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
    );
    let web_v2 = stored_container(json!({
        "name": "web", "image": "nginx:1.28",
        "ports": [{"containerPort": 80}],
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}],
    }));
    assert_eq!(containers(&v2), &json!([web_v2, side]));
    // Changes made outside the manifest stay.
    assert_eq!(
        v2["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"],
        restarted_at
    );

    // --- re-apply: Recreate strategy ($retainKeys drops rollingUpdate), sidecar and env B gone.
    assert_eq!(apply(&c, dir.path(), V3), "deployment.apps/web configured");
    let v3 = get(&c, "web");
    assert_eq!(v3["spec"]["strategy"], json!({"type": "Recreate"}));
    let web_v3 = stored_container(json!({
        "name": "web", "image": "nginx:1.28",
        "ports": [{"containerPort": 80}],
        "env": [{"name": "A", "value": "1"}, {"name": "C", "value": "3"}],
    }));
    assert_eq!(containers(&v3), &json!([web_v3]));
    assert_eq!(
        v3["metadata"]["labels"],
        json!({"app": "web", "tier": "front"})
    );
    assert_eq!(apply(&c, dir.path(), V3), "deployment.apps/web unchanged");
    assert_eq!(get(&c, "web")["metadata"]["labels"]["tier"], json!("front"));

    // --- subresources take strategic merge patches too.
    c.ok(&[
        "-n",
        "smp",
        "patch",
        "deployment",
        "web",
        "--subresource=scale",
        "--type=strategic",
        "-p",
        r#"{"spec":{"replicas":4}}"#,
    ]);
    assert_eq!(get(&c, "web")["spec"]["replicas"], json!(4));
    // Condition types of their own: the in-process deployment controller keeps `Available`
    // and `Progressing` itself, and leaves other types alone.
    for (ty, reason) in [("ExampleA", "A"), ("ExampleP", "P"), ("ExampleA", "A2")] {
        let patch = json!({"status": {"conditions": [
            {"type": ty, "status": "True", "reason": reason, "message": "m"}
        ]}});
        c.ok(&[
            "-n",
            "smp",
            "patch",
            "deployment",
            "web",
            "--subresource=status",
            "--type=strategic",
            "-p",
            &patch.to_string(),
        ]);
    }
    let conditions = &get(&c, "web")["status"]["conditions"];
    let mut by_type: Vec<(String, String)> = conditions
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["type"].as_str().unwrap().starts_with("Example"))
        .map(|c| {
            (
                c["type"].as_str().unwrap().into(),
                c["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    by_type.sort();
    assert_eq!(
        by_type,
        [
            ("ExampleA".into(), "A2".into()),
            ("ExampleP".into(), "P".into())
        ]
    );

    // --- merge patch and JSON patch on env, on a second deployment.
    c.ok(&[
        "-n",
        "smp",
        "create",
        "deployment",
        "envs",
        "--image=nginx:1.25",
    ]);
    c.ok(&["-n", "smp", "set", "env", "deployment/envs", "A=1"]);
    assert_eq!(
        containers(&get(&c, "envs"))[0]["env"],
        json!([{"name": "A", "value": "1"}])
    );
    c.ok(&[
        "-n", "smp", "patch", "deployment", "envs", "--type=json", "-p",
        r#"[{"op":"add","path":"/spec/template/spec/containers/0/env/-","value":{"name":"B","value":"2"}},
            {"op":"replace","path":"/spec/template/spec/containers/0/env/0/value","value":"one"}]"#,
    ]);
    assert_eq!(
        containers(&get(&c, "envs"))[0]["env"],
        json!([{"name": "A", "value": "one"}, {"name": "B", "value": "2"}])
    );
    // A merge patch replaces lists whole: the container list becomes exactly the patch's.
    c.ok(&[
        "-n", "smp", "patch", "deployment", "envs", "--type=merge", "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"nginx","image":"nginx:1.26","env":[{"name":"C","value":"3"}]}]}}}}"#,
    ]);
    assert_eq!(
        containers(&get(&c, "envs")),
        &json!([stored_container(json!({
            "name": "nginx", "image": "nginx:1.26", "env": [{"name": "C", "value": "3"}],
        }))])
    );
    // The strategic version merges env by name; an item new to the list and sent without
    // $setElementOrder goes first, as in Kubernetes.
    c.ok(&[
        "-n", "smp", "patch", "deployment", "envs", "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"nginx","env":[{"name":"D","value":"4"}]}]}}}}"#,
    ]);
    assert_eq!(
        containers(&get(&c, "envs"))[0]["env"],
        json!([{"name": "D", "value": "4"}, {"name": "C", "value": "3"}])
    );

    // --- a failed JSON patch `test` is 422; a malformed strategic patch is 400.
    let rv_before = get(&c, "envs")["metadata"]["resourceVersion"].clone();
    let err = c.fails(&[
        "-n",
        "smp",
        "patch",
        "deployment",
        "envs",
        "--type=json",
        "-v=6",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":99}]"#,
    ]);
    assert!(err.contains("422"), "{err}");
    assert!(err.contains("The request is invalid"), "{err}");
    let err = c.fails(&[
        "-n",
        "smp",
        "patch",
        "deployment",
        "envs",
        "--type=strategic",
        "-v=6",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"image":"no-name"}]}}}}"#,
    ]);
    assert!(err.contains("400"), "{err}");
    assert!(err.contains("merge key"), "{err}");
    assert_eq!(get(&c, "envs")["metadata"]["resourceVersion"], rv_before);
}

/// The issue's reproduction: a patch that names another kind used to be stored, and every
/// Deployment informer then failed to decode its list, so no Deployment anywhere was
/// reconciled again. Each patch type is tried; none may store another type, and the
/// controllers go on reconciling.
#[test]
fn kubectl_patch_cannot_change_the_stored_kind() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let c = Setpoint::start(&["up", "--no-node"], data.path());
    c.ok(&["create", "deployment", "a", "--image=nginx"]);

    let refused = [
        ("merge", r#"{"kind":"Pod"}"#),
        ("merge", r#"{"kind":5}"#),
        ("merge", r#"{"apiVersion":"v1"}"#),
        ("merge", r#"{"metadata":5}"#),
        ("json", r#"[{"op":"replace","path":"/kind","value":"Pod"}]"#),
        (
            "json",
            r#"[{"op":"replace","path":"/apiVersion","value":"v1"}]"#,
        ),
    ];
    for (ty, patch) in refused {
        let err = c.fails(&["patch", "deployment", "a", "--type", ty, "-p", patch]);
        assert!(
            err.contains("is invalid: patch: Invalid value"),
            "{ty} {patch}: {err}"
        );
    }
    // Removing the type gets it back; a strategic merge patch decodes into the kind's type.
    for (ty, patch) in [
        ("merge", r#"{"kind":null,"apiVersion":null}"#),
        ("json", r#"[{"op":"remove","path":"/kind"}]"#),
        ("strategic", r#"{"kind":"Pod","apiVersion":"v1"}"#),
    ] {
        c.ok(&["patch", "deployment", "a", "--type", ty, "-p", patch]);
    }
    assert_eq!(
        c.ok(&[
            "get",
            "deployment",
            "a",
            "-o",
            "jsonpath={.kind} {.apiVersion}"
        ]),
        "Deployment apps/v1"
    );
    // A PUT of another kind is refused with upstream's 400.
    let mut body: Value =
        serde_json::from_str(&c.ok(&["get", "deployment", "a", "-o", "json"])).unwrap();
    body["kind"] = json!("Pod");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.json");
    std::fs::write(&file, body.to_string()).unwrap();
    let err = c.fails(&[
        "replace",
        "--raw",
        "/apis/apps/v1/namespaces/default/deployments/a",
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(
        err.contains("the kind in the data (Pod) does not match the expected kind (Deployment)"),
        "{err}"
    );

    // The controllers still reconcile Deployments: a new one gets its ReplicaSet.
    c.ok(&["create", "deployment", "b", "--image=nginx", "--replicas=2"]);
    support::eventually(
        "deployment b's ReplicaSet",
        std::time::Duration::from_secs(30),
        || {
            let out = c.ok(&["get", "rs", "-l", "app=b", "-o", "name"]);
            (!out.trim().is_empty()).then_some(())
        },
    );
}
