//! What a downwardAPI volume's files hold: the pod's metadata (`fieldRef`) and its
//! containers' resources (`resourceFieldRef`), formatted as the kubelet formats them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectFieldSelector, Pod, ResourceFieldSelector};
use setpoint_api::quantity::Quantity;
use setpoint_api::strconv::quote as go_quote;

use crate::agent::Capacity;

/// A map as the kubelet writes `metadata.labels` and `metadata.annotations`: one
/// `key="value"` line per entry, sorted by key, each value quoted as Go's `%q` quotes it,
/// with no newline after the last.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of a downwardAPI volume's `fieldRef` (what the kubelet's
/// `ExtractFieldPathAsString` gives a volume): the pod's name, namespace, uid, labels and
/// annotations, whole or by key. `Err` is upstream's message.
pub fn field_value(pod: &Pod, selector: &ObjectFieldSelector) -> Result<String, String> {
    let meta = &pod.metadata;
    let path = selector.field_path.as_str();
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
    };
    if let Some(key) = subscript("metadata.annotations") {
        return Ok(lookup(meta.annotations.as_ref(), key));
    }
    if let Some(key) = subscript("metadata.labels") {
        return Ok(lookup(meta.labels.as_ref(), key));
    }
    let empty = BTreeMap::new();
    Ok(match path {
        "metadata.annotations" => format_map(meta.annotations.as_ref().unwrap_or(&empty)),
        "metadata.labels" => format_map(meta.labels.as_ref().unwrap_or(&empty)),
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        other => return Err(format!("unsupported fieldPath: {other}")),
    })
}

fn lookup(map: Option<&BTreeMap<String, String>>, key: &str) -> String {
    map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
}

/// The value of a `resourceFieldRef`: a container's request or limit divided by the
/// divisor (default `1`) and rounded up, CPU in millicores over the divisor's millicores,
/// everything else in units. A limit the container does not set is the node's allocatable
/// amount, as the kubelet merges it. `Err` is upstream's message.
pub fn resource_value(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    allocatable: &Capacity,
) -> Result<String, String> {
    let name = selector.container_name.as_deref().unwrap_or_default();
    let container = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .ok_or_else(|| format!("container {name} not found"))?;
    let resources = container.resources.clone().unwrap_or_default();
    let (kind, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| format!("unsupported container resource : {}", selector.resource))?;
    let map = match kind {
        "limits" => resources.limits,
        "requests" => resources.requests,
        _ => None,
    }
    .unwrap_or_default();
    let supported = matches!(resource, "cpu" | "memory" | "ephemeral-storage")
        || resource.starts_with("hugepages-");
    if !supported || !matches!(kind, "limits" | "requests") {
        return Err(format!(
            "unsupported container resource : {}",
            selector.resource
        ));
    }
    let parse = |s: &str| Quantity::parse(s).map_err(|e| e.to_string());
    let set = map
        .get(resource)
        .map(|q| parse(&q.0))
        .transpose()?
        .filter(|q| q.is_positive());
    let amount = match set {
        Some(q) => q,
        None if kind == "limits" && resource == "cpu" => parse(&allocatable.cpu)?,
        None if kind == "limits" && resource == "memory" => parse(&allocatable.memory)?,
        None => parse("0")?,
    };
    let divisor = match &selector.divisor {
        Some(d) if parse(&d.0)?.is_positive() => parse(&d.0)?,
        _ => parse("1")?,
    };
    let out_of_range = || format!("{} is out of range", selector.resource);
    let (value, per) = if resource == "cpu" {
        (amount.milli_value(), divisor.milli_value())
    } else {
        (amount.value(), divisor.value())
    };
    let (value, per) = (
        value.ok_or_else(out_of_range)?,
        per.ok_or_else(out_of_range)?,
    );
    if per <= 0 {
        return Err(out_of_range());
    }
    // Rounded up, as upstream's math.Ceil of the quotient.
    Ok(value
        .div_euclid(per)
        .saturating_add(i64::from(value.rem_euclid(per) != 0))
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                labels: Some(BTreeMap::from([
                    ("tier".to_string(), "front".to_string()),
                    ("app".to_string(), "web \"blue\"\n".to_string()),
                ])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        limits: Some(BTreeMap::from([("memory".to_string(), Q("64Mi".into()))])),
                        requests: Some(BTreeMap::from([("cpu".to_string(), Q("250m".into()))])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn field(path: &str) -> ObjectFieldSelector {
        ObjectFieldSelector {
            field_path: path.into(),
            ..Default::default()
        }
    }

    #[test]
    fn labels_are_sorted_go_quoted_lines() {
        assert_eq!(
            field_value(&pod(), &field("metadata.labels")).unwrap(),
            "app=\"web \\\"blue\\\"\\n\"\ntier=\"front\""
        );
        assert_eq!(
            field_value(&pod(), &field("metadata.annotations")).unwrap(),
            ""
        );
        assert_eq!(
            field_value(&pod(), &field("metadata.labels['tier']")).unwrap(),
            "front"
        );
        assert_eq!(
            field_value(&pod(), &field("metadata.labels['none']")).unwrap(),
            ""
        );
        assert_eq!(field_value(&pod(), &field("metadata.uid")).unwrap(), "u-1");
        assert_eq!(
            field_value(&pod(), &field("spec.nodeName")).unwrap_err(),
            "unsupported fieldPath: spec.nodeName"
        );
        assert_eq!(go_quote("é\u{1}\u{200b}"), "\"é\\x01\\u200b\"");
    }

    fn resource(name: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            container_name: Some("c".into()),
            resource: name.into(),
            divisor: divisor.map(|d| Q(d.into())),
        }
    }

    #[test]
    fn resources_are_divided_and_rounded_up() {
        let node = Capacity {
            cpu: "4".into(),
            memory: "8Gi".into(),
            pods: 110,
        };
        let v = |name: &str, divisor: Option<&str>| {
            resource_value(&pod(), &resource(name, divisor), &node)
        };
        assert_eq!(v("requests.cpu", None).unwrap(), "1");
        assert_eq!(v("requests.cpu", Some("1m")).unwrap(), "250");
        assert_eq!(v("limits.memory", Some("1Mi")).unwrap(), "64");
        assert_eq!(v("limits.memory", None).unwrap(), "67108864");
        // No limit: the node's allocatable.
        assert_eq!(v("limits.cpu", None).unwrap(), "4");
        assert_eq!(v("requests.memory", None).unwrap(), "0");
        assert_eq!(
            v("limits.gpu", None).unwrap_err(),
            "unsupported container resource : limits.gpu"
        );
        let mut other = resource("limits.cpu", None);
        other.container_name = Some("x".into());
        assert_eq!(
            resource_value(&pod(), &other, &node).unwrap_err(),
            "container x not found"
        );
    }
}
