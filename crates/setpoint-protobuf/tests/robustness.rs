//! Hostile input: random bytes, mutated real bodies and deep nesting must yield errors, never
//! panics or stack overflows.

use k8s_pb::api::{apps, core};
use k8s_pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
use proptest::prelude::*;
use prost::Message;
use setpoint_protobuf::{decode, DecodeError};

fn s(v: &str) -> Option<String> {
    Some(v.to_owned())
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: s(api_version),
            kind: s(kind),
        }),
        raw: Some(raw),
        content_encoding: s(""),
        content_type: s(""),
    };
    [b"k8s\0".as_slice(), &unknown.encode_to_vec()].concat()
}

fn sample_deployment() -> Vec<u8> {
    let d = apps::v1::Deployment {
        metadata: Some(meta::ObjectMeta {
            name: s("web"),
            labels: [("app".to_string(), "web".to_string())]
                .into_iter()
                .collect(),
            creation_timestamp: Some(meta::Time::default()),
            ..Default::default()
        }),
        spec: Some(apps::v1::DeploymentSpec {
            replicas: Some(3),
            template: Some(core::v1::PodTemplateSpec {
                metadata: None,
                spec: Some(core::v1::PodSpec {
                    containers: vec![core::v1::Container {
                        name: s("nginx"),
                        image: s("nginx"),
                        ports: vec![core::v1::ContainerPort {
                            container_port: Some(80),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    d.encode_to_vec()
}

const KINDS: &[(&str, &str)] = &[
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Node"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "ControllerRevision"),
    ("batch/v1", "CronJob"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("coordination.k8s.io/v1", "Lease"),
    ("events.k8s.io/v1", "Event"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("v1", "DeleteOptions"),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
        let _ = decode(&[b"k8s\0".as_slice(), &bytes].concat());
    }

    #[test]
    fn random_objects_of_real_kinds_never_panic(
        kind in 0..KINDS.len(),
        raw in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let (api_version, kind) = KINDS[kind];
        let _ = decode(&envelope(api_version, kind, raw));
    }

    #[test]
    fn mutated_real_bodies_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut raw = sample_deployment();
        for (at, byte, op) in edits {
            if raw.is_empty() {
                break;
            }
            let i = at.index(raw.len());
            match op {
                0 => raw[i] = byte,
                1 => raw.insert(i, byte),
                _ => {
                    raw.remove(i);
                }
            }
        }
        let _ = decode(&envelope("apps/v1", "Deployment", raw));
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let mut schema = apiext::JsonSchemaProps {
        r#type: s("object"),
        ..Default::default()
    };
    for _ in 0..500 {
        schema = apiext::JsonSchemaProps {
            not: Some(Box::new(schema)),
            ..Default::default()
        };
    }
    let crd = apiext::CustomResourceDefinition {
        metadata: None,
        spec: Some(apiext::CustomResourceDefinitionSpec {
            versions: vec![apiext::CustomResourceDefinitionVersion {
                name: s("v1"),
                schema: Some(apiext::CustomResourceValidation {
                    open_apiv3_schema: Some(schema),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let err = decode(&envelope(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        crd.encode_to_vec(),
    ))
    .unwrap_err();
    assert!(matches!(err, DecodeError::TooDeep(_)), "{err}");

    // Raw extensions that embed enveloped objects, recursively.
    let mut body = envelope("v1", "Namespace", vec![]);
    for _ in 0..200 {
        let cr = apps::v1::ControllerRevision {
            metadata: None,
            data: Some(RawExtension { raw: Some(body) }),
            revision: Some(1),
        };
        body = envelope("apps/v1", "ControllerRevision", cr.encode_to_vec());
    }
    assert!(matches!(decode(&body), Err(DecodeError::TooDeep(_))));
}

#[test]
fn nested_enveloped_object_in_a_raw_extension() {
    let inner = envelope(
        "v1",
        "Namespace",
        core::v1::Namespace {
            metadata: Some(meta::ObjectMeta {
                name: s("x"),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let cr = apps::v1::ControllerRevision {
        metadata: None,
        data: Some(RawExtension { raw: Some(inner) }),
        revision: Some(1),
    };
    let got = decode(&envelope(
        "apps/v1",
        "ControllerRevision",
        cr.encode_to_vec(),
    ))
    .unwrap();
    assert_eq!(
        got,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "ControllerRevision",
            "data": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
            "revision": 1
        })
    );
}
