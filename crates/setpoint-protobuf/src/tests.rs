//! Whole-table checks: for every kind k8s-openapi (v1.32) knows, synthesize a protobuf object in
//! which *every* field is set (recursively, cycles cut), decode it, and check that k8s-openapi
//! reads the JSON back without losing anything. k8s-openapi ignores unknown properties, so a
//! wrong JSON name, a missed inline struct or a wrong JSON shape shows up as a difference.

use std::collections::BTreeSet;

use k8s_openapi::serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use crate::decode::message;
use crate::table::{Card, Special, Ty};

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_len(out: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    put_varint(out, (u64::from(tag) << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_varint_field(out: &mut Vec<u8>, tag: u32, v: u64) {
    put_varint(out, u64::from(tag) << 3);
    put_varint(out, v);
}

/// Encodes one value of type `ty` as field `tag`; `false` when the value had to be left out
/// (a message already on the path).
fn put_value(out: &mut Vec<u8>, tag: u32, ty: Ty, path: &mut Vec<u16>) -> bool {
    match ty {
        Ty::Str => put_len(out, tag, b"s"),
        Ty::Bytes => put_len(out, tag, b"b"),
        Ty::Bool => put_varint_field(out, tag, 1),
        Ty::I32 | Ty::I64 => put_varint_field(out, tag, 7),
        Ty::F64 => {
            put_varint(out, (u64::from(tag) << 3) | 1);
            out.extend_from_slice(&1.5f64.to_le_bytes());
        }
        Ty::M(m) => {
            if path.contains(&m) {
                return false;
            }
            let bytes = synth(m, path);
            put_len(out, tag, &bytes);
        }
    }
    true
}

/// A message with every field set.
pub(crate) fn synth(index: u16, path: &mut Vec<u16>) -> Vec<u8> {
    let msg = message(index);
    let mut out = Vec::new();
    match msg.special {
        Special::Quantity => put_len(&mut out, 1, b"250m"),
        Special::IntOrString => {
            put_varint_field(&mut out, 1, 1);
            put_varint_field(&mut out, 2, 0);
            put_len(&mut out, 3, b"25%");
        }
        Special::Time | Special::MicroTime => {
            put_varint_field(&mut out, 1, 1_767_225_600);
            put_varint_field(&mut out, 2, 123_456_000);
        }
        Special::Duration => put_varint_field(&mut out, 1, 90_000_000_000),
        Special::RawJson => put_len(&mut out, 1, br#"{"a":[1,"x"]}"#),
        Special::ListWrapper => put_len(&mut out, 1, b"x"),
        Special::OrBool => put_varint_field(&mut out, 1, 1),
        Special::OrStringArray => put_len(&mut out, 2, b"x"),
        Special::OrArray | Special::None => {
            path.push(index);
            for f in msg.fields {
                match f.card {
                    Card::Map => {
                        let mut entry = Vec::new();
                        put_len(&mut entry, 1, b"k");
                        if put_value(&mut entry, 2, f.ty, path) {
                            put_len(&mut out, f.tag, &entry);
                        }
                    }
                    Card::Single | Card::Inline | Card::Repeated => {
                        put_value(&mut out, f.tag, f.ty, path);
                    }
                }
            }
            path.pop();
        }
    }
    out
}

pub(crate) fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    put_len(&mut type_meta, 1, api_version.as_bytes());
    put_len(&mut type_meta, 2, kind.as_bytes());
    let mut out = crate::MAGIC.to_vec();
    put_len(&mut out, 1, &type_meta);
    put_len(&mut out, 2, raw);
    put_len(&mut out, 3, b"");
    put_len(&mut out, 4, b"");
    out
}

/// Paths (`a.b[0].c`) where `left` has something `right` lacks or has differently.
fn diff(path: &str, left: &Value, right: &Value, out: &mut BTreeSet<String>) {
    match (left, right) {
        (Value::Object(l), Value::Object(r)) => {
            for (k, lv) in l {
                let p = format!("{path}.{k}");
                match r.get(k) {
                    Some(rv) => diff(&p, lv, rv, out),
                    // `null` and absent mean the same (Go writes null for a zero Time or an
                    // empty JSONSchemaPropsOrArray, which the cycle cut above produces).
                    None if lv.is_null() => {}
                    None => {
                        out.insert(p);
                    }
                }
            }
            // k8s-openapi writes apiVersion/kind even for embedded objects
            // (StatefulSet.spec.volumeClaimTemplates[]).
            let typemeta = |k: &&String| k.as_str() == "apiVersion" || k.as_str() == "kind";
            for k in r.keys().filter(|k| !l.contains_key(*k) && !typemeta(k)) {
                out.insert(format!("{path}.{k} (added)"));
            }
        }
        (Value::Array(l), Value::Array(r)) if l.len() == r.len() => {
            for (i, (lv, rv)) in l.iter().zip(r).enumerate() {
                diff(&format!("{path}[{i}]"), lv, rv, out);
            }
        }
        (l, r) if l == r => {}
        (l, r) => {
            out.insert(format!("{path}: {l} != {r}"));
        }
    }
}

/// Decodes a fully populated `T` and returns what k8s-openapi loses when reading it back.
fn lost_fields<T: k8s_openapi::Resource + DeserializeOwned + Serialize>() -> BTreeSet<String> {
    let index = crate::find_kind(T::GROUP, T::VERSION, T::KIND)
        .unwrap_or_else(|| panic!("no schema for {} {}", T::API_VERSION, T::KIND));
    let raw = synth(index, &mut Vec::new());
    let json = crate::decode(&envelope(T::API_VERSION, T::KIND, &raw)).expect("decodes");
    let typed: T = serde_json::from_value(json.clone()).unwrap_or_else(|e| {
        panic!(
            "k8s-openapi cannot read {} {}: {e}\n{json:#}",
            T::API_VERSION,
            T::KIND
        )
    });
    let back = serde_json::to_value(&typed).expect("serializes");
    let mut out = BTreeSet::new();
    diff(T::KIND, &json, &back, &mut out);
    out
}

/// Properties Kubernetes added after 1.32 (k8s-pb is newer than the k8s-openapi feature the
/// workspace uses), which k8s-openapi v1_32 therefore cannot read back. Any other loss fails.
fn newer_than_1_32(path: &str) -> bool {
    const NEWER: &[&str] = &[
        ".env[].valueFrom.fileKeyRef",
        ".lifecycle.stopSignal",
        "Statuses[].stopSignal",
        "ontainers[].restartPolicyRules",
        ".spec.hostnameOverride",
        ".spec.workloadRef",
        ".projected.sources[].podCertificate",
        "Pod.status.allocatedResources",
        "Pod.status.resources",
        "Pod.status.extendedResourceClaimStatus",
        "Pod.status.observedGeneration",
        "Pod.status.conditions[].observedGeneration",
        "CustomResourceDefinition.status.observedGeneration",
        "CustomResourceDefinition.status.conditions[].observedGeneration",
        "Node.status.declaredFeatures",
        "Node.status.nodeInfo.swap",
        "status.terminatingReplicas",
        ".behavior.scaleDown.tolerance",
        ".behavior.scaleUp.tolerance",
        ".hints.forNodes",
        "CSIDriver.spec.nodeAllocatableUpdatePeriodSeconds",
        "CSIDriver.spec.serviceAccountTokenInSecrets",
        "Error.errorCode",
    ];
    let mut normalized = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                normalized.push('[');
            }
            ']' => {
                in_index = false;
                normalized.push(']');
            }
            _ if in_index => {}
            c => normalized.push(c),
        }
    }
    NEWER.iter().any(|n| normalized.ends_with(n))
}

macro_rules! check_kinds {
    ($($t:ty),* $(,)?) => {{
        let mut report = Vec::new();
        $(
            for lost in lost_fields::<$t>() {
                if !newer_than_1_32(&lost) {
                    report.push(lost);
                }
            }
        )*
        report
    }};
}

#[test]
fn every_field_of_every_kind_round_trips_through_k8s_openapi() {
    use k8s_openapi::api as a;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as apireg;
    let report = check_kinds!(
        a::core::v1::Pod,
        a::core::v1::Service,
        a::core::v1::Namespace,
        a::core::v1::Node,
        a::core::v1::ConfigMap,
        a::core::v1::Secret,
        a::core::v1::ServiceAccount,
        a::core::v1::Endpoints,
        a::core::v1::Event,
        a::core::v1::ReplicationController,
        a::core::v1::ResourceQuota,
        a::core::v1::LimitRange,
        a::core::v1::Binding,
        a::core::v1::PersistentVolume,
        a::core::v1::PersistentVolumeClaim,
        a::core::v1::PodTemplate,
        a::core::v1::ComponentStatus,
        a::apps::v1::Deployment,
        a::apps::v1::ReplicaSet,
        a::apps::v1::StatefulSet,
        a::apps::v1::DaemonSet,
        a::apps::v1::ControllerRevision,
        a::batch::v1::Job,
        a::batch::v1::CronJob,
        a::autoscaling::v1::Scale,
        a::autoscaling::v1::HorizontalPodAutoscaler,
        a::autoscaling::v2::HorizontalPodAutoscaler,
        a::coordination::v1::Lease,
        a::events::v1::Event,
        a::authorization::v1::SelfSubjectAccessReview,
        a::authorization::v1::SubjectAccessReview,
        a::authorization::v1::LocalSubjectAccessReview,
        a::authorization::v1::SelfSubjectRulesReview,
        a::authentication::v1::TokenRequest,
        a::authentication::v1::TokenReview,
        a::authentication::v1::SelfSubjectReview,
        a::policy::v1::Eviction,
        a::policy::v1::PodDisruptionBudget,
        a::rbac::v1::Role,
        a::rbac::v1::ClusterRole,
        a::rbac::v1::RoleBinding,
        a::rbac::v1::ClusterRoleBinding,
        a::networking::v1::Ingress,
        a::networking::v1::IngressClass,
        a::networking::v1::NetworkPolicy,
        a::scheduling::v1::PriorityClass,
        a::certificates::v1::CertificateSigningRequest,
        a::discovery::v1::EndpointSlice,
        a::storage::v1::StorageClass,
        a::storage::v1::CSIDriver,
        a::storage::v1::CSINode,
        a::storage::v1::VolumeAttachment,
        a::storage::v1::CSIStorageCapacity,
        a::node::v1::RuntimeClass,
        a::admissionregistration::v1::MutatingWebhookConfiguration,
        a::admissionregistration::v1::ValidatingWebhookConfiguration,
        a::admissionregistration::v1::ValidatingAdmissionPolicy,
        a::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
        a::flowcontrol::v1::FlowSchema,
        a::flowcontrol::v1::PriorityLevelConfiguration,
        apiext::CustomResourceDefinition,
        apireg::APIService,
    );
    assert!(
        report.is_empty(),
        "JSON that k8s-openapi does not read back:\n{}",
        report.join("\n")
    );
}

#[test]
fn every_listed_kind_has_a_schema() {
    for k in crate::schema::KINDS {
        assert!(crate::supports(k.group, k.version, k.kind));
        let raw = synth(k.message, &mut Vec::new());
        let api_version = if k.group.is_empty() {
            k.version.to_string()
        } else {
            format!("{}/{}", k.group, k.version)
        };
        let json = crate::decode(&envelope(&api_version, k.kind, &raw))
            .unwrap_or_else(|e| panic!("{api_version} {}: {e}", k.kind));
        assert_eq!(json["kind"], k.kind);
    }
    // Kinds are sorted for binary search.
    assert!(crate::schema::KINDS
        .windows(2)
        .all(|w| (w[0].group, w[0].version, w[0].kind) < (w[1].group, w[1].version, w[1].kind)));
}

#[test]
fn every_message_field_table_is_sorted_and_typed() {
    for m in crate::schema::MESSAGES {
        assert!(
            m.fields.windows(2).all(|w| w[0].tag < w[1].tag),
            "{}",
            m.name
        );
        for f in m.fields {
            if f.card == Card::Inline {
                assert!(matches!(f.ty, Ty::M(_)), "{}", m.name);
            } else {
                assert!(!f.json.is_empty(), "{}.{}", m.name, f.tag);
            }
        }
    }
}
