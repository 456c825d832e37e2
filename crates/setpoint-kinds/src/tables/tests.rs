//! Expected rows, reasoned out from what `kubectl get` prints against a 1.32 cluster.

use chrono::{DateTime, Duration, TimeZone, Utc};
use serde_json::{json, Value};

use super::{cells, columns, human_duration, row_conditions, Column};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 10, 12, 0, 0).unwrap()
}

/// A timestamp `secs` seconds before [`now`].
fn ago(secs: i64) -> String {
    (now() - Duration::seconds(secs))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

const MIN: i64 = 60;
const HOUR: i64 = 3600;
const DAY: i64 = 86400;

fn row(group: &str, kind: &str, obj: &Value) -> Vec<Value> {
    let row = cells(group, kind, obj, now());
    assert_eq!(
        row.len(),
        columns(group, kind).len(),
        "{group}/{kind}: one cell per column"
    );
    row
}

fn names(cols: &[Column]) -> Vec<&str> {
    cols.iter().map(|c| c.name).collect()
}

/// Column names with a `*` on the wide-only ones.
fn layout(group: &str, kind: &str) -> Vec<String> {
    columns(group, kind)
        .iter()
        .map(|c| {
            if c.priority > 0 {
                format!("{}*", c.name)
            } else {
                c.name.to_string()
            }
        })
        .collect()
}

// ---- human_duration -------------------------------------------------------------------------

#[test]
fn human_duration_boundaries() {
    let s = |secs: i64| human_duration(Duration::seconds(secs));
    // Slightly in the future is clock skew; more is nonsense.
    assert_eq!(human_duration(Duration::milliseconds(-2500)), "<invalid>");
    assert_eq!(s(-2), "<invalid>");
    assert_eq!(s(-1), "0s");
    assert_eq!(human_duration(Duration::milliseconds(-1500)), "0s");
    assert_eq!(human_duration(Duration::milliseconds(-500)), "0s");
    assert_eq!(s(0), "0s");
    assert_eq!(human_duration(Duration::milliseconds(1999)), "1s");
    assert_eq!(s(59), "59s");
    assert_eq!(s(119), "119s");
    assert_eq!(s(2 * MIN), "2m");
    assert_eq!(s(2 * MIN + 1), "2m1s");
    assert_eq!(s(5 * MIN + 30), "5m30s");
    assert_eq!(s(10 * MIN - 1), "9m59s");
    assert_eq!(s(10 * MIN), "10m");
    assert_eq!(s(10 * MIN + 59), "10m");
    assert_eq!(s(3 * HOUR - 1), "179m");
    assert_eq!(s(3 * HOUR), "3h");
    assert_eq!(s(3 * HOUR + 30 * MIN + 59), "3h30m");
    assert_eq!(s(8 * HOUR - 1), "7h59m");
    assert_eq!(s(8 * HOUR), "8h");
    assert_eq!(s(48 * HOUR - 1), "47h");
    assert_eq!(s(48 * HOUR), "2d");
    assert_eq!(s(49 * HOUR), "2d1h");
    assert_eq!(s(8 * DAY - 1), "7d23h");
    assert_eq!(s(8 * DAY), "8d");
    assert_eq!(s(365 * DAY), "365d");
    assert_eq!(s(2 * 365 * DAY - 1), "729d");
    assert_eq!(s(2 * 365 * DAY), "2y");
    assert_eq!(s(2 * 365 * DAY + DAY), "2y1d");
    assert_eq!(s(8 * 365 * DAY - 1), "7y364d");
    assert_eq!(s(8 * 365 * DAY), "8y");
    assert_eq!(s(20 * 365 * DAY + 100 * DAY), "20y");
}

// ---- general shape --------------------------------------------------------------------------

#[test]
fn every_builtin_kind_has_a_printer() {
    // Reviews are never listed, so they print nothing of their own.
    for k in crate::BUILTIN.iter().filter(|k| !k.create_only) {
        let cols = columns(k.group, k.kind);
        let name_cols: Vec<&Column> = cols.iter().filter(|c| c.format == "name").collect();
        assert_eq!(name_cols.len(), 1, "{}: one name column", k.kind);
        assert_eq!(name_cols[0].type_, "string");
        assert_eq!(name_cols[0].name, "Name");
        assert!(cols.len() > 1, "{} has its own columns", k.kind);
        for c in &cols {
            assert!(
                !c.description.is_empty(),
                "{}/{} has a description",
                k.kind,
                c.name
            );
            assert!(["string", "integer", "number", "boolean", "date"].contains(&c.type_));
        }
        // Cells line up with columns, and integer columns hold numbers, even for a bare object.
        for obj in [
            json!({}),
            json!({"metadata": {"name": "x"}, "spec": null, "status": null}),
        ] {
            let row = row(k.group, k.kind, &obj);
            for (c, cell) in cols.iter().zip(&row) {
                if c.type_ == "integer" {
                    assert!(cell.is_i64(), "{}/{}: {cell}", k.kind, c.name);
                }
            }
        }
    }
}

#[test]
fn column_json() {
    let cols = columns("", "Pod");
    assert_eq!(
        cols[0].to_json(),
        json!({"name": "Name", "type": "string", "format": "name", "description": cols[0].description, "priority": 0})
    );
    assert_eq!(cols[5].to_json()["priority"], 1);
}

#[test]
fn unknown_kind_gets_name_and_age() {
    assert_eq!(names(&columns("example.com", "Widget")), ["Name", "Age"]);
    let obj = json!({"metadata": {"name": "w", "creationTimestamp": ago(5 * MIN)}});
    assert_eq!(
        row("example.com", "Widget", &obj),
        [json!("w"), json!("5m")]
    );
    // A kind's name in another group is not that kind.
    assert_eq!(names(&columns("example.com", "Pod")), ["Name", "Age"]);
}

#[test]
fn missing_creation_timestamp_is_unknown() {
    let obj = json!({"metadata": {"name": "cm"}, "data": {"a": "1"}});
    assert_eq!(
        row("", "ConfigMap", &obj),
        [json!("cm"), json!(1), json!("<unknown>")]
    );
}

// ---- Pod ------------------------------------------------------------------------------------

fn pod(status: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web-7d4b9", "namespace": "default", "creationTimestamp": ago(5 * MIN)},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "nginx:1.27"}]},
        "status": status,
    })
}

fn running(ready: bool) -> Value {
    json!({"name": "main", "ready": ready, "restartCount": 0, "started": true,
           "state": {"running": {"startedAt": ago(4 * MIN)}}})
}

#[test]
fn pod_columns() {
    assert_eq!(
        layout("", "Pod"),
        [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP*",
            "Node*",
            "Nominated Node*",
            "Readiness Gates*"
        ]
    );
    assert!(columns("", "Pod").iter().all(|c| c.type_ == "string"));
}

#[test]
fn pod_running() {
    let p = pod(json!({
        "phase": "Running",
        "podIP": "10.244.0.7",
        "podIPs": [{"ip": "10.244.0.7"}, {"ip": "fd00::7"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [running(true)],
    }));
    assert_eq!(
        row("", "Pod", &p),
        [
            json!("web-7d4b9"),
            json!("1/1"),
            json!("Running"),
            json!("0"),
            json!("5m"),
            json!("10.244.0.7"),
            json!("node-1"),
            json!("<none>"),
            json!("<none>")
        ]
    );
    assert_eq!(row_conditions("", "Pod", &p), None);
}

#[test]
fn pod_pending_unscheduled() {
    let mut p = pod(json!({"phase": "Pending"}));
    p["spec"].as_object_mut().unwrap().remove("nodeName");
    assert_eq!(
        row("", "Pod", &p),
        [
            json!("web-7d4b9"),
            json!("0/1"),
            json!("Pending"),
            json!("0"),
            json!("5m"),
            json!("<none>"),
            json!("<none>"),
            json!("<none>"),
            json!("<none>")
        ]
    );
}

#[test]
fn pod_container_creating() {
    let p = pod(json!({
        "phase": "Pending",
        "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                               "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }));
    let r = row("", "Pod", &p);
    assert_eq!(
        r[1..4],
        [json!("0/1"), json!("ContainerCreating"), json!("0")]
    );
}

#[test]
fn pod_crash_loop_with_recent_restart() {
    let p = pod(json!({
        "phase": "Running",
        "podIPs": [{"ip": "10.244.0.8"}],
        "containerStatuses": [{
            "name": "main", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(2 * MIN + 5)}},
        }],
    }));
    let r = row("", "Pod", &p);
    assert_eq!(
        r[1..6],
        [
            json!("0/1"),
            json!("CrashLoopBackOff"),
            json!("3 (2m5s ago)"),
            json!("5m"),
            json!("10.244.0.8")
        ]
    );
}

#[test]
fn pod_restarts_without_finish_time_show_only_the_count() {
    let p = pod(json!({
        "phase": "Running",
        "containerStatuses": [{"name": "main", "ready": true, "restartCount": 2,
                               "state": {"running": {"startedAt": ago(60)}}}],
    }));
    assert_eq!(row("", "Pod", &p)[3], json!("2"));
}

#[test]
fn pod_completed_and_error() {
    let done = pod(json!({
        "phase": "Succeeded",
        "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ago(60)}}}],
    }));
    assert_eq!(
        row("", "Pod", &done)[1..3],
        [json!("0/1"), json!("Completed")]
    );
    assert_eq!(
        row_conditions("", "Pod", &done),
        Some(
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded",
                     "message": "The pod has completed successfully."}])
        )
    );

    let failed = pod(json!({
        "phase": "Failed",
        "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                               "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
    }));
    assert_eq!(row("", "Pod", &failed)[2], json!("Error"));
    assert_eq!(
        row_conditions("", "Pod", &failed).unwrap()[0]["reason"],
        "Failed"
    );
    assert_eq!(row_conditions("", "Service", &failed), None);
}

#[test]
fn pod_terminated_without_reason() {
    let exit = pod(json!({
        "phase": "Running",
        "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 137}}}],
    }));
    assert_eq!(row("", "Pod", &exit)[2], json!("ExitCode:137"));
    let signal = pod(json!({
        "phase": "Running",
        "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0, "signal": 9}}}],
    }));
    assert_eq!(row("", "Pod", &signal)[2], json!("Signal:9"));
}

#[test]
fn pod_first_container_decides_status() {
    let mut p = pod(json!({
        "phase": "Pending",
        "containerStatuses": [
            {"name": "a", "ready": false, "state": {"waiting": {"reason": "ImagePullBackOff"}}},
            {"name": "b", "ready": false, "state": {"waiting": {"reason": "ContainerCreating"}}},
        ],
    }));
    p["spec"]["containers"] = json!([{"name": "a"}, {"name": "b"}]);
    assert_eq!(
        row("", "Pod", &p)[1..3],
        [json!("0/2"), json!("ImagePullBackOff")]
    );
}

#[test]
fn pod_completed_container_next_to_running_one() {
    let statuses = json!([
        {"name": "job", "ready": false, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "proxy", "ready": true, "state": {"running": {}}},
    ]);
    let mut p = pod(json!({"phase": "Running", "containerStatuses": statuses,
                           "conditions": [{"type": "Ready", "status": "True"}]}));
    p["spec"]["containers"] = json!([{"name": "job"}, {"name": "proxy"}]);
    assert_eq!(row("", "Pod", &p)[1..3], [json!("1/2"), json!("Running")]);
    p["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    assert_eq!(row("", "Pod", &p)[1..3], [json!("1/2"), json!("NotReady")]);
}

fn init_pod(init_status: Value, containers_status: Value) -> Value {
    let mut p = pod(json!({
        "phase": "Pending",
        "initContainerStatuses": [init_status],
        "containerStatuses": containers_status,
    }));
    p["spec"]["initContainers"] = json!([{"name": "migrate", "image": "migrate:1"}]);
    p
}

#[test]
fn pod_init_running() {
    let p = init_pod(
        json!({"name": "migrate", "ready": false, "restartCount": 0, "state": {"running": {}}}),
        json!([{"name": "main", "ready": false, "state": {"waiting": {"reason": "PodInitializing"}}}]),
    );
    assert_eq!(
        row("", "Pod", &p)[1..4],
        [json!("0/1"), json!("Init:0/1"), json!("0")]
    );
    // An init container reported as PodInitializing counts as plainly in progress.
    let p = init_pod(
        json!({"name": "migrate", "state": {"waiting": {"reason": "PodInitializing"}}}),
        json!([{"name": "main", "ready": false, "state": {"waiting": {"reason": "PodInitializing"}}}]),
    );
    assert_eq!(row("", "Pod", &p)[2], json!("Init:0/1"));
}

#[test]
fn pod_init_second_of_two() {
    let mut p = pod(json!({
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
            {"name": "b", "state": {"running": {}}},
        ],
    }));
    p["spec"]["initContainers"] = json!([{"name": "a"}, {"name": "b"}]);
    assert_eq!(row("", "Pod", &p)[2], json!("Init:1/2"));
}

#[test]
fn pod_init_crash_loop() {
    let p = init_pod(
        json!({"name": "migrate", "ready": false, "restartCount": 4,
               "state": {"waiting": {"reason": "CrashLoopBackOff"}},
               "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": ago(30)}}}),
        json!([{"name": "main", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}}}]),
    );
    assert_eq!(
        row("", "Pod", &p)[1..4],
        [
            json!("0/1"),
            json!("Init:CrashLoopBackOff"),
            json!("4 (30s ago)")
        ]
    );
}

#[test]
fn pod_init_failed() {
    let p = init_pod(
        json!({"name": "migrate", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}),
        json!([]),
    );
    assert_eq!(row("", "Pod", &p)[2], json!("Init:Error"));
    let p = init_pod(
        json!({"name": "migrate", "state": {"terminated": {"exitCode": 2}}}),
        json!([]),
    );
    assert_eq!(row("", "Pod", &p)[2], json!("Init:ExitCode:2"));
    let p = init_pod(
        json!({"name": "migrate", "state": {"terminated": {"exitCode": 0, "signal": 15}}}),
        json!([]),
    );
    // Exit code 0 counts as success even with a signal.
    assert_eq!(row("", "Pod", &p)[2], json!("Pending"));
    let p = init_pod(
        json!({"name": "migrate", "state": {"terminated": {"exitCode": 143, "signal": 15}}}),
        json!([]),
    );
    assert_eq!(row("", "Pod", &p)[2], json!("Init:Signal:15"));
}

#[test]
fn pod_init_done_main_running() {
    let mut p = init_pod(
        json!({"name": "migrate", "restartCount": 1,
               "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
               "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(3 * MIN)}}}),
        json!([running(true)]),
    );
    p["status"]["phase"] = json!("Running");
    // Restarts of finished init containers no longer count.
    assert_eq!(
        row("", "Pod", &p)[1..4],
        [json!("1/1"), json!("Running"), json!("0")]
    );
}

#[test]
fn pod_with_sidecar() {
    let mut p = pod(json!({
        "phase": "Running",
        "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"}],
        "initContainerStatuses": [{
            "name": "proxy", "ready": true, "started": true, "restartCount": 1,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(10 * MIN)}},
        }],
        "containerStatuses": [running(true)],
    }));
    p["spec"]["initContainers"] =
        json!([{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}]);
    assert_eq!(
        row("", "Pod", &p)[1..4],
        [json!("2/2"), json!("Running"), json!("1 (10m ago)")]
    );

    // A sidecar that has not started yet holds up initialisation.
    p["status"]["initContainerStatuses"][0]["started"] = json!(false);
    p["status"]["initContainerStatuses"][0]["ready"] = json!(false);
    p["status"]["conditions"] = json!([]);
    p["status"]["containerStatuses"] = json!([]);
    assert_eq!(
        row("", "Pod", &p)[1..4],
        [json!("0/2"), json!("Init:0/1"), json!("1 (10m ago)")]
    );
}

#[test]
fn pod_terminating() {
    let mut p = pod(json!({"phase": "Running", "containerStatuses": [running(true)]}));
    p["metadata"]["deletionTimestamp"] = json!(ago(5));
    assert_eq!(row("", "Pod", &p)[2], json!("Terminating"));
    // Finished pods keep their final status while being deleted.
    p["status"] = json!({"phase": "Succeeded",
                         "containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]});
    assert_eq!(row("", "Pod", &p)[2], json!("Completed"));
}

#[test]
fn pod_node_lost() {
    let mut p = pod(json!({"phase": "Running", "reason": "NodeLost"}));
    assert_eq!(row("", "Pod", &p)[2], json!("NodeLost"));
    p["metadata"]["deletionTimestamp"] = json!(ago(5));
    assert_eq!(row("", "Pod", &p)[2], json!("Unknown"));
    p["status"]["reason"] = json!("Evicted");
    p["status"]["phase"] = json!("Failed");
    assert_eq!(row("", "Pod", &p)[2], json!("Evicted"));
}

#[test]
fn pod_scheduling_gated() {
    let p = pod(json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
    }));
    assert_eq!(row("", "Pod", &p)[2], json!("SchedulingGated"));
}

#[test]
fn pod_wide_columns() {
    let mut p = pod(json!({
        "phase": "Pending",
        "podIP": "10.0.0.9",
        "nominatedNodeName": "node-2",
        "conditions": [
            {"type": "example.com/lb", "status": "True"},
            {"type": "example.com/dns", "status": "False"},
        ],
    }));
    p["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}, {"conditionType": "example.com/other"}]);
    // With only the singular podIP set, it is the IP shown.
    assert_eq!(
        row("", "Pod", &p)[5..],
        [
            json!("10.0.0.9"),
            json!("node-1"),
            json!("node-2"),
            json!("1/3")
        ]
    );
}

// ---- Service --------------------------------------------------------------------------------

fn service(spec: Value, status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "default", "creationTimestamp": ago(3 * DAY)},
           "spec": spec, "status": status})
}

#[test]
fn service_columns_and_cluster_ip() {
    assert_eq!(
        layout("", "Service"),
        [
            "Name",
            "Type",
            "Cluster-IP",
            "External-IP",
            "Port(s)",
            "Age",
            "Selector*"
        ]
    );
    let s = service(
        json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
               "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                         {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}],
               "selector": {"tier": "frontend", "app": "web"}}),
        json!({"loadBalancer": {}}),
    );
    assert_eq!(
        row("", "Service", &s),
        [
            json!("web"),
            json!("ClusterIP"),
            json!("10.96.0.10"),
            json!("<none>"),
            json!("80/TCP,443/TCP"),
            json!("3d"),
            json!("app=web,tier=frontend")
        ]
    );
}

#[test]
fn service_node_port_and_headless() {
    let s = service(
        json!({"type": "NodePort", "clusterIPs": ["10.96.1.1"], "externalIPs": ["192.0.2.1", "192.0.2.2"],
               "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]}),
        json!({}),
    );
    assert_eq!(
        row("", "Service", &s)[1..],
        [
            json!("NodePort"),
            json!("10.96.1.1"),
            json!("192.0.2.1,192.0.2.2"),
            json!("80:30080/TCP,53/UDP"),
            json!("3d"),
            json!("<none>")
        ]
    );
    let headless = service(
        json!({"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"]}),
        json!({}),
    );
    assert_eq!(
        row("", "Service", &headless)[2..5],
        [json!("None"), json!("<none>"), json!("<none>")]
    );
}

#[test]
fn service_load_balancer() {
    let spec = json!({"type": "LoadBalancer", "clusterIPs": ["10.96.2.2"],
                      "ports": [{"port": 443, "protocol": "TCP", "nodePort": 30443}]});
    let pending = service(spec.clone(), json!({"loadBalancer": {}}));
    assert_eq!(
        row("", "Service", &pending)[3..5],
        [json!("<pending>"), json!("443:30443/TCP")]
    );

    let ready = service(
        spec.clone(),
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}, {"ip": "203.0.113.5"}]}}),
    );
    assert_eq!(
        row("", "Service", &ready)[3],
        json!("203.0.113.5,203.0.113.9,lb.example.com")
    );

    let mut with_external = spec;
    with_external["externalIPs"] = json!(["192.0.2.7"]);
    let s = service(
        with_external.clone(),
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}]}}),
    );
    assert_eq!(row("", "Service", &s)[3], json!("203.0.113.9,192.0.2.7"));
    let s = service(with_external, json!({}));
    assert_eq!(row("", "Service", &s)[3], json!("192.0.2.7"));
}

#[test]
fn service_external_name() {
    let s = service(
        json!({"type": "ExternalName", "externalName": "db.example.com"}),
        json!({}),
    );
    assert_eq!(
        row("", "Service", &s)[1..],
        [
            json!("ExternalName"),
            json!("<none>"),
            json!("db.example.com"),
            json!("<none>"),
            json!("3d"),
            json!("<none>")
        ]
    );
}

// ---- ReplicationController ------------------------------------------------------------------

#[test]
fn replication_controller() {
    assert_eq!(
        layout("", "ReplicationController"),
        [
            "Name",
            "Desired",
            "Current",
            "Ready",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let rc = json!({
        "metadata": {"name": "nginx", "creationTimestamp": ago(90 * MIN)},
        "spec": {"replicas": 3, "selector": {"app": "nginx"},
                 "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx"}, {"name": "log", "image": "busybox"}]}}},
        "status": {"replicas": 3, "readyReplicas": 2},
    });
    assert_eq!(
        row("", "ReplicationController", &rc),
        [
            json!("nginx"),
            json!(3),
            json!(3),
            json!(2),
            json!("90m"),
            json!("nginx,log"),
            json!("nginx,busybox"),
            json!("app=nginx")
        ]
    );
}

// ---- Namespace, Node ------------------------------------------------------------------------

#[test]
fn namespace() {
    assert_eq!(layout("", "Namespace"), ["Name", "Status", "Age"]);
    let ns = json!({"metadata": {"name": "kube-system", "creationTimestamp": ago(40 * DAY)}, "status": {"phase": "Active"}});
    assert_eq!(
        row("", "Namespace", &ns),
        [json!("kube-system"), json!("Active"), json!("40d")]
    );
    let ns = json!({"metadata": {"name": "old", "creationTimestamp": ago(2 * HOUR + 5 * MIN)}, "status": {"phase": "Terminating"}});
    assert_eq!(
        row("", "Namespace", &ns),
        [json!("old"), json!("Terminating"), json!("125m")]
    );
}

fn node(labels: Value, unschedulable: bool, conditions: Value) -> Value {
    json!({
        "metadata": {"name": "node-1", "labels": labels, "creationTimestamp": ago(12 * DAY)},
        "spec": {"unschedulable": unschedulable},
        "status": {
            "conditions": conditions,
            "addresses": [{"type": "Hostname", "address": "node-1"}, {"type": "InternalIP", "address": "172.18.0.2"}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "kernelVersion": "6.1.0-18-amd64", "containerRuntimeVersion": "containerd://1.7.24"},
        },
    })
}

#[test]
fn node_ready_control_plane() {
    assert_eq!(
        layout("", "Node"),
        [
            "Name",
            "Status",
            "Roles",
            "Age",
            "Version",
            "Internal-IP*",
            "External-IP*",
            "OS-Image*",
            "Kernel-Version*",
            "Container-Runtime*"
        ]
    );
    let n = node(
        json!({"kubernetes.io/hostname": "node-1", "node-role.kubernetes.io/control-plane": ""}),
        false,
        json!([{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]),
    );
    assert_eq!(
        row("", "Node", &n),
        [
            json!("node-1"),
            json!("Ready"),
            json!("control-plane"),
            json!("12d"),
            json!("v1.32.0"),
            json!("172.18.0.2"),
            json!("<none>"),
            json!("Debian GNU/Linux 12 (bookworm)"),
            json!("6.1.0-18-amd64"),
            json!("containerd://1.7.24")
        ]
    );
}

#[test]
fn node_status_and_roles() {
    let cordoned = node(
        json!({}),
        true,
        json!([{"type": "Ready", "status": "True"}]),
    );
    assert_eq!(
        row("", "Node", &cordoned)[1..3],
        [json!("Ready,SchedulingDisabled"), json!("<none>")]
    );
    let not_ready = node(
        json!({"kubernetes.io/role": "master"}),
        false,
        json!([{"type": "Ready", "status": "False"}]),
    );
    assert_eq!(
        row("", "Node", &not_ready)[1..3],
        [json!("NotReady"), json!("master")]
    );
    let unknown_ready = node(
        json!({}),
        false,
        json!([{"type": "Ready", "status": "Unknown"}]),
    );
    assert_eq!(row("", "Node", &unknown_ready)[1], json!("NotReady"));
    let new_node = node(
        json!({"node-role.kubernetes.io/worker": "", "node-role.kubernetes.io/infra": "true", "kubernetes.io/role": "worker",
               "node-role.kubernetes.io/": "x"}),
        true,
        json!([]),
    );
    assert_eq!(
        row("", "Node", &new_node)[1..3],
        [json!("Unknown,SchedulingDisabled"), json!("infra,worker")]
    );

    let bare = json!({"metadata": {"name": "n"}});
    assert_eq!(
        row("", "Node", &bare),
        [
            json!("n"),
            json!("Unknown"),
            json!("<none>"),
            json!("<unknown>"),
            json!(""),
            json!("<none>"),
            json!("<none>"),
            json!("<unknown>"),
            json!("<unknown>"),
            json!("<unknown>")
        ]
    );
}

// ---- Endpoints ------------------------------------------------------------------------------

#[test]
fn endpoints() {
    assert_eq!(layout("", "Endpoints"), ["Name", "Endpoints", "Age"]);
    let ep = json!({
        "metadata": {"name": "web", "creationTimestamp": ago(3 * DAY + 4 * HOUR)},
        "subsets": [{
            "addresses": [{"ip": "10.244.0.7"}, {"ip": "10.244.0.8"}],
            "notReadyAddresses": [{"ip": "10.244.0.9"}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "https", "port": 443, "protocol": "TCP"}],
        }],
    });
    assert_eq!(
        row("", "Endpoints", &ep),
        [
            json!("web"),
            json!("10.244.0.7:80,10.244.0.8:80,10.244.0.7:443 + 1 more..."),
            json!("3d4h")
        ]
    );

    let few = json!({"metadata": {"name": "kubernetes"},
                     "subsets": [{"addresses": [{"ip": "172.18.0.2"}], "ports": [{"port": 6443}]},
                                 {"addresses": [{"ip": "fd00::2"}], "ports": [{"port": 6443}]}]});
    assert_eq!(
        row("", "Endpoints", &few)[1],
        json!("172.18.0.2:6443,[fd00::2]:6443")
    );

    let headless = json!({"metadata": {"name": "h"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}]});
    assert_eq!(
        row("", "Endpoints", &headless)[1],
        json!("10.0.0.1,10.0.0.2")
    );

    let none = json!({"metadata": {"name": "n"}});
    assert_eq!(row("", "Endpoints", &none)[1], json!("<none>"));
    let not_ready = json!({"metadata": {"name": "n"}, "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]});
    assert_eq!(row("", "Endpoints", &not_ready)[1], json!(""));
}

// ---- ConfigMap, Secret, ServiceAccount ------------------------------------------------------

#[test]
fn config_map_secret_service_account() {
    assert_eq!(layout("", "ConfigMap"), ["Name", "Data", "Age"]);
    let cm = json!({"metadata": {"name": "kube-root-ca.crt", "creationTimestamp": ago(45)},
                    "data": {"ca.crt": "…", "extra": "x"}, "binaryData": {"blob": "AAE="}});
    assert_eq!(
        row("", "ConfigMap", &cm),
        [json!("kube-root-ca.crt"), json!(3), json!("45s")]
    );

    assert_eq!(layout("", "Secret"), ["Name", "Type", "Data", "Age"]);
    let secret = json!({"metadata": {"name": "db-creds", "creationTimestamp": ago(HOUR)},
                        "type": "Opaque", "data": {"username": "YWRtaW4=", "password": "c2VjcmV0"}});
    assert_eq!(
        row("", "Secret", &secret),
        [json!("db-creds"), json!("Opaque"), json!(2), json!("60m")]
    );
    let tls = json!({"metadata": {"name": "tls", "creationTimestamp": ago(HOUR)},
                     "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}, "stringData": {"tls.key": "k", "ca.crt": "c"}});
    assert_eq!(
        row("", "Secret", &tls)[1..3],
        [json!("kubernetes.io/tls"), json!(3)]
    );

    assert_eq!(layout("", "ServiceAccount"), ["Name", "Secrets", "Age"]);
    let sa = json!({"metadata": {"name": "default", "creationTimestamp": ago(5 * DAY)}});
    assert_eq!(
        row("", "ServiceAccount", &sa),
        [json!("default"), json!(0), json!("5d")]
    );
    let sa = json!({"metadata": {"name": "builder", "creationTimestamp": ago(5 * DAY)}, "secrets": [{"name": "builder-token"}]});
    assert_eq!(row("", "ServiceAccount", &sa)[1], json!(1));
}

// ---- Event ----------------------------------------------------------------------------------

#[test]
fn event_columns() {
    let expected = [
        "Last Seen",
        "Type",
        "Reason",
        "Object",
        "Subobject*",
        "Source*",
        "Message",
        "First Seen*",
        "Count*",
        "Name*",
    ];
    assert_eq!(layout("", "Event"), expected);
    assert_eq!(layout("events.k8s.io", "Event"), expected);
    let cols = columns("", "Event");
    assert_eq!(cols[9].format, "name");
    assert_eq!(cols[0].format, "");
}

#[test]
fn core_event_from_kubelet() {
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "web-1.17a2b3c4d5e6f708", "namespace": "default", "creationTimestamp": ago(10 * MIN)},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1", "uid": "u-1",
                           "apiVersion": "v1", "resourceVersion": "512", "fieldPath": "spec.containers{main}"},
        "reason": "Pulled",
        "message": "Successfully pulled image \"nginx:1.27\" in 1.2s\n",
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": ago(10 * MIN),
        "lastTimestamp": ago(2 * MIN),
        "count": 3,
        "type": "Normal",
        "eventTime": null,
        "reportingComponent": "kubelet",
        "reportingInstance": "node-1",
    });
    assert_eq!(
        row("", "Event", &ev),
        [
            json!("2m"),
            json!("Normal"),
            json!("Pulled"),
            json!("pod/web-1"),
            json!("spec.containers{main}"),
            json!("kubelet, node-1"),
            json!("Successfully pulled image \"nginx:1.27\" in 1.2s"),
            json!("10m"),
            json!(3),
            json!("web-1.17a2b3c4d5e6f708")
        ]
    );
}

#[test]
fn core_event_from_new_style_recorder() {
    // What the scheduler writes through the events.k8s.io API, read back as a core event.
    let ev = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "web-1.17a2", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-1"},
        "reason": "Scheduled",
        "message": "Successfully assigned default/web-1 to node-1",
        "source": {},
        "firstTimestamp": null,
        "lastTimestamp": null,
        "eventTime": "2025-01-10T11:59:15.123456Z",
        "type": "Normal",
        "action": "Binding",
        "reportingComponent": "default-scheduler",
        "reportingInstance": "default-scheduler-control-plane",
    });
    assert_eq!(
        row("", "Event", &ev),
        [
            json!("44s"),
            json!("Normal"),
            json!("Scheduled"),
            json!("pod/web-1"),
            json!(""),
            json!("default-scheduler, default-scheduler-control-plane"),
            json!("Successfully assigned default/web-1 to node-1"),
            json!("44s"),
            json!(1),
            json!("web-1.17a2")
        ]
    );
}

#[test]
fn event_series_and_kind_only_target() {
    let ev = json!({
        "metadata": {"name": "x"},
        "involvedObject": {"kind": "Node"},
        "reason": "Rebooted",
        "type": "Warning",
        "message": "  restarted  ",
        "eventTime": ago(HOUR),
        "series": {"count": 5, "lastObservedTime": ago(30)},
        "reportingComponent": "kubelet",
    });
    assert_eq!(
        row("", "Event", &ev),
        [
            json!("30s"),
            json!("Warning"),
            json!("Rebooted"),
            json!("node"),
            json!(""),
            json!("kubelet"),
            json!("restarted"),
            json!("60m"),
            json!(5),
            json!("x")
        ]
    );
    let no_times =
        json!({"metadata": {"name": "y"}, "involvedObject": {"kind": "Pod", "name": "p"}});
    let r = row("", "Event", &no_times);
    assert_eq!(
        (r[0].clone(), r[7].clone(), r[8].clone()),
        (json!("<unknown>"), json!("<unknown>"), json!(1))
    );
}

#[test]
fn events_k8s_io_event() {
    let ev = json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "web.17a3", "namespace": "default", "creationTimestamp": ago(5 * MIN)},
        "eventTime": "2025-01-10T11:55:00.000000Z",
        "series": {"count": 4, "lastObservedTime": "2025-01-10T11:59:00.000000Z"},
        "reportingController": "deployment-controller",
        "reportingInstance": "",
        "action": "Scale",
        "reason": "ScalingReplicaSet",
        "regarding": {"kind": "Deployment", "namespace": "default", "name": "web", "apiVersion": "apps/v1"},
        "note": "Scaled up replica set web-7d4b9 to 3",
        "type": "Normal",
        "deprecatedSource": {"component": "deployment-controller"},
        "deprecatedFirstTimestamp": ago(5 * MIN),
        "deprecatedLastTimestamp": ago(2 * MIN),
        "deprecatedCount": 4,
    });
    assert_eq!(
        row("events.k8s.io", "Event", &ev),
        [
            json!("60s"),
            json!("Normal"),
            json!("ScalingReplicaSet"),
            json!("deployment/web"),
            json!(""),
            json!("deployment-controller"),
            json!("Scaled up replica set web-7d4b9 to 3"),
            json!("5m"),
            json!(4),
            json!("web.17a3")
        ]
    );
    // Without apiVersion the requested group decides the shape.
    let mut bare = ev.clone();
    bare.as_object_mut().unwrap().remove("apiVersion");
    assert_eq!(
        row("events.k8s.io", "Event", &bare),
        row("events.k8s.io", "Event", &ev)
    );
    // The stored core shape asked for through events.k8s.io reads the same as through core.
    let core = json!({"apiVersion": "v1", "metadata": {"name": "c"}, "involvedObject": {"kind": "Pod", "name": "p"},
                      "message": "m", "count": 2, "firstTimestamp": ago(70), "lastTimestamp": ago(10)});
    assert_eq!(
        row("events.k8s.io", "Event", &core),
        row("", "Event", &core)
    );
    assert_eq!(
        row("", "Event", &core)[3..9],
        [
            json!("pod/p"),
            json!(""),
            json!(""),
            json!("m"),
            json!("70s"),
            json!(2)
        ]
    );
}

// ---- ResourceQuota, LimitRange --------------------------------------------------------------

#[test]
fn resource_quota() {
    assert_eq!(
        layout("", "ResourceQuota"),
        ["Name", "Age", "Request", "Limit"]
    );
    let q = json!({
        "metadata": {"name": "compute", "creationTimestamp": ago(7 * DAY)},
        "spec": {"hard": {"cpu": "2"}},
        "status": {
            "hard": {"pods": "10", "cpu": "2", "memory": "2Gi", "limits.cpu": "4", "limits.memory": "4Gi",
                     "requests.storage": "10Gi", "count/deployments.apps": "5"},
            "used": {"pods": "3", "cpu": "500m", "memory": "512Mi", "limits.cpu": "1000m", "count/deployments.apps": "1"},
        },
    });
    assert_eq!(
        row("", "ResourceQuota", &q),
        [
            json!("compute"),
            json!("7d"),
            json!("count/deployments.apps: 1/5, cpu: 500m/2, memory: 512Mi/2Gi, pods: 3/10, requests.storage: 0/10Gi"),
            json!("limits.cpu: 1/4, limits.memory: 0/4Gi")
        ]
    );
    let empty = json!({"metadata": {"name": "e", "creationTimestamp": ago(1)}});
    assert_eq!(
        row("", "ResourceQuota", &empty),
        [json!("e"), json!("1s"), json!(""), json!("")]
    );
}

#[test]
fn limit_range_shows_creation_time() {
    let cols = columns("", "LimitRange");
    assert_eq!(names(&cols), ["Name", "Created At"]);
    assert_eq!(cols[1].type_, "date");
    let lr =
        json!({"metadata": {"name": "mem-limits", "creationTimestamp": "2025-01-01T08:30:00Z"}});
    assert_eq!(
        row("", "LimitRange", &lr),
        [json!("mem-limits"), json!("2025-01-01T08:30:00Z")]
    );
    let lr = json!({"metadata": {"name": "x", "creationTimestamp": "2025-01-01T10:30:00.5+02:00"}});
    assert_eq!(row("", "LimitRange", &lr)[1], json!("2025-01-01T08:30:00Z"));
    assert_eq!(
        row("", "LimitRange", &json!({"metadata": {"name": "y"}}))[1],
        Value::Null
    );
}

// ---- apps -----------------------------------------------------------------------------------

fn template(containers: Value) -> Value {
    json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}})
}

#[test]
fn deployment() {
    assert_eq!(
        layout("apps", "Deployment"),
        [
            "Name",
            "Ready",
            "Up-to-date",
            "Available",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let d = json!({
        "metadata": {"name": "web", "namespace": "default", "creationTimestamp": ago(4 * DAY + 2 * HOUR)},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": template(json!([{"name": "nginx", "image": "nginx:1.27"}, {"name": "sidecar", "image": "busybox:1.36"}]))},
        "status": {"replicas": 3, "updatedReplicas": 3, "readyReplicas": 2, "availableReplicas": 2},
    });
    assert_eq!(
        row("apps", "Deployment", &d),
        [
            json!("web"),
            json!("2/3"),
            json!(3),
            json!(2),
            json!("4d2h"),
            json!("nginx,sidecar"),
            json!("nginx:1.27,busybox:1.36"),
            json!("app=web")
        ]
    );
    // Fresh from `kubectl create deployment`: no status yet.
    let fresh = json!({"metadata": {"name": "new", "creationTimestamp": ago(1)},
                       "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "new"}}, "template": template(json!([]))}});
    assert_eq!(
        row("apps", "Deployment", &fresh)[1..5],
        [json!("0/1"), json!(0), json!(0), json!("1s")]
    );

    let exprs = json!({"metadata": {"name": "x"}, "spec": {"selector": {
    "matchLabels": {"app": "web"},
    "matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["frontend", "backend"]},
        {"key": "env", "operator": "Exists"},
        {"key": "canary", "operator": "DoesNotExist"},
        {"key": "zone", "operator": "NotIn", "values": ["b", "a"]},
    ]}}});
    assert_eq!(
        row("apps", "Deployment", &exprs)[7],
        json!("app=web,!canary,env,tier in (backend,frontend),zone notin (a,b)")
    );
    let bad = json!({"metadata": {"name": "x"}, "spec": {"selector": {"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}}});
    assert_eq!(row("apps", "Deployment", &bad)[7], json!("<invalid>"));
    let empty = json!({"metadata": {"name": "x"}, "spec": {"selector": {}}});
    assert_eq!(row("apps", "Deployment", &empty)[7], json!(""));
}

#[test]
fn replica_set() {
    assert_eq!(
        layout("apps", "ReplicaSet"),
        [
            "Name",
            "Desired",
            "Current",
            "Ready",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let rs = json!({
        "metadata": {"name": "web-7d4b9", "creationTimestamp": ago(4 * DAY)},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"pod-template-hash": "7d4b9", "app": "web"}},
                 "template": template(json!([{"name": "nginx", "image": "nginx:1.27"}]))},
        "status": {"replicas": 3, "readyReplicas": 3, "availableReplicas": 3},
    });
    assert_eq!(
        row("apps", "ReplicaSet", &rs),
        [
            json!("web-7d4b9"),
            json!(3),
            json!(3),
            json!(3),
            json!("4d"),
            json!("nginx"),
            json!("nginx:1.27"),
            json!("app=web,pod-template-hash=7d4b9")
        ]
    );
    let old = json!({"metadata": {"name": "web-old"}, "spec": {"replicas": 0, "selector": {"matchLabels": {}}}});
    assert_eq!(
        row("apps", "ReplicaSet", &old)[1..4],
        [json!(0), json!(0), json!(0)]
    );
    assert_eq!(row("apps", "ReplicaSet", &old)[7], json!("<none>"));
    let bad = json!({"metadata": {"name": "x"}, "spec": {"selector": {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}}});
    assert_eq!(row("apps", "ReplicaSet", &bad)[7], json!("<error>"));
}

#[test]
fn stateful_set() {
    assert_eq!(
        layout("apps", "StatefulSet"),
        ["Name", "Ready", "Age", "Containers*", "Images*"]
    );
    let sts = json!({
        "metadata": {"name": "db", "creationTimestamp": ago(HOUR)},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": template(json!([{"name": "postgres", "image": "postgres:16"}]))},
        "status": {"replicas": 2, "readyReplicas": 1, "currentReplicas": 2},
    });
    assert_eq!(
        row("apps", "StatefulSet", &sts),
        [
            json!("db"),
            json!("1/3"),
            json!("60m"),
            json!("postgres"),
            json!("postgres:16")
        ]
    );
}

#[test]
fn daemon_set() {
    assert_eq!(
        layout("apps", "DaemonSet"),
        [
            "Name",
            "Desired",
            "Current",
            "Ready",
            "Up-to-date",
            "Available",
            "Node Selector",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let mut tmpl = template(json!([{"name": "fluentd", "image": "fluentd:v1.17"}]));
    tmpl["spec"]["nodeSelector"] = json!({"kubernetes.io/os": "linux"});
    let ds = json!({
        "metadata": {"name": "fluentd", "namespace": "kube-system", "creationTimestamp": ago(10 * DAY)},
        "spec": {"selector": {"matchLabels": {"name": "fluentd"}}, "template": tmpl},
        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                   "updatedNumberScheduled": 3, "numberAvailable": 2, "numberMisscheduled": 0},
    });
    assert_eq!(
        row("apps", "DaemonSet", &ds),
        [
            json!("fluentd"),
            json!(3),
            json!(3),
            json!(2),
            json!(3),
            json!(2),
            json!("kubernetes.io/os=linux"),
            json!("10d"),
            json!("fluentd"),
            json!("fluentd:v1.17"),
            json!("name=fluentd")
        ]
    );
    let no_selector = json!({"metadata": {"name": "x"}, "spec": {"template": template(json!([]))}});
    assert_eq!(row("apps", "DaemonSet", &no_selector)[6], json!("<none>"));
}

#[test]
fn controller_revision() {
    assert_eq!(
        layout("apps", "ControllerRevision"),
        ["Name", "Controller", "Revision", "Age"]
    );
    let cr = json!({
        "metadata": {"name": "db-5b8f7c9d4", "creationTimestamp": ago(HOUR),
                     "ownerReferences": [
                         {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u0"},
                         {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u1", "controller": true, "blockOwnerDeletion": true}]},
        "revision": 2,
        "data": {},
    });
    assert_eq!(
        row("apps", "ControllerRevision", &cr),
        [
            json!("db-5b8f7c9d4"),
            json!("statefulset.apps/db"),
            json!(2),
            json!("60m")
        ]
    );
    let core_owner = json!({"metadata": {"name": "x", "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "controller": true}]}, "revision": 1});
    assert_eq!(
        row("apps", "ControllerRevision", &core_owner)[1],
        json!("pod/p")
    );
    let orphan = json!({"metadata": {"name": "x"}, "revision": 1});
    assert_eq!(
        row("apps", "ControllerRevision", &orphan)[1],
        json!("<none>")
    );
}

// ---- batch ----------------------------------------------------------------------------------

fn job(spec: Value, status: Value) -> Value {
    let mut spec = spec;
    spec["template"] = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "pi", "image": "perl:5.34"}]}});
    spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "0c1d"}});
    json!({"metadata": {"name": "pi", "namespace": "default", "creationTimestamp": ago(10 * MIN)}, "spec": spec, "status": status})
}

#[test]
fn job_complete() {
    assert_eq!(
        layout("batch", "Job"),
        [
            "Name",
            "Status",
            "Completions",
            "Duration",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let j = job(
        json!({"completions": 1, "parallelism": 1}),
        json!({"startTime": ago(10 * MIN), "completionTime": ago(10 * MIN - 25), "succeeded": 1,
               "conditions": [{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}]}),
    );
    assert_eq!(
        row("batch", "Job", &j),
        [
            json!("pi"),
            json!("Complete"),
            json!("1/1"),
            json!("25s"),
            json!("10m"),
            json!("pi"),
            json!("perl:5.34"),
            json!("batch.kubernetes.io/controller-uid=0c1d")
        ]
    );
}

#[test]
fn job_states() {
    let running = job(
        json!({"completions": 3, "parallelism": 2}),
        json!({"startTime": ago(90), "active": 2, "succeeded": 0}),
    );
    assert_eq!(
        row("batch", "Job", &running)[1..4],
        [json!("Running"), json!("0/3"), json!("90s")]
    );

    let failed = job(
        json!({"completions": 1}),
        json!({"startTime": ago(5 * MIN), "failed": 7,
               "conditions": [{"type": "FailureTarget", "status": "True"}, {"type": "Failed", "status": "True"}]}),
    );
    assert_eq!(
        row("batch", "Job", &failed)[1..4],
        [json!("Failed"), json!("0/1"), json!("5m")]
    );

    let suspended = job(
        json!({"completions": 1, "suspend": true}),
        json!({"conditions": [{"type": "Suspended", "status": "True"}]}),
    );
    assert_eq!(
        row("batch", "Job", &suspended)[1..4],
        [json!("Suspended"), json!("0/1"), json!("")]
    );

    let resumed = job(
        json!({"completions": 1}),
        json!({"conditions": [{"type": "Suspended", "status": "False"}]}),
    );
    assert_eq!(row("batch", "Job", &resumed)[1], json!("Running"));

    let failing = job(
        json!({"completions": 1}),
        json!({"conditions": [{"type": "FailureTarget", "status": "True"}]}),
    );
    assert_eq!(row("batch", "Job", &failing)[1], json!("FailureTarget"));
    let succeeding = job(
        json!({"completions": 1}),
        json!({"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}),
    );
    assert_eq!(
        row("batch", "Job", &succeeding)[1],
        json!("SuccessCriteriaMet")
    );

    let mut deleting = job(
        json!({"completions": 1}),
        json!({"conditions": [{"type": "Suspended", "status": "True"}]}),
    );
    deleting["metadata"]["deletionTimestamp"] = json!(ago(1));
    assert_eq!(row("batch", "Job", &deleting)[1], json!("Terminating"));

    let queue = job(json!({"parallelism": 4}), json!({"succeeded": 1}));
    assert_eq!(row("batch", "Job", &queue)[2], json!("1/1 of 4"));
    let single = job(json!({"parallelism": 1}), json!({}));
    assert_eq!(row("batch", "Job", &single)[2], json!("0/1"));

    let no_selector = json!({"metadata": {"name": "j"}});
    assert_eq!(row("batch", "Job", &no_selector)[7], json!(""));
}

#[test]
fn cron_job() {
    assert_eq!(
        layout("batch", "CronJob"),
        [
            "Name",
            "Schedule",
            "Timezone",
            "Suspend",
            "Active",
            "Last Schedule",
            "Age",
            "Containers*",
            "Images*",
            "Selector*"
        ]
    );
    let cj = json!({
        "metadata": {"name": "backup", "namespace": "default", "creationTimestamp": ago(2 * DAY)},
        "spec": {"schedule": "*/5 * * * *", "suspend": false, "concurrencyPolicy": "Allow",
                 "jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "backup", "image": "backup:2"}]}}}}},
        "status": {"active": [{"kind": "Job", "name": "backup-28941234"}], "lastScheduleTime": ago(3 * MIN)},
    });
    assert_eq!(
        row("batch", "CronJob", &cj),
        [
            json!("backup"),
            json!("*/5 * * * *"),
            json!("<none>"),
            json!("False"),
            json!(1),
            json!("3m"),
            json!("2d"),
            json!("backup"),
            json!("backup:2"),
            json!("")
        ]
    );
    let never = json!({"metadata": {"name": "n", "creationTimestamp": ago(1)},
                       "spec": {"schedule": "@daily", "timeZone": "Europe/Berlin", "suspend": true}});
    assert_eq!(
        row("batch", "CronJob", &never)[1..6],
        [
            json!("@daily"),
            json!("Europe/Berlin"),
            json!("True"),
            json!(0),
            json!("<none>")
        ]
    );
    let unset = json!({"metadata": {"name": "u"}, "spec": {"schedule": "0 0 * * *"}});
    assert_eq!(row("batch", "CronJob", &unset)[3], json!("<unset>"));
}

// ---- autoscaling ----------------------------------------------------------------------------

fn hpa(metrics: Value, current: Value) -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "default", "creationTimestamp": ago(6 * HOUR)},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                 "minReplicas": 1, "maxReplicas": 10, "metrics": metrics},
        "status": {"currentReplicas": 2, "desiredReplicas": 2, "currentMetrics": current},
    })
}

fn cpu_target(util: i64) -> Value {
    json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": util}}})
}

#[test]
fn hpa_cpu() {
    assert_eq!(
        layout("autoscaling", "HorizontalPodAutoscaler"),
        [
            "Name",
            "Reference",
            "Targets",
            "MinPods",
            "MaxPods",
            "Replicas",
            "Age"
        ]
    );
    let h = hpa(
        json!([cpu_target(80)]),
        json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 50, "averageValue": "250m"}}}]),
    );
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &h),
        [
            json!("web"),
            json!("Deployment/web"),
            json!("cpu: 50%/80%"),
            json!("1"),
            json!(10),
            json!(2),
            json!("6h")
        ]
    );
    let fresh = hpa(json!([cpu_target(80)]), json!(null));
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &fresh)[2],
        json!("cpu: <unknown>/80%")
    );
    let none = hpa(json!([]), json!([]));
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &none)[2],
        json!("<none>")
    );
    let mut unset = hpa(json!([]), json!([]));
    unset["spec"].as_object_mut().unwrap().remove("minReplicas");
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &unset)[3],
        json!("<unset>")
    );
}

#[test]
fn hpa_other_metric_types() {
    let specs = json!([
        {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "512Mi"}}},
        {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1000"}}},
        {"type": "Object", "object": {"metric": {"name": "hits"}, "describedObject": {"kind": "Ingress", "name": "main"},
                                       "target": {"type": "Value", "value": "10k"}}},
    ]);
    let current = json!([
        {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "200Mi"}}},
        {"type": "Pods", "pods": {"metric": {"name": "qps"}, "current": {"averageValue": "1500m"}}},
    ]);
    let h = hpa(specs.clone(), current);
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &h)[2],
        json!("memory: 200Mi/512Mi, 1500m/1k + 1 more...")
    );

    let objects = json!([
        {"type": "Object", "object": {"metric": {"name": "hits"}, "target": {"type": "AverageValue", "averageValue": "2"}}},
        {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value", "value": "30"}}},
    ]);
    let current = json!([
        {"type": "Object", "object": {"metric": {"name": "hits"}, "current": {"value": "9"}}},
        {"type": "External", "external": {"metric": {"name": "queue"}, "current": {"value": "12"}}},
    ]);
    let h = hpa(objects, current);
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &h)[2],
        json!("<unknown>/2 (avg), 12/30")
    );

    let containers = json!([
        {"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app", "target": {"type": "Utilization", "averageUtilization": 60}}},
        {"type": "Weird"},
    ]);
    // Status entries are matched by position: a different source type at that index is unknown.
    let current = json!([{"type": "ContainerResource", "containerResource": {"name": "cpu", "container": "app", "current": {"averageUtilization": 70}}},
                         {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 1}}}]);
    let h = hpa(containers, current);
    assert_eq!(
        row("autoscaling", "HorizontalPodAutoscaler", &h)[2],
        json!("70%/60%, <unknown type>")
    );
}

// ---- coordination ---------------------------------------------------------------------------

#[test]
fn lease() {
    assert_eq!(
        layout("coordination.k8s.io", "Lease"),
        ["Name", "Holder", "Age"]
    );
    let l = json!({
        "metadata": {"name": "node-1", "namespace": "kube-node-lease", "creationTimestamp": ago(40)},
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2025-01-10T11:59:58.000000Z"},
    });
    assert_eq!(
        row("coordination.k8s.io", "Lease", &l),
        [json!("node-1"), json!("node-1"), json!("40s")]
    );
    let free = json!({"metadata": {"name": "lock"}, "spec": {}});
    assert_eq!(row("coordination.k8s.io", "Lease", &free)[1], json!(""));
}
