//! The metrics clients, as upstream's HPA reads metrics: resource metrics from
//! `metrics.k8s.io/v1beta1` (PodMetrics), per-pod and per-object custom metrics from
//! `custom.metrics.k8s.io` and external metrics from `external.metrics.k8s.io`, all through
//! the API server (the latter two only when some server has registered those APIs; otherwise
//! the error says that none is).
//!
//! Parsing the answers is pure ([`pod_metrics_from_list`], [`values_from_list`]) so it is
//! tested without a server.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::Value;
use setpoint_runtime::client::Client;

use super::replicas::{PodMetric, PodMetrics};

/// The resource metrics API's group and version.
pub const RESOURCE_METRICS: &str = "/apis/metrics.k8s.io/v1beta1";
/// The custom metrics API's group.
pub const CUSTOM_METRICS_GROUP: &str = "custom.metrics.k8s.io";
/// The external metrics API's group.
pub const EXTERNAL_METRICS_GROUP: &str = "external.metrics.k8s.io";

/// Why metrics could not be read; the texts are upstream's metrics clients'.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MetricsError(pub String);

/// Percent-encodes a query parameter's value.
fn query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A Go duration as metrics-server writes a window (`30s`, `1m0.5s`, `15.002s`).
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s;
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_secs_f64(total))
}

fn milli(v: &Value) -> Option<i64> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    setpoint_api::quantity::Quantity::parse(&s)
        .ok()?
        .milli_value()
}

fn timestamp(v: Option<&Value>) -> DateTime<Utc> {
    v.and_then(Value::as_str)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.to_utc())
        .unwrap_or_default()
}

/// Each pod's usage of `resource` from a `PodMetricsList`: the sum over its containers (only
/// `container` when given). A pod missing the resource in any container it counts, or
/// lacking `container`, has no sample (the calculator treats it as missing).
pub fn pod_metrics_from_list(list: &Value, resource: &str, container: Option<&str>) -> PodMetrics {
    let mut out = BTreeMap::new();
    for item in list
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = item.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        let mut sum = 0i64;
        let mut found = false;
        let mut complete = true;
        for c in item
            .get("containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if container.is_some_and(|want| c.get("name").and_then(Value::as_str) != Some(want)) {
                continue;
            }
            found = true;
            match c.pointer(&format!("/usage/{resource}")).and_then(milli) {
                Some(m) => sum += m,
                None => complete = false,
            }
        }
        if !complete || (container.is_some() && !found) {
            continue;
        }
        out.insert(
            name.to_string(),
            PodMetric {
                milli: sum,
                timestamp: timestamp(item.get("timestamp")),
                window: item
                    .get("window")
                    .and_then(Value::as_str)
                    .and_then(parse_go_duration)
                    .unwrap_or(Duration::from_secs(30)),
            },
        );
    }
    out
}

/// The values of a custom `MetricValueList` (by described object's name) or an external
/// `ExternalMetricValueList` (by position), in thousandths.
pub fn values_from_list(list: &Value) -> Vec<(String, PodMetric)> {
    list.get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let name = item
                .pointer("/describedObject/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let window = item
                .get("windowSeconds")
                .and_then(Value::as_u64)
                .map(Duration::from_secs)
                .unwrap_or_default();
            Some((
                name,
                PodMetric {
                    milli: milli(item.get("value")?)?,
                    timestamp: timestamp(item.get("timestamp")),
                    window,
                },
            ))
        })
        .collect()
}

/// Reads metrics through the API server.
#[derive(Clone)]
pub struct MetricsClient {
    client: Client,
}

impl MetricsClient {
    /// A metrics client over `client`.
    pub fn new(client: Client) -> Self {
        MetricsClient { client }
    }

    async fn get(&self, path: &str) -> Result<Value, setpoint_runtime::ClientError> {
        self.client
            .request(http::Method::GET, path, None, Bytes::new())
            .await
    }

    /// Per-pod usage of `resource` for the pods `selector` picks (upstream's
    /// `GetResourceMetric`).
    pub async fn resource_metric(
        &self,
        namespace: &str,
        selector: &str,
        resource: &str,
        container: Option<&str>,
    ) -> Result<PodMetrics, MetricsError> {
        let path = format!(
            "{RESOURCE_METRICS}/namespaces/{namespace}/pods?labelSelector={}",
            query(selector)
        );
        let list = self.get(&path).await.map_err(|e| {
            MetricsError(format!(
                "unable to fetch metrics from resource metrics API: {e}"
            ))
        })?;
        if list
            .get("items")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty())
        {
            return Err(MetricsError(
                "no metrics returned from resource metrics API".into(),
            ));
        }
        Ok(pod_metrics_from_list(&list, resource, container))
    }

    /// The preferred version of a metrics API group, or the error that none is registered.
    async fn registered(&self, group: &str, what: &str) -> Result<String, MetricsError> {
        let missing = || MetricsError(format!("no {what} metrics API ({group}) registered"));
        let doc = self.get(&format!("/apis/{group}")).await.map_err(|e| {
            if e.is_not_found() {
                missing()
            } else {
                MetricsError(format!("unable to discover the {what} metrics API: {e}"))
            }
        })?;
        doc.pointer("/preferredVersion/version")
            .or_else(|| doc.pointer("/versions/0/version"))
            .and_then(Value::as_str)
            .map(String::from)
            .ok_or_else(missing)
    }

    /// A custom metric of the pods `selector` picks, per pod (upstream's `GetRawMetric`).
    pub async fn pods_metric(
        &self,
        namespace: &str,
        metric: &str,
        selector: &str,
        metric_selector: &str,
    ) -> Result<PodMetrics, MetricsError> {
        let version = self.registered(CUSTOM_METRICS_GROUP, "custom").await?;
        let mut path = format!(
            "/apis/{CUSTOM_METRICS_GROUP}/{version}/namespaces/{namespace}/pods/*/{}?labelSelector={}",
            query(metric),
            query(selector)
        );
        if !metric_selector.is_empty() {
            path.push_str(&format!("&metricLabelSelector={}", query(metric_selector)));
        }
        let list = self.get(&path).await.map_err(|e| {
            MetricsError(format!(
                "unable to fetch metrics from custom metrics API: {e}"
            ))
        })?;
        let values = values_from_list(&list);
        if values.is_empty() {
            return Err(MetricsError(
                "no metrics returned from custom metrics API".into(),
            ));
        }
        Ok(values.into_iter().collect())
    }

    /// A custom metric describing one object (upstream's `GetObjectMetric`); `plural` is the
    /// described object's resource.
    pub async fn object_metric(
        &self,
        namespace: &str,
        plural: &str,
        name: &str,
        metric: &str,
        metric_selector: &str,
    ) -> Result<i64, MetricsError> {
        let version = self.registered(CUSTOM_METRICS_GROUP, "custom").await?;
        let mut path = format!(
            "/apis/{CUSTOM_METRICS_GROUP}/{version}/namespaces/{namespace}/{plural}/{name}/{}",
            query(metric)
        );
        if !metric_selector.is_empty() {
            path.push_str(&format!("?metricLabelSelector={}", query(metric_selector)));
        }
        let answer = self.get(&path).await.map_err(|e| {
            MetricsError(format!(
                "unable to fetch metrics from custom metrics API: {e}"
            ))
        })?;
        // A list with one item, or the item itself.
        let values = if answer.get("items").is_some() {
            values_from_list(&answer)
        } else {
            values_from_list(&serde_json::json!({ "items": [answer] }))
        };
        values
            .first()
            .map(|(_, m)| m.milli)
            .ok_or_else(|| MetricsError("no metrics returned from custom metrics API".into()))
    }

    /// An external metric's values (upstream's `GetExternalMetric`), each in thousandths.
    pub async fn external_metric(
        &self,
        namespace: &str,
        metric: &str,
        metric_selector: &str,
    ) -> Result<Vec<i64>, MetricsError> {
        let version = self.registered(EXTERNAL_METRICS_GROUP, "external").await?;
        let mut path = format!(
            "/apis/{EXTERNAL_METRICS_GROUP}/{version}/namespaces/{namespace}/{}",
            query(metric)
        );
        if !metric_selector.is_empty() {
            path.push_str(&format!("?labelSelector={}", query(metric_selector)));
        }
        let list = self.get(&path).await.map_err(|e| {
            MetricsError(format!(
                "unable to fetch metrics from external metrics API: {e}"
            ))
        })?;
        let values: Vec<i64> = values_from_list(&list)
            .into_iter()
            .map(|(_, m)| m.milli)
            .collect();
        if values.is_empty() {
            return Err(MetricsError(
                "no metrics returned from external metrics API".into(),
            ));
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(
            parse_go_duration("1m0.5s"),
            Some(Duration::from_millis(60_500))
        );
        assert_eq!(parse_go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("5x"), None);
    }

    #[test]
    fn pod_metrics_sum_containers_and_drop_incomplete_pods() {
        let list = json!({"items": [
            {"metadata": {"name": "a"}, "timestamp": "2026-01-01T00:00:00Z", "window": "15s",
             "containers": [{"name": "web", "usage": {"cpu": "140m", "memory": "10Mi"}},
                            {"name": "side", "usage": {"cpu": "10m", "memory": "1Mi"}}]},
            {"metadata": {"name": "b"}, "timestamp": "2026-01-01T00:00:00Z", "window": "15s",
             "containers": [{"name": "web", "usage": {"cpu": "200000000n"}},
                            {"name": "side", "usage": {"memory": "1Mi"}}]},
        ]});
        let all = pod_metrics_from_list(&list, "cpu", None);
        assert_eq!(all.len(), 1);
        assert_eq!(all["a"].milli, 150);
        assert_eq!(all["a"].window, Duration::from_secs(15));
        let web = pod_metrics_from_list(&list, "cpu", Some("web"));
        assert_eq!(web["a"].milli, 140);
        assert_eq!(web["b"].milli, 200);
        assert!(pod_metrics_from_list(&list, "cpu", Some("db")).is_empty());
    }

    #[test]
    fn custom_and_external_values() {
        let list = json!({"items": [
            {"describedObject": {"kind": "Pod", "name": "a"}, "metricName": "qps", "value": "1500m", "windowSeconds": 60},
            {"describedObject": {"kind": "Pod", "name": "b"}, "metricName": "qps", "value": "2"},
        ]});
        let v = values_from_list(&list);
        assert_eq!(v[0].0, "a");
        assert_eq!(v[0].1.milli, 1500);
        assert_eq!(v[1].1.milli, 2000);
        assert_eq!(
            query("app=web,tier in (a,b)"),
            "app%3Dweb%2Ctier%20in%20%28a%2Cb%29"
        );
    }
}
