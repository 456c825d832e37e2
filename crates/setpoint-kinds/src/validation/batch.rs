//! Jobs and CronJobs: the job spec, job template, schedule and time zone.

use serde_json::{json, Value};
use setpoint_api::selector::LabelSelector;
use setpoint_api::Cause;

use super::apps::immutable_selector;
use super::fields::{
    at, child, enum_field, label_selector, non_negative, not_supported, optional_enum, present, s,
    same, strip_nulls,
};
use super::meta::{annotations, labels};
use super::pod::pod_template;

/// `validateJobSpec` on a Job or a CronJob's job template (`path` is `spec` or
/// `spec.jobTemplate.spec`).
fn job_spec(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    for field in [
        "parallelism",
        "completions",
        "activeDeadlineSeconds",
        "backoffLimit",
        "ttlSecondsAfterFinished",
    ] {
        non_negative(e, spec, field, &child(path, field));
    }
    if let Some(mode) = at(spec, "completionMode").as_str() {
        if mode != "NonIndexed" && mode != "Indexed" {
            not_supported(
                e,
                child(path, "completionMode"),
                mode,
                &["NonIndexed", "Indexed"],
            );
        }
        if mode == "Indexed" && !present(spec, "completions") {
            e.push(Cause::required(
                child(path, "completions"),
                "when completion mode is Indexed",
            ));
        }
    }
    optional_enum(
        e,
        spec,
        "podReplacementPolicy",
        &child(path, "podReplacementPolicy"),
        &["TerminatingOrFailed", "Failed"],
    );
    let template = at(spec, "template");
    let tpath = child(path, "template");
    pod_template(e, template, &tpath);
    let rp = s(at(template, "spec"), "restartPolicy");
    if rp != "OnFailure" && rp != "Never" {
        not_supported(
            e,
            child(&tpath, "spec.restartPolicy"),
            rp,
            &["OnFailure", "Never"],
        );
    } else if present(spec, "podFailurePolicy") && rp != "Never" {
        e.push(Cause::invalid(
            child(&tpath, "spec.restartPolicy"),
            &json!(rp),
            "only \"Never\" is supported when podFailurePolicy is specified",
        ));
    }
    index_policies(e, spec, path);
    if present(spec, "podFailurePolicy") {
        pod_failure_policy(e, spec, &child(path, "podFailurePolicy"));
        if let Some(rpp) = at(spec, "podReplacementPolicy").as_str() {
            if rpp != "Failed" {
                e.push(Cause::not_supported(
                    child(path, "podReplacementPolicy"),
                    &json!(rpp),
                    &["Failed"],
                ));
            }
        }
    }
}

/// The fields only an Indexed Job may use: `backoffLimitPerIndex`, `maxFailedIndexes` and
/// `successPolicy`.
fn index_policies(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    let indexed = at(spec, "completionMode").as_str() == Some("Indexed");
    for field in ["backoffLimitPerIndex", "maxFailedIndexes"] {
        non_negative(e, spec, field, &child(path, field));
        if present(spec, field) && !indexed {
            e.push(Cause::invalid(
                child(path, field),
                at(spec, field),
                "requires indexed completion mode",
            ));
        }
    }
    if indexed && present(spec, "maxFailedIndexes") && !present(spec, "backoffLimitPerIndex") {
        e.push(Cause::required(
            child(path, "backoffLimitPerIndex"),
            "when maxFailedIndexes is specified",
        ));
    }
    if present(spec, "successPolicy") {
        let policy = at(spec, "successPolicy");
        if !indexed {
            e.push(Cause::invalid(
                child(path, "successPolicy"),
                policy,
                "requires indexed completion mode",
            ));
        }
        if at(policy, "rules").as_array().is_none_or(Vec::is_empty) {
            e.push(Cause::required(
                child(path, "successPolicy.rules"),
                "at least one rules must be specified when the successPolicy is specified",
            ));
        }
    }
}

/// `validatePodFailurePolicy`: each rule's action, and exactly one of `onExitCodes` (a known
/// operator, a container of the template, ordered non-empty values, no 0 with `In`) and
/// `onPodConditions` (`status` True, False or Unknown).
fn pod_failure_policy(e: &mut Vec<Cause>, spec: &Value, path: &str) {
    let pod = at(at(spec, "template"), "spec");
    let containers: Vec<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| at(pod, k).as_array().into_iter().flatten())
        .map(|c| s(c, "name"))
        .collect();
    let rules = at(at(spec, "podFailurePolicy"), "rules");
    for (i, rule) in rules.as_array().into_iter().flatten().enumerate() {
        let rpath = format!("{path}.rules[{i}]");
        let action = s(rule, "action");
        let apath = child(&rpath, "action");
        match action {
            "" => e.push(Cause::required(
                apath,
                "valid values: [\"Count\" \"FailIndex\" \"FailJob\" \"Ignore\"]",
            )),
            "FailIndex" if !present(spec, "backoffLimitPerIndex") => e.push(Cause::invalid(
                apath,
                &json!(action),
                "requires the backoffLimitPerIndex to be set",
            )),
            "Count" | "FailIndex" | "FailJob" | "Ignore" => {}
            other => e.push(Cause::not_supported(
                apath,
                &json!(other),
                &["Count", "FailIndex", "FailJob", "Ignore"],
            )),
        }
        let codes = at(rule, "onExitCodes");
        let conditions = at(rule, "onPodConditions")
            .as_array()
            .filter(|c| !c.is_empty());
        if !codes.is_null() {
            let cpath = child(&rpath, "onExitCodes");
            let op = s(codes, "operator");
            match op {
                "" => e.push(Cause::required(
                    child(&cpath, "operator"),
                    "valid values: [\"In\" \"NotIn\"]",
                )),
                "In" | "NotIn" => {}
                other => e.push(Cause::not_supported(
                    child(&cpath, "operator"),
                    &json!(other),
                    &["In", "NotIn"],
                )),
            }
            if let Some(name) = at(codes, "containerName").as_str() {
                if !containers.contains(&name) {
                    e.push(Cause::invalid(
                        child(&cpath, "containerName"),
                        &json!(name),
                        "must be one of the container or initContainer names in the pod template",
                    ));
                }
            }
            let values: Vec<i64> = at(codes, "values")
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_i64)
                .collect();
            let vpath = child(&cpath, "values");
            if values.is_empty() {
                e.push(Cause::invalid(
                    &vpath,
                    at(codes, "values"),
                    "at least one value is required",
                ));
            }
            for (j, v) in values.iter().enumerate() {
                if op == "In" && *v == 0 {
                    e.push(Cause::invalid(
                        format!("{vpath}[{j}]"),
                        &json!(v),
                        "must not be 0 for the In operator",
                    ));
                }
                if values[..j].contains(v) {
                    e.push(Cause::duplicate(format!("{vpath}[{j}]"), &json!(v)));
                }
            }
            if values.windows(2).any(|w| w[0] > w[1]) {
                e.push(Cause::invalid(
                    &vpath,
                    at(codes, "values"),
                    "must be ordered",
                ));
            }
        }
        for (j, pattern) in conditions.into_iter().flatten().enumerate() {
            let status = s(pattern, "status");
            let spath = format!("{rpath}.onPodConditions[{j}].status");
            if !matches!(status, "True" | "False" | "Unknown") {
                e.push(Cause::not_supported(
                    spath,
                    &json!(status),
                    &["False", "True", "Unknown"],
                ));
            }
        }
        match (codes.is_null(), conditions.is_none()) {
            (false, false) => e.push(Cause::new(
                "FieldValueInvalid",
                rpath,
                "Invalid value: specifying both OnExitCodes and OnPodConditions is not supported",
            )),
            (true, true) => e.push(Cause::new(
                "FieldValueInvalid",
                rpath,
                "Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            )),
            _ => {}
        }
    }
}

pub(super) fn job(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let spec = at(obj, "spec");
    let sel = at(spec, "selector");
    let manual = at(spec, "manualSelector").as_bool() == Some(true);
    if sel.is_null() {
        // Without `manualSelector` the server generates the selector (defaults::job_selector).
        if manual {
            e.push(Cause::required("spec.selector", ""));
        }
    } else {
        label_selector(e, sel, "spec.selector");
        if let Ok(selector) = LabelSelector::from_label_selector_json(sel) {
            if !selector.matches_object(at(spec, "template")) {
                e.push(Cause::invalid(
                    "spec.template.metadata.labels",
                    at(at(at(spec, "template"), "metadata"), "labels"),
                    "`selector` does not match template `labels`",
                ));
            }
        }
    }
    job_spec(e, spec, "spec");
    // The batch.kubernetes.io/ labels are required of new Jobs, and of old ones that had them.
    let prefixed = old.is_none_or(|o| {
        !at(
            at(at(at(at(o, "spec"), "template"), "metadata"), "labels"),
            "batch.kubernetes.io/controller-uid",
        )
        .is_null()
    });
    generated_selector(e, obj, prefixed);
    let Some(old) = old else { return };
    let old_spec = at(old, "spec");
    immutable_selector(e, obj, Some(old));
    for field in [
        "completions",
        "completionMode",
        "podFailurePolicy",
        "backoffLimitPerIndex",
    ] {
        if !same(at(spec, field), at(old_spec, field)) {
            e.push(Cause::immutable(child("spec", field), at(spec, field)));
        }
    }
    // A suspended Job that never started may have its scheduling directives changed; otherwise
    // the template is fixed.
    let (mut new_t, mut old_t) = (
        strip_nulls(at(spec, "template")),
        strip_nulls(at(old_spec, "template")),
    );
    let never_started = at(at(old, "status"), "startTime").is_null();
    if at(old_spec, "suspend").as_bool() == Some(true) && never_started {
        for t in [&mut new_t, &mut old_t] {
            if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("labels");
                m.remove("annotations");
            }
            if let Some(m) = t.get_mut("spec").and_then(Value::as_object_mut) {
                for f in ["nodeSelector", "tolerations", "affinity", "schedulingGates"] {
                    m.remove(f);
                }
            }
        }
    }
    if new_t != old_t {
        e.push(Cause::immutable("spec.template", at(spec, "template")));
    }
}

/// `validateGeneratedSelector`: unless `manualSelector` is true, the template carries the
/// labels the server generated (defaults::job_selector) with the Job's uid and name, and the
/// selector selects that uid.
fn generated_selector(e: &mut Vec<Cause>, obj: &Value, prefixed: bool) {
    let spec = at(obj, "spec");
    let labels = at(at(at(spec, "template"), "metadata"), "labels");
    if at(spec, "manualSelector").as_bool() == Some(true) || labels.is_null() {
        return;
    }
    let meta = at(obj, "metadata");
    let (uid, name) = (s(meta, "uid"), s(meta, "name"));
    let mut expected = vec![("controller-uid", uid), ("job-name", name)];
    if prefixed {
        expected.push(("batch.kubernetes.io/controller-uid", uid));
        expected.push(("batch.kubernetes.io/job-name", name));
    }
    for (key, want) in expected {
        let path = format!("spec.template.metadata.labels[{key}]");
        match at(labels, key).as_str() {
            None => e.push(Cause::required(path, want)),
            Some(v) if v != want => {
                e.push(Cause::invalid(path, labels, &format!("must be '{want}'")))
            }
            Some(_) => {}
        }
    }
    let uid_label = if prefixed {
        "batch.kubernetes.io/controller-uid"
    } else {
        "controller-uid"
    };
    let sel = at(spec, "selector");
    let selects_uid = LabelSelector::from_label_selector_json(sel)
        .is_ok_and(|s| s.matches(|k| (k == uid_label).then_some(uid)));
    if !selects_uid {
        e.push(Cause::invalid(
            "spec.selector",
            sel,
            "`selector` not auto-generated",
        ));
    }
}

pub(super) fn cron_job(e: &mut Vec<Cause>, obj: &Value, old: Option<&Value>) {
    let name = s(at(obj, "metadata"), "name");
    if name.len() > 52 {
        e.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            "must be no more than 52 characters",
        ));
    }
    let spec = at(obj, "spec");
    let schedule = s(spec, "schedule");
    let old_schedule = old.map(|o| s(at(o, "spec"), "schedule")).unwrap_or("");
    if schedule.is_empty() {
        e.push(Cause::required("spec.schedule", ""));
    } else {
        if let Err(msg) = setpoint_api::cron::Schedule::parse(schedule) {
            e.push(Cause::invalid("spec.schedule", &json!(schedule), &msg));
        }
        let allow_tz = old_schedule.contains("TZ");
        if allow_tz && schedule.contains("TZ") && present(spec, "timeZone") {
            e.push(Cause::invalid(
                "spec.schedule",
                &json!(schedule),
                "cannot use both timeZone field and TZ or CRON_TZ in schedule",
            ));
        } else if !allow_tz && schedule.contains("TZ") {
            e.push(Cause::invalid(
                "spec.schedule",
                &json!(schedule),
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ));
        }
    }
    if let Some(tz) = at(spec, "timeZone").as_str() {
        time_zone(e, tz);
    }
    non_negative(
        e,
        spec,
        "startingDeadlineSeconds",
        "spec.startingDeadlineSeconds",
    );
    non_negative(
        e,
        spec,
        "successfulJobsHistoryLimit",
        "spec.successfulJobsHistoryLimit",
    );
    non_negative(
        e,
        spec,
        "failedJobsHistoryLimit",
        "spec.failedJobsHistoryLimit",
    );
    enum_field(
        e,
        s(spec, "concurrencyPolicy"),
        "spec.concurrencyPolicy",
        &["Allow", "Forbid", "Replace"],
    );
    let template = at(spec, "jobTemplate");
    let tspec = at(template, "spec");
    labels(
        e,
        at(at(template, "metadata"), "labels"),
        "spec.jobTemplate.labels",
    );
    annotations(
        e,
        at(at(template, "metadata"), "annotations"),
        "spec.jobTemplate.annotations",
    );
    job_spec(e, tspec, "spec.jobTemplate.spec");
    if present(tspec, "selector") {
        e.push(Cause::invalid(
            "spec.jobTemplate.spec.selector",
            at(tspec, "selector"),
            "`selector` will be auto-generated",
        ));
    }
    if at(tspec, "manualSelector").as_bool() == Some(true) {
        e.push(Cause::not_supported(
            "spec.jobTemplate.spec.manualSelector",
            &json!(true),
            &["nil", "false"],
        ));
    }
}

fn time_zone(e: &mut Vec<Cause>, tz: &str) {
    let path = "spec.timeZone";
    if tz.is_empty() {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            "timeZone must be nil or non-empty string",
        ));
        return;
    }
    if !setpoint_api::cron::plausible_zone(tz) {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            &format!("unknown time zone {tz}"),
        ));
    } else if tz.eq_ignore_ascii_case("local") {
        e.push(Cause::invalid(
            path,
            &json!(tz),
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
        ));
    } else if let Err(msg) = setpoint_api::cron::time_zone(tz) {
        // Well formed, but not in the IANA database.
        e.push(Cause::invalid(path, &json!(tz), &msg));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;
    use crate::validation::testutil::{check, find};
    use crate::validation::validate;

    fn job_json() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "pi", "namespace": "default", "uid": "u-1"},
            "spec": {"template": {"spec": {"containers": [{"name": "pi", "image": "perl:5"}], "restartPolicy": "Never"}}}
        })
    }

    fn created_job(mut j: Value) -> Value {
        defaults::apply("batch", "Job", &mut j);
        defaults::job_selector(&mut j, "u-1");
        j
    }

    #[test]
    fn jobs() {
        let j = created_job(job_json());
        assert_eq!(validate("batch", "v1", "Job", &j, None), vec![]);
        let mut no_policy = job_json();
        no_policy["spec"]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("restartPolicy");
        let causes = validate("batch", "v1", "Job", &created_job(no_policy), None);
        assert_eq!(
            find(&causes, "spec.template.spec.restartPolicy").message,
            "Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""
        );
        // Without manualSelector, a selector of one's own is refused, and so are labels
        // that contradict the generated ones.
        let mut own = job_json();
        own["spec"]["selector"] = json!({"matchLabels": {"app": "x"}});
        own["spec"]["template"]["metadata"] = json!({"labels": {"app": "x", "job-name": "other"}});
        let causes = validate("batch", "v1", "Job", &created_job(own.clone()), None);
        assert_eq!(
            find(&causes, "spec.selector").message,
            "Invalid value: {\"matchLabels\":{\"app\":\"x\",\"batch.kubernetes.io/controller-uid\":\"u-1\"}}: `selector` not auto-generated"
        );
        assert!(find(&causes, "spec.template.metadata.labels[job-name]")
            .message
            .ends_with("must be 'pi'"));
        own["spec"]["manualSelector"] = json!(true);
        assert_eq!(
            validate("batch", "v1", "Job", &created_job(own.clone()), None),
            vec![]
        );
        // The index-only fields and the pod failure policy's rules.
        own["spec"]["backoffLimitPerIndex"] = json!(1);
        own["spec"]["successPolicy"] = json!({"rules": []});
        own["spec"]["podFailurePolicy"] = json!({"rules": [
            {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [0, 3, 2], "containerName": "nope"}},
            {"action": "Retry", "onPodConditions": [{"type": "DisruptionTarget", "status": "Maybe"}]},
            {"action": "Ignore"},
        ]});
        own["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
        let causes = validate("batch", "v1", "Job", &created_job(own.clone()), None);
        for (path, msg) in [
            ("spec.backoffLimitPerIndex", "requires indexed completion mode"),
            ("spec.successPolicy", "requires indexed completion mode"),
            (
                "spec.successPolicy.rules",
                "Required value: at least one rules must be specified when the successPolicy is specified",
            ),
            (
                "spec.template.spec.restartPolicy",
                "Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified",
            ),
            (
                "spec.podFailurePolicy.rules[0].onExitCodes.containerName",
                "Invalid value: \"nope\": must be one of the container or initContainer names in the pod template",
            ),
            (
                "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
                "Invalid value: 0: must not be 0 for the In operator",
            ),
            ("spec.podFailurePolicy.rules[0].onExitCodes.values", "must be ordered"),
            (
                "spec.podFailurePolicy.rules[1].action",
                "Unsupported value: \"Retry\": supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\"",
            ),
            (
                "spec.podFailurePolicy.rules[1].onPodConditions[0].status",
                "Unsupported value: \"Maybe\"",
            ),
            (
                "spec.podFailurePolicy.rules[2]",
                "Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            ),
        ] {
            let m = &find(&causes, path).message;
            assert!(m.contains(msg), "{path}: {m}");
        }
        assert!(
            causes
                .iter()
                .all(|c| c.field != "spec.podFailurePolicy.rules[0].action"),
            "FailIndex with backoffLimitPerIndex is fine"
        );
        let mut changed = j.clone();
        changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("perl:6");
        let causes = validate("batch", "v1", "Job", &changed, Some(&j));
        assert!(find(&causes, "spec.template")
            .message
            .ends_with("field is immutable"));
        let mut suspended = j.clone();
        suspended["spec"]["suspend"] = json!(true);
        let mut rescheduled = suspended.clone();
        rescheduled["spec"]["template"]["spec"]["nodeSelector"] = json!({"zone": "a"});
        assert_eq!(
            validate("batch", "v1", "Job", &rescheduled, Some(&suspended)),
            vec![]
        );
        let mut manual = job_json();
        manual["spec"]["manualSelector"] = json!(true);
        find(
            &validate("batch", "v1", "Job", &created_job(manual), None),
            "spec.selector",
        );
    }

    #[test]
    fn cron_jobs() {
        let cj = |schedule: &str| {
            json!({"metadata": {"name": "c"}, "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": {"spec": {
                "containers": [{"name": "a", "image": "b:1"}], "restartPolicy": "OnFailure"}}}}}})
        };
        for ok in [
            "*/5 * * * *",
            "0 0 * * MON-FRI",
            "@hourly",
            "0 3 1,15 * *",
            "30 2 * JAN,jul sun",
            "@every 1h30m",
            "0 0 ? * *",
            "5/10 * * * *",
        ] {
            assert_eq!(check("batch", "v1", "CronJob", cj(ok)), vec![], "{ok}");
        }
        for (bad, msg) in [
            ("* * *", "expected exactly 5 fields, found 3: [* * *]"),
            ("61 * * * *", "end of range (61) above maximum (59): 61"),
            ("* * 0 * *", "beginning of range (0) below minimum (1): 0"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            (
                "x * * * *",
                "failed to parse int from x: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            ("1-2-3 * * * *", "too many hyphens: 1-2-3"),
            ("@fortnightly", "unrecognized descriptor: @fortnightly"),
            ("* * * * 7", "end of range (7) above maximum (6): 7"),
        ] {
            let causes = check("batch", "v1", "CronJob", cj(bad));
            assert_eq!(
                find(&causes, "spec.schedule").message,
                format!("Invalid value: {bad:?}: {msg}")
            );
        }
        let mut missing = cj("");
        missing["spec"].as_object_mut().unwrap().remove("schedule");
        assert_eq!(
            find(&check("batch", "v1", "CronJob", missing), "spec.schedule").message,
            "Required value"
        );
        let tz = check("batch", "v1", "CronJob", cj("TZ=UTC 0 * * * *"));
        assert!(find(&tz, "spec.schedule")
            .message
            .ends_with("cannot use TZ or CRON_TZ in schedule, use timeZone field instead"));
        let zoned = |zone: &str| {
            let mut c = cj("0 9 * * *");
            c["spec"]["timeZone"] = json!(zone);
            check("batch", "v1", "CronJob", c)
        };
        assert_eq!(zoned("Europe/Paris"), vec![]);
        assert_eq!(zoned("Etc/UTC"), vec![]);
        for (zone, msg) in [
            ("Mars/Olympus", "unknown time zone Mars/Olympus"),
            ("../x", "unknown time zone ../x"),
            ("", "timeZone must be nil or non-empty string"),
            (
                "Local",
                "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones",
            ),
        ] {
            assert_eq!(
                find(&zoned(zone), "spec.timeZone").message,
                format!("Invalid value: {zone:?}: {msg}")
            );
        }
        let mut long = cj("@daily");
        long["metadata"]["name"] = json!("a".repeat(53));
        find(&check("batch", "v1", "CronJob", long), "metadata.name");
        let mut always = cj("@daily");
        always["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] =
            json!("Always");
        find(
            &check("batch", "v1", "CronJob", always),
            "spec.jobTemplate.spec.template.spec.restartPolicy",
        );
    }
}
