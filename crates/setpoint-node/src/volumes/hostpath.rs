//! `hostPath` volumes: a path of the node, checked against the volume's `type` first as
//! the kubelet checks it (and created for `DirectoryOrCreate` and `FileOrCreate`).

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a path of the node is, in the words of the kubelet's `GetFileType`.
fn file_type(path: &Path) -> io::Result<&'static str> {
    let t = std::fs::metadata(path)?.file_type();
    Ok(if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        return Err(io::Error::other(
            "only recognise file, directory, socket, block device and character device",
        ));
    })
}

/// Checks (and for the `...OrCreate` types, makes) `path` as a `hostPath` volume of
/// `type_` (`None` or empty: no check). `Err` is the kubelet's message.
pub fn check_type(path: &Path, type_: Option<&str>) -> Result<(), String> {
    let shown = path.display();
    let expect = |wanted: &'static str, description: &str| -> Result<(), String> {
        if std::fs::metadata(path).is_err() {
            return Err(format!("hostPath {shown} doesn't exist"));
        }
        match file_type(path) {
            Ok(t) if t == wanted => Ok(()),
            Ok(t) => Err(format!(
                "hostPath type check failed: {shown} is not a {description}, it's a {t}"
            )),
            Err(e) => Err(format!(
                "hostPath type check failed, {shown} is not a {description}, unable to determine its type: {e}"
            )),
        }
    };
    match type_.unwrap_or_default() {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if std::fs::metadata(path).is_err() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(|e| format!("mkdir {shown}: {e}"))?;
            }
            expect("Directory", "directory")
        }
        "Directory" => expect("Directory", "directory"),
        "FileOrCreate" => {
            if std::fs::metadata(path).is_err() {
                match std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o644)
                    .open(path)
                {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("open {shown}: {e}")),
                }
            }
            expect("File", "file")
        }
        "File" => expect("File", "file"),
        "Socket" => expect("Socket", "socket file"),
        "CharDevice" => expect("CharDevice", "character device"),
        "BlockDevice" => expect("BlockDevice", "block device"),
        other => Err(format!("{other} is an invalid volume type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn types_are_checked_and_created_with_the_kubelets_words() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = d.join("f");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(check_type(&file, None), Ok(()));
        assert_eq!(check_type(&file, Some("File")), Ok(()));
        assert_eq!(
            check_type(&file, Some("Directory")).unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
        assert_eq!(
            check_type(d, Some("Socket")).unwrap_err(),
            format!(
                "hostPath type check failed: {} is not a socket file, it's a Directory",
                d.display()
            )
        );
        let missing = d.join("missing");
        assert_eq!(
            check_type(&missing, Some("Directory")).unwrap_err(),
            format!("hostPath {} doesn't exist", missing.display())
        );
        assert_eq!(
            check_type(&missing, Some("CharDevice")).unwrap_err(),
            format!("hostPath {} doesn't exist", missing.display())
        );
        assert_eq!(
            check_type(Path::new("/dev/null"), Some("CharDevice")),
            Ok(())
        );
        assert_eq!(
            check_type(&file, Some("Nope")).unwrap_err(),
            "Nope is an invalid volume type"
        );

        let made = d.join("a/b");
        assert_eq!(check_type(&made, Some("DirectoryOrCreate")), Ok(()));
        assert!(made.is_dir());
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o022, 0o755 & !0o022);
        let new_file = d.join("new");
        assert_eq!(check_type(&new_file, Some("FileOrCreate")), Ok(()));
        assert!(new_file.is_file());
        // Existing content is kept.
        assert_eq!(check_type(&file, Some("FileOrCreate")), Ok(()));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
        assert!(check_type(&file, Some("DirectoryOrCreate")).is_err());
    }
}
