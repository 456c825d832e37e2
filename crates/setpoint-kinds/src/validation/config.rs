//! ConfigMaps and Secrets: keys, sizes, base64 data, immutability and the typed Secret
//! types (docker config, service account tokens, …).

use serde_json::{json, Map, Value};
use setpoint_api::names;
use setpoint_api::Cause;

use super::fields::{at, entries, key, s, same};

const MAX_SECRET_SIZE: usize = 1024 * 1024;

fn config_key(e: &mut Vec<Cause>, k: &str, path: &str) {
    for msg in names::is_config_map_key(k).err().unwrap_or_default() {
        e.push(Cause::invalid(key(path, k), &json!(k), &msg));
    }
}

/// The decoded length of base64 data, or the error Go's decoder reports.
fn base64_len(v: &Value) -> Result<usize, String> {
    use base64::Engine;
    if v.is_null() {
        // A null byte field decodes to no bytes.
        return Ok(0);
    }
    let Some(text) = v.as_str() else {
        return Err("must be a base64-encoded string".into());
    };
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map(|b| b.len())
        .map_err(|err| match err {
            base64::DecodeError::InvalidByte(at, _)
            | base64::DecodeError::InvalidLastSymbol(at, _) => {
                format!("illegal base64 data at input byte {at}")
            }
            _ => format!("illegal base64 data at input byte {}", text.len()),
        })
}

pub(super) fn config_map(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let (data, binary) = (at(obj, "data"), at(obj, "binaryData"));
    let mut total = 0;
    for (k, v) in entries(data) {
        config_key(e, k, "data");
        if binary.get(k.as_str()).is_some() {
            e.push(Cause::invalid(
                key("data", k),
                &json!(k),
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map_or(0, str::len);
    }
    for (k, v) in entries(binary) {
        config_key(e, k, "binaryData");
        match base64_len(v) {
            Ok(n) => total += n,
            Err(msg) => e.push(Cause::invalid(
                key("binaryData", k),
                &json!("<binary data>"),
                &msg,
            )),
        }
    }
    if total > MAX_SECRET_SIZE {
        e.push(Cause::too_long("", MAX_SECRET_SIZE));
    }
    if let Some(old) = old {
        immutable_contents(e, obj, old, &["data", "binaryData"]);
    }
}

/// Once `immutable: true` is stored, it stays and the contents cannot change.
fn immutable_contents(e: &mut Vec<Cause>, obj: &Value, old: &Value, fields: &[&str]) {
    if at(old, "immutable").as_bool() != Some(true) {
        return;
    }
    if at(obj, "immutable").as_bool() != Some(true) {
        e.push(Cause::forbidden(
            "immutable",
            "field is immutable when `immutable` is set",
        ));
    }
    for f in fields {
        if !same(at(obj, f), at(old, f)) {
            e.push(Cause::forbidden(
                *f,
                "field is immutable when `immutable` is set",
            ));
        }
    }
}

pub(super) fn secret(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let data = at(obj, "data");
    let mut total = 0;
    for (k, v) in entries(data) {
        config_key(e, k, "data");
        match base64_len(v) {
            Ok(n) => total += n,
            Err(msg) => e.push(Cause::invalid(
                key("data", k),
                &json!("<secret contents redacted>"),
                &msg,
            )),
        }
    }
    if total > MAX_SECRET_SIZE {
        e.push(Cause::too_long("data", MAX_SECRET_SIZE));
    }
    for (k, _) in entries(at(obj, "stringData")) {
        config_key(e, k, "stringData");
    }
    let has = |k: &str| data.get(k).is_some();
    let sa_name = s(
        at(at(obj, "metadata"), "annotations"),
        "kubernetes.io/service-account.name",
    );
    match s(obj, "type") {
        "kubernetes.io/service-account-token" if sa_name.is_empty() => {
            e.push(Cause::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
                "",
            ));
        }
        "kubernetes.io/dockercfg" => docker_config(e, data, ".dockercfg"),
        "kubernetes.io/dockerconfigjson" => docker_config(e, data, ".dockerconfigjson"),
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            e.push(Cause::required("data[username]", ""));
            e.push(Cause::required("data[password]", ""));
        }
        "kubernetes.io/ssh-auth" if base64_len(at(data, "ssh-privatekey")).unwrap_or(0) == 0 => {
            e.push(Cause::required("data[ssh-privatekey]", ""));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !has(k) {
                    e.push(Cause::required(key("data", k), ""));
                }
            }
        }
        _ => {}
    }
    if let Some(old) = old {
        if s(obj, "type") != s(old, "type") {
            e.push(Cause::immutable("type", at(obj, "type")));
        }
        immutable_contents(e, obj, old, &["data"]);
    }
}

fn docker_config(e: &mut Vec<Cause>, data: &Value, k: &str) {
    use base64::Engine;
    let path = key("data", k);
    let Some(encoded) = at(data, k).as_str() else {
        e.push(Cause::required(path, ""));
        return;
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_default();
    if let Err(err) = serde_json::from_slice::<Map<String, Value>>(&decoded) {
        e.push(Cause::invalid(
            path,
            &json!("<secret contents redacted>"),
            &err.to_string(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, check_update, fields, find};

    #[test]
    fn config_maps_and_secrets() {
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"ok.key": "v", "bad/key": "v", "..x": "v", "dup": "a"}, "binaryData": {"dup": "eA=="}}),
        );
        assert!(find(&causes, "data[bad/key]")
            .message
            .contains("a valid config key must consist of alphanumeric characters"));
        assert_eq!(
            find(&causes, "data[..x]").message,
            "Invalid value: \"..x\": must not start with '..'"
        );
        assert!(find(&causes, "data[dup]")
            .message
            .ends_with("duplicate of key present in binaryData"));
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"port": 8080}}),
        );
        assert!(
            find(&causes, "data.port")
                .message
                .contains("expected a string"),
            "{causes:?}"
        );
        assert_eq!(
            check(
                "",
                "v1",
                "Secret",
                json!({"metadata": {"name": "s"}, "data": {"empty": null}})
            ),
            vec![]
        );
        let big = "x".repeat(MAX_SECRET_SIZE + 1);
        let causes = check(
            "",
            "v1",
            "ConfigMap",
            json!({"metadata": {"name": "c"}, "data": {"big": big}}),
        );
        assert_eq!(
            find(&causes, "").message,
            "Too long: may not be more than 1048576 bytes"
        );

        let causes = check(
            "",
            "v1",
            "Secret",
            json!({"metadata": {"name": "s"}, "data": {"a": "not base64!"}}),
        );
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert!(find(&causes, "data[a]")
            .message
            .contains("illegal base64 data at input byte"));
        let causes = check(
            "",
            "v1",
            "Secret",
            json!({"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
        );
        assert_eq!(fields(&causes), vec!["data[tls.key]"]);
        assert_eq!(
            check(
                "",
                "v1",
                "Secret",
                json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}})
            ),
            vec![]
        );

        let old = json!({"metadata": {"name": "s"}, "immutable": true, "data": {"a": "eA=="}});
        let mut new = old.clone();
        new["data"]["a"] = json!("eQ==");
        new["type"] = json!("kubernetes.io/basic-auth");
        let causes = check_update("", "v1", "Secret", old, new);
        assert_eq!(
            find(&causes, "data").message,
            "Forbidden: field is immutable when `immutable` is set"
        );
        assert!(find(&causes, "type")
            .message
            .ends_with("field is immutable"));
    }
}
