//! `emptyDir` volumes: a directory of the pod's, on the node's disk or (`medium: Memory`)
//! a tmpfs of at most `sizeLimit`; their usage against `sizeLimit`, which evicts the pod as
//! the kubelet's eviction manager does.

// Mounting and detaching a tmpfs are system calls libc exposes only as unsafe functions.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The `status.reason` of a pod the node evicted.
pub const EVICTED_REASON: &str = "Evicted";

/// The kubelet's eviction message for an emptyDir over its limit (`limit` as the quantity is
/// written canonically). The trailing space is upstream's.
pub fn eviction_message(volume: &str, limit: &str) -> String {
    format!("Usage of EmptyDir volume {volume:?} exceeds the limit {limit:?}. ")
}

/// Makes the volume's directory (world-writable, as the kubelet makes it); for `Memory`,
/// mounts a tmpfs there unless one already is, of `size_limit` bytes if given.
pub fn set_up(dir: &Path, memory: bool, size_limit: Option<i64>) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if memory && !is_mount_point(dir)? {
        let options = match size_limit {
            Some(bytes) => format!("size={bytes}"),
            None => String::new(),
        };
        mount_tmpfs(dir, &options)?;
    }
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode != 0o777 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    }
    Ok(())
}

/// Whether `dir` is the root of a mount: its device differs from its parent's.
pub fn is_mount_point(dir: &Path) -> io::Result<bool> {
    let here = std::fs::metadata(dir)?;
    let Some(parent) = dir.parent() else {
        return Ok(true);
    };
    Ok(std::fs::metadata(parent)?.dev() != here.dev())
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn mount_tmpfs(dir: &Path, options: &str) -> io::Result<()> {
    let target = c_path(dir)?;
    let fstype = c"tmpfs";
    let data = CString::new(options).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Detaches the mount at `dir` (a tmpfs the manager made).
pub fn unmount(dir: &Path) -> io::Result<()> {
    let target = c_path(dir)?;
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The mount points of this process's mount table under `root` (deepest first, so they
/// can be detached in order).
pub fn mounts_under(root: &Path) -> Vec<std::path::PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<std::path::PathBuf> = table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| std::path::PathBuf::from(unescape_octal(p)))
        .filter(|p| p.starts_with(root))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// A mountinfo field with its `\040`-style escapes undone.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let digit = |k: usize| u32::from(bytes[i + k] - b'0');
            out.push((digit(1) * 64 + digit(2) * 8 + digit(3)) as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The disk space `dir` uses, as `du` counts it: allocated blocks of everything under it,
/// symlinks not followed, each hard-linked file once.
pub fn usage(dir: &Path) -> io::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            // Removed by the workload meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_what_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(usage(d).unwrap(), 0);
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/big"), vec![1u8; 256 * 1024]).unwrap();
        let used = usage(d).unwrap();
        assert!(used >= 256 * 1024, "{used}");
        // A hard link is counted once.
        std::fs::hard_link(d.join("sub/big"), d.join("again")).unwrap();
        assert!(usage(d).unwrap() < used + 64 * 1024);
    }

    #[test]
    fn the_eviction_message_is_the_kubelets() {
        assert_eq!(
            eviction_message("scratch", "1Mi"),
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". "
        );
        assert_eq!(unescape_octal("/a\\040b"), "/a b");
    }

    #[test]
    fn a_disk_empty_dir_is_a_world_writable_directory() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir
            .path()
            .join("pods/u/volumes/kubernetes.io~empty-dir/scratch");
        set_up(&v, false, None).unwrap();
        let mode = std::fs::metadata(&v).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o777);
        assert!(!is_mount_point(&v).unwrap());
    }
}
