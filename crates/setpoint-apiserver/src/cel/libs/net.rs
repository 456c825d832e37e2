//! Kubernetes' IP address and CIDR libraries (`k8s.io/apiserver/pkg/cel/library/ip.go` and
//! `cidr.go`): the `net.IP` and `net.CIDR` types. As upstream, IPv4-mapped IPv6 addresses
//! and zones are refused, a CIDR keeps the address it was written with (`ip()`), and
//! `masked()` gives its network; containment is `setpoint_api::cidr`'s.

use std::net::{IpAddr, Ipv4Addr};

use cel::common::types::{CelBool, CelInt, CelString};
use cel::{DeclarationError, Env, ExecutionError};
use setpoint_api::cidr::Cidr;

use super::opaque_val;

/// A CEL value of type `net.IP`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelIp(IpAddr);

opaque_val!(
    CelIp,
    cel::common::types::Type::new_unspecified_type("net.IP")
);

/// A CEL value of type `net.CIDR`: the address as written and the prefix length.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelCidr {
    addr: IpAddr,
    prefix: u8,
}

opaque_val!(
    CelCidr,
    cel::common::types::Type::new_unspecified_type("net.CIDR")
);

impl CelCidr {
    fn network(&self) -> Cidr {
        Cidr::new(self.addr, self.prefix).expect("prefix checked when parsed")
    }
}

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(cel::common::types::Type::new_unspecified_type("net.IP"))?;
    env.add_type(cel::common::types::Type::new_unspecified_type("net.CIDR"))?;
    cel::add_overload!(env, fn ip: (CelString) -> Result<CelIp>, id = "string_to_ip")?;
    cel::add_overload!(env, fn is_ip: (CelString) -> CelBool, name = "isIP", id = "is_ip")?;
    cel::add_overload!(env, fn is_canonical: (CelString) -> Result<CelBool>,
        name = "ip.isCanonical", id = "ip_is_canonical")?;
    cel::add_overload!(env, fn ip_string: (CelIp) -> CelString<'static>,
        name = "string", id = "ip_to_string")?;
    cel::add_member_overload!(env, fn family: (CelIp) -> CelInt, id = "ip_family")?;
    cel::add_member_overload!(env, fn is_unspecified: (CelIp) -> CelBool,
        id = "ip_is_unspecified")?;
    cel::add_member_overload!(env, fn is_loopback: (CelIp) -> CelBool, id = "ip_is_loopback")?;
    cel::add_member_overload!(env, fn is_link_local_multicast: (CelIp) -> CelBool,
        id = "ip_is_link_local_multicast")?;
    cel::add_member_overload!(env, fn is_link_local_unicast: (CelIp) -> CelBool,
        id = "ip_is_link_local_unicast")?;
    cel::add_member_overload!(env, fn is_global_unicast: (CelIp) -> CelBool,
        id = "ip_is_global_unicast")?;

    cel::add_overload!(env, fn cidr: (CelString) -> Result<CelCidr>, id = "string_to_cidr")?;
    cel::add_overload!(env, fn is_cidr: (CelString) -> CelBool, name = "isCIDR", id = "is_cidr")?;
    cel::add_overload!(env, fn cidr_string: (CelCidr) -> CelString<'static>,
        name = "string", id = "cidr_to_string")?;
    cel::add_member_overload!(env, fn contains_ip: (CelCidr, CelIp) -> CelBool,
        name = "containsIP", id = "cidr_contains_ip_ip")?;
    cel::add_member_overload!(env, fn contains_ip_string: (CelCidr, CelString) -> Result<CelBool>,
        name = "containsIP", id = "cidr_contains_ip_string")?;
    cel::add_member_overload!(env, fn contains_cidr: (CelCidr, CelCidr) -> CelBool,
        name = "containsCIDR", id = "cidr_contains_cidr")?;
    cel::add_member_overload!(env, fn contains_cidr_string: (CelCidr, CelString) -> Result<CelBool>,
        name = "containsCIDR", id = "cidr_contains_cidr_string")?;
    cel::add_member_overload!(env, fn cidr_ip: (CelCidr) -> CelIp,
        name = "ip", id = "cidr_ip")?;
    cel::add_member_overload!(env, fn masked: (CelCidr) -> CelCidr, id = "cidr_masked")?;
    cel::add_member_overload!(env, fn prefix_length: (CelCidr) -> CelInt,
        id = "cidr_prefix_length")?;
    Ok(())
}

/// Parses an address as upstream's `netip.ParseAddr` plus its refusals.
fn parse_ip(s: &str) -> Result<IpAddr, String> {
    if s.contains('%') {
        return Err("IP address with zone value is not allowed".into());
    }
    let addr: IpAddr = s
        .parse()
        .map_err(|_| format!("ParseAddr({s:?}): unable to parse IP"))?;
    if let IpAddr::V6(v6) = addr {
        if v6.to_ipv4_mapped().is_some() {
            return Err("IPv4-mapped IPv6 address is not allowed".into());
        }
    }
    Ok(addr)
}

fn ip(s: &CelString<'_>) -> Result<CelIp, ExecutionError> {
    parse_ip(s.inner()).map(CelIp).map_err(|e| {
        ExecutionError::function_error(
            "ip",
            format!(
                "IP Address {:?} parse error during conversion from string: {e}",
                s.inner()
            ),
        )
    })
}

fn is_ip(s: &CelString<'_>) -> CelBool {
    parse_ip(s.inner()).is_ok().into()
}

fn is_canonical(s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let addr = ip(s)?;
    // The standard library prints IPv6 as RFC 5952 says, which is Go's canonical form too.
    Ok((addr.0.to_string() == s.inner()).into())
}

fn ip_string(a: &CelIp) -> CelString<'static> {
    a.0.to_string().into()
}

fn family(a: &CelIp) -> CelInt {
    if a.0.is_ipv4() { 4 } else { 6 }.into()
}

fn is_unspecified(a: &CelIp) -> CelBool {
    a.0.is_unspecified().into()
}

fn is_loopback(a: &CelIp) -> CelBool {
    a.0.is_loopback().into()
}

fn is_link_local_multicast(a: &CelIp) -> CelBool {
    match a.0 {
        // 224.0.0.0/24
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        // ff02::/16
        IpAddr::V6(v6) => v6.segments()[0] == 0xff02,
    }
    .into()
}

fn link_local_unicast(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4.is_link_local(),
        // fe80::/10
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

fn is_link_local_unicast(a: &CelIp) -> CelBool {
    link_local_unicast(&a.0).into()
}

/// Go's `IsGlobalUnicast`: neither unspecified, loopback, multicast, link-local unicast nor
/// the IPv4 broadcast address.
fn is_global_unicast(a: &CelIp) -> CelBool {
    let addr = a.0;
    let multicast = addr.is_multicast();
    let broadcast = addr == IpAddr::V4(Ipv4Addr::BROADCAST);
    (!addr.is_unspecified()
        && !addr.is_loopback()
        && !multicast
        && !broadcast
        && !link_local_unicast(&addr))
    .into()
}

fn parse_cidr(s: &str) -> Result<CelCidr, String> {
    let (addr, prefix) = s
        .split_once('/')
        .ok_or_else(|| format!("netip.ParsePrefix({s:?}): no '/'"))?;
    let addr = parse_ip(addr).map_err(|e| format!("netip.ParsePrefix({s:?}): {e}"))?;
    let bits = if addr.is_ipv4() { 32 } else { 128 };
    let prefix: u8 = prefix
        .parse()
        .ok()
        .filter(|p| *p <= bits && !prefix.starts_with('+'))
        .ok_or_else(|| format!("netip.ParsePrefix({s:?}): bad bits after slash: {prefix:?}"))?;
    Ok(CelCidr { addr, prefix })
}

fn cidr(s: &CelString<'_>) -> Result<CelCidr, ExecutionError> {
    parse_cidr(s.inner()).map_err(|e| {
        ExecutionError::function_error(
            "cidr",
            format!("network address parse error during conversion from string: {e}"),
        )
    })
}

fn is_cidr(s: &CelString<'_>) -> CelBool {
    parse_cidr(s.inner()).is_ok().into()
}

fn cidr_string(c: &CelCidr) -> CelString<'static> {
    format!("{}/{}", c.addr, c.prefix).into()
}

fn contains_ip(c: &CelCidr, a: &CelIp) -> CelBool {
    c.network().contains(&a.0).into()
}

fn contains_ip_string(c: &CelCidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    Ok(contains_ip(c, &ip(s)?))
}

fn contains_cidr(c: &CelCidr, other: &CelCidr) -> CelBool {
    let inner = other.network();
    (c.addr.is_ipv4() == other.addr.is_ipv4()
        && other.prefix >= c.prefix
        && c.network().contains(&inner.addr()))
    .into()
}

fn contains_cidr_string(c: &CelCidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    Ok(contains_cidr(c, &cidr(s)?))
}

fn cidr_ip(c: &CelCidr) -> CelIp {
    CelIp(c.addr)
}

fn masked(c: &CelCidr) -> CelCidr {
    CelCidr {
        addr: c.network().addr(),
        prefix: c.prefix,
    }
}

fn prefix_length(c: &CelCidr) -> CelInt {
    i64::from(c.prefix).into()
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_error, assert_true};

    /// Upstream's documented examples (the IP and CIDR library tables of "CEL in Kubernetes").
    #[test]
    fn documented_ip_examples() {
        assert_true(&[
            "isIP('127.0.0.1')",
            "isIP('::1')",
            "!isIP('127.0.0.256')",
            "!isIP(':::1')",
            "!isIP('::ffff:127.0.0.1')",
            "!isIP('fe80::1%eth0')",
            "ip('127.0.0.1').family() == 4",
            "ip('::1').family() == 6",
            "ip.isCanonical('127.0.0.1')",
            "ip.isCanonical('2001:db8::abcd')",
            "!ip.isCanonical('2001:DB8::ABCD')",
            "!ip.isCanonical('2001:db8::0:0:0:abcd')",
            "ip('0.0.0.0').isUnspecified()",
            "ip('::').isUnspecified()",
            "!ip('127.0.0.1').isUnspecified()",
            "ip('127.0.0.1').isLoopback()",
            "ip('::1').isLoopback()",
            "!ip('1.2.3.4').isLoopback()",
            "ip('224.0.0.1').isLinkLocalMulticast()",
            "ip('ff02::1').isLinkLocalMulticast()",
            "!ip('224.0.1.1').isLinkLocalMulticast()",
            "ip('169.254.169.254').isLinkLocalUnicast()",
            "ip('fe80::1').isLinkLocalUnicast()",
            "!ip('192.168.0.1').isLinkLocalUnicast()",
            "ip('192.168.0.1').isGlobalUnicast()",
            "ip('2001:db8::1').isGlobalUnicast()",
            "!ip('255.255.255.255').isGlobalUnicast()",
            "!ip('ff00::1').isGlobalUnicast()",
            "string(ip('127.0.0.1')) == '127.0.0.1'",
            "ip('127.0.0.1') == ip('127.0.0.1')",
            "ip('127.0.0.1') != ip('127.0.0.2')",
        ]);
        assert_error(
            "ip('::ffff:1.2.3.4')",
            "IPv4-mapped IPv6 address is not allowed",
        );
        assert_error("ip('1.2.3')", "parse error during conversion from string");
    }

    #[test]
    fn documented_cidr_examples() {
        assert_true(&[
            "isCIDR('192.168.0.0/16')",
            "isCIDR('::1/128')",
            "!isCIDR('192.168.0.0/33')",
            "!isCIDR('192.168.0.0')",
            "cidr('192.168.0.0/24').containsIP(ip('192.168.0.1'))",
            "!cidr('192.168.0.0/24').containsIP(ip('192.168.1.1'))",
            "cidr('192.168.0.0/24').containsIP('192.168.0.1')",
            "cidr('2001:db8::/32').containsIP(ip('2001:db8::1'))",
            "cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.0/25'))",
            "cidr('192.168.0.0/24').containsCIDR('192.168.0.0/25')",
            "!cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.0/23'))",
            "cidr('192.168.0.0/24').containsCIDR(cidr('192.168.0.0/24'))",
            "cidr('192.168.0.1/24').ip() == ip('192.168.0.1')",
            "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.0/24').masked() == cidr('192.168.0.0/24')",
            "cidr('192.168.0.0/16').prefixLength() == 16",
            "cidr('::1/128').ip().family() == 6",
            "string(cidr('192.168.0.0/24')) == '192.168.0.0/24'",
        ]);
        assert_error(
            "cidr('192.168.0.0/33')",
            "network address parse error during conversion from string",
        );
    }
}
