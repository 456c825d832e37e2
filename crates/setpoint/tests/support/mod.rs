//! The harness the end-to-end tests share: a `setpoint` process on a temporary data dir, the
//! real `kubectl` pointed at it, and a throwaway etcd.
//!
//! Each test file is its own crate (`mod support;`), so not every item is used by every one.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../../../setpoint-store/tests/support/etcd_server.rs"]
mod etcd_server;

/// A throwaway single-member etcd on free loopback ports, killed when dropped; `start` returns
/// `None` (after saying so) when etcd is not installed, unless `SETPOINT_REQUIRE_ETCD` is set.
pub type Etcd = etcd_server::TestEtcd;

/// Gives the data dir `to` the CA and admin certificate of the data dir `from`, so a server
/// started on `to` trusts the same kubeconfig (`Pki::load_or_create` reuses what it finds).
pub fn share_pki(from: &Path, to: &Path) {
    let pki = to.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    for f in ["ca.crt", "ca.key", "admin.crt", "admin.key"] {
        std::fs::copy(from.join("pki").join(f), pki.join(f)).unwrap();
    }
}

/// How long `setpoint` may take to print its address and kubeconfig.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// How long `setpoint` may take to exit after SIGTERM.
const STOP_DEADLINE: Duration = Duration::from_secs(15);

/// Whether this process can make network namespaces to stand for hosts: it runs as root and
/// `ip netns` works.
pub fn netns_available() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether kubectl can be run here. When it cannot, says so and returns false, unless
/// `SETPOINT_REQUIRE_KUBECTL` is set (CI sets it), in which case it panics: a CI run must not
/// pass by skipping.
pub fn kubectl_available() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("SETPOINT_REQUIRE_KUBECTL").is_none(),
            "kubectl is required but not installed"
        );
        eprintln!("kubectl not installed; skipping");
    }
    found
}

/// stdout of a command that must have succeeded; `what` names it in the panic message.
pub fn expect_success(what: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// stderr of a command that must have failed; `what` names it in the panic message.
pub fn expect_failure(what: &str, out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{what} unexpectedly succeeded:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// A `setpoint` process listening on a free loopback port, and a kubectl environment (its
/// kubeconfig, and a temporary `HOME` and cache) pointing at it.
pub struct Setpoint {
    child: Option<Child>,
    /// Where it serves, `https://127.0.0.1:PORT`.
    pub url: String,
    /// The admin kubeconfig it wrote.
    pub kubeconfig: PathBuf,
    /// Its data dir (pods of its local node keep their state and logs under it).
    pub data_dir: PathBuf,
    /// Leave the local node's pods running when this is dropped (to restart on them).
    keep_pods: bool,
    home: tempfile::TempDir,
    /// The lines it prints after its kubeconfig's (the join command, say), as they come.
    pub output: mpsc::Receiver<String>,
}

/// The environment variable of `--proxy-mode`: the tests set it to `none` for every node
/// they start; a test of the proxy passes the flag.
pub const PROXY_MODE_ENV: &str = "SETPOINT_PROXY_MODE";

/// The environment variable of `--container-runtime`: the tests set it to `process` for every
/// node they start, so pods run as local processes (today's behaviour) whatever the default
/// and whatever this machine has installed; a test that wants containers passes the flag.
pub const RUNTIME_ENV: &str = "SETPOINT_CONTAINER_RUNTIME";

/// The environment variable of `--process-pod-network`: the tests set it to `host` for every
/// node they start, whatever the default (`auto`, which is `bridge` as root). Their clusters
/// run side by side without a service proxy and mostly with the API server on `127.0.0.1`
/// (so that they do not share `10.96.0.1`), which a pod in a network namespace of its own
/// cannot reach; a test of the bridge passes `--process-pod-network bridge`.
pub const PROCESS_POD_NETWORK_ENV: &str = "SETPOINT_PROCESS_POD_NETWORK";

impl Setpoint {
    /// Starts `setpoint up` on `data_dir`.
    pub fn up(data_dir: &Path) -> Setpoint {
        Setpoint::start(&["up"], data_dir)
    }

    /// Starts `setpoint <args…> --listen 127.0.0.1:0 --data-dir <data_dir>` and waits, within a
    /// deadline, for the lines that say where it runs and where its kubeconfig is.
    pub fn start(args: &[&str], data_dir: &Path) -> Setpoint {
        Setpoint::start_listening(args, data_dir, "127.0.0.1:0")
    }

    /// [`Setpoint::start`] listening on `listen` (`0.0.0.0:0`: every address, so pods with a
    /// network of their own reach the server through the `kubernetes` Service).
    pub fn start_listening(args: &[&str], data_dir: &Path, listen: &str) -> Setpoint {
        let mut child = Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(args)
            .args(["--listen", listen, "--data-dir"])
            .arg(data_dir)
            .env("SETPOINT_LOG", "warn")
            // Pods run as processes unless a test asks for containers with the flag, which
            // wins over the environment.
            .env(RUNTIME_ENV, "process")
            // Process pods on the node's network unless a test asks for the bridge with the
            // flag (see `PROCESS_POD_NETWORK_ENV`).
            .env(PROCESS_POD_NETWORK_ENV, "host")
            // No service proxy unless a test asks for one with `--proxy-mode nftables`: the
            // clusters tests run side by side share the host's network, and their Services'
            // addresses overlap.
            .env(PROXY_MODE_ENV, "none")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start setpoint");
        let stdout = child.stdout.take().unwrap();
        // Read stdout on a thread, which keeps draining it after start-up so the server never
        // blocks on a full pipe, and so the wait below can have a deadline.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let mut setpoint = Setpoint {
            child: Some(child),
            url: String::new(),
            kubeconfig: PathBuf::new(),
            data_dir: data_dir.to_path_buf(),
            keep_pods: false,
            home: tempfile::tempdir().unwrap(),
            output: rx,
        };
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match setpoint.output.recv_timeout(left) {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "setpoint {args:?} did not print its kubeconfig within {START_DEADLINE:?}"
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("setpoint {args:?} exited before printing its kubeconfig")
                }
            };
            if let Some(rest) = line.strip_prefix("Setpoint is running at ") {
                setpoint.url = rest.split_whitespace().next().unwrap_or("").to_string();
            }
            if let Some(rest) = line.trim().strip_prefix("export KUBECONFIG=") {
                setpoint.kubeconfig = PathBuf::from(rest);
                break;
            }
        }
        assert!(
            setpoint.url.starts_with("https://") && setpoint.kubeconfig.exists(),
            "setpoint {args:?} did not print its address and kubeconfig"
        );
        setpoint
    }

    /// The temporary `HOME` kubectl runs with (tests may put their own files there too).
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// A `kubectl <args…>` command with this server's kubeconfig, a temporary `HOME` and
    /// cache, for callers that spawn it themselves (`kubectl get -w`).
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.home.path().join("cache"))
            .env("HOME", self.home.path());
        cmd
    }

    /// Runs kubectl to completion.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args).output().expect("run kubectl")
    }

    /// Runs kubectl and returns stdout, panicking with stdout and stderr on failure.
    pub fn ok(&self, args: &[&str]) -> String {
        expect_success(&format!("kubectl {args:?}"), &self.kubectl(args))
    }

    /// `kubectl apply` of a manifest given as text.
    pub fn apply(&self, manifest: &str) -> String {
        let file = self.manifest_file(manifest);
        self.ok(&["apply", "-f", file.to_str().unwrap()])
    }

    /// `kubectl create -f` of a manifest given as text, with `extra` flags (`--as=alice`),
    /// whether it succeeds or not: (success, stdout, stderr).
    pub fn create(&self, manifest: &str, extra: &[&str]) -> (bool, String, String) {
        let file = self.manifest_file(manifest);
        let mut args = vec!["create", "-f", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = self.kubectl(&args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Writes `manifest` to a new file in [`Setpoint::home`] and returns its path.
    fn manifest_file(&self, manifest: &str) -> PathBuf {
        let file = self.home.path().join(format!(
            "manifest-{}.yaml",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::write(&file, manifest).unwrap();
        file
    }

    /// Runs kubectl expecting failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        expect_failure(&format!("kubectl {args:?}"), &self.kubectl(args))
    }

    /// Stops the server with SIGTERM (a clean shutdown) and waits for it, within a deadline.
    pub fn stop(mut self) {
        self.shut_down();
    }

    /// Like [`Setpoint::stop`], but the local node's pods keep running, as they do when a
    /// real node agent restarts.
    pub fn stop_leaving_pods(mut self) {
        self.keep_pods = true;
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let mut child = self.child.take().unwrap();
        let pid = child.id();
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        if rx.recv_timeout(STOP_DEADLINE).is_err() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("setpoint did not shut down on SIGTERM within {STOP_DEADLINE:?}");
        }
    }
}

impl Drop for Setpoint {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Pods' processes outlive their node agent by design; a test leaves none behind.
        if !self.keep_pods {
            kill_processes_under(&self.data_dir);
            remove_pod_networks(&self.data_dir.join("node"));
            remove_private_bridge(&self.data_dir);
            remove_proxy_table(&self.data_dir.join("node"));
            remove_masquerade_table(&self.data_dir.join("containerd"));
        }
    }
}

/// Tears down the network namespaces of the process pods of the node whose state is in
/// `node_dir` (with `--process-pod-network bridge`), as the agent does when it removes a pod:
/// the CNI plugins release each pod's address, veth and masquerade rules, and the namespace's
/// mount goes. Pods outlive their agent by design, so a stopped cluster leaves them; a test
/// leaves none behind. Run on a thread of its own, so a caller inside a runtime can call it.
pub fn remove_pod_networks(node_dir: &Path) {
    use setpoint_node::process::netns;
    let dir = node_dir.join(netns::DIR);
    let uids = netns::uids(&dir);
    if uids.is_empty() {
        return;
    }
    let _ = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        for uid in uids {
            if let Err(e) = runtime.block_on(netns::teardown(&dir, &uid)) {
                eprintln!("tearing down the network of pod {uid}: {e}");
            }
        }
    })
    .join();
}

/// Deletes the service proxy's nftables table of the node whose state is in `node_dir`, if
/// it has one (the proxy leaves it in place when it stops, so a restart keeps routing).
pub fn remove_proxy_table(node_dir: &Path) {
    let Ok(dir) = node_dir.canonicalize() else {
        return;
    };
    let table = setpoint_network::proxy::table_name(&dir.display().to_string());
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", &table])
        .stderr(Stdio::null())
        .status();
}

/// Deletes the pod masquerade table of the node whose pod network's files are in
/// `containerd_dir`, if it has one (a node killed without a clean stop leaves it).
pub fn remove_masquerade_table(containerd_dir: &Path) {
    let Ok(dir) = containerd_dir.canonicalize() else {
        return;
    };
    let table = setpoint_network::masquerade::table_name(&dir.display().to_string());
    let _ = Command::new("nft")
        .args(["delete", "table", "ip", &table])
        .stderr(Stdio::null())
        .status();
}

/// Deletes the CNI bridge (`sp-n<x>`) of the private containerd that ran under the data dir
/// `dir`, if any, once no `setpoint` holds its subnet. The bridge outlives its containerd on
/// the host by design (as k3s's `cni0` does); a test leaves none behind. The subnet's lock is
/// taken first, so a bridge another cluster now uses on the same subnet is left alone.
pub fn remove_private_bridge(dir: &Path) {
    let conflist = dir.join("containerd/cni/net.d/10-setpoint.conflist");
    let Ok(text) = std::fs::read_to_string(&conflist) else {
        return;
    };
    let Ok(list) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let bridges = list["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["bridge"].as_str());
    for bridge in bridges {
        let Some(x) = bridge.strip_prefix("sp-n") else {
            continue;
        };
        let Ok(lock) = std::fs::File::open(format!("/run/setpoint/pod-net-{x}.lock")) else {
            continue;
        };
        if try_lock(&lock) {
            let _ = Command::new("ip")
                .args(["link", "del", bridge])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// An exclusive, non-blocking `flock` on `file` (released when it is closed).
#[allow(unsafe_code)]
fn try_lock(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    extern "C" {
        fn flock(fd: i32, operation: i32) -> i32;
    }
    const LOCK_EX: i32 = 2;
    const LOCK_NB: i32 = 4;
    // SAFETY: flock on a descriptor `file` keeps open for the call.
    unsafe { flock(file.as_raw_fd(), LOCK_EX | LOCK_NB) == 0 }
}

/// Kills (SIGKILL, whole process group) every process whose working directory is under
/// `dir`: the containers a node agent with its state in `dir` started.
pub fn kill_processes_under(dir: &Path) {
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cwd) = std::fs::read_link(e.path().join("cwd")) else {
            continue;
        };
        if cwd.starts_with(&dir) {
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics after `within`.
pub fn eventually<T>(what: &str, within: Duration, check: impl FnMut() -> Option<T>) -> T {
    setpoint_testing::eventually_blocking(what, within, check)
}

/// The non-empty, trimmed lines of `text`.
pub fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// A Role `name` in `namespace` with a rule per `(apiGroup, resource, verbs)`, the verbs
/// comma-separated (`"create, get"`).
pub fn role(namespace: &str, name: &str, rules: &[(&str, &str, &str)]) -> String {
    let mut m = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: {name}\n  namespace: {namespace}\nrules:\n"
    );
    for (group, resource, verbs) in rules {
        m.push_str(&format!(
            "- apiGroups: [{group:?}]\n  resources: [{resource}]\n  verbs: [{verbs}]\n"
        ));
    }
    m
}

/// A RoleBinding `name` in `namespace` of the Role `role` to the users `users`.
pub fn role_binding(namespace: &str, name: &str, role: &str, users: &[&str]) -> String {
    let mut m = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: {name}\n  namespace: {namespace}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: {role}\nsubjects:\n"
    );
    for user in users {
        m.push_str(&format!(
            "- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: {user}\n"
        ));
    }
    m
}

/// The names of the pods matching `selector` whose first container is ready, once there
/// are exactly `n` of them.
pub fn ready_pods(s: &Setpoint, selector: &str, n: usize) -> Option<Vec<String>> {
    let out = s.ok(&[
        "get", "pods", "-l", selector, "-o",
        r#"jsonpath={range .items[?(@.status.containerStatuses[0].ready==true)]}{.metadata.name}{"\n"}{end}"#,
    ]);
    let names = lines(&out);
    (names.len() == n).then_some(names)
}

/// A Deployment of three real servers (`python3 -m http.server` on the pod's own address,
/// port 8080), ready when they answer.
pub const WEB: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: python:3
        command: ["python3", "-m", "http.server", "8080", "--bind", "$(POD_IP)"]
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        readinessProbe:
          httpGet: {path: /, port: 8080}
          periodSeconds: 1
"#;

/// GET `path` from `ip:8080` over HTTP/1.0; the status line.
pub fn http_get(ip: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((ip, 8080)).expect("connect to the pod");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.lines().next().unwrap_or("").to_string()
}

/// Starts `cmd` with its stderr piped, and a thread that forwards each line of it: the lines
/// arrive on the receiver as the process logs them.
pub fn spawn_with_stderr_lines(cmd: &mut Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the process");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

/// Whether this machine can run containers through containerd; says why not, or panics
/// when `SETPOINT_REQUIRE_CONTAINERD=1` requires it.
pub fn containerd_available() -> bool {
    use setpoint_node::containerd::testing::{missing_prerequisites, REQUIRE_ENV};
    match missing_prerequisites() {
        None => true,
        Some(reason) => {
            assert!(
                std::env::var(REQUIRE_ENV).as_deref() != Ok("1"),
                "{REQUIRE_ENV}=1 but containerd cannot run here: {reason}"
            );
            eprintln!("skipping: containerd cannot run here: {reason}");
            false
        }
    }
}
