//! A private containerd for one test: its own temporary directory, a pod subnet and bridge
//! no other test running at the same time (or a user's cluster) uses, and the local images
//! imported. Everything it made is removed when it is dropped.
//!
//! Subnets are `10.222.<x>.0/24` with bridge `sp-t<x>`; a test owns `x` while it holds an
//! exclusive `flock` on `net-<x>.lock` in a shared directory under the system temp dir, so
//! parallel tests in any number of processes never share one, and a test killed outright
//! releases its lock with its process. An `x` whose subnet is already on a host interface
//! is skipped. Its containerd's directory is `run-<x>` in the same shared directory, so
//! whatever a killed test left there is cleared by the next test to take `x`.

// flock, geteuid, kill and umount2 are system calls.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::config::{find_cni_bin_dir, CNI_BIN_DIRS, CNI_PLUGINS};
use super::daemon::{ContainerdDaemon, DaemonOptions};
use super::image::{ensure_local_images, host_busybox, CRI_NAMESPACE};

/// The variable that turns a missing prerequisite from a skip into a failure (CI sets it).
pub const REQUIRE_ENV: &str = "SETPOINT_REQUIRE_CONTAINERD";

/// A containerd started for one test. See the module documentation.
#[derive(Debug)]
pub struct TestContainerd {
    daemon: Option<ContainerdDaemon>,
    endpoint: PathBuf,
    dir: PathBuf,
    bridge: String,
    subnet: String,
    _lock: std::fs::File,
}

impl TestContainerd {
    /// Starts one, or returns `None` after printing why when this machine cannot run it (not
    /// root, containerd, runc, the CNI plugins or a static busybox missing). With
    /// `SETPOINT_REQUIRE_CONTAINERD=1` a missing prerequisite panics instead. Failing to
    /// start once everything is there always panics.
    pub async fn start() -> Option<Self> {
        if let Some(reason) = missing_prerequisites() {
            if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
                panic!("{REQUIRE_ENV}=1 but containerd cannot run here: {reason}");
            }
            eprintln!("skipping: containerd cannot run here: {reason}");
            return None;
        }
        Some(Self::start_here().await)
    }

    async fn start_here() -> Self {
        let shared = shared_dir();
        let (index, lock) = claim_subnet(&shared);
        let bridge = format!("sp-t{index}");
        let subnet = format!("10.222.{index}.0/24");
        // A test killed outright leaves its bridge and nat rules behind; the lock says
        // nobody uses them now.
        delete_link(&bridge);
        remove_nat_rules_of(&bridge);
        // The directory belongs to the subnet's lock too: one left by a killed test (its
        // shims, its mounts) is cleared here, where nobody else can be using it.
        let dir = shared.join(format!("run-{index}"));
        if dir.exists() {
            clear_run_dir(&dir, &dir.join("containerd.sock"));
        }
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let mut options = DaemonOptions::new(bridge.clone(), subnet.clone());
        options.short_socket_dir = shared.clone();
        let daemon = match ContainerdDaemon::start(&dir, options).await {
            Ok(daemon) => daemon,
            Err(e) => panic!("starting a test containerd: {e}"),
        };
        let endpoint = daemon.endpoint().to_path_buf();
        let this = TestContainerd {
            daemon: Some(daemon),
            endpoint,
            dir,
            bridge,
            subnet,
            _lock: lock,
        };
        if let Err(e) = ensure_local_images(&this.endpoint, &shared.join("images")).await {
            panic!("importing the local images into the test containerd: {e}");
        }
        this
    }

    /// containerd's socket.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }

    /// The pod network's bridge device (created by the bridge plugin with the first pod).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The pod subnet.
    pub fn subnet(&self) -> &str {
        &self.subnet
    }

    /// containerd's data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's process id.
    pub fn pid(&self) -> i32 {
        self.daemon.as_ref().map(|d| d.pid()).unwrap_or(0)
    }

    /// The daemon (its log, its exit status).
    pub fn daemon(&self) -> Option<&ContainerdDaemon> {
        self.daemon.as_ref()
    }

    /// Runs `ctr --address <endpoint> --namespace k8s.io <args>` to completion (at most
    /// `timeout`), returning stdout, or stderr as the error.
    pub fn ctr(&self, args: &[&str], timeout: Duration) -> Result<String, String> {
        let mut command = Command::new("ctr");
        command
            .arg("--address")
            .arg(&self.endpoint)
            .arg("--namespace")
            .arg(CRI_NAMESPACE)
            .args(args);
        run_with_deadline(command, timeout)
    }
}

impl Drop for TestContainerd {
    fn drop(&mut self) {
        let Some(daemon) = self.daemon.take() else {
            return;
        };
        // Containers first, while containerd can still stop them: shims would outlive it.
        remove_all_tasks(&self.endpoint);
        drop(daemon);
        clear_run_dir(&self.dir, &self.endpoint);
        delete_link(&self.bridge);
        // Sandboxes left running never had their CNI DEL: their masquerade and hostPort
        // rules would stay in the nat table.
        remove_nat_rules_of(&self.bridge);
    }
}

/// Kills the shims of the containerd at `endpoint`, then unmounts and removes `dir`, its
/// data directory. Snapshots, sandbox network namespaces and shm are mounted under it;
/// removing the directory would fail, or descend into them, while they are.
fn clear_run_dir(dir: &Path, endpoint: &Path) {
    kill_shims_of(endpoint);
    unmount_under(dir);
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("removing {}: {e}", dir.display());
    }
}

/// Why a containerd cannot run here (not root, or containerd, runc, `ip`, iptables, the CNI
/// plugins or a static busybox missing), if it cannot.
pub fn missing_prerequisites() -> Option<String> {
    prerequisites().err()
}

fn prerequisites() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root".into());
    }
    for (binary, package) in [
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("containerd-shim-runc-v2", "containerd"),
        ("runc", "runc"),
        ("ip", "iproute2"),
        ("iptables", "iptables"),
    ] {
        if which(binary).is_none() {
            return Err(format!("{binary} not found (install {package})"));
        }
    }
    if find_cni_bin_dir().is_none() {
        return Err(format!(
            "no CNI plugins ({}) in {} (install containernetworking-plugins)",
            CNI_PLUGINS.join(", "),
            CNI_BIN_DIRS.join(" or ")
        ));
    }
    host_busybox().map_err(|e| e.to_string())?;
    Ok(())
}

fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(binary))
        .find(|p| p.is_file())
}

/// The directory the tests share (subnet locks, the image cache, long-path sockets),
/// readable only by root.
fn shared_dir() -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join("setpoint-test-containerd");
    let _ = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    dir
}

/// Takes the lock of the first free `x` in 1..=254 whose subnet no host interface has.
fn claim_subnet(shared: &Path) -> (u8, std::fs::File) {
    let used = host_ipv4_addresses();
    for x in 1..=254u8 {
        let prefix = format!("10.222.{x}.");
        if used.iter().any(|a| a.starts_with(&prefix)) {
            continue;
        }
        let path = shared.join(format!("net-{x}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return (x, file);
        }
    }
    panic!("every test subnet 10.222.1-254.0/24 is in use");
}

/// The IPv4 addresses on this host's interfaces, other than the test bridges' own.
fn host_ipv4_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // `<n>: <dev> inet <addr>/<len> ...`
            let dev = fields.get(1)?;
            if dev.starts_with("sp-t") {
                return None;
            }
            let pos = fields.iter().position(|f| *f == "inet")?;
            Some(fields.get(pos + 1)?.split('/').next()?.to_string())
        })
        .collect()
}

fn delete_link(name: &str) {
    let exists = Command::new("ip")
        .args(["link", "show", name])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if exists {
        let _ = Command::new("ip").args(["link", "del", name]).status();
    }
}

/// Runs a command to completion or kills it at the deadline.
fn run_with_deadline(mut command: Command, timeout: Duration) -> Result<String, String> {
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{command:?}: {e}"))?;
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = stdout.as_mut() {
            let _ = std::io::Read::read_to_string(p, &mut s);
        }
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = stderr.as_mut() {
            let _ = std::io::Read::read_to_string(p, &mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let out = out_thread.join().unwrap_or_default();
    let err = err_thread.join().unwrap_or_default();
    match status {
        Some(s) if s.success() => Ok(out),
        Some(s) => Err(format!("{command:?}: {s}: {}", err.trim())),
        None => Err(format!("{command:?}: no answer within {timeout:?}")),
    }
}

/// Kills and deletes every task and container in every namespace of the containerd at
/// `endpoint` (best effort: the test is over either way).
fn remove_all_tasks(endpoint: &Path) {
    let ctr = |ns: Option<&str>, args: &[&str]| {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(endpoint);
        if let Some(ns) = ns {
            command.arg("--namespace").arg(ns);
        }
        command.args(args);
        run_with_deadline(command, Duration::from_secs(20))
    };
    let Ok(namespaces) = ctr(None, &["namespaces", "ls", "-q"]) else {
        return;
    };
    for ns in namespaces.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Ok(tasks) = ctr(Some(ns), &["tasks", "ls", "-q"]) {
            for task in tasks.lines().map(str::trim).filter(|l| !l.is_empty()) {
                if let Err(e) = ctr(Some(ns), &["tasks", "delete", "--force", task]) {
                    eprintln!("removing task {ns}/{task}: {e}");
                }
            }
        }
        if let Ok(containers) = ctr(Some(ns), &["containers", "ls", "-q"]) {
            for c in containers.lines().map(str::trim).filter(|l| !l.is_empty()) {
                let _ = ctr(Some(ns), &["containers", "delete", c]);
            }
        }
    }
}

/// The running (not zombie) `containerd-shim` processes serving the containerd at
/// `endpoint`: they outlive containerd by design, so a test checks none is left.
pub fn shims_of(endpoint: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let address = endpoint.to_string_lossy().into_owned();
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_shim = args.first().is_some_and(|a| a.contains("containerd-shim"));
            let ours = args
                .windows(2)
                .any(|w| w[0] == "-address" && w[1] == address);
            (is_shim && ours && !is_zombie(pid)).then_some(pid)
        })
        .collect()
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_none_or(|state| state == "Z" || state == "X")
        })
        .unwrap_or(true)
}

/// SIGKILLs the shims serving the containerd at `endpoint` and waits (a bounded time) until
/// they are gone.
fn kill_shims_of(endpoint: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shims = shims_of(endpoint);
        if shims.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("containerd shims {shims:?} did not exit after SIGKILL");
            return;
        }
        for pid in shims {
            // SAFETY: kill has no memory effects.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes the nat-table rules the CNI plugins added for network `network` (their comments
/// name it) and the per-container chains those rules jump to.
pub fn remove_nat_rules_of(network: &str) {
    let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() else {
        return;
    };
    let (rules, chains) = cni_nat_rules(&String::from_utf8_lossy(&out.stdout), network);
    for rule in rules {
        let mut args = vec!["-t".to_string(), "nat".to_string(), "-D".to_string()];
        args.extend(rule);
        let _ = Command::new("iptables").args(&args).status();
    }
    for chain in chains {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", &chain])
            .status();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", &chain])
            .status();
    }
}

/// From `iptables-save` output: the rules (as arguments after `-A`) whose comment names
/// `network`, and the container chains (`CNI-...`, not the shared `CNI-HOSTPORT-*` ones)
/// they jump to.
fn cni_nat_rules(save: &str, network: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let needle = format!("name: \"{network}\"");
    let mut rules = Vec::new();
    let mut chains: Vec<String> = Vec::new();
    for line in save.lines() {
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let args = split_quoted(rest);
        let comment = args
            .windows(2)
            .find(|w| w[0] == "--comment")
            .map(|w| w[1].as_str());
        if !comment.is_some_and(|c| c.contains(&needle)) {
            continue;
        }
        if let Some(target) = args.windows(2).find(|w| w[0] == "-j").map(|w| &w[1]) {
            if target.starts_with("CNI-")
                && !target.starts_with("CNI-HOSTPORT-")
                && !chains.contains(target)
            {
                chains.push(target.clone());
            }
        }
        rules.push(args);
    }
    (rules, chains)
}

/// Splits an `iptables-save` rule into arguments: whitespace separates, double quotes
/// group, and a backslash inside quotes escapes the next character.
fn split_quoted(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut in_arg = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_arg = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => {
                            if let Some(e) = chars.next() {
                                current.push(e);
                            }
                        }
                        q => current.push(q),
                    }
                }
            }
            c if c.is_whitespace() => {
                if in_arg {
                    args.push(std::mem::take(&mut current));
                    in_arg = false;
                }
            }
            c => {
                in_arg = true;
                current.push(c);
            }
        }
    }
    if in_arg {
        args.push(current);
    }
    args
}

/// Detaches every mount at or below `dir`, deepest first: what a containerd that was killed
/// left mounted under its directories (snapshots, sandboxes' network namespaces and shm).
pub fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    points.dedup();
    for point in points {
        let Ok(c) =
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(point.as_os_str()))
        else {
            continue;
        };
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = std::io::Error::last_os_error();
            eprintln!("unmounting {}: {e}", point.display());
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nat_rules_of_one_network() {
        let save = r#"*nat
:POSTROUTING ACCEPT [0:0]
:CNI-4c1a0f2b - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-DN-77aa - [0:0]
-A POSTROUTING -s 10.222.1.2/32 -m comment --comment "name: \"sp-t1\" id: \"abc\"" -j CNI-4c1a0f2b
-A POSTROUTING -s 10.222.10.2/32 -m comment --comment "name: \"sp-t10\" id: \"def\"" -j CNI-99
-A CNI-4c1a0f2b -d 10.222.1.0/24 -m comment --comment "name: \"sp-t1\" id: \"abc\"" -j ACCEPT
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"sp-t1\" id: \"abc\"" -m multiport --dports 80 -j CNI-DN-77aa
COMMIT
"#;
        let (rules, chains) = cni_nat_rules(save, "sp-t1");
        assert_eq!(chains, ["CNI-4c1a0f2b", "CNI-DN-77aa"]);
        assert_eq!(rules.len(), 3);
        assert_eq!(
            rules[0],
            [
                "POSTROUTING",
                "-s",
                "10.222.1.2/32",
                "-m",
                "comment",
                "--comment",
                "name: \"sp-t1\" id: \"abc\"",
                "-j",
                "CNI-4c1a0f2b"
            ]
        );
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo(r"/a\134"), r"/a\");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
