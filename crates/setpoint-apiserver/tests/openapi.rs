//! OpenAPI v3 and v2 documents with schemas generated from the Kubernetes type graph.

mod common;

use common::*;
use prost::Message;
use serde_json::{json, Value};
use setpoint_apiserver::openapi::v2proto;

const DEPLOYMENT: &str = "io.k8s.api.apps.v1.Deployment";

/// Follows a property's schema to the component schema it names (`$ref` or `allOf: [$ref]`).
fn resolve<'a>(schemas: &'a Value, prop: &'a Value) -> &'a Value {
    let r = prop["$ref"]
        .as_str()
        .or_else(|| prop["allOf"][0]["$ref"].as_str())
        .unwrap_or_else(|| panic!("no reference in {prop}"));
    let name = r
        .strip_prefix("#/components/schemas/")
        .or_else(|| r.strip_prefix("#/definitions/"))
        .unwrap();
    let s = &schemas[name];
    assert!(s.is_object(), "{name} is not in the document");
    s
}

fn description(v: &Value) -> &str {
    v["description"].as_str().unwrap_or("")
}

#[tokio::test]
async fn v3_documents_carry_full_schemas() {
    let r = start().await;
    let root = get(&r, "/openapi/v3").await;
    let url = root.body["paths"]["apis/apps/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    // The hash is stable: the document is built once.
    let again = get(&r, "/openapi/v3").await;
    assert_eq!(
        again.body["paths"]["apis/apps/v1"]["serverRelativeURL"],
        url.as_str()
    );
    let doc = get(&r, &url).await;
    assert_eq!(doc.status, 200);
    let schemas = &doc.body["components"]["schemas"];
    let dep = &schemas[DEPLOYMENT];
    assert_eq!(
        dep["x-kubernetes-group-version-kind"],
        json!([{"group": "apps", "version": "v1", "kind": "Deployment"}])
    );
    assert!(description(dep).starts_with("Deployment enables declarative updates"));
    assert_eq!(dep["properties"]["apiVersion"]["type"], "string");
    assert!(!description(&dep["properties"]["kind"]).is_empty());
    let meta = resolve(schemas, &dep["properties"]["metadata"]);
    assert_eq!(meta["properties"]["name"]["type"], "string");
    assert!(schemas
        .get("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        .is_some());

    let spec = resolve(schemas, &dep["properties"]["spec"]);
    assert_eq!(spec["required"], json!(["selector", "template"]));
    assert_eq!(spec["properties"]["replicas"]["format"], "int32");
    let strategy = resolve(schemas, &spec["properties"]["strategy"]);
    assert_eq!(
        spec["properties"]["strategy"]["x-kubernetes-patch-strategy"],
        "retainKeys"
    );
    let rolling = resolve(schemas, &strategy["properties"]["rollingUpdate"]);
    for field in ["maxSurge", "maxUnavailable"] {
        let p = &rolling["properties"][field];
        assert!(
            description(p).starts_with("The maximum number of pods"),
            "{field}: {p}"
        );
        let ios = resolve(schemas, p);
        assert_eq!(ios["x-kubernetes-int-or-string"], true);
    }
    assert!(!description(&rolling["properties"]["maxSurge"]).contains("+optional"));

    let template = resolve(schemas, &spec["properties"]["template"]);
    let pod_spec = resolve(schemas, &template["properties"]["spec"]);
    assert_eq!(pod_spec["required"], json!(["containers"]));
    let containers = &pod_spec["properties"]["containers"];
    assert_eq!(containers["type"], "array");
    assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
    assert_eq!(containers["x-kubernetes-patch-strategy"], "merge");
    assert_eq!(containers["x-kubernetes-list-type"], "map");
    assert_eq!(containers["x-kubernetes-list-map-keys"], json!(["name"]));
    let volumes = &pod_spec["properties"]["volumes"];
    assert_eq!(volumes["x-kubernetes-patch-strategy"], "merge,retainKeys");
    let container = resolve(schemas, &containers["items"]);
    assert_eq!(container["required"], json!(["name"]));
    let ports = &container["properties"]["ports"];
    assert_eq!(
        ports["x-kubernetes-list-map-keys"],
        json!(["containerPort", "protocol"])
    );
    assert_eq!(
        container["properties"]["args"]["x-kubernetes-list-type"],
        "atomic"
    );
    let resources = resolve(schemas, &container["properties"]["resources"]);
    let limits = &resources["properties"]["limits"];
    assert_eq!(limits["type"], "object");
    resolve(schemas, &limits["additionalProperties"]);
    let time = &schemas["io.k8s.apimachinery.pkg.apis.meta.v1.Time"];
    assert_eq!(time["format"], "date-time");

    // The operations keep what kubectl checks: GVK, fieldValidation, no strategic merge patch.
    let patch_op =
        &doc.body["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert_eq!(
        patch_op["x-kubernetes-group-version-kind"]["kind"],
        "Deployment"
    );
    assert!(patch_op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation"));
    let content = patch_op["requestBody"]["content"].as_object().unwrap();
    assert!(content.contains_key("application/merge-patch+json"));
    assert!(!content.contains_key("application/strategic-merge-patch+json"));

    // Every reference in the document resolves inside it.
    let text = doc.body.to_string();
    for piece in text.split("\"#/components/schemas/").skip(1) {
        let name = &piece[..piece.find('"').unwrap()];
        assert!(schemas[name].is_object(), "dangling reference {name}");
    }

    let core = get(&r, "/openapi/v3/api/v1").await;
    let pod = &core.body["components"]["schemas"]["io.k8s.api.core.v1.Pod"];
    assert_eq!(
        pod["x-kubernetes-group-version-kind"],
        json!([{"group": "", "version": "v1", "kind": "Pod"}])
    );
    assert_eq!(get(&r, "/openapi/v3/apis/nope/v1").await.status, 404);
}

#[tokio::test]
async fn v2_is_swagger_json() {
    let r = start().await;
    let doc = call_with(
        &r,
        "GET",
        "/openapi/v2",
        None,
        None,
        &[("accept", "application/json")],
    )
    .await;
    assert_eq!(doc.status, 200);
    assert_eq!(doc.body["swagger"], "2.0");
    let defs = &doc.body["definitions"];
    let dep = &defs[DEPLOYMENT];
    assert_eq!(
        dep["x-kubernetes-group-version-kind"][0]["kind"],
        "Deployment"
    );
    let spec = resolve(defs, &dep["properties"]["spec"]);
    assert!(spec["properties"]["strategy"]["$ref"]
        .as_str()
        .unwrap()
        .starts_with("#/definitions/"));
    let text = doc.body.to_string();
    assert!(!text.contains("#/components/"));
    let op = &doc.body["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
    assert!(op["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"));
    assert!(defs["io.k8s.api.core.v1.Pod"].is_object());

    // A type we can't produce is refused.
    let yaml = call_with(
        &r,
        "GET",
        "/openapi/v2",
        None,
        None,
        &[("accept", "application/yaml")],
    )
    .await;
    assert_eq!(yaml.status, 406);
}

/// The properties of a decoded schema by name.
fn proto_props(s: &v2proto::Schema) -> Vec<(&str, &v2proto::Schema)> {
    s.properties
        .iter()
        .flat_map(|p| &p.additional_properties)
        .filter_map(|n| Some((n.name.as_str(), n.value.as_ref()?)))
        .collect()
}

fn proto_ext(exts: &[v2proto::NamedAny], name: &str) -> Value {
    let e = exts
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no {name}"));
    serde_saphyr::from_str(&e.value.as_ref().unwrap().yaml).unwrap()
}

#[tokio::test]
async fn v2_is_served_as_gnostic_protobuf() {
    let r = start().await;
    for accept in [
        // client-go's OpenAPISchema() and the newer spelling.
        "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf, application/json;q=0.9",
    ] {
        let resp = call_with(&r, "GET", "/openapi/v2", None, None, &[("accept", accept)]).await;
        assert_eq!(resp.status, 200, "{accept}");
        assert_eq!(
            resp.headers["content-type"],
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        );
        let doc = v2proto::Document::decode(resp.raw.clone()).expect("decodes");
        assert_eq!(doc.swagger, "2.0");
        let defs = &doc.definitions.as_ref().unwrap().additional_properties;
        let dep = defs
            .iter()
            .find(|d| d.name == DEPLOYMENT)
            .and_then(|d| d.value.as_ref())
            .expect("Deployment definition");
        let props = proto_props(dep);
        let spec = props.iter().find(|(n, _)| *n == "spec").expect("spec").1;
        assert_eq!(spec.xref, "#/definitions/io.k8s.api.apps.v1.DeploymentSpec");
        assert_eq!(
            proto_ext(&dep.vendor_extension, "x-kubernetes-group-version-kind"),
            json!([{"group": "apps", "version": "v1", "kind": "Deployment"}])
        );
        // A list property keeps its list-map keys.
        let pod_spec = defs
            .iter()
            .find(|d| d.name == "io.k8s.api.core.v1.PodSpec")
            .and_then(|d| d.value.as_ref())
            .unwrap();
        let containers = proto_props(pod_spec)
            .into_iter()
            .find(|(n, _)| *n == "containers")
            .unwrap()
            .1;
        assert_eq!(containers.r#type.as_ref().unwrap().value, ["array"]);
        assert_eq!(
            proto_ext(&containers.vendor_extension, "x-kubernetes-patch-merge-key"),
            json!("name")
        );
        let paths = &doc.paths.as_ref().unwrap().path;
        let json_doc = get(&r, "/openapi/v2").await;
        assert_eq!(
            paths.len(),
            json_doc.body["paths"].as_object().unwrap().len()
        );
        assert_eq!(
            defs.len(),
            json_doc.body["definitions"].as_object().unwrap().len()
        );
        let patch = paths
            .iter()
            .find(|p| p.name == "/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
            .and_then(|p| p.value.as_ref()?.patch.as_ref())
            .unwrap();
        assert_eq!(patch.operation_id, "patchDeployment");

        // Both encodings share the document's ETag; presenting it gets 304.
        let etag = resp.headers["etag"].to_str().unwrap().to_string();
        assert_eq!(json_doc.headers["etag"], etag.as_str());
        let again = call_with(
            &r,
            "GET",
            "/openapi/v2",
            None,
            None,
            &[("accept", accept), ("if-none-match", &etag)],
        )
        .await;
        assert_eq!(again.status, 304);
        assert!(again.raw.is_empty());
    }
}
