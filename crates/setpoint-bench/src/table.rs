//! Readable text for the reports: aligned tables for a terminal.

use std::fmt::Write;

use crate::report::{ApiLatency, ApiReport, ChurnReport, DensityReport, Percentiles, ProcessUsage};

fn pct_header(out: &mut String, first: &str, width: usize) {
    let _ = writeln!(
        out,
        "  {first:<width$} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
}

fn pct_row(out: &mut String, name: &str, p: &Percentiles, width: usize) {
    let _ = writeln!(
        out,
        "  {name:<width$} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
        p.count, p.p50, p.p90, p.p99, p.max
    );
}

fn api_table(out: &mut String, api: &[ApiLatency]) {
    let _ = writeln!(out, "API latency as the client saw it:");
    let _ = writeln!(
        out,
        "  {:<26} {:>8} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "verb resource", "count", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for a in api {
        let p = &a.latency_ms;
        let _ = writeln!(
            out,
            "  {:<26} {:>8} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            format!("{} {}", a.verb, a.resource),
            a.count,
            a.errors,
            p.p50,
            p.p90,
            p.p99,
            p.max
        );
    }
}

fn process_table(out: &mut String, procs: &[ProcessUsage]) {
    if procs.is_empty() {
        return;
    }
    let _ = writeln!(out, "Local Setpoint processes:");
    let _ = writeln!(
        out,
        "  {:>8} {:>14} {:>12}  name",
        "pid", "peak RSS MiB", "CPU s"
    );
    for p in procs {
        // A peak that could not be reset at the start may predate the run.
        let since = if p.peak_is_the_runs {
            ""
        } else {
            " (peak since the process started)"
        };
        let _ = writeln!(
            out,
            "  {:>8} {:>14.1} {:>12.2}  {}{since}",
            p.pid, p.peak_rss_mib, p.cpu_seconds, p.name
        );
    }
}

fn opt_secs(s: Option<f64>) -> String {
    s.map(|s| format!("{s:.2} s")).unwrap_or_else(|| "-".into())
}

/// The density report as text.
pub fn density(r: &DensityReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "density run {}: {} {}s x {} replicas = {} pods on {} Ready nodes ({} simulated here)",
        r.run_id, r.deployments, r.kind, r.replicas, r.pods, r.nodes, r.simulated_nodes
    );
    if r.timed_out {
        let _ = writeln!(out, "TIMED OUT; missing:");
        for m in &r.missing {
            let _ = writeln!(out, "  {m}");
        }
    }
    let _ = writeln!(
        out,
        "  total (creates started -> all Running)  {:.2} s",
        r.total_seconds
    );
    let _ = writeln!(
        out,
        "  pods Running per second                 {:.1}",
        r.pods_running_per_second
    );
    let _ = writeln!(
        out,
        "  {:<38} {}{}",
        format!("{} creates answered after", r.kind),
        opt_secs(r.create_seconds),
        r.create_rate
            .map(|c| format!(" (started at {c}/s)"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  namespace deletion took                 {}",
        opt_secs(r.deletion_seconds)
    );
    let available = if r.kind == "Deployment" {
        format!("  Deployments Available {}", r.deployments_available)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "  pods seen created {}  scheduled {}  Running {}{available}",
        r.pods_created, r.pods_scheduled, r.pods_running
    );
    let _ = writeln!(out, "  (Running = {})", r.running_means);
    let _ = writeln!(out, "Per-pod latency (first seen by a watch):");
    pct_header(&mut out, "phase", 28);
    let l = &r.latency_ms;
    pct_row(
        &mut out,
        "created -> scheduled",
        &l.created_to_scheduled,
        28,
    );
    pct_row(
        &mut out,
        "scheduled -> Running",
        &l.scheduled_to_running,
        28,
    );
    pct_row(&mut out, "created -> Running", &l.created_to_running, 28);
    pct_row(
        &mut out,
        "Deployment Available (start)",
        &l.deployment_available,
        28,
    );
    api_table(&mut out, &r.api);
    let _ = writeln!(
        out,
        "  requests {}  errors {}  retries {}",
        r.requests, r.errors, r.retries
    );
    process_table(&mut out, &r.processes);
    out
}

/// The churn report as text.
pub fn churn(r: &ChurnReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "churn run {}: {:.1} operations/s requested for {:.1} s",
        r.run_id, r.requested_rate, r.duration_seconds
    );
    let _ = writeln!(
        out,
        "  due {}  sent {}  succeeded {}  errors {}  skipped {}",
        r.due, r.sent, r.succeeded, r.errors, r.skipped
    );
    let _ = writeln!(
        out,
        "  achieved {:.1}/s of {:.1}/s requested; backlog at the end {}; kept up: {}",
        r.achieved_rate,
        r.requested_rate,
        r.backlog,
        if r.kept_up { "yes" } else { "NO" }
    );
    let _ = match (r.settled, r.settle_seconds) {
        (Some(true), Some(s)) => writeln!(
            out,
            "  settled {s:.2} s after the load (Deployments Available, pods Running, deleted pods gone)"
        ),
        (Some(_), _) => writeln!(out, "  did NOT settle before the timeout"),
        (None, _) => writeln!(out, "  settling not checked (no nodes hosted to run pods)"),
    };
    let _ = writeln!(out, "Latency per 5 s window:");
    let _ = writeln!(
        out,
        "  {:>8} {:>7} {:>7} {:>8} {:>10} {:>10} {:>10} {:>10}",
        "from s", "sent", "errors", "skipped", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for w in &r.windows {
        let p = &w.latency_ms;
        let _ = writeln!(
            out,
            "  {:>8.0} {:>7} {:>7} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            w.start_seconds, w.sent, w.errors, w.skipped, p.p50, p.p90, p.p99, p.max
        );
    }
    api_table(&mut out, &r.api);
    process_table(&mut out, &r.processes);
    out
}

/// The api report as text.
pub fn api(r: &ApiReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "api run {}: {} workers, {} B objects, {} watchers, {:.1} s",
        r.run_id, r.concurrency, r.object_size, r.watchers, r.duration_seconds
    );
    let _ = writeln!(
        out,
        "  requests {} ({:.0}/s)  errors {}",
        r.requests, r.requests_per_second, r.errors
    );
    for (verb, rate) in &r.per_second {
        let _ = writeln!(out, "  {verb:<8} {rate:>10.0}/s");
    }
    api_table(&mut out, &r.api);
    let _ = writeln!(
        out,
        "Watch fan-out: {} writes x {} watchers = {} expected, {} delivered",
        r.writes,
        r.watchers,
        r.writes * r.watchers,
        r.deliveries
    );
    pct_header(&mut out, "", 16);
    pct_row(&mut out, "sent -> received", &r.delivery_ms, 16);
    process_table(&mut out, &r.processes);
    out
}
