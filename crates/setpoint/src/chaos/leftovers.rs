//! What a run killed with SIGKILL (or crashed) leaves of its network, and its removal by the
//! next run.
//!
//! A run's network ([`super::netns`]) is named by the run's id, the harness's process id:
//! namespaces `setpoint-chaos-<id>-<process>` (their bind mounts under `/run/netns`, and the
//! partitions' nftables tables inside them), a bridge `spc<id in hex>b` and host veth ends
//! `spc<id in hex>h<i>`. For as long as that network exists, the run holds an exclusive
//! `flock` on `<LOCK_DIR>/<id>.lock`; the kernel releases it when the process dies, however
//! it dies. So the test of whether an owner is alive is whether its lock can be taken, which
//! a reused process id does not fool.
//!
//! At its start a run sweeps: it lists the namespaces and links named like a run's and the
//! lock files, takes (without waiting) the lock of every owner it finds, and deletes the
//! names of the owners whose lock it got, holding that lock meanwhile so a new run of the
//! same id waits. An owner whose lock is held is a live run and is never touched. Names with
//! no lock file (a run of a build before the locks) count as live while their process id is.
//!
//! The decisions are pure ([`parse`], [`owner_live`], [`stale`]) and unit-tested; [`sweep`]
//! and [`RunLock`] do the I/O.

// Taking and testing a `flock` is a system call.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where runs keep their lock files: on the tmpfs `/run` (as `ip netns` keeps its namespaces
/// under `/run/netns`), so a reboot, which ends every run and its network, empties it too.
pub const LOCK_DIR: &str = "/run/setpoint-chaos";

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// The host's network interfaces.
const LINKS_DIR: &str = "/sys/class/net";

/// What a leftover name is, in the order they are deleted: a namespace first (which takes
/// its veth end, its nftables tables and, once no process is in it, the host's veth end),
/// then a host veth end still there, then the bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Netns,
    Veth,
    Bridge,
}

/// A name a run made, and the run's id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Leftover {
    pub kind: Kind,
    pub name: String,
    pub owner: u32,
}

/// The owner and kind of `name`, a namespace (`netns: true`) or a host link, if a run named
/// it; `None` for every other name.
pub fn parse(name: &str, netns: bool) -> Option<Leftover> {
    let (kind, owner) = if netns {
        // `setpoint-chaos-<id>-<process>`
        let rest = name.strip_prefix("setpoint-chaos-")?;
        let (id, process) = rest.split_once('-')?;
        if process.is_empty() || id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        (Kind::Netns, id.parse().ok()?)
    } else {
        // `spc<6 hex digits>b`, or `spc<6 hex digits>h<i>` (the host's veth end).
        let rest = name.strip_prefix("spc")?;
        let (id, suffix) = (rest.get(..6)?, rest.get(6..)?);
        if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let kind = match suffix.as_bytes() {
            [b'b'] => Kind::Bridge,
            [b'h', digits @ ..] if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) => {
                Kind::Veth
            }
            _ => return None,
        };
        (kind, u32::from_str_radix(id, 16).ok()?)
    };
    Some(Leftover {
        kind,
        name: name.to_string(),
        owner,
    })
}

/// What trying an owner's lock found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockState {
    /// Another process holds it: the run is alive.
    Held,
    /// Nobody held it; the sweep holds it now.
    Taken,
    /// There is no lock file.
    Absent,
}

/// Whether the owner of names is a live run, from its lock and whether a process of its id
/// exists. Without a lock file the process id is all there is: a live run of a build before
/// the locks is kept (a reused id keeps leftovers until it is free again, which is harmless).
pub fn owner_live(lock: LockState, process_exists: bool) -> bool {
    match lock {
        LockState::Held => true,
        LockState::Taken => false,
        LockState::Absent => process_exists,
    }
}

/// The leftovers to delete, in the order to delete them: those of owners not in `live`.
pub fn stale(found: &[Leftover], live: &BTreeSet<u32>) -> Vec<Leftover> {
    let mut out: Vec<Leftover> = found
        .iter()
        .filter(|l| !live.contains(&l.owner))
        .cloned()
        .collect();
    out.sort();
    out
}

/// The exclusive lock a run holds on `<dir>/<id>.lock` while its network exists. Dropping it
/// removes the file (while still holding it), then releases it.
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

/// `flock(fd, op)`, retried when a signal interrupts it.
fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this `File` owns for the whole call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Whether `file` is still the file at `path`: a lock holder removes the file before it
/// releases the lock, so a lock taken on a removed file is no lock at all.
fn still_at(file: &File, path: &Path) -> std::io::Result<bool> {
    let open = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn lock_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id}.lock"))
}

impl RunLock {
    /// Takes the lock of run `id` in `dir` (created if missing), waiting while a sweep holds
    /// it.
    pub fn take(dir: &Path, id: u32) -> std::io::Result<RunLock> {
        std::fs::create_dir_all(dir)?;
        let path = lock_path(dir, id);
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            flock(&file, libc::LOCK_EX)?;
            if still_at(&file, &path)? {
                return Ok(RunLock { file, path });
            }
        }
    }

    /// Tries the lock of run `id` in `dir` without waiting and without making the file.
    fn try_take(dir: &Path, id: u32) -> std::io::Result<(LockState, Option<RunLock>)> {
        let path = lock_path(dir, id);
        loop {
            let file = match std::fs::OpenOptions::new().read(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Ok((LockState::Absent, None))
                }
                Err(e) => return Err(e),
            };
            match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Ok((LockState::Held, None))
                }
                Err(e) => return Err(e),
            }
            if still_at(&file, &path)? {
                return Ok((LockState::Taken, Some(RunLock { file, path })));
            }
            // Removed or replaced meanwhile: look again.
        }
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = flock(&self.file, libc::LOCK_UN);
    }
}

/// The names in `dir` (empty when it does not exist).
fn names_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// What a sweep deleted, and what it could not.
#[derive(Debug, Default)]
pub struct Swept {
    pub deleted: Vec<Leftover>,
    pub failed: Vec<String>,
}

/// Deletes the namespaces, veths and bridges of runs that are no longer alive, whose locks
/// are in `lock_dir`; never a live run's.
pub fn sweep(lock_dir: &Path) -> Swept {
    let mut found: Vec<Leftover> = names_in(Path::new(NETNS_DIR))
        .iter()
        .filter_map(|n| parse(n, true))
        .collect();
    found.extend(
        names_in(Path::new(LINKS_DIR))
            .iter()
            .filter_map(|n| parse(n, false)),
    );
    let mut owners: BTreeSet<u32> = found.iter().map(|l| l.owner).collect();
    // Lock files of runs that left nothing else are swept too.
    owners.extend(
        names_in(lock_dir)
            .iter()
            .filter_map(|n| n.strip_suffix(".lock")?.parse::<u32>().ok()),
    );
    let mut swept = Swept::default();
    let mut live = BTreeSet::new();
    // Held until the names are deleted, so a new run of the same id waits for the sweep.
    let mut taken = Vec::new();
    for owner in owners {
        let exists = Path::new("/proc").join(owner.to_string()).exists();
        match RunLock::try_take(lock_dir, owner) {
            Ok((state, lock)) => {
                if owner_live(state, exists) {
                    live.insert(owner);
                }
                taken.extend(lock);
            }
            Err(e) => {
                // Unknown: leave it alone.
                swept.failed.push(format!("the lock of run {owner}: {e}"));
                live.insert(owner);
            }
        }
    }
    for l in stale(&found, &live) {
        let args: &[&str] = match l.kind {
            Kind::Netns => &["netns", "del", &l.name],
            Kind::Veth | Kind::Bridge => &["link", "del", &l.name],
        };
        match super::netns::run("ip", args, None) {
            Ok(()) => swept.deleted.push(l),
            // A veth goes with its peer's namespace: one already gone is not a failure.
            Err(_) if l.kind == Kind::Veth && !Path::new(LINKS_DIR).join(&l.name).exists() => {
                swept.deleted.push(l)
            }
            Err(e) => swept.failed.push(format!("{e:#}")),
        }
    }
    drop(taken);
    swept
}

#[cfg(test)]
mod tests {
    use super::super::netns::Plan;
    use super::*;

    #[test]
    fn every_name_a_plan_makes_on_the_host_parses_back_to_its_run() {
        for id in [1, 4242, 4_194_304] {
            let p = Plan::new(
                id,
                &["agent-0", "controller-manager-0", "controller-manager-1"],
            );
            let b = parse(&p.bridge, false).unwrap();
            assert_eq!((b.kind, b.owner), (Kind::Bridge, id));
            for m in &p.members {
                let n = parse(&m.netns, true).unwrap();
                assert_eq!((n.kind, n.owner), (Kind::Netns, id));
                let h = parse(&m.host_link, false).unwrap();
                assert_eq!((h.kind, h.owner), (Kind::Veth, id));
                // The namespace's end is not on the host.
                assert_eq!(parse(&m.ns_link, false), None);
            }
        }
    }

    #[test]
    fn other_names_are_not_a_runs() {
        for (name, netns) in [
            ("setpoint-chaos-", true),
            ("setpoint-chaos-12", true),
            ("setpoint-chaos-12-", true),
            ("setpoint-chaos-x1-agent-0", true),
            ("setpoint-node-12-agent", true),
            ("cni-1234", true),
            ("eth0", false),
            ("spc", false),
            ("spc00002ab", true),
            ("spc00002a", false),
            ("spc00002ax", false),
            ("spc00002ah", false),
            ("spc00002ahx", false),
            ("spcz0002ab", false),
            ("spc00002abb", false),
        ] {
            assert_eq!(parse(name, netns), None, "{name}");
        }
    }

    #[test]
    fn only_the_names_of_owners_not_alive_are_stale_namespaces_first() {
        let names = [
            ("spc0000c8b", false),
            ("spc0000c8h0", false),
            ("setpoint-chaos-200-agent-0", true),
            ("spc0000c9b", false),
            ("setpoint-chaos-201-agent-0", true),
            ("setpoint-chaos-202-agent-0", true),
        ];
        let found: Vec<Leftover> = names.iter().map(|(n, ns)| parse(n, *ns).unwrap()).collect();
        let live = BTreeSet::from([201, 202]);
        let gone: Vec<String> = stale(&found, &live).into_iter().map(|l| l.name).collect();
        assert_eq!(
            gone,
            ["setpoint-chaos-200-agent-0", "spc0000c8h0", "spc0000c8b"]
        );
        assert!(stale(&found, &BTreeSet::from([200, 201, 202])).is_empty());
    }

    #[test]
    fn an_owner_is_alive_while_its_lock_is_held_or_without_a_lock_while_its_process_exists() {
        assert!(owner_live(LockState::Held, false));
        assert!(owner_live(LockState::Held, true));
        // Taken: nobody held it, whatever process has that id now.
        assert!(!owner_live(LockState::Taken, true));
        assert!(!owner_live(LockState::Taken, false));
        assert!(owner_live(LockState::Absent, true));
        assert!(!owner_live(LockState::Absent, false));
    }

    #[test]
    fn a_held_lock_cannot_be_taken_and_a_released_one_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let held = RunLock::take(dir.path(), 7).unwrap();
        // flock conflicts between two open files even within one process.
        let (state, lock) = RunLock::try_take(dir.path(), 7).unwrap();
        assert_eq!(state, LockState::Held);
        assert!(lock.is_none());
        drop(held);
        assert!(!dir.path().join("7.lock").exists());
        assert_eq!(
            RunLock::try_take(dir.path(), 7).unwrap().0,
            LockState::Absent
        );
        // A lock file left by a killed run (nobody holds it) is taken, and removed after.
        std::fs::write(dir.path().join("8.lock"), "").unwrap();
        let (state, lock) = RunLock::try_take(dir.path(), 8).unwrap();
        assert_eq!(state, LockState::Taken);
        drop(lock);
        assert!(!dir.path().join("8.lock").exists());
    }
}
