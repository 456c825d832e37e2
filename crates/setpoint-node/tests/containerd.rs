//! A private containerd for a test: it starts, holds the local images, runs them, networks a
//! namespace with its CNI configuration, and leaves nothing behind when dropped.
//!
//! Needs root, containerd, runc, the CNI plugins and busybox-static; skipped with a message
//! without them unless `SETPOINT_REQUIRE_CONTAINERD=1`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use setpoint_node::containerd::testing::{missing_prerequisites, shims_of};
use setpoint_node::containerd::{
    ContainerdDaemon, DaemonOptions, LocalContainerd, TestContainerd, BUSYBOX_IMAGE, PAUSE_IMAGE,
};

const CTR_TIMEOUT: Duration = Duration::from_secs(60);

fn link_exists(name: &str) -> bool {
    Command::new("ip")
        .args(["link", "show", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn nat_rules() -> String {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn process_alive(pid: i32) -> bool {
    // A zombie is not alive; containerd's parent reaps it when it exits.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// Waits until `task` is STOPPED in `ctr tasks ls`.
fn wait_stopped(c: &TestContainerd, task: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = c.ctr(&["tasks", "ls"], CTR_TIMEOUT)?;
        let status = list
            .lines()
            .find(|l| l.split_whitespace().next() == Some(task))
            .and_then(|l| l.split_whitespace().nth(2))
            .map(str::to_string);
        if status.as_deref() == Some("STOPPED") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{task} is {status:?}, not STOPPED, after {timeout:?}:\n{list}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the CNI plugins of the instance's network list by hand (as the CRI plugin would,
/// in order, with the list's name and version) on a fresh network namespace: ADD, then DEL
/// unless `del` is false (as for a sandbox containerd never stopped), then the namespace is
/// deleted. Returns the address the namespace got.
fn cni_add(conflist: &Path, netns_name: &str, del: bool) -> String {
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(conflist).unwrap()).unwrap();
    let netns = format!("/var/run/netns/{netns_name}");
    let status = Command::new("ip")
        .args(["netns", "add", netns_name])
        .status()
        .unwrap();
    assert!(status.success(), "ip netns add {netns_name}");
    let run = |command: &str, plugin: &serde_json::Value, prev: Option<&serde_json::Value>| {
        let mut conf = plugin.clone();
        conf["name"] = list["name"].clone();
        conf["cniVersion"] = list["cniVersion"].clone();
        if let Some(prev) = prev {
            conf["prevResult"] = prev.clone();
        }
        let kind = plugin["type"].as_str().unwrap();
        let mut child = Command::new(format!("/usr/lib/cni/{kind}"))
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", netns_name)
            .env("CNI_NETNS", &netns)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{kind} {command}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.stdout.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
        }
    };
    let plugins = list["plugins"].as_array().unwrap();
    let mut result = serde_json::Value::Null;
    for plugin in plugins {
        let prev = (!result.is_null()).then_some(&result);
        let next = run("ADD", plugin, prev);
        if !next.is_null() {
            result = next;
        }
    }
    let address = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if del {
        for plugin in plugins.iter().rev() {
            run("DEL", plugin, Some(&result));
        }
    }
    let _ = Command::new("ip")
        .args(["netns", "del", netns_name])
        .status();
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_containerd_runs_local_images_and_cleans_up() {
    let Some(c) = TestContainerd::start().await else {
        return;
    };
    // Both images are there, imported by the harness.
    let images = c.ctr(&["images", "ls", "-q"], CTR_TIMEOUT).unwrap();
    for name in [BUSYBOX_IMAGE, PAUSE_IMAGE] {
        assert!(images.lines().any(|l| l == name), "{name} not in\n{images}");
    }
    // Unpacked for the CRI plugin's snapshotter, so a pod needs no unpacking (or pull).
    let unpacked = c.ctr(&["images", "check"], CTR_TIMEOUT).unwrap_or_default();
    let ours: Vec<&str> = unpacked
        .lines()
        .filter(|l| l.starts_with("setpoint.local/"))
        .collect();
    assert_eq!(ours.len(), 2, "{unpacked}");
    // Columns: REF TYPE DIGEST STATUS SIZE UNPACKED.
    assert!(
        ours.iter()
            .all(|l| l.contains("complete") && l.trim_end().ends_with("true")),
        "{unpacked}"
    );

    // containerd ignores keys it does not know, so check that the CRI plugin read ours: it
    // logs the configuration it runs with (containerd 1.6 as `Start cri plugin with config
    // {...}`; other versions may word it otherwise, and are not checked here).
    let log = std::fs::read_to_string(c.daemon().unwrap().log_path()).unwrap();
    if let Some(line) = log
        .lines()
        .find(|l| l.contains("Start cri plugin with config"))
    {
        let conf_dir = c.dir().join("cni/net.d");
        for field in [
            format!("SandboxImage:{PAUSE_IMAGE}"),
            "RestrictOOMScoreAdj:true".to_string(),
            "NetNSMountsUnderStateDir:true".to_string(),
            "Options:map[SystemdCgroup:false]".to_string(),
            "Snapshotter:overlayfs".to_string(),
            format!("NetworkPluginConfDir:{}", conf_dir.display()),
        ] {
            assert!(line.contains(&field), "CRI config lacks {field}: {line}");
        }
    }

    // The busybox image runs a command.
    let id = format!("sp-echo-{}", std::process::id());
    let out = c
        .ctr(
            &["run", "--rm", BUSYBOX_IMAGE, &id, "echo", "hi"],
            CTR_TIMEOUT,
        )
        .unwrap();
    assert_eq!(out.trim(), "hi");
    // Users and /tmp as documented.
    let id = format!("sp-id-{}", std::process::id());
    let out = c
        .ctr(
            &[
                "run",
                "--rm",
                BUSYBOX_IMAGE,
                &id,
                "sh",
                "-c",
                "id -un; grep nobody /etc/passwd | cut -d: -f3; stat -c %a /tmp",
            ],
            CTR_TIMEOUT,
        )
        .unwrap();
    assert_eq!(out.lines().collect::<Vec<_>>(), ["root", "65534", "1777"]);

    // The pause image keeps running as PID 1 and exits at once on SIGTERM.
    let id = format!("sp-pause-{}", std::process::id());
    c.ctr(&["run", "-d", PAUSE_IMAGE, &id], CTR_TIMEOUT)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = c.ctr(&["tasks", "ls"], CTR_TIMEOUT).unwrap();
        if list
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("RUNNING"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "pause never ran:\n{list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.ctr(&["tasks", "kill", "--signal", "SIGTERM", &id], CTR_TIMEOUT)
        .unwrap();
    wait_stopped(&c, &id, Duration::from_secs(10)).unwrap();
    c.ctr(&["tasks", "delete", &id], CTR_TIMEOUT).unwrap();
    c.ctr(&["containers", "delete", &id], CTR_TIMEOUT).unwrap();

    // The CNI network list works with the installed plugins: the bridge is created with the
    // gateway and the namespace gets an address of the instance's subnet.
    let conflist = c.dir().join("cni/net.d/10-setpoint.conflist");
    let netns = format!("sp-test-{}", std::process::id());
    let address = cni_add(&conflist, &netns, true);
    let prefix = c.subnet().trim_end_matches("0/24");
    assert!(
        address.starts_with(prefix),
        "{address} not in {}",
        c.subnet()
    );
    assert!(link_exists(c.bridge()), "bridge {} missing", c.bridge());

    // A network never torn down is cleaned up on drop. The bridge plugin adds no NAT rules
    // of its own (`ipMasq: false`): the node masquerades only traffic leaving the cluster,
    // in its own nftables table, so pods on other nodes see a pod's own address.
    let leftover = cni_add(&conflist, &format!("{netns}-left"), false);
    assert!(leftover.starts_with(prefix), "{leftover}");
    let needle = format!("name: \\\"{}\\\"", c.bridge());
    let nat = nat_rules();
    assert!(
        !nat.contains(&needle),
        "the bridge plugin masqueraded {leftover}:\n{nat}"
    );

    // A container left running is removed on drop, with everything else.
    let id = format!("sp-left-{}", std::process::id());
    c.ctr(
        &["run", "-d", BUSYBOX_IMAGE, &id, "sleep", "600"],
        CTR_TIMEOUT,
    )
    .unwrap();

    let pid = c.pid();
    let bridge = c.bridge().to_string();
    let dir = c.dir().to_path_buf();
    let endpoint = c.endpoint().to_path_buf();
    drop(c);
    assert!(!process_alive(pid), "containerd {pid} still runs");
    assert!(!link_exists(&bridge), "bridge {bridge} still exists");
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(std::os::unix::net::UnixStream::connect(&endpoint).is_err());
    assert_eq!(shims_of(&endpoint), Vec::<i32>::new(), "shims left running");
    let nat = nat_rules();
    assert!(!nat.contains(&needle), "nat rules of {bridge} left:\n{nat}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(dir.to_str().unwrap()),
        "mounts left under {}",
        dir.display()
    );
}

/// Set in the child process of [`containerd_dies_with_its_parent`]: the directory to start
/// containerd in.
const CHILD_ENV: &str = "SETPOINT_TEST_CONTAINERD_PARENT_DIR";

/// containerd started by a process that is then killed with SIGKILL (no cleanup runs) dies
/// too: the agent never leaves an orphaned containerd behind.
#[tokio::test]
async fn containerd_dies_with_its_parent() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        // The child: start containerd, say its pid, and wait to be killed. No pod is ever
        // created, so the bridge and subnet are only written into the configuration.
        let dir = Path::new(&dir);
        let options = DaemonOptions::new("sp-pdeath", "10.222.255.0/24");
        let daemon = ContainerdDaemon::start(&dir.join("c"), options)
            .await
            .unwrap();
        std::fs::write(dir.join("pid.tmp"), daemon.pid().to_string()).unwrap();
        std::fs::rename(dir.join("pid.tmp"), dir.join("pid")).unwrap();
        std::future::pending::<()>().await;
    }
    if let Some(reason) = missing_prerequisites() {
        if std::env::var("SETPOINT_REQUIRE_CONTAINERD").as_deref() == Ok("1") {
            panic!("SETPOINT_REQUIRE_CONTAINERD=1 but containerd cannot run here: {reason}");
        }
        eprintln!("skipping: containerd cannot run here: {reason}");
        return;
    }
    let dir = tempfile::Builder::new().prefix("sp-pd-").tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "containerd_dies_with_its_parent",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .spawn()
        .unwrap();
    let pid_file = dir.path().join("pid");
    let deadline = Instant::now() + Duration::from_secs(60);
    let pid: i32 = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse().unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child exited ({status}) before containerd started");
        }
        assert!(
            Instant::now() < deadline,
            "containerd never started in the child"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(process_alive(pid));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_alive(pid) {
        if Instant::now() >= deadline {
            // Leave nothing running whatever the outcome.
            kill_9(pid);
            panic!("containerd {pid} outlived its parent");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_9(pid: i32) {
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
}

/// Two test containerds at once (as parallel tests start them) get their own subnet, bridge,
/// directory and socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_instances_do_not_collide() {
    let (Some(a), Some(b)) = tokio::join!(TestContainerd::start(), TestContainerd::start()) else {
        return;
    };
    assert_ne!(a.subnet(), b.subnet());
    assert_ne!(a.bridge(), b.bridge());
    assert_ne!(a.dir(), b.dir());
    assert_ne!(a.endpoint(), b.endpoint());
    for c in [&a, &b] {
        let images = c.ctr(&["images", "ls", "-q"], CTR_TIMEOUT).unwrap();
        assert!(images.lines().any(|l| l == BUSYBOX_IMAGE), "{images}");
    }
}

/// A data dir whose path is too long for a unix socket gets its socket in the short
/// directory, and containerd serves there; `version` reports the binary.
#[tokio::test]
async fn long_data_dir_gets_a_short_socket() {
    if let Some(reason) = missing_prerequisites() {
        if std::env::var("SETPOINT_REQUIRE_CONTAINERD").as_deref() == Ok("1") {
            panic!("SETPOINT_REQUIRE_CONTAINERD=1 but containerd cannot run here: {reason}");
        }
        eprintln!("skipping: containerd cannot run here: {reason}");
        return;
    }
    let base = tempfile::Builder::new()
        .prefix("sp-long-")
        .tempdir()
        .unwrap();
    let short = tempfile::Builder::new().prefix("sp-s-").tempdir().unwrap();
    let dir = base.path().join("d".repeat(60)).join("e".repeat(60));
    let mut options = DaemonOptions::new("sp-long", "10.222.255.0/24");
    options.short_socket_dir = short.path().to_path_buf();
    let daemon = ContainerdDaemon::start(&dir, options).await.unwrap();
    assert!(
        daemon.endpoint().starts_with(short.path()),
        "{}",
        daemon.endpoint().display()
    );
    assert!(std::os::unix::net::UnixStream::connect(daemon.endpoint()).is_ok());
    let version = setpoint_node::containerd::daemon::version(Path::new("containerd")).unwrap();
    assert!(version.starts_with("containerd "), "{version}");
    let status = daemon.stop().await.unwrap();
    assert!(
        status.success(),
        "containerd exited with {status} on SIGTERM"
    );
    assert!(std::os::unix::net::UnixStream::connect(daemon.endpoint()).is_err());
}

/// Without a system containerd, `find_or_start` starts a private one; with one, it uses it.
#[tokio::test]
async fn find_or_start_uses_the_system_containerd_or_starts_one() {
    if let Some(reason) = missing_prerequisites() {
        if std::env::var("SETPOINT_REQUIRE_CONTAINERD").as_deref() == Ok("1") {
            panic!("SETPOINT_REQUIRE_CONTAINERD=1 but containerd cannot run here: {reason}");
        }
        eprintln!("skipping: containerd cannot run here: {reason}");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("sp-fos-")
        .tempdir()
        .unwrap();
    let system = setpoint_node::containerd::find_system_endpoint();
    let options = DaemonOptions::new("sp-fos", "10.222.255.0/24");
    let local = LocalContainerd::find_or_start(dir.path(), options)
        .await
        .unwrap();
    match (&local, system) {
        (LocalContainerd::System(socket), Some(expected)) => assert_eq!(*socket, expected),
        (LocalContainerd::Private(daemon), None) => {
            assert!(daemon.endpoint().starts_with(dir.path()));
            assert!(std::os::unix::net::UnixStream::connect(local.endpoint()).is_ok());
        }
        (local, system) => panic!("{local:?} with system containerd {system:?}"),
    }
    local.stop().await.unwrap();
    if let LocalContainerd::Private(daemon) = &local {
        assert!(daemon.exit_status().is_some());
    }
}
