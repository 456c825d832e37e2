//! What the control-plane components that run against an API server share: connecting from a
//! kubeconfig, and leader election when they run as several replicas.

use std::path::Path;
use std::time::Duration;

use setpoint_runtime::client::{Client, Kubeconfig};
use setpoint_runtime::leader::{LeaderConfig, LeaderElector, LeaderHandle, LeaseLock};
use setpoint_runtime::metrics::LeaderMetrics;
use tokio::sync::watch;

/// A client for the API server in the kubeconfig at `path` (default: `$KUBECONFIG`, then
/// `~/.kube/config`), and the kubeconfig itself. `component` is its `User-Agent` name, which
/// the server records as the field manager of its writes.
pub fn connect(path: Option<&Path>, component: &str) -> anyhow::Result<(Client, Kubeconfig)> {
    let kubeconfig = match path {
        Some(p) => Kubeconfig::read(p)?,
        None => Kubeconfig::from_env()?,
    };
    let client = Client::from_kubeconfig(&kubeconfig)?.with_user_agent(component);
    Ok((client, kubeconfig))
}

/// The leader election flags kube-controller-manager and kube-scheduler take, with their
/// defaults; durations are written as Go writes them (`15s`, `1m30s`, `500ms`).
#[derive(clap::Args, Clone, Debug)]
pub struct LeaderElectionFlags {
    /// Elect a leader on the component's Lease in `kube-system`, so that only one of several
    /// replicas acts (`--leader-elect=false` to run unconditionally).
    #[arg(
        long,
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub leader_elect: bool,
    /// How long standbys wait after the leader's last renewal before taking the Lease over.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal (less than the lease
    /// duration).
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// How often the leader renews and standbys retry.
    #[arg(long, default_value = "2s", value_parser = parse_go_duration)]
    pub leader_elect_retry_period: Duration,
}

impl Default for LeaderElectionFlags {
    fn default() -> Self {
        let config = LeaderConfig::default();
        LeaderElectionFlags {
            leader_elect: true,
            leader_elect_lease_duration: config.lease_duration,
            leader_elect_renew_deadline: config.renew_deadline,
            leader_elect_retry_period: config.retry_period,
        }
    }
}

impl LeaderElectionFlags {
    /// The election's timing (releasing the Lease on a clean stop, as upstream's components
    /// do with `ReleaseOnCancel`).
    pub fn config(&self) -> LeaderConfig {
        LeaderConfig {
            lease_duration: self.leader_elect_lease_duration,
            renew_deadline: self.leader_elect_renew_deadline,
            retry_period: self.leader_elect_retry_period,
            release_on_shutdown: true,
        }
    }
}

/// Parses a Go `time.Duration` string: a sequence of decimal numbers, each with a unit
/// (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `15s`, `1m30s`, `1.5s`; `0` alone is zero.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {s:?}: expected e.g. 15s, 500ms or 1m30s");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(bad());
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..num_end].parse().map_err(|_| bad())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// A component's place in its election: the handle (to release the Lease on shutdown) and
/// the "am I leading" signal. Both are `None` when election is off (the component always acts).
pub struct Leadership {
    pub handle: Option<LeaderHandle>,
    pub leading: Option<watch::Receiver<bool>>,
}

/// Joins the election on the Lease `namespace/name` as the flags say, recording
/// `leader_election_master_status` into `metrics` when given.
pub fn elect(
    client: &Client,
    lease: (&str, &str),
    flags: &LeaderElectionFlags,
    metrics: Option<LeaderMetrics>,
) -> anyhow::Result<Leadership> {
    if !flags.leader_elect {
        return Ok(Leadership {
            handle: None,
            leading: None,
        });
    }
    // The elector does not share the component's rate limit: renewals queued behind a
    // controller's burst of creates (a 1,000-pod ReplicaSet reserves seconds of tokens at
    // once) missed the renew deadline, so leadership changed hands under load, each time
    // with the new leader's caches behind the old one's writes. Upstream likewise gives
    // leader election a client of its own; the elector paces itself by its retry period.
    let mut elector = LeaderElector::new(
        client.clone().without_rate_limit(),
        LeaseLock::new(lease.0, lease.1),
        flags.config(),
    )?;
    if let Some(m) = metrics {
        elector = elector.with_metrics(m);
    }
    let handle = elector.start();
    tracing::info!(identity = handle.identity(), lease = %format!("{}/{}", lease.0, lease.1), "leader election");
    let leading = Some(handle.is_leader());
    Ok(Leadership {
        handle: Some(handle),
        leading,
    })
}

impl Leadership {
    /// Releases the Lease (if held) so another replica takes over at once, not after it
    /// expires.
    pub async fn release(self) {
        if let Some(h) = self.handle {
            h.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration(s).unwrap();
        assert_eq!(d("15s"), Duration::from_secs(15));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "15", "s", "-1s", "1x", "1.2.3s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
