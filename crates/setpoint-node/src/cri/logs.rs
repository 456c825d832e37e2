//! CRI container log files: each line is `<RFC 3339 time> <stdout|stderr> <P|F> <text>`,
//! where `P` marks a partial line that the next entries continue and `F` ends it. This
//! module turns a file's content into what `kubectl logs` shows, honouring `tailLines`,
//! `sinceSeconds`, `timestamps` and `limitBytes`; and where rotation moves a log that grew
//! too large (`<log>.<YYYYMMDD-hhmmss>`, as the kubelet names them) and which rotated files
//! go.

use k8s_openapi::jiff::Timestamp;

use crate::runtime::LogOptions;

/// One whole line of a container's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// When the line's first part was written, as the runtime wrote it.
    pub time: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The line, without its newline.
    pub text: String,
}

/// The whole lines of a CRI log file's content; partial lines are joined with what follows
/// them, and a malformed line is skipped. A partial line at the very end (still being
/// written) is included as it is.
pub fn parse(content: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut pending: Option<Entry> = None;
    for line in content.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let text = parts.next().unwrap_or_default();
        let partial = tag.split(':').next() == Some("P");
        match &mut pending {
            Some(p) => p.text.push_str(text),
            None => {
                pending = Some(Entry {
                    time: time.to_string(),
                    stream: stream.to_string(),
                    text: text.to_string(),
                })
            }
        }
        if !partial {
            out.extend(pending.take());
        }
    }
    out.extend(pending);
    out
}

/// What to send for `options` from a log's content, at `now`.
pub fn render(content: &str, options: &LogOptions, now: Timestamp) -> Vec<u8> {
    let mut entries = parse(content);
    if let Some(since) = options.since_seconds {
        let cutoff = now.as_second().saturating_sub(since as i64);
        entries.retain(|e| {
            e.time
                .parse::<Timestamp>()
                .is_ok_and(|t| t.as_second() >= cutoff)
        });
    }
    if let Some(tail) = options.tail_lines {
        let skip = entries
            .len()
            .saturating_sub(usize::try_from(tail).unwrap_or(usize::MAX));
        entries.drain(..skip);
    }
    let mut out = Vec::new();
    for e in entries {
        if options.timestamps {
            out.extend_from_slice(e.time.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(e.text.as_bytes());
        out.push(b'\n');
    }
    if let Some(limit) = options.limit_bytes {
        out.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
    out
}

/// The name a log is rotated to at `now`: `<log>.<YYYYMMDD-hhmmss>`.
pub fn rotated_name(log: &std::path::Path, now: Timestamp) -> std::path::PathBuf {
    let stamp = now.strftime("%Y%m%d-%H%M%S").to_string();
    let mut name = log.as_os_str().to_os_string();
    name.push(".");
    name.push(stamp);
    std::path::PathBuf::from(name)
}

/// The rotated files of `log` beyond the newest `keep`, oldest first: those to remove.
/// `siblings` are the names in the log's directory.
pub fn excess_rotated(log_name: &str, siblings: &[String], keep: usize) -> Vec<String> {
    let prefix = format!("{log_name}.");
    let mut rotated: Vec<&String> = siblings
        .iter()
        .filter(|n| {
            n.strip_prefix(&prefix)
                .is_some_and(|stamp| stamp.len() == 15 && stamp.as_bytes()[8] == b'-')
        })
        .collect();
    rotated.sort();
    let excess = rotated.len().saturating_sub(keep);
    rotated.into_iter().take(excess).cloned().collect()
}

/// How much of a growing log is whole lines: the length up to the end of the last line
/// that ends an entry (tag `F`). What follows is a line still being written or a partial
/// (`P`) entry whose continuation has not come yet; following readers keep it for later.
pub fn complete_len(content: &[u8]) -> usize {
    let mut end = 0;
    let mut start = 0;
    while let Some(nl) = content[start..].iter().position(|b| *b == b'\n') {
        let line = &content[start..start + nl];
        let tag = line.split(|b| *b == b' ').nth(2).unwrap_or_default();
        if tag.first() != Some(&b'P') {
            end = start + nl + 1;
        }
        start += nl + 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02.5Z stderr P tw\n\
2026-01-01T00:00:02.6Z stderr F o\n\
garbage\n\
2026-01-01T00:00:09Z stdout F three\n";

    fn now() -> Timestamp {
        "2026-01-01T00:00:10Z".parse().unwrap()
    }

    #[test]
    fn partial_lines_are_joined() {
        let e = parse(LOG);
        let texts: Vec<&str> = e.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["one", "two", "three"]);
        assert_eq!(e[1].stream, "stderr");
        assert_eq!(e[1].time, "2026-01-01T00:00:02.5Z");
    }

    #[test]
    fn rotation_names_and_what_goes() {
        let t: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        assert_eq!(
            rotated_name(std::path::Path::new("d/c/0.log"), t),
            std::path::PathBuf::from("d/c/0.log.20260102-030405")
        );
        let names: Vec<String> = [
            "0.log",
            "0.log.20260102-030407",
            "0.log.20260102-030405",
            "0.log.20260102-030406",
            "1.log.20260102-030401",
            "0.log.tmp",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            excess_rotated("0.log", &names, 1),
            ["0.log.20260102-030405", "0.log.20260102-030406"]
        );
        assert!(excess_rotated("0.log", &names, 4).is_empty());
    }

    #[test]
    fn only_whole_entries_are_complete() {
        let log = b"t stdout F a\nt stdout P b\nt stdout F c\nt stdout P d\nt stdout F e";
        // Up to "c": "d" waits for its continuation, "e" for its newline.
        assert_eq!(
            complete_len(log),
            "t stdout F a\nt stdout P b\nt stdout F c\n".len()
        );
        assert_eq!(complete_len(b"t stdout P x\n"), 0);
        assert_eq!(complete_len(b""), 0);
    }

    #[test]
    fn options_select_and_decorate() {
        let all = LogOptions::default();
        assert_eq!(render(LOG, &all, now()), b"one\ntwo\nthree\n");
        let tail = LogOptions {
            tail_lines: Some(2),
            ..Default::default()
        };
        assert_eq!(render(LOG, &tail, now()), b"two\nthree\n");
        let since = LogOptions {
            since_seconds: Some(5),
            ..Default::default()
        };
        assert_eq!(render(LOG, &since, now()), b"three\n");
        let stamped = LogOptions {
            timestamps: true,
            tail_lines: Some(1),
            ..Default::default()
        };
        assert_eq!(
            render(LOG, &stamped, now()),
            b"2026-01-01T00:00:09Z three\n"
        );
        let limited = LogOptions {
            limit_bytes: Some(5),
            ..Default::default()
        };
        assert_eq!(render(LOG, &limited, now()), b"one\nt");
    }
}
