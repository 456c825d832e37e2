//! `exec` and `attach` for process containers.
//!
//! A process container has no cgroup of its own: it is a process of the node with an
//! environment and a working directory (and, with a pod network, the pod's network namespace,
//! [`super::netns`], which the command joins too). So `exec` starts the command as another such
//! process, with the environment and working directory the container's running workload has
//! (read from `/proc/<pid>/environ` and `/proc/<pid>/cwd`, so it is exactly what the
//! container got, `$(VAR)` expansions included), over pipes, or on a new pseudo-terminal
//! when the client asks for a TTY (the command is the session leader with the terminal as
//! its controlling terminal, and resizes are applied with `TIOCSWINSZ`).
//!
//! A container with volume mounts runs in a mount namespace of its own
//! ([`super::mounts`]): the command joins it (and the workload's directory as the container
//! sees it), so it sees the mounted files as the workload does.
//!
//! `attach` streams what the workload writes from now on (its run's log, followed, so
//! stdout and stderr arrive merged, as the log holds them) until the workload exits or the
//! client leaves. Workloads read `/dev/null` ([`super::launch`]), so there is no stdin to
//! attach to: a container that asks for `stdin` is refused ([`crate::unsupported::in_process`]),
//! and what a client sends to another one is discarded, as a container without `stdin` does
//! under the kubelet.

// openpty, setsid, TIOCSCTTY and TIOCSWINSZ are system calls.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinHandle;

use std::sync::Arc;

use super::mounts::Joined;
use super::{logs, run_handle, ProcessRuntime};
use crate::runtime::{
    ExecRequest, LogOptions, RuntimeError, RuntimePod, StreamIo, StreamWriter, TerminalSize,
};

/// How much one copy moves at a time.
const CHUNK: usize = 32 * 1024;

/// What `exec` needs from the container's running workload.
struct Workload {
    pid: i32,
    /// Its start time (clock ticks since boot; 0 when unknown).
    start: u64,
    env: Vec<(String, String)>,
    cwd: PathBuf,
}

/// The environment of a running process, as it was given at its start.
fn environ(pid: i32) -> std::io::Result<Vec<(String, String)>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect())
}

/// The exit code a shell would report: the code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Copies `from` into `to` until `from` ends or `to` fails; closes `to` at the end.
async fn copy(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            // A pty master reads EIO once the terminal's last user closed it: its end.
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown().await;
}

/// Sets a terminal's size.
fn set_size(fd: &OwnedFd, size: TerminalSize) {
    let ws = libc::winsize {
        ws_row: size.height,
        ws_col: size.width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize we own from a descriptor we own.
    unsafe {
        libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}

/// A new pseudo-terminal: (master, slave).
fn openpty() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut master = -1;
    let mut slave = -1;
    // SAFETY: openpty writes two descriptors into the integers we pass; no name, termios or
    // size is asked for.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    let fds = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&fds.0, &fds.1] {
        // SAFETY: fcntl on a descriptor we own; close-on-exec keeps them out of other
        // children (the command gets the slave through dup2, which clears the flag).
        unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(fds)
}

impl ProcessRuntime {
    /// The running workload of `container`, or why commands cannot run in it.
    async fn workload(&self, pod: &RuntimePod, container: &str) -> Result<Workload, RuntimeError> {
        let not_found = || RuntimeError::BadRequest(format!("container not found ({container:?})"));
        let entry = self.inner.pod_entry(&pod.uid).ok_or_else(not_found)?;
        let st = entry.lock().await;
        let run = st
            .record
            .containers
            .get(container)
            .and_then(|c| c.run.as_ref())
            .filter(|r| r.exit.is_none())
            .ok_or_else(not_found)?;
        if run.simulated {
            return Err(RuntimeError::BadRequest(format!(
                "container {container:?} is simulated (it has no command), so it has no process to run commands beside"
            )));
        }
        let pid = run.pid.ok_or_else(not_found)?;
        let gone = |e: std::io::Error| {
            RuntimeError::BadRequest(format!(
                "container {container:?} is not running (its process {pid}: {e})"
            ))
        };
        let env = environ(pid).map_err(gone)?;
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).map_err(gone)?;
        Ok(Workload {
            pid,
            start: run.pid_start.unwrap_or(0),
            env,
            cwd,
        })
    }

    /// Runs `request` beside the container's workload (see the [module docs](self)).
    pub(super) async fn exec_command(
        &self,
        pod: &RuntimePod,
        request: ExecRequest,
        io: StreamIo,
    ) -> Result<i32, RuntimeError> {
        let workload = self.workload(pod, &request.container).await?;
        let argv0 = request
            .command
            .first()
            .cloned()
            .ok_or_else(|| RuntimeError::BadRequest("no command".into()))?;
        let mut command = tokio::process::Command::new(&argv0);
        command
            .args(&request.command[1..])
            .env_clear()
            .envs(workload.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        // A container with volume mounts has a mount namespace of its own: the command runs
        // in it, so it sees the same files.
        let joined = Joined::of(workload.pid, workload.start, &workload.cwd).map_err(|e| {
            RuntimeError::Internal(format!(
                "failed to exec in container: entering its mount namespace: {e}"
            ))
        })?;
        // A pod with a network namespace of its own: the command runs in it, so it sees the
        // pod's interfaces and `localhost` is the pod's.
        let net = super::netns::Joined::of(workload.pid).map_err(|e| {
            RuntimeError::Internal(format!(
                "failed to exec in container: entering its network namespace: {e}"
            ))
        })?;
        if let Some(net) = &net {
            net.install(&mut command);
        }
        match joined {
            Some(joined) => Arc::new(joined).install(&mut command),
            None => {
                command.current_dir(&workload.cwd);
            }
        }
        tracing::debug!(pod = %pod.name, container = %request.container, workload = workload.pid, tty = request.tty, "exec");
        let start_error = |e: std::io::Error| {
            RuntimeError::Internal(format!(
                "failed to exec in container: starting {argv0:?}: {e}"
            ))
        };
        if request.tty {
            exec_on_terminal(command, io)
                .await
                .map_err(start_error)?
                .await
        } else {
            exec_on_pipes(command, io).await.map_err(start_error)
        }
    }

    /// Streams the workload's output from now on (see the [module docs](self)).
    pub(super) async fn attach_container(
        &self,
        pod: &RuntimePod,
        container: &str,
        io: StreamIo,
    ) -> Result<(), RuntimeError> {
        self.workload(pod, container).await?;
        let (log, active) = {
            let entry = self.inner.pod_entry(&pod.uid).ok_or_else(|| {
                RuntimeError::BadRequest(format!("container not found ({container:?})"))
            })?;
            let st = entry.lock().await;
            let run = st
                .record
                .containers
                .get(container)
                .and_then(|c| c.run.as_ref())
                .ok_or_else(|| {
                    RuntimeError::BadRequest(format!("container not found ({container:?})"))
                })?;
            (
                st.paths.run_file(container, run.index, "log"),
                run_handle(&st.paths, container, run),
            )
        };
        let options = LogOptions {
            follow: true,
            tail_lines: Some(0),
            ..LogOptions::default()
        };
        let mut stream = logs::open(&log, &options, Some(active))?;
        let StreamIo {
            stdin,
            stdout,
            stderr,
            ..
        } = io;
        // Nothing reads what the client sends; keep its stream drained so it never blocks.
        let drain = stdin.map(|mut s| {
            tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut s, &mut sink).await;
            })
        });
        let mut out: Option<StreamWriter> = stdout.or(stderr);
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { break };
            let Some(w) = out.as_mut() else { break };
            if w.write_all(&chunk).await.is_err() || w.flush().await.is_err() {
                break;
            }
        }
        if let Some(d) = drain {
            d.abort();
        }
        Ok(())
    }
}

/// Runs the command with pipes for the streams asked for, and `/dev/null` for the rest.
async fn exec_on_pipes(mut command: tokio::process::Command, io: StreamIo) -> std::io::Result<i32> {
    let pipe_or_null = |wanted: bool| {
        if wanted {
            Stdio::piped()
        } else {
            Stdio::null()
        }
    };
    command
        .stdin(pipe_or_null(io.stdin.is_some()))
        .stdout(pipe_or_null(io.stdout.is_some()))
        .stderr(pipe_or_null(io.stderr.is_some()))
        // Its own process group: signals meant for the agent's group never reach it.
        .process_group(0);
    let mut child = command.spawn()?;
    let feeder: Option<JoinHandle<()>> = match (io.stdin, child.stdin.take()) {
        (Some(from), Some(to)) => Some(tokio::spawn(copy(from, to))),
        _ => None,
    };
    let mut outputs = Vec::new();
    if let (Some(to), Some(from)) = (io.stdout, child.stdout.take()) {
        outputs.push(tokio::spawn(copy(from, to)));
    }
    if let (Some(to), Some(from)) = (io.stderr, child.stderr.take()) {
        outputs.push(tokio::spawn(copy(from, to)));
    }
    let status = child.wait().await?;
    // All output is passed on before the exit is reported.
    for o in outputs {
        let _ = o.await;
    }
    if let Some(f) = feeder {
        f.abort();
    }
    Ok(exit_code(status))
}

/// Starts the command on a new terminal; the returned future passes the streams and
/// resizes until the command exits, and yields its exit code.
async fn exec_on_terminal(
    mut command: tokio::process::Command,
    io: StreamIo,
) -> std::io::Result<impl std::future::Future<Output = Result<i32, RuntimeError>>> {
    use std::os::unix::process::CommandExt;
    let (master, slave) = openpty()?;
    command
        .stdin(Stdio::from(slave.try_clone()?))
        .stdout(Stdio::from(slave.try_clone()?))
        .stderr(Stdio::from(slave));
    // SAFETY: between fork and exec only async-signal-safe calls: setsid, then make the
    // terminal (already stdin) the controlling terminal of the new session.
    unsafe {
        command.as_std_mut().pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    // The command holds the only copies of the slave now (the Command dropped ours), so
    // reads of the master end when the command and its children are done with it.
    drop(command);
    let reader = tokio::fs::File::from_std(std::fs::File::from(master.try_clone()?));
    let writer = tokio::fs::File::from_std(std::fs::File::from(master.try_clone()?));
    let StreamIo {
        stdin,
        stdout,
        resize,
        ..
    } = io;
    let output = stdout.map(|to| tokio::spawn(copy(reader, to)));
    let feeder = stdin.map(|from| tokio::spawn(copy(from, writer)));
    let resizer = resize.map(|mut sizes| {
        tokio::spawn(async move {
            while let Some(size) = sizes.recv().await {
                set_size(&master, size);
            }
        })
    });
    Ok(async move {
        let status = child
            .wait()
            .await
            .map_err(|e| RuntimeError::Internal(format!("waiting for the command: {e}")))?;
        if let Some(o) = output {
            let _ = o.await;
        }
        for task in [feeder, resizer].into_iter().flatten() {
            task.abort();
        }
        Ok(exit_code(status))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_reads_this_process() {
        let env = environ(std::process::id() as i32).unwrap();
        assert!(env.iter().any(|(k, _)| k == "PATH"));
    }

    #[tokio::test]
    async fn pipes_pass_stdin_and_exit_codes() {
        let (mut stdin_w, stdin_r) = tokio::io::duplex(1024);
        let (stdout_w, mut stdout_r) = tokio::io::duplex(1024);
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", "cat; exit 3"]);
        let io = StreamIo {
            stdin: Some(Box::new(stdin_r)),
            stdout: Some(Box::new(stdout_w)),
            ..StreamIo::default()
        };
        let run = tokio::spawn(exec_on_pipes(command, io));
        stdin_w.write_all(b"data\n").await.unwrap();
        drop(stdin_w);
        let code = run.await.unwrap().unwrap();
        let mut out = String::new();
        stdout_r.read_to_string(&mut out).await.unwrap();
        assert_eq!((code, out.as_str()), (3, "data\n"));
    }

    #[tokio::test]
    async fn a_terminal_has_the_size_sent() {
        let (mut stdin_w, stdin_r) = tokio::io::duplex(1024);
        let (stdout_w, mut stdout_r) = tokio::io::duplex(64 * 1024);
        let (resize_tx, resize_rx) = tokio::sync::mpsc::channel(1);
        let mut command = tokio::process::Command::new("sh");
        // Reads a line first, so the size is set before stty looks.
        command.args(["-c", "read x; stty size; tty -s && echo onterm"]);
        let io = StreamIo {
            stdin: Some(Box::new(stdin_r)),
            stdout: Some(Box::new(stdout_w)),
            resize: Some(resize_rx),
            ..StreamIo::default()
        };
        let run = exec_on_terminal(command, io).await.unwrap();
        let run = tokio::spawn(run);
        resize_tx
            .send(TerminalSize {
                width: 91,
                height: 17,
            })
            .await
            .unwrap();
        // The resize is applied by a task; the line goes after it has been taken.
        setpoint_testing::eventually_within(
            std::time::Duration::from_secs(5),
            "the resize taken",
            || async { (resize_tx.capacity() == 1).then_some(()) },
        )
        .await;
        stdin_w.write_all(b"go\n").await.unwrap();
        let code = run.await.unwrap().unwrap();
        let mut out = String::new();
        stdout_r.read_to_string(&mut out).await.unwrap();
        assert_eq!(code, 0);
        assert!(out.contains("17 91"), "{out:?}");
        assert!(out.contains("onterm"), "{out:?}");
    }
}
