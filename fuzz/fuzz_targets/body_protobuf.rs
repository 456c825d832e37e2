//! Kubernetes protobuf request bodies (`k8s\0` + `runtime.Unknown`), decoded by
//! `setpoint_protobuf::decode`.
//!
//! Must hold, for any bytes: decoding returns an object or an error, never panics. For a body
//! that decodes: the object names its `apiVersion` and `kind`, and for the kinds listed below it
//! is JSON the k8s-openapi type reads. For a body whose object the generated Go-compatible
//! types (k8s-pb, prost) read and Setpoint decodes: the same object re-encoded canonically
//! decodes to the same JSON (field order, repeated or merged messages, packed or unpacked
//! numbers do not change what an object is). Setpoint may refuse what prost reads: embedded
//! JSON that is not JSON, and deprecated protobuf groups, which Go's decoder skips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use serde_json::Value;

use k8s_pb::apimachinery::pkg::runtime::Unknown;

/// Re-encodes `raw` canonically as message `T`: `None` when prost does not read it.
fn canonical<T: Message + Default>(raw: &[u8]) -> Option<Vec<u8>> {
    T::decode(raw).ok().map(|m| m.encode_to_vec())
}

/// Whether k8s-openapi's type `T` reads `v`.
fn openapi_reads<T: k8s_openapi::serde::de::DeserializeOwned>(v: &Value) -> Result<(), String> {
    serde_json::from_value::<T>(v.clone())
        .map(drop)
        .map_err(|e| e.to_string())
}

macro_rules! kinds {
    ($($api_version:literal, $kind:literal => $pb:ty, $openapi:ty;)*) => {
        /// For a kind listed above: the raw object re-encoded canonically (`None` when prost
        /// does not read it), and whether k8s-openapi reads `decoded` (when given).
        fn per_kind(
            api_version: &str,
            kind: &str,
            raw: &[u8],
            decoded: Option<&Value>,
        ) -> Option<(Option<Vec<u8>>, Result<(), String>)> {
            match (api_version, kind) {
                $(($api_version, $kind) => Some((
                    canonical::<$pb>(raw),
                    decoded.map_or(Ok(()), openapi_reads::<$openapi>),
                )),)*
                _ => None,
            }
        }
    };
}

use k8s_openapi::api as oa;
use k8s_pb::api as pb;

kinds! {
    "v1", "Pod" => pb::core::v1::Pod, oa::core::v1::Pod;
    "v1", "ConfigMap" => pb::core::v1::ConfigMap, oa::core::v1::ConfigMap;
    "v1", "Secret" => pb::core::v1::Secret, oa::core::v1::Secret;
    "v1", "Service" => pb::core::v1::Service, oa::core::v1::Service;
    "v1", "Namespace" => pb::core::v1::Namespace, oa::core::v1::Namespace;
    "v1", "Node" => pb::core::v1::Node, oa::core::v1::Node;
    "v1", "Event" => pb::core::v1::Event, oa::core::v1::Event;
    "apps/v1", "Deployment" => pb::apps::v1::Deployment, oa::apps::v1::Deployment;
    "apps/v1", "ReplicaSet" => pb::apps::v1::ReplicaSet, oa::apps::v1::ReplicaSet;
    "apps/v1", "StatefulSet" => pb::apps::v1::StatefulSet, oa::apps::v1::StatefulSet;
    "batch/v1", "Job" => pb::batch::v1::Job, oa::batch::v1::Job;
    "batch/v1", "CronJob" => pb::batch::v1::CronJob, oa::batch::v1::CronJob;
    "coordination.k8s.io/v1", "Lease" => pb::coordination::v1::Lease, oa::coordination::v1::Lease;
}

fuzz_target!(|data: &[u8]| {
    let decoded = setpoint_protobuf::decode(data);
    if let Ok(v) = &decoded {
        assert!(v.is_object(), "an object: {v}");
        assert!(v["apiVersion"].is_string() && v["kind"].is_string(), "{v}");
    }
    let Some(rest) = data.strip_prefix(setpoint_protobuf::MAGIC) else {
        assert!(decoded.is_err(), "no magic, no object");
        return;
    };
    let Ok(unknown) = Unknown::decode(rest) else {
        return;
    };
    let type_meta = unknown.type_meta.clone().unwrap_or_default();
    let api_version = type_meta.api_version.clone().unwrap_or_default();
    let kind = type_meta.kind.clone().unwrap_or_default();
    let raw = unknown.raw.clone().unwrap_or_default();
    let plain_envelope = unknown.content_encoding.as_deref().unwrap_or("").is_empty()
        && matches!(
            unknown.content_type.as_deref().unwrap_or(""),
            "" | "application/vnd.kubernetes.protobuf"
        );
    let Some((reencoded, openapi)) = per_kind(&api_version, &kind, &raw, decoded.as_ref().ok())
    else {
        return;
    };
    if let Err(e) = openapi {
        panic!(
            "k8s-openapi does not read the decoded {kind}: {e}\n{}",
            decoded.as_ref().map(Value::to_string).unwrap_or_default()
        );
    }
    let Some(reencoded) = reencoded else {
        return;
    };
    if !plain_envelope {
        return;
    }
    let again = Unknown {
        raw: Some(reencoded),
        ..unknown
    };
    let body = [setpoint_protobuf::MAGIC, &again.encode_to_vec()].concat();
    let canonical = setpoint_protobuf::decode(&body);
    match (&decoded, &canonical) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the same object, however it was encoded"),
        // Refused: the canonical encoding may no longer hold what was refused (prost drops
        // unknown groups).
        (Err(_), _) => {}
        (a, b) => panic!(
            "the {kind} decodes as {:?}, and re-encoded canonically as {:?}",
            a.as_ref().map(Value::to_string),
            b.as_ref().map(Value::to_string)
        ),
    }
});
