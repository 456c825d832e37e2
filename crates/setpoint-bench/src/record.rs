//! The raw event log: one [`Entry`] per observation, each with the microseconds since the run
//! started on this process's monotonic clock.
//!
//! Times are integers on purpose: a report recomputed from the log written to disk must be
//! bit-for-bit the report computed in memory, and integers survive a JSON round trip exactly.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::BenchError;

/// One observation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Microseconds since the run started.
    pub t_us: u64,
    /// What was observed.
    #[serde(flatten)]
    pub record: Record,
}

/// Milestones of a run, in the order they normally happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// Nodes are Ready and the watches are open: the clock for throughput starts here.
    CreatesStarted,
    /// Every create was answered.
    CreatesDone,
    /// Every pod Running and every Deployment Available.
    AllReady,
    /// The wait for readiness gave up.
    TimedOut,
    /// The namespace deletes were sent.
    DeleteStarted,
    /// The namespaces are gone.
    Deleted,
    /// The load phase of churn or api ended.
    LoadDone,
    /// Churn, after the load: every Deployment it left was Available with its replicas
    /// updated, every pod it left Running and ready, and every deleted pod gone.
    Settled,
}

/// What was observed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// The first record: which benchmark, with what parameters, started when (wall clock).
    Start {
        /// `density`, `churn` or `api`.
        benchmark: String,
        /// The run's random id (see [`crate::density::run_id`]).
        run_id: String,
        /// Wall-clock start, milliseconds since the Unix epoch.
        unix_ms: i64,
        /// The run's configuration as the report needs it (counts, rates, sizes), a JSON object.
        params: serde_json::Value,
    },
    /// A milestone.
    Mark {
        /// Which milestone was reached.
        mark: Mark,
    },
    /// A pod (`namespace/name`) was first seen at all.
    PodCreated {
        /// `namespace/name`.
        pod: String,
    },
    /// A pod was first seen with `spec.nodeName`.
    PodScheduled {
        /// `namespace/name`.
        pod: String,
        /// The `spec.nodeName` it was bound to.
        node: String,
    },
    /// A pod was first seen in phase Running with every container ready.
    PodRunning {
        /// `namespace/name`.
        pod: String,
    },
    /// A Deployment (`namespace/name`) was first seen with `availableReplicas` == replicas.
    DeploymentAvailable {
        /// `namespace/name`.
        deployment: String,
    },
    /// One API request as the client saw it: sent at `t_us`, answered `us` later; `error` is
    /// `None` on success, else the HTTP code or `transport` / `decode`.
    Request {
        /// The client call (`create`, `get`, `list`, `watch`, `patch`, …).
        verb: String,
        /// The resource's plural name (`pods`).
        resource: String,
        /// Microseconds from sending to the answer (or the failure).
        us: u64,
        /// `None` on success; else the HTTP status code, `transport`, `decode`, `config` or
        /// `timeout`.
        error: Option<String>,
    },
    /// A failed request is being retried.
    Retry {
        /// The client call, as in [`Record::Request`].
        verb: String,
        /// The resource's plural name.
        resource: String,
        /// The failed attempt's `error`, as in [`Record::Request`].
        reason: String,
    },
    /// The sampler reset the peak resident set of a local process to its current size
    /// (`reset`), so its later `VmHWM` samples are the run's peak, not the process's; or
    /// could not (then they are the peak since the process started).
    PeakReset {
        /// The process id.
        pid: u32,
        /// Whether the reset worked.
        reset: bool,
    },
    /// A sample of a local process: peak resident set (`VmHWM`) and CPU time so far.
    Process {
        /// The process id.
        pid: u32,
        /// What the report calls the process (see [`crate::procstat::setpoint_processes`]).
        name: String,
        /// Peak resident set, in kB (`VmHWM`).
        hwm_kb: u64,
        /// User plus system CPU time since the process started, in milliseconds.
        cpu_ms: u64,
    },
    /// What was still missing when a wait gave up.
    Missing {
        /// What, in words (`namespace bench-1a2b3c still there after 60s`, or the error that
        /// stopped a cleanup step).
        what: String,
    },
    /// A watcher received a change `us` after its writer sent it.
    Delivery {
        /// The watcher's index, from 0.
        watcher: u32,
        /// Microseconds from the writer sending the change to the watcher receiving it.
        us: u64,
    },
    /// Churn: an operation was due but every slot was busy, so it was not sent (backlog).
    Skipped {
        /// The operation, such as `create pod` or `patch deployment`.
        op: String,
    },
}

/// Collects entries from many tasks; cheap to clone.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            entries: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Microseconds since the start.
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// The instant the clock started (to turn other instants into log times).
    pub fn start(&self) -> Instant {
        self.start
    }

    /// Records `record` as observed now.
    pub fn record(&self, record: Record) {
        let t_us = self.now_us();
        self.record_at(t_us, record);
    }

    /// Records `record` as observed at `t_us`.
    pub fn record_at(&self, t_us: u64, record: Record) {
        self.entries.lock().push(Entry { t_us, record });
    }

    /// Everything recorded so far, sorted by time (stable, so equal times keep their order).
    pub fn snapshot(&self) -> Vec<Entry> {
        let mut v = self.entries.lock().clone();
        v.sort_by_key(|e| e.t_us);
        v
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// Writes entries as JSON lines.
pub fn write_log(entries: &[Entry], out: impl Write) -> Result<(), BenchError> {
    let mut out = std::io::BufWriter::new(out);
    for e in entries {
        serde_json::to_writer(&mut out, e)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Reads JSON lines written by [`write_log`] (blank lines are skipped).
pub fn read_log(input: impl BufRead) -> Result<Vec<Entry>, BenchError> {
    let mut v = Vec::new();
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        v.push(serde_json::from_str(&line)?);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trips() {
        let entries = vec![
            Entry {
                t_us: 0,
                record: Record::Start {
                    benchmark: "density".into(),
                    run_id: "abc".into(),
                    unix_ms: 1,
                    params: serde_json::json!({"nodes": 3}),
                },
            },
            Entry {
                t_us: 5,
                record: Record::Request {
                    verb: "POST".into(),
                    resource: "pods".into(),
                    us: 17,
                    error: Some("transport".into()),
                },
            },
            Entry {
                t_us: 9,
                record: Record::Mark {
                    mark: Mark::AllReady,
                },
            },
        ];
        let mut buf = Vec::new();
        write_log(&entries, &mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert!(text.lines().nth(1).unwrap().contains(r#""kind":"request""#));
        assert_eq!(read_log(&buf[..]).unwrap(), entries);
    }

    #[test]
    fn snapshot_is_sorted_by_time() {
        let r = Recorder::new();
        r.record_at(10, Record::Missing { what: "b".into() });
        r.record_at(3, Record::Missing { what: "a".into() });
        let s = r.snapshot();
        assert_eq!(s[0].t_us, 3);
        assert_eq!(s[1].t_us, 10);
    }
}
