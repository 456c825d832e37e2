//! The cluster a run attacks: separate `setpoint` processes it starts itself — one API server
//! on the embedded store, two controller managers and two schedulers (leader-elected on short
//! leases), and an agent hosting simulated nodes — each in a process group of its own, so a
//! signal reaches the whole process and nothing outlives the run.
//!
//! Where the machine allows it (root, `ip netns`, nftables), the agent and the controller
//! managers each run in a network namespace of their own ([`super::netns`]) and reach the API
//! server on the run's bridge, so a partition drops real packets; otherwise everything runs
//! on loopback and the run says why partitions are not drawn.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use setpoint_runtime::client::{Client, Kubeconfig};

use super::netns::{Network, Plan};

/// The components' election timing: short, so a frozen leader's lease lapses within a run.
pub const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: &str = "2s";
const RETRY_PERIOD: &str = "500ms";

/// How long a (re)started API server may take to answer.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// One `setpoint` process of the cluster, started again in place after a kill.
pub struct Process {
    /// `controller-manager-1`; also the `HOSTNAME` it runs with, so its leader-election
    /// identity (`<hostname>_<uuid>`) names it.
    pub name: String,
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
            args,
            log: dir.join("logs").join(format!("{name}.log")),
            cwd: dir.to_path_buf(),
            netns: netns.map(str::to_string),
            child: None,
        };
        p.start(exe)?;
        Ok(p)
    }

    fn start(&mut self, exe: &Path) -> anyhow::Result<()> {
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
        let child = command
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
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", self.name))?;
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
    pub fn restart(&mut self, exe: &Path) -> anyhow::Result<()> {
        self.kill();
        self.start(exe)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
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
}

/// The running cluster.
pub struct Cluster {
    exe: PathBuf,
    pub client: Client,
    pub processes: Vec<Process>,
    /// Where each process logs.
    pub logs: PathBuf,
    /// The namespaces of the processes a partition can hit; deleted after the processes are
    /// stopped (fields drop after [`Cluster`]'s `drop`).
    network: Option<Network>,
    /// Why partitions are not drawn, when there are no namespaces.
    pub no_partitions: Option<String>,
}

/// The processes that run in namespaces of their own when the machine allows it: those a
/// partition hits.
const NAMESPACED: [&str; 3] = ["agent-0", "controller-manager-0", "controller-manager-1"];

/// A port free right now on `ip` (the API server keeps one address across restarts, so the
/// components' kubeconfig stays valid).
fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0))?;
    Ok(l.local_addr()?.port())
}

impl Cluster {
    /// Starts the API server, waits until it answers, then the other components.
    pub async fn start(config: &ClusterConfig) -> anyhow::Result<Cluster> {
        let logs = config.dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let server_dir = config.dir.join("server");
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
        let port = free_port(ip.into())?;
        let server = Process::spawn(
            &config.exe,
            "api-server",
            vec![
                "server".into(),
                "--listen".into(),
                format!("{ip}:{port}"),
                "--data-dir".into(),
                server_dir.display().to_string(),
            ],
            &config.dir,
            None,
        )?;
        let kubeconfig = server_dir.join("kubeconfig");
        let deadline = Instant::now() + START_DEADLINE;
        while !kubeconfig.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the API server wrote no kubeconfig within {START_DEADLINE:?} (see {})",
                    logs.join("api-server.log").display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = Client::from_kubeconfig(&Kubeconfig::read(&kubeconfig)?)?
            .without_rate_limit()
            .with_user_agent("setpoint-chaos");
        let mut cluster = Cluster {
            exe: config.exe.clone(),
            client,
            processes: vec![server],
            logs: logs.clone(),
            network,
            no_partitions,
        };
        cluster.wait_for_server().await?;
        let kc = kubeconfig.display().to_string();
        let election = |component: &str| {
            vec![
                component.to_string(),
                "--kubeconfig".into(),
                kc.clone(),
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
            let mut args = election("controller-manager");
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
            cluster.processes.push(Process::spawn(
                &config.exe,
                &format!("scheduler-{i}"),
                election("scheduler"),
                &config.dir,
                None,
            )?);
        }
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

    /// Waits until the API server answers a read.
    pub async fn wait_for_server(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let answer = self
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
                    bail!("the API server did not answer within {START_DEADLINE:?}: {e}")
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
        let exe = self.exe.clone();
        let p = self
            .process_mut(name)
            .with_context(|| format!("no process {name}"))?;
        p.restart(&exe)
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

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}
