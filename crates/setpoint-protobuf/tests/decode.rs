//! Bodies built with k8s-pb/prost (the same bytes a Go client sends), decoded and compared with the
//! JSON written by hand from Kubernetes' JSON conventions (what `kubectl ... -o json` prints).
//! Each expected JSON is also read into the k8s-openapi type and written back, which proves the
//! expected document itself uses the exact Kubernetes property names.

use std::collections::BTreeMap;

use k8s_openapi::serde::{de::DeserializeOwned, Serialize};
use k8s_pb::api::{
    apps, authentication, authorization, autoscaling, batch, coordination, core, events, policy,
};
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;
use prost::Message;
use serde_json::{json, Value};
use setpoint_protobuf::{decode, supports, DecodeError};

// ---------------------------------------------------------------------------------------------
// helpers

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity { string: s(v) }))
        .collect()
}

fn int_port(v: i32) -> Option<IntOrString> {
    Some(IntOrString {
        r#type: Some(0),
        int_val: Some(v),
        str_val: s(""),
    })
}

fn str_port(v: &str) -> Option<IntOrString> {
    Some(IntOrString {
        r#type: Some(1),
        int_val: Some(0),
        str_val: s(v),
    })
}

fn time(seconds: i64) -> Option<meta::Time> {
    Some(meta::Time {
        seconds: Some(seconds),
        nanos: Some(0),
    })
}

fn micro_time(seconds: i64, nanos: i32) -> Option<meta::MicroTime> {
    Some(meta::MicroTime {
        seconds: Some(seconds),
        nanos: Some(nanos),
    })
}

/// 2026-01-01T00:00:00Z
const T2026: i64 = 1_767_225_600;

/// The envelope client-go writes: magic, then runtime.Unknown with empty encoding/type strings.
fn body(api_version: &str, kind: &str, obj: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s(api_version),
            kind: s(kind),
        }),
        raw: Some(obj.encode_to_vec()),
        content_encoding: s(""),
        content_type: s(""),
    };
    [b"k8s\0".as_slice(), &unknown.encode_to_vec()].concat()
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        v => v,
    }
}

/// Decodes `body`, compares with `expected`, and checks `expected` against k8s-openapi's `T`.
fn check<T: DeserializeOwned + Serialize>(body: &[u8], expected: Value) {
    let got = decode(body).unwrap_or_else(|e| panic!("decode failed: {e}"));
    assert_eq!(
        got,
        expected,
        "\n got: {}\nwant: {}",
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&expected).unwrap()
    );
    assert!(
        got.get("apiVersion").is_some_and(Value::is_string)
            && got.get("kind").is_some_and(Value::is_string),
        "apiVersion and kind are set"
    );
    let typed: T =
        serde_json::from_value(expected.clone()).expect("expected JSON is valid for k8s-openapi");
    let mut back = serde_json::to_value(&typed).unwrap();
    drop_added_type_meta(&mut back, &expected);
    assert_eq!(
        strip_nulls(back),
        strip_nulls(expected),
        "k8s-openapi reads the expected JSON back unchanged"
    );
}

/// k8s-openapi writes apiVersion/kind for embedded objects too (StatefulSet volumeClaimTemplates);
/// drop those it added.
fn drop_added_type_meta(back: &mut Value, expected: &Value) {
    match (back, expected) {
        (Value::Object(b), Value::Object(e)) => {
            for k in ["apiVersion", "kind"] {
                if !e.contains_key(k) {
                    b.remove(k);
                }
            }
            for (k, v) in b.iter_mut() {
                if let Some(ev) = e.get(k) {
                    drop_added_type_meta(v, ev);
                }
            }
        }
        (Value::Array(b), Value::Array(e)) => {
            for (bv, ev) in b.iter_mut().zip(e) {
                drop_added_type_meta(bv, ev);
            }
        }
        _ => {}
    }
}

/// ObjectMeta as Go writes it: every non-pointer field present, zero or not.
fn go_meta(name: &str, namespace: &str, labels: &[(&str, &str)]) -> Option<meta::ObjectMeta> {
    Some(meta::ObjectMeta {
        name: s(name),
        generate_name: s(""),
        namespace: s(namespace),
        self_link: s(""),
        uid: s(""),
        resource_version: s(""),
        generation: Some(0),
        creation_timestamp: Some(meta::Time::default()),
        labels: map(labels),
        ..Default::default()
    })
}

/// A container as Go writes it (non-pointer fields present with zero values).
fn go_container(name: &str, image: &str) -> core::v1::Container {
    core::v1::Container {
        name: s(name),
        image: s(image),
        working_dir: s(""),
        resources: Some(Default::default()),
        termination_message_path: s(""),
        termination_message_policy: s(""),
        image_pull_policy: s(""),
        stdin: Some(false),
        stdin_once: Some(false),
        tty: Some(false),
        ..Default::default()
    }
}

/// A pod spec as Go writes it.
fn go_pod_spec(containers: Vec<core::v1::Container>) -> core::v1::PodSpec {
    core::v1::PodSpec {
        containers,
        restart_policy: s(""),
        dns_policy: s(""),
        service_account_name: s(""),
        service_account: s(""),
        node_name: s(""),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        hostname: s(""),
        subdomain: s(""),
        scheduler_name: s(""),
        priority_class_name: s(""),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// kinds

/// `kubectl create deployment web --image=nginx --port=80 --replicas=0`, encoded as Go does.
#[test]
fn deployment_as_kubectl_create_sends_it() {
    let mut container = go_container("nginx", "nginx");
    container.ports = vec![core::v1::ContainerPort {
        name: s(""),
        host_port: Some(0),
        container_port: Some(80),
        protocol: s(""),
        host_ip: s(""),
    }];
    let d = apps::v1::Deployment {
        metadata: go_meta("web", "", &[("app", "web")]),
        spec: Some(apps::v1::DeploymentSpec {
            replicas: Some(0),
            selector: Some(meta::LabelSelector {
                match_labels: map(&[("app", "web")]),
                match_expressions: vec![],
            }),
            template: Some(core::v1::PodTemplateSpec {
                metadata: go_meta("", "", &[("app", "web")]),
                spec: Some(go_pod_spec(vec![container])),
            }),
            strategy: Some(apps::v1::DeploymentStrategy {
                r#type: s(""),
                rolling_update: None,
            }),
            min_ready_seconds: Some(0),
            paused: Some(false),
            ..Default::default()
        }),
        status: Some(apps::v1::DeploymentStatus {
            observed_generation: Some(0),
            replicas: Some(0),
            updated_replicas: Some(0),
            ready_replicas: Some(0),
            available_replicas: Some(0),
            unavailable_replicas: Some(0),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::apps::v1::Deployment>(
        &body("apps/v1", "Deployment", &d),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "nginx",
                        "image": "nginx",
                        "ports": [{"containerPort": 80}],
                        "resources": {}
                    }]}
                },
                "strategy": {}
            },
            "status": {}
        }),
    );
}

#[test]
fn deployment_with_everything_kubectl_users_write() {
    let mut c = go_container("app", "registry.local/app:1.2");
    c.command = vec!["/bin/app".into()];
    c.args = vec!["--port=8080".into(), "-v".into()];
    c.ports = vec![core::v1::ContainerPort {
        name: s("http"),
        container_port: Some(8080),
        protocol: s("TCP"),
        ..Default::default()
    }];
    c.env = vec![
        core::v1::EnvVar {
            name: s("MODE"),
            value: s("prod"),
            value_from: None,
        },
        core::v1::EnvVar {
            name: s("POD_IP"),
            value: s(""),
            value_from: Some(core::v1::EnvVarSource {
                field_ref: Some(core::v1::ObjectFieldSelector {
                    api_version: s("v1"),
                    field_path: s("status.podIP"),
                }),
                ..Default::default()
            }),
        },
    ];
    c.resources = Some(core::v1::ResourceRequirements {
        limits: quantities(&[("cpu", "1"), ("memory", "512Mi")]),
        requests: quantities(&[("cpu", "250m"), ("memory", "64Mi")]),
        claims: vec![],
    });
    c.liveness_probe = Some(core::v1::Probe {
        handler: Some(core::v1::ProbeHandler {
            http_get: Some(core::v1::HttpGetAction {
                path: s("/healthz"),
                port: str_port("http"),
                host: s(""),
                scheme: s("HTTP"),
                http_headers: vec![],
            }),
            ..Default::default()
        }),
        initial_delay_seconds: Some(5),
        timeout_seconds: Some(0),
        period_seconds: Some(10),
        success_threshold: Some(0),
        failure_threshold: Some(3),
        termination_grace_period_seconds: None,
    });
    c.readiness_probe = Some(core::v1::Probe {
        handler: Some(core::v1::ProbeHandler {
            tcp_socket: Some(core::v1::TcpSocketAction {
                port: int_port(8080),
                host: s(""),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    c.security_context = Some(core::v1::SecurityContext {
        run_as_user: Some(0),
        run_as_non_root: Some(false),
        allow_privilege_escalation: Some(false),
        ..Default::default()
    });
    c.image_pull_policy = s("IfNotPresent");
    let mut spec = go_pod_spec(vec![c]);
    spec.termination_grace_period_seconds = Some(0);
    spec.automount_service_account_token = Some(false);
    spec.priority = Some(-5);
    spec.node_selector = map(&[("disk", "ssd")]);
    spec.tolerations = vec![core::v1::Toleration {
        key: s("node.kubernetes.io/not-ready"),
        operator: s("Exists"),
        value: s(""),
        effect: s("NoExecute"),
        toleration_seconds: Some(300),
    }];
    spec.volumes = vec![core::v1::Volume {
        name: s("cfg"),
        volume_source: Some(core::v1::VolumeSource {
            config_map: Some(core::v1::ConfigMapVolumeSource {
                local_object_reference: Some(core::v1::LocalObjectReference {
                    name: s("app-config"),
                }),
                items: vec![],
                default_mode: Some(0o644),
                optional: Some(false),
            }),
            ..Default::default()
        }),
    }];
    let mut meta = go_meta("app", "prod", &[("app", "app"), ("tier", "web")]);
    if let Some(m) = meta.as_mut() {
        m.annotations = map(&[("deployment.kubernetes.io/revision", "3")]);
        m.generation = Some(4);
        m.uid = s("8a7c3c2e-0000-4000-8000-000000000001");
        m.creation_timestamp = time(T2026);
    }
    let d = apps::v1::Deployment {
        metadata: meta,
        spec: Some(apps::v1::DeploymentSpec {
            replicas: Some(3),
            selector: Some(meta::LabelSelector {
                match_labels: map(&[("app", "app")]),
                match_expressions: vec![meta::LabelSelectorRequirement {
                    key: s("tier"),
                    operator: s("In"),
                    values: vec!["web".into(), "api".into()],
                }],
            }),
            template: Some(core::v1::PodTemplateSpec {
                metadata: go_meta("", "", &[("app", "app"), ("tier", "web")]),
                spec: Some(spec),
            }),
            strategy: Some(apps::v1::DeploymentStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(apps::v1::RollingUpdateDeployment {
                    max_unavailable: int_port(0),
                    max_surge: str_port("25%"),
                }),
            }),
            min_ready_seconds: Some(0),
            revision_history_limit: Some(10),
            paused: Some(false),
            progress_deadline_seconds: Some(600),
        }),
        status: None,
    };
    check::<k8s_openapi::api::apps::v1::Deployment>(
        &body("apps/v1", "Deployment", &d),
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "app",
                "namespace": "prod",
                "uid": "8a7c3c2e-0000-4000-8000-000000000001",
                "generation": 4,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app": "app", "tier": "web"},
                "annotations": {"deployment.kubernetes.io/revision": "3"}
            },
            "spec": {
                "replicas": 3,
                "selector": {
                    "matchLabels": {"app": "app"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "api"]}]
                },
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "app", "tier": "web"}},
                    "spec": {
                        "volumes": [{"name": "cfg", "configMap": {"name": "app-config", "defaultMode": 420, "optional": false}}],
                        "containers": [{
                            "name": "app",
                            "image": "registry.local/app:1.2",
                            "command": ["/bin/app"],
                            "args": ["--port=8080", "-v"],
                            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                            "env": [
                                {"name": "MODE", "value": "prod"},
                                {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}
                            ],
                            "resources": {
                                "limits": {"cpu": "1", "memory": "512Mi"},
                                "requests": {"cpu": "250m", "memory": "64Mi"}
                            },
                            "livenessProbe": {
                                "httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                                "initialDelaySeconds": 5,
                                "periodSeconds": 10,
                                "failureThreshold": 3
                            },
                            "readinessProbe": {"tcpSocket": {"port": 8080}},
                            "imagePullPolicy": "IfNotPresent",
                            "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "allowPrivilegeEscalation": false}
                        }],
                        "terminationGracePeriodSeconds": 0,
                        "nodeSelector": {"disk": "ssd"},
                        "automountServiceAccountToken": false,
                        "tolerations": [{
                            "key": "node.kubernetes.io/not-ready",
                            "operator": "Exists",
                            "effect": "NoExecute",
                            "tolerationSeconds": 300
                        }],
                        "priority": -5
                    }
                },
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "25%"}},
                "revisionHistoryLimit": 10,
                "progressDeadlineSeconds": 600
            }
        }),
    );
}

#[test]
fn namespace() {
    let ns = core::v1::Namespace {
        metadata: go_meta("team-a", "", &[]),
        spec: Some(core::v1::NamespaceSpec { finalizers: vec![] }),
        status: Some(core::v1::NamespaceStatus {
            phase: s(""),
            conditions: vec![],
        }),
    };
    check::<k8s_openapi::api::core::v1::Namespace>(
        &body("v1", "Namespace", &ns),
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": "team-a", "creationTimestamp": null},
            "spec": {},
            "status": {}
        }),
    );
}

#[test]
fn configmap_with_data_and_binary_data() {
    let cm = core::v1::ConfigMap {
        metadata: go_meta("cfg", "default", &[]),
        immutable: None,
        data: map(&[("app.properties", "a=1\nb=2\n"), ("empty", "")]),
        binary_data: [
            (
                "logo.png".to_string(),
                vec![0x89, b'P', b'N', b'G', 0, 0xff],
            ),
            ("none".to_string(), vec![]),
        ]
        .into_iter()
        .collect(),
    };
    check::<k8s_openapi::api::core::v1::ConfigMap>(
        &body("v1", "ConfigMap", &cm),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": "default", "creationTimestamp": null},
            "data": {"app.properties": "a=1\nb=2\n", "empty": ""},
            "binaryData": {"logo.png": "iVBORwD/", "none": ""}
        }),
    );
}

#[test]
fn secret_with_data() {
    let secret = core::v1::Secret {
        metadata: go_meta("creds", "default", &[]),
        immutable: Some(true),
        data: [
            ("username".to_string(), b"admin".to_vec()),
            ("password".to_string(), b"s3cr\xc3\xa9t\x00".to_vec()),
        ]
        .into_iter()
        .collect(),
        string_data: BTreeMap::new(),
        r#type: s("Opaque"),
    };
    check::<k8s_openapi::api::core::v1::Secret>(
        &body("v1", "Secret", &secret),
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default", "creationTimestamp": null},
            "immutable": true,
            "data": {"password": "czNjcsOpdAA=", "username": "YWRtaW4="},
            "type": "Opaque"
        }),
    );
}

/// `kubectl create service clusterip web --tcp=80:8080` plus a named target port.
#[test]
fn service_with_int_and_string_target_ports() {
    let svc = core::v1::Service {
        metadata: go_meta("web", "", &[("app", "web")]),
        spec: Some(core::v1::ServiceSpec {
            ports: vec![
                core::v1::ServicePort {
                    name: s("80-8080"),
                    protocol: s("TCP"),
                    app_protocol: None,
                    port: Some(80),
                    target_port: int_port(8080),
                    node_port: Some(0),
                },
                core::v1::ServicePort {
                    name: s("metrics"),
                    protocol: s("TCP"),
                    app_protocol: s("http"),
                    port: Some(9090),
                    target_port: str_port("metrics"),
                    node_port: Some(0),
                },
            ],
            selector: map(&[("app", "web")]),
            cluster_ip: s(""),
            r#type: s("ClusterIP"),
            session_affinity: s(""),
            load_balancer_ip: s(""),
            external_name: s(""),
            external_traffic_policy: s(""),
            health_check_node_port: Some(0),
            publish_not_ready_addresses: Some(false),
            internal_traffic_policy: s("Cluster"),
            ..Default::default()
        }),
        status: Some(core::v1::ServiceStatus {
            load_balancer: Some(Default::default()),
            conditions: vec![],
        }),
    };
    check::<k8s_openapi::api::core::v1::Service>(
        &body("v1", "Service", &svc),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
            "spec": {
                "ports": [
                    {"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080},
                    {"name": "metrics", "protocol": "TCP", "appProtocol": "http", "port": 9090, "targetPort": "metrics"}
                ],
                "selector": {"app": "web"},
                "type": "ClusterIP",
                "internalTrafficPolicy": "Cluster"
            },
            "status": {"loadBalancer": {}}
        }),
    );
}

/// `kubectl create job pi --image=perl -- perl -e 1`, plus pointer fields set to zero.
#[test]
fn job() {
    let mut c = go_container("pi", "perl");
    c.command = vec!["perl".into(), "-e".into(), "1".into()];
    let mut spec = go_pod_spec(vec![c]);
    spec.restart_policy = s("Never");
    let job = batch::v1::Job {
        metadata: go_meta("pi", "", &[]),
        spec: Some(batch::v1::JobSpec {
            parallelism: Some(1),
            completions: Some(1),
            backoff_limit: Some(0),
            ttl_seconds_after_finished: Some(0),
            suspend: Some(false),
            template: Some(core::v1::PodTemplateSpec {
                metadata: go_meta("", "", &[]),
                spec: Some(spec),
            }),
            ..Default::default()
        }),
        status: Some(batch::v1::JobStatus {
            active: Some(0),
            succeeded: Some(0),
            failed: Some(0),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::batch::v1::Job>(
        &body("batch/v1", "Job", &job),
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "pi", "creationTimestamp": null},
            "spec": {
                "parallelism": 1,
                "completions": 1,
                "backoffLimit": 0,
                "template": {
                    "metadata": {"creationTimestamp": null},
                    "spec": {
                        "containers": [{"name": "pi", "image": "perl", "command": ["perl", "-e", "1"], "resources": {}}],
                        "restartPolicy": "Never"
                    }
                },
                "ttlSecondsAfterFinished": 0,
                "suspend": false
            },
            "status": {}
        }),
    );
}

/// `kubectl create cronjob tick --image=busybox --schedule="*/5 * * * *"`.
#[test]
fn cronjob() {
    let mut spec = go_pod_spec(vec![go_container("tick", "busybox")]);
    spec.restart_policy = s("OnFailure");
    let cj = batch::v1::CronJob {
        metadata: go_meta("tick", "", &[]),
        spec: Some(batch::v1::CronJobSpec {
            schedule: s("*/5 * * * *"),
            time_zone: s("Europe/Paris"),
            concurrency_policy: s(""),
            suspend: Some(false),
            job_template: Some(batch::v1::JobTemplateSpec {
                metadata: go_meta("tick", "", &[]),
                spec: Some(batch::v1::JobSpec {
                    template: Some(core::v1::PodTemplateSpec {
                        metadata: go_meta("", "", &[]),
                        spec: Some(spec),
                    }),
                    ..Default::default()
                }),
            }),
            successful_jobs_history_limit: Some(3),
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    check::<k8s_openapi::api::batch::v1::CronJob>(
        &body("batch/v1", "CronJob", &cj),
        json!({
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "tick", "creationTimestamp": null},
            "spec": {
                "schedule": "*/5 * * * *",
                "timeZone": "Europe/Paris",
                "suspend": false,
                "jobTemplate": {
                    "metadata": {"name": "tick", "creationTimestamp": null},
                    "spec": {"template": {
                        "metadata": {"creationTimestamp": null},
                        "spec": {"containers": [{"name": "tick", "image": "busybox", "resources": {}}], "restartPolicy": "OnFailure"}
                    }}
                },
                "successfulJobsHistoryLimit": 3
            },
            "status": {}
        }),
    );
}

#[test]
fn hpa_v2_with_metrics_and_behavior() {
    let hpa = autoscaling::v2::HorizontalPodAutoscaler {
        metadata: go_meta("web", "default", &[]),
        spec: Some(autoscaling::v2::HorizontalPodAutoscalerSpec {
            scale_target_ref: Some(autoscaling::v2::CrossVersionObjectReference {
                kind: s("Deployment"),
                name: s("web"),
                api_version: s("apps/v1"),
            }),
            min_replicas: Some(1),
            max_replicas: Some(10),
            metrics: vec![
                autoscaling::v2::MetricSpec {
                    r#type: s("Resource"),
                    resource: Some(autoscaling::v2::ResourceMetricSource {
                        name: s("cpu"),
                        target: Some(autoscaling::v2::MetricTarget {
                            r#type: s("Utilization"),
                            average_utilization: Some(80),
                            ..Default::default()
                        }),
                    }),
                    ..Default::default()
                },
                autoscaling::v2::MetricSpec {
                    r#type: s("Pods"),
                    pods: Some(autoscaling::v2::PodsMetricSource {
                        metric: Some(autoscaling::v2::MetricIdentifier {
                            name: s("requests_per_second"),
                            selector: None,
                        }),
                        target: Some(autoscaling::v2::MetricTarget {
                            r#type: s("AverageValue"),
                            average_value: Some(Quantity { string: s("1k") }),
                            ..Default::default()
                        }),
                    }),
                    ..Default::default()
                },
            ],
            behavior: Some(autoscaling::v2::HorizontalPodAutoscalerBehavior {
                scale_up: None,
                scale_down: Some(autoscaling::v2::HpaScalingRules {
                    stabilization_window_seconds: Some(0),
                    select_policy: s("Max"),
                    policies: vec![autoscaling::v2::HpaScalingPolicy {
                        r#type: s("Percent"),
                        value: Some(100),
                        period_seconds: Some(15),
                    }],
                    tolerance: None,
                }),
            }),
        }),
        status: None,
    };
    check::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(
        &body("autoscaling/v2", "HorizontalPodAutoscaler", &hpa),
        json!({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
                "minReplicas": 1,
                "maxReplicas": 10,
                "metrics": [
                    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}},
                    {"type": "Pods", "pods": {
                        "metric": {"name": "requests_per_second"},
                        "target": {"type": "AverageValue", "averageValue": "1k"}
                    }}
                ],
                "behavior": {"scaleDown": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]
                }}
            }
        }),
    );
}

/// `kubectl autoscale deployment web --min=2 --max=5 --cpu-percent=70`.
#[test]
fn hpa_v1_from_kubectl_autoscale() {
    let hpa = autoscaling::v1::HorizontalPodAutoscaler {
        metadata: go_meta("web", "", &[]),
        spec: Some(autoscaling::v1::HorizontalPodAutoscalerSpec {
            scale_target_ref: Some(autoscaling::v1::CrossVersionObjectReference {
                kind: s("Deployment"),
                name: s("web"),
                api_version: s("apps/v1"),
            }),
            min_replicas: Some(2),
            max_replicas: Some(5),
            target_cpu_utilization_percentage: Some(70),
        }),
        status: Some(autoscaling::v1::HorizontalPodAutoscalerStatus {
            current_replicas: Some(0),
            desired_replicas: Some(0),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler>(
        &body("autoscaling/v1", "HorizontalPodAutoscaler", &hpa),
        json!({
            "apiVersion": "autoscaling/v1",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web", "creationTimestamp": null},
            "spec": {
                "scaleTargetRef": {"kind": "Deployment", "name": "web", "apiVersion": "apps/v1"},
                "minReplicas": 2,
                "maxReplicas": 5,
                "targetCPUUtilizationPercentage": 70
            },
            "status": {"currentReplicas": 0, "desiredReplicas": 0}
        }),
    );
}

#[test]
fn lease_with_micro_time() {
    let lease = coordination::v1::Lease {
        metadata: go_meta("kube-scheduler", "kube-system", &[]),
        spec: Some(coordination::v1::LeaseSpec {
            holder_identity: s("node-1_7f3c"),
            lease_duration_seconds: Some(15),
            acquire_time: micro_time(T2026, 0),
            renew_time: micro_time(T2026 + 61, 123_456_789),
            lease_transitions: Some(0),
            strategy: None,
            preferred_holder: None,
        }),
    };
    check::<k8s_openapi::api::coordination::v1::Lease>(
        &body("coordination.k8s.io/v1", "Lease", &lease),
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "kube-scheduler", "namespace": "kube-system", "creationTimestamp": null},
            "spec": {
                "holderIdentity": "node-1_7f3c",
                "leaseDurationSeconds": 15,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:01:01.123456Z",
                "leaseTransitions": 0
            }
        }),
    );
}

#[test]
fn events_v1_event() {
    let ev = events::v1::Event {
        metadata: go_meta("web.17f2a", "default", &[]),
        event_time: micro_time(T2026, 500_000_000),
        series: Some(events::v1::EventSeries {
            count: Some(2),
            last_observed_time: micro_time(T2026 + 30, 0),
        }),
        reporting_controller: s("setpoint.dev/controller"),
        reporting_instance: s("controller-0"),
        action: s("Scaling"),
        reason: s("ScalingReplicaSet"),
        regarding: Some(core::v1::ObjectReference {
            kind: s("Deployment"),
            namespace: s("default"),
            name: s("web"),
            uid: s("u-1"),
            api_version: s("apps/v1"),
            resource_version: s("42"),
            field_path: s(""),
        }),
        related: None,
        note: s("Scaled up replica set web-5d8 to 3"),
        r#type: s("Normal"),
        deprecated_source: Some(core::v1::EventSource {
            component: s(""),
            host: s(""),
        }),
        deprecated_first_timestamp: Some(meta::Time::default()),
        deprecated_last_timestamp: Some(meta::Time::default()),
        deprecated_count: Some(0),
    };
    check::<k8s_openapi::api::events::v1::Event>(
        &body("events.k8s.io/v1", "Event", &ev),
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "web.17f2a", "namespace": "default", "creationTimestamp": null},
            "eventTime": "2026-01-01T00:00:00.500000Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:30.000000Z"},
            "reportingController": "setpoint.dev/controller",
            "reportingInstance": "controller-0",
            "action": "Scaling",
            "reason": "ScalingReplicaSet",
            "regarding": {"kind": "Deployment", "namespace": "default", "name": "web", "uid": "u-1", "apiVersion": "apps/v1", "resourceVersion": "42"},
            "note": "Scaled up replica set web-5d8 to 3",
            "type": "Normal",
            "deprecatedSource": {},
            "deprecatedFirstTimestamp": null,
            "deprecatedLastTimestamp": null
        }),
    );
}

#[test]
fn core_v1_event() {
    let ev = core::v1::Event {
        metadata: go_meta("web.1", "default", &[]),
        involved_object: Some(core::v1::ObjectReference {
            kind: s("Pod"),
            name: s("web-1"),
            namespace: s("default"),
            ..Default::default()
        }),
        reason: s("Started"),
        message: s("Started container web"),
        source: Some(core::v1::EventSource {
            component: s("kubelet"),
            host: s("node-1"),
        }),
        first_timestamp: time(T2026),
        last_timestamp: time(T2026 + 3600),
        count: Some(1),
        r#type: s("Normal"),
        event_time: Some(meta::MicroTime::default()),
        reporting_component: s("kubelet"),
        reporting_instance: s("node-1"),
        ..Default::default()
    };
    check::<k8s_openapi::api::core::v1::Event>(
        &body("v1", "Event", &ev),
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "default", "creationTimestamp": null},
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": "default"},
            "reason": "Started",
            "message": "Started container web",
            "source": {"component": "kubelet", "host": "node-1"},
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T01:00:00Z",
            "count": 1,
            "type": "Normal",
            "eventTime": null,
            "reportingComponent": "kubelet",
            "reportingInstance": "node-1"
        }),
    );
}

#[test]
fn pod_with_status_volumes_and_init_containers() {
    let mut init = go_container("init", "busybox");
    init.restart_policy = s("Always"); // sidecar
    let mut spec = go_pod_spec(vec![go_container("web", "nginx")]);
    spec.init_containers = vec![init];
    spec.node_name = s("node-1");
    spec.security_context = Some(core::v1::PodSecurityContext {
        supplemental_groups: vec![1000, 2000],
        fs_group: Some(0),
        ..Default::default()
    });
    spec.volumes = vec![
        core::v1::Volume {
            name: s("scratch"),
            volume_source: Some(core::v1::VolumeSource {
                empty_dir: Some(core::v1::EmptyDirVolumeSource {
                    medium: s(""),
                    size_limit: Some(Quantity { string: s("1Gi") }),
                }),
                ..Default::default()
            }),
        },
        core::v1::Volume {
            name: s("token"),
            volume_source: Some(core::v1::VolumeSource {
                projected: Some(core::v1::ProjectedVolumeSource {
                    sources: vec![core::v1::VolumeProjection {
                        service_account_token: Some(core::v1::ServiceAccountTokenProjection {
                            audience: s(""),
                            expiration_seconds: Some(3607),
                            path: s("token"),
                        }),
                        ..Default::default()
                    }],
                    default_mode: Some(420),
                }),
                ..Default::default()
            }),
        },
    ];
    let pod = core::v1::Pod {
        metadata: go_meta("web-1", "default", &[]),
        spec: Some(spec),
        status: Some(core::v1::PodStatus {
            phase: s("Running"),
            host_ip: s("10.0.0.1"),
            host_ips: vec![core::v1::HostIp { ip: s("10.0.0.1") }],
            pod_ip: s("10.1.0.5"),
            pod_ips: vec![core::v1::PodIp { ip: s("10.1.0.5") }],
            start_time: time(T2026),
            qos_class: s("BestEffort"),
            conditions: vec![core::v1::PodCondition {
                r#type: s("Ready"),
                status: s("True"),
                last_probe_time: Some(meta::Time::default()),
                last_transition_time: time(T2026 + 5),
                reason: s(""),
                message: s(""),
                observed_generation: None,
            }],
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::core::v1::Pod>(
        &body("v1", "Pod", &pod),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "volumes": [
                    {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
                    {"name": "token", "projected": {
                        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}],
                        "defaultMode": 420
                    }}
                ],
                "initContainers": [{"name": "init", "image": "busybox", "resources": {}, "restartPolicy": "Always"}],
                "containers": [{"name": "web", "image": "nginx", "resources": {}}],
                "nodeName": "node-1",
                "securityContext": {"supplementalGroups": [1000, 2000], "fsGroup": 0}
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-01-01T00:00:05Z"}],
                "hostIP": "10.0.0.1",
                "hostIPs": [{"ip": "10.0.0.1"}],
                "podIP": "10.1.0.5",
                "podIPs": [{"ip": "10.1.0.5"}],
                "startTime": "2026-01-01T00:00:00Z",
                "qosClass": "BestEffort"
            }
        }),
    );
}

#[test]
fn node_with_taints_and_capacity() {
    let node = core::v1::Node {
        metadata: go_meta("node-1", "", &[("kubernetes.io/hostname", "node-1")]),
        spec: Some(core::v1::NodeSpec {
            pod_cidr: s("10.1.0.0/24"),
            pod_cid_rs: vec!["10.1.0.0/24".into()],
            unschedulable: Some(true),
            taints: vec![core::v1::Taint {
                key: s("node.kubernetes.io/unschedulable"),
                value: s(""),
                effect: s("NoSchedule"),
                time_added: time(T2026),
            }],
            ..Default::default()
        }),
        status: Some(core::v1::NodeStatus {
            capacity: quantities(&[("cpu", "2"), ("memory", "24Gi"), ("pods", "110")]),
            addresses: vec![core::v1::NodeAddress {
                r#type: s("InternalIP"),
                address: s("10.0.0.1"),
            }],
            daemon_endpoints: Some(core::v1::NodeDaemonEndpoints {
                kubelet_endpoint: Some(core::v1::DaemonEndpoint { port: Some(10250) }),
            }),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::core::v1::Node>(
        &body("v1", "Node", &node),
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-1", "creationTimestamp": null, "labels": {"kubernetes.io/hostname": "node-1"}},
            "spec": {
                "podCIDR": "10.1.0.0/24",
                "podCIDRs": ["10.1.0.0/24"],
                "unschedulable": true,
                "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAdded": "2026-01-01T00:00:00Z"}]
            },
            "status": {
                "capacity": {"cpu": "2", "memory": "24Gi", "pods": "110"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}
            }
        }),
    );
}

#[test]
fn service_account_endpoints_quota_limitrange_rc_binding() {
    let sa = core::v1::ServiceAccount {
        metadata: go_meta("builder", "ci", &[]),
        secrets: vec![],
        image_pull_secrets: vec![core::v1::LocalObjectReference { name: s("regcred") }],
        automount_service_account_token: Some(false),
    };
    check::<k8s_openapi::api::core::v1::ServiceAccount>(
        &body("v1", "ServiceAccount", &sa),
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "builder", "namespace": "ci", "creationTimestamp": null},
            "imagePullSecrets": [{"name": "regcred"}],
            "automountServiceAccountToken": false
        }),
    );

    let ep = core::v1::Endpoints {
        metadata: go_meta("web", "default", &[]),
        subsets: vec![core::v1::EndpointSubset {
            addresses: vec![core::v1::EndpointAddress {
                ip: s("10.1.0.5"),
                hostname: s(""),
                node_name: s("node-1"),
                target_ref: Some(core::v1::ObjectReference {
                    kind: s("Pod"),
                    name: s("web-1"),
                    ..Default::default()
                }),
            }],
            not_ready_addresses: vec![],
            ports: vec![core::v1::EndpointPort {
                name: s(""),
                port: Some(8080),
                protocol: s("TCP"),
                app_protocol: None,
            }],
        }],
    };
    check::<k8s_openapi::api::core::v1::Endpoints>(
        &body("v1", "Endpoints", &ep),
        json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null},
            "subsets": [{
                "addresses": [{"ip": "10.1.0.5", "nodeName": "node-1", "targetRef": {"kind": "Pod", "name": "web-1"}}],
                "ports": [{"port": 8080, "protocol": "TCP"}]
            }]
        }),
    );

    let quota = core::v1::ResourceQuota {
        metadata: go_meta("compute", "default", &[]),
        spec: Some(core::v1::ResourceQuotaSpec {
            hard: quantities(&[("requests.cpu", "4"), ("pods", "10")]),
            scopes: vec!["NotTerminating".into()],
            scope_selector: None,
        }),
        status: Some(Default::default()),
    };
    check::<k8s_openapi::api::core::v1::ResourceQuota>(
        &body("v1", "ResourceQuota", &quota),
        json!({
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "compute", "namespace": "default", "creationTimestamp": null},
            "spec": {"hard": {"pods": "10", "requests.cpu": "4"}, "scopes": ["NotTerminating"]},
            "status": {}
        }),
    );

    let lr = core::v1::LimitRange {
        metadata: go_meta("defaults", "default", &[]),
        spec: Some(core::v1::LimitRangeSpec {
            limits: vec![core::v1::LimitRangeItem {
                r#type: s("Container"),
                default: quantities(&[("cpu", "500m")]),
                default_request: quantities(&[("cpu", "100m")]),
                max_limit_request_ratio: quantities(&[("cpu", "10")]),
                ..Default::default()
            }],
        }),
    };
    check::<k8s_openapi::api::core::v1::LimitRange>(
        &body("v1", "LimitRange", &lr),
        json!({
            "apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": "defaults", "namespace": "default", "creationTimestamp": null},
            "spec": {"limits": [{
                "type": "Container",
                "default": {"cpu": "500m"},
                "defaultRequest": {"cpu": "100m"},
                "maxLimitRequestRatio": {"cpu": "10"}
            }]}
        }),
    );

    let rc = core::v1::ReplicationController {
        metadata: go_meta("legacy", "default", &[]),
        spec: Some(core::v1::ReplicationControllerSpec {
            replicas: Some(2),
            min_ready_seconds: Some(0),
            selector: map(&[("app", "legacy")]),
            template: Some(core::v1::PodTemplateSpec {
                metadata: go_meta("", "", &[("app", "legacy")]),
                spec: Some(go_pod_spec(vec![go_container("c", "nginx")])),
            }),
        }),
        status: Some(core::v1::ReplicationControllerStatus {
            replicas: Some(0),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::core::v1::ReplicationController>(
        &body("v1", "ReplicationController", &rc),
        json!({
            "apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": "legacy", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "replicas": 2,
                "selector": {"app": "legacy"},
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "legacy"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx", "resources": {}}]}
                }
            },
            "status": {"replicas": 0}
        }),
    );

    let binding = core::v1::Binding {
        metadata: go_meta("web-1", "default", &[]),
        target: Some(core::v1::ObjectReference {
            kind: s("Node"),
            name: s("node-1"),
            namespace: s(""),
            uid: s(""),
            api_version: s("v1"),
            resource_version: s(""),
            field_path: s(""),
        }),
    };
    check::<k8s_openapi::api::core::v1::Binding>(
        &body("v1", "Binding", &binding),
        json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": null},
            "target": {"kind": "Node", "name": "node-1", "apiVersion": "v1"}
        }),
    );
}

#[test]
fn replicaset_statefulset_daemonset_controllerrevision() {
    let template = || core::v1::PodTemplateSpec {
        metadata: go_meta("", "", &[("app", "db")]),
        spec: Some(go_pod_spec(vec![go_container("db", "postgres:17")])),
    };
    let template_json = json!({
        "metadata": {"creationTimestamp": null, "labels": {"app": "db"}},
        "spec": {"containers": [{"name": "db", "image": "postgres:17", "resources": {}}]}
    });
    let selector = || {
        Some(meta::LabelSelector {
            match_labels: map(&[("app", "db")]),
            match_expressions: vec![],
        })
    };

    let rs = apps::v1::ReplicaSet {
        metadata: go_meta("db-5d8", "default", &[]),
        spec: Some(apps::v1::ReplicaSetSpec {
            replicas: Some(1),
            min_ready_seconds: Some(0),
            selector: selector(),
            template: Some(template()),
        }),
        status: Some(apps::v1::ReplicaSetStatus {
            replicas: Some(0),
            ..Default::default()
        }),
    };
    check::<k8s_openapi::api::apps::v1::ReplicaSet>(
        &body("apps/v1", "ReplicaSet", &rs),
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "db-5d8", "namespace": "default", "creationTimestamp": null},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}}, "template": template_json},
            "status": {"replicas": 0}
        }),
    );

    let sts = apps::v1::StatefulSet {
        metadata: go_meta("db", "default", &[]),
        spec: Some(apps::v1::StatefulSetSpec {
            replicas: Some(3),
            selector: selector(),
            template: Some(template()),
            volume_claim_templates: vec![core::v1::PersistentVolumeClaim {
                metadata: go_meta("data", "", &[]),
                spec: Some(core::v1::PersistentVolumeClaimSpec {
                    access_modes: vec!["ReadWriteOnce".into()],
                    resources: Some(core::v1::VolumeResourceRequirements {
                        limits: BTreeMap::new(),
                        requests: quantities(&[("storage", "10Gi")]),
                    }),
                    storage_class_name: s(""),
                    ..Default::default()
                }),
                status: Some(Default::default()),
            }],
            service_name: s("db"),
            pod_management_policy: s("Parallel"),
            update_strategy: Some(apps::v1::StatefulSetUpdateStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(apps::v1::RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    max_unavailable: None,
                }),
            }),
            ordinals: Some(apps::v1::StatefulSetOrdinals { start: Some(1) }),
            ..Default::default()
        }),
        status: None,
    };
    check::<k8s_openapi::api::apps::v1::StatefulSet>(
        &body("apps/v1", "StatefulSet", &sts),
        json!({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "db", "namespace": "default", "creationTimestamp": null},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "db"}},
                "template": template_json,
                "volumeClaimTemplates": [{
                    "metadata": {"name": "data", "creationTimestamp": null},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": ""},
                    "status": {}
                }],
                "serviceName": "db",
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
                "ordinals": {"start": 1}
            }
        }),
    );

    let ds = apps::v1::DaemonSet {
        metadata: go_meta("agent", "kube-system", &[]),
        spec: Some(apps::v1::DaemonSetSpec {
            selector: selector(),
            template: Some(template()),
            update_strategy: Some(apps::v1::DaemonSetUpdateStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(apps::v1::RollingUpdateDaemonSet {
                    max_unavailable: int_port(1),
                    max_surge: int_port(0),
                }),
            }),
            min_ready_seconds: Some(0),
            revision_history_limit: Some(10),
        }),
        status: None,
    };
    check::<k8s_openapi::api::apps::v1::DaemonSet>(
        &body("apps/v1", "DaemonSet", &ds),
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": "kube-system", "creationTimestamp": null},
            "spec": {
                "selector": {"matchLabels": {"app": "db"}},
                "template": template_json,
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
                "revisionHistoryLimit": 10
            }
        }),
    );

    let cr = apps::v1::ControllerRevision {
        metadata: go_meta("db-7c9", "default", &[]),
        data: Some(RawExtension {
            raw: Some(br#"{"spec":{"template":{"$patch":"replace"}}}"#.to_vec()),
        }),
        revision: Some(2),
    };
    check::<k8s_openapi::api::apps::v1::ControllerRevision>(
        &body("apps/v1", "ControllerRevision", &cr),
        json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "metadata": {"name": "db-7c9", "namespace": "default", "creationTimestamp": null},
            "data": {"spec": {"template": {"$patch": "replace"}}},
            "revision": 2
        }),
    );
}

#[test]
fn metadata_owner_references_finalizers_and_managed_fields() {
    let mut m = go_meta("web-5d8", "default", &[]).unwrap();
    m.owner_references = vec![meta::OwnerReference {
        api_version: s("apps/v1"),
        kind: s("Deployment"),
        name: s("web"),
        uid: s("u-1"),
        controller: Some(true),
        block_owner_deletion: Some(false),
    }];
    m.finalizers = vec!["example.com/cleanup".into()];
    m.deletion_timestamp = time(T2026);
    m.deletion_grace_period_seconds = Some(0);
    m.managed_fields = vec![meta::ManagedFieldsEntry {
        manager: s("kubectl-create"),
        operation: s("Update"),
        api_version: s("apps/v1"),
        time: time(T2026),
        fields_type: s("FieldsV1"),
        fields_v1: Some(meta::FieldsV1 {
            raw: Some(br#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}}}"#.to_vec()),
        }),
        subresource: s(""),
    }];
    let rs = apps::v1::ReplicaSet {
        metadata: Some(m),
        spec: None,
        status: None,
    };
    check::<k8s_openapi::api::apps::v1::ReplicaSet>(
        &body("apps/v1", "ReplicaSet", &rs),
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": "web-5d8",
                "namespace": "default",
                "creationTimestamp": null,
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": 0,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-1", "controller": true, "blockOwnerDeletion": false}],
                "finalizers": ["example.com/cleanup"],
                "managedFields": [{
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "apiVersion": "apps/v1",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}
                }]
            }
        }),
    );
}

/// `kubectl create token builder --duration=1h --bound-object-kind=Pod ...`.
#[test]
fn token_request() {
    let tr = authentication::v1::TokenRequest {
        metadata: go_meta("builder", "ci", &[]),
        spec: Some(authentication::v1::TokenRequestSpec {
            audiences: vec!["https://kubernetes.default.svc".into()],
            expiration_seconds: Some(3600),
            bound_object_ref: Some(authentication::v1::BoundObjectReference {
                kind: s("Pod"),
                api_version: s("v1"),
                name: s("web-1"),
                u_id: s(""),
            }),
        }),
        status: None,
    };
    let mut expected = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "metadata": {"name": "builder", "namespace": "ci", "creationTimestamp": null},
        "spec": {
            "audiences": ["https://kubernetes.default.svc"],
            "expirationSeconds": 3600,
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "web-1"}
        }
    });
    check::<k8s_openapi::api::authentication::v1::TokenRequest>(
        &body("authentication.k8s.io/v1", "TokenRequest", &tr),
        expected.clone(),
    );
    // kubectl (Go) also writes the zero status; Go's JSON for it is
    // `{"token":"","expirationTimestamp":null}` (token has no omitempty, a zero Time is null).
    let with_status = authentication::v1::TokenRequest {
        status: Some(authentication::v1::TokenRequestStatus {
            token: s(""),
            expiration_timestamp: Some(meta::Time::default()),
        }),
        ..tr
    };
    expected["status"] = json!({"token": "", "expirationTimestamp": null});
    assert_eq!(
        decode(&body(
            "authentication.k8s.io/v1",
            "TokenRequest",
            &with_status
        ))
        .unwrap(),
        expected
    );
}

/// `kubectl auth can-i create deployments.apps -n default`.
#[test]
fn self_subject_access_review() {
    let ssar = authorization::v1::SelfSubjectAccessReview {
        metadata: go_meta("", "", &[]),
        spec: Some(authorization::v1::SelfSubjectAccessReviewSpec {
            resource_attributes: Some(authorization::v1::ResourceAttributes {
                namespace: s("default"),
                verb: s("create"),
                group: s("apps"),
                version: s(""),
                resource: s("deployments"),
                subresource: s(""),
                name: s(""),
                field_selector: None,
                label_selector: None,
            }),
            non_resource_attributes: None,
        }),
        status: Some(authorization::v1::SubjectAccessReviewStatus {
            allowed: Some(false),
            denied: Some(false),
            reason: s(""),
            evaluation_error: s(""),
        }),
    };
    check::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(
        &body("authorization.k8s.io/v1", "SelfSubjectAccessReview", &ssar),
        json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "metadata": {"creationTimestamp": null},
            "spec": {"resourceAttributes": {"namespace": "default", "verb": "create", "group": "apps", "resource": "deployments"}},
            "status": {"allowed": false}
        }),
    );
}

/// `kubectl drain` posts an Eviction; DeleteOptions can also be a body on its own.
#[test]
fn eviction_and_delete_options() {
    let opts = meta::DeleteOptions {
        grace_period_seconds: Some(0),
        preconditions: Some(meta::Preconditions {
            uid: s("u-1"),
            resource_version: None,
        }),
        orphan_dependents: None,
        propagation_policy: s("Foreground"),
        dry_run: vec!["All".into()],
        ignore_store_read_error_with_cluster_breaking_potential: None,
    };
    let ev = policy::v1::Eviction {
        metadata: go_meta("web-1", "default", &[]),
        delete_options: Some(opts.clone()),
    };
    check::<k8s_openapi::api::policy::v1::Eviction>(
        &body("policy/v1", "Eviction", &ev),
        json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": null},
            "deleteOptions": {"gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}, "propagationPolicy": "Foreground", "dryRun": ["All"]}
        }),
    );
    let expected = json!({
        "apiVersion": "apps/v1", "kind": "DeleteOptions",
        "gracePeriodSeconds": 0, "preconditions": {"uid": "u-1"}, "propagationPolicy": "Foreground", "dryRun": ["All"]
    });
    assert_eq!(
        decode(&body("apps/v1", "DeleteOptions", &opts)).unwrap(),
        expected
    );
    let _: k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions =
        serde_json::from_value(expected).unwrap();
    assert!(supports("", "v1", "DeleteOptions"));
    assert!(supports("meta.k8s.io", "v1", "DeleteOptions"));
}

/// `kubectl scale` (typed client) sends autoscaling/v1 Scale; status.replicas is required.
#[test]
fn scale() {
    let scale = autoscaling::v1::Scale {
        metadata: go_meta("web", "default", &[]),
        spec: Some(autoscaling::v1::ScaleSpec { replicas: Some(5) }),
        status: Some(autoscaling::v1::ScaleStatus {
            replicas: Some(0),
            selector: s(""),
        }),
    };
    check::<k8s_openapi::api::autoscaling::v1::Scale>(
        &body("autoscaling/v1", "Scale", &scale),
        json!({
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": "web", "namespace": "default", "creationTimestamp": null},
            "spec": {"replicas": 5},
            "status": {"replicas": 0}
        }),
    );
}

// ---------------------------------------------------------------------------------------------
// wire-format details

/// Hand-built bytes: a key, then a length-delimited value.
fn len_field(tag: u8, bytes: &[u8]) -> Vec<u8> {
    assert!(bytes.len() < 128 && tag < 16);
    [vec![(tag << 3) | 2, bytes.len() as u8], bytes.to_vec()].concat()
}

fn raw_body(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let tm = [
        len_field(1, api_version.as_bytes()),
        len_field(2, kind.as_bytes()),
    ]
    .concat();
    let mut out = b"k8s\0".to_vec();
    out.extend(len_field(1, &tm));
    // raw may be long: encode its length as a varint
    out.push(0x12);
    let mut n = raw.len();
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(raw);
    out
}

#[test]
fn packed_and_unpacked_repeated_scalars_and_merged_messages() {
    // PodSecurityContext.supplementalGroups (tag 4, int64): one packed run plus one unpacked value.
    let psc = [
        vec![0x22, 0x03, 0x01, 0x02, 0x03], // packed 1, 2, 3
        vec![0x20, 0x04],                   // unpacked 4
    ]
    .concat();
    let pod_spec = [len_field(14, &psc)].concat(); // PodSpec.securityContext = 14
                                                   // Pod.metadata given twice: protobuf merges the two occurrences.
    let pod = [
        len_field(1, &len_field(1, b"p")), // metadata.name
        len_field(
            1,
            &len_field(11, &[len_field(1, b"a"), len_field(2, b"b")].concat()),
        ), // metadata.labels
        len_field(2, &pod_spec),
    ]
    .concat();
    let got = decode(&raw_body("v1", "Pod", &pod)).unwrap();
    assert_eq!(
        got,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"securityContext": {"supplementalGroups": [1, 2, 3, 4]}}
        })
    );
}

#[test]
fn unknown_fields_are_skipped() {
    // Namespace with an unknown field 99 (varint) and 100 (fixed64) and 101 (fixed32).
    let ns = [
        vec![0x98, 0x06, 0x01],
        vec![0xa1, 0x06, 1, 2, 3, 4, 5, 6, 7, 8],
        vec![0xad, 0x06, 1, 2, 3, 4],
        len_field(1, &len_field(1, b"ns")),
    ]
    .concat();
    assert_eq!(
        decode(&raw_body("v1", "Namespace", &ns)).unwrap(),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}})
    );
}

#[test]
fn negative_int32_and_int64() {
    // PodSpec.priority (tag 25, int32) = -1 as a 10-byte varint; activeDeadlineSeconds (5) = -2.
    let mut spec = vec![0xc8, 0x01];
    spec.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    spec.extend([
        0x28, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ]);
    let pod = len_field(2, &spec);
    assert_eq!(
        decode(&raw_body("v1", "Pod", &pod)).unwrap(),
        json!({"apiVersion": "v1", "kind": "Pod", "spec": {"activeDeadlineSeconds": -2, "priority": -1}})
    );
}

#[test]
fn json_content_type_in_the_envelope() {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s("v1"),
            kind: s("ConfigMap"),
        }),
        raw: Some(br#"{"metadata":{"name":"x"},"data":{"a":"b"}}"#.to_vec()),
        content_encoding: s(""),
        content_type: s("application/json"),
    };
    let body = [b"k8s\0".as_slice(), &unknown.encode_to_vec()].concat();
    assert_eq!(
        decode(&body).unwrap(),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}})
    );
}

#[test]
fn supports_lists_the_kinds() {
    for (g, v, k) in [
        ("", "v1", "Pod"),
        ("", "v1", "Service"),
        ("", "v1", "Namespace"),
        ("", "v1", "Node"),
        ("", "v1", "ConfigMap"),
        ("", "v1", "Secret"),
        ("", "v1", "ServiceAccount"),
        ("", "v1", "Endpoints"),
        ("", "v1", "Event"),
        ("", "v1", "ReplicationController"),
        ("", "v1", "ResourceQuota"),
        ("", "v1", "LimitRange"),
        ("", "v1", "Binding"),
        ("apps", "v1", "Deployment"),
        ("apps", "v1", "ReplicaSet"),
        ("apps", "v1", "StatefulSet"),
        ("apps", "v1", "DaemonSet"),
        ("apps", "v1", "ControllerRevision"),
        ("batch", "v1", "Job"),
        ("batch", "v1", "CronJob"),
        ("autoscaling", "v1", "Scale"),
        ("autoscaling", "v2", "HorizontalPodAutoscaler"),
        ("coordination.k8s.io", "v1", "Lease"),
        ("events.k8s.io", "v1", "Event"),
        ("meta.k8s.io", "v1", "DeleteOptions"),
        ("authorization.k8s.io", "v1", "SelfSubjectAccessReview"),
        ("authentication.k8s.io", "v1", "TokenRequest"),
        ("policy", "v1", "Eviction"),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding"),
        ("networking.k8s.io", "v1", "Ingress"),
    ] {
        assert!(supports(g, v, k), "{g}/{v} {k}");
    }
    assert!(!supports("apps", "v1", "Pod"));
    assert!(!supports("example.com", "v1", "Widget"));
}

// ---------------------------------------------------------------------------------------------
// errors

#[test]
fn bad_magic() {
    assert!(matches!(decode(b""), Err(DecodeError::BadMagic)));
    assert!(matches!(decode(b"k8s"), Err(DecodeError::BadMagic)));
    assert!(matches!(
        decode(b"{\"kind\":\"Pod\"}"),
        Err(DecodeError::BadMagic)
    ));
    assert!(decode(b"k8s\x01rest")
        .unwrap_err()
        .to_string()
        .contains("magic"));
}

#[test]
fn unknown_kind() {
    let err = decode(&raw_body("example.com/v1", "Widget", &[])).unwrap_err();
    assert!(matches!(&err, DecodeError::UnknownKind { kind, .. } if kind == "Widget"));
    assert_eq!(
        err.to_string(),
        "unknown kind Widget in example.com/v1: no protobuf schema is known for it"
    );
}

#[test]
fn missing_type_meta_and_compressed_bodies() {
    let err = decode(b"k8s\0").unwrap_err();
    assert!(matches!(err, DecodeError::UnsupportedEnvelope(_)), "{err}");
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s("v1"),
            kind: s("Pod"),
        }),
        raw: Some(vec![]),
        content_encoding: s("gzip"),
        content_type: s(""),
    };
    let body = [b"k8s\0".as_slice(), &unknown.encode_to_vec()].concat();
    assert!(decode(&body).unwrap_err().to_string().contains("gzip"));
}

#[test]
fn truncated_varint() {
    // ObjectMeta.generation (tag 7, varint) whose varint never ends.
    let pod = len_field(1, &[0x38, 0xff, 0xff]);
    let err = decode(&raw_body("v1", "Pod", &pod)).unwrap_err();
    assert!(
        matches!(err, DecodeError::Truncated { message, field: Some(7) } if message.ends_with("meta.v1.ObjectMeta")),
        "{err}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");
}

#[test]
fn wrong_wire_type() {
    // ObjectMeta.name (tag 1, string) sent as a varint.
    let pod = len_field(1, &[0x08, 0x01]);
    let err = decode(&raw_body("v1", "Pod", &pod)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed field 1 in message k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta: \
         varint wire type where length-delimited was expected"
    );
    // PodSpec.hostNetwork (tag 11, bool) sent length-delimited.
    let pod = len_field(2, &len_field(11, b"x"));
    let err = decode(&raw_body("v1", "Pod", &pod)).unwrap_err();
    assert!(
        matches!(err, DecodeError::MalformedField { field: 11, message, .. } if message.ends_with("core.v1.PodSpec"))
    );
}

#[test]
fn invalid_embedded_json_and_times() {
    let cr = apps::v1::ControllerRevision {
        metadata: None,
        data: Some(RawExtension {
            raw: Some(b"{not json".to_vec()),
        }),
        revision: Some(1),
    };
    let err = decode(&body("apps/v1", "ControllerRevision", &cr)).unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");

    let ns = core::v1::Namespace {
        metadata: Some(meta::ObjectMeta {
            creation_timestamp: Some(meta::Time {
                seconds: Some(0),
                nanos: Some(-1),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(decode(&body("v1", "Namespace", &ns)).is_err());
}

#[test]
fn every_truncation_of_a_real_body_fails_cleanly() {
    let d = apps::v1::Deployment {
        metadata: go_meta("web", "default", &[("app", "web")]),
        spec: Some(apps::v1::DeploymentSpec {
            replicas: Some(2),
            template: Some(core::v1::PodTemplateSpec {
                metadata: go_meta("", "", &[("app", "web")]),
                spec: Some(go_pod_spec(vec![go_container("nginx", "nginx")])),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let full = body("apps/v1", "Deployment", &d);
    assert!(decode(&full).is_ok());
    // A cut at a field boundary of the envelope is valid protobuf (the later fields are just
    // absent): right after typeMeta, and before/after the two trailing empty strings. Any other
    // cut leaves a key without its value or a length that runs past the end.
    let raw_len = d.encode_to_vec().len();
    let raw_field = 1 + prost::encoding::encoded_len_varint(raw_len as u64) + raw_len;
    let boundaries = [full.len() - 4 - raw_field, full.len() - 4, full.len() - 2];
    for len in 0..full.len() {
        let result = decode(&full[..len]);
        assert_eq!(
            result.is_ok(),
            boundaries.contains(&len),
            "prefix of {len} bytes: {result:?}"
        );
    }
}
