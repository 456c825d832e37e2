//! Metrics text for scrapers. The metrics libraries here write OpenMetrics text, in which a
//! counter family `x` has samples `x_total` and the document ends with `# EOF`. Prometheus'
//! classic text format (`text/plain; version=0.0.4`), which Kubernetes components serve and
//! which a scraper gets unless it asks for OpenMetrics, names a counter by its sample name
//! (`# TYPE x_total counter`) and has no `# UNIT` or `# EOF` lines.

/// The media type of Prometheus' classic text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The media type of OpenMetrics text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: &str) -> bool {
    accept
        .split(',')
        .any(|t| t.trim().starts_with("application/openmetrics-text"))
}

/// Rewrites OpenMetrics text as Prometheus' classic text format.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP comes before its TYPE: it is held until the TYPE says whether the
    // family is a counter, whose name then takes `_total`.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some((name, text)) = help.take() {
                push_help(&mut out, name, text);
            }
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some((_, text)) = help.take() {
                push_help(&mut out, &name, text);
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            if let Some((name, text)) = help.take() {
                push_help(&mut out, name, text);
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    if let Some((name, text)) = help {
        push_help(&mut out, name, text);
    }
    out
}

fn push_help(out: &mut String, name: &str, text: &str) {
    out.push_str(&format!("# HELP {name} {text}\n"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_by_their_samples() {
        let om = "# HELP apiserver_request Requests.\n# TYPE apiserver_request counter\n\
                  apiserver_request_total{verb=\"GET\"} 3\n\
                  # HELP depth Depth.\n# TYPE depth gauge\n# UNIT depth items\ndepth 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP apiserver_request_total Requests.\n# TYPE apiserver_request_total counter\n\
             apiserver_request_total{verb=\"GET\"} 3\n\
             # HELP depth Depth.\n# TYPE depth gauge\ndepth 1\n"
        );
    }

    #[test]
    fn accept_headers() {
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        ));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(!wants_openmetrics("*/*"));
    }
}
