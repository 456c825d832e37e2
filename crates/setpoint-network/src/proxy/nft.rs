//! Running `nft`: every change is one `nft -f -` transaction on the proxy's own table, so the
//! kernel moves from one complete ruleset to the next with nothing in between.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Why `nft` did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The `nft` program could not be run (not installed, not on `PATH`).
    #[error("cannot run nft: {0}")]
    Spawn(#[source] std::io::Error),
    /// `nft` ran and refused: its standard error.
    #[error("nft failed: {0}")]
    Failed(String),
}

/// The `nft` command line, on one table of family `ip`.
#[derive(Clone, Debug)]
pub struct Nft {
    table: String,
}

impl Nft {
    /// `nft` acting on table `ip <table>`.
    pub fn new(table: &str) -> Nft {
        Nft {
            table: table.into(),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether this process may program nftables: lists the tables, which needs
    /// `CAP_NET_ADMIN` as every change does.
    pub async fn probe() -> Result<(), NftError> {
        run(&["list", "tables"], None).await.map(|_| ())
    }

    /// Applies `script` (`nft -f -` syntax) as one transaction.
    pub async fn apply(&self, script: &str) -> Result<(), NftError> {
        run(&["-f", "-"], Some(script)).await.map(|_| ())
    }

    /// The table as `nft list table` prints it, `None` when it does not exist.
    pub async fn list(&self) -> Result<Option<String>, NftError> {
        match run(&["list", "table", "ip", &self.table], None).await {
            Ok(out) => Ok(Some(out)),
            Err(NftError::Failed(e)) if e.contains("No such file or directory") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the table and everything in it (`kube-proxy --cleanup`'s job); absent is fine.
    pub async fn delete_table(&self) -> Result<(), NftError> {
        // `add` first makes the delete succeed when the table is absent, in one transaction.
        let script = format!("add table ip {0}\ndelete table ip {0}\n", self.table);
        self.apply(&script).await
    }
}

async fn run(args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
    let mut cmd = Command::new("nft");
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(NftError::Spawn)?;
    if let (Some(script), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(script.as_bytes())
            .await
            .map_err(NftError::Spawn)?;
        drop(pipe);
    }
    let out = child.wait_with_output().await.map_err(NftError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        // A transaction's error repeats the offending line; a long script's is cut short.
        let mut msg: String = err.trim().chars().take(2000).collect();
        if msg.is_empty() {
            msg = format!("exit status {}", out.status);
        }
        Err(NftError::Failed(msg))
    }
}
