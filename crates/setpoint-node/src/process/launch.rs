//! Starting and stopping container processes.
//!
//! Each container run is supervised by a small `sh` wrapper that the runtime starts in a
//! new process group (so the container outlives the agent, terminal signals never reach it,
//! and the group can be signalled as one).
//! The wrapper starts the workload with its output appended to the run's log, writes the
//! workload's pid, waits for it and writes its exit status to a file — so the status is
//! known even when the agent was not running when the workload exited. The wrapper traps
//! TERM/HUP/INT with a handler (never ignores them), so the workload, which sh resets to
//! default dispositions, receives signals sent to the group as it would in a container.
//! (`sh` starts background commands with SIGINT and SIGQUIT ignored and cannot undo that;
//! where GNU `env --default-signal` exists the workload is started through it, which restores
//! every signal to its default.)
//!
//! Spawning is on the hot path of starting many pods: a plain spawn (no code run between
//! fork and exec) lets the standard library use `posix_spawn`, which does not copy the
//! agent's page tables — a `fork` of a large agent costs milliseconds per container. Only
//! when the agent itself was started with TERM, HUP, INT or QUIT ignored (which a child
//! would inherit and `sh` could not undo) does it fork and reset the dispositions in the
//! child, in a new session.

// Starting a process in its own group and signalling it are system calls (`pre_exec`, `kill`).
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Child;

use super::state::{alive, proc_stat};

/// The supervising script. Arguments: pid file, exit file, log file, then the argv.
/// Its variables have unusual names because variables imported from the environment stay
/// exported: a plain `rc` would overwrite a container variable of that name.
const WRAPPER: &str = r#"
__sp_pidfile=$1; __sp_exitfile=$2; __sp_log=$3; shift 3
trap '__sp_sig=1' TERM HUP INT
"$@" >>"$__sp_log" 2>&1 </dev/null &
__sp_child=$!
echo "$__sp_child" >"$__sp_pidfile.tmp" && mv -f "$__sp_pidfile.tmp" "$__sp_pidfile"
while :; do
  __sp_sig=0
  wait "$__sp_child"; __sp_rc=$?
  if [ "$__sp_sig" = 1 ] && [ "$__sp_rc" -gt 128 ]; then
    # A trapped signal interrupted wait; the workload may still be running.
    if kill -0 "$__sp_child" 2>/dev/null; then continue; fi
    wait "$__sp_child"; __sp_r=$?
    [ "$__sp_r" -ne 127 ] && __sp_rc=$__sp_r
  fi
  break
done
echo "$__sp_rc" >"$__sp_exitfile.tmp" && mv -f "$__sp_exitfile.tmp" "$__sp_exitfile"
"#;

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The workload's argv (already expanded).
    pub argv: Vec<String>,
    /// Its complete environment.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub workdir: PathBuf,
    /// The log file its stdout and stderr are appended to.
    pub log: PathBuf,
    /// Where the wrapper writes the workload's pid.
    pub pid_file: PathBuf,
    /// Where the wrapper writes the workload's exit status.
    pub exit_file: PathBuf,
    /// The container's own mount namespace, for a container with volume mounts
    /// ([`super::mounts`]); `None`: it runs in the node's.
    pub namespace: Option<std::sync::Arc<super::mounts::Namespace>>,
    /// The pod's own network namespace ([`super::netns`]), entered before the mount
    /// namespace; `None`: it runs in the node's.
    pub netns: Option<PathBuf>,
}

/// A started run.
#[derive(Debug)]
pub struct Launched {
    /// The wrapper process (the agent's child, to be awaited so it never stays a zombie).
    pub child: Child,
    /// Its pid (= its process group id).
    pub wrapper_pid: i32,
    /// Its start time from `/proc`.
    pub wrapper_start: u64,
    /// The workload's pid and start time, unless it ended before they could be read.
    pub workload: Option<(i32, u64)>,
}

/// Whether this process ignores a signal the wrapper must handle (an inherited `SIG_IGN`
/// survives `exec`, and `sh` cannot trap a signal ignored on entry).
fn inherits_ignored_signals() -> bool {
    static IGNORED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        [libc::SIGTERM, libc::SIGHUP, libc::SIGINT, libc::SIGQUIT]
            .into_iter()
            .any(|sig| {
                // SAFETY: querying (a null new action) changes nothing.
                unsafe {
                    let mut old: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                        && old.sa_sigaction == libc::SIG_IGN
                }
            })
    })
}

/// The argv prefix that restores every signal to its default for the workload, if this host
/// has one.
fn signal_reset_prefix() -> &'static [&'static str] {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    const PREFIX: &[&str] = &["/usr/bin/env", "--default-signal"];
    let supported = *SUPPORTED.get_or_init(|| {
        std::process::Command::new(PREFIX[0])
            .args(&PREFIX[1..])
            .arg("true")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if supported {
        PREFIX
    } else {
        &[]
    }
}

/// Starts the wrapper and waits (briefly) for it to report the workload's pid.
pub async fn launch(spec: &LaunchSpec) -> std::io::Result<Launched> {
    let mut cmd = tokio::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(WRAPPER)
        .arg("setpoint-container")
        .arg(&spec.pid_file)
        .arg(&spec.exit_file)
        .arg(&spec.log)
        .args(signal_reset_prefix())
        .args(&spec.argv)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if !inherits_ignored_signals() {
        cmd.process_group(0);
    } else {
        // SAFETY: setsid and signal are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // A container starts with default signal handling, whatever the agent inherited
                // (the C library refuses to change the two signals it reserves; that is fine).
                for sig in 1..libc::SIGRTMAX() {
                    if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                        libc::signal(sig, libc::SIG_DFL);
                    }
                }
                Ok(())
            });
        }
    }
    if let Some(netns) = &spec.netns {
        super::netns::install(&mut cmd, netns).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "opening the pod's network namespace {}: {e}",
                    netns.display()
                ),
            )
        })?;
    }
    match &spec.namespace {
        // The child enters the working directory itself, after mounting: it may be inside a
        // volume.
        Some(namespace) => namespace.install(&mut cmd),
        None => {
            cmd.current_dir(&spec.workdir);
        }
    }
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => match &spec.namespace {
            Some(namespace) => return Err(std::io::Error::new(e.kind(), namespace.explain(&e))),
            None => return Err(e),
        },
    };
    let wrapper_pid = child.id().map(|p| p as i32).unwrap_or(0);
    let wrapper_start = proc_stat(wrapper_pid).map(|s| s.start).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut workload = None;
    loop {
        if let Some(pid) = read_i32(&spec.pid_file) {
            workload = proc_stat(pid).map(|s| (pid, s.start)).or(Some((pid, 0)));
            break;
        }
        if child.try_wait()?.is_some() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(Launched {
        child,
        wrapper_pid,
        wrapper_start,
        workload,
    })
}

/// Reads a file holding one integer.
pub fn read_i32(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Identifies one run's processes for signalling and liveness checks.
#[derive(Clone, Debug)]
pub struct RunHandle {
    /// Wrapper pid (the process group).
    pub wrapper_pid: i32,
    /// Wrapper start time.
    pub wrapper_start: u64,
    /// Workload pid and start time, when known.
    pub workload: Option<(i32, u64)>,
    /// The run's exit file.
    pub exit_file: PathBuf,
}

impl RunHandle {
    /// Whether the wrapper still runs.
    pub fn wrapper_alive(&self) -> bool {
        alive(self.wrapper_pid, self.wrapper_start)
    }

    /// Whether the workload still runs (its exit status not yet written and its process, or
    /// failing that its wrapper, alive).
    pub fn running(&self) -> bool {
        if self.exit_file.exists() {
            return false;
        }
        match self.workload {
            Some((pid, start)) if start != 0 => alive(pid, start),
            _ => self.wrapper_alive(),
        }
    }

    fn signal_group(&self, signal: i32) {
        // Only signal a group whose leader is still ours, or whose workload is: a pid (and
        // so a group id) may have been reused once both are gone.
        let ours = self.wrapper_alive()
            || self
                .workload
                .is_some_and(|(pid, start)| start != 0 && alive(pid, start));
        if ours && self.wrapper_pid > 0 {
            // SAFETY: plain syscall on a process group we started.
            unsafe {
                libc::kill(-self.wrapper_pid, signal);
            }
        }
    }

    /// Stops the run as Kubernetes stops a container: SIGTERM to its process group, SIGKILL
    /// after `grace`, and returns once the workload and the wrapper have exited. Whatever
    /// else is left in the group is killed too (a container's processes end with it).
    pub async fn terminate(&self, grace: Duration) {
        if !self.running() && !self.wrapper_alive() {
            return;
        }
        self.signal_group(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while self.running() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.running() {
            self.signal_group(libc::SIGKILL);
        }
        // Let the wrapper record the exit status before anything left in the group is killed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while (self.running() || (self.wrapper_alive() && !self.exit_file.exists()))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.kill_leftovers();
    }

    /// Kills what is left of the run's process group after its workload ended.
    pub fn kill_leftovers(&self) {
        if self.wrapper_pid > 0 {
            // SAFETY: plain syscall; ESRCH when the group is empty is fine.
            unsafe {
                libc::kill(-self.wrapper_pid, libc::SIGKILL);
            }
        }
    }
}
