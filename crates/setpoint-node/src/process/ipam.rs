//! Loopback addresses for pods. Every address in 127.0.0.0/8 reaches the local host on
//! Linux, so each pod gets its own and several replicas can listen on the same port.

use std::collections::HashSet;
use std::net::Ipv4Addr;

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
    /// The lowest address of the range that is not in `used`, skipping addresses ending in
    /// `.0` or `.255` (they look like network or broadcast addresses to people and tools).
    pub fn allocate(&self, used: &HashSet<Ipv4Addr>) -> Option<Ipv4Addr> {
        let start = u32::from(self.first);
        (0..self.count)
            .filter_map(|i| start.checked_add(i).map(Ipv4Addr::from))
            .filter(|ip| ip.octets()[3] != 0 && ip.octets()[3] != 255)
            .find(|ip| !used.contains(ip))
    }
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
}
