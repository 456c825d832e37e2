//! A hand-written SVG chart of a density report: pods Running over time on the left, the
//! per-pod phase latency percentiles on the right, so two runs compare at a glance.

use std::fmt::Write;

use crate::report::{DensityReport, Percentiles};

const W: f64 = 960.0;
const H: f64 = 420.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The chart as an SVG document.
pub fn density(r: &DensityReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let title = format!(
        "density {}: {} pods on {} nodes, all Running in {:.2} s ({:.0} pods/s){}",
        r.run_id,
        r.pods,
        r.nodes,
        r.total_seconds,
        r.pods_running_per_second,
        if r.timed_out { " — TIMED OUT" } else { "" }
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="24" font-size="15">{}</text>"#,
        esc(&title)
    );

    // Left: pods Running over time.
    let (x0, y0, pw, ph) = (60.0, 60.0, 400.0, 300.0);
    let tmax = r.total_seconds.max(1e-6);
    let nmax = r.pods.max(1) as f64;
    let _ = writeln!(
        s,
        r#"<path d="M{x0} {y0} V{} H{}" stroke="black" fill="none"/>"#,
        y0 + ph,
        x0 + pw
    );
    let points: Vec<String> = r
        .running_over_time
        .iter()
        .map(|(t, n)| {
            format!(
                "{:.1},{:.1}",
                x0 + t / tmax * pw,
                y0 + ph - *n as f64 / nmax * ph
            )
        })
        .collect();
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="2"/>"##,
        points.join(" ")
    );
    let _ = writeln!(s, r#"<text x="{x0}" y="{}">pods Running</text>"#, y0 - 8.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
        x0 - 4.0,
        y0 + 4.0,
        r.pods
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
        x0 - 4.0,
        y0 + ph
    );
    let _ = writeln!(s, r#"<text x="{x0}" y="{}">0 s</text>"#, y0 + ph + 16.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">{:.2} s</text>"#,
        x0 + pw,
        y0 + ph + 16.0,
        r.total_seconds
    );

    // Right: latency percentiles per phase, one group of bars per phase.
    let (bx, by, bw, bh) = (540.0, 60.0, 400.0, 300.0);
    let l = &r.latency_ms;
    let phases: [(&str, &Percentiles); 3] = [
        ("created→scheduled", &l.created_to_scheduled),
        ("scheduled→Running", &l.scheduled_to_running),
        ("created→Running", &l.created_to_running),
    ];
    let vmax = phases.iter().map(|(_, p)| p.max).fold(1e-6, f64::max);
    let colors = ["#2ca02c", "#ff7f0e", "#d62728", "#7f7f7f"];
    let names = ["p50", "p90", "p99", "max"];
    let _ = writeln!(
        s,
        r#"<path d="M{bx} {by} V{} H{}" stroke="black" fill="none"/>"#,
        by + bh,
        bx + bw
    );
    let _ = writeln!(
        s,
        r#"<text x="{bx}" y="{}">per-pod latency, ms (max {:.0})</text>"#,
        by - 8.0,
        vmax
    );
    let group = bw / 3.0;
    let bar = group / 5.0;
    for (g, (name, p)) in phases.iter().enumerate() {
        let gx = bx + g as f64 * group + bar / 2.0;
        for (i, v) in [p.p50, p.p90, p.p99, p.max].iter().enumerate() {
            let hgt = v / vmax * bh;
            let x = gx + i as f64 * bar;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{hgt:.1}" fill="{}"><title>{} {}: {:.1} ms</title></rect>"#,
                by + bh - hgt,
                bar - 2.0,
                colors[i],
                name,
                names[i],
                v
            );
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{:.0}</text>"#,
                x + bar / 2.0 - 1.0,
                by + bh - hgt - 3.0,
                v
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            bx + g as f64 * group + group / 2.0,
            by + bh + 16.0,
            name
        );
    }
    for (i, n) in names.iter().enumerate() {
        let x = bx + i as f64 * 60.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{n}</text>"#,
            by + bh + 30.0,
            colors[i],
            x + 14.0,
            by + bh + 39.0
        );
    }
    s.push_str("</svg>\n");
    s
}
