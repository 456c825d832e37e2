//! End to end: a cluster moves from the embedded store to etcd with `setpoint store export` /
//! `setpoint store import`, and its objects keep their uids, generations, creation timestamps
//! and managed fields.
//!
//! Skipped (with a message) when etcd or kubectl is missing, unless `SETPOINT_REQUIRE_ETCD` /
//! `SETPOINT_REQUIRE_KUBECTL` is set (CI sets both).

use std::process::{Command, Output};

mod support;

use support::{Etcd, Setpoint};

/// An object's metadata (with managed fields), less `resourceVersion`, which is the one
/// thing a move between stores changes.
fn metadata(server: &Setpoint, args: &[&str]) -> serde_json::Value {
    let mut full = args.to_vec();
    full.extend(["-o", "json", "--show-managed-fields"]);
    let obj: serde_json::Value = serde_json::from_str(&server.ok(&full)).unwrap();
    let mut meta = obj["metadata"].clone();
    meta.as_object_mut().unwrap().remove("resourceVersion");
    meta
}

/// Runs `setpoint store …`.
fn store_cmd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .arg("store")
        .args(args)
        .env("SETPOINT_LOG", "warn")
        .output()
        .expect("run setpoint store")
}

fn store_ok(args: &[&str]) -> String {
    let out = store_cmd(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "setpoint store {args:?} failed:\n{stderr}"
    );
    stderr
}

fn store_fails(args: &[&str]) -> String {
    let out = store_cmd(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "setpoint store {args:?} unexpectedly succeeded:\n{stderr}"
    );
    stderr
}

#[test]
fn embedded_to_etcd_keeps_objects() {
    if !support::kubectl_available() {
        return;
    }
    let Some(etcd) = Etcd::start() else {
        return;
    };
    let embedded_dir = tempfile::tempdir().unwrap();
    let embedded_data = embedded_dir.path().to_str().unwrap();

    let source = Setpoint::up(embedded_dir.path());
    source.ok(&["create", "namespace", "demo"]);
    source.ok(&[
        "-n",
        "demo",
        "create",
        "deployment",
        "web",
        "--image=nginx:1.25",
    ]);
    // A spec change bumps the generation past 1, so it is something to preserve.
    source.ok(&["-n", "demo", "scale", "deployment", "web", "--replicas=3"]);
    source.ok(&[
        "-n",
        "demo",
        "create",
        "service",
        "clusterip",
        "web",
        "--tcp=80:80",
    ]);
    let deployment = metadata(&source, &["-n", "demo", "get", "deployment", "web"]);
    assert_eq!(deployment["generation"], 2, "{deployment}");
    let service = metadata(&source, &["-n", "demo", "get", "service", "web"]);
    let cluster_ip = source.ok(&[
        "-n",
        "demo",
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);

    // The running server holds the store's lock: the export says so rather than failing
    // obscurely.
    let err = store_fails(&["export", "--data-dir", embedded_data, "--output", "-"]);
    assert!(err.contains("stop the setpoint server"), "{err}");
    source.stop();

    let export_file = embedded_dir.path().join("cluster.export");
    let export_path = export_file.to_str().unwrap();
    let said = store_ok(&[
        "export",
        "--data-dir",
        embedded_data,
        "--output",
        export_path,
    ]);
    assert!(said.contains("exported"), "{said}");
    let text = std::fs::read_to_string(&export_file).unwrap();
    assert!(text.starts_with("{\"format\":\"setpoint-export\",\"version\":1,"));
    assert!(text.contains("/registry/_allocations/serviceips/"));
    // Objects are embedded as JSON, readable with text tools.
    assert!(text.contains(&format!(
        "\"uid\":\"{}\"",
        deployment["uid"].as_str().unwrap()
    )));

    let etcd_flags = ["--store", "etcd", "--etcd-endpoints", &etcd.url];
    let import = |extra: &[&'static str]| {
        let mut args = vec!["import", "--input", export_path];
        args.extend(etcd_flags);
        args.extend(extra.iter().copied());
        args
    };
    store_ok(&import(&[]));
    // A second import finds the store non-empty, and is refused unless forced.
    let err = store_fails(&import(&[]));
    assert!(err.contains("not empty"), "{err}");
    let said = store_ok(&import(&["--force"]));
    assert!(said.contains("overwriting"), "{said}");

    // A server on etcd, with the first cluster's certificates (so its kubeconfig still works
    // and the service account tokens it signed stay valid).
    let etcd_dir = tempfile::tempdir().unwrap();
    let pki = etcd_dir.path().join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    for entry in std::fs::read_dir(embedded_dir.path().join("pki")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), pki.join(entry.file_name())).unwrap();
    }
    let mut server_args = vec!["server"];
    server_args.extend(etcd_flags);
    let target = Setpoint::start(&server_args, etcd_dir.path());
    assert_eq!(
        metadata(&target, &["-n", "demo", "get", "deployment", "web"]),
        deployment
    );
    assert_eq!(
        metadata(&target, &["-n", "demo", "get", "service", "web"]),
        service
    );
    assert_eq!(
        target.ok(&[
            "-n",
            "demo",
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ]),
        cluster_ip
    );
    // The allocation moved with the service: a new service gets a different address.
    target.ok(&[
        "-n",
        "demo",
        "create",
        "service",
        "clusterip",
        "other",
        "--tcp=80:80",
    ]);
    let other_ip = target.ok(&[
        "-n",
        "demo",
        "get",
        "service",
        "other",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    assert_ne!(other_ip, cluster_ip);
    target.stop();

    // And back with `store migrate`: etcd → a fresh embedded data dir holds the same bytes.
    let back_dir = tempfile::tempdir().unwrap();
    let back_data = back_dir.path().to_str().unwrap();
    let from = format!("etcd:{}", etcd.url);
    let to = format!("embedded:{back_data}");
    let said = store_ok(&["migrate", "--from", &from, "--to", &to]);
    assert!(said.contains("copied"), "{said}");
    let err = store_fails(&["migrate", "--from", &from, "--to", &to]);
    assert!(err.contains("not empty"), "{err}");
    let back_file = back_dir.path().join("back.export");
    let back_path = back_file.to_str().unwrap();
    store_ok(&["export", "--data-dir", back_data, "--output", back_path]);
    let back_text = std::fs::read_to_string(&back_file).unwrap();
    let deployment_line = |t: &str| {
        t.lines()
            .find(|l| l.contains("\"/registry/apps/deployments/demo/web\""))
            .map(str::to_owned)
    };
    assert!(deployment_line(&text).is_some());
    assert_eq!(deployment_line(&back_text), deployment_line(&text));
}
