//! The configuration files of a private containerd: its own TOML (`version = 2`) and the CNI
//! network list its CRI plugin loads. Pure functions from settings to text.

use std::path::{Path, PathBuf};

/// The longest path a unix socket address can hold (`sun_path` is 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// containerd serves ttrpc next to its gRPC socket, at the same path plus this suffix, so the
/// socket path must leave room for it.
const TTRPC_SUFFIX: &str = ".ttrpc";

/// Where the CNI plugins may be installed: Debian's `containernetworking-plugins`, then the
/// upstream release tarball's conventional place.
pub const CNI_BIN_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];

/// The CNI plugins the network list names; a bin dir without them cannot network pods.
pub const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];

/// Everything the containerd config of one private instance depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdConfig {
    /// Persistent data (content store, snapshots, metadata).
    pub root: PathBuf,
    /// Runtime state (sockets of shims, bundles, netns mounts).
    pub state: PathBuf,
    /// The gRPC unix socket (see [`socket_path`] for the length limit).
    pub address: PathBuf,
    /// The image every pod sandbox runs; must be present locally (nothing is pulled for it).
    pub sandbox_image: String,
    /// Where the CNI plugin binaries are.
    pub cni_bin_dir: PathBuf,
    /// Where the CNI network list is (the CRI plugin loads the first one there).
    pub cni_conf_dir: PathBuf,
    /// Whether to tell the CRI plugin not to apply AppArmor profiles; needed where the kernel
    /// has no AppArmor, since runc would otherwise fail to apply the default one.
    pub disable_apparmor: bool,
}

/// Renders `config` as containerd's TOML configuration (schema version 2).
pub fn containerd_config_toml(config: &ContainerdConfig) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    let mut out = String::new();
    out.push_str("# Written by setpoint for its private containerd; rewritten at every start.\n");
    out.push_str("version = 2\n");
    out.push_str(&format!("root = {}\n", toml_path(&config.root)));
    out.push_str(&format!("state = {}\n", toml_path(&config.state)));
    // containerd's own OOM score stays what the agent's is: changing it needs privileges
    // this host may not grant.
    out.push_str("oom_score = 0\n\n");
    out.push_str("[grpc]\n");
    out.push_str(&format!("  address = {}\n\n", toml_path(&config.address)));
    // Keep the debug socket off: by default it would be a fixed path shared with any other
    // containerd on the machine.
    out.push_str("[debug]\n  address = \"\"\n\n");
    // The `opt` plugin installs into /opt/containerd by default; a private instance keeps it
    // under its own root.
    out.push_str("[plugins.\"io.containerd.internal.v1.opt\"]\n");
    out.push_str(&format!(
        "  path = {}\n\n",
        toml_path(&config.root.join("opt"))
    ));
    out.push_str(&format!("[{cri}]\n"));
    out.push_str(&format!(
        "  sandbox_image = {}\n",
        toml_string(&config.sandbox_image)
    ));
    // Without CAP_SYS_RESOURCE a negative oom_score_adj fails in runc; restricting clamps
    // containers' scores to containerd's own.
    out.push_str("  restrict_oom_score_adj = true\n");
    out.push_str(&format!(
        "  disable_apparmor = {}\n",
        config.disable_apparmor
    ));
    // Network namespaces under the state dir rather than /var/run/netns: everything this
    // instance mounts is under its own directories, so cleaning up after it is local.
    out.push_str("  netns_mounts_under_state_dir = true\n");
    out.push_str(&format!("  [{cri}.containerd]\n"));
    out.push_str("    snapshotter = \"overlayfs\"\n");
    out.push_str("    default_runtime_name = \"runc\"\n");
    out.push_str(&format!("    [{cri}.containerd.runtimes.runc]\n"));
    out.push_str("      runtime_type = \"io.containerd.runc.v2\"\n");
    out.push_str(&format!("      [{cri}.containerd.runtimes.runc.options]\n"));
    // The agent manages cgroupfs paths itself; there may be no systemd at all.
    out.push_str("        SystemdCgroup = false\n");
    out.push_str(&format!("  [{cri}.cni]\n"));
    out.push_str(&format!(
        "    bin_dir = {}\n",
        toml_path(&config.cni_bin_dir)
    ));
    out.push_str(&format!(
        "    conf_dir = {}\n",
        toml_path(&config.cni_conf_dir)
    ));
    out.push_str("    max_conf_num = 1\n");
    out
}

/// One node's pod network: a Linux bridge with a gateway address and an IPv4 subnet handed
/// out by `host-local`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniNetwork {
    /// The CNI network name (also names `host-local`'s allocation records).
    pub name: String,
    /// The bridge device (at most 15 bytes, the kernel's interface name limit).
    pub bridge: String,
    /// The pod subnet, e.g. `10.222.3.0/24`; the bridge gets its first address.
    pub subnet: String,
    /// Where `host-local` records its allocations (by default a machine-wide directory,
    /// which two instances with one network name would share).
    pub ipam_data_dir: PathBuf,
}

/// Renders `network` as a CNI network list: `bridge` (the node's gateway) with `host-local`
/// IPAM, then `portmap` for `hostPort`s. The CRI plugin sets up each sandbox's loopback
/// itself with the `loopback` plugin. The bridge does not masquerade: its `ipMasq` would
/// rewrite everything leaving the subnet, pod-to-pod traffic to other nodes included, so the
/// node masquerades only what leaves the cluster CIDR itself
/// (`setpoint_network::masquerade`).
pub fn cni_conflist(network: &CniNetwork) -> String {
    let list = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": network.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": true,
                "ipMasq": false,
                // A pod reaching a service that lands back on itself goes out and in the bridge.
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": network.subnet }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": network.ipam_data_dir.to_string_lossy(),
                },
            },
            {
                "type": "portmap",
                "capabilities": { "portMappings": true },
            },
        ],
    });
    let mut text = serde_json::to_string_pretty(&list).unwrap_or_default();
    text.push('\n');
    text
}

/// The socket path for a containerd whose data lives in `dir`: `dir/containerd.sock` when
/// that (plus the ttrpc suffix) fits a unix socket address, else a path under
/// `short_base` named by a hash of `dir` (so two data dirs never share a socket).
pub fn socket_path(dir: &Path, short_base: &Path) -> PathBuf {
    let preferred = dir.join("containerd.sock");
    if fits_sun_path(&preferred) {
        return preferred;
    }
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()),
    );
    let name = format!("sp-containerd-{}.sock", &hex(digest.as_ref())[..16]);
    short_base.join(name)
}

/// Whether `socket` and its ttrpc sibling fit in a unix socket address.
pub fn fits_sun_path(socket: &Path) -> bool {
    socket.as_os_str().len() + TTRPC_SUFFIX.len() <= SUN_PATH_MAX
}

/// Whether the kernel enforces AppArmor (so the CRI plugin may apply its default profile).
pub fn apparmor_available() -> bool {
    std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .map(|s| s.trim() == "Y")
        .unwrap_or(false)
}

/// The first of [`CNI_BIN_DIRS`] holding every plugin in [`CNI_PLUGINS`].
pub fn find_cni_bin_dir() -> Option<PathBuf> {
    CNI_BIN_DIRS
        .iter()
        .map(PathBuf::from)
        .find(|dir| CNI_PLUGINS.iter().all(|p| dir.join(p).is_file()))
}

/// Lower-case hexadecimal of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn toml_path(path: &Path) -> String {
    toml_string(&path.to_string_lossy())
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ContainerdConfig {
        ContainerdConfig {
            root: "/var/lib/sp/root".into(),
            state: "/var/lib/sp/state".into(),
            address: "/var/lib/sp/containerd.sock".into(),
            sandbox_image: "setpoint.local/pause:3.10".into(),
            cni_bin_dir: "/usr/lib/cni".into(),
            cni_conf_dir: "/var/lib/sp/cni".into(),
            disable_apparmor: true,
        }
    }

    #[test]
    fn config_names_every_setting() {
        let text = containerd_config_toml(&config());
        for line in [
            "version = 2",
            "root = \"/var/lib/sp/root\"",
            "state = \"/var/lib/sp/state\"",
            "  address = \"/var/lib/sp/containerd.sock\"",
            "  path = \"/var/lib/sp/root/opt\"",
            "  sandbox_image = \"setpoint.local/pause:3.10\"",
            "  restrict_oom_score_adj = true",
            "  disable_apparmor = true",
            "  netns_mounts_under_state_dir = true",
            "    snapshotter = \"overlayfs\"",
            "      runtime_type = \"io.containerd.runc.v2\"",
            "        SystemdCgroup = false",
            "    bin_dir = \"/usr/lib/cni\"",
            "    conf_dir = \"/var/lib/sp/cni\"",
            "      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]",
        ] {
            assert!(
                text.lines().any(|l| l.trim_end() == line.trim_end()),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn apparmor_setting_follows_the_host() {
        let mut c = config();
        c.disable_apparmor = false;
        assert!(containerd_config_toml(&c).contains("  disable_apparmor = false\n"));
    }

    #[test]
    fn strings_are_escaped() {
        let mut c = config();
        c.root = PathBuf::from("/data/a \"b\"\\c");
        let text = containerd_config_toml(&c);
        assert!(text.contains(r#"root = "/data/a \"b\"\\c""#), "{text}");
        assert_eq!(toml_string("a\u{1}"), "\"a\\u0001\"");
    }

    #[test]
    fn conflist_has_bridge_ipam_and_portmap() {
        let text = cni_conflist(&CniNetwork {
            name: "sp-t3".into(),
            bridge: "sp-t3".into(),
            subnet: "10.222.3.0/24".into(),
            ipam_data_dir: "/var/lib/sp/ipam".into(),
        });
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["name"], "sp-t3");
        assert_eq!(v["cniVersion"], "1.0.0");
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["type"], "bridge");
        assert_eq!(bridge["bridge"], "sp-t3");
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["type"], "host-local");
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.222.3.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/var/lib/sp/ipam");
        assert_eq!(v["plugins"][1]["type"], "portmap");
        assert_eq!(v["plugins"][1]["capabilities"]["portMappings"], true);
        assert_eq!(v["plugins"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn long_dirs_get_a_short_socket() {
        let short = Path::new("/run");
        let dir = Path::new("/var/lib/setpoint");
        assert_eq!(
            socket_path(dir, short),
            PathBuf::from("/var/lib/setpoint/containerd.sock")
        );
        let long = PathBuf::from(format!("/{}", "d".repeat(100)));
        let socket = socket_path(&long, short);
        assert!(socket.starts_with("/run"), "{}", socket.display());
        assert!(fits_sun_path(&socket));
        // Another long dir gets another socket; the same dir the same one.
        let other = PathBuf::from(format!("/{}", "e".repeat(100)));
        assert_ne!(socket_path(&other, short), socket);
        assert_eq!(socket_path(&long, short), socket);
        // The limit counts the ttrpc sibling: a path of 101 bytes is already too long.
        assert!(fits_sun_path(Path::new(&"x".repeat(101))));
        assert!(!fits_sun_path(Path::new(&"x".repeat(102))));
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
