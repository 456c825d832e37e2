//! The etcd cluster of a run on `--store etcd`: three members on loopback ports, each a
//! process of the run (killed and started again on its data dir like any other), and whether
//! a member answers healthy.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The members of a run's etcd cluster.
pub const MEMBERS: usize = 3;

/// The `etcd` binary (`SETPOINT_ETCD_BIN` names another one, as for the tests).
pub fn binary() -> String {
    std::env::var("SETPOINT_ETCD_BIN").unwrap_or_else(|_| "etcd".to_string())
}

/// One member's ports on loopback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    pub client: u16,
    pub peer: u16,
}

/// The client URL of a member.
pub fn client_url(p: Ports) -> String {
    format!("http://127.0.0.1:{}", p.client)
}

fn peer_url(p: Ports) -> String {
    format!("http://127.0.0.1:{}", p.peer)
}

/// The arguments of member `i` of the cluster of `ports`, its data in `data_dir`. The same
/// arguments start it again after a kill: with a data dir, etcd ignores the initial-cluster
/// flags and rejoins as the member it was.
pub fn member_args(i: usize, ports: &[Ports], data_dir: &Path, token: &str) -> Vec<String> {
    let initial: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(j, p)| format!("etcd-{j}={}", peer_url(*p)))
        .collect();
    let me = ports[i];
    vec![
        "--name".into(),
        format!("etcd-{i}"),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen-client-urls".into(),
        client_url(me),
        "--advertise-client-urls".into(),
        client_url(me),
        "--listen-peer-urls".into(),
        peer_url(me),
        "--initial-advertise-peer-urls".into(),
        peer_url(me),
        "--initial-cluster".into(),
        initial.join(","),
        "--initial-cluster-state".into(),
        "new".into(),
        // Unique per run, so members of two runs could never join each other.
        "--initial-cluster-token".into(),
        token.to_string(),
        "--logger".into(),
        "zap".into(),
        "--log-level".into(),
        "warn".into(),
    ]
}

/// Whether the member listening on `port` answers `/health` with `"health":"true"` (it is
/// part of a cluster with a leader).
pub async fn healthy(port: u16) -> bool {
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body.contains("\"health\":\"true\""))
    };
    tokio::time::timeout(Duration::from_secs(2), ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_names_the_whole_cluster_and_itself() {
        let ports = [
            Ports {
                client: 1001,
                peer: 2001,
            },
            Ports {
                client: 1002,
                peer: 2002,
            },
            Ports {
                client: 1003,
                peer: 2003,
            },
        ];
        let args = member_args(1, &ports, Path::new("/d/etcd-1"), "t");
        let value = |flag: &str| {
            let i = args.iter().position(|a| a == flag).expect(flag);
            args[i + 1].clone()
        };
        assert_eq!(value("--name"), "etcd-1");
        assert_eq!(value("--listen-client-urls"), "http://127.0.0.1:1002");
        assert_eq!(
            value("--initial-advertise-peer-urls"),
            "http://127.0.0.1:2002"
        );
        assert_eq!(
            value("--initial-cluster"),
            "etcd-0=http://127.0.0.1:2001,etcd-1=http://127.0.0.1:2002,etcd-2=http://127.0.0.1:2003"
        );
        assert_eq!(value("--data-dir"), "/d/etcd-1");
    }
}
