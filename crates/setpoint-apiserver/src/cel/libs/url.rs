//! Kubernetes' URL library (`k8s.io/apiserver/pkg/cel/library/urls.go`): the
//! `kubernetes.URL` type. URLs parse as Go's `url.ParseRequestURI` does: an absolute URI or
//! an absolute path, no relative references.

use std::collections::HashMap;

use cel::common::types::{CelBool, CelList, CelMap, CelMapKey, CelString};
use cel::common::value::Val;
use cel::{DeclarationError, Env, ExecutionError};

use super::opaque_val;

/// A parsed URL: the parts upstream's accessors return.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CelUrl {
    scheme: String,
    /// `host[:port]` as written, brackets around IPv6 included.
    host: String,
    /// The path exactly as written (still escaped).
    raw_path: String,
    raw_query: String,
}

opaque_val!(
    CelUrl,
    cel::common::types::Type::new_unspecified_type("kubernetes.URL")
);

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(cel::common::types::Type::new_unspecified_type(
        "kubernetes.URL",
    ))?;
    cel::add_overload!(env, fn url: (CelString) -> Result<CelUrl>, id = "string_to_url")?;
    cel::add_overload!(env, fn is_url: (CelString) -> CelBool,
        name = "isURL", id = "is_url_string")?;
    cel::add_member_overload!(env, fn get_scheme: (CelUrl) -> CelString<'static>,
        id = "url_get_scheme")?;
    cel::add_member_overload!(env, fn get_host: (CelUrl) -> CelString<'static>,
        id = "url_get_host")?;
    cel::add_member_overload!(env, fn get_hostname: (CelUrl) -> CelString<'static>,
        id = "url_get_hostname")?;
    cel::add_member_overload!(env, fn get_port: (CelUrl) -> CelString<'static>,
        id = "url_get_port")?;
    cel::add_member_overload!(env, fn get_escaped_path: (CelUrl) -> CelString<'static>,
        id = "url_get_escaped_path")?;
    cel::add_member_overload!(env, fn get_query: (CelUrl) -> CelMap<'static>,
        id = "url_get_query")?;
    Ok(())
}

fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// Whether `%` escapes in `s` are all well formed.
fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if i + 2 >= b.len() || !(b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit()) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

/// Checks `host[:port]` as Go's `parseHost`: a bracketed IPv6 literal or a name, and a
/// port of digits only.
fn valid_host(host: &str) -> Result<(), String> {
    let port = if let Some(rest) = host.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| "missing ']' in host".to_string())?;
        let after = &rest[end + 1..];
        if !after.is_empty() && !after.starts_with(':') {
            return Err(format!("invalid port {after:?} after host"));
        }
        after
    } else {
        match host.rfind(':') {
            Some(i) => &host[i..],
            None => "",
        }
    };
    if let Some(digits) = port.strip_prefix(':') {
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("invalid port {port:?} after host"));
        }
    }
    if !valid_escapes(host) {
        return Err(format!("invalid URL escape in host {host:?}"));
    }
    Ok(())
}

pub(super) fn parse(s: &str) -> Result<CelUrl, String> {
    if s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    // `ParseRequestURI` does not split a fragment off: it stays part of the query or path.
    let (rest, raw_query) = match s.split_once('?') {
        Some((r, q)) => (r, q.to_string()),
        None => (s, String::new()),
    };
    let (scheme, rest) = match rest.find(':') {
        Some(i) if !rest[..i].contains('/') => {
            let scheme = &rest[..i];
            if !is_scheme(scheme) {
                return Err("missing protocol scheme".into());
            }
            (scheme.to_ascii_lowercase(), &rest[i + 1..])
        }
        _ => (String::new(), rest),
    };
    if !rest.starts_with('/') && (scheme.is_empty() || rest.is_empty()) {
        return Err("invalid URI for request".into());
    }
    let (host, path) = match rest.strip_prefix("//") {
        Some(authority_and_path) if !scheme.is_empty() => {
            let end = authority_and_path
                .find('/')
                .unwrap_or(authority_and_path.len());
            let authority = &authority_and_path[..end];
            let host = match authority.rfind('@') {
                Some(i) => &authority[i + 1..],
                None => authority,
            };
            valid_host(host)?;
            (host.to_string(), &authority_and_path[end..])
        }
        _ => (String::new(), rest),
    };
    if !valid_escapes(path) {
        return Err(format!("invalid URL escape in path {path:?}"));
    }
    Ok(CelUrl {
        scheme,
        host,
        raw_path: path.to_string(),
        raw_query,
    })
}

fn url(s: &CelString<'_>) -> Result<CelUrl, ExecutionError> {
    parse(s.inner()).map_err(|e| {
        ExecutionError::function_error(
            "url",
            format!(
                "URL parse error during conversion from string: parse {:?}: {e}",
                s.inner()
            ),
        )
    })
}

fn is_url(s: &CelString<'_>) -> CelBool {
    parse(s.inner()).is_ok().into()
}

fn get_scheme(u: &CelUrl) -> CelString<'static> {
    u.scheme.clone().into()
}

fn get_host(u: &CelUrl) -> CelString<'static> {
    u.host.clone().into()
}

/// The host and the port apart, brackets of an IPv6 literal removed (Go's `Hostname` and
/// `Port`).
fn split_host(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            let port = rest[end + 1..].strip_prefix(':').unwrap_or("");
            return (&rest[..end], port);
        }
    }
    match host.rfind(':') {
        Some(i) => (&host[..i], &host[i + 1..]),
        None => (host, ""),
    }
}

fn get_hostname(u: &CelUrl) -> CelString<'static> {
    split_host(&u.host).0.to_string().into()
}

fn get_port(u: &CelUrl) -> CelString<'static> {
    split_host(&u.host).1.to_string().into()
}

/// Whether Go leaves byte `b` unescaped in a path (`shouldEscape` in `encodePath` mode).
fn path_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'_'
                | b'.'
                | b'~'
                | b'$'
                | b'&'
                | b'+'
                | b','
                | b'/'
                | b':'
                | b';'
                | b'='
                | b'@'
                | b'!'
                | b'\''
                | b'('
                | b')'
                | b'*'
        )
}

/// The path as Go's `EscapedPath`: as written when that is a valid encoding, else escaped.
fn get_escaped_path(u: &CelUrl) -> CelString<'static> {
    let raw = &u.raw_path;
    if raw.bytes().all(|b| path_safe(b) || b == b'%') {
        return raw.clone().into();
    }
    let mut out = String::with_capacity(raw.len());
    for b in raw.bytes() {
        if path_safe(b) || b == b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.into()
}

/// Decodes a query component as Go's `QueryUnescape`: `+` is a space.
fn query_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The query as Go's `Query()`: values by key, in order; pairs that do not decode (or hold
/// a `;`) are left out, as Go does.
fn get_query(u: &CelUrl) -> CelMap<'static> {
    let mut values: HashMap<String, Vec<String>> = HashMap::new();
    for pair in u.raw_query.split('&').filter(|p| !p.is_empty()) {
        if pair.contains(';') {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if let (Some(k), Some(v)) = (query_unescape(k), query_unescape(v)) {
            values.entry(k).or_default().push(v);
        }
    }
    let map: HashMap<CelMapKey<'static>, Box<dyn Val>> = values
        .into_iter()
        .map(|(k, vs)| {
            let list: Vec<Box<dyn Val>> = vs
                .into_iter()
                .map(|v| Box::new(CelString::from(v)) as Box<dyn Val>)
                .collect();
            (
                CelMapKey::from(k),
                Box::new(CelList::from(list)) as Box<dyn Val>,
            )
        })
        .collect();
    CelMap::from(map)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_error, assert_true};

    /// Upstream's documented examples (the URL library table of "CEL in Kubernetes").
    #[test]
    fn documented_examples() {
        assert_true(&[
            "isURL('https://example.com:80/path?query=val#fragment')",
            "isURL('/absolute-path')",
            "!isURL('../relative-path')",
            "!isURL('https://a:b:c/')",
            "url('/absolute-path').getScheme() == ''",
            "url('https://example.com/').getScheme() == 'https'",
            "url('https://example.com:80/').getHost() == 'example.com:80'",
            "url('https://example.com/').getHost() == 'example.com'",
            "url('https://[::1]:80/').getHost() == '[::1]:80'",
            "url('https://[::1]/').getHost() == '[::1]'",
            "url('/path').getHost() == ''",
            "url('https://example.com:80/').getHostname() == 'example.com'",
            "url('https://127.0.0.1:80/').getHostname() == '127.0.0.1'",
            "url('https://[::1]:80/').getHostname() == '::1'",
            "url('/path').getHostname() == ''",
            "url('https://example.com:80/').getPort() == '80'",
            "url('https://example.com/').getPort() == ''",
            "url('/path').getPort() == ''",
            "url('https://example.com/path').getEscapedPath() == '/path'",
            "url('https://example.com/path with spaces/').getEscapedPath() == '/path%20with%20spaces/'",
            "url('https://example.com').getEscapedPath() == ''",
            "url('https://example.com/path?k1=a&k2=b&k2=c').getQuery() == {'k1': ['a'], 'k2': ['b', 'c']}",
            "url('https://example.com/path?key with spaces=value with spaces').getQuery() == {'key with spaces': ['value with spaces']}",
            "url('https://example.com/path?').getQuery() == {}",
            "url('https://example.com/path').getQuery() == {}",
            "url('https://example.com/a') == url('https://example.com/a')",
        ]);
        assert_error(
            "url('../x')",
            "URL parse error during conversion from string",
        );
    }
}
