//! Network namespaces for partitions: the processes a partition can cut off (the agent and the
//! controller managers) each run in a namespace of their own, joined to the host by a veth
//! pair on a bridge of the run's, and the API server listens on the bridge's address. A
//! partition is an nftables table in the component's namespace that drops every packet to and
//! from that address (a real packet drop: connections time out, nothing is refused); healing
//! deletes the table.
//!
//! Names and addresses are a pure function of the run's id ([`Plan::new`]); [`Network`] makes
//! them, and deletes them when dropped. While they exist the run holds its lock, and a run
//! starting removes first what runs killed before it left ([`super::leftovers`]).

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context};

use super::leftovers::{self, RunLock};

/// The nftables table a partition adds in a component's namespace.
const TABLE: &str = "setpoint_chaos";

/// One namespaced process: its namespace, the veth ends and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The process (`agent-0`).
    pub process: String,
    /// The namespace it runs in.
    pub netns: String,
    /// The veth end on the host, a port of the bridge.
    pub host_link: String,
    /// The veth end in the namespace.
    pub ns_link: String,
    pub address: Ipv4Addr,
}

/// The names and addresses of a run's network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The run's id, which every name carries.
    pub id: u32,
    pub bridge: String,
    /// The bridge's address: where the API server listens.
    pub host: Ipv4Addr,
    /// The prefix length of the run's block.
    pub prefix: u8,
    pub members: Vec<Member>,
}

/// The private range the runs' blocks are carved from (no other part of the project or its
/// tests uses it).
const RANGE: [u8; 2] = [10, 252];

impl Plan {
    /// The network of run `id` (the harness's process id: unique among running harnesses, so
    /// runs at once do not collide) for `processes`: a /29 of 10.252.0.0/16 chosen by the id
    /// (room for the bridge and five members), and names of at most 15 bytes as Linux wants
    /// for links.
    pub fn new(id: u32, processes: &[&str]) -> Plan {
        assert!(
            processes.len() <= 5,
            "a /29 holds the bridge and five members"
        );
        let block = (id % 8192) * 8;
        let base = |n: u32| {
            Ipv4Addr::new(
                RANGE[0],
                RANGE[1],
                (block / 256) as u8,
                (block % 256 + n) as u8,
            )
        };
        // Six hex digits hold every Linux process id (at most 2^22).
        let tag = format!("spc{:06x}", id & 0xff_ffff);
        Plan {
            id,
            bridge: format!("{tag}b"),
            host: base(1),
            prefix: 29,
            members: processes
                .iter()
                .enumerate()
                .map(|(i, p)| Member {
                    process: p.to_string(),
                    netns: format!("setpoint-chaos-{id}-{p}"),
                    host_link: format!("{tag}h{i}"),
                    ns_link: format!("{tag}n{i}"),
                    address: base(2 + i as u32),
                })
                .collect(),
        }
    }

    /// The member running `process`.
    pub fn member(&self, process: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.process == process)
    }

    /// The nftables script that cuts `member` off from the API server's address, both ways.
    pub fn partition_rules(&self) -> String {
        let host = self.host;
        format!(
            "table inet {TABLE} {{\n\
             \tchain output {{ type filter hook output priority 0; policy accept; ip daddr {host} drop; }}\n\
             \tchain input {{ type filter hook input priority 0; policy accept; ip saddr {host} drop; }}\n\
             }}\n"
        )
    }
}

/// Whether this process runs as root (namespaces and nftables need it).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs `program args…` (with `input` on its stdin), failing with its stderr.
pub(super) fn run(program: &str, args: &[&str], input: Option<&str>) -> anyhow::Result<()> {
    let command = format!("{program} {}", args.join(" "));
    let failed = |detail: String| anyhow!("`{command}` failed: {detail}");
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| failed(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// A run's namespaces, veths and bridge, deleted when dropped; and the run's lock, held
/// until they are.
pub struct Network {
    pub plan: Plan,
    /// Dropped after [`Network`]'s `drop` has deleted the names (fields drop last).
    _lock: RunLock,
}

impl Network {
    /// Makes `plan`'s bridge and namespaces. First it takes the run's lock and deletes what
    /// runs no longer alive left ([`leftovers::sweep`]); what a harness killed with SIGKILL
    /// left under the same names (its process id was reused) is deleted too.
    pub fn create(plan: Plan) -> anyhow::Result<Network> {
        if !is_root() {
            bail!("partitions need root (network namespaces and nftables)");
        }
        let lock_dir = Path::new(leftovers::LOCK_DIR);
        let lock = RunLock::take(lock_dir, plan.id)
            .with_context(|| format!("taking the run's lock in {}", lock_dir.display()))?;
        let swept = leftovers::sweep(lock_dir);
        if !swept.deleted.is_empty() {
            let names: Vec<&str> = swept.deleted.iter().map(|l| l.name.as_str()).collect();
            eprintln!(
                "chaos: deleted what runs no longer alive left: {}",
                names.join(", ")
            );
        }
        for f in &swept.failed {
            eprintln!("chaos: could not delete a leftover of a run no longer alive: {f}");
        }
        let network = Network { plan, _lock: lock };
        network.delete();
        let p = &network.plan;
        let host = format!("{}/{}", p.host, p.prefix);
        run("ip", &["link", "add", &p.bridge, "type", "bridge"], None)?;
        run("ip", &["addr", "add", &host, "dev", &p.bridge], None)?;
        run("ip", &["link", "set", &p.bridge, "up"], None)?;
        for m in &p.members {
            let address = format!("{}/{}", m.address, p.prefix);
            let ns = m.netns.as_str();
            run("ip", &["netns", "add", ns], None)?;
            run(
                "ip",
                &[
                    "link",
                    "add",
                    &m.host_link,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &m.ns_link,
                ],
                None,
            )?;
            run("ip", &["link", "set", &m.ns_link, "netns", ns], None)?;
            run(
                "ip",
                &["link", "set", &m.host_link, "master", &p.bridge, "up"],
                None,
            )?;
            run(
                "ip",
                &["-n", ns, "addr", "add", &address, "dev", &m.ns_link],
                None,
            )?;
            run("ip", &["-n", ns, "link", "set", &m.ns_link, "up"], None)?;
            run("ip", &["-n", ns, "link", "set", "lo", "up"], None)?;
        }
        Ok(network)
    }

    /// The namespace `process` runs in, if it has one.
    pub fn netns(&self, process: &str) -> Option<&str> {
        self.plan.member(process).map(|m| m.netns.as_str())
    }

    /// Drops every packet between `process` and the API server.
    pub fn partition(&self, process: &str) -> anyhow::Result<()> {
        let ns = self.namespace_of(process)?;
        run(
            "ip",
            &["netns", "exec", ns, "nft", "-f", "-"],
            Some(&self.plan.partition_rules()),
        )
    }

    /// Lets `process`'s packets through again.
    pub fn heal(&self, process: &str) -> anyhow::Result<()> {
        let ns = self.namespace_of(process)?;
        run(
            "ip",
            &["netns", "exec", ns, "nft", "delete", "table", "inet", TABLE],
            None,
        )
    }

    fn namespace_of(&self, process: &str) -> anyhow::Result<&str> {
        self.netns(process)
            .with_context(|| format!("{process} has no network namespace of its own"))
    }

    /// Deletes the namespaces (each takes its veth end, and with it the host's) and the
    /// bridge; whatever is not there is skipped.
    fn delete(&self) {
        for m in &self.plan.members {
            let _ = run("ip", &["netns", "del", &m.netns], None);
            // A namespace still held by a process keeps its veth: delete the host's end.
            let _ = run("ip", &["link", "del", &m.host_link], None);
        }
        let _ = run("ip", &["link", "del", &self.plan.bridge], None);
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.delete();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_linux_and_addresses_share_one_block() {
        let p = Plan::new(4_194_304, &["agent-0", "controller-manager-0"]);
        assert!(p.bridge.len() <= 15);
        for m in &p.members {
            assert!(m.host_link.len() <= 15 && m.ns_link.len() <= 15, "{m:?}");
            assert_eq!(m.address.octets()[..3], p.host.octets()[..3]);
            assert_ne!(m.address, p.host);
        }
        assert_eq!(
            p.member("agent-0").unwrap().address.octets()[3],
            p.host.octets()[3] + 1
        );
        assert!(p.member("scheduler-0").is_none());
    }

    #[test]
    fn runs_with_other_ids_get_other_names_and_blocks() {
        let a = Plan::new(100, &["agent-0"]);
        let b = Plan::new(101, &["agent-0"]);
        assert_ne!(a.bridge, b.bridge);
        assert_ne!(a.members[0].netns, b.members[0].netns);
        assert_ne!(a.host, b.host);
        // A block never crosses into the next.
        let last = Plan::new(8191, &["a", "b", "c", "d", "e"]);
        assert_eq!(last.members[4].address, Ipv4Addr::new(10, 252, 255, 254));
    }

    #[test]
    fn a_partition_drops_both_ways_from_the_servers_address() {
        let p = Plan::new(7, &["agent-0"]);
        let rules = p.partition_rules();
        assert!(rules.contains(&format!("ip daddr {} drop", p.host)));
        assert!(rules.contains(&format!("ip saddr {} drop", p.host)));
    }
}
