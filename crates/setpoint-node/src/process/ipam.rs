//! Loopback addresses for pods. Every address in 127.0.0.0/8 reaches the local host on
//! Linux, so each pod gets its own and several replicas can listen on the same port.
//!
//! Each node's state directory has its own block of 65,000 addresses (`127.B.0.1` upward),
//! chosen at its first start among the blocks nothing on the host uses yet, and kept in the
//! directory (`pod-ips`), so two clusters on one machine do not hand out the same address. An
//! address some other process has a socket on is skipped too.

use std::collections::HashSet;
use std::io;
use std::net::Ipv4Addr;
use std::path::Path;

/// The file in a state directory that records its range.
const RANGE_FILE: &str = "pod-ips";

/// A range of addresses to hand out: `count` addresses from `first` upward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpRange {
    /// The first address handed out.
    pub first: Ipv4Addr,
    /// How many addresses the range spans (including skipped `.0`/`.255` ones).
    pub count: u32,
}

impl Default for IpRange {
    /// 127.1.0.1 upward, 65,000 addresses (127.0.0.1 stays the host's).
    fn default() -> Self {
        Self {
            first: Ipv4Addr::new(127, 1, 0, 1),
            count: 65_000,
        }
    }
}

impl IpRange {
    /// The block `127.b.0.1` upward.
    fn block(b: u8) -> IpRange {
        IpRange {
            first: Ipv4Addr::new(127, b, 0, 1),
            ..IpRange::default()
        }
    }

    /// Whether `ip` is one of the range's addresses.
    fn contains(&self, ip: Ipv4Addr) -> bool {
        let (first, ip) = (u32::from(self.first), u32::from(ip));
        ip >= first && ip - first < self.count
    }

    /// The lowest address of the range that is not in `used`, skipping addresses ending in
    /// `.0` or `.255` (they look like network or broadcast addresses to people and tools).
    pub fn allocate(&self, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let start = u32::from(self.first);
        (0..self.count)
            .filter_map(|i| start.checked_add(i).map(Ipv4Addr::from))
            .filter(|ip| ip.octets()[3] != 0 && ip.octets()[3] != 255)
            .find(|ip| !used.contains(ip))
    }

    /// The range of the state directory `root`: the one it recorded, or, at its first start,
    /// a block nothing on the host uses (pods adopted from a version that recorded no range
    /// keep the old default, 127.1.0.1 upward). The choice is written to the directory.
    pub fn for_state_dir(root: &Path, adopted: &HashSet<Ipv4Addr>) -> io::Result<IpRange> {
        let file = root.join(RANGE_FILE);
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                return parse(&text).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: not a pod address range: {text:?}", file.display()),
                    )
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let range = if adopted.is_empty() {
            choose_block(&in_use_on_host(), rand::random::<u8>())
        } else {
            IpRange::default()
        };
        let tmp = root.join(format!("{RANGE_FILE}.tmp"));
        std::fs::write(&tmp, format!("{} {}\n", range.first, range.count))?;
        std::fs::rename(&tmp, &file)?;
        tracing::info!(first = %range.first, count = range.count, "pod address range chosen");
        Ok(range)
    }
}

fn parse(text: &str) -> Option<IpRange> {
    let mut parts = text.split_whitespace();
    let first = parts.next()?.parse().ok()?;
    let count = parts.next()?.parse().ok()?;
    Some(IpRange { first, count })
}

/// The first block `127.b.0.1` (b from 2 to 254, starting at `start` and wrapping) that no
/// address in `in_use` falls in; `127.0` is the host's and `127.1` the old default. When every
/// block has something, the one with the fewest.
fn choose_block(in_use: &HashSet<Ipv4Addr>, start: u8) -> IpRange {
    let blocks = 2u8..=254;
    let n = blocks.len();
    let candidates = (0..n).map(|i| 2 + ((usize::from(start) + i) % n) as u8);
    let used_in = |b: u8| {
        let r = IpRange::block(b);
        in_use.iter().filter(|ip| r.contains(**ip)).count()
    };
    candidates
        .clone()
        .find(|b| used_in(*b) == 0)
        .or_else(|| candidates.min_by_key(|b| used_in(*b)))
        .map(IpRange::block)
        .unwrap_or_default()
}

/// The IPv4 loopback addresses other than 127.0.0.1 that sockets on this host are bound to
/// (`/proc/net/{tcp,udp}`): another cluster's pods, or anything else listening there.
pub fn in_use_on_host() -> HashSet<Ipv4Addr> {
    let mut found = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/udp"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // "  sl  local_address rem_address ...": the local address is hex, host order
            // of a little-endian u32, then ":port".
            let Some(local) = line.split_whitespace().nth(1) else {
                continue;
            };
            let Some((hex, _port)) = local.split_once(':') else {
                continue;
            };
            if let Ok(v) = u32::from_str_radix(hex, 16) {
                let ip = Ipv4Addr::from(v.swap_bytes());
                if ip.is_loopback() && ip != Ipv4Addr::LOCALHOST {
                    found.insert(ip);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_the_lowest_free_address_and_skips_edges() {
        let range = IpRange {
            first: Ipv4Addr::new(127, 1, 0, 254),
            count: 4,
        };
        let mut used = HashSet::new();
        assert_eq!(range.allocate(&used), Some(Ipv4Addr::new(127, 1, 0, 254)));
        used.insert(Ipv4Addr::new(127, 1, 0, 254));
        assert_eq!(range.allocate(&used), Some(Ipv4Addr::new(127, 1, 1, 1)));
        used.insert(Ipv4Addr::new(127, 1, 1, 1));
        assert_eq!(range.allocate(&used), None);
        used.remove(&Ipv4Addr::new(127, 1, 0, 254));
        assert_eq!(range.allocate(&used), Some(Ipv4Addr::new(127, 1, 0, 254)));
    }

    #[test]
    fn a_new_state_dir_takes_a_free_block_and_keeps_it() {
        let in_use: HashSet<_> = [Ipv4Addr::new(127, 7, 0, 1), Ipv4Addr::new(127, 8, 3, 9)]
            .into_iter()
            .collect();
        assert_eq!(choose_block(&in_use, 5).first, Ipv4Addr::new(127, 9, 0, 1));
        assert_eq!(choose_block(&in_use, 4).first, Ipv4Addr::new(127, 6, 0, 1));
        // Wraps from 254 to 2.
        assert_eq!(
            choose_block(&in_use, 252).first,
            Ipv4Addr::new(127, 254, 0, 1)
        );
        assert_eq!(
            choose_block(&HashSet::new(), 253).first,
            Ipv4Addr::new(127, 2, 0, 1)
        );

        let dir = tempfile::tempdir().unwrap();
        let chosen = IpRange::for_state_dir(dir.path(), &HashSet::new()).unwrap();
        assert_ne!(chosen.first.octets()[1], 0);
        assert_ne!(chosen.first.octets()[1], 1);
        assert_eq!(
            IpRange::for_state_dir(dir.path(), &HashSet::new()).unwrap(),
            chosen
        );
        // Pods from before ranges were recorded keep the old default.
        let old = tempfile::tempdir().unwrap();
        let adopted = [Ipv4Addr::new(127, 1, 0, 1)].into_iter().collect();
        assert_eq!(
            IpRange::for_state_dir(old.path(), &adopted).unwrap(),
            IpRange::default()
        );
    }

    #[test]
    fn sockets_on_loopback_addresses_are_seen() {
        let listener = std::net::TcpListener::bind((Ipv4Addr::new(127, 201, 7, 9), 0)).unwrap();
        assert!(in_use_on_host().contains(&Ipv4Addr::new(127, 201, 7, 9)));
        drop(listener);
    }
}
