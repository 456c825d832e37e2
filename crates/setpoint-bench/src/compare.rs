//! `bench compare`: two reports of the same benchmark side by side, with b/a for every figure.
//!
//! Works on the JSON of any report: every number is flattened to a path (list entries are
//! named by their `verb`+`resource` or `name` when they have one, so the same figure lines up
//! even when the lists differ), and figures only one side has are shown with a blank.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

/// Fields that identify a run rather than measure it.
const SKIP: &[&str] = &["started_unix_ms", "run_id", "running_over_time", "pid"];

/// One figure of both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The figure's dotted path in the report (`api.get pods.count`); list entries
    /// are named by their verb and resource, role or name.
    pub path: String,
    /// Its value in the first report; `None` when that report lacks it.
    pub a: Option<f64>,
    /// Its value in the second report; `None` when that report lacks it.
    pub b: Option<f64>,
}

impl Row {
    /// b / a, when both are there and a is not zero.
    pub fn ratio(&self) -> Option<f64> {
        match (self.a, self.b) {
            (Some(a), Some(b)) if a != 0.0 => Some(b / a),
            _ => None,
        }
    }
}

fn entry_name(v: &Value, i: usize) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    match (s("verb"), s("resource"), s("role").or(s("name"))) {
        (Some(verb), Some(res), _) => format!("{verb} {res}"),
        (_, _, Some(name)) => name.to_string(),
        _ => i.to_string(),
    }
}

/// Names of a list's entries; a name that repeats gets ` #2`, ` #3`… from its second use, so
/// no figure hides another.
fn entry_names(items: &[Value]) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let name = entry_name(item, i);
            let n = seen.entry(name.clone()).or_default();
            *n += 1;
            if *n == 1 {
                name
            } else {
                format!("{name} #{n}")
            }
        })
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, f64>) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.insert(prefix.to_string(), f);
            }
        }
        Value::Bool(b) => {
            out.insert(prefix.to_string(), f64::from(u8::from(*b)));
        }
        Value::Object(m) => {
            for (k, v) in m {
                if !SKIP.contains(&k.as_str()) {
                    flatten(&join(k), v, out);
                }
            }
        }
        Value::Array(items) => {
            for (name, item) in entry_names(items).iter().zip(items) {
                flatten(&join(name), item, out);
            }
        }
        _ => {}
    }
}

/// Refuses two reports of different benchmarks (their figures measure different things), or
/// JSON that is not a report.
pub fn same_benchmark(a: &Value, b: &Value) -> Result<(), String> {
    let kind = |v: &Value| v.get("benchmark").and_then(Value::as_str).map(String::from);
    match (kind(a), kind(b)) {
        (Some(x), Some(y)) if x == y => Ok(()),
        (Some(x), Some(y)) => Err(format!(
            "the reports are of different benchmarks ({x} and {y})"
        )),
        _ => Err("not a `setpoint bench` report (no `benchmark` field)".into()),
    }
}

/// Every figure of `a` and `b`, in `a`'s order then those only `b` has.
pub fn rows(a: &Value, b: &Value) -> Vec<Row> {
    let (mut fa, mut fb) = (BTreeMap::new(), BTreeMap::new());
    flatten("", a, &mut fa);
    flatten("", b, &mut fb);
    let mut out: Vec<Row> = fa
        .iter()
        .map(|(k, v)| Row {
            path: k.clone(),
            a: Some(*v),
            b: fb.get(k).copied(),
        })
        .collect();
    out.extend(
        fb.iter()
            .filter(|(k, _)| !fa.contains_key(*k))
            .map(|(k, v)| Row {
                path: k.clone(),
                a: None,
                b: Some(*v),
            }),
    );
    out
}

/// The rows as a table.
pub fn render(rows: &[Row], a_name: &str, b_name: &str) -> String {
    let width = rows.iter().map(|r| r.path.len()).max().unwrap_or(6).max(6);
    let num = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<width$} {:>14} {:>14} {:>8}",
        "figure", a_name, b_name, "b/a"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<width$} {:>14} {:>14} {:>8}",
            r.path,
            num(r.a),
            num(r.b),
            r.ratio().map(|x| format!("{x:.2}")).unwrap_or_default()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattens_and_lines_up_by_name() {
        let a = json!({"total_seconds": 2.0, "run_id": "x", "api": [
            {"verb": "create", "resource": "pods", "count": 10},
            {"verb": "get", "resource": "pods", "count": 4}
        ], "timed_out": false});
        let b = json!({"total_seconds": 3.0, "run_id": "y", "api": [
            {"verb": "get", "resource": "pods", "count": 8}
        ], "extra": 1});
        let r = rows(&a, &b);
        let find = |p: &str| r.iter().find(|x| x.path == p).unwrap().clone();
        assert_eq!(find("total_seconds").ratio(), Some(1.5));
        assert_eq!(find("api.get pods.count").ratio(), Some(2.0));
        assert_eq!(find("api.create pods.count").b, None);
        assert_eq!(find("extra").a, None);
        assert_eq!(find("timed_out").a, Some(0.0));
        assert_eq!(find("timed_out").ratio(), None);
        assert!(r.iter().all(|x| !x.path.contains("run_id")));
        let text = render(&r, "a.json", "b.json");
        assert!(text.contains("1.50"));
    }

    #[test]
    fn processes_line_up_by_role_and_repeats_stay_apart() {
        let a = json!({"processes": [
            {"pid": 1, "name": "setpoint up --data-dir /x", "role": "setpoint up", "cpu_seconds": 10.0},
            {"pid": 2, "name": "setpoint agent --simulate", "role": "setpoint agent", "cpu_seconds": 1.0},
            {"pid": 3, "name": "setpoint agent --simulate", "role": "setpoint agent", "cpu_seconds": 2.0}
        ]});
        let b = json!({"processes": [
            {"pid": 7, "name": "setpoint up --store etcd", "role": "setpoint up", "cpu_seconds": 20.0}
        ]});
        let r = rows(&a, &b);
        let find = |p: &str| r.iter().find(|x| x.path == p).cloned();
        assert_eq!(
            find("processes.setpoint up.cpu_seconds").unwrap().ratio(),
            Some(2.0)
        );
        assert_eq!(
            find("processes.setpoint agent.cpu_seconds").unwrap().a,
            Some(1.0)
        );
        assert_eq!(
            find("processes.setpoint agent #2.cpu_seconds").unwrap().a,
            Some(2.0)
        );
    }

    #[test]
    fn reports_of_different_benchmarks_are_refused() {
        let d = json!({"benchmark": "density"});
        assert!(same_benchmark(&d, &d).is_ok());
        let e = same_benchmark(&d, &json!({"benchmark": "churn"})).unwrap_err();
        assert!(e.contains("density") && e.contains("churn"), "{e}");
        assert!(same_benchmark(&d, &json!({"total_seconds": 1})).is_err());
    }
}
