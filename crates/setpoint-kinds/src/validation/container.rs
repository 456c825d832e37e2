//! Containers: names, images, ports, environment, resources (requests within limits), probes
//! and lifecycle handlers, volume mounts.

use serde_json::{json, Value};
use setpoint_api::names;
use setpoint_api::Cause;
use std::collections::HashSet;

use super::fields::{
    arr, at, child, dns_label, entries, enum_field, index, int, key, non_negative, not_supported,
    present, s,
};
use super::pod::ContainerKind;
use super::quantity::{parse_quantity, quantity_text, QUANTITY_FORMAT_ERROR};

fn resources(e: &mut Vec<Cause>, res: &Value, path: &str) {
    for part in ["limits", "requests"] {
        for (name, q) in entries(at(res, part)) {
            let p = key(&child(path, part), name);
            match parse_quantity(q) {
                None => e.push(Cause::invalid(p, q, QUANTITY_FORMAT_ERROR)),
                Some(x) if x.is_negative() => e.push(Cause::invalid(
                    p,
                    &json!(quantity_text(q)),
                    "must be greater than or equal to 0",
                )),
                _ => {}
            }
        }
    }
    for (name, req) in entries(at(res, "requests")) {
        let Some(limit) = at(res, "limits").get(name.as_str()) else {
            continue;
        };
        if let (Some(r), Some(l)) = (parse_quantity(req), parse_quantity(limit)) {
            if r > l {
                e.push(Cause::invalid(
                    child(path, "requests"),
                    &json!(quantity_text(req)),
                    &format!(
                        "must be less than or equal to {name} limit of {}",
                        quantity_text(limit)
                    ),
                ));
            }
        }
    }
}

pub(super) fn container(
    e: &mut Vec<Cause>,
    c: &Value,
    path: &str,
    volumes: &HashSet<String>,
    names_seen: &mut HashSet<String>,
    kind: ContainerKind,
) {
    let name = s(c, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else {
        dns_label(e, name, &child(path, "name"));
        if !names_seen.insert(name.to_string()) {
            e.push(Cause::duplicate(child(path, "name"), &json!(name)));
        }
    }
    let image = s(c, "image");
    if image.is_empty() {
        e.push(Cause::required(child(path, "image"), ""));
    } else if image.trim() != image {
        e.push(Cause::invalid(
            child(path, "image"),
            &json!(image),
            "must not have leading or trailing whitespace",
        ));
    }
    enum_field(
        e,
        s(c, "imagePullPolicy"),
        &child(path, "imagePullPolicy"),
        &["Always", "IfNotPresent", "Never"],
    );
    if let Some(policy) = at(c, "terminationMessagePolicy").as_str() {
        if !["File", "FallbackToLogsOnError"].contains(&policy) {
            not_supported(
                e,
                child(path, "terminationMessagePolicy"),
                policy,
                &["File", "FallbackToLogsOnError"],
            );
        }
    }
    if present(c, "restartPolicy") {
        let rp = s(c, "restartPolicy");
        match kind {
            ContainerKind::Regular => e.push(Cause::forbidden(
                child(path, "restartPolicy"),
                "may not be set for non-init containers",
            )),
            ContainerKind::Init if rp != "Always" => {
                not_supported(e, child(path, "restartPolicy"), rp, &["Always"])
            }
            ContainerKind::Init => {}
        }
    }
    container_ports(e, arr(c, "ports"), &child(path, "ports"));
    for (i, env) in arr(c, "env").iter().enumerate() {
        env_var(e, env, &index(&child(path, "env"), i));
    }
    let mut mount_paths = HashSet::new();
    for (i, m) in arr(c, "volumeMounts").iter().enumerate() {
        let p = index(&child(path, "volumeMounts"), i);
        let mname = s(m, "name");
        if mname.is_empty() {
            e.push(Cause::required(child(&p, "name"), ""));
        } else if !volumes.contains(mname) {
            e.push(Cause::new(
                "FieldValueNotFound",
                child(&p, "name"),
                format!("Not found: {mname:?}"),
            ));
        }
        let mpath = s(m, "mountPath");
        if mpath.is_empty() {
            e.push(Cause::required(child(&p, "mountPath"), ""));
        } else if !mount_paths.insert(mpath.to_string()) {
            e.push(Cause::invalid(
                child(&p, "mountPath"),
                &json!(mpath),
                "must be unique",
            ));
        }
    }
    resources(e, at(c, "resources"), &child(path, "resources"));
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        let p = at(c, probe);
        if p.is_null() {
            continue;
        }
        if kind == ContainerKind::Init && at(c, "restartPolicy").as_str() != Some("Always") {
            e.push(Cause::forbidden(
                child(path, probe),
                "may not be set for init containers without restartPolicy=Always",
            ));
            continue;
        }
        let pp = child(path, probe);
        handler(e, p, &pp, &["exec", "httpGet", "tcpSocket", "grpc"]);
        for field in [
            "initialDelaySeconds",
            "timeoutSeconds",
            "periodSeconds",
            "successThreshold",
            "failureThreshold",
        ] {
            non_negative(e, p, field, &child(&pp, field));
        }
        if probe != "readinessProbe" {
            if let Some(n) = int(p, "successThreshold") {
                if n != 1 {
                    e.push(Cause::invalid(
                        child(&pp, "successThreshold"),
                        &json!(n),
                        "must be 1",
                    ));
                }
            }
        }
    }
    for hook in ["postStart", "preStop"] {
        let h = at(at(c, "lifecycle"), hook);
        if !h.is_null() {
            handler(
                e,
                h,
                &child(path, &format!("lifecycle.{hook}")),
                &["exec", "httpGet", "tcpSocket", "sleep"],
            );
        }
    }
}

/// A probe or lifecycle handler has exactly one action; its port, if any, must be valid.
fn handler(e: &mut Vec<Cause>, h: &Value, path: &str, kinds: &[&str]) {
    let set: Vec<&&str> = kinds.iter().filter(|k| present(h, k)).collect();
    match set.as_slice() {
        [] => e.push(Cause::required(path, "must specify a handler type")),
        [_] => {}
        [_, second, ..] => e.push(Cause::forbidden(
            child(path, second),
            "may not specify more than 1 handler type",
        )),
    }
    for action in ["httpGet", "tcpSocket", "grpc"] {
        let port = at(at(h, action), "port");
        let p = child(path, &format!("{action}.port"));
        match port {
            Value::Null => {}
            Value::String(name) if action != "grpc" => {
                for msg in names::is_valid_port_name(name).err().unwrap_or_default() {
                    e.push(Cause::invalid(&p, port, &msg));
                }
            }
            other => {
                if let Some(n) = other.as_i64() {
                    for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                        e.push(Cause::invalid(&p, port, &msg));
                    }
                }
            }
        }
    }
}

fn container_ports(e: &mut Vec<Cause>, ports: &[Value], path: &str) {
    let mut names_seen = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = index(path, i);
        let name = s(port, "name");
        if !name.is_empty() {
            for msg in names::is_valid_port_name(name).err().unwrap_or_default() {
                e.push(Cause::invalid(child(&p, "name"), &json!(name), &msg));
            }
            if !names_seen.insert(name.to_string()) {
                e.push(Cause::duplicate(child(&p, "name"), &json!(name)));
            }
        }
        match int(port, "containerPort") {
            None | Some(0) => e.push(Cause::required(child(&p, "containerPort"), "")),
            Some(n) => {
                for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                    e.push(Cause::invalid(child(&p, "containerPort"), &json!(n), &msg));
                }
            }
        }
        if let Some(n) = int(port, "hostPort").filter(|n| *n != 0) {
            for msg in names::is_valid_port_num(n).err().unwrap_or_default() {
                e.push(Cause::invalid(child(&p, "hostPort"), &json!(n), &msg));
            }
        }
        enum_field(
            e,
            s(port, "protocol"),
            &child(&p, "protocol"),
            &["SCTP", "TCP", "UDP"],
        );
    }
}

fn env_var(e: &mut Vec<Cause>, env: &Value, path: &str) {
    let name = s(env, "name");
    if name.is_empty() {
        e.push(Cause::required(child(path, "name"), ""));
    } else if !name
        .bytes()
        .all(|c| (b' '..=b'~').contains(&c) && c != b'=')
    {
        e.push(Cause::invalid(
            child(path, "name"),
            &json!(name),
            "a valid environment variable name must consist only of printable ASCII characters other than '='",
        ));
    }
    let from = at(env, "valueFrom");
    if from.is_null() {
        return;
    }
    let sources = [
        "fieldRef",
        "resourceFieldRef",
        "configMapKeyRef",
        "secretKeyRef",
    ];
    let count = sources.iter().filter(|k| present(from, k)).count();
    let p = child(path, "valueFrom");
    if !s(env, "value").is_empty() {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "may not be specified when `value` is not empty",
        ));
    }
    if count == 0 {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        ));
    } else if count > 1 {
        e.push(Cause::invalid(
            &p,
            &json!(""),
            "may not have more than one field specified at a time",
        ));
    }
    let field_ref = at(from, "fieldRef");
    if !field_ref.is_null() && s(field_ref, "fieldPath").is_empty() {
        e.push(Cause::required(child(&p, "fieldRef.fieldPath"), ""));
    }
    for source in ["configMapKeyRef", "secretKeyRef"] {
        let r = at(from, source);
        if !r.is_null() && s(r, "key").is_empty() {
            e.push(Cause::required(child(&p, &format!("{source}.key")), ""));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validation::testutil::{check, deployment, find, pod};

    #[test]
    fn container_rules() {
        let mut d = deployment();
        let c = json!([
            {"name": "a", "image": "x", "ports": [{"containerPort": 70000, "protocol": "HTTP"}, {"containerPort": 1, "name": "Bad--"}]},
            {"name": "a", "image": "", "imagePullPolicy": "Sometimes"},
            {"name": "B", "image": " y", "volumeMounts": [{"name": "nope", "mountPath": "/m"}], "env": [{"name": "A=B"}]}
        ]);
        d["spec"]["template"]["spec"]["containers"] = c;
        d["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let causes = check("apps", "v1", "Deployment", d);
        let p = "spec.template.spec.containers";
        assert_eq!(
            find(&causes, &format!("{p}[0].ports[0].containerPort")).message,
            "Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(
            find(&causes, &format!("{p}[0].ports[0].protocol")).message,
            "Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\""
        );
        find(&causes, &format!("{p}[0].ports[1].name"));
        assert_eq!(
            find(&causes, &format!("{p}[1].name")).message,
            "Duplicate value: \"a\""
        );
        assert_eq!(
            find(&causes, &format!("{p}[1].image")).message,
            "Required value"
        );
        find(&causes, &format!("{p}[1].imagePullPolicy"));
        find(&causes, &format!("{p}[2].name"));
        assert!(find(&causes, &format!("{p}[2].image"))
            .message
            .ends_with("must not have leading or trailing whitespace"));
        assert_eq!(
            find(&causes, &format!("{p}[2].volumeMounts[0].name")).message,
            "Not found: \"nope\""
        );
        find(&causes, &format!("{p}[2].env[0].name"));
        assert_eq!(
            find(&causes, "spec.template.spec.restartPolicy").message,
            "Unsupported value: \"Never\": supported values: \"Always\""
        );
    }

    #[test]
    fn resource_requests_within_limits() {
        let mut p = pod();
        p["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "lots"}});
        let causes = check("", "v1", "Pod", p);
        assert_eq!(
            find(&causes, "spec.containers[0].resources.requests").message,
            "Invalid value: \"1\": must be less than or equal to cpu limit of 500m"
        );
        assert!(
            find(&causes, "spec.containers[0].resources.requests[memory]")
                .message
                .contains("quantities must match")
        );
        let q = |s: &str| setpoint_api::quantity::Quantity::parse(s).ok();
        assert_eq!(parse_quantity(&json!("1.5Gi")), q("1536Mi"));
        assert_eq!(parse_quantity(&json!("100m")), q("0.1"));
        assert_eq!(parse_quantity(&json!("2e3")), q("2k"));
        assert_eq!(parse_quantity(&json!(".5")), q("500m"));
        assert_eq!(parse_quantity(&json!(3)), q("3"));
        assert_eq!(parse_quantity(&json!(0.25)), q("250m"));
        for bad in ["", "m", "1.2.3", "1Gb", "1e", "abc", " 1"] {
            assert_eq!(parse_quantity(&json!(bad)), None, "{bad}");
        }
    }
}
