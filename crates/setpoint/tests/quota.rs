//! End to end with the real kubectl against `setpoint up`: namespace defaults (the `default`
//! ServiceAccount and `kube-root-ca.crt`, within a second of the namespace, and put back
//! when deleted), a ResourceQuota that refuses the pod over its limit with upstream's
//! message and follows deletes, `kubectl describe quota`, and LimitRange defaults and
//! bounds.
//!
//! Skipped (with a message) when kubectl is missing, unless `SETPOINT_REQUIRE_KUBECTL` is set.

use std::time::Duration;

mod support;

use support::{eventually, expect_failure, Setpoint};

const WAIT: Duration = Duration::from_secs(20);

/// A pod that sleeps, with a name and extra container YAML (indented for the container).
fn pod(name: &str, ns: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: busybox\n    command: [sleep, '300']\n{container_extra}"
    )
}

/// `kubectl get <what> -n <ns> -o jsonpath=<path>`, or `None` if it fails.
fn jsonpath(s: &Setpoint, what: &[&str], ns: &str, path: &str) -> Option<String> {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let p = format!("jsonpath={path}");
    args.extend_from_slice(&["-n", ns, "-o", &p]);
    let out = s.kubectl(&args);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

fn seconds(ts: &str) -> i64 {
    setpoint_api::time::parse_time(ts.trim())
        .unwrap_or_else(|e| panic!("timestamp {ts:?}: {e}"))
        .timestamp()
}

/// `kubectl apply` of a manifest, returning the output whether it succeeded or not.
fn apply_output(s: &Setpoint, manifest: &str, extra: &[&str]) -> std::process::Output {
    let file = s.home().join(format!(
        "try-{}.yaml",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::write(&file, manifest).unwrap();
    let mut args = vec!["apply", "-f", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    s.kubectl(&args)
}

#[test]
fn namespace_defaults_quotas_and_limit_ranges() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::up(&dir.path().join("data"));

    // Namespace defaults: both appear, stamped within a second of the namespace.
    s.ok(&["create", "namespace", "team"]);
    let ns_created = seconds(
        &jsonpath(
            &s,
            &["namespace", "team"],
            "team",
            "{.metadata.creationTimestamp}",
        )
        .unwrap(),
    );
    let sa_created = eventually("the default ServiceAccount", WAIT, || {
        jsonpath(
            &s,
            &["serviceaccount", "default"],
            "team",
            "{.metadata.creationTimestamp}",
        )
    });
    let cm_created = eventually("kube-root-ca.crt", WAIT, || {
        jsonpath(
            &s,
            &["configmap", "kube-root-ca.crt"],
            "team",
            "{.metadata.creationTimestamp}",
        )
    });
    assert!(
        seconds(&sa_created) - ns_created <= 1,
        "{sa_created} vs {ns_created}"
    );
    assert!(
        seconds(&cm_created) - ns_created <= 1,
        "{cm_created} vs {ns_created}"
    );
    // The published CA is the one the admin kubeconfig trusts.
    let ca = jsonpath(
        &s,
        &["configmap", "kube-root-ca.crt"],
        "team",
        r"{.data.ca\.crt}",
    )
    .unwrap();
    let trusted = std::fs::read_to_string(s.data_dir.join("pki").join("ca.crt")).unwrap();
    assert_eq!(ca.trim(), trusted.trim());
    let description = jsonpath(
        &s,
        &["configmap", "kube-root-ca.crt"],
        "team",
        r"{.metadata.annotations.kubernetes\.io/description}",
    )
    .unwrap();
    assert!(
        description.starts_with("Contains a CA bundle"),
        "{description}"
    );
    // Deleted: put back.
    let old_sa = jsonpath(
        &s,
        &["serviceaccount", "default"],
        "team",
        "{.metadata.uid}",
    )
    .unwrap();
    s.ok(&["delete", "serviceaccount", "default", "-n", "team"]);
    s.ok(&["delete", "configmap", "kube-root-ca.crt", "-n", "team"]);
    eventually("the default ServiceAccount again", WAIT, || {
        jsonpath(
            &s,
            &["serviceaccount", "default"],
            "team",
            "{.metadata.uid}",
        )
        .filter(|uid| *uid != old_sa)
    });
    eventually("kube-root-ca.crt again", WAIT, || {
        jsonpath(
            &s,
            &["configmap", "kube-root-ca.crt"],
            "team",
            r"{.data.ca\.crt}",
        )
        .filter(|c| c.trim() == ca.trim())
    });

    // A quota of two pods (and ConfigMaps, of which kube-root-ca.crt is one).
    s.ok(&[
        "create",
        "quota",
        "q",
        "--hard=pods=2,count/configmaps=3",
        "-n",
        "team",
    ]);
    let used = |what: &str| {
        jsonpath(
            &s,
            &["quota", "q"],
            "team",
            &format!("{{.status.used.{what}}}"),
        )
        .unwrap_or_default()
    };
    eventually("the quota's usage computed", WAIT, || {
        (used("pods") == "0").then_some(())
    });
    s.apply(&pod("p1", "team", ""));
    s.apply(&pod("p2", "team", ""));
    let out = apply_output(&s, &pod("p3", "team", ""), &[]);
    let err = expect_failure("a third pod", &out);
    assert!(
        err.contains(r#"pods "p3" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"#),
        "{err}"
    );
    let described = s.ok(&["describe", "quota", "q", "-n", "team"]);
    let row = |name: &str| {
        described
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
    };
    assert_eq!(
        row("pods"),
        Some(vec!["pods".into(), "2".into(), "2".into()]),
        "{described}"
    );
    assert_eq!(
        row("count/configmaps"),
        Some(vec!["count/configmaps".into(), "1".into(), "3".into()]),
        "{described}"
    );
    let table = s.ok(&["get", "quota", "q", "-n", "team"]);
    assert!(
        table.contains("count/configmaps: 1/3, pods: 2/2"),
        "{table}"
    );
    // Usage follows deletes: then the third pod fits.
    s.ok(&["delete", "pod", "p1", "-n", "team", "--wait=true"]);
    eventually("pods usage after the delete", WAIT, || {
        (used("pods") == "1").then_some(())
    });
    s.apply(&pod("p3", "team", ""));
    s.ok(&["create", "configmap", "extra", "-n", "team"]);
    eventually("configmap usage after a create", WAIT, || {
        (used("count/configmaps") == "2").then_some(())
    });
    s.ok(&["delete", "configmap", "extra", "-n", "team"]);
    eventually("configmap usage after a delete", WAIT, || {
        (used("count/configmaps") == "1").then_some(())
    });

    // LimitRange: defaults on a pod that sets no resources, and a maximum.
    s.ok(&["create", "namespace", "limited"]);
    s.apply("apiVersion: v1\nkind: LimitRange\nmetadata:\n  name: lr\n  namespace: limited\nspec:\n  limits:\n  - type: Container\n    max: {cpu: '2'}\n    default: {cpu: 500m, memory: 128Mi}\n    defaultRequest: {cpu: 100m}\n");
    // Admission reads LimitRanges from its cache: wait until a dry run shows the default.
    eventually("the LimitRange in force", WAIT, || {
        let out = apply_output(
            &s,
            &pod("probe", "limited", ""),
            &[
                "--dry-run=server",
                "-o",
                "jsonpath={.spec.containers[0].resources.limits.cpu}",
            ],
        );
        (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "500m")
            .then_some(())
    });
    s.apply(&pod("plain", "limited", ""));
    let resources = jsonpath(
        &s,
        &["pod", "plain"],
        "limited",
        "{.spec.containers[0].resources}",
    )
    .unwrap();
    let resources: serde_json::Value = serde_json::from_str(&resources).unwrap();
    assert_eq!(
        resources,
        serde_json::json!({"limits": {"cpu": "500m", "memory": "128Mi"},
                           "requests": {"cpu": "100m", "memory": "128Mi"}})
    );
    let out = apply_output(
        &s,
        &pod(
            "big",
            "limited",
            "    resources:\n      limits: {cpu: '3'}\n",
        ),
        &[],
    );
    let err = expect_failure("a pod over the maximum", &out);
    assert!(
        err.contains(
            r#"pods "big" is forbidden: maximum cpu usage per Container is 2, but limit is 3"#
        ),
        "{err}"
    );
    s.stop();
}

/// A background `setpoint` component, killed when dropped.
struct Component(std::process::Child);

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_standalone_controller_manager_publishes_its_kubeconfigs_ca() {
    if !support::kubectl_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Setpoint::start(&["server"], &dir.path().join("data"));
    let _cm = Component(
        std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args([
                "controller-manager",
                "--leader-elect=false",
                "--secure-port",
                "0",
            ])
            .arg("--kubeconfig")
            .arg(&s.kubeconfig)
            .env("SETPOINT_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the controller manager"),
    );
    s.ok(&["create", "namespace", "solo"]);
    let ca = eventually("kube-root-ca.crt", WAIT, || {
        jsonpath(
            &s,
            &["configmap", "kube-root-ca.crt"],
            "solo",
            r"{.data.ca\.crt}",
        )
    });
    let trusted = std::fs::read_to_string(s.data_dir.join("pki").join("ca.crt")).unwrap();
    assert_eq!(ca.trim(), trusted.trim());
    eventually("the default ServiceAccount", WAIT, || {
        jsonpath(
            &s,
            &["serviceaccount", "default"],
            "solo",
            "{.metadata.name}",
        )
    });
    s.stop();
}
