//! Images without a registry: an OCI image layout archive written from a list of files, and
//! the two images every node needs built from the host's static busybox and imported into
//! containerd with `ctr images import`.
//!
//! Layers are uncompressed tars (`application/vnd.oci.image.layer.v1.tar`), so a layer's
//! digest is also its diff id, and every byte is deterministic: the same inputs give the
//! same digests, which is what lets a built archive be cached by content.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::hex;
use super::tar::{tar_bytes, TarEntry, TarKind};
use super::ContainerdError;

/// A busybox image for tests and small workloads: every applet of the host's static
/// busybox under `/bin`, `root` and `nobody` users, `/tmp`; runs `sh`.
pub const BUSYBOX_IMAGE: &str = "setpoint.local/busybox:1";

/// The sandbox ("pause") image the CRI plugin runs first in every pod: sleeps as PID 1
/// and exits 0 on SIGTERM or SIGINT.
pub const PAUSE_IMAGE: &str = "setpoint.local/pause:3.10";

/// Where Debian's busybox-static installs its binary.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// containerd's namespace of the CRI plugin: images there are the ones pods can run.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// The pause entrypoint: PID 1 gets no default signal actions, so it must trap TERM and INT
/// to exit on them; `sleep` runs in the background so the trap runs as soon as a signal
/// arrives rather than after the sleep.
const PAUSE_SCRIPT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// Applets tests and workloads rely on; the build fails if the host's busybox lacks one.
pub const REQUIRED_APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "httpd", "tar", "ls", "id", "wget", "nc", "env", "true", "false",
    "kill", "ps", "mkdir", "rm", "hostname", "ip", "stty",
];

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// These bytes.
    Bytes(Vec<u8>),
    /// The contents of a file of the host, read when the layer is built.
    Host(PathBuf),
}

/// One entry of an image's single layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerEntry {
    /// A regular file.
    File {
        /// Absolute path in the image.
        path: String,
        /// Permission bits.
        mode: u32,
        /// The contents.
        source: FileSource,
    },
    /// A directory.
    Dir {
        /// Absolute path in the image.
        path: String,
        /// Permission bits (`0o1777` for `/tmp`).
        mode: u32,
    },
    /// A symbolic link.
    Symlink {
        /// Absolute path in the image.
        path: String,
        /// What it points to.
        target: String,
    },
}

/// The runtime settings of an image's config (`config` in the OCI image config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunConfig {
    /// `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `Cmd`.
    pub cmd: Vec<String>,
    /// `Env`, as `NAME=value`.
    pub env: Vec<String>,
    /// `User`, if any.
    pub user: Option<String>,
    /// `WorkingDir`, if any.
    pub working_dir: Option<String>,
}

/// An image to write: its name (as containerd will list it), its config and one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The full reference, e.g. `setpoint.local/busybox:1`.
    pub name: String,
    /// Entrypoint, Cmd, Env, User, WorkingDir.
    pub config: RunConfig,
    /// The layer's contents, in archive order (parents before children).
    pub entries: Vec<LayerEntry>,
}

/// An OCI image layout archive in memory, with the digest of its manifest.
#[derive(Debug, Clone)]
pub struct OciArchive {
    /// The archive (`oci-layout`, `index.json`, `blobs/sha256/...`).
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of the image manifest.
    pub manifest_digest: String,
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    format!(
        "sha256:{}",
        hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
    )
}

/// The OCI name of this machine's architecture.
pub fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// Writes `spec` as an OCI image layout archive: `oci-layout`, `index.json` naming the
/// image by `io.containerd.image.name` (the full reference `ctr images import` uses) and
/// `org.opencontainers.image.ref.name` (its tag), then the manifest, config and layer blobs.
pub fn oci_archive(spec: &ImageSpec) -> Result<OciArchive, ContainerdError> {
    let layer = tar_bytes(&layer_tar_entries(&spec.entries)?)
        .map_err(|e| ContainerdError::Image(e.to_string()))?;
    let layer_digest = sha256_digest(&layer);
    let mut run = serde_json::Map::new();
    if !spec.config.entrypoint.is_empty() {
        run.insert("Entrypoint".into(), json!(spec.config.entrypoint));
    }
    if !spec.config.cmd.is_empty() {
        run.insert("Cmd".into(), json!(spec.config.cmd));
    }
    if !spec.config.env.is_empty() {
        run.insert("Env".into(), json!(spec.config.env));
    }
    if let Some(user) = &spec.config.user {
        run.insert("User".into(), json!(user));
    }
    if let Some(dir) = &spec.config.working_dir {
        run.insert("WorkingDir".into(), json!(dir));
    }
    let config = to_vec(&json!({
        // A fixed time keeps the config, and so the image's digest, a function of its content.
        "created": "1970-01-01T00:00:00Z",
        "architecture": oci_architecture(),
        "os": "linux",
        "config": run,
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    }));
    let config_digest = sha256_digest(&config);
    let manifest = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    }));
    let manifest_digest = sha256_digest(&manifest);
    let tag = spec
        .name
        .rsplit_once(':')
        .filter(|(repo, _)| !repo.is_empty())
        .map(|(_, tag)| tag)
        .filter(|tag| !tag.contains('/'))
        .unwrap_or("latest");
    let index = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": oci_architecture(), "os": "linux" },
            "annotations": {
                "io.containerd.image.name": spec.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }));
    let blob = |digest: &str, data: Vec<u8>| TarEntry {
        path: format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")),
        mode: 0o644,
        uid: 0,
        gid: 0,
        kind: TarKind::File(data),
    };
    let dir = |path: &str| TarEntry {
        path: path.into(),
        mode: 0o755,
        uid: 0,
        gid: 0,
        kind: TarKind::Dir,
    };
    let archive = tar_bytes(&[
        TarEntry {
            path: "oci-layout".into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            kind: TarKind::File(to_vec(&json!({ "imageLayoutVersion": "1.0.0" }))),
        },
        TarEntry {
            path: "index.json".into(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            kind: TarKind::File(index),
        },
        dir("blobs"),
        dir("blobs/sha256"),
        blob(&manifest_digest, manifest),
        blob(&config_digest, config),
        blob(&layer_digest, layer),
    ])
    .map_err(|e| ContainerdError::Image(e.to_string()))?;
    Ok(OciArchive {
        bytes: archive,
        manifest_digest,
    })
}

fn to_vec(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn layer_tar_entries(entries: &[LayerEntry]) -> Result<Vec<TarEntry>, ContainerdError> {
    entries
        .iter()
        .map(|entry| {
            let (path, mode, kind) = match entry {
                LayerEntry::File { path, mode, source } => {
                    let data = match source {
                        FileSource::Bytes(b) => b.clone(),
                        FileSource::Host(host) => std::fs::read(host)
                            .map_err(ContainerdError::io(format!("reading {}", host.display())))?,
                    };
                    (path, *mode, TarKind::File(data))
                }
                LayerEntry::Dir { path, mode } => (path, *mode, TarKind::Dir),
                LayerEntry::Symlink { path, target } => {
                    (path, 0o777, TarKind::Symlink(target.clone()))
                }
            };
            Ok(TarEntry {
                path: path.trim_start_matches('/').to_string(),
                mode,
                uid: 0,
                gid: 0,
                kind,
            })
        })
        .collect()
}

/// Whether the ELF file `data` is statically linked: it has no `PT_INTERP` program header
/// (a dynamic executable names its loader there). `None` if `data` is not an ELF file.
pub fn elf_is_static(data: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        return None;
    }
    let little = match data[5] {
        1 => true,
        2 => false,
        _ => return None,
    };
    let uint = |at: usize, len: usize| -> Option<u64> {
        let bytes = data.get(at..at + len)?;
        let mut v = 0u64;
        for i in 0..len {
            let b = if little { bytes[len - 1 - i] } else { bytes[i] };
            v = (v << 8) | u64::from(b);
        }
        Some(v)
    };
    let (phoff, phentsize, phnum) = match data[4] {
        1 => (uint(0x1c, 4)?, uint(0x2a, 2)?, uint(0x2c, 2)?),
        2 => (uint(0x20, 8)?, uint(0x36, 2)?, uint(0x38, 2)?),
        _ => return None,
    };
    for i in 0..phnum {
        let at = usize::try_from(phoff + i * phentsize).ok()?;
        if uint(at, 4)? as u32 == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The layer entries of a busybox root: the binary at `/bin/busybox`, a symlink per applet,
/// `/etc/passwd` and `/etc/group` with `root` and `nobody` (65534), a world-writable `/tmp`.
pub fn busybox_rootfs(busybox: &Path, applets: &[String]) -> Vec<LayerEntry> {
    let dir = |path: &str, mode| LayerEntry::Dir {
        path: path.into(),
        mode,
    };
    let text = |path: &str, content: &str| LayerEntry::File {
        path: path.into(),
        mode: 0o644,
        source: FileSource::Bytes(content.as_bytes().to_vec()),
    };
    let mut entries = vec![
        dir("/bin", 0o755),
        LayerEntry::File {
            path: "/bin/busybox".into(),
            mode: 0o755,
            source: FileSource::Host(busybox.to_path_buf()),
        },
    ];
    let mut names: Vec<&String> = applets.iter().filter(|a| a.as_str() != "busybox").collect();
    names.sort();
    names.dedup();
    entries.extend(names.into_iter().map(|applet| LayerEntry::Symlink {
        path: format!("/bin/{applet}"),
        target: "busybox".into(),
    }));
    entries.extend([
        dir("/etc", 0o755),
        text(
            "/etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        ),
        text("/etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        dir("/root", 0o700),
        dir("/tmp", 0o1777),
        dir("/proc", 0o555),
        dir("/sys", 0o555),
        dir("/dev", 0o755),
    ]);
    entries
}

/// The host's static busybox and its applets, or an error saying what to install.
pub fn host_busybox() -> Result<(PathBuf, Vec<String>), ContainerdError> {
    let path = PathBuf::from(HOST_BUSYBOX);
    let install = "install a static busybox at /bin/busybox (Debian and Ubuntu: `apt-get install busybox-static`)";
    let data = std::fs::read(&path)
        .map_err(|e| ContainerdError::Missing(format!("{}: {e}; {install}", path.display())))?;
    match elf_is_static(&data) {
        Some(true) => {}
        Some(false) => {
            return Err(ContainerdError::Missing(format!(
                "{} is dynamically linked, so it cannot run alone in an image; {install}",
                path.display()
            )))
        }
        None => {
            return Err(ContainerdError::Missing(format!(
                "{} is not an ELF executable; {install}",
                path.display()
            )))
        }
    }
    let out = std::process::Command::new(&path)
        .arg("--list")
        .output()
        .map_err(ContainerdError::io(format!(
            "running {} --list",
            path.display()
        )))?;
    let applets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains('/'))
        .map(str::to_string)
        .collect();
    let missing: Vec<&str> = REQUIRED_APPLETS
        .iter()
        .copied()
        .filter(|a| !applets.iter().any(|x| x == a))
        .collect();
    if !missing.is_empty() {
        return Err(ContainerdError::Missing(format!(
            "{} lacks the applets {}; {install}",
            path.display(),
            missing.join(", ")
        )));
    }
    Ok((path, applets))
}

/// The image specs of [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`] over one busybox root (the
/// two share their layer).
pub fn local_image_specs(busybox: &Path, applets: &[String]) -> [ImageSpec; 2] {
    let rootfs = busybox_rootfs(busybox, applets);
    let env = vec!["PATH=/bin".to_string()];
    [
        ImageSpec {
            name: BUSYBOX_IMAGE.into(),
            config: RunConfig {
                cmd: vec!["sh".into()],
                env: env.clone(),
                ..RunConfig::default()
            },
            entries: rootfs.clone(),
        },
        ImageSpec {
            name: PAUSE_IMAGE.into(),
            config: RunConfig {
                entrypoint: vec!["/bin/sh".into(), "-c".into(), PAUSE_SCRIPT.into()],
                env,
                working_dir: Some("/".into()),
                ..RunConfig::default()
            },
            entries: rootfs,
        },
    ]
}

/// The names of the images in containerd's CRI namespace.
pub async fn list_images(endpoint: &Path) -> Result<Vec<String>, ContainerdError> {
    let out = ctr(endpoint, &["images", "ls", "-q"]).await?;
    Ok(out.lines().map(|l| l.trim().to_string()).collect())
}

/// Runs `ctr --address <endpoint> --namespace k8s.io <args>`, returning its stdout.
pub async fn ctr(endpoint: &Path, args: &[&str]) -> Result<String, ContainerdError> {
    let mut command = tokio::process::Command::new("ctr");
    command
        .arg("--address")
        .arg(endpoint)
        .arg("--namespace")
        .arg(CRI_NAMESPACE)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let line = format!("ctr --address {} {}", endpoint.display(), args.join(" "));
    let out = command.output().await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ContainerdError::Missing(
                "ctr not found: install containerd (Debian: `apt-get install containerd`)".into(),
            )
        } else {
            ContainerdError::io(format!("running {line}"))(e)
        }
    })?;
    if !out.status.success() {
        return Err(ContainerdError::Command {
            command: line,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes `archive` to `cache_dir` named by its content's digest, unless it is there
/// already, and returns the path. Written to a temporary name and renamed, so concurrent
/// writers never expose a partial file.
pub fn cache_archive(cache_dir: &Path, archive: &OciArchive) -> Result<PathBuf, ContainerdError> {
    std::fs::create_dir_all(cache_dir).map_err(ContainerdError::io(format!(
        "creating {}",
        cache_dir.display()
    )))?;
    let digest = sha256_digest(&archive.bytes);
    let path = cache_dir.join(format!("{}.tar", digest.trim_start_matches("sha256:")));
    let matches = std::fs::read(&path)
        .map(|data| sha256_digest(&data) == digest)
        .unwrap_or(false);
    if !matches {
        let tmp = cache_dir.join(format!(
            ".{}.{}.tmp",
            digest.trim_start_matches("sha256:"),
            std::process::id()
        ));
        std::fs::write(&tmp, &archive.bytes)
            .map_err(ContainerdError::io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(ContainerdError::io(format!(
            "renaming to {}",
            path.display()
        )))?;
    }
    Ok(path)
}

/// Imports an OCI archive into containerd's CRI namespace, unpacked for the default
/// snapshotter (overlayfs, the CRI plugin's), so pods can run it without a pull.
pub async fn import_archive(endpoint: &Path, archive: &Path) -> Result<(), ContainerdError> {
    let path = archive.to_string_lossy();
    ctr(
        endpoint,
        &["images", "import", "--snapshotter", "overlayfs", &path],
    )
    .await?;
    Ok(())
}

/// Makes sure [`BUSYBOX_IMAGE`] and [`PAUSE_IMAGE`] are in the containerd at `endpoint`:
/// builds the missing ones from the host's static busybox (archives cached by content in
/// `cache_dir`), imports them and checks that containerd lists them.
pub async fn ensure_local_images(endpoint: &Path, cache_dir: &Path) -> Result<(), ContainerdError> {
    let present = list_images(endpoint).await?;
    if [BUSYBOX_IMAGE, PAUSE_IMAGE]
        .iter()
        .all(|name| present.iter().any(|p| p == name))
    {
        return Ok(());
    }
    let (busybox, applets) = host_busybox()?;
    for spec in local_image_specs(&busybox, &applets) {
        if present.contains(&spec.name) {
            continue;
        }
        let archive = oci_archive(&spec)?;
        let path = cache_archive(cache_dir, &archive)?;
        import_archive(endpoint, &path).await?;
        tracing::info!(image = %spec.name, digest = %archive.manifest_digest, "imported local image");
    }
    let now = list_images(endpoint).await?;
    for name in [BUSYBOX_IMAGE, PAUSE_IMAGE] {
        if !now.iter().any(|p| p == name) {
            return Err(ContainerdError::Image(format!(
                "{name} is not listed by containerd after its import"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a tar produced by this module back as (path, typeflag, data).
    fn members(archive: &[u8]) -> Vec<(String, u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at + 512 <= archive.len() && archive[at] != 0 {
            let h = &archive[at..at + 512];
            let name = String::from_utf8_lossy(&h[..100])
                .trim_end_matches('\0')
                .to_string();
            let size = u64::from_str_radix(
                String::from_utf8_lossy(&h[124..135]).trim_end_matches('\0'),
                8,
            )
            .unwrap() as usize;
            let data = archive[at + 512..at + 512 + size].to_vec();
            out.push((name, h[156], data));
            at += 512 + size.div_ceil(512) * 512;
        }
        out
    }

    fn spec() -> ImageSpec {
        ImageSpec {
            name: "setpoint.local/test:2".into(),
            config: RunConfig {
                entrypoint: vec!["/bin/sh".into()],
                cmd: vec!["-c".into(), "true".into()],
                env: vec!["A=b".into()],
                user: Some("65534".into()),
                working_dir: Some("/tmp".into()),
            },
            entries: vec![
                LayerEntry::Dir {
                    path: "/tmp".into(),
                    mode: 0o1777,
                },
                LayerEntry::File {
                    path: "/hello".into(),
                    mode: 0o644,
                    source: FileSource::Bytes(b"hi\n".to_vec()),
                },
                LayerEntry::Symlink {
                    path: "/link".into(),
                    target: "hello".into(),
                },
            ],
        }
    }

    #[test]
    fn archive_is_a_consistent_oci_layout() {
        let archive = oci_archive(&spec()).unwrap();
        let files = members(&archive.bytes);
        let get = |name: &str| {
            files
                .iter()
                .find(|(n, _, _)| n == name)
                .unwrap_or_else(|| panic!("{name} missing"))
                .2
                .clone()
        };
        let json = |data: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&data).unwrap();
        assert_eq!(json(get("oci-layout"))["imageLayoutVersion"], "1.0.0");
        let index = json(get("index.json"));
        let desc = &index["manifests"][0];
        assert_eq!(
            desc["annotations"]["io.containerd.image.name"],
            "setpoint.local/test:2"
        );
        assert_eq!(
            desc["annotations"]["org.opencontainers.image.ref.name"],
            "2"
        );
        assert_eq!(desc["digest"], archive.manifest_digest);
        // Every blob is stored under its own digest, with the size its descriptor says.
        for (name, _, data) in files
            .iter()
            .filter(|(n, _, _)| n.starts_with("blobs/sha256/") && !n.ends_with('/'))
        {
            assert_eq!(
                sha256_digest(data),
                format!("sha256:{}", name.trim_start_matches("blobs/sha256/"))
            );
        }
        let blob = |digest: &serde_json::Value| {
            get(&format!(
                "blobs/sha256/{}",
                digest.as_str().unwrap().trim_start_matches("sha256:")
            ))
        };
        let manifest_bytes = blob(&desc["digest"]);
        assert_eq!(desc["size"], manifest_bytes.len());
        let manifest = json(manifest_bytes);
        let config = json(blob(&manifest["config"]["digest"]));
        assert_eq!(config["config"]["Entrypoint"], json!(["/bin/sh"]));
        assert_eq!(config["config"]["Cmd"], json!(["-c", "true"]));
        assert_eq!(config["config"]["Env"], json!(["A=b"]));
        assert_eq!(config["config"]["User"], "65534");
        assert_eq!(config["config"]["WorkingDir"], "/tmp");
        assert_eq!(config["os"], "linux");
        let layer = blob(&manifest["layers"][0]["digest"]);
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            manifest["layers"][0]["digest"]
        );
        let layer_files = members(&layer);
        assert_eq!(
            layer_files
                .iter()
                .map(|(n, t, _)| (n.as_str(), *t))
                .collect::<Vec<_>>(),
            [("tmp/", b'5'), ("hello", b'0'), ("link", b'2')]
        );
        assert_eq!(layer_files[1].2, b"hi\n");
        // Deterministic: the same spec gives the same bytes.
        assert_eq!(oci_archive(&spec()).unwrap().bytes, archive.bytes);
    }

    #[test]
    fn static_and_dynamic_elf() {
        // A minimal ELF64 little-endian header with one program header of the given type.
        let elf = |ptype: u32| {
            let mut d = vec![0u8; 64 + 56];
            d[..4].copy_from_slice(b"\x7fELF");
            d[4] = 2;
            d[5] = 1;
            d[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
            d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
            d[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
            d[64..68].copy_from_slice(&ptype.to_le_bytes());
            d
        };
        assert_eq!(elf_is_static(&elf(1)), Some(true));
        assert_eq!(elf_is_static(&elf(3)), Some(false));
        assert_eq!(elf_is_static(b"#!/bin/sh\n"), None);
        // This test's own executable is dynamically linked on a glibc host.
        if let Ok(me) = std::env::current_exe().and_then(std::fs::read) {
            assert!(elf_is_static(&me).is_some());
        }
    }

    #[test]
    fn busybox_root_has_users_tmp_and_applets() {
        let applets = vec!["sh".to_string(), "busybox".to_string(), "echo".to_string()];
        let entries = busybox_rootfs(Path::new("/bin/busybox"), &applets);
        assert!(entries.contains(&LayerEntry::Symlink {
            path: "/bin/sh".into(),
            target: "busybox".into()
        }));
        assert!(!entries
            .iter()
            .any(|e| matches!(e, LayerEntry::Symlink { path, .. } if path == "/bin/busybox")));
        assert!(entries.contains(&LayerEntry::Dir {
            path: "/tmp".into(),
            mode: 0o1777
        }));
        let passwd = entries
            .iter()
            .find_map(|e| match e {
                LayerEntry::File {
                    path,
                    source: FileSource::Bytes(b),
                    ..
                } if path == "/etc/passwd" => Some(String::from_utf8(b.clone()).unwrap()),
                _ => None,
            })
            .unwrap();
        assert!(passwd.contains("root:x:0:0:"));
        assert!(passwd.contains("nobody:x:65534:65534:"));
    }

    #[test]
    fn pause_image_traps_term() {
        let [busybox, pause] = local_image_specs(Path::new("/bin/busybox"), &["sh".into()]);
        assert_eq!(busybox.name, BUSYBOX_IMAGE);
        assert_eq!(busybox.config.cmd, ["sh"]);
        assert_eq!(pause.name, PAUSE_IMAGE);
        assert_eq!(pause.config.entrypoint[..2], ["/bin/sh", "-c"]);
        assert!(pause.config.entrypoint[2].contains("trap 'exit 0' TERM INT"));
    }
}
