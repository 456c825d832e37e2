//! HorizontalPodAutoscalers: scale target and replica bounds.

use serde_json::{json, Value};
use setpoint_api::names;
use setpoint_api::Cause;

use super::fields::{at, int, s};

pub(super) fn hpa(e: &mut Vec<Cause>, obj: &Value) {
    let spec = at(obj, "spec");
    let target = at(spec, "scaleTargetRef");
    if s(target, "kind").is_empty() {
        e.push(Cause::required("spec.scaleTargetRef.kind", ""));
    }
    let name = s(target, "name");
    if name.is_empty() {
        e.push(Cause::required("spec.scaleTargetRef.name", ""));
    } else {
        for msg in names::path_segment_name(name).err().unwrap_or_default() {
            e.push(Cause::invalid(
                "spec.scaleTargetRef.name",
                &json!(name),
                &msg,
            ));
        }
    }
    let min = int(spec, "minReplicas");
    if let Some(m) = min.filter(|m| *m < 1) {
        e.push(Cause::invalid(
            "spec.minReplicas",
            &json!(m),
            "must be greater than or equal to 1",
        ));
    }
    match int(spec, "maxReplicas") {
        Some(max) if max < 1 => e.push(Cause::invalid(
            "spec.maxReplicas",
            &json!(max),
            "must be greater than 0",
        )),
        Some(max) if min.is_some_and(|m| max < m) => e.push(Cause::invalid(
            "spec.maxReplicas",
            &json!(max),
            "must be greater than or equal to `minReplicas`",
        )),
        _ => {}
    }
}
