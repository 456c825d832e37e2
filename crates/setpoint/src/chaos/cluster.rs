//! The cluster a run attacks: separate `setpoint` processes it starts itself — one API server
//! on the embedded store (or three on a three-member etcd cluster it starts too), two
//! controller managers and two schedulers (leader-elected on short leases), and an agent
//! hosting simulated nodes — each in a process group of its own, so a signal reaches the
//! whole process and nothing outlives the run.
//!
//! Nor a run killed with SIGKILL: each process asks the kernel for SIGKILL when its parent
//! goes ([`spawn_tied`]).
//!
//! Where the machine allows it (root, `ip netns`, nftables), the agent and the controller
//! managers each run in a network namespace of their own ([`super::netns`]) and reach the API
//! server on the run's bridge, so a partition drops real packets; otherwise everything runs
//! on loopback and the run says why partitions are not drawn.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use setpoint_runtime::client::{Client, Kubeconfig};

use super::etcd;
use super::netns::{Network, Plan};

/// The components' election timing: short, so a frozen leader's lease lapses within a run,
/// and a killed leader's standby takes over within about 2.6 s (the lease, plus the time it
/// took to see the last renewal and to poll again). `leaseDurationSeconds` is whole seconds,
/// so 2 s is the shortest lease above 1 s that still leaves the renew deadline (1.5 s) six
/// renewals of margin and a 0.5 s safety gap before a standby may act.
pub const LEASE_DURATION: Duration = Duration::from_secs(2);
const RENEW_DEADLINE: &str = "1500ms";
const RETRY_PERIOD: &str = "250ms";

/// How long a (re)started API server may take to answer.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// One `setpoint` process of the cluster, started again in place after a kill.
pub struct Process {
    /// `controller-manager-1`; also the `HOSTNAME` it runs with, so its leader-election
    /// identity (`<hostname>_<uuid>`) names it.
    pub name: String,
    /// The binary: `setpoint`, or `etcd` for an etcd member.
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// The working directory: the run's directory, so whatever is left of a run can be found
    /// by it.
    cwd: PathBuf,
    /// The network namespace it runs in (`None`: the host's).
    netns: Option<String>,
    child: Option<Child>,
}

impl Process {
    fn spawn(
        exe: &Path,
        name: &str,
        args: Vec<String>,
        dir: &Path,
        netns: Option<&str>,
    ) -> anyhow::Result<Process> {
        let mut p = Process {
            name: name.to_string(),
            program: exe.to_path_buf(),
            args,
            log: dir.join("logs").join(format!("{name}.log")),
            cwd: dir.to_path_buf(),
            netns: netns.map(str::to_string),
            child: None,
        };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let exe = &self.program;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        // `ip netns exec` enters the namespace and execs the program: the process id, and so
        // the process group, stay the program's.
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        command
            .args(&self.args)
            .env("HOSTNAME", &self.name)
            .env("SETPOINT_LOG", "warn")
            // No service proxy: the run needs none, and it would program the host's nftables.
            .env("SETPOINT_PROXY_MODE", "none")
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: signals reach it and whatever it starts, and a terminal's
            // Ctrl-C reaches only the harness, which then stops everything in order.
            .process_group(0);
        let child = spawn_tied(command).with_context(|| format!("starting {}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// The process id (also its process group's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) to the process's group.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} is not running", self.name)
        };
        let status = Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{signal} {} ({pid}) failed", self.name);
        }
        Ok(())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills the process and starts it again with the same arguments.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.start()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A command to spawn and where to send the result.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The thread that spawns the run's processes: it lives as long as the harness, since a
/// child's death signal follows the thread that forked it, not the process. The runtime's
/// threads are not that: a blocking-pool thread ends after idling, and a worker that ran
/// `block_in_place` may end too.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // The sender stays in the static, so the loop (and the thread) never ends.
        std::thread::Builder::new()
            .name("chaos-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("starting the chaos spawner thread");
        tx
    })
}

/// Spawns `command` so that the kernel SIGKILLs it when the harness dies, however it dies
/// (`PR_SET_PDEATHSIG`, from [`spawner`]'s long-lived thread). `ip netns exec` execs the
/// program, which keeps the death signal (only a set-user-ID or privileged binary's exec
/// clears it).
fn spawn_tied(mut command: Command) -> std::io::Result<Child> {
    setpoint_node::deathsig::die_with_parent(&mut command);
    let (tx, rx) = mpsc::channel();
    spawner()
        .send((command, tx))
        .map_err(|_| std::io::Error::other("the chaos spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the chaos spawner thread is gone"))?
}

/// What the API servers store their objects in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// One API server on the embedded store in its data dir.
    #[default]
    Embedded,
    /// A three-member etcd cluster and three API servers on it.
    Etcd,
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// The `setpoint` binary.
    pub exe: PathBuf,
    /// Where data dirs and logs go.
    pub dir: PathBuf,
    /// Simulated nodes the agent hosts.
    pub nodes: usize,
    pub store: StoreKind,
}

/// An API server of the cluster and a client of its own (to tell when that one answers).
struct Server {
    name: String,
    client: Client,
}

/// The running cluster.
pub struct Cluster {
    /// A client of the first API server: the workload, the watchers and the checks use it.
    pub client: Client,
    pub processes: Vec<Process>,
    /// Where each process logs.
    pub logs: PathBuf,
    servers: Vec<Server>,
    /// The etcd members (process name and client port), on `--store etcd`.
    etcd: Vec<(String, u16)>,
    /// How many API server and etcd member kills so far: a kill hits the next one round,
    /// so a seed replays the same processes.
    api_server_kills: usize,
    etcd_kills: usize,
    /// The namespaces of the processes a partition can hit; deleted after the processes are
    /// stopped (fields drop after [`Cluster`]'s `drop`).
    network: Option<Network>,
    /// Why partitions are not drawn, when there are no namespaces.
    pub no_partitions: Option<String>,
}

/// The processes that run in namespaces of their own when the machine allows it: those a
/// partition hits.
const NAMESPACED: [&str; 3] = ["agent-0", "controller-manager-0", "controller-manager-1"];

/// The API servers on `--store etcd`.
const ETCD_API_SERVERS: usize = 3;

/// A port free right now on `ip` (the API server keeps one address across restarts, so the
/// components' kubeconfig stays valid).
fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0))?;
    Ok(l.local_addr()?.port())
}

/// Waits up to [`START_DEADLINE`] for `path` to exist (a kubeconfig the API server writes).
async fn wait_for_file(path: &Path, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_DEADLINE;
    while !path.exists() {
        if Instant::now() > deadline {
            bail!(
                "the API server wrote no {} within {START_DEADLINE:?} (see {})",
                path.display(),
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Copies the CA and admin certificate of one API server's data dir into another's, so all
/// of them serve certificates of one CA and accept one admin (a server reuses what it finds
/// in `<data-dir>/pki`).
fn share_pki(from: &Path, to: &Path) -> anyhow::Result<()> {
    let pki = to.join("pki");
    std::fs::create_dir_all(&pki)?;
    for f in ["ca.crt", "ca.key", "admin.crt", "admin.key"] {
        std::fs::copy(from.join("pki").join(f), pki.join(f))
            .with_context(|| format!("copying {f} to {}", pki.display()))?;
    }
    Ok(())
}

impl Cluster {
    /// Starts the store (on etcd: its members, until healthy), the API servers, waits until
    /// they answer, then the other components.
    pub async fn start(config: &ClusterConfig) -> anyhow::Result<Cluster> {
        let logs = config.dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let (network, no_partitions) =
            match Network::create(Plan::new(std::process::id(), &NAMESPACED)) {
                Ok(n) => (Some(n), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            };
        // On the bridge when there is one: the namespaced processes reach it there, the others
        // (and this harness) too, as it is an address of this host.
        let ip = network
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.plan.host);
        let mut processes = Vec::new();
        let mut etcd_members = Vec::new();
        let mut store_args: Vec<String> = Vec::new();
        if config.store == StoreKind::Etcd {
            let mut ports = Vec::new();
            for _ in 0..etcd::MEMBERS {
                ports.push(etcd::Ports {
                    client: free_port(std::net::Ipv4Addr::LOCALHOST.into())?,
                    peer: free_port(std::net::Ipv4Addr::LOCALHOST.into())?,
                });
            }
            let token = format!("setpoint-chaos-{}", std::process::id());
            for i in 0..etcd::MEMBERS {
                let name = format!("etcd-{i}");
                let data = config.dir.join(&name);
                processes.push(Process::spawn(
                    Path::new(&etcd::binary()),
                    &name,
                    etcd::member_args(i, &ports, &data, &token),
                    &config.dir,
                    None,
                )?);
                etcd_members.push((name, ports[i].client));
            }
            for (name, port) in &etcd_members {
                wait_for_etcd(name, *port, &logs).await?;
            }
            let urls: Vec<String> = ports.iter().map(|p| etcd::client_url(*p)).collect();
            store_args = vec![
                "--store".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                urls.join(","),
            ];
        }
        let names: Vec<String> = match config.store {
            StoreKind::Embedded => vec!["api-server".into()],
            StoreKind::Etcd => (0..ETCD_API_SERVERS)
                .map(|i| format!("api-server-{i}"))
                .collect(),
        };
        let mut servers = Vec::new();
        let mut kubeconfigs = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let dir = config.dir.join(if i == 0 && names.len() == 1 {
                "server".to_string()
            } else {
                format!("server-{i}")
            });
            if i > 0 {
                share_pki(&config.dir.join("server-0"), &dir)?;
            }
            let port = free_port(ip.into())?;
            let mut args = vec![
                "server".into(),
                "--listen".into(),
                format!("{ip}:{port}"),
                "--data-dir".into(),
                dir.display().to_string(),
                // The switch the `watch-drop`, `expire-watches` and `latency` faults use.
                "--enable-fault-injection".into(),
            ];
            args.extend(store_args.iter().cloned());
            processes.push(Process::spawn(&config.exe, name, args, &config.dir, None)?);
            let kubeconfig = dir.join("kubeconfig");
            // The next server copies this one's certificates: wait for them to be written.
            wait_for_file(&kubeconfig, &logs.join(format!("{name}.log"))).await?;
            let client = Client::from_kubeconfig(&Kubeconfig::read(&kubeconfig)?)?
                .without_rate_limit()
                .with_user_agent("setpoint-chaos");
            servers.push(Server {
                name: name.clone(),
                client,
            });
            kubeconfigs.push(kubeconfig.display().to_string());
        }
        let mut cluster = Cluster {
            client: servers[0].client.clone(),
            processes,
            logs: logs.clone(),
            servers,
            etcd: etcd_members,
            api_server_kills: 0,
            etcd_kills: 0,
            network,
            no_partitions,
        };
        for name in names {
            cluster.wait_for_server(&name).await?;
        }
        // The components are spread over the API servers (on etcd, each of three reaches its
        // own), so a server's kill cuts off some and not others.
        let mut next = kubeconfigs.iter().cycle();
        let election = |component: &str, kc: &str| {
            vec![
                component.to_string(),
                "--kubeconfig".into(),
                kc.to_string(),
                "--secure-port".into(),
                "0".into(),
                "--bind-address".into(),
                "127.0.0.1".into(),
                format!(
                    "--leader-elect-lease-duration={}s",
                    LEASE_DURATION.as_secs()
                ),
                format!("--leader-elect-renew-deadline={RENEW_DEADLINE}"),
                format!("--leader-elect-retry-period={RETRY_PERIOD}"),
            ]
        };
        for i in 0..2 {
            let kc = next.next().expect("a kubeconfig");
            let mut args = election("controller-manager", kc);
            // Nodes of a killed agent are marked unreachable only well after it is back: the
            // run is about the control plane's convergence, not pod eviction.
            args.extend(["--node-monitor-grace-period-seconds".into(), "40".into()]);
            let name = format!("controller-manager-{i}");
            let netns = cluster.netns(&name);
            cluster.processes.push(Process::spawn(
                &config.exe,
                &name,
                args,
                &config.dir,
                netns.as_deref(),
            )?);
            let kc = next.next().expect("a kubeconfig");
            cluster.processes.push(Process::spawn(
                &config.exe,
                &format!("scheduler-{i}"),
                election("scheduler", kc),
                &config.dir,
                None,
            )?);
        }
        let kc = next.next().expect("a kubeconfig").clone();
        let netns = cluster.netns("agent-0");
        cluster.processes.push(Process::spawn(
            &config.exe,
            "agent-0",
            vec![
                "agent".into(),
                "--kubeconfig".into(),
                kc,
                "--simulate".into(),
                config.nodes.to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data-dir".into(),
                config.dir.join("agent").display().to_string(),
                "--lease-interval-seconds".into(),
                "2".into(),
                "--start-delay-ms".into(),
                "100".into(),
                "--ready-delay-ms".into(),
                "200".into(),
            ],
            &config.dir,
            netns.as_deref(),
        )?);
        Ok(cluster)
    }

    /// Whether the API servers are on etcd (etcd member kills can be drawn).
    pub fn on_etcd(&self) -> bool {
        !self.etcd.is_empty()
    }

    /// The API server the next kill hits: the next in turn.
    pub fn next_api_server(&mut self) -> String {
        let name = self.servers[self.api_server_kills % self.servers.len()]
            .name
            .clone();
        self.api_server_kills += 1;
        name
    }

    /// A client of the API server `name` only (a fault for its switch reaches that one).
    pub fn server_client(&self, name: &str) -> anyhow::Result<&Client> {
        self.servers
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.client)
            .with_context(|| format!("no API server {name}"))
    }

    /// The etcd member the next kill hits: the next in turn.
    pub fn next_etcd_member(&mut self) -> anyhow::Result<String> {
        if self.etcd.is_empty() {
            bail!("this run's API servers are not on etcd");
        }
        let name = self.etcd[self.etcd_kills % self.etcd.len()].0.clone();
        self.etcd_kills += 1;
        Ok(name)
    }

    /// Waits until the etcd member `name` (started again) answers healthy.
    pub async fn wait_for_etcd(&self, name: &str) -> anyhow::Result<()> {
        let (_, port) = self
            .etcd
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("no etcd member {name}"))?;
        wait_for_etcd(name, *port, &self.logs).await
    }

    /// The network namespace `process` runs in, if it has one of its own.
    fn netns(&self, process: &str) -> Option<String> {
        self.network
            .as_ref()
            .and_then(|n| n.netns(process))
            .map(str::to_string)
    }

    /// Whether partitions can be injected (the targets run in namespaces of their own).
    pub fn can_partition(&self) -> bool {
        self.network.is_some()
    }

    /// Drops every packet between `process` and the API server.
    pub fn partition(&self, process: &str) -> anyhow::Result<()> {
        self.network
            .as_ref()
            .context("this run has no network namespaces")?
            .partition(process)
    }

    /// Lets `process`'s packets through again.
    pub fn heal(&self, process: &str) -> anyhow::Result<()> {
        self.network
            .as_ref()
            .context("this run has no network namespaces")?
            .heal(process)
    }

    /// Waits until the API server `name` answers a read.
    pub async fn wait_for_server(&self, name: &str) -> anyhow::Result<()> {
        let server = self
            .servers
            .iter()
            .find(|s| s.name == name)
            .with_context(|| format!("no API server {name}"))?;
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let answer = server
                .client
                .request(
                    http::Method::GET,
                    "/api/v1/namespaces/kube-system",
                    None,
                    bytes::Bytes::new(),
                )
                .await;
            match answer {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!("{name} did not answer within {START_DEADLINE:?}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The process named `name`.
    pub fn process_mut(&mut self, name: &str) -> Option<&mut Process> {
        self.processes.iter_mut().find(|p| p.name == name)
    }

    /// Kills `name` and starts it again in place.
    pub fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        let p = self
            .process_mut(name)
            .with_context(|| format!("no process {name}"))?;
        p.restart()
    }

    /// The name of the process holding the Lease `kube-system/<lease>` (its identity is
    /// `<name>_<uuid>`), waiting up to `within` for one of this cluster's processes to hold it.
    pub async fn leader(&self, lease: &str, within: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + within;
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease}");
        loop {
            if let Ok(l) = self
                .client
                .request(http::Method::GET, &path, None, bytes::Bytes::new())
                .await
            {
                let holder = l["spec"]["holderIdentity"].as_str().unwrap_or_default();
                let name = holder.split('_').next().unwrap_or_default();
                if self
                    .processes
                    .iter()
                    .any(|p| p.name == name && !name.is_empty())
                {
                    return Ok(name.to_string());
                }
            }
            if Instant::now() > deadline {
                bail!("no process of this run held the Lease {lease} within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every process (SIGKILL to each group) and reaps them.
    pub fn stop(&mut self) {
        // Thawed first, so none is left stopped if the kill were lost.
        for p in &self.processes {
            let _ = p.signal("CONT");
        }
        for p in &mut self.processes {
            p.kill();
        }
    }
}

/// Waits up to [`START_DEADLINE`] for the etcd member `name` on `port` to answer healthy.
async fn wait_for_etcd(name: &str, port: u16, logs: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_DEADLINE;
    while !etcd::healthy(port).await {
        if Instant::now() > deadline {
            bail!(
                "{name} was not healthy within {START_DEADLINE:?} (see {})",
                logs.join(format!("{name}.log")).display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
