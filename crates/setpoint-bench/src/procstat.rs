//! Peak RSS and CPU seconds of the Setpoint processes on this machine: every process whose
//! executable is named `setpoint`, plus this process (which hosts the simulated nodes).
//!
//! Read from `/proc`: `VmHWM` of `/proc/<pid>/status` is the kernel's own peak resident set,
//! so sampling cannot miss a short peak; `utime + stime` of `/proc/<pid>/stat` is cumulative,
//! so the CPU a run cost is the last sample minus the first. Against a remote cluster only
//! this process is found, and the report says so by listing just it.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::record::{Record, Recorder};

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, 100 on every Linux ABI
/// (it is fixed for user space, independent of the kernel's internal `HZ`).
const USER_HZ: u64 = 100;

/// One sample of one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub pid: u32,
    pub name: String,
    pub hwm_kb: u64,
    pub cpu_ms: u64,
}

/// `VmHWM` in kB from the text of `/proc/<pid>/status`.
pub fn parse_hwm_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `utime + stime` in milliseconds from the text of `/proc/<pid>/stat`.
pub fn parse_cpu_ms(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces: split after the
    // last ')'. utime and stime are fields 14 and 15, i.e. 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) * 1000 / USER_HZ)
}

/// Samples one process (`None` when it is gone or unreadable).
pub fn sample(pid: u32, name: &str) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Sample {
        pid,
        name: name.into(),
        hwm_kb: parse_hwm_kb(&status)?,
        cpu_ms: parse_cpu_ms(&stat)?,
    })
}

/// This process and every other process whose executable is named `setpoint`, with a name
/// saying which is which (the first arguments of their command line).
pub fn setpoint_processes() -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut out = vec![(me, "this process (driver + simulated nodes)".to_string())];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(exe) = std::fs::read_link(e.path().join("exe")) else {
            continue;
        };
        if exe.file_name().and_then(|n| n.to_str()) != Some("setpoint") {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .skip(1)
            .take(2)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .filter(|a| !a.is_empty())
            .collect();
        out.push((pid, format!("setpoint {}", args.join(" "))));
    }
    out
}

/// Samples the Setpoint processes every `every` into the log until stopped (and once more at
/// the stop, so the CPU figure covers the whole run).
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Starts sampling now.
    pub fn start(rec: Recorder, every: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let procs = setpoint_processes();
            loop {
                for (pid, name) in &procs {
                    if let Some(s) = sample(*pid, name) {
                        rec.record(Record::Process {
                            pid: s.pid,
                            name: s.name,
                            hwm_kb: s.hwm_kb,
                            cpu_ms: s.cpu_ms,
                        });
                    }
                }
                if *stopped.borrow() {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stopped.changed() => {}
                }
            }
        });
        Sampler { stop, task }
    }

    /// Takes the last sample and stops.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_stat() {
        let status = "Name:\tsetpoint\nVmPeak:\t  100 kB\nVmHWM:\t   52344 kB\nVmRSS:\t 1 kB\n";
        assert_eq!(parse_hwm_kb(status), Some(52344));
        assert_eq!(parse_hwm_kb("Name: x\n"), None);
        // A name with spaces and parentheses must not shift the fields.
        let stat = "42 (set (point) x) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 8 0 1000";
        assert_eq!(parse_cpu_ms(stat), Some(2800));
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id(), "me").expect("own /proc entry");
        assert!(s.hwm_kb > 0);
        assert_eq!(setpoint_processes()[0].0, std::process::id());
    }
}
