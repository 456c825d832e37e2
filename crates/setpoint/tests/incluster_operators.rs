//! End to end: operators deployed as Deployments *inside* the cluster, on a process node,
//! find the API server through the standard in-cluster configuration (the
//! `KUBERNETES_SERVICE_HOST`/`_PORT` variables and the `kube-api-access-*` volume the
//! `ServiceAccount` admission step adds) and act as their service account, so RBAC decides
//! what they may do: `examples/namespace-defaults` (Setpoint's runtime client,
//! `Client::try_default()`) with the manifests of its README, and a kopf operator (the Python
//! client's `load_incluster_config()`). With their ClusterRoleBinding removed they get 403s
//! and say so in their logs. A pod with `automountServiceAccountToken: false` gets nothing
//! mounted, and a pod naming a missing account is refused with upstream's message.
//!
//! The kopf part is skipped (with a message) when kopf is missing, unless
//! `SETPOINT_REQUIRE_KOPF` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;

use support::{eventually, lines, Setpoint};

/// How long a Deployment's pod may take to run, and an operator to act.
const WITHIN: Duration = Duration::from_secs(90);

/// Where the token volume is mounted in every container.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The example's README, whose first `yaml` block is the operator's deployment.
const README: &str = include_str!("../../../examples/namespace-defaults/README.md");

/// The first ```yaml block of `markdown`.
fn first_yaml_block(markdown: &str) -> String {
    let start = markdown.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let len = markdown[start..].find("```").expect("the block ends");
    markdown[start..start + len].to_string()
}

/// Builds the example operator and returns its path (next to the `setpoint` binary, in the
/// same profile's target directory).
fn namespace_defaults_binary() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "namespace-defaults",
            "--bin",
            "namespace-defaults",
        ])
        .current_dir(&workspace)
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build -p namespace-defaults failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = Path::new(env!("CARGO_BIN_EXE_setpoint"))
        .parent()
        .unwrap()
        .join("namespace-defaults");
    assert!(bin.exists(), "{} was not built", bin.display());
    bin
}

/// The name of the running pod labelled `app=<app>` in `namespace`, once there is one whose
/// container has started.
fn running_pod(s: &Setpoint, namespace: &str, app: &str) -> String {
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_running_pod(s, namespace, app)
    }));
    match found {
        Ok(pod) => pod,
        Err(_) => {
            let describe = s.kubectl(&["-n", namespace, "describe", "pods"]);
            panic!(
                "no running {app} pod:\n{}",
                String::from_utf8_lossy(&describe.stdout)
            )
        }
    }
}

fn wait_running_pod(s: &Setpoint, namespace: &str, app: &str) -> String {
    eventually(&format!("a running {app} pod"), WITHIN, || {
        let out = s.ok(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            &format!("app={app}"),
            "-o",
            r#"jsonpath={range .items[?(@.status.phase=="Running")]}{.metadata.name}{"\n"}{end}"#,
        ]);
        lines(&out).into_iter().next()
    })
}

/// The pod's log (empty while it has none).
fn pod_log(s: &Setpoint, namespace: &str, pod: &str) -> String {
    let out = s.kubectl(&["-n", namespace, "logs", pod]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What admission gave the pod: its account, and for each container the volume mounted at
/// the token path.
fn token_mounts(s: &Setpoint, namespace: &str, pod: &str) -> (String, String) {
    let account = s.ok(&[
        "-n",
        namespace,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.spec.serviceAccountName}",
    ]);
    let mounts = s.ok(&[
        "-n",
        namespace,
        "get",
        "pod",
        pod,
        "-o",
        &format!(
            r#"jsonpath={{range .spec.containers[*].volumeMounts[?(@.mountPath=="{TOKEN_PATH}")]}}{{.name}}{{end}}"#
        ),
    ]);
    (account, mounts)
}

#[test]
fn namespace_defaults_runs_in_the_cluster_as_its_service_account() {
    if !support::kubectl_available() {
        return;
    }
    let operator = namespace_defaults_binary();
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    let manifests = first_yaml_block(README);
    assert!(manifests.contains("/usr/local/bin/namespace-defaults"));
    s.apply(&manifests.replace(
        "/usr/local/bin/namespace-defaults",
        operator.to_str().unwrap(),
    ));
    let pod = running_pod(&s, "namespace-defaults", "namespace-defaults");
    let (account, mount) = token_mounts(&s, "namespace-defaults", &pod);
    assert_eq!(account, "namespace-defaults");
    assert!(mount.starts_with("kube-api-access-"), "{mount:?}");

    s.ok(&["create", "namespace", "team-a"]);
    s.ok(&[
        "label",
        "namespace",
        "team-a",
        "defaults.example.com/tier=gold",
    ]);
    eventually("the operator to fill team-a's ConfigMap", WITHIN, || {
        let out = s.kubectl(&[
            "-n",
            "team-a",
            "get",
            "configmap",
            "team-defaults",
            "-o",
            "jsonpath={.data.tier}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "gold").then_some(())
    });

    // Without its binding the service account may do nothing the operator needs: its next
    // write is refused, and it says so.
    s.ok(&["delete", "clusterrolebinding", "namespace-defaults"]);
    s.ok(&["create", "namespace", "team-b"]);
    let log = eventually("the operator to log the 403", WITHIN, || {
        let log = pod_log(&s, "namespace-defaults", &pod);
        log.contains("forbidden: RBAC does not allow this operator to create ConfigMaps")
            .then_some(log)
    });
    assert!(
        log.contains(
            r#"User \"system:serviceaccount:namespace-defaults:namespace-defaults\" cannot create resource \"configmaps\""#
        ) || log.contains(
            r#"User "system:serviceaccount:namespace-defaults:namespace-defaults" cannot create resource "configmaps""#
        ),
        "{log}"
    );
    let absent = s.kubectl(&["-n", "team-b", "get", "configmap", "team-defaults"]);
    assert!(!absent.status.success());
    s.stop();
}

const WIDGET_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

/// The kopf operator's account and what kopf needs: its resources and their status, events,
/// and the namespaces and CRDs it observes.
const KOPF_RBAC: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: kopf-operator
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: kopf-operator
  namespace: kopf-operator
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: kopf-operator
rules:
- apiGroups: [example.com]
  resources: [widgets]
  verbs: [get, list, watch, patch]
- apiGroups: [example.com]
  resources: [widgets/status]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kopf-operator
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: kopf-operator
subjects:
- kind: ServiceAccount
  name: kopf-operator
  namespace: kopf-operator
"#;

/// The Python interpreter that has kopf, by its real path (the pod's environment is empty,
/// so no shim that needs `HOME` or `PATH`), or `None` (after saying so) without kopf.
fn kopf_python() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import kopf, kubernetes, sys; print(sys.executable)"])
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => Some(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        _ => {
            assert!(
                std::env::var_os("SETPOINT_REQUIRE_KOPF").is_none(),
                "kopf is required (SETPOINT_REQUIRE_KOPF is set) but `import kopf, kubernetes` fails"
            );
            eprintln!("skipping: kopf (with the kubernetes client) is not installed");
            None
        }
    }
}

#[test]
fn kopf_operator_runs_in_the_cluster_as_its_service_account() {
    if !support::kubectl_available() {
        return;
    }
    let Some(python) = kopf_python() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let markers = data.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    s.apply(WIDGET_CRD);
    s.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=30s",
    ]);
    s.apply(KOPF_RBAC);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kopf/operator.py");
    s.apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: kopf-operator
  namespace: kopf-operator
spec:
  replicas: 1
  selector:
    matchLabels: {{app: kopf-operator}}
  template:
    metadata:
      labels: {{app: kopf-operator}}
    spec:
      serviceAccountName: kopf-operator
      containers:
      - name: operator
        image: python:3
        command: ["{python}", "-m", "kopf", "run", "--standalone", "--all-namespaces", "--verbose", "{script}"]
        env:
        - name: WIDGET_MARKERS
          value: "{markers}"
"#,
        markers = markers.display()
    ));
    let pod = running_pod(&s, "kopf-operator", "kopf-operator");
    let (account, mount) = token_mounts(&s, "kopf-operator", &pod);
    assert_eq!(account, "kopf-operator");
    assert!(mount.starts_with("kube-api-access-"), "{mount:?}");

    s.apply("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n");
    let message = eventually("kopf's create handler to report", WITHIN, || {
        let m = s.ok(&[
            "get",
            "widget",
            "w1",
            "-o",
            "jsonpath={.status.create_fn.message}",
        ]);
        (!m.is_empty()).then_some(m)
    });
    assert_eq!(
        message,
        "created w1 with size 3",
        "{}",
        pod_log(&s, "kopf-operator", &pod)
    );
    let log = pod_log(&s, "kopf-operator", &pod);
    assert!(
        log.contains("Client is configured in cluster with service account"),
        "kopf did not log in through the in-cluster configuration:\n{log}"
    );

    s.ok(&["delete", "clusterrolebinding", "kopf-operator"]);
    s.apply("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w2\nspec:\n  size: 4\n");
    let log = eventually("kopf to log the 403", WITHIN, || {
        let log = pod_log(&s, "kopf-operator", &pod);
        log.contains(r#"User "system:serviceaccount:kopf-operator:kopf-operator" cannot"#)
            .then_some(log)
    });
    assert!(log.contains("Forbidden") || log.contains("403"), "{log}");
    let handled = s.ok(&["get", "widget", "w2", "-o", "jsonpath={.status.create_fn}"]);
    assert!(handled.is_empty(), "w2 was handled without RBAC: {handled}");
    s.stop();
}

#[test]
fn automount_false_mounts_nothing_and_a_missing_account_is_refused() {
    if !support::kubectl_available() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&data.path().join("data"));
    // The pod's own `false`, and an account's `false`: neither pod gets the volume, and
    // neither sees a token.
    s.apply(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: quiet\nautomountServiceAccountToken: false\n",
    );
    let probe =
        format!("if [ -e {TOKEN_PATH}/token ]; then echo token; else echo no-token; fi; sleep 300");
    for (name, spec) in [
        ("own-setting", "automountServiceAccountToken: false"),
        ("account-setting", "serviceAccountName: quiet"),
    ] {
        s.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  {spec}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    command: [sh, -c, '{probe}']\n"
        ));
        let volumes = s.ok(&["get", "pod", name, "-o", "jsonpath={.spec.volumes}"]);
        assert_eq!(volumes, "", "{name}");
        let mounts = s.ok(&[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.spec.containers[0].volumeMounts}",
        ]);
        assert_eq!(mounts, "", "{name}");
        eventually(&format!("{name} to say what it sees"), WITHIN, || {
            let log = pod_log(&s, "default", name);
            (!log.is_empty()).then_some(())
        });
        assert_eq!(pod_log(&s, "default", name).trim(), "no-token", "{name}");
    }
    let account = s.ok(&[
        "get",
        "pod",
        "own-setting",
        "-o",
        "jsonpath={.spec.serviceAccountName}/{.spec.serviceAccount}",
    ]);
    assert_eq!(account, "default/default");

    s.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: elsewhere\n");
    let refused = s.fails(&[
        "-n",
        "elsewhere",
        "run",
        "lost",
        "--image=busybox",
        "--overrides",
        r#"{"spec":{"serviceAccountName":"nosuch"}}"#,
        "--command",
        "--",
        "sleep",
        "300",
    ]);
    assert!(
        refused.contains(
            r#"pods "lost" is forbidden: error looking up service account elsewhere/nosuch: serviceaccount "nosuch" not found"#
        ),
        "{refused}"
    );
    // A missing namespace is reported as such, before any account is looked up.
    let missing = s.fails(&["-n", "nowhere", "run", "lost", "--image=busybox"]);
    assert!(
        missing.contains(r#"namespaces "nowhere" not found"#),
        "{missing}"
    );
    s.stop();
}
