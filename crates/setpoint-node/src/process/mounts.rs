//! Volume mounts of process containers: each container that mounts volumes runs in a mount
//! namespace of its own, with every [`ContainerMount`] bind-mounted at its path, so the
//! manifest that works under the CRI runtime works here too.
//!
//! - **Setting up** ([`Namespace`]): everything that needs memory or may block happens in the
//!   agent before the fork: the paths become C strings and missing mount points are created
//!   ([`MountPoints`]). The child, between fork and exec, only makes system calls:
//!   `unshare(CLONE_NEWNS)`; `/` recursively a slave (the container's mounts never reach the
//!   node, and the node's unmounts — another pod's tmpfs going away — do reach the
//!   container, so it never pins them); every volume's path opened (`O_PATH`, at a
//!   descriptor number the agent reserved) before the first mount, and bound through
//!   `/proc/self/fd/<n>`, so a mount made earlier never hides a later one's source; then per
//!   mount, parents before children as
//!   containerd orders them, a recursive bind, made private (`mountPropagation: None`, as
//!   runc makes it), and for `readOnly` a read-only remount that keeps the source's
//!   `nosuid`/`nodev`/`noexec`/atime flags; last the working directory, entered after the
//!   mounts so a `workingDir` inside a volume is the volume. When a step fails the child
//!   says which through a pipe, so the error names the mount.
//! - **Joining** ([`Joined`]): `kubectl exec` and exec probes enter the namespace of the
//!   container's workload (`setns` on `/proc/<pid>/ns/mnt`, opened before the fork and
//!   checked against the workload's start time so a reused pid is never joined), and so see
//!   exactly its files.
//! - **Mount points**: a bind mount needs its target to exist. A process container shares
//!   the node's file system, so a missing `mountPath` (a directory, or an empty file when the
//!   volume path is a file, as `subPath` to a file gives) is created on the node — or inside
//!   the volume mounted above it, where the container will see it. The ones created on the
//!   node are remembered in `<state dir>/mountpoints.json` with the pods that need them, and
//!   removed when the last of those pods is gone, if they are still empty; paths that existed
//!   before are never touched. (Creating them inside a throwaway root, as a container
//!   runtime does, would need a whole root file system per container; the node's own is the
//!   one a process container runs on.)
//! - **Privilege**: a mount namespace needs `CAP_SYS_ADMIN`. Without it a container with
//!   mounts is refused ([`MountError::NotPermitted`], reported as
//!   `CreateContainerConfigError`) instead of running without its files; a container
//!   without mounts needs no namespace and runs as before.

// unshare, mount, setns, chdir and pipes are system calls.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::state::alive;
use crate::volumes::ContainerMount;

/// The message of a container with mounts on an agent that cannot make mount namespaces.
pub const NOT_PERMITTED: &str = "volume mounts in the process runtime need a private mount namespace, which needs root (CAP_SYS_ADMIN): run the agent as root or use --container-runtime cri";

/// Why a container's mounts cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The agent may not create mount namespaces.
    #[error("{NOT_PERMITTED}")]
    NotPermitted,
    /// A `mountPath` the process runtime cannot mount at.
    #[error("mountPath {path:?}: {why}")]
    Target {
        /// The `mountPath`.
        path: String,
        /// Why not.
        why: String,
    },
    /// A file system operation on the node failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path of the node.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> MountError + 'a {
    move |source| MountError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Whether this process may create mount namespaces: `CAP_SYS_ADMIN` in its effective set.
pub fn namespaces_permitted() -> bool {
    static PERMITTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PERMITTED.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status")
            .map(|status| cap_sys_admin_in(&status))
            .unwrap_or(false)
    })
}

/// Whether a `/proc/<pid>/status` text shows `CAP_SYS_ADMIN` (bit 21) in `CapEff`.
pub fn cap_sys_admin_in(status: &str) -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// A `mountPath` as the absolute, normalized path the container sees (`.` and repeated
/// slashes dropped, relative paths taken from `/`, as containerd takes them from the root).
/// `..` and `/` itself are refused.
pub fn normalize_target(path: &str) -> Result<PathBuf, String> {
    let mut out = PathBuf::from("/");
    for component in Path::new(path).components() {
        match component {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err("must not contain '..'".to_string()),
            Component::Normal(part) => out.push(part),
        }
    }
    if out == Path::new("/") {
        return Err(
            "the process runtime cannot mount over / (the node's own root file system)".to_string(),
        );
    }
    Ok(out)
}

/// The mounts in the order they are made: parents before children (fewer path components
/// first, the spec's order among equals), as containerd sorts them, so a mount inside
/// another volume lands in that volume.
pub fn mount_order(
    mounts: &[ContainerMount],
) -> Result<Vec<(PathBuf, &ContainerMount)>, MountError> {
    let mut out = Vec::with_capacity(mounts.len());
    for m in mounts {
        let target = normalize_target(&m.container_path).map_err(|why| MountError::Target {
            path: m.container_path.clone(),
            why,
        })?;
        out.push((target, m));
    }
    out.sort_by_key(|(target, _)| target.components().count());
    Ok(out)
}

/// Where the container path `path` is on the node once `earlier` (container path, node
/// path) mounts are made: inside the deepest of them that contains it, else the same path of
/// the node. The flag says whether it is inside a volume.
pub fn node_location(path: &Path, earlier: &[(PathBuf, PathBuf)]) -> (PathBuf, bool) {
    earlier
        .iter()
        .filter_map(|(target, source)| {
            let rest = path.strip_prefix(target).ok()?;
            Some((target.components().count(), source.join(rest)))
        })
        .max_by_key(|(depth, _)| *depth)
        .map_or_else(|| (path.to_path_buf(), false), |(_, p)| (p, true))
}

/// Where the container path `path` is on the node given the container's `mounts` (see
/// [`node_location`]); a path no mount contains is the node's own.
pub fn node_path_of(path: &Path, mounts: &[ContainerMount]) -> PathBuf {
    let made: Vec<(PathBuf, PathBuf)> = mounts
        .iter()
        .filter_map(|m| {
            Some((
                normalize_target(&m.container_path).ok()?,
                m.host_path.clone(),
            ))
        })
        .collect();
    node_location(path, &made).0
}

/// The mount flags a read-only remount must keep from the source's file system (`statvfs`
/// `f_flag`): without them the remount would clear `nosuid`, `nodev`, `noexec` or the
/// atime choice the node put there.
pub fn kept_flags(st_flags: u64) -> libc::c_ulong {
    let pairs: [(u64, libc::c_ulong); 6] = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    pairs
        .iter()
        .filter(|(st, _)| st_flags & st != 0)
        .fold(0, |acc, (_, ms)| acc | ms)
}

/// The mount points the runtime created on the node, with the pods that need each
/// (`<state dir>/mountpoints.json`). Paths that existed before the runtime needed them are
/// not in it and are never removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountPoints {
    /// Created path → uids of the pods whose containers mount there (or below).
    created: BTreeMap<PathBuf, BTreeSet<String>>,
}

impl MountPoints {
    /// Reads the list; a missing or unreadable one is empty (nothing is removed that is not
    /// known to be ours).
    pub fn load(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    /// Writes the list atomically.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    }

    /// Records that the pod `uid` needs `path`: a path created now is added; one created
    /// earlier gains the pod; another existing path is not ours and stays unrecorded.
    /// Returns whether the list changed.
    pub fn need(&mut self, path: &Path, uid: &str, created_now: bool) -> bool {
        match self.created.get_mut(path) {
            Some(uids) => uids.insert(uid.to_string()),
            None if created_now => {
                self.created
                    .insert(path.to_path_buf(), BTreeSet::from([uid.to_string()]));
                true
            }
            None => false,
        }
    }

    /// Forgets the pod `uid`; returns the paths no pod needs any more, deepest first (the
    /// order they can be removed in), and forgets them too.
    pub fn release(&mut self, uid: &str) -> Vec<PathBuf> {
        let mut free = Vec::new();
        self.created.retain(|path, uids| {
            uids.remove(uid);
            if uids.is_empty() {
                free.push(path.clone());
                false
            } else {
                true
            }
        });
        free.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        free
    }

    /// Keeps `path` recorded with no pod needing it, so the next release looks at it again.
    pub fn keep(&mut self, path: &Path) {
        self.created.entry(path.to_path_buf()).or_default();
    }

    /// The pods that need some recorded path.
    pub fn uids(&self) -> BTreeSet<String> {
        self.created.values().flatten().cloned().collect()
    }

    /// Whether any path is recorded.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty()
    }
}

/// Which of `candidates` are mount points in some mount namespace of this machine other
/// than the agent's own: another agent's containers may mount at a path this runtime
/// created (it found the path there and so did not record it), and removing the directory
/// would take the mount away from them. Each namespace's table is read once.
pub fn mounted_elsewhere(candidates: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let own = std::fs::read_link("/proc/self/ns/mnt").ok();
    let mut seen = std::collections::HashSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(ns) = std::fs::read_link(entry.path().join("ns/mnt")) else {
            continue;
        };
        if Some(&ns) == own.as_ref() || !seen.insert(ns) {
            continue;
        }
        if let Ok(table) = std::fs::read_to_string(entry.path().join("mountinfo")) {
            found.extend(mount_points_in(&table, candidates));
        }
    }
    found
}

/// Which of `candidates` a `/proc/<pid>/mountinfo` table has as mount points (its fifth
/// field, with spaces, tabs, newlines and backslashes escaped in octal).
pub fn mount_points_in(table: &str, candidates: &[PathBuf]) -> Vec<PathBuf> {
    let escaped: Vec<(String, &PathBuf)> = candidates
        .iter()
        .map(|p| {
            let text = p.to_string_lossy();
            let mut out = String::with_capacity(text.len());
            for c in text.chars() {
                match c {
                    ' ' => out.push_str("\\040"),
                    '\t' => out.push_str("\\011"),
                    '\n' => out.push_str("\\012"),
                    '\\' => out.push_str("\\134"),
                    c => out.push(c),
                }
            }
            (out, p)
        })
        .collect();
    let points: std::collections::HashSet<&str> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .collect();
    escaped
        .into_iter()
        .filter(|(e, _)| points.contains(e.as_str()))
        .map(|(_, p)| p.clone())
        .collect()
}

/// Removes a mount point the runtime created if it is still empty (an empty directory, or
/// an empty file); anything else was put there by someone and stays.
pub fn remove_if_empty(path: &Path) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir(path)
    } else if meta.is_file() && meta.len() == 0 {
        std::fs::remove_file(path)
    } else {
        return;
    };
    if let Err(e) = result {
        tracing::debug!(path = %path.display(), error = %e, "mount point left in place");
    }
}

/// Creates `path` (a directory, or an empty file when `file`) with the directories above it,
/// recording in `points` each level created and each level created earlier for another pod,
/// so none is removed while `uid` needs it. Levels inside a volume are not recorded: they go
/// with the volume.
fn make_mount_point(
    path: &Path,
    file: bool,
    uid: &str,
    record: bool,
    points: &mut MountPoints,
) -> Result<bool, MountError> {
    let mut changed = false;
    let levels: Vec<&Path> = path.ancestors().collect();
    for (i, level) in levels.iter().rev().enumerate() {
        let last = i + 1 == levels.len();
        let created_now = match std::fs::symlink_metadata(level) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let made = if last && file {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(level)
                        .map(drop)
                } else {
                    std::fs::create_dir(level)
                };
                match made {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
                    Err(e) => return Err(io_error("creating the mount point", level)(e)),
                }
            }
            Err(e) => return Err(io_error("looking at the mount point", level)(e)),
        };
        if record {
            changed |= points.need(level, uid, created_now);
        }
    }
    Ok(changed)
}

/// One bind mount as the child makes it.
#[derive(Debug)]
struct Step {
    /// The volume's path on the node.
    path: CString,
    /// The descriptor number the child opens it at (reserved in the agent, see
    /// [`Namespace::prepare`]).
    slot: libc::c_int,
    /// `/proc/self/fd/<slot>`: what is bound.
    source: CString,
    target: CString,
    read_only: bool,
    kept: libc::c_ulong,
}

/// A container's mount namespace, ready to be entered by a child between fork and exec
/// ([`Namespace::install`]). See the [module docs](self).
#[derive(Debug)]
pub struct Namespace {
    steps: Vec<Step>,
    workdir: CString,
    /// What each step index the child may report means.
    descriptions: Vec<String>,
    /// Descriptor numbers held open (on `/dev/null`) so the child may put each source at
    /// its own: sources must be opened inside the new namespace (the kernel binds only mounts
    /// of the caller's namespace), yet before any mount could hide them.
    _slots: Vec<OwnedFd>,
    /// The pipe the child reports a failed step on: (read end, write end).
    report: (OwnedFd, OwnedFd),
}

impl Namespace {
    /// Prepares the namespace of one run of the pod `uid`'s container: checks privilege,
    /// orders the mounts, opens their sources and creates missing mount points (recorded in
    /// `points`; the flag returned says whether it changed). `workdir` is the container's
    /// working directory as the container sees it. `state_dir` is where the runtime keeps
    /// the run's pid, exit and log files, which the container's supervisor writes from inside
    /// the namespace: a mount hiding it is refused rather than losing the run's status.
    pub fn prepare(
        mounts: &[ContainerMount],
        workdir: &Path,
        uid: &str,
        state_dir: &Path,
        points: &mut MountPoints,
    ) -> Result<(Self, bool), MountError> {
        if !namespaces_permitted() {
            return Err(MountError::NotPermitted);
        }
        let ordered = mount_order(mounts)?;
        let state_dir = std::path::absolute(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
        let state_real = state_dir
            .canonicalize()
            .unwrap_or_else(|_| state_dir.clone());
        for (target, m) in &ordered {
            if state_dir.starts_with(target) || state_real.starts_with(target) {
                return Err(MountError::Target {
                    path: m.container_path.clone(),
                    why: format!(
                        "it would hide {}, where the process runtime keeps the container's state; mount the volume elsewhere or give the agent another data dir",
                        state_real.display()
                    ),
                });
            }
        }
        let mut made: Vec<(PathBuf, PathBuf)> = Vec::new();
        let mut steps = Vec::new();
        let mut slots = Vec::new();
        let mut descriptions = vec![
            "creating the container's mount namespace".to_string(),
            "making the container's mounts private to it".to_string(),
        ];
        let mut changed = false;
        for (target, m) in ordered {
            let meta = std::fs::metadata(&m.host_path)
                .map_err(io_error("the volume path", &m.host_path))?;
            let (location, in_volume) = node_location(&target, &made);
            changed |= make_mount_point(&location, !meta.is_dir(), uid, !in_volume, points)?;
            let slot = std::fs::File::open("/dev/null")
                .map(OwnedFd::from)
                .map_err(io_error("opening", Path::new("/dev/null")))?;
            let source = cstring(format!("/proc/self/fd/{}", slot.as_raw_fd()).as_bytes())?;
            let kept = if m.read_only {
                statvfs_flags(&m.host_path)
                    .map_err(io_error("reading the mount flags of", &m.host_path))?
            } else {
                0
            };
            let shown = format!("{} at {}", m.host_path.display(), target.display());
            descriptions.push(format!("opening {}", m.host_path.display()));
            descriptions.push(format!("bind-mounting {shown}"));
            descriptions.push(format!("making the mount {shown} private"));
            descriptions.push(format!("making the mount {shown} read-only"));
            steps.push(Step {
                path: cstring(m.host_path.as_os_str().as_bytes())?,
                slot: slot.as_raw_fd(),
                source,
                target: cstring(target.as_os_str().as_bytes())?,
                read_only: m.read_only,
                kept,
            });
            slots.push(slot);
            made.push((target, m.host_path.clone()));
        }
        descriptions.push(format!(
            "entering the working directory {}",
            workdir.display()
        ));
        let report = pipe().map_err(io_error("creating a pipe for", Path::new("the mounts")))?;
        Ok((
            Self {
                steps,
                workdir: cstring(workdir.as_os_str().as_bytes())?,
                descriptions,
                _slots: slots,
                report,
            },
            changed,
        ))
    }

    /// Makes `command`'s child enter this namespace before it executes. The command's own
    /// `current_dir` is irrelevant: the child enters the working directory after mounting.
    pub fn install(self: &std::sync::Arc<Self>, command: &mut tokio::process::Command) {
        let this = std::sync::Arc::clone(self);
        // SAFETY: `enter` makes only async-signal-safe system calls on memory prepared
        // before the fork.
        unsafe {
            command.pre_exec(move || this.enter());
        }
    }

    /// The child's half: system calls only, no allocation.
    fn enter(&self) -> std::io::Result<()> {
        let slash = c"/";
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: plain system calls on NUL-terminated strings that outlive them.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(self.fail(0));
            }
            if libc::mount(
                null,
                slash.as_ptr(),
                null,
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) != 0
            {
                return Err(self.fail(1));
            }
            // Every source is opened before the first mount, in the new namespace.
            for (i, step) in self.steps.iter().enumerate() {
                let fd = libc::open(step.path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 || libc::dup3(fd, step.slot, libc::O_CLOEXEC) < 0 {
                    return Err(self.fail(2 + 4 * i as u32));
                }
                libc::close(fd);
            }
            for (i, step) in self.steps.iter().enumerate() {
                let base = 3 + 4 * i as u32;
                if libc::mount(
                    step.source.as_ptr(),
                    step.target.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(self.fail(base));
                }
                if libc::mount(
                    null,
                    step.target.as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(self.fail(base + 1));
                }
                if step.read_only
                    && libc::mount(
                        null,
                        step.target.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | step.kept,
                        std::ptr::null(),
                    ) != 0
                {
                    return Err(self.fail(base + 2));
                }
            }
            if libc::chdir(self.workdir.as_ptr()) != 0 {
                return Err(self.fail(2 + 4 * self.steps.len() as u32));
            }
        }
        Ok(())
    }

    /// In the child: the error of the failed system call, after telling the parent which
    /// step it was.
    fn fail(&self, step: u32) -> std::io::Error {
        let error = std::io::Error::last_os_error();
        let bytes = step.to_ne_bytes();
        // SAFETY: write is async-signal-safe; the buffer is on the stack.
        unsafe {
            libc::write(
                self.report.1.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
            );
        }
        error
    }

    /// What failed when spawning a command that had this namespace installed failed with
    /// `error`: the step the child reported, with the error.
    pub fn explain(&self, error: &std::io::Error) -> String {
        let mut bytes = [0u8; 4];
        // SAFETY: a non-blocking read into a buffer we own.
        let n = unsafe {
            libc::read(
                self.report.0.as_raw_fd(),
                bytes.as_mut_ptr().cast(),
                bytes.len(),
            )
        };
        if n == 4 {
            let step = u32::from_ne_bytes(bytes) as usize;
            if let Some(what) = self.descriptions.get(step) {
                return format!("{what}: {error}");
            }
        }
        error.to_string()
    }
}

fn cstring(bytes: &[u8]) -> Result<CString, MountError> {
    CString::new(bytes).map_err(|_| MountError::Target {
        path: String::from_utf8_lossy(bytes).into_owned(),
        why: "contains a NUL byte".to_string(),
    })
}

/// The mount flags of the file system holding `path` (`statvfs` `f_flag`).
fn statvfs_flags(path: &Path) -> std::io::Result<libc::c_ulong> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: statvfs fills a struct we own.
    let flags = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        st.f_flag
    };
    Ok(kept_flags(flags as u64))
}

/// A close-on-exec pipe with a non-blocking read end: (read, write).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nobody else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(read.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(read.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok((read, write))
}

/// The mount namespace of a running container's workload, to run a command in
/// (`kubectl exec`, exec probes). See the [module docs](self).
#[derive(Debug)]
pub struct Joined {
    ns: OwnedFd,
    cwd: CString,
}

impl Joined {
    /// The namespace of the process `pid` started at `start` (clock ticks; 0 when unknown),
    /// or `None` when it is this process's own (a container without mounts). `cwd` is the
    /// directory the command starts in, as the container sees it.
    pub fn of(pid: i32, start: u64, cwd: &Path) -> std::io::Result<Option<Self>> {
        let theirs = format!("/proc/{pid}/ns/mnt");
        if std::fs::read_link(&theirs)? == std::fs::read_link("/proc/self/ns/mnt")? {
            return Ok(None);
        }
        let ns = open_file(&theirs)?;
        // Opened first, checked after: the descriptor is the namespace of the process that
        // is (still) the workload, not of a process that reused its pid.
        if start != 0 && !alive(pid, start) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("process {pid} has exited"),
            ));
        }
        let cwd = CString::new(cwd.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
        Ok(Some(Self { ns, cwd }))
    }

    /// Makes `command`'s child enter the namespace, then `cwd`, before it executes.
    pub fn install(self: &std::sync::Arc<Self>, command: &mut tokio::process::Command) {
        let this = std::sync::Arc::clone(self);
        // SAFETY: setns and chdir are async-signal-safe; their arguments were prepared
        // before the fork. (A forked child has one thread, as setns of a mount namespace
        // requires.)
        unsafe {
            command.pre_exec(move || {
                if libc::setns(this.ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::chdir(this.cwd.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

fn open_file(path: &str) -> std::io::Result<OwnedFd> {
    let file = std::fs::File::open(path)?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(host: &str, container: &str, read_only: bool) -> ContainerMount {
        ContainerMount {
            host_path: host.into(),
            container_path: container.into(),
            read_only,
        }
    }

    /// Runs `script` through the runtime's launch path in a namespace with `mounts`, and
    /// returns its output once it exited.
    async fn run_in(
        root: &Path,
        mounts: &[ContainerMount],
        workdir: &Path,
        script: &str,
    ) -> String {
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let mut points = MountPoints::default();
        let (namespace, _) =
            Namespace::prepare(mounts, workdir, "pod-1", &state, &mut points).unwrap();
        let spec = super::super::launch::LaunchSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
            workdir: workdir.to_path_buf(),
            log: state.join("0.log"),
            pid_file: state.join("0.pid"),
            exit_file: state.join("0.exit"),
            namespace: Some(std::sync::Arc::new(namespace)),
            netns: None,
        };
        let mut launched = super::super::launch::launch(&spec).await.unwrap();
        launched.child.wait().await.unwrap();
        assert!(spec.exit_file.exists(), "the supervisor recorded the exit");
        std::fs::read_to_string(&spec.log).unwrap()
    }

    #[tokio::test]
    async fn a_container_sees_its_mounts_and_the_node_does_not() {
        if !namespaces_permitted() {
            // The refusal is what a container gets here; the runtime tests check it.
            eprintln!("skipped: this process may not create mount namespaces");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let volume = root.join("volume");
        std::fs::create_dir_all(volume.join("sub")).unwrap();
        std::fs::write(volume.join("greeting"), "hello\n").unwrap();
        std::fs::write(volume.join("sub/file.txt"), "one file\n").unwrap();
        let app = root.join("c/etc/app");
        let mounts = [
            mount(volume.to_str().unwrap(), app.to_str().unwrap(), true),
            // A file (subPath) inside the read-only mount: its mount point is made in the
            // volume, where the container sees it; and a writable mount in the container.
            ContainerMount {
                host_path: volume.join("sub/file.txt"),
                container_path: root.join("c/etc/app/single").display().to_string(),
                read_only: false,
            },
        ];
        let out = run_in(
            &root,
            &mounts,
            &app,
            "cat greeting single; pwd; touch greeting 2>/dev/null && echo writable || echo read-only",
        )
        .await;
        assert_eq!(
            out,
            format!("hello\none file\n{}\nread-only\n", app.display())
        );
        // Nothing of it reached the node: the mount point is empty there.
        assert!(app.is_dir());
        assert_eq!(std::fs::read_dir(&app).unwrap().count(), 0);
        assert!(
            volume.join("single").is_file(),
            "the nested mount point, in the volume"
        );
    }

    #[tokio::test]
    async fn a_failed_mount_is_named() {
        if !namespaces_permitted() {
            eprintln!("skipped: this process may not create mount namespaces");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let state = root.join("state");
        std::fs::create_dir_all(&state).unwrap();
        let file = root.join("file");
        std::fs::write(&file, "x").unwrap();
        // A file onto a directory that exists: the kernel refuses the bind.
        let target = root.join("dir");
        std::fs::create_dir(&target).unwrap();
        let mounts = [mount(
            file.to_str().unwrap(),
            target.to_str().unwrap(),
            false,
        )];
        let mut points = MountPoints::default();
        let (namespace, _) =
            Namespace::prepare(&mounts, &root, "pod-1", &state, &mut points).unwrap();
        let spec = super::super::launch::LaunchSpec {
            argv: vec!["true".into()],
            env: Vec::new(),
            workdir: root.clone(),
            log: state.join("0.log"),
            pid_file: state.join("0.pid"),
            exit_file: state.join("0.exit"),
            namespace: Some(std::sync::Arc::new(namespace)),
            netns: None,
        };
        let error = super::super::launch::launch(&spec).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "bind-mounting {} at {}: Not a directory (os error 20)",
                file.display(),
                target.display()
            )
        );
        // A mount hiding the runtime's state is refused before anything runs.
        let hiding = [mount(file.to_str().unwrap(), root.to_str().unwrap(), false)];
        let refused = Namespace::prepare(&hiding, &root, "pod-1", &state, &mut points).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("where the process runtime keeps the container's state"),
            "{refused}"
        );
    }

    #[test]
    fn capabilities_are_read_from_cap_eff() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        let user = "CapPrm:\t00000000a80425fb\nCapEff:\t0000000000000000\n";
        let only_admin = "CapEff:\t0000000000200000\n";
        assert!(cap_sys_admin_in(root));
        assert!(!cap_sys_admin_in(user));
        assert!(cap_sys_admin_in(only_admin));
        assert!(!cap_sys_admin_in("no such line"));
    }

    #[test]
    fn targets_are_normalized_and_checked() {
        assert_eq!(normalize_target("/etc/app").unwrap(), Path::new("/etc/app"));
        assert_eq!(
            normalize_target("//etc/./app/").unwrap(),
            Path::new("/etc/app")
        );
        assert_eq!(normalize_target("data").unwrap(), Path::new("/data"));
        assert_eq!(
            normalize_target("/a/../etc").unwrap_err(),
            "must not contain '..'"
        );
        assert!(normalize_target("/").is_err());
        assert!(normalize_target("/./").is_err());
    }

    #[test]
    fn parents_are_mounted_before_children_and_children_land_in_them() {
        let mounts = [
            mount("/v/b", "/data/sub/x", false),
            mount("/v/a", "/data", false),
            mount("/v/c", "/etc/app", true),
        ];
        let order: Vec<PathBuf> = mount_order(&mounts)
            .unwrap()
            .into_iter()
            .map(|(t, _)| t)
            .collect();
        assert_eq!(
            order,
            [
                Path::new("/data"),
                Path::new("/etc/app"),
                Path::new("/data/sub/x")
            ]
        );
        let made = vec![(PathBuf::from("/data"), PathBuf::from("/v/a"))];
        assert_eq!(
            node_location(Path::new("/data/sub/x"), &made),
            (PathBuf::from("/v/a/sub/x"), true)
        );
        assert_eq!(
            node_location(Path::new("/database"), &made),
            (PathBuf::from("/database"), false)
        );
        let deeper = vec![
            (PathBuf::from("/data"), PathBuf::from("/v/a")),
            (PathBuf::from("/data/sub"), PathBuf::from("/v/s")),
        ];
        assert_eq!(
            node_location(Path::new("/data/sub/x"), &deeper),
            (PathBuf::from("/v/s/x"), true)
        );
        let bad = [mount("/v", "/x/../y", false)];
        assert!(matches!(mount_order(&bad), Err(MountError::Target { .. })));
    }

    #[test]
    fn read_only_remounts_keep_the_locked_flags() {
        assert_eq!(kept_flags(0), 0);
        assert_eq!(
            kept_flags(libc::ST_NOSUID | libc::ST_NODEV | libc::ST_RDONLY),
            libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_eq!(kept_flags(libc::ST_RELATIME), libc::MS_RELATIME);
    }

    #[test]
    fn mount_tables_are_read_for_mount_points() {
        let table = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                     40 22 0:5 /v /etc/app rw,relatime - ext4 /dev/sda1 rw\n\
                     41 22 0:5 /w /my\\040data rw - ext4 /dev/sda1 rw\n";
        let candidates = [
            PathBuf::from("/etc/app"),
            PathBuf::from("/my data"),
            PathBuf::from("/etc"),
        ];
        assert_eq!(
            mount_points_in(table, &candidates),
            [PathBuf::from("/etc/app"), PathBuf::from("/my data")]
        );
        // This process's own namespace is not "elsewhere".
        assert!(mounted_elsewhere(&[PathBuf::from("/")]).len() <= 1);
    }

    #[test]
    fn mount_points_are_removed_when_the_last_pod_is_gone() {
        let mut points = MountPoints::default();
        let (a, ab) = (Path::new("/a"), Path::new("/a/b"));
        assert!(points.need(a, "p1", true));
        assert!(points.need(ab, "p1", true));
        // A second pod needs them too; a path that existed before is never recorded.
        assert!(points.need(a, "p2", false));
        assert!(points.need(ab, "p2", false));
        assert!(!points.need(Path::new("/etc"), "p2", false));
        assert!(points.release("p1").is_empty());
        assert_eq!(points.release("p2"), [ab.to_path_buf(), a.to_path_buf()]);
        assert!(points.is_empty());
        // A path kept (still mounted elsewhere) comes back at the next release.
        points.keep(a);
        assert_eq!(points.release("p3"), [a.to_path_buf()]);
        assert!(points.is_empty());
        assert!(points.release("p2").is_empty());
    }

    #[test]
    fn mount_points_are_created_recorded_and_removed_if_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mut points = MountPoints::default();
        let file = root.join("x/y/config.yaml");
        assert!(make_mount_point(&file, true, "p1", true, &mut points).unwrap());
        assert!(file.is_file());
        let other = root.join("x/z");
        assert!(make_mount_point(&other, false, "p2", true, &mut points).unwrap());
        // Saved and loaded, as after an agent restart.
        let list = root.join("mountpoints.json");
        points.save(&list).unwrap();
        let mut points = MountPoints::load(&list);
        for path in points.release("p1") {
            remove_if_empty(&path);
        }
        assert!(!root.join("x/y").exists());
        assert!(other.is_dir(), "still needed by p2");
        std::fs::write(other.join("kept"), "someone's").unwrap();
        for path in points.release("p2") {
            remove_if_empty(&path);
        }
        assert!(other.join("kept").exists(), "a non-empty mount point stays");
        assert!(root.exists(), "what existed before is not removed");
        assert!(points.is_empty());
    }
}
