//! Peak RSS and CPU seconds of the Setpoint processes serving the benchmarked cluster on this
//! machine, plus this process (which hosts the simulated nodes).
//!
//! A process counts when its executable is named `setpoint` and it either listens on the API
//! server's port or names the kubeconfig (or the directory holding it) on its command line —
//! so `setpoint up` and components started against it count, while other clusters' processes
//! on a shared machine do not.
//!
//! Read from `/proc`: `VmHWM` of `/proc/<pid>/status` is the kernel's own peak resident set,
//! so sampling cannot miss a short peak; `utime + stime` of `/proc/<pid>/stat` is cumulative,
//! so the CPU a run cost is the last sample minus the first. Against a remote cluster only
//! this process is found, and the report says so by listing just it.
//!
//! `VmHWM` is a peak over the process's life, and a reused `setpoint up` may have peaked
//! before the run. So the sampler first resets it to the current resident set (writing `5`
//! to `/proc/<pid>/clear_refs`, which only the process's owner or root may do) and logs
//! whether that worked; the report then says, per process, whether its peak is the run's.

use std::path::Path;
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
    /// The process id.
    pub pid: u32,
    /// What the report calls the process (see [`setpoint_processes`]).
    pub name: String,
    /// Peak resident set so far, in kB (`VmHWM`).
    pub hwm_kb: u64,
    /// User plus system CPU time so far, in milliseconds.
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

/// Which local processes belong to the cluster under test.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// The API server's port, when it is on this machine.
    pub port: Option<u16>,
    /// Strings whose presence in a command line ties the process to the cluster.
    pub mentions: Vec<String>,
}

impl Scope {
    /// The scope of the cluster at `server` (a URL), reached through the kubeconfig at `path`.
    pub fn for_cluster(server: &str, kubeconfig: Option<&Path>) -> Self {
        let authority = server
            .split("://")
            .nth(1)
            .unwrap_or(server)
            .split('/')
            .next()
            .unwrap_or("");
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()),
            None => (authority, None),
        };
        let local = matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "0.0.0.0");
        let mut mentions = Vec::new();
        if let Some(p) = kubeconfig {
            let p = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
            mentions.push(p.display().to_string());
            if let Some(dir) = p.parent().filter(|d| d.parent().is_some()) {
                mentions.push(dir.display().to_string());
            }
        }
        Scope {
            port: if local { port } else { None },
            mentions,
        }
    }
}

/// Inodes of the sockets listening on `port` in the text of `/proc/net/tcp` or `tcp6`.
pub fn listening_inodes(tcp: &str, port: u16) -> Vec<u64> {
    tcp.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            let listening = *f.get(3)? == "0A";
            (listening && u16::from_str_radix(local_port, 16).ok()? == port)
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// Resets the peak resident set (`VmHWM`) of `pid` to its current size; whether it could.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), b"5").is_ok()
}

/// This process and the `setpoint` processes in `scope`, with names saying which is which
/// (the first arguments of their command line).
pub fn setpoint_processes(scope: &Scope) -> Vec<(u32, String)> {
    let me = std::process::id();
    let mut out = vec![(
        me,
        "this process (benchmark, and the nodes it hosts)".to_string(),
    )];
    let sockets: Vec<String> = scope
        .port
        .map(|port| {
            ["/proc/net/tcp", "/proc/net/tcp6"]
                .iter()
                .filter_map(|f| std::fs::read_to_string(f).ok())
                .flat_map(|t| listening_inodes(&t, port))
                .map(|i| format!("socket:[{i}]"))
                .collect()
        })
        .unwrap_or_default();
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
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let mentioned = args
            .iter()
            .any(|a| scope.mentions.iter().any(|m| a.contains(m.as_str())));
        let listens = !sockets.is_empty()
            && std::fs::read_dir(e.path().join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| sockets.iter().any(|s| l.as_os_str() == s.as_str()))
                })
            });
        if mentioned || listens {
            let shown: Vec<&str> = args.iter().skip(1).take(3).map(String::as_str).collect();
            out.push((pid, format!("setpoint {}", shown.join(" ").trim())));
        }
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
    pub fn start(rec: Recorder, scope: Scope, every: Duration) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let procs = setpoint_processes(&scope);
            for (pid, _) in &procs {
                rec.record(Record::PeakReset {
                    pid: *pid,
                    reset: reset_peak(*pid),
                });
            }
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
    fn resets_the_peak_of_this_process() {
        // Touch 64 MiB and give it back: the peak stays above the resident set until reset.
        let big = vec![1u8; 64 << 20];
        assert_eq!(big.iter().map(|b| *b as u64).sum::<u64>(), 64 << 20);
        drop(big);
        let read = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let rss: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap();
            (parse_hwm_kb(&status).unwrap(), rss)
        };
        let (before, _) = read();
        assert!(reset_peak(std::process::id()));
        let (after, rss) = read();
        assert!(after < before, "peak {before} kB -> {after} kB");
        // Reset to the resident set at that moment (which may have grown a little since).
        assert!(after <= rss + 1024, "peak {after} kB, resident {rss} kB");
        assert!(!reset_peak(u32::MAX), "no such process");
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id(), "me").expect("own /proc entry");
        assert!(s.hwm_kb > 0);
        assert_eq!(
            setpoint_processes(&Scope::default())[0].0,
            std::process::id()
        );
    }

    #[test]
    fn scope_of_a_local_and_a_remote_cluster() {
        let s = Scope::for_cluster(
            "https://127.0.0.1:6443",
            Some(Path::new("/nonexistent/d/kubeconfig")),
        );
        assert_eq!(s.port, Some(6443));
        assert_eq!(
            s.mentions,
            vec![
                "/nonexistent/d/kubeconfig".to_string(),
                "/nonexistent/d".to_string()
            ]
        );
        let r = Scope::for_cluster("https://10.1.2.3:443/prefix", None);
        assert_eq!(r, Scope::default());
    }

    #[test]
    fn finds_listening_sockets_by_port() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:192B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0\n\
   1: 0100007F:192B 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0\n\
   2: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0\n";
        assert_eq!(listening_inodes(tcp, 6443), vec![4242]);
        assert_eq!(listening_inodes(tcp, 80), vec![4444]);
        assert!(listening_inodes(tcp, 1).is_empty());
    }
}
