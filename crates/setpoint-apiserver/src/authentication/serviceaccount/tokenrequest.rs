//! `POST serviceaccounts/<name>/token`: a TokenRequest (`authentication.k8s.io/v1`) in, the
//! same with `status.token` and `status.expirationTimestamp` out, as upstream's token REST
//! storage answers it.

use std::sync::Arc;

use serde_json::{json, Value};
use setpoint_api::{ApiError, Cause, GroupResource};

use super::{Binding, ObjectRef, DEFAULT_EXPIRATION_SECONDS};
use crate::state::ApiServer;

/// The shortest validity a client may ask for (upstream's validation).
const MIN_EXPIRATION_SECONDS: i64 = 10 * 60;
/// The longest: 2^32 seconds.
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// What a TokenRequest asks for, defaulted and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `spec.audiences` (the API's audiences when empty).
    pub audiences: Vec<String>,
    /// `spec.expirationSeconds`.
    pub expiration_seconds: i64,
    /// `spec.boundObjectRef`: (apiVersion, kind, name, uid).
    pub bound: Option<(String, String, String, String)>,
}

/// Reads, defaults and validates a TokenRequest's spec for the service account `name`.
pub(crate) fn spec(
    request: &Value,
    name: &str,
    api_audiences: &[String],
) -> Result<Spec, ApiError> {
    let spec = request.get("spec").cloned().unwrap_or(Value::Null);
    let mut audiences: Vec<String> = spec
        .get("audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    if audiences.is_empty() {
        audiences = api_audiences.to_vec();
    }
    let expiration_seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::bad_request(format!(
                "TokenRequest in version \"v1\" cannot be handled as a TokenRequest: json: cannot unmarshal {v} into Go struct field TokenRequestSpec.spec.expirationSeconds of type int64"
            ))
        })?,
    };
    let field = "spec.expirationSeconds";
    let mut causes = Vec::new();
    if expiration_seconds < MIN_EXPIRATION_SECONDS {
        causes.push(Cause::invalid(
            field,
            &json!(expiration_seconds),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if expiration_seconds > MAX_EXPIRATION_SECONDS {
        causes.push(Cause::invalid(
            field,
            &json!(expiration_seconds),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            causes,
        ));
    }
    let bound = spec
        .get("boundObjectRef")
        .filter(|r| r.is_object())
        .map(|r| {
            let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            (s("apiVersion"), s("kind"), s("name"), s("uid"))
        });
    Ok(Spec {
        audiences,
        expiration_seconds,
        bound,
    })
}

/// Mints the token a TokenRequest for the service account `ns`/`name` asks for.
pub(crate) async fn create(
    server: &Arc<ApiServer>,
    ns: &str,
    name: &str,
    mut request: Value,
) -> Result<Value, ApiError> {
    let def = |plural: &str| {
        server
            .registry()
            .get("", "v1", plural)
            .cloned()
            .ok_or_else(ApiError::not_found_path)
    };
    let sa = server
        .get_object(&*def("serviceaccounts")?, ns, name)
        .await?;
    let issuer = server.service_accounts.clone();
    let spec = spec(&request, name, issuer.api_audiences())?;
    let mut binding = Binding {
        namespace: ns.to_string(),
        service_account: ObjectRef {
            name: name.to_string(),
            uid: uid_of(&sa),
        },
        ..Binding::default()
    };
    if let Some((api_version, kind, object, uid)) = &spec.bound {
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g, v),
            None => ("", api_version.as_str()),
        };
        let found = match (group, kind.as_str()) {
            ("", "Pod") => {
                let pod = server.get_object(&*def("pods")?, ns, object).await?;
                let account = pod
                    .pointer("/spec/serviceAccountName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if account != name {
                    return Err(ApiError::bad_request(format!(
                        "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                    )));
                }
                let pod_ref = ObjectRef {
                    name: object.clone(),
                    uid: uid_of(&pod),
                };
                // A scheduled pod's token also names its node, as upstream's do.
                let node_name = pod
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !node_name.is_empty() {
                    if let Ok(node) = server.get_object(&*def("nodes")?, "", node_name).await {
                        binding.node = Some(ObjectRef {
                            name: node_name.to_string(),
                            uid: uid_of(&node),
                        });
                    }
                }
                binding.pod = Some(pod_ref.clone());
                pod_ref
            }
            ("", "Node") => {
                let node = server.get_object(&*def("nodes")?, "", object).await?;
                let node_ref = ObjectRef {
                    name: object.clone(),
                    uid: uid_of(&node),
                };
                binding.node = Some(node_ref.clone());
                node_ref
            }
            ("", "Secret") => {
                let secret = server.get_object(&*def("secrets")?, ns, object).await?;
                let secret_ref = ObjectRef {
                    name: object.clone(),
                    uid: uid_of(&secret),
                };
                binding.secret = Some(secret_ref.clone());
                secret_ref
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {group}/{version}, Kind={kind}"
                )))
            }
        };
        if !uid.is_empty() && *uid != found.uid {
            let gr = GroupResource {
                group: group.to_string(),
                resource: kind.clone(),
            };
            return Err(ApiError::conflict(
                &gr,
                object,
                &format!(
                    "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        request["spec"]["boundObjectRef"]["uid"] = json!(found.uid);
    }
    let now = chrono::Utc::now();
    let minted = issuer.mint(
        &binding,
        &spec.audiences,
        now.timestamp(),
        spec.expiration_seconds,
    );
    let expires = chrono::DateTime::from_timestamp(minted.expires, 0).unwrap_or(now);
    tracing::debug!(
        namespace = ns,
        serviceaccount = name,
        expires = %expires,
        "minted a service account token"
    );
    if !request.get("metadata").is_some_and(Value::is_object) {
        request["metadata"] = json!({});
    }
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(ns);
    if !request.get("spec").is_some_and(Value::is_object) {
        request["spec"] = json!({});
    }
    request["spec"]["audiences"] = json!(spec.audiences);
    request["spec"]["expirationSeconds"] = json!(spec.expiration_seconds);
    request["status"] = json!({
        "token": minted.token,
        "expirationTimestamp": setpoint_api::time::format_time(expires),
    });
    Ok(request)
}

fn uid_of(obj: &Value) -> String {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_is_defaulted_and_validated_as_upstreams() {
        let api = vec!["https://kubernetes.default.svc.cluster.local".to_string()];
        let s = spec(&json!({}), "bot", &api).unwrap();
        assert_eq!(s.audiences, api);
        assert_eq!(s.expiration_seconds, 3600);
        assert_eq!(s.bound, None);
        let s = spec(
            &json!({"spec": {"audiences": ["x"], "expirationSeconds": 600,
                             "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}}),
            "bot",
            &api,
        )
        .unwrap();
        assert_eq!(s.audiences, ["x"]);
        assert_eq!(
            s.bound,
            Some(("v1".into(), "Pod".into(), "p".into(), String::new()))
        );
        let e = spec(&json!({"spec": {"expirationSeconds": 60}}), "bot", &api).unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
        assert_eq!(
            e.message,
            "TokenRequest.authentication.k8s.io \"bot\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"
        );
        let e = spec(
            &json!({"spec": {"expirationSeconds": 1i64 << 33}}),
            "bot",
            &api,
        )
        .unwrap_err();
        assert!(e
            .message
            .ends_with("may not specify a duration larger than 2^32 seconds"));
    }
}
