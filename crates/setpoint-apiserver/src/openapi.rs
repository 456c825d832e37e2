//! OpenAPI documents: the v3 root index, one v3 document per group/version, and the Swagger 2.0
//! document at `/openapi/v2`.
//!
//! Each document lists every served path with its operations, the
//! `x-kubernetes-group-version-kind` of each kind and the `fieldValidation` parameter, which is
//! what kubectl reads to decide that the server validates fields itself (so `kubectl create -f`
//! and `apply -f` send `fieldValidation=Strict`).
//!
//! Schemas of built-in kinds come from the protobuf crate's type graph ([`types`]): every message
//! reachable from a group/version's kinds becomes an object schema named like Kubernetes names it
//! (`k8s.io.api.apps.v1.Deployment` → `io.k8s.api.apps.v1.Deployment`), with the descriptions,
//! required properties, list types and strategic-merge-patch metadata recorded there. That is
//! what `kubectl explain` reads. Kinds the graph does not describe (custom resources) keep a
//! schema that accepts any object.
//!
//! Strategic merge patch is left out of the built-ins' PATCH request bodies on purpose: kubectl
//! then computes it from the v2 document's patch metadata (`x-kubernetes-patch-strategy`,
//! `x-kubernetes-patch-merge-key`, read from the protobuf form), falling back to its
//! compiled-in types; the server's implementation matches both.
//!
//! `/openapi/v2` is served as JSON or, when the client prefers it (client-go's
//! `OpenAPISchema()` asks for it), as gnostic's protobuf message ([`v2proto`]).
//!
//! Built-in documents never change, so each one is built once (per set of served resources) and
//! cached along with the hash the root index advertises (and `/openapi/v2` sends as its ETag),
//! and the v2 document's protobuf encoding once it is first asked for.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use serde_json::{json, Map, Value};
use setpoint_api::ApiError;
use setpoint_protobuf::types::{self, FieldRef, Form, TypeRef};

use crate::cel::schema::Node;
use crate::registry::{Registry, ResourceDef};
use crate::state::ApiServer;

pub mod v2proto;

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
/// Past this many cached documents (custom resources coming and going) the cache starts over.
const MAX_CACHED: usize = 512;

/// The media type of the v2 document's gnostic protobuf encoding, which the response carries.
pub const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// The older spelling of [`V2_PROTOBUF`], which client-go still sends; answered the same.
const V2_PROTOBUF_AT: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

/// One built document and the hash the root index advertises for it.
struct Built {
    doc: Value,
    hash: String,
    /// The protobuf encoding (v2 only), made on first request: most clients never ask.
    proto: OnceLock<Bytes>,
}

fn cache() -> &'static Mutex<HashMap<String, Arc<Built>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Built>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// Returns the cached document for `key`, building it on first use.
fn cached(key: String, build: impl FnOnce() -> Value) -> Arc<Built> {
    if let Some(b) = cache().lock().expect("openapi cache").get(&key) {
        return b.clone();
    }
    let doc = build();
    let built = Arc::new(Built {
        hash: doc_hash(&doc),
        doc,
        proto: OnceLock::new(),
    });
    let mut map = cache().lock().expect("openapi cache");
    if map.len() >= MAX_CACHED {
        map.clear();
    }
    map.entry(key).or_insert(built).clone()
}

/// What a document depends on: the served resources of the group/versions it covers.
fn fingerprint<'a>(defs: impl Iterator<Item = &'a Arc<ResourceDef>>) -> String {
    let mut key = String::new();
    for r in defs {
        key.push_str(&format!(
            "{}/{}/{}/{}/{}/{}/{};",
            r.group, r.version, r.kind, r.plural, r.namespaced, r.status, r.scale
        ));
    }
    key
}

fn gv_built(server: &ApiServer, group: &str, version: &str) -> Option<Arc<Built>> {
    gv_built_in(&server.registry(), group, version)
}

fn gv_built_in(registry: &Registry, group: &str, version: &str) -> Option<Arc<Built>> {
    let owned = registry.of_group_version(group, version);
    let defs: Vec<&Arc<ResourceDef>> = owned.iter().collect();
    if defs.is_empty() {
        return None;
    }
    let key = format!("v3:{}", fingerprint(defs.iter().copied()));
    Some(cached(key, || group_version_doc(&defs)))
}

/// One served kind's schema as its group/version's OpenAPI v3 document publishes it, with the
/// document's named schemas its `$ref`s resolve against.
pub struct KindSchema {
    /// The kind, as upstream prints a `GroupVersionKind` (`apps/v1, Kind=Deployment`).
    pub gvk: String,
    built: Arc<Built>,
    name: String,
}

impl KindSchema {
    /// The kind's schema node; `None` if the document does not hold it.
    pub fn node(&self) -> Option<Node<'_>> {
        let defs = self.built.doc.pointer("/components/schemas")?;
        Some(Node::with_definitions(defs.get(&self.name)?, defs))
    }
}

/// The schema of `resource` (looked up by plural, or by kind when `by_kind`) of
/// `group`/`version`, from the same cached document `/openapi/v3` serves.
pub fn kind_schema(
    registry: &Registry,
    group: &str,
    version: &str,
    resource: &str,
    by_kind: bool,
) -> Option<KindSchema> {
    let def = if by_kind {
        registry.by_kind(group, version, resource)
    } else {
        registry.get(group, version, resource)
    }?;
    let name = match types::for_kind(&def.group, &def.version, &def.kind) {
        Some(t) => schema_name(t.name()),
        None => custom_schema_name(&def.group, &def.version, &def.kind),
    };
    Some(KindSchema {
        gvk: format!("{}/{}, Kind={}", def.group, def.version, def.kind),
        built: gv_built_in(registry, group, version)?,
        name,
    })
}

/// Serves `/openapi/v3` (the index) and `/openapi/v3/<api/v1 | apis/g/v>`.
pub fn v3(server: &ApiServer, path: &str) -> Option<Value> {
    let rest = path
        .trim_start_matches("/openapi/v3")
        .trim_start_matches('/');
    if rest.is_empty() {
        let mut paths = Map::new();
        for (g, versions) in server.registry().groups() {
            for v in versions {
                let key = if g.is_empty() {
                    format!("api/{v}")
                } else {
                    format!("apis/{g}/{v}")
                };
                let Some(built) = gv_built(server, &g, &v) else {
                    continue;
                };
                paths.insert(
                    key.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={}", built.hash)}),
                );
            }
        }
        return Some(json!({"paths": Value::Object(paths)}));
    }
    let (group, version) = match rest.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    gv_built(server, &group, &version).map(|b| b.doc.clone())
}

/// The body of an `/openapi/v2` response.
#[derive(Debug, Clone)]
pub enum V2Body {
    /// Swagger 2.0 JSON.
    Json(Value),
    /// The same document as gnostic's `openapi.v2.Document`, media type [`V2_PROTOBUF`].
    Protobuf(Bytes),
}

/// An `/openapi/v2` response: the body and the ETag shared by both encodings (the document's
/// hash; the response varies by Accept, as kube-apiserver's does).
#[derive(Debug, Clone)]
pub struct V2Doc {
    /// The document, in the encoding the client accepts.
    pub body: V2Body,
    /// The ETag value (unquoted).
    pub etag: String,
}

/// The encodings `/openapi/v2` can answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V2Format {
    Json,
    Protobuf,
}

/// Picks the encoding an Accept header asks for, like kube-apiserver: clauses by preference
/// (quality, then the more specific first, then in order), the first one we can produce wins;
/// wildcards mean JSON. `None` when nothing acceptable can be produced.
fn negotiate_v2(accept: &str) -> Option<V2Format> {
    if accept.trim().is_empty() {
        return Some(V2Format::Json);
    }
    let mut clauses: Vec<(f32, u8, usize, Option<V2Format>)> = Vec::new();
    for (i, clause) in accept.split(',').enumerate() {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if q <= 0.0 {
            continue;
        }
        let (format, specificity) = match media.as_str() {
            "application/json" => (Some(V2Format::Json), 2),
            V2_PROTOBUF | V2_PROTOBUF_AT => (Some(V2Format::Protobuf), 2),
            "application/*" => (Some(V2Format::Json), 1),
            "*/*" => (Some(V2Format::Json), 0),
            _ => (None, 2),
        };
        clauses.push((q, specificity, i, format));
    }
    clauses.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    clauses.into_iter().find_map(|c| c.3)
}

/// Serves `/openapi/v2`: Swagger 2.0 as JSON, or as gnostic's protobuf message when the Accept
/// header prefers [`V2_PROTOBUF`] (or its older `@v1.0` spelling). Anything else is 406.
pub fn v2(server: &ApiServer, accept: &str) -> Result<V2Doc, ApiError> {
    let Some(format) = negotiate_v2(accept) else {
        return Err(ApiError::not_acceptable(format!(
            "unsupported Accept {accept:?} for /openapi/v2: application/json and \
             {V2_PROTOBUF} are served"
        )));
    };
    let all = server.registry().all().to_vec();
    let key = format!("v2:{}", fingerprint(all.iter()));
    let built = cached(key, || {
        let mut gvs: Vec<(String, String)> = Vec::new();
        for r in all {
            if !gvs.iter().any(|(g, v)| *g == r.group && *v == r.version) {
                gvs.push((r.group.clone(), r.version.clone()));
            }
        }
        let docs: Vec<Value> = gvs
            .iter()
            .map(|(g, v)| {
                let owned = server.registry().of_group_version(g, v);
                group_version_doc(&owned.iter().collect::<Vec<_>>())
            })
            .collect();
        swagger2(&docs)
    });
    let body = match format {
        V2Format::Json => V2Body::Json(built.doc.clone()),
        V2Format::Protobuf => V2Body::Protobuf(
            built
                .proto
                .get_or_init(|| Bytes::from(v2proto::encode(&built.doc)))
                .clone(),
        ),
    };
    Ok(V2Doc {
        body,
        etag: built.hash.clone(),
    })
}

fn doc_hash(doc: &Value) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in doc.to_string().bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

fn param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        param(
            "dryRun",
            "When present, the write is validated but not persisted. Valid value: All.",
        ),
        param("fieldManager", "The name of the actor making the change."),
        param(
            "fieldValidation",
            "What to do with unknown or duplicate fields: Ignore, Warn (default) or Strict.",
        ),
    ]
}

fn gvk_of(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn gvk(r: &ResourceDef) -> Value {
    gvk_of(&r.group, &r.version, &r.kind)
}

fn ref_to(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// Kubernetes' schema name of a protobuf message: `k8s.io.api.apps.v1.Deployment` →
/// `io.k8s.api.apps.v1.Deployment`, `k8s.io.apiextensions_apiserver.…` →
/// `io.k8s.apiextensions-apiserver.…`.
pub fn schema_name(proto: &str) -> String {
    let rest = proto.strip_prefix("k8s.io.").unwrap_or(proto);
    match rest.rsplit_once('.') {
        Some((pkg, name)) => format!("io.k8s.{}.{name}", pkg.replace('_', "-")),
        None => format!("io.k8s.{rest}"),
    }
}

/// The schema name of a kind the type graph does not describe (a custom resource): the group
/// reversed, as Kubernetes names CRD schemas (`example.com` → `com.example.v1.Widget`).
fn custom_schema_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.rsplit('.').collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// The schema of a custom resource: its CRD's `openAPIV3Schema` (or "anything" without one)
/// with the server's `apiVersion`, `kind` and `metadata`, as Kubernetes publishes it.
fn custom_schema(r: &ResourceDef, object_meta: Option<&str>) -> Value {
    let mut s = r
        .custom
        .as_ref()
        .and_then(|c| c.schema.clone())
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    if let Some(m) = s.as_object_mut() {
        if !m.get("properties").is_some_and(Value::is_object) {
            m.insert("properties".into(), json!({}));
        }
        if let Some(props) = m.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert(
                "apiVersion".into(),
                json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}),
            );
            props.insert(
                "kind".into(),
                json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}),
            );
            if let Some(meta) = object_meta {
                props.insert("metadata".into(), json!({"allOf": [ref_to(meta)]}));
            }
        }
        m.insert("x-kubernetes-group-version-kind".into(), json!([gvk(r)]));
    }
    s
}

/// Collects the component schemas of one document.
#[derive(Default)]
struct Schemas {
    schemas: BTreeMap<String, Value>,
    /// Top-level kinds by schema name.
    gvks: HashMap<String, Vec<Value>>,
}

impl Schemas {
    /// Adds `t` (and everything it reaches) and returns its schema name.
    fn add_type(&mut self, t: TypeRef) -> String {
        let name = schema_name(t.name());
        if self.schemas.contains_key(&name) {
            return name;
        }
        // Placeholder first: the graph has cycles (JSONSchemaProps).
        self.schemas.insert(name.clone(), Value::Null);
        let mut props = Map::new();
        if has_type_meta(t) {
            let type_meta = TypeRef::by_name(&format!("{META}.TypeMeta"));
            for field in ["apiVersion", "kind"] {
                let description = type_meta
                    .and_then(|tm| tm.field(field))
                    .map(|f| f.description())
                    .unwrap_or("");
                props.insert(
                    field.to_string(),
                    json!({"description": description, "type": "string"}),
                );
            }
        }
        for f in t.fields() {
            let p = self.property(f);
            props.insert(f.name().to_string(), p);
        }
        let mut s = Map::new();
        if !t.description().is_empty() {
            s.insert("description".into(), t.description().into());
        }
        s.insert("type".into(), "object".into());
        let mut required = t.required();
        // Every kind's (and list's) metadata is optional upstream (`metadata,omitempty`); the
        // type graph marks it required, which would make kubectl's client-side validation
        // (which it runs for kinds without a PATCH, such as the reviews) refuse bodies
        // without metadata.
        if has_type_meta(t) {
            required.retain(|r| *r != "metadata");
        }
        if !required.is_empty() {
            s.insert("required".into(), json!(required));
        }
        s.insert("properties".into(), Value::Object(props));
        if let Some(g) = self.gvks.get(&name) {
            s.insert("x-kubernetes-group-version-kind".into(), json!(g));
        }
        self.schemas.insert(name.clone(), Value::Object(s));
        name
    }

    /// Marks `t` as the type of a kind (before it is added).
    fn kind(&mut self, t: TypeRef, gvk: Value) {
        let entry = self.gvks.entry(schema_name(t.name())).or_default();
        if !entry.contains(&gvk) {
            entry.push(gvk);
        }
    }

    /// The schema of one value of `f` (each item of a list, each value of a map).
    fn element(&mut self, f: FieldRef) -> Value {
        match f.form() {
            Form::Object(t) => ref_to(&self.add_type(t)),
            Form::String => json!({"type": "string"}),
            Form::Bytes => json!({"type": "string", "format": "byte"}),
            Form::Boolean => json!({"type": "boolean"}),
            Form::Int32 => json!({"type": "integer", "format": "int32"}),
            Form::Int64 => json!({"type": "integer", "format": "int64"}),
            Form::Double => json!({"type": "number", "format": "double"}),
            form => {
                let proto = f.type_name().unwrap_or_default();
                let name = schema_name(proto);
                if !self.schemas.contains_key(&name) {
                    let mut s = special_schema(form, proto);
                    let description = types::description_of(proto).unwrap_or("");
                    if !description.is_empty() {
                        s["description"] = description.into();
                    }
                    self.schemas.insert(name.clone(), s);
                }
                ref_to(&name)
            }
        }
    }

    fn property(&mut self, f: FieldRef) -> Value {
        let item = self.element(f);
        let mut p = if f.is_list() {
            let mut p = json!({"type": "array", "items": item});
            let strategy = f.patch_strategy();
            match f.list_type() {
                Some((list_type, keys)) => {
                    p["x-kubernetes-list-type"] = list_type.into();
                    if list_type == "map" && !keys.is_empty() {
                        p["x-kubernetes-list-map-keys"] = json!(keys);
                    }
                }
                None => {
                    if let Some(key) = strategy.merge_key() {
                        p["x-kubernetes-list-type"] = "map".into();
                        p["x-kubernetes-list-map-keys"] = json!([key]);
                    } else if strategy.merges_list() {
                        p["x-kubernetes-list-type"] = "set".into();
                    }
                }
            }
            p
        } else if f.is_map() {
            json!({"type": "object", "additionalProperties": item})
        } else if item.get("$ref").is_some() {
            // `$ref` siblings are ignored in OpenAPI 3.0: wrap it so the description counts.
            json!({"allOf": [item]})
        } else {
            item
        };
        let strategy = f.patch_strategy();
        if let Some(s) = strategy.openapi_strategy() {
            p["x-kubernetes-patch-strategy"] = s.into();
        }
        if let Some(key) = strategy.merge_key() {
            p["x-kubernetes-patch-merge-key"] = key.into();
        }
        if !f.description().is_empty() {
            p["description"] = f.description().into();
        }
        p
    }
}

/// Whether the type's JSON form carries `apiVersion` and `kind` (it embeds TypeMeta): kinds
/// and their lists, recognised by their object or list metadata.
fn has_type_meta(t: TypeRef) -> bool {
    t.field("metadata")
        .and_then(|f| f.message())
        .is_some_and(|m| {
            m.name() == format!("{META}.ObjectMeta") || m.name() == format!("{META}.ListMeta")
        })
}

/// Schemas of the messages with a hand-written JSON form.
fn special_schema(form: Form, proto: &str) -> Value {
    match form {
        Form::Quantity | Form::IntOrString => json!({
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": true,
        }),
        Form::Time | Form::MicroTime => json!({"type": "string", "format": "date-time"}),
        Form::Duration => json!({"type": "string"}),
        Form::RawJson if proto.ends_with(".JSON") => {
            json!({"x-kubernetes-preserve-unknown-fields": true})
        }
        Form::RawJson => json!({"type": "object"}),
        Form::StringList => json!({"type": "array", "items": {"type": "string"}}),
        _ => json!({"x-kubernetes-preserve-unknown-fields": true}),
    }
}

fn group_version_doc(defs: &[&Arc<ResourceDef>]) -> Value {
    let mut schemas = Schemas::default();
    // Kinds first, so that their schemas carry the GVK extension when added.
    let mut kinds: Vec<(&ResourceDef, Option<TypeRef>, Option<TypeRef>)> = Vec::new();
    for r in defs {
        let t = types::for_kind(&r.group, &r.version, &r.kind);
        let list = t.and_then(|t| TypeRef::by_name(&format!("{}List", t.name())));
        if let Some(t) = t {
            for (g, v, k, other) in types::kinds() {
                if other == t {
                    schemas.kind(t, gvk_of(g, v, k));
                }
            }
            schemas.kind(t, gvk(r));
        }
        if let Some(l) = list {
            schemas.kind(l, gvk_of(&r.group, &r.version, &format!("{}List", r.kind)));
        }
        kinds.push((r, t, list));
    }
    let scale = types::for_kind("autoscaling", "v1", "Scale");
    if let Some(s) = scale {
        schemas.kind(s, gvk_of("autoscaling", "v1", "Scale"));
    }
    let common = |schemas: &mut Schemas, kind: &str| {
        TypeRef::by_name(&format!("{META}.{kind}")).map(|t| {
            schemas.kind(t, gvk_of("", "v1", kind));
            schemas.add_type(t)
        })
    };
    let delete_options = common(&mut schemas, "DeleteOptions");
    let status = common(&mut schemas, "Status");

    let mut paths = Map::new();
    for (r, t, list) in kinds {
        let object_schema = match t {
            Some(t) => schemas.add_type(t),
            None => {
                let name = custom_schema_name(&r.group, &r.version, &r.kind);
                let object_meta =
                    TypeRef::by_name(&format!("{META}.ObjectMeta")).map(|t| schemas.add_type(t));
                schemas
                    .schemas
                    .insert(name.clone(), custom_schema(r, object_meta.as_deref()));
                name
            }
        };
        let list_schema = list.map(|l| schemas.add_type(l));
        let base = if r.group.is_empty() {
            format!("/api/{}", r.version)
        } else {
            format!("/apis/{}/{}", r.group, r.version)
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let item = format!("{collection}/{{name}}");
        let ok = |schema: &str| {
            json!({"200": {"description": "OK", "content": {
                "application/json": {"schema": ref_to(schema)},
                "application/yaml": {"schema": ref_to(schema)},
            }}})
        };
        let body = |schema: &str, types: &[&str]| {
            let mut content = Map::new();
            for t in types {
                let s = if t.contains("patch") {
                    // Patches are partial objects or JSON patch arrays.
                    json!({"type": "object"})
                } else {
                    ref_to(schema)
                };
                content.insert((*t).to_string(), json!({"schema": s}));
            }
            json!({"content": Value::Object(content), "required": true})
        };
        let op = |action: &str, kind: &ResourceDef, response: &str, extra: Value| {
            let mut o = json!({
                "operationId": format!("{action}{}", kind.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk(kind),
                "responses": ok(response),
            });
            if let Value::Object(m) = extra {
                for (k, v) in m {
                    o[k] = v;
                }
            }
            o
        };
        let list_response = list_schema.as_deref().unwrap_or(&object_schema);
        let status_response = status.as_deref().unwrap_or(&object_schema);
        let mut delete_extra = json!({
            "parameters": [param("dryRun", "When present, the delete is validated but not performed.")],
        });
        if let Some(d) = delete_options.as_deref() {
            let mut b = body(d, &["application/json"]);
            b["required"] = false.into();
            delete_extra["requestBody"] = b;
        }
        // A review is only ever created: its collection takes a POST, and it has no objects.
        if r.is_create_only() {
            paths.insert(
                collection,
                json!({"post": op("post", r, &object_schema, json!({"parameters": write_params(), "requestBody": body(&object_schema, &["application/json", "application/yaml"])}))}),
            );
            continue;
        }
        paths.insert(
            collection.clone(),
            json!({
                "get": op("list", r, list_response, json!({})),
                "post": op("post", r, &object_schema, json!({"parameters": write_params(), "requestBody": body(&object_schema, &["application/json", "application/yaml"])})),
                "delete": op("deletecollection", r, status_response, json!({})),
            }),
        );
        paths.insert(
            item.clone(),
            json!({
                "get": op("get", r, &object_schema, json!({})),
                "put": op("put", r, &object_schema, json!({"parameters": write_params(), "requestBody": body(&object_schema, &["application/json", "application/yaml"])})),
                // Strategic merge patch is left out on purpose: kubectl then computes it from
                // the v2 document's patch metadata or its compiled-in types, which is right
                // for built-in kinds.
                "patch": op("patch", r, &object_schema, json!({
                    "parameters": write_params().into_iter().chain([param("force", "Force an apply, taking ownership of conflicting fields.")]).collect::<Vec<_>>(),
                    "requestBody": body(&object_schema, &["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]),
                })),
                "delete": op("delete", r, status_response, delete_extra),
            }),
        );
        for s in r.subresources() {
            let schema = if s.name == "scale" {
                scale.map(|t| schemas.add_type(t))
            } else {
                None
            }
            .unwrap_or_else(|| object_schema.clone());
            paths.insert(
                format!("{item}/{}", s.name),
                json!({"get": op("get", r, &schema, json!({}))}),
            );
        }
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": Value::Object(paths),
        "components": {"schemas": Value::Object(schemas.schemas.into_iter().collect())},
    })
}

/// Rewrites a v3 schema for Swagger 2.0: `#/definitions/` references, `$ref` without the
/// `allOf` wrapper, int-or-string as `type: string, format: int-or-string`.
fn schema_v2(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            if let Some(Value::Array(all)) = m.get("allOf") {
                if let [only] = all.as_slice() {
                    if let Some(r) = only.get("$ref") {
                        out.insert("$ref".into(), schema_v2(r));
                    }
                }
            }
            if m.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                out.insert("type".into(), "string".into());
                out.insert("format".into(), "int-or-string".into());
            }
            for (k, val) in m {
                if (k == "allOf" && out.contains_key("$ref"))
                    || (k == "anyOf" && out.contains_key("format"))
                    || k == "x-kubernetes-int-or-string"
                {
                    continue;
                }
                out.insert(k.clone(), schema_v2(val));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(schema_v2).collect()),
        Value::String(s) => match s.strip_prefix("#/components/schemas/") {
            Some(name) => Value::String(format!("#/definitions/{name}")),
            None => v.clone(),
        },
        _ => v.clone(),
    }
}

/// One operation in Swagger 2.0 form.
fn operation_v2(op: &Value) -> Value {
    let mut out = Map::new();
    let mut params: Vec<Value> = Vec::new();
    for (k, v) in op.as_object().into_iter().flatten() {
        match k.as_str() {
            "parameters" => {
                for p in v.as_array().into_iter().flatten() {
                    let mut p2 = p.clone();
                    if let Some(m) = p2.as_object_mut() {
                        m.remove("schema");
                        m.insert("type".into(), "string".into());
                        m.insert("uniqueItems".into(), true.into());
                    }
                    params.push(p2);
                }
            }
            "requestBody" => {
                let content = v.get("content").and_then(Value::as_object);
                let consumes: Vec<&String> =
                    content.into_iter().flatten().map(|(t, _)| t).collect();
                if let Some(schema) = content
                    .into_iter()
                    .flatten()
                    .next()
                    .and_then(|(_, c)| c.get("schema"))
                {
                    params.push(json!({
                        "name": "body",
                        "in": "body",
                        "required": v.get("required").cloned().unwrap_or(Value::Bool(true)),
                        "schema": schema_v2(schema),
                    }));
                }
                out.insert("consumes".into(), json!(consumes));
            }
            "responses" => {
                let mut responses = Map::new();
                for (code, r) in v.as_object().into_iter().flatten() {
                    let mut r2 = json!({"description": r.get("description").cloned().unwrap_or("OK".into())});
                    if let Some(schema) = r.pointer("/content/application~1json/schema") {
                        r2["schema"] = schema_v2(schema);
                    }
                    responses.insert(code.clone(), r2);
                }
                out.insert("responses".into(), Value::Object(responses));
                out.insert(
                    "produces".into(),
                    json!(["application/json", "application/yaml"]),
                );
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    Value::Object(out)
}

/// Merges v3 group/version documents into one Swagger 2.0 document.
fn swagger2(docs: &[Value]) -> Value {
    let mut paths = Map::new();
    let mut definitions = BTreeMap::new();
    for doc in docs {
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            let mut ops = Map::new();
            for (method, op) in item.as_object().into_iter().flatten() {
                ops.insert(method.clone(), operation_v2(op));
            }
            paths.insert(path.clone(), Value::Object(ops));
        }
        for (name, schema) in doc["components"]["schemas"]
            .as_object()
            .into_iter()
            .flatten()
        {
            definitions
                .entry(name.clone())
                .or_insert_with(|| schema_v2(schema));
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": Value::Object(paths),
        "definitions": Value::Object(definitions.into_iter().collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_follow_kubernetes() {
        assert_eq!(
            schema_name("k8s.io.api.apps.v1.Deployment"),
            "io.k8s.api.apps.v1.Deployment"
        );
        assert_eq!(
            schema_name(
                "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
            ),
            "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"
        );
        assert_eq!(
            custom_schema_name("stable.example.com", "v1", "CronTab"),
            "com.example.stable.v1.CronTab"
        );
    }

    #[test]
    fn v2_negotiation_follows_accept_preferences() {
        use V2Format::*;
        let cases = [
            ("", Some(Json)),
            ("application/json", Some(Json)),
            ("*/*", Some(Json)),
            ("application/json;charset=utf-8", Some(Json)),
            (V2_PROTOBUF_AT, Some(Protobuf)),
            (V2_PROTOBUF, Some(Protobuf)),
            // client-go's request, and one that prefers JSON by quality.
            (
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf, application/json",
                Some(Protobuf),
            ),
            (
                "application/com.github.proto-openapi.spec.v2@v1.0+protobuf;q=0.5, application/json",
                Some(Json),
            ),
            // The exact type beats a wildcard of the same quality wherever it is listed.
            (
                "*/*, application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                Some(Protobuf),
            ),
            ("application/yaml", None),
            ("application/json;q=0", None),
            ("application/vnd.kubernetes.protobuf", None),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate_v2(accept), want, "{accept}");
        }
    }

    #[test]
    fn v2_schemas_use_definitions_and_plain_refs() {
        let v3 = json!({"properties": {
            "a": {"allOf": [{"$ref": "#/components/schemas/X"}], "description": "d"},
            "b": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
        }});
        let v2 = schema_v2(&v3);
        assert_eq!(
            v2["properties"]["a"],
            json!({"$ref": "#/definitions/X", "description": "d"})
        );
        assert_eq!(
            v2["properties"]["b"],
            json!({"type": "string", "format": "int-or-string"})
        );
    }
}
