//! Turning a request into what it asks for: the path into a discovery document, a collection,
//! or one object (with an optional subresource); the query string into typed parameters, each
//! type read by one parser that answers a value upstream would reject with upstream's error.

use std::collections::HashMap;

use setpoint_api::{ApiError, Cause};

/// What a `/api/...` or `/apis/...` path names, before the registry is consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathTarget {
    /// `/api` (legacy discovery of the core group's versions).
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/apis/<group>`.
    Group { group: String },
    /// `/api/v1` or `/apis/<group>/<version>`.
    ResourceList { group: String, version: String },
    /// A collection of a resource, in one namespace or all of them.
    Collection {
        group: String,
        version: String,
        plural: String,
        namespace: Option<String>,
    },
    /// One object, maybe a subresource of it.
    Object {
        group: String,
        version: String,
        plural: String,
        namespace: Option<String>,
        name: String,
        subresource: Option<String>,
    },
}

/// Subresources of the `namespaces` resource, which make `/api/v1/namespaces/<n>/<x>` mean
/// "subresource x of namespace n" rather than "collection x in namespace n".
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// Parses a request path (already percent-decoded per segment).
pub fn parse_path(path: &str) -> Result<PathTarget, ApiError> {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        })
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api"] => return Ok(PathTarget::CoreVersions),
        ["apis"] => return Ok(PathTarget::Groups),
        ["apis", g] => {
            return Ok(PathTarget::Group {
                group: g.to_string(),
            })
        }
        ["api", v, rest @ ..] => ("", v, rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Err(ApiError::not_found_path()),
    };
    let gv =
        |plural: &str, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| match name {
            None => PathTarget::Collection {
                group: group.into(),
                version: version.into(),
                plural: plural.into(),
                namespace: namespace.map(Into::into),
            },
            Some(name) => PathTarget::Object {
                group: group.into(),
                version: version.into(),
                plural: plural.into(),
                namespace: namespace.map(Into::into),
                name: name.into(),
                subresource: sub.map(Into::into),
            },
        };
    let target = match rest {
        [] => PathTarget::ResourceList {
            group: group.into(),
            version: version.into(),
        },
        // Namespace objects themselves and their subresources.
        ["namespaces", name, sub] if NAMESPACE_SUBRESOURCES.contains(sub) && group.is_empty() => {
            gv("namespaces", None, Some(name), Some(sub))
        }
        ["namespaces", ns, plural, tail @ ..] => match tail {
            [] => gv(plural, Some(ns), None, None),
            [name] => gv(plural, Some(ns), Some(name), None),
            [name, sub] => gv(plural, Some(ns), Some(name), Some(sub)),
            // `<resource>/<name>/proxy/<path>`: the path is the proxied request's.
            [name, "proxy", _, ..] => gv(plural, Some(ns), Some(name), Some("proxy")),
            _ => return Err(ApiError::not_found_path()),
        },
        [plural] => gv(plural, None, None, None),
        [plural, name] => gv(plural, None, Some(name), None),
        [plural, name, sub] => gv(plural, None, Some(name), Some(sub)),
        [plural, name, "proxy", _, ..] => gv(plural, None, Some(name), Some("proxy")),
        _ => return Err(ApiError::not_found_path()),
    };
    Ok(target)
}

/// The query parameters of a request, decoded. A parameter given twice counts once, by its
/// first value, as upstream's parameter codec reads it.
pub type Query = HashMap<String, String>;

/// Decodes a query string (`None`: no query).
pub fn parse_query(raw: Option<&str>) -> Query {
    let mut q = Query::new();
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        q.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    q
}

/// A boolean parameter as upstream's query conversion reads it: absent, `0` or `false` (in
/// any case) is false, and every other value, the empty one included, is true. Upstream
/// answers no value of a boolean parameter with an error, so neither does this.
pub fn bool_param(q: &Query, name: &str) -> bool {
    q.get(name).is_some_and(|v| is_true(v))
}

/// A boolean parameter whose absence means something of its own (`sendInitialEvents`,
/// `force`): `None` when absent, else read as [`bool_param`] reads it.
pub fn opt_bool_param(q: &Query, name: &str) -> Option<bool> {
    q.get(name).map(|v| is_true(v))
}

fn is_true(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// An integer parameter (`limit`, `timeoutSeconds`, `gracePeriodSeconds`): `None` when absent;
/// a value that is not a decimal 64-bit integer is a 400 with the parse error as upstream words
/// it (`strconv.ParseInt: parsing "abc": invalid syntax`).
pub fn int_param(q: &Query, name: &str) -> Result<Option<i64>, ApiError> {
    q.get(name)
        .map(|v| go_parse_int(v).map_err(ApiError::bad_request))
        .transpose()
}

/// What a `resourceVersion` parameter asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvParam {
    /// Unset: the most recent state (a consistent read).
    Unset,
    /// `0`: any state the server has.
    Any,
    /// A revision: not older than it.
    At(u64),
}

impl RvParam {
    /// The revision named, as the store counts them (a revision beyond the store's range is
    /// one it can never reach, and waiting for it times out like any future one).
    pub fn revision(self) -> Option<i64> {
        match self {
            RvParam::At(r) => Some(i64::try_from(r).unwrap_or(i64::MAX)),
            _ => None,
        }
    }
}

/// The `resourceVersion` parameter. A value that is not a resource version is a 400 with
/// upstream's message: `resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing
/// "abc": invalid syntax`.
pub fn rv_param(q: &Query) -> Result<RvParam, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(RvParam::Unset),
        Some("0") => Ok(RvParam::Any),
        Some(v) => go_parse_uint(v).map(RvParam::At).map_err(|e| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {}: {e}",
                go_quote(v)
            ))
        }),
    }
}

/// The options of a LIST or WATCH, read and checked as upstream reads `ListOptions`: a value
/// that does not parse is a 400; a combination upstream's `ValidateListOptions` forbids is a
/// 422 Invalid on `ListOptions.meta.k8s.io`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListParams {
    /// `watch`: a WATCH rather than a LIST.
    pub watch: bool,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `resourceVersion`.
    pub resource_version: RvParam,
    /// `resourceVersionMatch`: `Exact`, `NotOlderThan`, or empty.
    pub resource_version_match: String,
    /// `limit`: `None` when absent; a value of 0 or less also means no limit.
    pub limit: Option<i64>,
    /// `timeoutSeconds`: `None` when absent (the server's default); 0 also means the default,
    /// and a negative value ends a watch at once.
    pub timeout_seconds: Option<i64>,
    /// `continue`, when given and not empty.
    pub continue_token: Option<String>,
    /// `sendInitialEvents`, `None` when absent.
    pub send_initial_events: Option<bool>,
}

impl ListParams {
    /// Reads and validates the list options of `q`.
    pub fn parse(q: &Query) -> Result<ListParams, ApiError> {
        let p = ListParams {
            watch: bool_param(q, "watch"),
            allow_watch_bookmarks: bool_param(q, "allowWatchBookmarks"),
            resource_version: rv_param(q)?,
            resource_version_match: q.get("resourceVersionMatch").cloned().unwrap_or_default(),
            limit: int_param(q, "limit")?,
            timeout_seconds: int_param(q, "timeoutSeconds")?,
            continue_token: q.get("continue").filter(|c| !c.is_empty()).cloned(),
            send_initial_events: opt_bool_param(q, "sendInitialEvents"),
        };
        let causes = p.violations(q.get("resourceVersion").map_or("", String::as_str));
        if causes.is_empty() {
            Ok(p)
        } else {
            Err(ApiError::invalid("meta.k8s.io", "ListOptions", "", causes))
        }
    }

    /// Upstream's `ValidateListOptions` (the WatchList feature on), in its order; `rv` is the
    /// parameter as given.
    fn violations(&self, rv: &str) -> Vec<Cause> {
        const FIELD: &str = "resourceVersionMatch";
        let m = self.resource_version_match.as_str();
        let mut causes = Vec::new();
        let forbidden = |detail: &str| Cause::forbidden(FIELD, detail);
        if self.watch {
            if self.send_initial_events.is_some() && m != "NotOlderThan" {
                causes.push(forbidden(
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !m.is_empty() {
                if self.send_initial_events.is_none() {
                    causes.push(forbidden(
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != "NotOlderThan" {
                    causes.push(not_supported(FIELD, m, &["NotOlderThan"]));
                }
                if self.continue_token.is_some() {
                    causes.push(forbidden(
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
            }
            return causes;
        }
        if !m.is_empty() {
            if rv.is_empty() {
                causes.push(forbidden(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.continue_token.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                causes.push(not_supported(FIELD, m, &["Exact", "NotOlderThan", ""]));
            }
            if m == "Exact" && rv == "0" {
                causes.push(forbidden(
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if self.send_initial_events.is_some() {
            causes.push(Cause::forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
        causes
    }
}

/// `field: Unsupported value: "v": supported values: ...` with the value quoted as Go quotes it.
fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
    Cause::new(
        "FieldValueNotSupported",
        field,
        format!(
            "Unsupported value: {}: supported values: {}",
            go_quote(value),
            list.join(", ")
        ),
    )
}

/// The longest `fieldManager` upstream accepts, in bytes (`FieldManagerMaxLength`).
pub const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// Upstream's `ValidateFieldManager`: at most 128 bytes, every character printable. The causes
/// go into a 422 on the write's options (`CreateOptions`, `UpdateOptions`, `PatchOptions`).
pub fn field_manager_causes(manager: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    if manager.len() > FIELD_MANAGER_MAX_LENGTH {
        causes.push(Cause::too_long("fieldManager", FIELD_MANAGER_MAX_LENGTH));
    }
    for (i, c) in manager.char_indices() {
        if !is_print(c) {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "fieldManager",
                format!(
                    "Invalid value: {}: invalid character U+{:04X} (at position {i})",
                    go_quote(manager),
                    c as u32
                ),
            ));
        }
    }
    causes
}

/// Go's `strconv.ParseUint(s, 10, 64)`, its error worded as Go's.
pub fn go_parse_uint(s: &str) -> Result<u64, String> {
    let err = |what: &str| format!("strconv.ParseUint: parsing {}: {what}", go_quote(s));
    if s.is_empty() {
        return Err(err("invalid syntax"));
    }
    let mut n: u64 = 0;
    for b in s.bytes() {
        // Go stops at the first character that is not a digit, or at the first overflow,
        // whichever comes first.
        if !b.is_ascii_digit() {
            return Err(err("invalid syntax"));
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or_else(|| err("value out of range"))?;
    }
    Ok(n)
}

/// Go's `strconv.ParseInt(s, 10, 64)`: an optional sign, then decimal digits.
pub fn go_parse_int(s: &str) -> Result<i64, String> {
    let err = |what: &str| format!("strconv.ParseInt: parsing {}: {what}", go_quote(s));
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let n = go_parse_uint(digits).map_err(|e| {
        if e.ends_with("value out of range") {
            err("value out of range")
        } else {
            err("invalid syntax")
        }
    })?;
    if negative {
        0i64.checked_sub_unsigned(n)
            .ok_or_else(|| err("value out of range"))
    } else {
        i64::try_from(n).map_err(|_| err("value out of range"))
    }
}

pub use setpoint_api::strconv::{is_print, quote as go_quote};

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(g: &str, v: &str, p: &str, ns: Option<&str>, n: &str, s: Option<&str>) -> PathTarget {
        PathTarget::Object {
            group: g.into(),
            version: v.into(),
            plural: p.into(),
            namespace: ns.map(Into::into),
            name: n.into(),
            subresource: s.map(Into::into),
        }
    }

    #[test]
    fn parses_the_url_shapes() {
        assert_eq!(parse_path("/api").unwrap(), PathTarget::CoreVersions);
        assert_eq!(
            parse_path("/apis/apps").unwrap(),
            PathTarget::Group {
                group: "apps".into()
            }
        );
        assert_eq!(
            parse_path("/apis/apps/v1").unwrap(),
            PathTarget::ResourceList {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo/pods").unwrap(),
            PathTarget::Collection {
                group: "".into(),
                version: "v1".into(),
                plural: "pods".into(),
                namespace: Some("demo".into())
            }
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo").unwrap(),
            obj("", "v1", "namespaces", None, "demo", None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/demo/finalize").unwrap(),
            obj("", "v1", "namespaces", None, "demo", Some("finalize"))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/d/deployments/web/scale").unwrap(),
            obj("apps", "v1", "deployments", Some("d"), "web", Some("scale"))
        );
        assert_eq!(
            parse_path("/api/v1/nodes/n1/status").unwrap(),
            obj("", "v1", "nodes", None, "n1", Some("status"))
        );
        assert!(parse_path("/foo").is_err());
    }

    fn query(pairs: &[(&str, &str)]) -> Query {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn booleans_read_as_upstream_reads_them() {
        for v in ["0", "false", "False", "FALSE", "fAlSe"] {
            assert!(!bool_param(&query(&[("watch", v)]), "watch"), "{v}");
        }
        for v in ["1", "true", "t", "maybe", "", "yes"] {
            assert!(bool_param(&query(&[("watch", v)]), "watch"), "{v}");
        }
        assert!(!bool_param(&query(&[]), "watch"));
        assert_eq!(opt_bool_param(&query(&[]), "force"), None);
        assert_eq!(
            opt_bool_param(&query(&[("force", "0")]), "force"),
            Some(false)
        );
    }

    #[test]
    fn the_first_of_repeated_parameters_counts() {
        let q = parse_query(Some("limit=5&limit=abc&watch=%74rue"));
        assert_eq!(q["limit"], "5");
        assert_eq!(q["watch"], "true");
        assert!(parse_query(None).is_empty());
    }

    #[test]
    fn integers_parse_as_go_parses_them() {
        assert_eq!(go_parse_int("42"), Ok(42));
        assert_eq!(go_parse_int("+7"), Ok(7));
        assert_eq!(go_parse_int("-1"), Ok(-1));
        assert_eq!(go_parse_int("-9223372036854775808"), Ok(i64::MIN));
        assert_eq!(go_parse_int("9223372036854775807"), Ok(i64::MAX));
        let bad = |s: &str, what: &str| {
            assert_eq!(
                go_parse_int(s),
                Err(format!("strconv.ParseInt: parsing {}: {what}", go_quote(s)))
            )
        };
        for s in ["abc", "", "-", "+", " 1", "1.5", "1_000", "0x10", "--1"] {
            bad(s, "invalid syntax");
        }
        for s in [
            "9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
        ] {
            bad(s, "value out of range");
        }
        // Go reports the overflow it meets before a bad character.
        bad("99999999999999999999x", "value out of range");
        assert_eq!(
            go_parse_uint("-1"),
            Err("strconv.ParseUint: parsing \"-1\": invalid syntax".into())
        );
        assert_eq!(go_parse_uint("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn bad_integers_are_400_with_the_parse_error() {
        let e = int_param(&query(&[("limit", "abc")]), "limit").unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));
        assert_eq!(
            e.message,
            "strconv.ParseInt: parsing \"abc\": invalid syntax"
        );
        assert_eq!(int_param(&query(&[]), "limit"), Ok(None));
    }

    #[test]
    fn resource_versions() {
        let rv = |v: &str| rv_param(&query(&[("resourceVersion", v)]));
        assert_eq!(rv(""), Ok(RvParam::Unset));
        assert_eq!(rv_param(&query(&[])), Ok(RvParam::Unset));
        assert_eq!(rv("0"), Ok(RvParam::Any));
        assert_eq!(rv("17"), Ok(RvParam::At(17)));
        assert_eq!(
            rv("18446744073709551615").unwrap().revision(),
            Some(i64::MAX)
        );
        let e = rv("abc").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
        );
        assert_eq!(
            rv("-5").unwrap_err().message,
            "resourceVersion: Invalid value: \"-5\": strconv.ParseUint: parsing \"-5\": invalid syntax"
        );
    }

    fn list_error(pairs: &[(&str, &str)]) -> String {
        ListParams::parse(&query(pairs)).unwrap_err().message
    }

    #[test]
    fn list_options_are_validated_as_upstream_validates_them() {
        assert_eq!(
            list_error(&[("resourceVersion", "1"), ("resourceVersionMatch", "Bogus")]),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Bogus\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
        assert_eq!(
            list_error(&[("resourceVersionMatch", "Exact")]),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
        );
        assert_eq!(
            list_error(&[("resourceVersion", "0"), ("resourceVersionMatch", "Exact")]),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
        );
        assert_eq!(
            list_error(&[("sendInitialEvents", "true")]),
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
        );
        assert_eq!(
            list_error(&[("watch", "1"), ("sendInitialEvents", "true")]),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
        );
        assert_eq!(
            list_error(&[("watch", "1"), ("resourceVersionMatch", "Exact")]),
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"
        );
        let ok = ListParams::parse(&query(&[
            ("watch", "true"),
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("timeoutSeconds", "-1"),
        ]))
        .unwrap();
        assert_eq!(ok.timeout_seconds, Some(-1));
        assert_eq!(ok.send_initial_events, Some(true));
        let e =
            ListParams::parse(&query(&[("watch", "1"), ("timeoutSeconds", "abc")])).unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn field_managers_are_short_and_printable() {
        assert!(field_manager_causes("kubectl-client-side-apply").is_empty());
        assert!(field_manager_causes(&"m".repeat(128)).is_empty());
        assert!(field_manager_causes("名前 with spaces").is_empty());
        let long = field_manager_causes(&"m".repeat(129));
        assert_eq!(long.len(), 1);
        assert_eq!(long[0].reason, "FieldValueTooLong");
        assert_eq!(long[0].message, "Too long: may not be more than 128 bytes");
        let nul = field_manager_causes("a\0b\n");
        assert_eq!(nul.len(), 2);
        assert_eq!(
            nul[0].message,
            "Invalid value: \"a\\x00b\\n\": invalid character U+0000 (at position 1)"
        );
        assert_eq!(
            nul[1].message,
            "Invalid value: \"a\\x00b\\n\": invalid character U+000A (at position 3)"
        );
        assert_eq!(field_manager_causes("x\u{200B}").len(), 1);
    }

    #[test]
    fn quoting_follows_go() {
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("\u{1}\u{7f}é\u{feff}"), "\"\\x01\\x7fé\\ufeff\"");
        assert_eq!(go_quote("\u{F0000}"), "\"\\U000f0000\"");
    }
}
