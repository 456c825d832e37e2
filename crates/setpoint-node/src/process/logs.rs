//! Container logs.
//!
//! A run's stdout and stderr are appended by the process itself to `<run>.log`, so logging
//! never depends on the agent being alive. Timestamps live beside it in `<run>.times`: the
//! runtime's monitor records checkpoints `<log size> <file mtime in ns>` as the log grows,
//! and a line's time is that of the first checkpoint covering its end — the time of the
//! write that completed it, to within one monitor interval (lines written while the agent
//! was down get the time of the last write before it came back). A log over the size cap
//! is copied to `<run>.log.1` (replacing an older copy) and truncated in place, which the
//! writer's `O_APPEND` descriptor tolerates, so a run keeps at most twice the cap.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;

use super::launch::RunHandle;
use crate::runtime::{LogOptions, LogStream, RuntimeError};

/// One file of a run's log and its timestamp checkpoints.
#[derive(Clone, Debug)]
pub struct Segment {
    /// The log bytes.
    pub log: PathBuf,
    /// The checkpoints.
    pub times: PathBuf,
}

/// The segments of a run, oldest first: the rotated copy (if any), then the live file.
pub fn segments(log: &Path) -> Vec<Segment> {
    let live = Segment {
        log: log.to_path_buf(),
        times: log.with_extension("times"),
    };
    let old = Segment {
        log: suffixed(&live.log, ".1"),
        times: suffixed(&live.times, ".1"),
    };
    if old.log.exists() {
        vec![old, live]
    } else {
        vec![live]
    }
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

fn mtime_ns(path: &Path) -> Option<i128> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(modified.duration_since(UNIX_EPOCH).ok()?.as_nanos() as i128)
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// Records a checkpoint when the live log grew since `indexed` (the size last recorded,
/// updated), and rotates it when it passed `cap` bytes.
pub fn index(log: &Path, indexed: &mut u64, cap: u64) -> std::io::Result<()> {
    let Ok(meta) = std::fs::metadata(log) else {
        return Ok(());
    };
    let size = meta.len();
    let times = log.with_extension("times");
    if size < *indexed {
        // Truncated under us (rotation by an earlier agent): start over.
        *indexed = 0;
    }
    if size > *indexed {
        let mtime = mtime_ns(log).unwrap_or_else(now_ns);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&times)?;
        writeln!(f, "{size} {mtime}")?;
        *indexed = size;
    }
    // The checkpoints count too: a log growing by a byte per interval has more of them.
    let times_len = std::fs::metadata(&times).map(|m| m.len()).unwrap_or(0);
    if size > cap || times_len > cap {
        std::fs::copy(log, suffixed(log, ".1"))?;
        std::fs::copy(&times, suffixed(&times, ".1"))?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(log)?
            .set_len(0)?;
        std::fs::File::create(&times)?;
        *indexed = 0;
    }
    Ok(())
}

/// The size the checkpoints of a live log already cover (to resume indexing after a restart).
pub fn indexed_size(log: &Path) -> u64 {
    read_times(&log.with_extension("times"))
        .last()
        .map(|(o, _)| *o)
        .unwrap_or(0)
}

fn read_times(path: &Path) -> Vec<(u64, i128)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let (o, t) = l.split_once(' ')?;
            Some((o.parse().ok()?, t.parse().ok()?))
        })
        .collect()
}

/// A log line and when it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// Unix nanoseconds.
    pub time_ns: i128,
    /// The bytes, with the trailing newline when it has one.
    pub bytes: Vec<u8>,
}

/// Splits `data` into lines timed by `times`; lines past the last checkpoint get `fallback`.
pub fn timed_lines(data: &[u8], times: &[(u64, i128)], fallback: i128) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut start = 0usize;
    let mut cp = 0usize;
    while start < data.len() {
        let end = data[start..]
            .iter()
            .position(|b| *b == b'\n')
            .map(|p| start + p + 1)
            .unwrap_or(data.len());
        while cp < times.len() && (times[cp].0 as usize) < end {
            cp += 1;
        }
        let time_ns = times.get(cp).map(|t| t.1).unwrap_or(fallback);
        lines.push(Line {
            time_ns,
            bytes: data[start..end].to_vec(),
        });
        start = end;
    }
    lines
}

fn read_segment(seg: &Segment) -> std::io::Result<(Vec<Line>, u64)> {
    let data = match std::fs::read(&seg.log) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let fallback = mtime_ns(&seg.log).unwrap_or_else(now_ns);
    let len = data.len() as u64;
    Ok((timed_lines(&data, &read_times(&seg.times), fallback), len))
}

/// Formats a time as Kubernetes' RFC 3339 with nanoseconds.
pub fn format_time(time_ns: i128) -> String {
    Timestamp::from_nanosecond(time_ns)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Selects and renders the lines of a log that `options` ask for (not following).
pub fn render(lines: Vec<Line>, options: &LogOptions, now_ns: i128) -> Vec<u8> {
    let mut lines = lines;
    if let Some(since) = options.since_seconds {
        let cutoff = now_ns - i128::from(since) * 1_000_000_000;
        lines.retain(|l| l.time_ns >= cutoff);
    }
    if let Some(tail) = options.tail_lines {
        let keep = usize::try_from(tail).unwrap_or(usize::MAX);
        if lines.len() > keep {
            lines.drain(..lines.len() - keep);
        }
    }
    let mut out = Vec::new();
    for line in lines {
        push_line(&mut out, &line, options.timestamps);
    }
    out
}

fn push_line(out: &mut Vec<u8>, line: &Line, timestamps: bool) {
    if timestamps {
        out.extend_from_slice(format_time(line.time_ns).as_bytes());
        out.push(b' ');
    }
    out.extend_from_slice(&line.bytes);
}

/// Cuts `data` to what is left of the byte limit.
fn limit(data: &mut Vec<u8>, remaining: &mut Option<u64>) {
    if let Some(left) = remaining {
        let keep = (*left).min(data.len() as u64);
        data.truncate(keep as usize);
        *left -= keep;
    }
}

/// Opens a run's log as a stream. `active` is the run when it still runs: with `follow`
/// the stream then keeps sending lines until the run ends or the stream is dropped.
pub fn open(
    log: &Path,
    options: &LogOptions,
    active: Option<RunHandle>,
) -> Result<LogStream, RuntimeError> {
    let segs = segments(log);
    let mut lines = Vec::new();
    let mut live_len = 0;
    for seg in &segs {
        let (l, len) =
            read_segment(seg).map_err(|e| RuntimeError::Internal(format!("reading log: {e}")))?;
        lines.extend(l);
        live_len = len;
    }
    let mut first = render(lines, options, now_ns());
    let mut remaining = options.limit_bytes;
    limit(&mut first, &mut remaining);
    let initial = futures::stream::iter((!first.is_empty()).then(|| Ok(Bytes::from(first))));
    let follow = match active {
        Some(handle) if options.follow && remaining != Some(0) => handle,
        _ => return Ok(initial.boxed()),
    };
    let state = Follow {
        path: log.to_path_buf(),
        pos: live_len,
        partial: Vec::new(),
        handle: follow,
        timestamps: options.timestamps,
        remaining,
        done: false,
    };
    let rest = futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            // Check whether the run ended before reading, so the last read sees all it wrote.
            let ended = !st.handle.running();
            match st.read_new(ended) {
                Ok(Some(chunk)) => return Some((Ok(chunk), st)),
                Ok(None) if ended || st.remaining == Some(0) => return None,
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => {
                    st.done = true;
                    return Some((Err(RuntimeError::Internal(format!("reading log: {e}"))), st));
                }
            }
        }
    });
    Ok(initial.chain(rest).boxed())
}

struct Follow {
    path: PathBuf,
    pos: u64,
    partial: Vec<u8>,
    handle: RunHandle,
    timestamps: bool,
    remaining: Option<u64>,
    done: bool,
}

impl Follow {
    /// New complete lines since the last read (and the unterminated rest once `ended`).
    fn read_new(&mut self, ended: bool) -> std::io::Result<Option<Bytes>> {
        if self.remaining == Some(0) {
            return Ok(None);
        }
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.done = true;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len < self.pos {
            // Rotated: the live file starts over.
            self.pos = 0;
        }
        file.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::new();
        file.take(1 << 20).read_to_end(&mut buf)?;
        self.pos += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let cut = if ended {
            self.partial.len()
        } else {
            self.partial
                .iter()
                .rposition(|b| *b == b'\n')
                .map(|p| p + 1)
                .unwrap_or(0)
        };
        if cut == 0 {
            return Ok(None);
        }
        let complete: Vec<u8> = self.partial.drain(..cut).collect();
        let time_ns = mtime_ns(&self.path).unwrap_or_else(now_ns);
        let mut out = Vec::new();
        for line in timed_lines(&complete, &[], time_ns) {
            push_line(&mut out, &line, self.timestamps);
        }
        limit(&mut out, &mut self.remaining);
        if ended {
            self.done = true;
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i128 = 1_000_000_000;

    #[test]
    fn lines_take_the_time_of_the_checkpoint_covering_them() {
        let data = b"a\nbb\nccc\ntail";
        // "a\n" ends at 2, "bb\n" at 5, "ccc\n" at 9, "tail" at 13.
        let lines = timed_lines(data, &[(5, 10 * S), (9, 20 * S)], 99 * S);
        let times: Vec<i128> = lines.iter().map(|l| l.time_ns / S).collect();
        assert_eq!(times, [10, 10, 20, 99]);
        assert_eq!(lines[3].bytes, b"tail");
    }

    #[test]
    fn render_applies_since_tail_and_timestamps() {
        let lines = timed_lines(b"old\nmid\nnew\n", &[(4, 100 * S), (12, 195 * S)], 0);
        let opts = LogOptions {
            since_seconds: Some(10),
            ..Default::default()
        };
        assert_eq!(render(lines.clone(), &opts, 200 * S), b"mid\nnew\n");
        let opts = LogOptions {
            tail_lines: Some(1),
            timestamps: true,
            ..Default::default()
        };
        assert_eq!(
            String::from_utf8(render(lines.clone(), &opts, 200 * S)).unwrap(),
            "1970-01-01T00:03:15Z new\n"
        );
        let opts = LogOptions {
            tail_lines: Some(0),
            ..Default::default()
        };
        assert!(render(lines, &opts, 0).is_empty());
    }

    #[test]
    fn index_records_growth_and_rotates_over_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, b"one\n").unwrap();
        let mut indexed = 0;
        index(&log, &mut indexed, 1000).unwrap();
        index(&log, &mut indexed, 1000).unwrap();
        assert_eq!(read_times(&log.with_extension("times")).len(), 1);
        assert_eq!(indexed_size(&log), 4);
        std::fs::write(&log, vec![b'x'; 20]).unwrap();
        index(&log, &mut indexed, 10).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        assert_eq!(std::fs::read(suffixed(&log, ".1")).unwrap().len(), 20);
        assert_eq!(segments(&log).len(), 2);
    }
}
