//! The kubelet's atomic writer: how ConfigMap, Secret, downwardAPI and projected volumes are
//! written so a reader never sees half an update.
//!
//! The files live in a hidden timestamped directory (`..2026_01_02_15_04_05.123456789`); the
//! `..data` symlink names the current one, and each user-visible top-level name is a relative
//! symlink through it (`key -> ..data/key`). An update writes a new timestamped directory,
//! points a temporary symlink (`..data_tmp`) at it and renames that over `..data` (a rename is
//! atomic), then removes the names no longer in the payload and the previous directory.
//! Names starting with `..` are the writer's own.
//!
//! A write compares the payload with what is on disk first and changes nothing when they
//! agree, so calling it on every sync costs reads, not writes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The symlink naming the current payload directory.
pub const DATA_DIR: &str = "..data";
/// The symlink renamed over [`DATA_DIR`] to switch payloads.
const DATA_DIR_TMP: &str = "..data_tmp";
/// Longest file name of a payload path (upstream's limit).
const MAX_FILE_NAME: usize = 255;
/// Longest payload path (upstream's limit).
const MAX_PATH: usize = 4096;

/// One file of a payload: its bytes and its mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    /// The file's contents.
    pub data: Vec<u8>,
    /// Its permission bits (`0o644`).
    pub mode: u32,
    /// The group it belongs to (the pod's `fsGroup`), or the writer's own.
    pub gid: Option<u32>,
}

/// What a volume holds: relative paths to their files.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a payload could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A path of the payload is not one the writer accepts (upstream's words).
    #[error("{0}")]
    InvalidPath(String),
    /// The file system refused.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError::Io { what, path, source }
}

/// Checks one payload path as the kubelet does: not empty, relative, no `..` element, not
/// starting with `..`, names at most 255 bytes and the path at most 4096. `Err` is
/// upstream's message.
pub fn validate_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err(format!("invalid path: must not be empty: {path:?}"));
    }
    if path.starts_with('/') {
        return Err(format!("invalid path: must be relative path: {path}"));
    }
    if path.len() > MAX_PATH {
        return Err(format!(
            "invalid path: must be less than or equal to {MAX_PATH} characters"
        ));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return Err(format!("invalid path: must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME {
            return Err(format!(
                "invalid path: filenames must be less than or equal to {MAX_FILE_NAME} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(format!("invalid path: must not start with '..': {path}"));
    }
    Ok(())
}

/// `path` without empty and `.` elements (Go's `filepath.Clean` for the relative paths
/// [`validate_path`] lets through).
fn clean(path: &str) -> String {
    path.split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// The directory `..data` points at now, if the volume was written before.
pub fn current_data_dir(target: &Path) -> Option<PathBuf> {
    let link = std::fs::read_link(target.join(DATA_DIR)).ok()?;
    Some(target.join(link))
}

/// Every path under `dir`, relative to it (directories included).
fn walk(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        if entry.file_type()?.is_dir() {
            walk(&entry.path(), &rel, out)?;
        }
        out.insert(rel);
    }
    Ok(())
}

/// Whether `file` differs from what `path` holds (missing, other bytes, other mode).
fn differs(path: &Path, file: &FileProjection) -> io::Result<bool> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    if !meta.is_file() || meta.permissions().mode() & 0o7777 != file.mode {
        return Ok(true);
    }
    if file.gid.is_some_and(|gid| gid != meta.gid()) {
        return Ok(true);
    }
    if meta.len() != file.data.len() as u64 {
        return Ok(true);
    }
    Ok(std::fs::read(path)? != file.data)
}

/// A new, empty timestamped directory in `target`, mode 0755 whatever the umask.
fn new_timestamp_dir(target: &Path) -> Result<PathBuf, WriteError> {
    let stamp = chrono::Utc::now().format("..%Y_%m_%d_%H_%M_%S.");
    loop {
        let suffix: u32 = rand::random::<u32>() % 1_000_000_000;
        let dir = target.join(format!("{stamp}{suffix}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                    .map_err(io_err("setting the mode of", &dir))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err("creating", &dir)(e)),
        }
    }
}

/// Writes `payload` into `dir`, each file with its mode whatever the umask.
fn write_payload(dir: &Path, payload: &Payload) -> Result<(), WriteError> {
    for (rel, file) in payload {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
        }
        std::fs::write(&path, &file.data).map_err(io_err("writing", &path))?;
        if let Some(gid) = file.gid {
            std::os::unix::fs::chown(&path, None, Some(gid))
                .map_err(io_err("changing the group of", &path))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode))
            .map_err(io_err("setting the mode of", &path))?;
    }
    Ok(())
}

/// Projects `payload` into `target` (which must exist) atomically. Returns whether anything
/// was written: `false` when the volume already holds exactly this payload.
pub fn write(target: &Path, payload: &Payload) -> Result<bool, WriteError> {
    let mut clean_payload = Payload::new();
    for (path, file) in payload {
        validate_path(path).map_err(WriteError::InvalidPath)?;
        clean_payload.insert(clean(path), file.clone());
    }
    let data_link = target.join(DATA_DIR);
    let old = match std::fs::read_link(&data_link) {
        Ok(link) => Some(link),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("reading the link", &data_link)(e)),
    };

    // Every path of the new payload and each directory above it stays.
    let mut keep = BTreeSet::new();
    for rel in clean_payload.keys() {
        let mut p = rel.as_str();
        loop {
            keep.insert(p.to_string());
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
    }
    let mut remove = BTreeSet::new();
    if let Some(old) = &old {
        let old_dir = target.join(old);
        let mut existing = BTreeSet::new();
        match walk(&old_dir, "", &mut existing) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("reading", &old_dir)(e)),
        }
        remove = existing.difference(&keep).cloned().collect();
        let mut changed = false;
        for (rel, file) in &clean_payload {
            let path = old_dir.join(rel);
            if differs(&path, file).map_err(io_err("reading", &path))? {
                changed = true;
                break;
            }
        }
        if !changed && remove.is_empty() {
            return Ok(false);
        }
    }

    let ts_dir = new_timestamp_dir(target)?;
    let ts_name = ts_dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    if let Err(e) = write_payload(&ts_dir, &clean_payload) {
        let _ = std::fs::remove_dir_all(&ts_dir);
        return Err(e);
    }
    // The user-visible names: each top-level name once, through `..data`.
    for rel in &clean_payload {
        let top = rel.0.split('/').next().unwrap_or_default();
        let visible = target.join(top);
        match std::fs::symlink_metadata(&visible) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                symlink(Path::new(DATA_DIR).join(top), &visible)
                    .map_err(io_err("linking", &visible))?;
            }
            Err(e) => return Err(io_err("reading", &visible)(e)),
        }
    }
    let tmp_link = target.join(DATA_DIR_TMP);
    // Left by a write that failed half-way; it is replaced.
    let _ = std::fs::remove_file(&tmp_link);
    if let Err(e) = symlink(&ts_name, &tmp_link) {
        let _ = std::fs::remove_dir_all(&ts_dir);
        return Err(io_err("linking", &tmp_link)(e));
    }
    if let Err(e) = std::fs::rename(&tmp_link, &data_link) {
        let _ = std::fs::remove_file(&tmp_link);
        let _ = std::fs::remove_dir_all(&ts_dir);
        return Err(io_err("renaming over", &data_link)(e));
    }
    // Only top-level names are links of the target; deeper paths went with the old directory.
    for rel in remove.iter().filter(|r| !r.contains('/')) {
        let path = target.join(rel);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_err("removing", &path)(e))
            }
            _ => {}
        }
    }
    // The previous payload, and any left by an earlier write that failed half-way.
    let entries = std::fs::read_dir(target).map_err(io_err("reading", target))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("..")
            && name != DATA_DIR
            && *name != *ts_name.to_string_lossy()
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(io_err("removing", &path))?;
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            gid: None,
        }
    }

    fn read(target: &Path, rel: &str) -> String {
        std::fs::read_to_string(target.join(rel)).unwrap()
    }

    fn names(target: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(target)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn paths_are_checked_with_upstreams_words() {
        assert_eq!(validate_path("a/b.txt"), Ok(()));
        assert_eq!(
            validate_path(".."),
            Err("invalid path: must not contain '..': ..".into())
        );
        assert_eq!(
            validate_path("a/../b"),
            Err("invalid path: must not contain '..': a/../b".into())
        );
        assert_eq!(
            validate_path("..data"),
            Err("invalid path: must not start with '..': ..data".into())
        );
        assert_eq!(
            validate_path("/etc/passwd"),
            Err("invalid path: must be relative path: /etc/passwd".into())
        );
        assert_eq!(
            validate_path(""),
            Err("invalid path: must not be empty: \"\"".into())
        );
        assert!(validate_path(&"x".repeat(256)).is_err());
    }

    #[test]
    fn a_payload_is_linked_through_data_and_swapped_whole() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let first = Payload::from([
            ("a".to_string(), file("1", 0o644)),
            ("sub/b".to_string(), file("2", 0o600)),
        ]);
        assert!(write(t, &first).unwrap());
        assert_eq!(read(t, "a"), "1");
        assert_eq!(read(t, "sub/b"), "2");
        assert_eq!(
            std::fs::read_link(t.join("a")).unwrap(),
            Path::new("..data/a")
        );
        assert_eq!(
            std::fs::read_link(t.join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        let ts = std::fs::read_link(t.join(DATA_DIR)).unwrap();
        let ts = ts.to_string_lossy().into_owned();
        assert!(ts.starts_with("..") && ts.len() > 20, "{ts}");
        let mode = std::fs::metadata(t.join("sub/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600);
        assert_eq!(names(t), [ts.as_str(), "..data", "a", "sub"]);

        // The same payload again writes nothing.
        assert!(!write(t, &first).unwrap());
        assert_eq!(
            std::fs::read_link(t.join(DATA_DIR))
                .unwrap()
                .to_string_lossy(),
            ts
        );

        // A changed value and a removed name: a new directory, the old one and the stale
        // name gone.
        let second = Payload::from([("a".to_string(), file("changed", 0o644))]);
        assert!(write(t, &second).unwrap());
        assert_eq!(read(t, "a"), "changed");
        let ts2 = std::fs::read_link(t.join(DATA_DIR)).unwrap();
        let ts2 = ts2.to_string_lossy().into_owned();
        assert_ne!(ts, ts2);
        assert_eq!(names(t), [ts2.as_str(), "..data", "a"]);

        // A mode change alone is a change.
        let third = Payload::from([("a".to_string(), file("changed", 0o400))]);
        assert!(write(t, &third).unwrap());
        let mode = std::fs::metadata(t.join("a")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o400);
    }

    #[test]
    fn an_empty_payload_still_has_data_and_bad_paths_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        assert!(write(t, &Payload::new()).unwrap());
        assert!(current_data_dir(t).unwrap().is_dir());
        let bad = Payload::from([("../x".to_string(), file("x", 0o644))]);
        assert!(matches!(write(t, &bad), Err(WriteError::InvalidPath(_))));
        assert_eq!(names(t).len(), 2);
    }
}
