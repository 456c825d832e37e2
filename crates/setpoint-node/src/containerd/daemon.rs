//! A private containerd run as the agent's child process, and finding a running one.
//!
//! Everything of a private instance lives under one directory: `config.toml`, `root/`,
//! `state/`, the CNI network list under `cni/net.d/` with `host-local`'s records under
//! `cni/ipam/`, `containerd.log` (its stdout and stderr), and its socket (unless the
//! directory's path is too long for one, see [`config::socket_path`]).
//!
//! The child is started by a thread that lives exactly as long as it: the thread spawns
//! it, waits for it and records its exit. The child asks the kernel for SIGKILL when that
//! thread goes away (`PR_SET_PDEATHSIG` follows the spawning thread, not the process), so
//! containerd dies with the agent even when the agent is killed with SIGKILL. Containers
//! outlive both: their shims are not containerd's children in that sense and keep running,
//! as under any containerd restart.

// Stopping the daemon is `kill`; its death signal is armed by `crate::deathsig`.
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::config::{self, CniNetwork, ContainerdConfig};
use super::image::PAUSE_IMAGE;
use super::ContainerdError;

/// The socket of a system containerd (the distribution packages' default).
pub const SYSTEM_SOCKET: &str = "/run/containerd/containerd.sock";

/// How to run a private containerd.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// The sandbox image the CRI plugin runs in every pod ([`PAUSE_IMAGE`] by default); it
    /// must be imported before the first pod (see [`super::ensure_local_images`]).
    pub sandbox_image: String,
    /// The bridge device of the pod network (at most 15 bytes); also the CNI network name.
    pub bridge: String,
    /// The pod subnet, e.g. `10.222.3.0/24`.
    pub subnet: String,
    /// The containerd binary (found on `PATH` by default).
    pub binary: PathBuf,
    /// Where the socket goes when the data dir's path is too long for one.
    pub short_socket_dir: PathBuf,
    /// How long to wait for the socket to accept connections.
    pub start_timeout: Duration,
    /// How long [`ContainerdDaemon::stop`] waits after SIGTERM before SIGKILL.
    pub stop_timeout: Duration,
}

impl DaemonOptions {
    /// Defaults for a pod network on `bridge` with `subnet`.
    pub fn new(bridge: impl Into<String>, subnet: impl Into<String>) -> Self {
        DaemonOptions {
            sandbox_image: PAUSE_IMAGE.to_string(),
            bridge: bridge.into(),
            subnet: subnet.into(),
            binary: PathBuf::from("containerd"),
            short_socket_dir: PathBuf::from("/run/setpoint"),
            start_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

/// How the child ended, once it has; shared with the thread that waits for it.
type ExitState = Arc<(Mutex<Option<ExitStatus>>, Condvar)>;

/// A running private containerd. Stopped by [`stop`](Self::stop) or, failing that, on drop.
#[derive(Debug)]
pub struct ContainerdDaemon {
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    pid: i32,
    exit: ExitState,
    stop_timeout: Duration,
}

impl ContainerdDaemon {
    /// Writes the config and CNI network list under `dir`, starts containerd and waits until
    /// its socket accepts connections (or it exits, or `options.start_timeout` passes).
    pub async fn start(dir: &Path, options: DaemonOptions) -> Result<Self, ContainerdError> {
        let dir = std::path::absolute(dir)
            .map_err(ContainerdError::io(format!("resolving {}", dir.display())))?;
        if options.bridge.is_empty() || options.bridge.len() > 15 {
            return Err(ContainerdError::Start(format!(
                "bridge name {:?} must have 1 to 15 bytes",
                options.bridge
            )));
        }
        let cni_bin_dir = config::find_cni_bin_dir().ok_or_else(|| {
            ContainerdError::Missing(format!(
                "no CNI plugins ({}) in {}: install them (Debian: `apt-get install containernetworking-plugins`)",
                config::CNI_PLUGINS.join(", "),
                config::CNI_BIN_DIRS.join(" or ")
            ))
        })?;
        let root = dir.join("root");
        let state = dir.join("state");
        let conf_dir = dir.join("cni").join("net.d");
        let ipam_dir = dir.join("cni").join("ipam");
        for d in [&dir, &root, &state, &conf_dir, &ipam_dir] {
            std::fs::create_dir_all(d)
                .map_err(ContainerdError::io(format!("creating {}", d.display())))?;
        }
        let socket = config::socket_path(&dir, &options.short_socket_dir);
        if let Some(parent) = socket.parent() {
            std::fs::create_dir_all(parent).map_err(ContainerdError::io(format!(
                "creating {}",
                parent.display()
            )))?;
        }
        if socket.exists() {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Err(ContainerdError::Start(format!(
                    "another containerd already serves {}",
                    socket.display()
                )));
            }
            // Left by a containerd that was killed: nothing listens, so it is safe to remove.
            let _ = std::fs::remove_file(&socket);
            let _ = std::fs::remove_file(ttrpc_path(&socket));
        }
        let config_text = config::containerd_config_toml(&ContainerdConfig {
            root,
            state,
            address: socket.clone(),
            sandbox_image: options.sandbox_image.clone(),
            cni_bin_dir,
            cni_conf_dir: conf_dir.clone(),
            disable_apparmor: !config::apparmor_available(),
        });
        let config_file = dir.join("config.toml");
        write(&config_file, &config_text)?;
        let conflist = config::cni_conflist(&CniNetwork {
            name: options.bridge.clone(),
            bridge: options.bridge.clone(),
            subnet: options.subnet.clone(),
            ipam_data_dir: ipam_dir,
        });
        write(&conf_dir.join("10-setpoint.conflist"), &conflist)?;

        let log = dir.join("containerd.log");
        let (pid, exit) = spawn_supervised(&options.binary, &config_file, &log)?;
        let daemon = ContainerdDaemon {
            dir,
            socket,
            log,
            pid,
            exit,
            stop_timeout: options.stop_timeout,
        };
        tracing::info!(pid, socket = %daemon.socket.display(), "started containerd");
        let deadline = Instant::now() + options.start_timeout;
        loop {
            if let Some(status) = daemon.exit_status() {
                return Err(ContainerdError::Start(format!(
                    "it exited ({status}); its log {} ends with:\n{}",
                    daemon.log.display(),
                    tail(&daemon.log, 20)
                )));
            }
            if tokio::net::UnixStream::connect(&daemon.socket)
                .await
                .is_ok()
            {
                return Ok(daemon);
            }
            if Instant::now() >= deadline {
                return Err(ContainerdError::Start(format!(
                    "{} did not accept connections within {:?}; its log {} ends with:\n{}",
                    daemon.socket.display(),
                    options.start_timeout,
                    daemon.log.display(),
                    tail(&daemon.log, 20)
                )));
                // Dropping `daemon` stops the process.
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The gRPC socket (CRI and containerd's own API).
    pub fn endpoint(&self) -> &Path {
        &self.socket
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// How it ended, if it has.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *lock(&self.exit.0)
    }

    /// Stops containerd: SIGTERM, then SIGKILL if it has not exited after the stop timeout.
    /// Returns how it ended. Containers keep running (their shims are independent).
    pub async fn stop(&self) -> Result<ExitStatus, ContainerdError> {
        if let Some(status) = self.exit_status() {
            return Ok(status);
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + self.stop_timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::warn!(pid = self.pid, "containerd ignored SIGTERM; killing it");
        self.signal(libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(ContainerdError::Start(format!(
            "containerd (pid {}) did not exit after SIGKILL",
            self.pid
        )))
    }

    /// The blocking form of [`stop`](Self::stop), for drop.
    fn stop_blocking(&self) {
        if self.exit_status().is_some() {
            return;
        }
        self.signal(libc::SIGTERM);
        if self.wait_blocking(self.stop_timeout).is_none() {
            self.signal(libc::SIGKILL);
            let _ = self.wait_blocking(Duration::from_secs(5));
        }
    }

    fn wait_blocking(&self, timeout: Duration) -> Option<ExitStatus> {
        let (state, changed) = &*self.exit;
        let guard = lock(state);
        let (guard, _) = changed
            .wait_timeout_while(guard, timeout, |s| s.is_none())
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }

    fn signal(&self, sig: libc::c_int) {
        // Only while the waiting thread has not reaped it: afterwards the pid may be reused.
        let guard = lock(&self.exit.0);
        if guard.is_none() {
            // SAFETY: kill has no memory effects; the pid is our unreaped child (a zombie at
            // worst), so it cannot name another process while the lock is held.
            unsafe {
                libc::kill(self.pid, sig);
            }
        }
    }
}

impl Drop for ContainerdDaemon {
    fn drop(&mut self) {
        self.stop_blocking();
    }
}

/// `containerd --version` of `binary`, e.g. `containerd github.com/containerd/containerd
/// 1.6.20 ...`, for reporting (the node's `containerRuntimeVersion` comes from CRI).
pub fn version(binary: &Path) -> Result<String, ContainerdError> {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| not_found_or(binary, e))?;
    if !out.status.success() {
        return Err(ContainerdError::Command {
            command: format!("{} --version", binary.display()),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The socket of a running system containerd ([`SYSTEM_SOCKET`]), if it accepts
/// connections.
pub fn find_system_endpoint() -> Option<PathBuf> {
    let socket = PathBuf::from(SYSTEM_SOCKET);
    std::os::unix::net::UnixStream::connect(&socket)
        .ok()
        .map(|_| socket)
}

/// The containerd a node agent uses: a running system one, or its own private child.
#[derive(Debug)]
pub enum LocalContainerd {
    /// A containerd someone else runs, at this socket. Its own configuration applies: its
    /// sandbox image and CNI network are whatever it was set up with.
    System(PathBuf),
    /// A containerd started under the agent's data dir, stopped with the agent.
    Private(ContainerdDaemon),
}

impl LocalContainerd {
    /// Uses a running system containerd ([`find_system_endpoint`]) if there is one, else
    /// starts a private one under `dir` with `options` (as k3s does with its bundled one).
    pub async fn find_or_start(
        dir: &Path,
        options: DaemonOptions,
    ) -> Result<Self, ContainerdError> {
        if let Some(socket) = find_system_endpoint() {
            tracing::info!(socket = %socket.display(), "using the running containerd");
            return Ok(LocalContainerd::System(socket));
        }
        Ok(LocalContainerd::Private(
            ContainerdDaemon::start(dir, options).await?,
        ))
    }

    /// The socket to talk CRI (and containerd's API) on.
    pub fn endpoint(&self) -> &Path {
        match self {
            LocalContainerd::System(socket) => socket,
            LocalContainerd::Private(daemon) => daemon.endpoint(),
        }
    }

    /// Stops the private containerd; a system one is left alone.
    pub async fn stop(&self) -> Result<(), ContainerdError> {
        match self {
            LocalContainerd::System(_) => Ok(()),
            LocalContainerd::Private(daemon) => daemon.stop().await.map(|_| ()),
        }
    }
}

fn ttrpc_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_os_string();
    s.push(".ttrpc");
    PathBuf::from(s)
}

fn write(path: &Path, text: &str) -> Result<(), ContainerdError> {
    std::fs::write(path, text).map_err(ContainerdError::io(format!("writing {}", path.display())))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn not_found_or(binary: &Path, e: std::io::Error) -> ContainerdError {
    if e.kind() == std::io::ErrorKind::NotFound {
        ContainerdError::Missing(format!(
            "{} not found: install containerd and runc (Debian: `apt-get install containerd runc`)",
            binary.display()
        ))
    } else {
        ContainerdError::io(format!("running {}", binary.display()))(e)
    }
}

/// The last `n` lines of a file, for error messages.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Starts `binary --config <config>` from a thread that then waits for it; returns its pid
/// and the shared exit state the thread fills in.
fn spawn_supervised(
    binary: &Path,
    config_file: &Path,
    log: &Path,
) -> Result<(i32, ExitState), ContainerdError> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(ContainerdError::io(format!("opening {}", log.display())))?;
    let log_err = log_file
        .try_clone()
        .map_err(ContainerdError::io("duplicating the log descriptor"))?;
    let mut command = std::process::Command::new(binary);
    command
        .arg("--config")
        .arg(config_file)
        .stdin(std::process::Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        // Its own process group: a terminal's Ctrl-C reaches the agent, which stops
        // containerd in order, rather than both at once.
        .process_group(0);
    // Dies with the agent: the supervising thread spawning it lives as long as the agent.
    crate::deathsig::die_with_parent(&mut command);
    let exit: ExitState = Arc::new((Mutex::new(None), Condvar::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let thread_exit = exit.clone();
    let binary_owned = binary.to_path_buf();
    std::thread::Builder::new()
        .name("containerd-wait".into())
        .spawn(move || {
            let mut child = match command.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = tx.send(Err(not_found_or(&binary_owned, e)));
                    return;
                }
            };
            let _ = tx.send(Ok(child.id() as i32));
            // This thread is the child's parent for PR_SET_PDEATHSIG: it stays until the
            // child is gone. It waits without reaping first, so the child is reaped only
            // under the state lock: a signal sent under that lock never reaches a reused pid.
            let pid = child.id() as libc::id_t;
            loop {
                // SAFETY: `info` is a plain struct waitid fills in.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                let rc = unsafe {
                    libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT)
                };
                if rc == 0 {
                    break;
                }
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "waiting for containerd failed");
                    break;
                }
            }
            let (state, changed) = &*thread_exit;
            let mut guard = lock(state);
            let status = match child.wait() {
                Ok(status) => status,
                Err(e) => {
                    tracing::error!(error = %e, "reaping containerd failed");
                    return;
                }
            };
            *guard = Some(status);
            drop(guard);
            changed.notify_all();
            tracing::info!(%status, "containerd exited");
        })
        .map_err(ContainerdError::io("starting the containerd wait thread"))?;
    let pid = rx
        .recv()
        .map_err(|_| ContainerdError::Start("the containerd wait thread ended".into()))??;
    Ok((pid, exit))
}
