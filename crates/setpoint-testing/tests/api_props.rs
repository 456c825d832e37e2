//! API-level property test: random sequences of create, update, merge patch, JSON patch,
//! strategic merge patch, server-side apply and delete, with valid and invalid bodies, against
//! ConfigMaps, Deployments and a custom resource, through the in-process server. After every
//! step:
//!
//! - every answer is a success or a 4xx `Status` (never a 5xx, never a hang);
//! - a LIST of each resource decodes as its type, the way informers decode it, every item
//!   names the resource's `kind` and `apiVersion`, carries no field its type does not have, and
//!   the names and `resourceVersion`s are exactly those of the successful writes;
//! - `resourceVersion` increases strictly across the writes that changed something (a write
//!   that changed nothing keeps the object's `resourceVersion`, as upstream's do), and a
//!   `dryRun=All` write changes nothing;
//! - the server-owned fields keep the server's values whatever a body says: `uid` and
//!   `creationTimestamp` are set once, `namespace` is the request's, no `deletionTimestamp`
//!   appears; a created Deployment has an empty `.status`, writes of the object leave its
//!   status alone, and `/status` writes change neither spec, labels, annotations nor
//!   generation.
//!
//! At checkpoints and at the end, a watch opened before the first step has seen exactly the
//! changes made, in order, with their `resourceVersion`s, and an informer's cache equals a
//! fresh LIST.
//!
//! One test runs with a fixed seed (CI); the other with a random seed that it prints. Either
//! replays a given seed with `SETPOINT_PROPTEST_SEED=<u64>`; `PROPTEST_CASES` changes the
//! number of sequences.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngSeed, TestCaseError, TestError, TestRunner,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use setpoint_runtime::client::{Api, Client, ListParams, WatchEvent};
use setpoint_runtime::informer::{Informer, InformerOptions};
use setpoint_testing::TestCluster;

/// The seed of the CI run.
const FIXED_SEED: u64 = 0x5e79_0170;
/// Replays a seed (decimal or `0x` hex) in either test.
const SEED_VAR: &str = "SETPOINT_PROPTEST_SEED";
/// How long one request, or one wait for the watch or an informer, may take.
const DEADLINE: Duration = Duration::from_secs(15);

const GROUP: &str = "props.example.com";
const CRD: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

// ---- the custom resource, typed -----------------------------------------------------------

/// The custom resource's spec; unknown fields fail to decode, since the CRD's structural
/// schema prunes them before anything is stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WidgetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tags: Option<Vec<String>>,
}

/// `Widget` as a typed client sees it: like k8s-openapi's types, decoding checks `apiVersion`
/// and `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "WidgetWire", into = "WidgetWire")]
struct Widget {
    metadata: ObjectMeta,
    spec: Option<WidgetSpec>,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WidgetWire {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<WidgetSpec>,
}

impl TryFrom<WidgetWire> for Widget {
    type Error = String;
    fn try_from(w: WidgetWire) -> Result<Self, String> {
        if w.api_version != "props.example.com/v1" || w.kind != "Widget" {
            return Err(format!(
                "a Widget names apiVersion {:?} and kind {:?}",
                w.api_version, w.kind
            ));
        }
        Ok(Widget {
            metadata: w.metadata,
            spec: w.spec,
        })
    }
}

impl From<Widget> for WidgetWire {
    fn from(w: Widget) -> Self {
        WidgetWire {
            api_version: "props.example.com/v1".into(),
            kind: "Widget".into(),
            metadata: w.metadata,
            spec: w.spec,
        }
    }
}

impl k8s_openapi::Resource for Widget {
    const API_VERSION: &'static str = "props.example.com/v1";
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = "Widget";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "widgets";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for Widget {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.props.example.com"},
        "spec": {"group": GROUP, "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                           "listKind": "WidgetList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "spec": {"type": "object", "properties": {
                             "size": {"type": "integer", "minimum": 0},
                             "color": {"type": "string"},
                             "tags": {"type": "array", "items": {"type": "string"}}}}}}}}]}
    })
}

// ---- what a step is -----------------------------------------------------------------------

/// The resources the sequences write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Res {
    ConfigMap,
    Deployment,
    Widget,
}

const RESOURCES: [Res; 3] = [Res::ConfigMap, Res::Deployment, Res::Widget];

impl Res {
    fn index(self) -> usize {
        self as usize
    }
    fn api_version(self) -> &'static str {
        match self {
            Res::ConfigMap => "v1",
            Res::Deployment => "apps/v1",
            Res::Widget => "props.example.com/v1",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Res::ConfigMap => "ConfigMap",
            Res::Deployment => "Deployment",
            Res::Widget => "Widget",
        }
    }
    fn collection(self, ns: &str) -> String {
        match self {
            Res::ConfigMap => format!("/api/v1/namespaces/{ns}/configmaps"),
            Res::Deployment => format!("/apis/apps/v1/namespaces/{ns}/deployments"),
            Res::Widget => format!("/apis/{GROUP}/v1/namespaces/{ns}/widgets"),
        }
    }
    /// Decodes one object as a typed client does.
    fn decode(self, v: &Value) -> Result<(), String> {
        fn typed<K: DeserializeOwned>(v: &Value) -> Result<(), String> {
            K::deserialize(v).map(drop).map_err(|e| e.to_string())
        }
        match self {
            Res::ConfigMap => typed::<ConfigMap>(v),
            Res::Deployment => typed::<Deployment>(v),
            Res::Widget => typed::<Widget>(v),
        }
    }
    /// The paths of `v` that its type has no field for (`serde_ignored` on the typed decode).
    fn unknown_fields(self, v: &Value) -> Vec<String> {
        fn typed<K: DeserializeOwned>(v: &Value) -> Vec<String> {
            let mut unknown = Vec::new();
            let _ = serde_ignored::deserialize::<_, _, K>(v, |path| unknown.push(path.to_string()));
            unknown
        }
        match self {
            Res::ConfigMap => typed::<ConfigMap>(v),
            Res::Deployment => typed::<Deployment>(v),
            Res::Widget => typed::<Widget>(v),
        }
    }
}

/// What a step does.
#[derive(Clone, Debug)]
enum Verb {
    Create,
    /// PUT; `with_rv` sends the last known `resourceVersion` (optimistic concurrency).
    Update {
        with_rv: bool,
    },
    Merge,
    JsonPatch,
    Strategic,
    Apply {
        force: bool,
    },
    Delete,
    /// PUT to the `status` subresource (only Deployments have one here), with a changed spec
    /// and labels that must be ignored.
    UpdateStatus,
    /// A merge patch of the `status` subresource that also tries to change the spec.
    PatchStatus,
}

/// How a body is spoiled (or not).
#[derive(Clone, Debug)]
enum Fault {
    None,
    Kind(&'static str),
    ApiVersion(&'static str),
    /// `kind` or `apiVersion` not a string.
    TypeMetaNotString,
    UnknownField {
        nested: bool,
    },
    /// A field of the wrong JSON type.
    WrongType,
    /// `metadata` not an object (a string, an array, a number or null).
    Metadata(u8),
    /// A metadata field of the wrong type or value (name, labels, annotations, finalizers…).
    MetadataField(u8),
    NameMismatch,
    NoName,
    GenerateName,
    /// Server-owned fields set by the client (uid, creationTimestamp, generation, …).
    ServerFields(u8),
    Status,
    StaleRv,
    BadRv,
    /// A string of this many KiB.
    Huge(u32),
    /// Arrays nested this deep.
    Deep(u32),
    NotJson(u8),
    NotObject(u8),
    /// A patch-type-specific mistake (JSON patch operations, strategic merge directives).
    PatchSpecific(u8),
}

#[derive(Clone, Debug)]
struct Step {
    res: Res,
    verb: Verb,
    name: &'static str,
    fault: Fault,
    /// Varies the values of a valid body.
    v: u8,
    /// Query parameters of a write.
    query: Query,
}

/// What a write asks for beyond the defaults.
#[derive(Clone, Copy, Debug)]
enum Query {
    None,
    /// `dryRun=All`: a success changes nothing, so no event and no new `resourceVersion`.
    DryRun,
    /// `fieldValidation=Strict`: unknown and duplicate fields are errors.
    Strict,
    /// `fieldValidation=Ignore`: unknown fields are dropped silently.
    Ignore,
}

impl Query {
    fn param(self) -> Option<&'static str> {
        match self {
            Query::None => None,
            Query::DryRun => Some("dryRun=All"),
            Query::Strict => Some("fieldValidation=Strict"),
            Query::Ignore => Some("fieldValidation=Ignore"),
        }
    }
}

/// A name that is not a DNS subdomain (upstream allows at most 253 characters).
const LONG_NAME: &str = concat!(
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll",
    "llllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllllll"
);

fn res() -> impl Strategy<Value = Res> {
    prop::sample::select(RESOURCES.to_vec())
}

fn verb() -> impl Strategy<Value = Verb> {
    prop_oneof![
        4 => Just(Verb::Create),
        3 => any::<bool>().prop_map(|with_rv| Verb::Update { with_rv }),
        3 => Just(Verb::Merge),
        2 => Just(Verb::JsonPatch),
        2 => Just(Verb::Strategic),
        3 => any::<bool>().prop_map(|force| Verb::Apply { force }),
        2 => Just(Verb::Delete),
        1 => Just(Verb::UpdateStatus),
        1 => Just(Verb::PatchStatus),
    ]
}

fn name() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        // Mostly names that already exist (every sequence starts by creating "a"), so that
        // updates, patches and deletes find something to change.
        8 => Just("a"),
        4 => Just("b"),
        2 => Just("c"),
        1 => Just("Bad_Name"),
        1 => Just(LONG_NAME),
    ]
}

fn fault() -> impl Strategy<Value = Fault> {
    let kinds = vec![
        "Pod",
        "Secret",
        "ConfigMap",
        "Deployment",
        "Widget",
        "Status",
        "ConfigMapList",
        "",
    ];
    let versions = vec![
        "v1",
        "apps/v1",
        "v2",
        "apps/v1beta1",
        "props.example.com/v1",
        "props.example.com/v2",
        "extensions/v1beta1",
        "",
    ];
    prop_oneof![
        30 => Just(Fault::None),
        3 => prop::sample::select(kinds).prop_map(Fault::Kind),
        3 => prop::sample::select(versions).prop_map(Fault::ApiVersion),
        1 => Just(Fault::TypeMetaNotString),
        2 => any::<bool>().prop_map(|nested| Fault::UnknownField { nested }),
        2 => Just(Fault::WrongType),
        2 => (0u8..5).prop_map(Fault::Metadata),
        2 => (0u8..8).prop_map(Fault::MetadataField),
        1 => Just(Fault::NameMismatch),
        1 => Just(Fault::NoName),
        1 => Just(Fault::GenerateName),
        2 => (0u8..6).prop_map(Fault::ServerFields),
        1 => Just(Fault::Status),
        1 => Just(Fault::StaleRv),
        1 => Just(Fault::BadRv),
        1 => prop::sample::select(vec![300u32, 1100, 1600, 3100]).prop_map(Fault::Huge),
        1 => prop::sample::select(vec![40u32, 200, 3000, 100_000]).prop_map(Fault::Deep),
        1 => (0u8..4).prop_map(Fault::NotJson),
        1 => (0u8..4).prop_map(Fault::NotObject),
        3 => (0u8..10).prop_map(Fault::PatchSpecific),
    ]
}

fn query() -> impl Strategy<Value = Query> {
    prop_oneof![
        12 => Just(Query::None),
        2 => Just(Query::DryRun),
        1 => Just(Query::Strict),
        1 => Just(Query::Ignore),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (res(), verb(), name(), fault(), any::<u8>(), query()).prop_map(
        |(res, verb, name, fault, v, query)| Step {
            res,
            verb,
            name,
            fault,
            v,
            query,
        },
    )
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..40)
}

// ---- bodies -------------------------------------------------------------------------------

/// A valid object of `res` named `name`; `v` varies its values.
fn valid_object(res: Res, name: &str, v: u8) -> Value {
    match res {
        Res::ConfigMap => json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"v": format!("l{}", v % 4)}},
            "data": {format!("k{}", v % 3): format!("value-{v}")}
        }),
        Res::Deployment => json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": v % 4,
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [
                                      {"name": "c", "image": format!("image:{}", v % 5)}]}}}
        }),
        Res::Widget => {
            let color = ["red", "blue", "green"][usize::from(v % 3)];
            let tags: Vec<String> = (0..v % 3).map(|i| format!("t{i}")).collect();
            json!({
                "apiVersion": "props.example.com/v1", "kind": "Widget",
                "metadata": {"name": name},
                "spec": {"size": v % 7, "color": color, "tags": tags}
            })
        }
    }
}

/// A valid merge (or strategic merge) patch of `res`.
fn valid_patch(res: Res, v: u8) -> Value {
    match res {
        Res::ConfigMap => json!({
            "metadata": {"labels": {"p": format!("l{}", v % 3)}},
            "data": {format!("k{}", v % 3): format!("patched-{v}")}
        }),
        Res::Deployment => json!({
            "spec": {"replicas": v % 3,
                     "template": {"spec": {"containers": [
                         {"name": "c", "image": format!("patched:{}", v % 4)}]}}}
        }),
        Res::Widget => json!({"spec": {"size": v % 5, "tags": ["p"]}}),
    }
}

/// The field of `res` that holds free-form strings, and where a spoiled value goes.
fn payload_slot(res: Res, body: &mut Value) -> &mut Value {
    let obj = body.as_object_mut().expect("bodies here are objects");
    match res {
        Res::ConfigMap => {
            let data = obj.entry("data").or_insert_with(|| json!({}));
            if !data.is_object() {
                *data = json!({});
            }
            data.as_object_mut()
                .unwrap()
                .entry("big")
                .or_insert(Value::Null)
        }
        Res::Deployment => {
            let meta = obj.entry("metadata").or_insert_with(|| json!({}));
            if !meta.is_object() {
                *meta = json!({});
            }
            let ann = meta
                .as_object_mut()
                .unwrap()
                .entry("annotations")
                .or_insert_with(|| json!({}));
            ann.as_object_mut()
                .unwrap()
                .entry("big")
                .or_insert(Value::Null)
        }
        Res::Widget => {
            let spec = obj.entry("spec").or_insert_with(|| json!({}));
            if !spec.is_object() {
                *spec = json!({});
            }
            spec.as_object_mut()
                .unwrap()
                .entry("color")
                .or_insert(Value::Null)
        }
    }
}

fn nested(depth: u32) -> Value {
    // Built as text: a deep `Value` would overflow the stack when dropped or serialized.
    let text = format!(
        "{}{}",
        "[".repeat(depth as usize),
        "]".repeat(depth as usize)
    );
    Value::String(text)
}

fn meta_mut(body: &mut Value) -> &mut serde_json::Map<String, Value> {
    let obj = body.as_object_mut().expect("bodies here are objects");
    let meta = obj.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut().unwrap()
}

/// A request body: JSON, or raw bytes (not JSON, or JSON too deep to build as a `Value`).
enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

/// Spoils an object body (a whole object or a merge patch) as `fault` says.
fn spoil(res: Res, name: &str, body: &mut Value, fault: &Fault, v: u8) -> Option<Body> {
    let other = |s: &str| format!("{s}-other");
    match fault {
        Fault::None | Fault::PatchSpecific(_) => {}
        Fault::Kind(k) => body["kind"] = json!(k),
        Fault::ApiVersion(a) => body["apiVersion"] = json!(a),
        Fault::TypeMetaNotString => {
            if v & 1 == 0 {
                body["kind"] = json!(5)
            } else {
                body["apiVersion"] = json!(["v1"])
            }
        }
        Fault::UnknownField { nested: false } => body["bogusField"] = json!({"x": 1}),
        Fault::UnknownField { nested: true } => match res {
            Res::ConfigMap => {
                meta_mut(body).insert("bogusMeta".into(), json!(1));
            }
            Res::Deployment => body["spec"]["bogusSpec"] = json!("x"),
            Res::Widget => body["spec"]["bogusSpec"] = json!("x"),
        },
        Fault::WrongType => match res {
            Res::ConfigMap => body["data"] = json!({"k0": 5, "k1": {"x": true}}),
            Res::Deployment => body["spec"]["replicas"] = json!("three"),
            Res::Widget => body["spec"]["size"] = json!("big"),
        },
        Fault::Metadata(n) => {
            body["metadata"] = match n {
                0 => json!("metadata"),
                1 => json!([name]),
                2 => json!(42),
                3 => Value::Null,
                _ => json!(true),
            }
        }
        Fault::MetadataField(n) => {
            let m = meta_mut(body);
            match n {
                0 => {
                    m.insert("name".into(), json!(7));
                }
                1 => {
                    m.insert("labels".into(), json!("app=x"));
                }
                2 => {
                    m.insert("labels".into(), json!({"bad key!": "v"}));
                }
                3 => {
                    m.insert("annotations".into(), json!({"a": 1}));
                }
                4 => {
                    m.insert("namespace".into(), json!("elsewhere"));
                }
                5 => {
                    m.insert("managedFields".into(), json!("everything"));
                }
                6 => {
                    m.insert("ownerReferences".into(), json!([{"name": "x"}]));
                }
                _ => {
                    m.insert("labels".into(), json!({"v": "x".repeat(64)}));
                }
            }
        }
        Fault::NameMismatch => {
            meta_mut(body).insert("name".into(), json!(other(name)));
        }
        Fault::NoName => {
            meta_mut(body).remove("name");
        }
        Fault::GenerateName => {
            let m = meta_mut(body);
            m.remove("name");
            m.insert("generateName".into(), json!("gen-"));
        }
        Fault::ServerFields(n) => {
            let m = meta_mut(body);
            match n {
                0 => m.insert("uid".into(), json!("not-a-uid")),
                1 => m.insert("creationTimestamp".into(), json!("yesterday")),
                2 => m.insert("creationTimestamp".into(), json!("2001-02-03T04:05:06Z")),
                3 => m.insert("generation".into(), json!(99)),
                4 => m.insert("deletionTimestamp".into(), json!("2001-02-03T04:05:06Z")),
                _ => m.insert("selfLink".into(), json!("/somewhere")),
            };
        }
        Fault::Status => {
            body["status"] = match res {
                Res::Deployment => json!({"replicas": 9, "readyReplicas": 9}),
                _ => json!({"phase": "Done"}),
            }
        }
        Fault::StaleRv => {
            meta_mut(body).insert("resourceVersion".into(), json!("1"));
        }
        Fault::BadRv => {
            meta_mut(body).insert("resourceVersion".into(), json!("not-a-number"));
        }
        Fault::Huge(kib) => {
            *payload_slot(res, body) = json!("x".repeat(*kib as usize * 1024));
        }
        Fault::Deep(depth) => {
            // The nesting goes into the text after serializing, so that it reaches the
            // server's decoder as real arrays.
            *payload_slot(res, body) = json!("@DEEP@");
            let text = serde_json::to_string(body).unwrap();
            let Value::String(deep) = nested(*depth) else {
                unreachable!()
            };
            return Some(Body::Raw(text.replace("\"@DEEP@\"", &deep).into_bytes()));
        }
        Fault::NotJson(n) => {
            let raw: &[u8] = match n {
                0 => b"{\"metadata\": {\"name\": ",
                1 => b"kind: ConfigMap\nmetadata:\n  name: a\n",
                2 => b"\xff\xfe\x00garbage",
                _ => b"",
            };
            return Some(Body::Raw(raw.to_vec()));
        }
        Fault::NotObject(n) => {
            return Some(Body::Json(match n {
                0 => json!([]),
                1 => Value::Null,
                2 => json!("object"),
                _ => json!(12),
            }))
        }
    }
    None
}

/// A Deployment status a status write sets.
fn status_of(v: u8) -> Value {
    json!({"observedGeneration": 1, "replicas": v % 5, "updatedReplicas": v % 3})
}

/// The JSON patch of a step.
fn json_patch(res: Res, fault: &Fault, v: u8) -> Body {
    let valid = match res {
        Res::ConfigMap => json!([
            {"op": "add", "path": "/metadata/labels", "value": {"j": format!("l{}", v % 3)}}]),
        Res::Deployment => json!([{"op": "replace", "path": "/spec/replicas", "value": v % 4}]),
        Res::Widget => json!([{"op": "add", "path": "/spec/size", "value": v % 6}]),
    };
    let ops = match fault {
        Fault::None | Fault::NameMismatch | Fault::NoName | Fault::GenerateName => valid,
        Fault::Kind(k) => json!([{"op": "replace", "path": "/kind", "value": k}]),
        Fault::ApiVersion(a) => json!([{"op": "replace", "path": "/apiVersion", "value": a}]),
        Fault::TypeMetaNotString => json!([{"op": "replace", "path": "/kind", "value": 5}]),
        Fault::UnknownField { .. } => json!([{"op": "add", "path": "/bogus", "value": 1}]),
        Fault::WrongType => match res {
            Res::ConfigMap => json!([{"op": "add", "path": "/data", "value": {"k": 5}}]),
            Res::Deployment => {
                json!([{"op": "replace", "path": "/spec/replicas", "value": "three"}])
            }
            Res::Widget => json!([{"op": "add", "path": "/spec/size", "value": "big"}]),
        },
        Fault::Metadata(n) => match n {
            0 => json!([{"op": "replace", "path": "/metadata", "value": "x"}]),
            1 => json!([{"op": "remove", "path": "/metadata"}]),
            _ => json!([{"op": "replace", "path": "/metadata", "value": null}]),
        },
        Fault::MetadataField(n) => match n {
            0 => json!([{"op": "replace", "path": "/metadata/name", "value": "renamed"}]),
            1 => json!([{"op": "add", "path": "/metadata/labels", "value": "x"}]),
            2 => json!([{"op": "replace", "path": "/metadata/namespace", "value": "other"}]),
            _ => json!([{"op": "add", "path": "/metadata/uid", "value": "u"}]),
        },
        Fault::ServerFields(_) | Fault::Status => {
            json!([{"op": "add", "path": "/metadata/generation", "value": 42}])
        }
        Fault::StaleRv | Fault::BadRv => {
            json!([{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}])
        }
        Fault::Huge(kib) => json!([{"op": "add", "path": "/metadata/annotations",
                "value": {"big": "x".repeat(*kib as usize * 1024)}}]),
        Fault::Deep(depth) => {
            let text = serde_json::to_string(&json!([
                {"op": "add", "path": "/metadata/annotations", "value": "@DEEP@"}]))
            .unwrap();
            let Value::String(deep) = nested(*depth) else {
                unreachable!()
            };
            return Body::Raw(text.replace("\"@DEEP@\"", &deep).into_bytes());
        }
        Fault::NotJson(_) => return Body::Raw(b"[{\"op\": \"add\", ".to_vec()),
        Fault::NotObject(n) => match n {
            0 => json!({"op": "add", "path": "/a", "value": 1}),
            1 => Value::Null,
            2 => json!([1, 2]),
            _ => json!([{"op": "add"}]),
        },
        Fault::PatchSpecific(n) => match n {
            0 => json!([{"op": "test", "path": "/metadata/name", "value": "zzz"}]),
            1 => json!([{"op": "frobnicate", "path": "/metadata"}]),
            2 => json!([{"op": "move", "from": "/metadata", "path": "/metadata/labels"}]),
            3 => json!([{"op": "copy", "from": "/nothing", "path": "/x"}]),
            4 => json!([{"op": "remove", "path": "/metadata/labels/absent"}]),
            5 => json!([{"op": "add", "path": "/metadata/labels/~2", "value": "x"}]),
            6 => json!([{"op": "add", "path": "metadata", "value": {}}]),
            // Many operations at once.
            7 => Value::Array(
                (0..20_000)
                    .map(|i| json!({"op": "test", "path": "/kind", "value": res.kind(), "i": i}))
                    .collect(),
            ),
            // Each copy doubles the annotations: 16 KiB becomes 4 MiB, more than a request
            // may carry.
            _ => {
                let mut ops = vec![json!({"op": "add", "path": "/metadata/annotations",
                    "value": {"a0": "x".repeat(16 * 1024)}})];
                for i in 1..=8 {
                    ops.push(json!({"op": "copy", "from": "/metadata/annotations",
                        "path": format!("/metadata/annotations/a{i}")}));
                }
                Value::Array(ops)
            }
        },
    };
    Body::Json(ops)
}

/// Strategic-merge-patch directives that upstream rejects or that remove required parts.
fn strategic_patch(res: Res, name: &str, fault: &Fault, v: u8) -> Body {
    let mut body = valid_patch(res, v);
    if let Fault::PatchSpecific(n) = fault {
        return Body::Json(match (res, n % 5) {
            (Res::Deployment, 0) => json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "$patch": "delete"}]}}}}),
            (Res::Deployment, 1) => json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "zzz"}],
                "containers": [{"name": "c", "image": "x"}]}}}}),
            (Res::Deployment, 2) => json!({"spec": {"$retainKeys": ["replicas"], "replicas": 2}}),
            (_, 3) => json!({"$patch": "replace", "metadata": {"name": name}}),
            (_, 4) => json!({"metadata": {"$patch": "delete"}}),
            (_, _) => json!({"$patch": "frobnicate"}),
        });
    }
    match spoil(res, name, &mut body, fault, v) {
        Some(b) => b,
        None => Body::Json(body),
    }
}

impl Body {
    fn bytes(&self) -> Bytes {
        match self {
            Body::Json(v) => Bytes::from(serde_json::to_vec(v).unwrap()),
            Body::Raw(b) => Bytes::from(b.clone()),
        }
    }
}

// ---- one sequence ---------------------------------------------------------------------------

/// A change the watch must show.
#[derive(Clone, Debug, PartialEq)]
struct Change {
    kind: &'static str,
    name: String,
    /// Unknown for deletions (the answer carries the object's last state).
    rv: Option<u64>,
}

/// What the watch of one resource delivered.
#[derive(Default)]
struct Seen {
    events: Vec<(Change, Result<(), String>)>,
    /// Why the watch ended early, if it did.
    ended: Option<String>,
}

struct Sequence {
    client: Client,
    ns: String,
    /// Name → resourceVersion of every object that exists, per resource.
    model: [BTreeMap<String, u64>; 3],
    /// Name → the server-owned identity (`uid`, `creationTimestamp`) it gave each object.
    identity: [BTreeMap<String, (String, String)>; 3],
    /// Name → the object as the last successful write answered it.
    last: [BTreeMap<String, Value>; 3],
    expected: [Vec<Change>; 3],
    seen: [Arc<Mutex<Seen>>; 3],
    watches: Vec<tokio::task::JoinHandle<()>>,
    cms: Informer<ConfigMap>,
    deployments: Informer<Deployment>,
    widgets: Informer<Widget>,
    /// The highest resourceVersion a write has produced.
    last_rv: u64,
    /// The steps so far, for failure messages.
    log: Vec<String>,
}

fn fail(msg: impl Into<String>) -> TestCaseError {
    TestCaseError::fail(msg.into())
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(DEADLINE, f)
        .await
        .map_err(|_| format!("{what}: no answer within {DEADLINE:?}"))
}

/// One request: its status code and body.
async fn call(
    client: &Client,
    method: http::Method,
    path: &str,
    content_type: Option<&str>,
    body: Bytes,
) -> Result<(u16, Bytes), String> {
    let what = format!("{method} {path}");
    within(&what, async {
        let resp = client
            .send(method.clone(), path, content_type, body)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{what}: reading the answer: {e}"))?
            .to_bytes();
        Ok((code, bytes))
    })
    .await?
}

fn rv_of(v: &Value) -> Result<u64, String> {
    let rv = v
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("no metadata.resourceVersion in {}", short(v)))?;
    rv.parse()
        .map_err(|_| format!("resourceVersion {rv:?} is not a revision"))
}

/// A value cut for messages (huge bodies must not flood the output).
fn short(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 600 {
        s.truncate(600);
        s.push('…');
    }
    s
}

fn watch_event_change(
    res: Res,
    ev: WatchEvent<Value>,
) -> Result<(Change, Result<(), String>), String> {
    let (kind, obj) = match ev {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        WatchEvent::Bookmark { .. } => return Err("a bookmark nobody asked for".into()),
        WatchEvent::Error(e) => return Err(format!("watch error: {e}")),
    };
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let rv = rv_of(&obj)?;
    let decoded = res.decode(&obj);
    Ok((
        Change {
            kind,
            name,
            rv: Some(rv),
        },
        decoded,
    ))
}

impl Sequence {
    async fn start(client: Client, ns: String) -> Result<Sequence, String> {
        let (code, body) = call(
            &client,
            http::Method::POST,
            "/api/v1/namespaces",
            Some("application/json"),
            Bytes::from(
                serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": ns}}))
                .unwrap(),
            ),
        )
        .await?;
        if code != 201 {
            return Err(format!(
                "creating namespace {ns}: {code} {}",
                String::from_utf8_lossy(&body)
            ));
        }
        let ns_rv = rv_of(&serde_json::from_slice(&body).unwrap())?;
        let seen: [Arc<Mutex<Seen>>; 3] = Default::default();
        let mut watches = Vec::new();
        for res in RESOURCES {
            let path = format!(
                "{}?watch=true&resourceVersion={ns_rv}&timeoutSeconds=3600",
                res.collection(&ns)
            );
            let stream = within("opening a watch", client.watch_raw(&path))
                .await?
                .map_err(|e| format!("opening a watch: {e}"))?;
            let seen = seen[res.index()].clone();
            // Drained continuously, so that this watcher is never the slow one the server
            // may drop.
            watches.push(tokio::spawn(async move {
                let mut stream = std::pin::pin!(stream);
                loop {
                    let next = stream.next().await;
                    let mut s = seen.lock().unwrap();
                    match next {
                        Some(Ok(ev)) => match watch_event_change(res, ev) {
                            Ok(c) => s.events.push(c),
                            Err(e) => {
                                s.ended = Some(e);
                                return;
                            }
                        },
                        Some(Err(e)) => {
                            s.ended = Some(format!("the watch failed: {e}"));
                            return;
                        }
                        None => {
                            s.ended = Some("the watch ended".into());
                            return;
                        }
                    }
                }
            }));
        }
        let cms = Informer::new(Api::namespaced(client.clone(), &ns), Default::default());
        let deployments = Informer::new(Api::namespaced(client.clone(), &ns), Default::default());
        let widgets = Informer::new(
            Api::namespaced(client.clone(), &ns),
            InformerOptions::default(),
        );
        cms.start();
        deployments.start();
        widgets.start();
        within("informers to sync", async {
            cms.wait_synced().await?;
            deployments.wait_synced().await?;
            widgets.wait_synced().await
        })
        .await?
        .map_err(|e| e.to_string())?;
        Ok(Sequence {
            client,
            ns,
            model: Default::default(),
            identity: Default::default(),
            last: Default::default(),
            expected: Default::default(),
            seen,
            watches,
            cms,
            deployments,
            widgets,
            last_rv: ns_rv,
            log: Vec::new(),
        })
    }

    fn context(&self) -> String {
        let tail: Vec<&str> = self
            .log
            .iter()
            .rev()
            .take(8)
            .rev()
            .map(String::as_str)
            .collect();
        format!(
            "in namespace {}, after {} steps; the last ones:\n  {}",
            self.ns,
            self.log.len(),
            tail.join("\n  ")
        )
    }

    /// Sends one step and checks its answer; updates the model from a success.
    async fn run(&mut self, step: &Step) -> Result<(), String> {
        let res = step.res;
        let collection = res.collection(&self.ns);
        let item = format!("{collection}/{}", step.name);
        let known_rv = self.model[res.index()].get(step.name).copied();
        let (method, path, ctype, body) = match &step.verb {
            Verb::Create => {
                let mut b = valid_object(res, step.name, step.v);
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (http::Method::POST, collection, "application/json", body)
            }
            Verb::Update { with_rv } => {
                let mut b = valid_object(res, step.name, step.v);
                if let (true, Some(rv)) = (with_rv, known_rv) {
                    b["metadata"]["resourceVersion"] = json!(rv.to_string());
                }
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (http::Method::PUT, item, "application/json", body)
            }
            Verb::Merge => {
                let mut b = valid_patch(res, step.v);
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (
                    http::Method::PATCH,
                    item,
                    "application/merge-patch+json",
                    body,
                )
            }
            Verb::JsonPatch => (
                http::Method::PATCH,
                item,
                "application/json-patch+json",
                json_patch(res, &step.fault, step.v),
            ),
            Verb::Strategic => (
                http::Method::PATCH,
                item,
                "application/strategic-merge-patch+json",
                strategic_patch(res, step.name, &step.fault, step.v),
            ),
            Verb::Apply { force } => {
                let mut b = valid_object(res, step.name, step.v);
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (
                    http::Method::PATCH,
                    format!("{item}?fieldManager=props&force={force}"),
                    "application/apply-patch+yaml",
                    body,
                )
            }
            Verb::UpdateStatus => {
                let mut b = valid_object(res, step.name, step.v.wrapping_add(1));
                b["metadata"]["labels"] = json!({"from-status": "ignored"});
                b["status"] = status_of(step.v);
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (
                    http::Method::PUT,
                    format!("{item}/status"),
                    "application/json",
                    body,
                )
            }
            Verb::PatchStatus => {
                let mut b = json!({"spec": {"replicas": 7},
                    "metadata": {"labels": {"from-status": "ignored"}},
                    "status": status_of(step.v)});
                let body =
                    spoil(res, step.name, &mut b, &step.fault, step.v).unwrap_or(Body::Json(b));
                (
                    http::Method::PATCH,
                    format!("{item}/status"),
                    "application/merge-patch+json",
                    body,
                )
            }
            Verb::Delete => {
                let body = match &step.fault {
                    Fault::StaleRv => Body::Json(json!({"kind": "DeleteOptions",
                        "apiVersion": "v1", "preconditions": {"resourceVersion": "1"}})),
                    Fault::ServerFields(_) => Body::Json(json!({"kind": "DeleteOptions",
                        "apiVersion": "v1", "preconditions": {"uid": "not-the-uid"}})),
                    Fault::NotJson(_) => Body::Raw(b"{\"kind\": ".to_vec()),
                    Fault::WrongType => Body::Json(json!({"gracePeriodSeconds": "soon"})),
                    Fault::PatchSpecific(_) => {
                        Body::Json(json!({"propagationPolicy": "Sometimes"}))
                    }
                    _ => Body::Raw(Vec::new()),
                };
                (http::Method::DELETE, item, "application/json", body)
            }
        };
        let path = match step.query.param() {
            Some(q) if path.contains('?') => format!("{path}&{q}"),
            Some(q) => format!("{path}?{q}"),
            None => path,
        };
        let bytes = body.bytes();
        let (code, answer) = call(&self.client, method.clone(), &path, Some(ctype), bytes).await?;
        let verb_name = match step.verb {
            Verb::Create => "create",
            Verb::Update { .. } => "update",
            Verb::Merge => "merge",
            Verb::JsonPatch => "json-patch",
            Verb::Strategic => "strategic",
            Verb::Apply { .. } => "apply",
            Verb::Delete => "delete",
            Verb::UpdateStatus => "update-status",
            Verb::PatchStatus => "patch-status",
        };
        *ANSWERS
            .lock()
            .unwrap()
            .entry((verb_name, code))
            .or_default() += 1;
        let answer: Result<Value, _> = serde_json::from_slice(&answer);
        let shown = match &answer {
            Ok(v) => short(v),
            Err(_) => "<not JSON>".into(),
        };
        self.log.push(format!(
            "{:?} {:?} {:?} {:?} {:?} (v {}) → {code} {}",
            res,
            step.verb,
            step.name,
            step.fault,
            step.query,
            step.v,
            short(&Value::String(shown.chars().take(200).collect()))
        ));
        let answer = answer.map_err(|e| format!("{method} {path} → {code}, not JSON: {e}"))?;
        if !(200..300).contains(&code) && !(400..500).contains(&code) {
            return Err(format!(
                "{method} {path} → {code}, neither a success nor a client error: {}",
                short(&answer)
            ));
        }
        if code >= 400 {
            return check_status(&answer, code).map_err(|e| format!("{method} {path}: {e}"));
        }
        // A success.
        if matches!(step.query, Query::DryRun) {
            // Nothing may change: the LIST after this step and the watch check that.
            if answer.get("kind").and_then(Value::as_str) != Some("Status") {
                res.decode(&answer).map_err(|e| {
                    format!("{method} {path} → {code}: the answer does not decode: {e}")
                })?;
            }
            return Ok(());
        }
        if matches!(step.verb, Verb::Delete) {
            if answer.get("kind").and_then(Value::as_str) != Some("Status") {
                res.decode(&answer)
                    .map_err(|e| format!("DELETE {path}: the answer does not decode: {e}"))?;
            }
            self.identity[res.index()].remove(step.name);
            self.last[res.index()].remove(step.name);
            if self.model[res.index()].remove(step.name).is_none() {
                return Err(format!(
                    "DELETE {path} → {code}, but no such object was written"
                ));
            }
            self.expected[res.index()].push(Change {
                kind: "DELETED",
                name: step.name.to_string(),
                rv: None,
            });
            return Ok(());
        }
        res.decode(&answer).map_err(|e| {
            format!(
                "{method} {path} → {code}, but the object does not decode as a {}: {e}: {}",
                res.kind(),
                short(&answer)
            )
        })?;
        let name = answer
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .ok_or("a success without metadata.name")?
            .to_string();
        let rv = rv_of(&answer)?;
        let identity = server_owned(&answer, &self.ns)
            .map_err(|e| format!("{method} {path} → {code}: {e}: {}", short(&answer)))?;
        match self.identity[res.index()].get(&name) {
            Some(known) if *known != identity => {
                return Err(format!(
                    "{method} {path} → {code}: uid and creationTimestamp were {known:?}, now \
                     {identity:?}; only the server sets them, once"
                ))
            }
            _ => self.identity[res.index()].insert(name.clone(), identity),
        };
        match self.last[res.index()].get(&name) {
            Some(old) => subresource_rules(&step.verb, old, &answer),
            None if res == Res::Deployment => empty_status(&answer)
                .map_err(|e| format!("a Deployment was created with a status: {e}")),
            None => Ok(()),
        }
        .map_err(|e| format!("{method} {path} → {code}: {e}"))?;
        self.last[res.index()].insert(name.clone(), answer.clone());
        let before = self.model[res.index()].get(&name).copied();
        if before == Some(rv) {
            // Upstream writes nothing when a write changes nothing, and answers with the
            // object as it is.
            return Ok(());
        }
        if rv <= self.last_rv {
            return Err(format!(
                "{method} {path} → {code} with resourceVersion {rv}, not after the last write's {}",
                self.last_rv
            ));
        }
        let kind = match (code, before) {
            (201, None) => "ADDED",
            (200, Some(_)) => "MODIFIED",
            _ => {
                return Err(format!(
                    "{method} {path} → {code}, but the object {}",
                    if before.is_some() {
                        "existed (201 means created)"
                    } else {
                        "did not exist (a create answers 201)"
                    }
                ))
            }
        };
        self.last_rv = rv;
        self.model[res.index()].insert(name.clone(), rv);
        self.expected[res.index()].push(Change {
            kind,
            name,
            rv: Some(rv),
        });
        Ok(())
    }

    /// LISTs each resource: decodes typed as informers do, and matches the model.
    async fn check_lists(&self) -> Result<(), String> {
        for res in RESOURCES {
            let path = res.collection(&self.ns);
            match res {
                Res::ConfigMap => typed_list::<ConfigMap>(&self.client, &self.ns).await?,
                Res::Deployment => typed_list::<Deployment>(&self.client, &self.ns).await?,
                Res::Widget => typed_list::<Widget>(&self.client, &self.ns).await?,
            };
            let (code, body) =
                call(&self.client, http::Method::GET, &path, None, Bytes::new()).await?;
            let list: Value = serde_json::from_slice(&body)
                .map_err(|e| format!("LIST {path} → {code}, not JSON: {e}"))?;
            if code != 200 {
                return Err(format!("LIST {path} → {code}: {}", short(&list)));
            }
            let mut listed = BTreeMap::new();
            for item in list["items"].as_array().into_iter().flatten() {
                for (field, want) in [("kind", res.kind()), ("apiVersion", res.api_version())] {
                    if let Some(got) = item.get(field) {
                        if got != want {
                            return Err(format!(
                                "LIST {path}: an item has {field} {got}, not {want:?}: {}",
                                short(item)
                            ));
                        }
                    }
                }
                let mut typed = item.clone();
                typed["kind"] = json!(res.kind());
                typed["apiVersion"] = json!(res.api_version());
                let unknown = res.unknown_fields(&typed);
                if !unknown.is_empty() {
                    return Err(format!(
                        "LIST {path}: a stored {} has fields its type does not: {unknown:?}",
                        res.kind()
                    ));
                }
                let name = item
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                listed.insert(name, rv_of(item)?);
            }
            if listed != self.model[res.index()] {
                return Err(format!(
                    "LIST {path}: objects and resourceVersions {listed:?}, but the successful \
                     writes left {:?}",
                    self.model[res.index()]
                ));
            }
        }
        Ok(())
    }

    /// Waits until each watch has delivered as many events as changes were made, then
    /// compares them.
    async fn check_watches(&self) -> Result<(), String> {
        for res in RESOURCES {
            let want = self.expected[res.index()].len();
            let seen = self.seen[res.index()].clone();
            let wait = within("the watch to catch up", async {
                loop {
                    {
                        let s = seen.lock().unwrap();
                        if s.events.len() >= want || s.ended.is_some() {
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            let s = seen.lock().unwrap();
            let got: Vec<&Change> = s.events.iter().map(|(c, _)| c).collect();
            if let Err(e) = wait {
                return Err(format!(
                    "{} watch: {e}; {} events for {want} changes: {got:?}",
                    res.kind(),
                    got.len()
                ));
            }
            if got.len() < want {
                return Err(format!(
                    "{} watch: {} after {} of {want} changes",
                    res.kind(),
                    s.ended.as_deref().unwrap_or("stopped"),
                    got.len()
                ));
            }
            let mut previous = 0;
            for (i, (change, decoded)) in s.events.iter().enumerate() {
                let rv = change.rv.unwrap_or_default();
                if rv <= previous {
                    return Err(format!(
                        "{} watch: event {i} has resourceVersion {rv} after {previous}",
                        res.kind()
                    ));
                }
                previous = rv;
                if let Err(e) = decoded {
                    return Err(format!(
                        "{} watch: event {i} ({change:?}) does not decode: {e}",
                        res.kind()
                    ));
                }
                if i >= want {
                    return Err(format!(
                        "{} watch: event {i} ({change:?}) for no change that was made",
                        res.kind()
                    ));
                }
                let expected = &self.expected[res.index()][i];
                let same = expected.kind == change.kind
                    && expected.name == change.name
                    && expected.rv.is_none_or(|r| Some(r) == change.rv);
                if !same {
                    return Err(format!(
                        "{} watch: event {i} is {change:?}, the change made was {expected:?}; \
                         all events: {got:?}",
                        res.kind()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Waits until each informer's cache equals a fresh LIST (no writes happen meanwhile).
    async fn check_informers(&self) -> Result<(), String> {
        compare_cache(&self.client, &self.ns, &self.cms).await?;
        compare_cache(&self.client, &self.ns, &self.deployments).await?;
        compare_cache(&self.client, &self.ns, &self.widgets).await
    }

    /// Creates one more object of each resource and waits for its event: every event before
    /// it has then been delivered, so the watches must hold exactly the changes made.
    async fn check_end(&mut self) -> Result<(), String> {
        for res in RESOURCES {
            let step = Step {
                res,
                verb: Verb::Create,
                name: "zz-last",
                fault: Fault::None,
                v: 0,
                query: Query::None,
            };
            self.run(&step).await?;
            if !self.model[res.index()].contains_key("zz-last") {
                return Err(format!("the last {} was not created", res.kind()));
            }
        }
        self.check_watches().await?;
        for res in RESOURCES {
            let s = self.seen[res.index()].lock().unwrap();
            if s.events.len() != self.expected[res.index()].len() {
                return Err(format!(
                    "{} watch: {} events for {} changes",
                    res.kind(),
                    s.events.len(),
                    self.expected[res.index()].len()
                ));
            }
        }
        self.check_informers().await
    }

    /// Stops the watches and informers and deletes what the sequence made (the big objects
    /// would otherwise pile up across sequences).
    async fn finish(self) {
        for w in &self.watches {
            w.abort();
        }
        self.cms.shutdown().await;
        self.deployments.shutdown().await;
        self.widgets.shutdown().await;
        for res in RESOURCES {
            for name in self.model[res.index()].keys() {
                let path = format!("{}/{name}", res.collection(&self.ns));
                let _ = call(
                    &self.client,
                    http::Method::DELETE,
                    &path,
                    None,
                    Bytes::new(),
                )
                .await;
            }
        }
    }
}

/// The server-owned `uid` and `creationTimestamp` of a written object, checked against
/// what the test's bodies try to set (a made-up uid, a timestamp in 2001, a deletion
/// timestamp, another namespace): none of it may stick.
fn server_owned(obj: &Value, ns: &str) -> Result<(String, String), String> {
    let meta = |f: &str| {
        obj.pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
    };
    let uid = meta("uid").unwrap_or_default();
    let created = meta("creationTimestamp").unwrap_or_default();
    if uid.is_empty() || uid == "not-a-uid" {
        return Err(format!("uid {uid:?} was not set by the server"));
    }
    if created.is_empty() || created.starts_with("2001-") {
        return Err(format!(
            "creationTimestamp {created:?} was not set by the server"
        ));
    }
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        return Err("a client set deletionTimestamp".into());
    }
    if meta("namespace") != Some(ns) {
        return Err(format!("namespace {:?}, not {ns:?}", meta("namespace")));
    }
    Ok((uid.to_string(), created.to_string()))
}

/// What upstream's strategies keep apart: a write to the `status` subresource changes
/// neither the spec nor labels, annotations or generation; a write to the object itself
/// leaves the status as it was.
fn subresource_rules(verb: &Verb, old: &Value, new: &Value) -> Result<(), String> {
    let field = |v: &Value, p: &str| v.pointer(p).cloned().filter(|f| f != &json!({}));
    let same = |p: &str, why: &str| {
        let (before, after) = (field(old, p), field(new, p));
        if before == after {
            Ok(())
        } else {
            Err(format!(
                "{why}: {p} was {}, now {}",
                short(&before.unwrap_or_default()),
                short(&after.unwrap_or_default())
            ))
        }
    };
    match verb {
        Verb::UpdateStatus | Verb::PatchStatus => {
            let why = "a status write changed more than the status";
            same("/spec", why)?;
            same("/metadata/labels", why)?;
            same("/metadata/annotations", why)?;
            same("/metadata/generation", why)
        }
        Verb::Create | Verb::Delete => Ok(()),
        _ => same("/status", "a write of the object changed its status"),
    }
}

/// A created Deployment's status is empty whatever the body said.
fn empty_status(obj: &Value) -> Result<(), String> {
    match obj.get("status") {
        None => Ok(()),
        Some(st) if st == &json!({}) => Ok(()),
        Some(st) => Err(short(st)),
    }
}

/// A `Status` answer with `code`: kind, status, code, reason and message all present.
fn check_status(answer: &Value, code: u16) -> Result<(), String> {
    let ok = answer.get("kind").and_then(Value::as_str) == Some("Status")
        && answer.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && answer.get("status").and_then(Value::as_str) == Some("Failure")
        && answer.get("code").and_then(Value::as_u64) == Some(u64::from(code))
        && answer
            .get("reason")
            .and_then(Value::as_str)
            .is_some_and(|r| !r.is_empty())
        && answer
            .get("message")
            .and_then(Value::as_str)
            .is_some_and(|m| !m.is_empty());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{code} is not a failure Status with code, reason and message: {}",
            short(answer)
        ))
    }
}

async fn typed_list<K>(client: &Client, ns: &str) -> Result<(), String>
where
    K: k8s_openapi::Resource + DeserializeOwned + Serialize + Send + 'static,
    K::Scope: 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    within("a typed LIST", api.list(&ListParams::default()))
        .await?
        .map(drop)
        .map_err(|e| format!("a LIST of {} does not decode: {e}", K::KIND))
}

async fn compare_cache<K>(client: &Client, ns: &str, informer: &Informer<K>) -> Result<(), String>
where
    K: setpoint_runtime::object::Object + k8s_openapi::Resource,
    K::Scope: 'static,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let listed = within("a typed LIST", api.list(&ListParams::default()))
        .await?
        .map_err(|e| format!("a LIST of {} does not decode: {e}", K::KIND))?;
    let as_map = |objects: Vec<Value>| -> BTreeMap<String, Value> {
        objects
            .into_iter()
            .map(|o| {
                let name = o["metadata"]["name"].as_str().unwrap_or("").to_string();
                (name, o)
            })
            .collect()
    };
    let want = as_map(
        listed
            .items
            .iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .collect(),
    );
    let store = informer.store();
    let cached = || {
        as_map(
            store
                .list()
                .iter()
                .map(|o| serde_json::to_value(o.as_ref()).unwrap())
                .collect(),
        )
    };
    let waited = within("an informer's cache to equal a LIST", async {
        while cached() != want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    waited.map_err(|e| {
        let have = cached();
        let rvs = |m: &BTreeMap<String, Value>| -> Vec<(String, String)> {
            m.iter()
                .map(|(n, o)| {
                    let rv = o["metadata"]["resourceVersion"].as_str().unwrap_or("");
                    (n.clone(), rv.to_string())
                })
                .collect()
        };
        format!(
            "{e}: the {} informer holds {:?}, a LIST {:?}",
            K::KIND,
            rvs(&have),
            rvs(&want)
        )
    })
}

// ---- running --------------------------------------------------------------------------------

/// The seed from `SETPOINT_PROPTEST_SEED`, decimal or `0x` hex.
fn seed_from_env() -> Option<u64> {
    let s = std::env::var(SEED_VAR).ok()?;
    let s = s.trim();
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{SEED_VAR}={s:?} is not a u64")))
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // A fresh `RandomState` is seeded from the OS; this needs no RNG crate.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

static NAMESPACES: AtomicU64 = AtomicU64::new(0);

/// Answers by verb and status code, printed at the end of a run (how much of the space the
/// sequences reached: patches that only ever met 404s would prove little).
static ANSWERS: Mutex<BTreeMap<(&'static str, u16), usize>> = Mutex::new(BTreeMap::new());

/// Runs `cases` sequences from `seed` against one in-process cluster (each sequence in its
/// own namespace).
fn run_sequences(seed: u64, cases: u32) {
    eprintln!("api_props: seed {seed} (replay with {SEED_VAR}={seed})");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cluster = rt.block_on(async {
        let cluster = TestCluster::start().await;
        let client = cluster.client();
        let (code, body) = call(
            &client,
            http::Method::POST,
            CRD,
            Some("application/json"),
            Bytes::from(serde_json::to_vec(&widget_crd()).unwrap()),
        )
        .await
        .unwrap();
        assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
        setpoint_testing::eventually("the Widget CRD to be served", || async {
            let (code, _) = call(
                &client,
                http::Method::GET,
                &Res::Widget.collection("default"),
                None,
                Bytes::new(),
            )
            .await
            .ok()?;
            (code == 200).then_some(())
        })
        .await;
        cluster
    });
    let client = cluster.client();
    let config = Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(cases),
        rng_seed: RngSeed::Fixed(seed),
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        // Each shrink step replays a whole sequence; bound the time a failure takes.
        max_shrink_iters: 256,
        max_shrink_time: 30_000,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&steps(), |steps| {
        rt.block_on(async {
            let ns = format!("props-{}", NAMESPACES.fetch_add(1, Ordering::Relaxed));
            let mut seq = Sequence::start(client.clone(), ns).await.map_err(fail)?;
            let outcome = run_steps(&mut seq, &steps).await;
            let context = seq.context();
            seq.finish().await;
            outcome.map_err(|e| fail(format!("{e}\n{context}")))
        })
    });
    rt.block_on(cluster.stop());
    eprintln!(
        "api_props: answers by verb and code: {:?}",
        ANSWERS.lock().unwrap()
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, steps)) => panic!(
            "seed {seed} ({SEED_VAR}={seed}): {why}\nminimal sequence ({} steps): {steps:#?}",
            steps.len()
        ),
        Err(TestError::Abort(why)) => panic!("seed {seed}: aborted: {why}"),
    }
}

async fn run_steps(seq: &mut Sequence, steps: &[Step]) -> Result<(), String> {
    for res in RESOURCES {
        let first = Step {
            res,
            verb: Verb::Create,
            name: "a",
            fault: Fault::None,
            v: 1,
            query: Query::None,
        };
        seq.run(&first).await?;
    }
    for (i, step) in steps.iter().enumerate() {
        seq.run(step).await?;
        seq.check_lists().await?;
        if i % 10 == 9 {
            seq.check_watches().await?;
            seq.check_informers().await?;
        }
    }
    seq.check_end().await
}

#[test]
fn api_sequences_fixed_seed() {
    run_sequences(seed_from_env().unwrap_or(FIXED_SEED), 96);
}

#[test]
fn api_sequences_random_seed() {
    run_sequences(seed_from_env().unwrap_or_else(random_seed), 48);
}
