//! A throwaway single-member etcd for tests: started from the installed `etcd` binary on free
//! loopback ports in a temporary directory, and killed (by its PID) when dropped.
//!
//! When `etcd` is not installed, [`TestEtcd::start`] returns `None` after saying so, unless
//! `SETPOINT_REQUIRE_ETCD` is set (CI sets it), in which case it panics: a CI run must not
//! pass by skipping. `SETPOINT_ETCD_BIN` names another binary.
//!
//! Shared by the store's and the command's tests (included with `#[path]`), so not every
//! item is used by every test crate.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long etcd may take to start answering.
const START_DEADLINE: Duration = Duration::from_secs(30);

/// TLS files for a server started with [`TestEtcd::start_tls`].
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// A running etcd.
pub struct TestEtcd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// The client URL, `http://127.0.0.1:PORT` (or `https://…` with TLS).
    pub url: String,
}

fn etcd_binary() -> String {
    std::env::var("SETPOINT_ETCD_BIN").unwrap_or_else(|_| "etcd".to_owned())
}

/// Whether etcd can be run here; panics if it is required but missing.
pub fn etcd_available() -> bool {
    let found = Command::new(etcd_binary())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !found {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_ETCD").is_none(),
            "SETPOINT_REQUIRE_ETCD is set but `{}` cannot be run (apt-get install etcd-server)",
            etcd_binary()
        );
        eprintln!("etcd is not installed; skipping (apt-get install etcd-server to run this)");
    }
    found
}

/// A key prefix no other caller in this process gets. Fixed-width numbers keep any two of
/// them from being prefixes of each other.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    format!("/{tag}-{}-{n:05}", std::process::id())
}

/// Two currently free loopback ports (the OS could hand them out again before etcd binds
/// them; [`TestEtcd::start`] retries on that).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

impl TestEtcd {
    /// Starts etcd over plain HTTP, or returns `None` when it is not installed (see the module
    /// docs).
    pub fn start() -> Option<TestEtcd> {
        if !etcd_available() {
            return None;
        }
        Some(Self::start_with(None))
    }

    /// Starts etcd serving HTTPS with these files and requiring client certificates signed by
    /// the same CA.
    pub fn start_tls(tls: &TlsFiles) -> Option<TestEtcd> {
        if !etcd_available() {
            return None;
        }
        Some(Self::start_with(Some(tls)))
    }

    fn start_with(tls: Option<&TlsFiles>) -> TestEtcd {
        let mut last_log = String::new();
        for attempt in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let (client_port, peer_port) = free_ports();
            let scheme = if tls.is_some() { "https" } else { "http" };
            let url = format!("{scheme}://127.0.0.1:{client_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let log_path = dir.path().join(format!("etcd-{attempt}.log"));
            let log = std::fs::File::create(&log_path).unwrap();
            let mut cmd = Command::new(etcd_binary());
            cmd.arg("--name")
                .arg("test")
                .arg("--data-dir")
                .arg(dir.path().join(format!("data-{attempt}")))
                .arg("--listen-client-urls")
                .arg(&url)
                .arg("--advertise-client-urls")
                .arg(&url)
                .arg("--listen-peer-urls")
                .arg(&peer)
                .arg("--initial-advertise-peer-urls")
                .arg(&peer)
                .arg("--initial-cluster")
                .arg(format!("test={peer}"))
                .arg("--logger")
                .arg("zap")
                .arg("--log-level")
                .arg("warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log);
            if let Some(t) = tls {
                cmd.arg("--cert-file")
                    .arg(&t.server_cert)
                    .arg("--key-file")
                    .arg(&t.server_key)
                    .arg("--trusted-ca-file")
                    .arg(&t.ca)
                    .arg("--client-cert-auth");
            }
            let child = cmd.spawn().expect("start etcd");
            let mut etcd = TestEtcd {
                child: Some(child),
                dir,
                url,
            };
            match etcd.wait_ready(client_port, tls.is_some()) {
                Ok(()) => return etcd,
                Err(why) => {
                    last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    eprintln!("etcd attempt {attempt} failed: {why}");
                    etcd.kill();
                }
            }
        }
        panic!("etcd did not start; its log:\n{last_log}");
    }

    /// Polls until etcd answers (its `/health` over HTTP, or a TCP connection for HTTPS),
    /// within [`START_DEADLINE`]; fails early if the process exits.
    fn wait_ready(&mut self, port: u16, tls: bool) -> Result<(), String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("etcd exited with {status}"));
            }
            let ready = if tls {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            } else {
                healthy(port)
            };
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("etcd not ready after {START_DEADLINE:?}"));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The etcd process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The temporary directory etcd runs in (tests may put their own files there too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills etcd (SIGKILL to its PID) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether etcd on this loopback port reports itself healthy.
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}
