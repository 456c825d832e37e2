//! A process pod's own network namespace on the node's pod bridge.
//!
//! With a [`PodNetwork`] (the agent runs as root and was given a CNI network list: the one
//! its private containerd loads, or one it wrote for a process-only node), each pod gets a
//! network namespace of its own, as a CRI sandbox does:
//!
//! - a namespace is created by a short-lived thread that `unshare`s one and bind-mounts
//!   `/proc/thread-self/ns/net` at `<root>/netns/<uid>`, so it lives without any process;
//! - the CNI plugins are run on it as a container runtime runs them (`CNI_COMMAND=ADD`,
//!   `CNI_NETNS`, `CNI_IFNAME=eth0`, the network list's plugins chained through
//!   `prevResult`, and `loopback` for `lo`); the address `host-local` hands out is the pod's
//!   IP. The same network list and `host-local` data directory as the node's containerd
//!   means process and container pods share one bridge and one range without conflicts;
//! - each container's workload enters the namespace by `setns` between fork and exec
//!   ([`install`]), and `kubectl exec` and exec probes join the workload's ([`Joined`]);
//! - what DEL needs (the plugins' directory, the network list, the ADD result) is kept in
//!   `<root>/netns/<uid>.json`, written before the ADD, so a pod's network is torn down at
//!   its removal, and by the next runtime over the directory when the agent stopped in
//!   between (level-triggered: every state file without a pod is torn down).
//!
//! Several replicas can then all listen on `0.0.0.0:<port>`, and the pod IP is reachable
//! from the node and, with routes to the node's pod range, from other machines.

// unshare, mount, umount, setns and fstatfs are system calls.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// The interface the pod's address is on inside its namespace (as CRI sandboxes name it).
pub const IFNAME: &str = "eth0";

/// The directory under the runtime's root holding the pods' namespaces and network state.
pub const DIR: &str = "netns";

/// The Node annotation saying how the node's process pods are networked: `bridge` (a network
/// namespace each, on the pod bridge) or `host` (loopback addresses on the node's network).
pub const NETWORK_ANNOTATION: &str = "setpoint.io/process-pod-network";
/// The Node annotation saying why its process pods are on the node's network when `auto`
/// could not give them one of their own.
pub const NETWORK_REASON_ANNOTATION: &str = "setpoint.io/process-pod-network-reason";

/// `NSFS_MAGIC`: the filesystem type of a namespace file (`linux/magic.h`).
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Why a pod's network could not be set up or torn down.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A file or system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// A CNI plugin failed (its own message, as CNI errors carry one).
    #[error("plugin type=\"{plugin}\" failed ({command}): {message}")]
    Plugin {
        /// The plugin's type.
        plugin: String,
        /// `ADD` or `DEL`.
        command: &'static str,
        /// What it said.
        message: String,
    },
    /// The network list's result gave the pod no IPv4 address.
    #[error("the CNI result has no IPv4 address for {IFNAME}: {0}")]
    NoAddress(String),
    /// The network list is not one (no `plugins`).
    #[error("not a CNI network list: {0}")]
    BadList(String),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetworkError {
    let context = context.into();
    move |source| NetworkError::Io { context, source }
}

/// The network process pods join: a CNI network list and where its plugins are.
#[derive(Clone, Debug)]
pub struct PodNetwork {
    /// The directory holding the CNI plugins (`CNI_PATH`).
    pub bin_dir: PathBuf,
    /// The network list (`cniVersion`, `name`, `plugins`).
    pub list: Value,
}

impl PodNetwork {
    /// A network from a network list's text and the plugins' directory.
    pub fn new(bin_dir: PathBuf, conflist: &str) -> Result<Self, NetworkError> {
        let list: Value =
            serde_json::from_str(conflist).map_err(|e| NetworkError::BadList(e.to_string()))?;
        if !list["plugins"].is_array() || !list["name"].is_string() {
            return Err(NetworkError::BadList("it has no name or no plugins".into()));
        }
        Ok(Self { bin_dir, list })
    }
}

impl PodNetwork {
    /// The subnet the list's `host-local` IPAM hands addresses from (the first range's), as
    /// the bridge network lists the node writes name it.
    pub fn subnet(&self) -> Option<String> {
        self.list["plugins"]
            .as_array()?
            .iter()
            .find_map(|p| p["ipam"]["ranges"][0][0]["subnet"].as_str())
            .map(str::to_string)
    }
}

/// Whether this process may create network namespaces and configure them: `CAP_SYS_ADMIN`
/// (unshare, mount) and `CAP_NET_ADMIN` (links, addresses, routes) in its effective set.
pub fn permitted() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| caps_in(&s))
}

/// Whether a `/proc/<pid>/status` text shows `CAP_NET_ADMIN` (12) and `CAP_SYS_ADMIN` (21).
pub fn caps_in(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0 && caps & (1 << 21) != 0)
}

/// One plugin's configuration in a list: the plugin's object with the list's `cniVersion`
/// and `name`, and the previous plugin's result, as the CNI specification chains them.
pub fn plugin_config(list: &Value, plugin: &Value, prev: Option<&Value>) -> Value {
    let mut conf = plugin.clone();
    if let Some(obj) = conf.as_object_mut() {
        obj.insert("cniVersion".into(), list["cniVersion"].clone());
        obj.insert("name".into(), list["name"].clone());
        if let Some(prev) = prev {
            obj.insert("prevResult".into(), prev.clone());
        }
    }
    conf
}

/// The `loopback` plugin's configuration for the list's version (it brings `lo` up).
pub fn loopback_config(list: &Value) -> Value {
    json!({ "cniVersion": list["cniVersion"], "name": "loopback", "type": "loopback" })
}

/// The first IPv4 address of a CNI result (`ips[].address`, `a.b.c.d/len`).
pub fn result_ipv4(result: &Value) -> Option<Ipv4Addr> {
    result["ips"]
        .as_array()?
        .iter()
        .filter_map(|ip| ip["address"].as_str())
        .find_map(|a| a.split('/').next()?.parse().ok())
}

/// A plugin's failure in words: a CNI error object's `msg` and `details`, else its output.
pub fn plugin_message(stdout: &[u8], stderr: &[u8]) -> String {
    if let Ok(err) = serde_json::from_slice::<Value>(stdout) {
        if let Some(msg) = err["msg"].as_str() {
            return match err["details"].as_str().filter(|d| !d.is_empty()) {
                Some(details) => format!("{msg}: {details}"),
                None => msg.to_string(),
            };
        }
    }
    let text = String::from_utf8_lossy(if stdout.is_empty() { stderr } else { stdout });
    text.trim().to_string()
}

/// What a pod's network needs at DEL, kept beside its namespace.
fn state_file(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("{uid}.json"))
}

/// The namespace file of the pod `uid` under the runtime's `netns` directory.
pub fn path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(uid)
}

/// Whether the pod `uid` has a network namespace of its own.
pub fn exists(dir: &Path, uid: &str) -> bool {
    state_file(dir, uid).exists()
}

/// The uids with network state under `dir`.
pub fn uids(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".json").map(str::to_string)
        })
        .collect()
}

/// Creates the pod's namespace and runs the network's plugins on it; returns its address.
/// Idempotent: a pod whose ADD completed gets the address it has.
pub async fn setup(network: &PodNetwork, dir: &Path, uid: &str) -> Result<Ipv4Addr, NetworkError> {
    let state = state_file(dir, uid);
    if let Ok(text) = std::fs::read_to_string(&state) {
        if let Ok(saved) = serde_json::from_str::<Value>(&text) {
            if let Some(ip) = result_ipv4(&saved["result"]) {
                if is_namespace(&path(dir, uid)) {
                    return Ok(ip);
                }
            }
        }
        // An ADD that did not complete: undone before it is tried again.
        teardown(dir, uid).await?;
    }
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let mut saved = json!({
        "binDir": network.bin_dir.to_string_lossy(),
        "list": network.list,
        "result": Value::Null,
    });
    write_state(&state, &saved)?;
    let added = add(network, dir, uid).await.and_then(|result| {
        let ip = result_ipv4(&result).ok_or_else(|| NetworkError::NoAddress(result.to_string()))?;
        saved["result"] = result;
        write_state(&state, &saved)?;
        Ok(ip)
    });
    match added {
        Ok(ip) => Ok(ip),
        Err(e) => {
            if let Err(undo) = teardown(dir, uid).await {
                tracing::warn!(uid, error = %undo, "undoing a failed pod network setup");
            }
            Err(e)
        }
    }
}

async fn add(network: &PodNetwork, dir: &Path, uid: &str) -> Result<Value, NetworkError> {
    let ns = path(dir, uid);
    create_namespace(&ns)?;
    let bin = &network.bin_dir;
    let list = &network.list;
    run_plugin(bin, &loopback_config(list), "ADD", uid, &ns, "lo").await?;
    let mut prev: Option<Value> = None;
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let conf = plugin_config(list, plugin, prev.as_ref());
        prev = Some(run_plugin(bin, &conf, "ADD", uid, &ns, IFNAME).await?);
    }
    prev.ok_or_else(|| NetworkError::BadList("it has no plugins".into()))
}

/// Runs DEL of the pod's plugins (last first) and removes its namespace and state.
/// Idempotent: nothing to do for a pod without network state. When a plugin fails the
/// state stays, so the next runtime over the directory tries again.
pub async fn teardown(dir: &Path, uid: &str) -> Result<(), NetworkError> {
    let state = state_file(dir, uid);
    let ns = path(dir, uid);
    let saved = match std::fs::read_to_string(&state) {
        Ok(text) => serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            remove_namespace(&ns);
            return Ok(());
        }
        Err(e) => return Err(io(format!("reading {}", state.display()))(e)),
    };
    let bin = PathBuf::from(saved["binDir"].as_str().unwrap_or_default());
    let list = &saved["list"];
    let result = saved["result"].clone();
    // Without its namespace (gone with a reboot) the plugins still release the address and
    // host-side state; they are told no namespace, as the CNI specification allows for DEL.
    let netns = if is_namespace(&ns) {
        ns.clone()
    } else {
        PathBuf::new()
    };
    let mut failure = None;
    for plugin in list["plugins"].as_array().into_iter().flatten().rev() {
        let prev = (!result.is_null()).then_some(&result);
        let conf = plugin_config(list, plugin, prev);
        if let Err(e) = run_plugin(&bin, &conf, "DEL", uid, &netns, IFNAME).await {
            failure.get_or_insert(e);
        }
    }
    remove_namespace(&ns);
    if let Some(e) = failure {
        return Err(e);
    }
    match std::fs::remove_file(&state) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io(format!("removing {}", state.display()))(e))
        }
        _ => Ok(()),
    }
}

fn write_state(file: &Path, saved: &Value) -> Result<(), NetworkError> {
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, saved.to_string())
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(io(format!("writing {}", file.display())))
}

/// Runs one plugin and returns its result (`{}` for a DEL that printed nothing).
async fn run_plugin(
    bin_dir: &Path,
    conf: &Value,
    command: &'static str,
    uid: &str,
    netns: &Path,
    ifname: &str,
) -> Result<Value, NetworkError> {
    let plugin = conf["type"].as_str().unwrap_or_default().to_string();
    let fail = |message: String| NetworkError::Plugin {
        plugin: plugin.clone(),
        command,
        message,
    };
    if plugin.is_empty() || plugin.contains('/') {
        return Err(fail("the plugin has no usable type".into()));
    }
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    let mut child = tokio::process::Command::new(bin_dir.join(&plugin))
        .env_clear()
        .env("PATH", path)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", uid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", ifname)
        .env("CNI_PATH", bin_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("starting {}: {e}", bin_dir.join(&plugin).display())))?;
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = conf.to_string().into_bytes();
        stdin
            .write_all(&bytes)
            .await
            .map_err(|e| fail(format!("writing its configuration: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(plugin_message(&out.stdout, &out.stderr)));
    }
    if out.stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("its result: {e}")))
}

/// Whether `path` is a namespace file (a bind mount of one).
fn is_namespace(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: fstatfs writes into the zeroed struct we pass, on a descriptor we own.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut st) == 0 && st.f_type as i64 == NSFS_MAGIC
    }
}

fn cstring(path: &Path) -> Result<CString, NetworkError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|e| NetworkError::Io {
        context: format!("{}", path.display()),
        source: std::io::Error::other(e),
    })
}

/// Creates a network namespace and bind-mounts it at `path`, on a thread of its own (a
/// thread may `unshare` its network namespace; it ends right after, and the mount keeps the
/// namespace).
fn create_namespace(path: &Path) -> Result<(), NetworkError> {
    if is_namespace(path) {
        return Ok(());
    }
    std::fs::File::create(path).map_err(io(format!("creating {}", path.display())))?;
    let target = cstring(path)?;
    let made = std::thread::spawn(move || {
        // SAFETY: plain system calls on this thread only, with NUL-terminated paths.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let source = c"/proc/thread-self/ns/net";
            if libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("the namespace thread panicked")));
    made.map_err(io(format!(
        "creating a network namespace at {}",
        path.display()
    )))
}

/// Unmounts and removes a namespace file (the namespace ends with its last user).
fn remove_namespace(path: &Path) {
    if let Ok(target) = cstring(path) {
        // SAFETY: umount2 of a path we created; EINVAL when it is not a mount point is fine.
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
    }
    let _ = std::fs::remove_file(path);
}

/// Makes `command`'s child enter the namespace at `path` before it executes.
pub fn install(command: &mut tokio::process::Command, path: &Path) -> std::io::Result<()> {
    let ns = Arc::new(OwnedFd::from(std::fs::File::open(path)?));
    enter_before_exec(command, ns);
    Ok(())
}

fn enter_before_exec(command: &mut tokio::process::Command, ns: Arc<OwnedFd>) {
    // SAFETY: setns is async-signal-safe; the descriptor was opened before the fork.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The network namespace of a running workload, for a command to join (`kubectl exec`,
/// exec probes): `None` when it is this process's own.
#[derive(Debug)]
pub struct Joined(Arc<OwnedFd>);

impl Joined {
    /// The namespace of the process `pid`, or `None` when it shares this process's.
    pub fn of(pid: i32) -> std::io::Result<Option<Self>> {
        let theirs = format!("/proc/{pid}/ns/net");
        if std::fs::read_link(&theirs)? == std::fs::read_link("/proc/self/ns/net")? {
            return Ok(None);
        }
        let fd = OwnedFd::from(std::fs::File::open(&theirs)?);
        Ok(Some(Self(Arc::new(fd))))
    }

    /// Makes `command`'s child enter the namespace before it executes.
    pub fn install(&self, command: &mut tokio::process::Command) {
        enter_before_exec(command, Arc::clone(&self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "sp-n7",
            "plugins": [
                { "type": "bridge", "bridge": "sp-n7", "ipam": { "type": "host-local" } },
                { "type": "portmap", "capabilities": { "portMappings": true } },
            ],
        })
    }

    #[test]
    fn plugins_are_chained_with_the_lists_name_and_version() {
        let list = list();
        let first = plugin_config(&list, &list["plugins"][0], None);
        assert_eq!(first["name"], "sp-n7");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert_eq!(first["bridge"], "sp-n7");
        assert!(first.get("prevResult").is_none());
        let prev = json!({ "ips": [{ "address": "10.223.7.5/24" }] });
        let second = plugin_config(&list, &list["plugins"][1], Some(&prev));
        assert_eq!(second["type"], "portmap");
        assert_eq!(second["prevResult"], prev);
        assert_eq!(loopback_config(&list)["type"], "loopback");
        assert_eq!(loopback_config(&list)["cniVersion"], "1.0.0");
    }

    #[test]
    fn the_first_ipv4_address_of_a_result_is_the_pods() {
        let result = json!({ "ips": [
            { "address": "fd00::5/64" },
            { "address": "10.223.7.5/24", "gateway": "10.223.7.1" },
        ]});
        assert_eq!(result_ipv4(&result), Some(Ipv4Addr::new(10, 223, 7, 5)));
        assert_eq!(result_ipv4(&json!({})), None);
    }

    #[test]
    fn plugin_errors_keep_their_message() {
        let out = br#"{"code":7,"msg":"failed to allocate for range 0","details":"no IP addresses available"}"#;
        assert_eq!(
            plugin_message(out, b""),
            "failed to allocate for range 0: no IP addresses available"
        );
        assert_eq!(plugin_message(b"", b"boom\n"), "boom");
    }

    #[test]
    fn capabilities_need_both_bits() {
        assert!(caps_in("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        // CAP_NET_ADMIN only.
        assert!(!caps_in("CapEff:\t0000000000001000\n"));
        // CAP_SYS_ADMIN only.
        assert!(!caps_in("CapEff:\t0000000000200000\n"));
        assert!(!caps_in(""));
        assert!(caps_in("CapEff:\t0000000000201000\n"));
    }

    #[tokio::test]
    async fn a_namespace_is_created_kept_by_its_mount_and_removed() {
        if !permitted() {
            eprintln!("skipping: creating network namespaces needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("pod");
        assert!(!is_namespace(&ns));
        create_namespace(&ns).unwrap();
        assert!(is_namespace(&ns));
        // Idempotent: the same namespace stays.
        let before = std::fs::metadata(&ns).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        create_namespace(&ns).unwrap();
        let after = std::fs::metadata(&ns).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        assert_eq!(before.unwrap(), after.unwrap());
        // A process entering it is in another namespace than this one.
        let mut command = tokio::process::Command::new("readlink");
        command.arg("/proc/self/ns/net");
        install(&mut command, &ns).unwrap();
        let theirs = command.output().await.unwrap();
        let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
        assert!(theirs.status.success());
        assert_ne!(
            String::from_utf8_lossy(&theirs.stdout).trim(),
            ours.to_string_lossy()
        );
        remove_namespace(&ns);
        assert!(!ns.exists());
    }

    #[test]
    fn the_subnet_is_the_first_range_of_the_lists_ipam() {
        let network = PodNetwork::new(
            PathBuf::from("/opt/cni/bin"),
            r#"{"cniVersion": "1.0.0", "name": "n", "plugins": [
                {"type": "bridge", "ipam": {"type": "host-local",
                  "ranges": [[{"subnet": "10.223.7.0/24"}], [{"subnet": "10.224.0.0/24"}]]}},
                {"type": "portmap"}]}"#,
        )
        .unwrap();
        assert_eq!(network.subnet().as_deref(), Some("10.223.7.0/24"));
        let bare = PodNetwork::new(
            PathBuf::from("/opt/cni/bin"),
            r#"{"name": "n", "plugins": [{"type": "bridge"}]}"#,
        )
        .unwrap();
        assert_eq!(bare.subnet(), None);
    }

    #[test]
    fn a_list_needs_a_name_and_plugins() {
        assert!(PodNetwork::new("/usr/lib/cni".into(), &list().to_string()).is_ok());
        assert!(PodNetwork::new("/usr/lib/cni".into(), "{\"name\":\"x\"}").is_err());
        assert!(PodNetwork::new("/usr/lib/cni".into(), "nope").is_err());
    }
}
