//! A minimal POSIX ustar writer: regular files, directories and symlinks, which is all an
//! image layer and an OCI layout archive need. Output is deterministic (fixed mtime, numeric
//! owners, no user or group names), so equal input gives equal bytes and equal digests.

use std::io::{self, Write};

const BLOCK: usize = 512;

/// What one archive member is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TarKind {
    /// A regular file with these contents.
    File(Vec<u8>),
    /// A directory.
    Dir,
    /// A symbolic link to this target.
    Symlink(String),
}

/// One archive member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TarEntry {
    /// The path inside the archive, relative (no leading `/`); directories without a
    /// trailing slash (one is added).
    pub path: String,
    /// Permission bits (e.g. `0o755`, `0o1777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// File, directory or symlink.
    pub kind: TarKind,
}

/// Why an entry cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    /// A path or link target longer than ustar can hold.
    #[error("tar: {0:?} is too long for a ustar header")]
    NameTooLong(String),
    /// A file larger than the header's 8 GiB size field.
    #[error("tar: {0:?} is too large for a ustar header")]
    TooLarge(String),
    /// Writing the output failed.
    #[error("tar: {0}")]
    Io(#[from] io::Error),
}

/// Writes `entries` in order, then the end-of-archive marker.
pub fn write_tar<W: Write>(out: &mut W, entries: &[TarEntry]) -> Result<(), TarError> {
    for entry in entries {
        write_entry(out, entry)?;
    }
    out.write_all(&[0u8; BLOCK * 2])?;
    Ok(())
}

/// The archive as bytes.
pub fn tar_bytes(entries: &[TarEntry]) -> Result<Vec<u8>, TarError> {
    let mut out = Vec::new();
    write_tar(&mut out, entries)?;
    Ok(out)
}

fn write_entry<W: Write>(out: &mut W, entry: &TarEntry) -> Result<(), TarError> {
    let mut path = entry.path.trim_start_matches('/').to_string();
    let (typeflag, size, link) = match &entry.kind {
        TarKind::File(data) => (b'0', data.len() as u64, ""),
        TarKind::Dir => {
            if !path.ends_with('/') {
                path.push('/');
            }
            (b'5', 0, "")
        }
        TarKind::Symlink(target) => (b'2', 0, target.as_str()),
    };
    let mut header = [0u8; BLOCK];
    let (prefix, name) = split_path(&path).ok_or_else(|| TarError::NameTooLong(path.clone()))?;
    header[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut header[100..108], u64::from(entry.mode & 0o7777));
    octal(&mut header[108..116], u64::from(entry.uid));
    octal(&mut header[116..124], u64::from(entry.gid));
    if size >= 1 << 33 {
        return Err(TarError::TooLarge(path));
    }
    octal(&mut header[124..136], size);
    octal(&mut header[136..148], 0);
    header[156] = typeflag;
    if link.len() > 100 {
        return Err(TarError::NameTooLong(link.to_string()));
    }
    header[157..157 + link.len()].copy_from_slice(link.as_bytes());
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    // The checksum is computed with its own field read as spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    // Six octal digits, NUL, space: the traditional layout every reader accepts.
    let digits = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(digits.as_bytes());
    out.write_all(&header)?;
    if let TarKind::File(data) = &entry.kind {
        out.write_all(data)?;
        let pad = (BLOCK - data.len() % BLOCK) % BLOCK;
        out.write_all(&vec![0u8; pad])?;
    }
    Ok(())
}

/// Splits a path into ustar's prefix (≤ 155 bytes) and name (≤ 100 bytes) at a slash.
fn split_path(path: &str) -> Option<(&str, &str)> {
    if path.len() <= 100 {
        return Some(("", path));
    }
    // The name part may itself end in '/' (directories); split at an earlier slash.
    let search = path.trim_end_matches('/');
    search
        .char_indices()
        .filter(|&(_, c)| c == '/')
        .map(|(i, _)| (&path[..i], &path[i + 1..]))
        .find(|(prefix, name)| prefix.len() <= 155 && name.len() <= 100 && !name.is_empty())
}

/// Writes `value` as zero-padded octal filling the field but its last byte (NUL).
fn octal(field: &mut [u8], value: u64) {
    let width = field.len() - 1;
    let text = format!("{value:0width$o}");
    field[..width].copy_from_slice(text.as_bytes());
    field[width] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &[u8]) -> TarEntry {
        TarEntry {
            path: path.into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            kind: TarKind::File(data.to_vec()),
        }
    }

    fn field(header: &[u8], range: std::ops::Range<usize>) -> String {
        String::from_utf8_lossy(&header[range])
            .trim_end_matches('\0')
            .to_string()
    }

    #[test]
    fn file_dir_and_symlink_headers() {
        let bytes = tar_bytes(&[
            TarEntry {
                path: "tmp".into(),
                mode: 0o1777,
                uid: 0,
                gid: 0,
                kind: TarKind::Dir,
            },
            file("etc/passwd", b"root:x:0:0::/:/bin/sh\n"),
            TarEntry {
                path: "bin/sh".into(),
                mode: 0o777,
                uid: 0,
                gid: 0,
                kind: TarKind::Symlink("busybox".into()),
            },
        ])
        .unwrap();
        // Three headers, one data block, two end blocks.
        assert_eq!(bytes.len(), 512 * 6);
        let dir = &bytes[..512];
        assert_eq!(field(dir, 0..100), "tmp/");
        assert_eq!(dir[156], b'5');
        assert_eq!(field(dir, 100..108), "0001777");
        let f = &bytes[512..1024];
        assert_eq!(field(f, 0..100), "etc/passwd");
        assert_eq!(field(f, 124..136), format!("{:011o}", 22));
        assert_eq!(&bytes[1024..1046], b"root:x:0:0::/:/bin/sh\n");
        let link = &bytes[1536..2048];
        assert_eq!(link[156], b'2');
        assert_eq!(field(link, 157..257), "busybox");
        assert!(bytes[2048..].iter().all(|&b| b == 0));
        // Checksums: the header's bytes with the checksum field as spaces.
        for header in [dir, f, link] {
            let mut copy = header.to_vec();
            copy[148..156].copy_from_slice(b"        ");
            let sum: u32 = copy.iter().map(|&b| u32::from(b)).sum();
            let stored = u32::from_str_radix(field(header, 148..154).trim(), 8).unwrap();
            assert_eq!(sum, stored);
        }
    }

    #[test]
    fn long_paths_use_the_prefix() {
        let dir = "d".repeat(80);
        let path = format!("{dir}/{}", "f".repeat(60));
        let bytes = tar_bytes(&[file(&path, b"x")]).unwrap();
        assert_eq!(field(&bytes, 0..100), "f".repeat(60));
        assert_eq!(field(&bytes, 345..500), dir);
        let too_long = "x".repeat(300);
        assert!(matches!(
            tar_bytes(&[file(&too_long, b"")]),
            Err(TarError::NameTooLong(_))
        ));
    }

    #[test]
    fn output_is_deterministic() {
        let entries = [file("a", b"1"), file("b", b"2")];
        assert_eq!(tar_bytes(&entries).unwrap(), tar_bytes(&entries).unwrap());
    }
}
