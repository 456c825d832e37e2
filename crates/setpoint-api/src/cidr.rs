//! IP networks in CIDR notation, as the node IPAM controller hands them out (`spec.podCIDR`)
//! and the node agents route them: parsing as Go's `net.ParseCIDR` (the network of the
//! address and prefix length), printing in canonical form, and the arithmetic of splitting a
//! cluster range into equal subnets.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IPv4 or IPv6 network: its first address and its prefix length. The address is always
/// the network's own (the host bits are zero), so two values for one network are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a text is not a CIDR, in the words of Go's `net.ParseCIDR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address: {0}")]
pub struct CidrError(pub String);

impl Cidr {
    /// The network of `addr` with `prefix` bits (the host bits of `addr` cleared); `None`
    /// when `prefix` is longer than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Cidr> {
        let bits = bits_of(&addr);
        if prefix > bits {
            return None;
        }
        let value = to_u128(&addr) & mask(bits, prefix);
        Some(Cidr {
            addr: from_u128(value, addr.is_ipv4()),
            prefix,
        })
    }

    /// The network's first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether this is an IPv4 network.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// The address length in bits (32 or 128).
    pub fn bits(&self) -> u8 {
        bits_of(&self.addr)
    }

    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        ip.is_ipv4() == self.is_ipv4()
            && to_u128(ip) & mask(self.bits(), self.prefix) == to_u128(&self.addr)
    }

    /// Whether the two networks share any address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(&other.addr) || other.contains(&self.addr)
    }

    /// How many subnets of prefix length `sub_prefix` this network splits into; `None` when
    /// `sub_prefix` is shorter than the network's or longer than the address.
    pub fn subnet_count(&self, sub_prefix: u8) -> Option<u128> {
        if sub_prefix < self.prefix || sub_prefix > self.bits() {
            return None;
        }
        1u128.checked_shl(u32::from(sub_prefix - self.prefix))
    }

    /// The `index`th subnet of prefix length `sub_prefix`, counting from the network's
    /// first address; `None` past the last one.
    pub fn subnet(&self, sub_prefix: u8, index: u128) -> Option<Cidr> {
        if index >= self.subnet_count(sub_prefix)? {
            return None;
        }
        let step = 1u128
            .checked_shl(u32::from(self.bits() - sub_prefix))
            .unwrap_or(0);
        let value = to_u128(&self.addr) + index * step;
        Cidr::new(from_u128(value, self.is_ipv4()), sub_prefix)
    }

    /// Which subnet of prefix length `sub_prefix` `inner` is (its index for
    /// [`Cidr::subnet`]); `None` unless `inner` is exactly such a subnet of this network.
    pub fn subnet_index(&self, sub_prefix: u8, inner: &Cidr) -> Option<u128> {
        if inner.prefix != sub_prefix || !self.contains(&inner.addr) {
            return None;
        }
        self.subnet_count(sub_prefix)?;
        let offset = to_u128(&inner.addr) - to_u128(&self.addr);
        Some(offset >> (self.bits() - sub_prefix))
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let err = || CidrError(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(err)?;
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        // Go accepts only decimal digits here: no sign, no spaces.
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
            return Err(err());
        }
        let prefix: u8 = prefix.parse().map_err(|_| err())?;
        Cidr::new(addr, prefix).ok_or_else(err)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

fn bits_of(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

fn mask(bits: u8, prefix: u8) -> u128 {
    let all = if bits == 32 {
        u128::from(u32::MAX)
    } else {
        u128::MAX
    };
    let host = u32::from(bits - prefix);
    if host >= 128 {
        0
    } else {
        all & !((1u128 << host) - 1)
    }
}

fn to_u128(addr: &IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    }
}

fn from_u128(value: u128, v4: bool) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(value as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn parsing_keeps_the_network_and_refuses_what_go_refuses() {
        assert_eq!(c("10.244.3.7/16").to_string(), "10.244.0.0/16");
        assert_eq!(c("fd00::1/64").to_string(), "fd00::/64");
        assert_eq!(c("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(c("1.2.3.4/32").to_string(), "1.2.3.4/32");
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0/8",
            "x/8",
            "::/129",
            "10.0.0.0/+8",
        ] {
            assert_eq!(
                bad.parse::<Cidr>(),
                Err(CidrError(bad.into())),
                "{bad} should be refused"
            );
        }
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr>().unwrap_err().to_string(),
            "invalid CIDR address: 10.0.0.0/33"
        );
    }

    #[test]
    fn subnets_split_the_range_in_order() {
        let range = c("10.244.0.0/16");
        assert_eq!(range.subnet_count(24), Some(256));
        assert_eq!(range.subnet(24, 0), Some(c("10.244.0.0/24")));
        assert_eq!(range.subnet(24, 255), Some(c("10.244.255.0/24")));
        assert_eq!(range.subnet(24, 256), None);
        assert_eq!(range.subnet_index(24, &c("10.244.7.0/24")), Some(7));
        assert_eq!(range.subnet_index(24, &c("10.245.7.0/24")), None);
        assert_eq!(range.subnet_index(24, &c("10.244.7.0/25")), None);
        assert_eq!(range.subnet_count(8), None);
        let v6 = c("fd00::/48");
        assert_eq!(v6.subnet(64, 3), Some(c("fd00:0:0:3::/64")));
        assert_eq!(c("10.0.0.0/8").subnet(32, 1), Some(c("10.0.0.1/32")));
    }

    #[test]
    fn containment_and_overlap() {
        let range = c("10.244.0.0/16");
        assert!(range.contains(&"10.244.9.9".parse().unwrap()));
        assert!(!range.contains(&"10.245.0.0".parse().unwrap()));
        assert!(!range.contains(&"::1".parse().unwrap()));
        assert!(range.overlaps(&c("10.0.0.0/8")));
        assert!(c("10.96.0.0/12").overlaps(&c("10.100.0.0/16")));
        assert!(!range.overlaps(&c("10.96.0.0/12")));
        assert!(c("0.0.0.0/0").contains(&"1.1.1.1".parse().unwrap()));
    }
}
