//! The routes' I/O: reading, replacing and deleting this host's routes of one `proto`
//! number with iproute2's `ip`, and the host's own addresses.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::plan::Route;

/// A failed `ip` command.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// `ip` could not be run.
    #[error("running `ip`: {0}")]
    Spawn(#[from] std::io::Error),
    /// `ip` ran and failed.
    #[error("`ip {args}` failed: {stderr}")]
    Failed {
        /// Its arguments.
        args: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// This process may not change routes.
    #[error("changing routes needs CAP_NET_ADMIN, which this process does not have")]
    NotPermitted,
}

async fn ip(args: &[&str]) -> Result<String, RouteError> {
    let out = tokio::process::Command::new("ip")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if !out.status.success() {
        return Err(RouteError::Failed {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process can change routes: `ip` is installed, and the effective
/// capabilities hold `CAP_NET_ADMIN` (bit 12).
pub async fn probe() -> Result<(), RouteError> {
    ip(&["-V"]).await?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    if cap & (1 << 12) == 0 {
        return Err(RouteError::NotPermitted);
    }
    Ok(())
}

/// The routes of the main table with protocol `proto` (the ones this node owns).
pub async fn list(proto: u8) -> Result<BTreeSet<Route>, RouteError> {
    let proto = proto.to_string();
    let mut out = BTreeSet::new();
    for family in ["-4", "-6"] {
        let args = [
            family, "-o", "route", "show", "table", "main", "proto", &proto,
        ];
        let text = match ip(&args).await {
            Ok(text) => text,
            // A family without a single route (IPv6 off, say) has no table to list.
            Err(RouteError::Failed { stderr, .. })
                if stderr.contains("FIB table does not exist") =>
            {
                String::new()
            }
            Err(e) => return Err(e),
        };
        out.extend(text.lines().filter_map(parse_route));
    }
    Ok(out)
}

/// One line of `ip -o route show`: `<dst> via <gateway> dev <dev> ...`; `None` for routes
/// without a gateway or a CIDR destination.
pub fn parse_route(line: &str) -> Option<Route> {
    let mut words = line.split_whitespace();
    let dst = words.next()?;
    // A host route is printed without its /32 or /128.
    let dst = if dst.contains('/') {
        dst.parse().ok()?
    } else {
        let addr: IpAddr = dst.parse().ok()?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        setpoint_api::cidr::Cidr::new(addr, bits)?
    };
    let mut via = None;
    while let Some(w) = words.next() {
        if w == "via" {
            let mut next = words.next()?;
            // `via inet6 <addr>` names the family when it differs from the destination's.
            if next == "inet" || next == "inet6" {
                next = words.next()?;
            }
            via = next.parse().ok();
            break;
        }
    }
    Some(Route { dst, via: via? })
}

/// Adds `route`, or repoints the route to its destination, with protocol `proto`.
pub async fn replace(route: &Route, proto: u8) -> Result<(), RouteError> {
    let (dst, via, proto) = (
        route.dst.to_string(),
        route.via.to_string(),
        proto.to_string(),
    );
    ip(&["route", "replace", &dst, "via", &via, "proto", &proto]).await?;
    Ok(())
}

/// Deletes `route` (only the one with protocol `proto`).
pub async fn delete(route: &Route, proto: u8) -> Result<(), RouteError> {
    let (dst, via, proto) = (
        route.dst.to_string(),
        route.via.to_string(),
        proto.to_string(),
    );
    match ip(&["route", "del", &dst, "via", &via, "proto", &proto]).await {
        // Gone already (its link went down, say): what was wanted.
        Err(RouteError::Failed { stderr, .. }) if stderr.contains("No such process") => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Every address on this host's interfaces.
pub async fn local_addresses() -> Result<Vec<IpAddr>, RouteError> {
    let text = ip(&["-o", "addr", "show"]).await?;
    Ok(text
        .lines()
        .filter_map(|line| {
            // `<n>: <dev> inet <addr>/<len> ...`
            let mut words = line.split_whitespace().skip(2);
            let family = words.next()?;
            if family != "inet" && family != "inet6" {
                return None;
            }
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_lines_parse() {
        let r = parse_route("10.244.1.0/24 via 192.168.7.2 dev veth0 proto 211 ").unwrap();
        assert_eq!(r.dst.to_string(), "10.244.1.0/24");
        assert_eq!(r.via.to_string(), "192.168.7.2");
        let host = parse_route("10.9.9.9 via 10.0.0.1 dev eth0").unwrap();
        assert_eq!(host.dst.to_string(), "10.9.9.9/32");
        let v6 = parse_route("fd00:1::/64 via fd00::2 dev eth0 metric 1024 pref medium").unwrap();
        assert_eq!(v6.via.to_string(), "fd00::2");
        assert_eq!(parse_route("10.1.0.0/24 dev br0 scope link"), None);
        assert_eq!(parse_route("default via 10.0.0.1 dev eth0"), None);
    }
}
