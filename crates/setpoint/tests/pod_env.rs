//! A pod's environment from the API, end to end with the real kubectl against `setpoint up`
//! on a process node (`--container-runtime process`): `envFrom` a ConfigMap with a prefix
//! waits with `CreateContainerConfigError` (in `kubectl get pod` and the container's status,
//! with the kubelet's message) while the ConfigMap is missing and runs once it is created; a
//! Secret's key, resource fields and every pod field a variable may read; the variables of a
//! Service created before the pod, and `KUBERNETES_SERVICE_HOST`/`_PORT`: for a process pod
//! on the node's network (`--process-pod-network host`), the API server itself, which such a
//! pod reaches, unlike the master Service's cluster IP; for one in a network namespace of its
//! own (`bridge`, the default as root), the master Service, as for containers;
//! `enableServiceLinks: false` leaving only the latter; and an edit of the ConfigMap leaving
//! the running container's variable as it was, as upstream.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::{Duration, Instant};

mod support;

use support::{eventually, Setpoint};

const WAIT: Duration = Duration::from_secs(60);

/// `kubectl get <what> -o jsonpath=<path>`, or `None` if it fails or is empty.
fn jsonpath(s: &Setpoint, what: &[&str], path: &str) -> Option<String> {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &p]);
    let out = s.kubectl(&args);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn wait_running(s: &Setpoint, pod: &str) {
    eventually(&format!("pod {pod} Running"), WAIT, || {
        (jsonpath(s, &["pod", pod], "{.status.phase}").as_deref() == Some("Running")).then_some(())
    });
}

/// The variables the pod printed at its start (`env` sorted, then a marker line).
fn printed_env(s: &Setpoint, pod: &str) -> Vec<(String, String)> {
    let logs = eventually(&format!("{pod}'s environment"), WAIT, || {
        let logs = s.ok(&["logs", pod]);
        logs.contains("--- end").then_some(logs)
    });
    logs.lines()
        .take_while(|l| *l != "--- end")
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn var<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

const SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: backend-api
spec:
  selector:
    app: backend
  ports:
  - name: http
    port: 8080
    targetPort: 80
"#;

const SECRET: &str = r#"apiVersion: v1
kind: Secret
metadata:
  name: db
stringData:
  password: s3cret
"#;

fn config_map(color: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-settings\ndata:\n  color: {color}\n  size: L\n"
    )
}

/// The pod: prints its environment, sorted, then keeps running (`image`: what a process
/// pod ignores, or the local busybox image for a container).
fn pod_with_image(name: &str, links: bool, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app: demo
  annotations:
    team: core
spec:
  enableServiceLinks: {links}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "env | sort; echo '--- end'; while true; do sleep 1; done"]
    resources:
      requests:
        cpu: 100m
        memory: 32Mi
      limits:
        cpu: 500m
        memory: 64Mi
    envFrom:
    - prefix: CFG_
      configMapRef:
        name: app-settings
    env:
    - name: PASSWORD
      valueFrom:
        secretKeyRef:
          name: db
          key: password
    - name: MAYBE
      valueFrom:
        configMapKeyRef:
          name: not-there
          key: k
          optional: true
    - name: MEM_LIMIT_MI
      valueFrom:
        resourceFieldRef:
          resource: limits.memory
          divisor: 1Mi
    - name: CPU_REQUEST_M
      valueFrom:
        resourceFieldRef:
          containerName: main
          resource: requests.cpu
          divisor: 1m
    - name: CPU_LIMIT
      valueFrom:
        resourceFieldRef:
          resource: limits.cpu
    - name: POD_NAME
      valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
    - name: POD_NAMESPACE
      valueFrom: {{fieldRef: {{fieldPath: metadata.namespace}}}}
    - name: POD_UID
      valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}
    - name: APP
      valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['app']"}}}}
    - name: TEAM
      valueFrom: {{fieldRef: {{fieldPath: "metadata.annotations['team']"}}}}
    - name: NODE
      valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
    - name: ACCOUNT
      valueFrom: {{fieldRef: {{fieldPath: spec.serviceAccountName}}}}
    - name: HOST_IP
      valueFrom: {{fieldRef: {{fieldPath: status.hostIP}}}}
    - name: POD_IP
      valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}
    - name: POD_IPS
      valueFrom: {{fieldRef: {{fieldPath: status.podIPs}}}}
    - name: GREETING
      value: "$(CFG_color) from $(BACKEND_API_SERVICE_HOST)"
"#
    )
}

fn pod(name: &str, links: bool) -> String {
    pod_with_image(name, links, "busybox")
}

/// The pod waits for its missing ConfigMap with the kubelet's message, then runs once it is
/// created.
fn waits_for_the_config_map(s: &Setpoint, pod: &str) {
    let message = eventually("CreateContainerConfigError", WAIT, || {
        let reason = jsonpath(
            s,
            &["pod", pod],
            "{.status.containerStatuses[0].state.waiting.reason}",
        )?;
        (reason == "CreateContainerConfigError").then(|| {
            jsonpath(
                s,
                &["pod", pod],
                "{.status.containerStatuses[0].state.waiting.message}",
            )
        })?
    });
    assert_eq!(message, "configmap \"app-settings\" not found");
    let table = s.ok(&["get", "pod", pod]);
    assert!(table.contains("CreateContainerConfigError"), "{table}");
    // Created, it reaches the waiting pod through the node's watch of that one object.
    let created = Instant::now();
    s.apply(&config_map("blue"));
    wait_running(s, pod);
    eprintln!(
        "{pod} Running {:?} after its ConfigMap was created",
        created.elapsed()
    );
}

/// The same on a containerd node: the container in its own network namespace gets the
/// master Service's cluster IP, as upstream.
#[test]
fn containers_get_their_environment_from_the_api() {
    if !support::kubectl_available() || !support::containerd_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["up", "--container-runtime", "cri"], dir.path());
    s.apply(SERVICE);
    s.apply(SECRET);
    s.apply(&pod_with_image("ctr-env", true, "setpoint.local/busybox:1"));
    waits_for_the_config_map(&s, "ctr-env");
    let env = printed_env(&s, "ctr-env");
    let pod_ip = jsonpath(&s, &["pod", "ctr-env"], "{.status.podIP}").unwrap();
    let backend = jsonpath(&s, &["service", "backend-api"], "{.spec.clusterIP}").unwrap();
    let master = jsonpath(&s, &["service", "kubernetes"], "{.spec.clusterIP}").unwrap();
    for (name, value) in [
        ("CFG_color", "blue"),
        ("PASSWORD", "s3cret"),
        ("MEM_LIMIT_MI", "64"),
        ("CPU_REQUEST_M", "100"),
        ("POD_NAME", "ctr-env"),
        ("POD_IP", pod_ip.as_str()),
        ("BACKEND_API_SERVICE_HOST", backend.as_str()),
        ("BACKEND_API_SERVICE_PORT_HTTP", "8080"),
        ("KUBERNETES_SERVICE_HOST", master.as_str()),
        ("KUBERNETES_SERVICE_PORT", "443"),
    ] {
        assert_eq!(var(&env, name), Some(value), "{name} in {env:?}");
    }
    s.ok(&["delete", "pod", "ctr-env", "--wait=true"]);
    s.stop();
}

#[test]
fn process_pods_get_their_environment_from_the_api() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(
        &["up", "--container-runtime", "process"],
        &dir.path().join("data"),
    );
    s.apply(SERVICE);
    s.apply(SECRET);
    s.apply(&pod("env-demo", true));

    // The ConfigMap is missing: the container waits, saying so in the kubelet's words.
    waits_for_the_config_map(&s, "env-demo");

    let env = printed_env(&s, "env-demo");
    let uid = jsonpath(&s, &["pod", "env-demo"], "{.metadata.uid}").unwrap();
    let pod_ip = jsonpath(&s, &["pod", "env-demo"], "{.status.podIP}").unwrap();
    let host_ip = jsonpath(&s, &["pod", "env-demo"], "{.status.hostIP}").unwrap();
    let node = jsonpath(&s, &["pod", "env-demo"], "{.spec.nodeName}").unwrap();
    let account =
        jsonpath(&s, &["pod", "env-demo"], "{.spec.serviceAccountName}").unwrap_or_default();
    let backend = jsonpath(&s, &["service", "backend-api"], "{.spec.clusterIP}").unwrap();
    // Where the pod reaches the API server depends on how the node networks process pods,
    // which it says on the Node.
    let network = jsonpath(
        &s,
        &["nodes"],
        r"{.items[0].metadata.annotations.setpoint\.io/process-pod-network}",
    )
    .unwrap();
    let on_node_network = network == "host";
    assert_eq!(
        pod_ip.parse::<std::net::IpAddr>().unwrap().is_loopback(),
        on_node_network,
        "pod IP {pod_ip} on a node whose process pod network is {network}"
    );
    let (api_host, api_port) = if on_node_network {
        let port = s.url.rsplit(':').next().unwrap().trim_end_matches('/');
        ("127.0.0.1".to_string(), port.to_string())
    } else {
        let master = jsonpath(&s, &["service", "kubernetes"], "{.spec.clusterIP}").unwrap();
        (master, "443".to_string())
    };
    let expected = [
        ("CFG_color", "blue"),
        ("CFG_size", "L"),
        ("PASSWORD", "s3cret"),
        ("MEM_LIMIT_MI", "64"),
        ("CPU_REQUEST_M", "100"),
        ("CPU_LIMIT", "1"),
        ("POD_NAME", "env-demo"),
        ("POD_NAMESPACE", "default"),
        ("POD_UID", &uid),
        ("APP", "demo"),
        ("TEAM", "core"),
        ("NODE", &node),
        ("ACCOUNT", &account),
        ("HOST_IP", &host_ip),
        ("POD_IP", &pod_ip),
        ("POD_IPS", &pod_ip),
        ("BACKEND_API_SERVICE_HOST", &backend),
        ("BACKEND_API_SERVICE_PORT", "8080"),
        ("BACKEND_API_SERVICE_PORT_HTTP", "8080"),
        ("BACKEND_API_PORT_8080_TCP_PROTO", "tcp"),
        ("KUBERNETES_SERVICE_HOST", &api_host),
        ("KUBERNETES_SERVICE_PORT", &api_port),
        ("KUBERNETES_SERVICE_PORT_HTTPS", &api_port),
    ];
    for (name, value) in expected {
        assert_eq!(var(&env, name), Some(value), "{name} in {env:?}");
    }
    let greeting = format!("blue from {backend}");
    assert_eq!(var(&env, "GREETING"), Some(greeting.as_str()));
    assert_eq!(
        var(&env, "BACKEND_API_PORT"),
        Some(format!("tcp://{backend}:8080").as_str())
    );
    assert_eq!(
        var(&env, "KUBERNETES_PORT"),
        Some(format!("tcp://{api_host}:{api_port}").as_str())
    );
    assert_eq!(var(&env, "MAYBE"), None);

    // Without service links only the master Service's variables are there.
    s.apply(&pod("no-links", false));
    wait_running(&s, "no-links");
    let env = printed_env(&s, "no-links");
    assert_eq!(var(&env, "BACKEND_API_SERVICE_HOST"), None, "{env:?}");
    assert_eq!(
        var(&env, "KUBERNETES_SERVICE_HOST"),
        Some(api_host.as_str())
    );
    assert_eq!(var(&env, "CFG_color"), Some("blue"));

    // An edit of the ConfigMap syncs the pod again (its watch) but changes no running
    // container's variable, and restarts nothing.
    s.apply(&config_map("red"));
    eventually("the edit in the API", WAIT, || {
        (jsonpath(&s, &["configmap", "app-settings"], "{.data.color}").as_deref() == Some("red"))
            .then_some(())
    });
    // A pod created after the edit sees it: the node's cache has it.
    s.apply(&pod("after-edit", true));
    wait_running(&s, "after-edit");
    assert_eq!(
        var(&printed_env(&s, "after-edit"), "CFG_color"),
        Some("red")
    );
    let value = s.ok(&["exec", "env-demo", "--", "printenv", "CFG_color"]);
    assert_eq!(value, "blue\n");
    assert_eq!(
        jsonpath(
            &s,
            &["pod", "env-demo"],
            "{.status.containerStatuses[0].restartCount}"
        )
        .as_deref(),
        Some("0")
    );
    s.stop();
}
