//! Where audit events go: standard output, or a file rotated as kube-apiserver's log backend
//! (lumberjack) rotates it, written in one of upstream's two modes.
//!
//! Rotation: before a write would take the file past `max_size` MB (100 when 0, lumberjack's
//! default), the file is renamed to `<name>-<UTC time 2006-01-02T15-04-05.000><.ext>` beside
//! it and a new one is started; then backups beyond `max_backups` (0 keeps all) and older than
//! `max_age` days (0 keeps all) are removed, oldest first.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};

use chrono::{DateTime, NaiveDateTime, Utc};

/// Lumberjack's default file size, in MB, when none is given.
const DEFAULT_MAX_SIZE_MB: u64 = 100;
/// The time format of backup names (Go's `2006-01-02T15-04-05.000`).
const BACKUP_TIME_FORMAT: &str = "%Y-%m-%dT%H-%M-%S%.3f";

/// Rotation settings (`--audit-log-maxsize`, `--audit-log-maxbackup`, `--audit-log-maxage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rotation {
    /// Megabytes a file may reach before it is rotated; 0 means 100.
    pub max_size_mb: u64,
    /// Backups kept; 0 keeps all.
    pub max_backups: usize,
    /// Days a backup is kept; 0 keeps all.
    pub max_age_days: u64,
}

/// An output for event lines.
pub enum Output {
    /// Standard output (`--audit-log-path -`).
    Stdout,
    /// A file, rotated.
    File(RotatingFile),
}

impl Output {
    /// Opens the output for a path (`-` is standard output).
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<Output> {
        if path == Path::new("-") {
            return Ok(Output::Stdout);
        }
        Ok(Output::File(RotatingFile::open(path, rotation)?))
    }

    /// Writes lines (each ending in `\n`) and flushes them.
    pub fn write_lines(&mut self, lines: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(lines)?;
                out.flush()
            }
            Output::File(f) => f.write(lines),
        }
    }
}

/// A file that rotates past a size.
pub struct RotatingFile {
    path: PathBuf,
    rotation: Rotation,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens (appending to) or creates the file, and its directory, readable by its owner only
    /// (the events name users and may hold objects).
    pub fn open(path: &Path, rotation: Rotation) -> io::Result<RotatingFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            rotation,
            file,
            size,
        })
    }

    fn max_size(&self) -> u64 {
        let mb = if self.rotation.max_size_mb == 0 {
            DEFAULT_MAX_SIZE_MB
        } else {
            self.rotation.max_size_mb
        };
        mb * 1024 * 1024
    }

    /// Writes bytes, rotating first when they would take the file past its size.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let len = bytes.len() as u64;
        if len > self.max_size() {
            return Err(io::Error::other(format!(
                "write length {len} exceeds maximum file size {}",
                self.max_size()
            )));
        }
        if self.size + len > self.max_size() {
            self.rotate(Utc::now())?;
        }
        self.file.write_all(bytes)?;
        self.size += len;
        Ok(())
    }

    /// Renames the file to a timestamped backup, starts a new one and prunes old backups.
    fn rotate(&mut self, now: DateTime<Utc>) -> io::Result<()> {
        let backup = backup_path(&self.path, now);
        std::fs::rename(&self.path, &backup)?;
        self.file = open_append(&self.path)?;
        self.size = 0;
        for old in self.expired_backups(now)? {
            if let Err(e) = std::fs::remove_file(&old) {
                tracing::warn!(file = %old.display(), error = %e, "removing an old audit log");
            }
        }
        Ok(())
    }

    /// The backups to remove: beyond the count kept, or older than the age kept.
    fn expired_backups(&self, now: DateTime<Utc>) -> io::Result<Vec<PathBuf>> {
        let dir = match self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => d.to_path_buf(),
            None => PathBuf::from("."),
        };
        let (stem, ext) = stem_and_ext(&self.path);
        let mut backups: Vec<(DateTime<Utc>, PathBuf)> = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                backup_time(&name, &stem, &ext).map(|t| (t, e.path()))
            })
            .collect();
        backups.sort_by_key(|b| std::cmp::Reverse(b.0));
        Ok(expired(&backups, self.rotation, now))
    }
}

/// Which backups (newest first) go: those past the count kept, and those past the age kept.
fn expired(
    newest_first: &[(DateTime<Utc>, PathBuf)],
    rotation: Rotation,
    now: DateTime<Utc>,
) -> Vec<PathBuf> {
    let cutoff = (rotation.max_age_days > 0)
        .then(|| now - chrono::Duration::days(rotation.max_age_days as i64));
    newest_first
        .iter()
        .enumerate()
        .filter(|(i, (t, _))| {
            (rotation.max_backups > 0 && *i >= rotation.max_backups)
                || cutoff.is_some_and(|c| *t < c)
        })
        .map(|(_, (_, p))| p.clone())
        .collect()
}

fn open_append(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// `audit.log` → (`audit`, `.log`); a name without an extension has `""`.
fn stem_and_ext(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match path.extension() {
        Some(ext) => {
            let ext = format!(".{}", ext.to_string_lossy());
            (name[..name.len() - ext.len()].to_string(), ext)
        }
        None => (name, String::new()),
    }
}

/// `<dir>/<stem>-<time><ext>`.
pub fn backup_path(path: &Path, now: DateTime<Utc>) -> PathBuf {
    let (stem, ext) = stem_and_ext(path);
    let name = format!("{stem}-{}{ext}", now.format(BACKUP_TIME_FORMAT));
    path.with_file_name(name)
}

/// The time in a backup's name, if it is one of this file's backups.
fn backup_time(name: &str, stem: &str, ext: &str) -> Option<DateTime<Utc>> {
    let middle = name
        .strip_prefix(stem)?
        .strip_prefix('-')?
        .strip_suffix(ext)?;
    NaiveDateTime::parse_from_str(middle, BACKUP_TIME_FORMAT)
        .ok()
        .map(|t| t.and_utc())
}

/// The batch mode's queue: a writer thread drains it; a full queue drops events.
pub struct Batch {
    sender: SyncSender<Vec<u8>>,
}

impl Batch {
    /// Starts the writer thread over `output` with a queue of `buffer` events. `on_error` is
    /// called with the number of events a failed write lost.
    pub fn start(
        mut output: Output,
        buffer: usize,
        on_error: impl Fn(u64) + Send + 'static,
    ) -> io::Result<Batch> {
        let (sender, receiver): (SyncSender<Vec<u8>>, Receiver<Vec<u8>>) =
            sync_channel(buffer.max(1));
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                // Each wake-up writes what has queued since, as one write and one flush.
                while let Ok(first) = receiver.recv() {
                    let mut lines = first;
                    let mut n = 1u64;
                    while let Ok(more) = receiver.try_recv() {
                        lines.extend_from_slice(&more);
                        n += 1;
                    }
                    if let Err(e) = output.write_lines(&lines) {
                        tracing::error!(error = %e, events = n, "writing the audit log");
                        on_error(n);
                    }
                }
            })?;
        Ok(Batch { sender })
    }

    /// Queues one line; `false` when the queue was full and the line was dropped.
    pub fn push(&self, line: Vec<u8>) -> bool {
        match self.sender.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn backup_names_as_lumberjack() {
        let p = backup_path(
            Path::new("/var/log/audit.log"),
            at("2026-11-27T13:04:05.123456Z"),
        );
        assert_eq!(
            p,
            PathBuf::from("/var/log/audit-2026-11-27T13-04-05.123.log")
        );
        assert_eq!(
            backup_time("audit-2026-11-27T13-04-05.123.log", "audit", ".log"),
            Some(at("2026-11-27T13:04:05.123Z"))
        );
        assert_eq!(backup_time("audit.log", "audit", ".log"), None);
        assert_eq!(
            backup_time("other-2026-11-27T13-04-05.123.log", "audit", ".log"),
            None
        );
        let p = backup_path(Path::new("audit"), at("2026-11-27T13:04:05Z"));
        assert_eq!(p, PathBuf::from("audit-2026-11-27T13-04-05.000"));
    }

    #[test]
    fn expired_by_count_and_age() {
        let now = at("2026-11-27T00:00:00Z");
        let b = |s: &str, n: &str| (at(s), PathBuf::from(n));
        let backups = vec![
            b("2026-11-26T00:00:00Z", "a"),
            b("2026-11-25T00:00:00Z", "b"),
            b("2026-11-20T00:00:00Z", "c"),
        ];
        let keep_all = Rotation::default();
        assert!(expired(&backups, keep_all, now).is_empty());
        let two = Rotation {
            max_backups: 2,
            ..keep_all
        };
        assert_eq!(expired(&backups, two, now), vec![PathBuf::from("c")]);
        let week = Rotation {
            max_age_days: 3,
            ..keep_all
        };
        assert_eq!(expired(&backups, week, now), vec![PathBuf::from("c")]);
        let one_day = Rotation {
            max_age_days: 1,
            max_backups: 1,
            ..keep_all
        };
        assert_eq!(
            expired(&backups, one_day, now),
            vec![PathBuf::from("b"), PathBuf::from("c")]
        );
    }

    #[test]
    fn rotates_past_max_size_and_keeps_max_backups() {
        let dir =
            std::env::temp_dir().join(format!("setpoint-audit-rotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("audit.log");
        let rotation = Rotation {
            max_size_mb: 1,
            max_backups: 1,
            max_age_days: 0,
        };
        let mut f = RotatingFile::open(&path, rotation).unwrap();
        let line = vec![b'x'; 600 * 1024];
        f.write(&line).unwrap();
        // The second line would pass 1 MB: the first file becomes a backup.
        f.write(&line).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), line.len() as u64);
        // A second rotation, a second later: two backups, of which one is kept.
        f.rotate(Utc::now() + chrono::Duration::seconds(1)).unwrap();
        f.write(&line).unwrap();
        let backups: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "audit.log")
            .collect();
        assert_eq!(backups.len(), 1, "{backups:?}");
        assert!(backups[0].starts_with("audit-") && backups[0].ends_with(".log"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let too_big = vec![b'x'; 2 * 1024 * 1024];
        assert!(f
            .write(&too_big)
            .unwrap_err()
            .to_string()
            .starts_with("write length 2097152 exceeds maximum file size 1048576"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
