//! What the runtime keeps on disk so a new agent process finds the pods the previous one
//! started: one `pod.json` per pod, rewritten atomically on every change, and the facts
//! about processes read from `/proc`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The record of one pod, `pods/<uid>/pod.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PodRecord {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The loopback address allocated to the pod.
    pub ip: String,
    /// When the runtime first started the pod's containers (Unix milliseconds).
    pub start_time_ms: i64,
    /// Per container name.
    pub containers: BTreeMap<String, ContainerRecord>,
}

/// The record of one container.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// How many times the container was restarted.
    pub restart_count: i32,
    /// The latest run (running or exited).
    pub run: Option<RunRecord>,
    /// How the run before the latest one ended (`lastState`).
    pub last: Option<ExitRecord>,
    /// The back-off delay the next crash waits (milliseconds); `None` before the first crash.
    pub backoff_ms: Option<u64>,
    /// When the exited latest run may be restarted (Unix milliseconds).
    pub restart_at_ms: Option<i64>,
}

/// One run of a container: one process (or a simulated container).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunRecord {
    /// 0 for the first run, then one more per restart; names the run's log files.
    pub index: u32,
    /// The container is simulated: it has no process.
    pub simulated: bool,
    /// The supervising wrapper's pid (also its process group id).
    pub wrapper_pid: i32,
    /// The wrapper's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub wrapper_start: u64,
    /// The workload's pid, once the wrapper reported it.
    pub pid: Option<i32>,
    /// The workload's start time in clock ticks since boot.
    pub pid_start: Option<u64>,
    /// When the run started (Unix milliseconds).
    pub started_at_ms: i64,
    /// How it ended, once it did.
    pub exit: Option<ExitRecord>,
}

/// How a run ended.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitRecord {
    /// The exit code; 128 + signal number when a signal killed it.
    pub code: i32,
    /// `Completed` or `Error`.
    pub reason: String,
    /// A note when the exit code is not the process's own.
    pub message: Option<String>,
    /// When the run started (Unix milliseconds).
    pub started_at_ms: i64,
    /// When it ended (Unix milliseconds).
    pub finished_at_ms: i64,
    /// The container id the run had (`process://<pid>`).
    pub container_id: String,
}

impl PodRecord {
    /// Reads a pod record.
    pub fn load(path: &Path) -> std::io::Result<Self> {
        let bytes = std::fs::read(path)?;
        serde_json::from_slice(&bytes).map_err(std::io::Error::other)
    }

    /// Writes the record atomically (temporary file, fsync, rename) so a crash never leaves
    /// half a record.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

/// The files of one pod under the runtime's root.
#[derive(Clone, Debug)]
pub struct PodPaths {
    /// `pods/<uid>`.
    pub dir: PathBuf,
}

impl PodPaths {
    /// The paths of the pod `uid` under `root`.
    pub fn new(root: &Path, uid: &str) -> Self {
        Self {
            dir: root.join("pods").join(uid),
        }
    }
    /// The pod record.
    pub fn record(&self) -> PathBuf {
        self.dir.join("pod.json")
    }
    /// The pod's `/etc/resolv.conf`, for a pod with a network namespace of its own.
    pub fn resolv_conf(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }
    /// A container's directory: logs, pid and exit files of its runs.
    pub fn container(&self, name: &str) -> PathBuf {
        self.dir.join("containers").join(name)
    }
    /// The default working directory of a container: its own scratch directory.
    pub fn workdir(&self, name: &str) -> PathBuf {
        self.dir.join("work").join(name)
    }
    /// A run's file with the given extension (`log`, `times`, `pid`, `exit`).
    pub fn run_file(&self, name: &str, index: u32, ext: &str) -> PathBuf {
        self.container(name).join(format!("{index}.{ext}"))
    }
}

/// A process as `/proc/<pid>/stat` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Start time in clock ticks since boot.
    pub start: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when there is no such process.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields after it are
    // counted from the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Field 22 overall is index 19 after the state (field 3).
    let start = fields.get(19)?.parse().ok()?;
    Some(ProcStat { state, start })
}

/// Whether the process `pid` that started at `start` still runs (a zombie has ended; a
/// process with another start time is a reused pid).
pub fn alive(pid: i32, start: u64) -> bool {
    pid > 0
        && matches!(proc_stat(pid), Some(s) if s.start == start && s.state != 'Z' && s.state != 'X')
}

/// The current time in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A file's modification time in Unix milliseconds.
pub fn mtime_ms(path: &Path) -> Option<i64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_millis()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process_and_detects_reuse() {
        let me = std::process::id() as i32;
        let stat = proc_stat(me).expect("own stat");
        assert!(alive(me, stat.start));
        assert!(!alive(me, stat.start + 1));
        assert!(proc_stat(-5).is_none());
    }

    #[test]
    fn records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pod.json");
        let mut rec = PodRecord {
            uid: "u".into(),
            ip: "127.1.0.1".into(),
            ..Default::default()
        };
        rec.containers.insert(
            "c".into(),
            ContainerRecord {
                restart_count: 2,
                backoff_ms: Some(20),
                ..Default::default()
            },
        );
        rec.save(&path).unwrap();
        let back = PodRecord::load(&path).unwrap();
        assert_eq!(back.ip, "127.1.0.1");
        assert_eq!(back.containers["c"].restart_count, 2);
    }
}
