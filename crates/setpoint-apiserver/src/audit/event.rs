//! The `audit.k8s.io/v1` `Event`: what one stage of one request writes, with the API's field
//! names and `omitempty` rules, and what a request's headers say about its caller.

use std::collections::BTreeMap;
use std::net::IpAddr;

use http::HeaderMap;
use serde::Serialize;
use serde_json::Value;

use crate::authentication::UserInfo;

/// One audit event.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Always `Event`.
    pub kind: &'static str,
    /// Always `audit.k8s.io/v1`.
    pub api_version: &'static str,
    /// The policy's level for the request.
    pub level: &'static str,
    /// The request's id, the same in each of its stages (and its `Audit-Id` header).
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// The stage that wrote the event.
    pub stage: &'static str,
    /// The path and query as sent.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, …), or the lowercase HTTP method
    /// of a non-resource request.
    pub verb: String,
    /// The authenticated user.
    pub user: User,
    /// The user the request acts as (`Impersonate-User`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<User>,
    /// Where the request came from: `X-Forwarded-For`, `X-Real-Ip`, then the peer.
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    /// The `User-Agent` header.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    /// The object the request is about, for resource requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectRef>,
    /// The response's status (absent before the response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    /// The request's body (level `Request` and above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    /// The response's body (level `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// When the request was received (RFC 3339, microseconds).
    pub request_received_timestamp: String,
    /// When this stage was reached (RFC 3339, microseconds).
    pub stage_timestamp: String,
    /// Notes by the handlers (`authorization.k8s.io/decision`, `…/reason`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// `authentication.k8s.io/v1` `UserInfo`.
#[derive(Clone, Debug, Serialize)]
pub struct User {
    /// The user name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// The user's uid, when the authenticator knows one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The user's groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// What else the authenticator knows.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl From<&UserInfo> for User {
    fn from(u: &UserInfo) -> User {
        User {
            username: u.username.clone(),
            uid: u.uid.clone(),
            groups: u.groups.clone(),
            extra: u.extra.clone(),
        }
    }
}

/// `ObjectReference` of the audit API.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// The resource (plural).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    /// The namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// The object's name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// The object's uid, from the request's body.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The API group, absent for the core group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// The API version.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The resourceVersion the request's body carries.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// The subresource.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The bounded part of the response's `Status` upstream copies into an event.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ResponseStatus {
    /// Always empty: `ListMeta` of the status.
    pub metadata: serde_json::Map<String, Value>,
    /// `Success` or `Failure`, when the response was a `Status`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// The status's message.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The status's reason (`NotFound`, `Forbidden`, …).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The status's details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The HTTP status code.
    pub code: u16,
}

impl ResponseStatus {
    /// The status of a response: its code, and when its body is a `Status`, the fields
    /// upstream copies from it.
    pub fn of(code: u16, body: Option<&Value>) -> ResponseStatus {
        let mut s = ResponseStatus {
            code,
            ..Default::default()
        };
        if let Some(b) = body.filter(|b| b["kind"] == "Status") {
            let text = |k: &str| b[k].as_str().unwrap_or("").to_string();
            s.status = text("status");
            s.message = text("message");
            s.reason = text("reason");
            s.details = b.get("details").cloned();
        }
        s
    }
}

/// `sourceIPs` as upstream's `utilnet.SourceIPs`: the `X-Forwarded-For` list, then
/// `X-Real-Ip`, then the connection's peer, each once.
pub fn source_ips(headers: &HeaderMap, peer: Option<IpAddr>) -> Vec<String> {
    let mut ips: Vec<IpAddr> = Vec::new();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(xff) = header("x-forwarded-for") {
        ips.extend(
            xff.split(',')
                .filter_map(|p| p.trim().parse::<IpAddr>().ok()),
        );
    }
    if let Some(ip) = header("x-real-ip").and_then(|v| v.trim().parse::<IpAddr>().ok()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    if let Some(ip) = peer {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    ips.iter().map(IpAddr::to_string).collect()
}

/// Removes `metadata.managedFields` from a logged body, and from each item of a list.
pub fn omit_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for item in items {
            if let Some(m) = item.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ips_forwarded_then_peer_once() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "10.0.0.1, bogus, 10.0.0.2".parse().unwrap(),
        );
        h.insert("x-real-ip", "10.0.0.2".parse().unwrap());
        let peer = Some("127.0.0.1".parse().unwrap());
        assert_eq!(
            source_ips(&h, peer),
            vec!["10.0.0.1", "10.0.0.2", "127.0.0.1"]
        );
        assert_eq!(source_ips(&HeaderMap::new(), peer), vec!["127.0.0.1"]);
    }

    #[test]
    fn status_fields_come_from_a_status_body() {
        let body = serde_json::json!({"kind": "Status", "status": "Failure",
            "message": "secrets \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "kind": "secrets"}, "code": 404});
        let s = serde_json::to_value(ResponseStatus::of(404, Some(&body))).unwrap();
        assert_eq!(
            s,
            serde_json::json!({"metadata": {}, "status": "Failure",
                "message": "secrets \"x\" not found", "reason": "NotFound",
                "details": {"name": "x", "kind": "secrets"}, "code": 404})
        );
        let ok = serde_json::to_value(ResponseStatus::of(200, None)).unwrap();
        assert_eq!(ok, serde_json::json!({"metadata": {}, "code": 200}));
    }

    #[test]
    fn managed_fields_are_removed_from_objects_and_items() {
        let mut v = serde_json::json!({"metadata": {"name": "a", "managedFields": []},
            "items": [{"metadata": {"managedFields": [], "name": "b"}}]});
        omit_managed_fields(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"metadata": {"name": "a"}, "items": [{"metadata": {"name": "b"}}]})
        );
    }
}
