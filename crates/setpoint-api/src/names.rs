//! Name checks with Kubernetes' wording: DNS-1123 subdomains and labels, DNS-1035 labels,
//! qualified names (label and annotation keys), label values, config keys, path-segment names,
//! and the random suffix used for `metadata.generateName`.
//!
//! Each check returns `Err` with every problem found, each worded the way the Kubernetes API
//! server words it, because kubectl users (and tests) read those texts verbatim in 422 errors.
//! The checks are hand-written scanners rather than regexes; the regex Kubernetes uses is only
//! quoted in the message.

use rand::Rng;

/// Longest DNS-1123 subdomain (most object names).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Longest DNS-1123 label (namespace names, container names).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Longest DNS-1035 label (service names).
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
/// Longest name part of a qualified name (`prefix/name`).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const CONFIG_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_KEY_ERR: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

/// The alphabet Kubernetes draws generated name suffixes from: no vowels (so no words) and no
/// easily confused characters (`0`/`o`, `1`/`l`, `3`/`e`).
pub const NAME_SUFFIX_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";
/// Length of the random suffix appended to `metadata.generateName`.
pub const NAME_SUFFIX_LENGTH: usize = 5;

/// Kubernetes' `RegexError`: the message, then examples and the regex in parentheses.
///
/// The spacing (`'a',  or 'b'`) is exactly what upstream produces, double space included.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = String::from(msg);
    if examples.is_empty() {
        out.push_str(&format!(" (regex used for validation is '{fmt}')"));
        return out;
    }
    out.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

/// `must be no more than N characters`.
pub fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `must be non-empty`.
pub fn empty_error() -> String {
    "must be non-empty".to_string()
}

/// `must be between LO and HI, inclusive`.
pub fn inclusive_range_error(lo: i64, hi: i64) -> String {
    format!("must be between {lo} and {hi}, inclusive")
}

fn result(errs: Vec<String>) -> Result<(), Vec<String>> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?` exactly.
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            is_lower_alnum(f)
                && is_lower_alnum(l)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Matches the DNS-1123 subdomain regex: dot-separated DNS-1123 labels.
fn matches_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(matches_dns1123_label)
}

/// Matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&f), Some(&l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// A DNS-1123 subdomain (`example.com`): at most 253 characters, lower-case alphanumerics, `-`
/// and `.`, starting and ending alphanumeric. Most object names must be one.
pub fn is_dns1123_subdomain(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    result(errs)
}

/// A DNS-1123 label (`my-name`): at most 63 characters, lower-case alphanumerics and `-`,
/// starting and ending alphanumeric. Namespace and container names must be one.
pub fn is_dns1123_label(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            // A valid subdomain that is not a valid label can only be wrong because of its dots;
            // upstream says so rather than printing the general message.
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    result(errs)
}

/// A DNS-1035 label (`my-name`): like a DNS-1123 label but starting with a letter. Service names
/// must be one (they become DNS names that must not look like IP addresses).
pub fn is_dns1035_label(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    let starts_alpha = value
        .as_bytes()
        .first()
        .is_some_and(|c| c.is_ascii_lowercase());
    if !(starts_alpha && matches_dns1123_label(value)) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    result(errs)
}

/// A qualified name (label and annotation keys, finalizers): an optional DNS subdomain prefix and
/// `/`, then a name of at most 63 alphanumerics, `-`, `_` and `.`, starting and ending
/// alphanumeric (`example.com/MyName`).
pub fn is_qualified_name(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else if let Err(msgs) = is_dns1123_subdomain(prefix) {
                errs.extend(msgs.into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return result(errs);
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    result(errs)
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting and ending
/// alphanumeric.
pub fn is_valid_label_value(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_qualified_name(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    result(errs)
}

/// A ConfigMap or Secret data key: at most 253 of `[-._a-zA-Z0-9]`, and not `.`, `..` or
/// starting with `..` (keys become file names in volumes).
pub fn is_config_map_key(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    let charset_ok = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.');
    if !charset_ok {
        errs.push(regex_error(
            CONFIG_KEY_ERR,
            CONFIG_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if value == "." {
        errs.push("must not be '.'".to_string());
    } else if value == ".." {
        errs.push("must not be '..'".to_string());
    } else if value.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    result(errs)
}

/// A name usable as one URL path segment: not `.` or `..`, and without `/` or `%`. Every object
/// name must pass this (custom resources only need this and DNS-subdomain checks).
pub fn path_segment_name(name: &str) -> Result<(), Vec<String>> {
    for bad in [".", ".."] {
        if name == bad {
            return Err(vec![format!("may not be '{bad}'")]);
        }
    }
    let errs: Vec<String> = ["/", "%"]
        .iter()
        .filter(|c| name.contains(**c))
        .map(|c| format!("may not contain '{c}'"))
        .collect();
    result(errs)
}

/// An IANA service (port) name: at most 15 lower-case alphanumerics and `-`, at least one
/// letter, no `--`, not starting or ending with `-`.
pub fn is_valid_port_name(port: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty() || !port.bytes().all(|c| is_lower_alnum(c) || c == b'-') {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string(),
        );
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens (--)".to_string());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen (-)".to_string());
    }
    result(errs)
}

/// A port number: 1 to 65535.
pub fn is_valid_port_num(port: i64) -> Result<(), Vec<String>> {
    if (1..=65535).contains(&port) {
        Ok(())
    } else {
        Err(vec![inclusive_range_error(1, 65535)])
    }
}

/// Five random characters from [`NAME_SUFFIX_ALPHABET`], appended to `metadata.generateName`.
pub fn generate_name_suffix() -> String {
    let alphabet = NAME_SUFFIX_ALPHABET.as_bytes();
    let mut rng = rand::rng();
    (0..NAME_SUFFIX_LENGTH)
        .map(|_| alphabet[rng.random_range(0..alphabet.len())] as char)
        .collect()
}

/// The name generated from a `generateName` prefix: the prefix, cut so that prefix and suffix fit
/// in 63 characters as upstream does (a generated name must stay usable as a label value), plus
/// a random suffix.
pub fn generate_name(prefix: &str) -> String {
    const MAX_GENERATED_NAME_LENGTH: usize = 63 - NAME_SUFFIX_LENGTH;
    let mut cut = prefix.len().min(MAX_GENERATED_NAME_LENGTH);
    while !prefix.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{}", &prefix[..cut], generate_name_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn subdomain_accepts_and_rejects() {
        for ok in ["a", "example.com", "a-b.c-d", "0", "web-1", "a.b.c"] {
            assert!(is_dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "A", "a_b", "-a", "a-", "a..b", ".a", "a.", "a b", "héllo",
        ] {
            assert!(is_dns1123_subdomain(bad).is_err(), "{bad}");
        }
        let long = "a".repeat(254);
        let errs = is_dns1123_subdomain(&long).unwrap_err();
        assert_eq!(
            errs,
            vec!["must be no more than 253 characters".to_string()]
        );
        assert!(is_dns1123_subdomain(&"a".repeat(253)).is_ok());
    }

    #[test]
    fn subdomain_message_is_upstream_text() {
        let errs = is_dns1123_subdomain("Bad_Name").unwrap_err();
        assert_eq!(
            errs,
            vec!["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string()]
        );
    }

    #[test]
    fn label_messages() {
        assert!(is_dns1123_label("my-name").is_ok());
        assert_eq!(
            is_dns1123_label("a.b").unwrap_err(),
            vec!["must not contain dots".to_string()]
        );
        let errs = is_dns1123_label("My").unwrap_err();
        assert_eq!(
            errs[0],
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        let errs = is_dns1123_label(&"a".repeat(64)).unwrap_err();
        assert_eq!(errs, vec![max_len_error(63)]);
    }

    #[test]
    fn dns1035_requires_leading_letter() {
        assert!(is_dns1035_label("web").is_ok());
        assert!(is_dns1035_label("1web").is_err());
        assert!(is_dns1035_label("web-").is_err());
        assert!(is_dns1035_label("a.b").is_err());
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "app",
            "App_1",
            "example.com/MyName",
            "kubernetes.io/metadata.name",
            "a.b",
        ] {
            assert!(is_qualified_name(ok).is_ok(), "{ok}");
        }
        assert_eq!(
            is_qualified_name("/a").unwrap_err(),
            vec!["prefix part must be non-empty".to_string()]
        );
        let errs = is_qualified_name("Example.com/a").unwrap_err();
        assert!(
            errs[0].starts_with("prefix part a lowercase RFC 1123 subdomain"),
            "{errs:?}"
        );
        let errs = is_qualified_name("a/").unwrap_err();
        assert_eq!(errs[0], "name part must be non-empty");
        assert!(errs[1].starts_with("name part must consist of alphanumeric characters"));
        let errs = is_qualified_name("a/b/c").unwrap_err();
        assert!(
            errs[0].starts_with("a qualified name must consist of"),
            "{errs:?}"
        );
        assert!(errs[0].ends_with(
            "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ));
        let errs = is_qualified_name(&"a".repeat(64)).unwrap_err();
        assert_eq!(
            errs,
            vec!["name part must be no more than 63 characters".to_string()]
        );
        assert!(is_qualified_name("-a").is_err());
        assert!(is_qualified_name("").is_err());
    }

    #[test]
    fn label_values() {
        for ok in ["", "v1", "my_value", "1.2.3", "A-b"] {
            assert!(is_valid_label_value(ok).is_ok(), "{ok:?}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "ä"] {
            assert!(is_valid_label_value(bad).is_err(), "{bad:?}");
        }
        let errs = is_valid_label_value(&"a".repeat(64)).unwrap_err();
        assert_eq!(errs, vec![max_len_error(63)]);
        let errs = is_valid_label_value("a b").unwrap_err();
        assert!(errs[0].starts_with("a valid label must be an empty string"));
    }

    #[test]
    fn config_keys() {
        assert!(is_config_map_key("app.properties").is_ok());
        assert!(is_config_map_key("KEY_NAME").is_ok());
        assert_eq!(
            is_config_map_key("..").unwrap_err(),
            vec!["must not be '..'".to_string()]
        );
        assert_eq!(
            is_config_map_key("..a").unwrap_err(),
            vec!["must not start with '..'".to_string()]
        );
        assert!(is_config_map_key("a/b").unwrap_err()[0].starts_with("a valid config key"));
        assert!(is_config_map_key("").is_err());
    }

    #[test]
    fn path_segments() {
        assert!(path_segment_name("ok").is_ok());
        assert_eq!(
            path_segment_name("..").unwrap_err(),
            vec!["may not be '..'".to_string()]
        );
        assert_eq!(
            path_segment_name("a/b%c").unwrap_err(),
            vec![
                "may not contain '/'".to_string(),
                "may not contain '%'".to_string()
            ]
        );
    }

    #[test]
    fn port_names_and_numbers() {
        assert!(is_valid_port_name("http").is_ok());
        assert!(is_valid_port_name("http-80").is_ok());
        assert!(is_valid_port_name("80")
            .unwrap_err()
            .contains(&"must contain at least one letter (a-z)".to_string()));
        assert!(is_valid_port_name("a--b").is_err());
        assert!(is_valid_port_name("-ab").is_err());
        assert!(is_valid_port_name("HTTP").is_err());
        assert!(is_valid_port_name("abcdefghijklmnop").is_err());
        assert!(is_valid_port_num(80).is_ok());
        assert_eq!(
            is_valid_port_num(0).unwrap_err(),
            vec!["must be between 1 and 65535, inclusive".to_string()]
        );
        assert!(is_valid_port_num(65536).is_err());
    }

    #[test]
    fn suffix_uses_the_alphabet() {
        for _ in 0..100 {
            let s = generate_name_suffix();
            assert_eq!(s.len(), 5);
            assert!(s.chars().all(|c| NAME_SUFFIX_ALPHABET.contains(c)), "{s}");
        }
        let g = generate_name("web-");
        assert!(g.starts_with("web-") && g.len() == 9);
        assert!(is_dns1123_subdomain(&g).is_ok());
        assert_eq!(generate_name(&"a".repeat(100)).len(), 63);
    }

    proptest! {
        /// The hand-written subdomain scanner agrees with a structural model of the regex.
        #[test]
        fn subdomain_scanner_matches_model(s in "[a-z0-9.-]{0,12}") {
            let model = !s.is_empty() && s.split('.').all(|l| {
                !l.is_empty() && !l.starts_with('-') && !l.ends_with('-')
            });
            prop_assert_eq!(is_dns1123_subdomain(&s).is_ok(), model);
        }

        /// Every generated label-ish string passes exactly when it looks like a label.
        #[test]
        fn label_value_model(s in "[A-Za-z0-9._/ -]{0,10}") {
            let model = s.is_empty() || (
                s.chars().next().unwrap().is_ascii_alphanumeric()
                && s.chars().last().unwrap().is_ascii_alphanumeric()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)));
            prop_assert_eq!(is_valid_label_value(&s).is_ok(), model);
        }
    }
}
