//! Impersonation (`kubectl --as`, `--as-group`, `--as-uid`), as kube-apiserver's filter does it:
//! after authentication, the `Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid` and
//! `Impersonate-Extra-<key>` headers each ask to act as someone else, and each is authorized
//! on its own with the `impersonate` verb: on `users` (or the ServiceAccount, in its
//! namespace, for a `system:serviceaccount:<namespace>:<name>` user), `groups`, `uids` and
//! `userextras/<key>` (the last two in `authentication.k8s.io`). The first one refused is the
//! 403, named as upstream names it; when all are allowed the request goes on as the
//! impersonated user, whose groups gain `system:authenticated` (or, for `system:anonymous`,
//! `system:unauthenticated`) unless the request named one of those.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderMap;
use setpoint_api::ApiError;

use super::{UserInfo, ANONYMOUS, AUTHENTICATED, UNAUTHENTICATED};
use crate::authorization::{forbidden, Attributes, Authorizers, Decision};

/// The header naming the user to act as.
pub const USER_HEADER: &str = "impersonate-user";
/// The header naming a group to act as (repeated for several).
pub const GROUP_HEADER: &str = "impersonate-group";
/// The header naming the uid to act as.
pub const UID_HEADER: &str = "impersonate-uid";
/// The prefix of the headers naming extra values (`Impersonate-Extra-<key>: <value>`).
pub const EXTRA_HEADER_PREFIX: &str = "impersonate-extra-";

/// The prefix of ServiceAccounts' user names.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Why impersonation did not happen.
#[derive(Debug)]
pub enum Refusal {
    /// The caller may not act as what it asked for: upstream's 403.
    Forbidden(ApiError),
    /// The headers ask for groups, extras or a uid without a user; upstream answers with a
    /// plain-text 500 whose message is this text (after the request URI).
    Malformed(String),
}

/// One thing a request asks to act as, in the order upstream authorizes them.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ask {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Ask {
    /// Upstream's `%v` of the object reference it builds for the ask, which its error for
    /// headers without a user prints: `{Kind Namespace Name UID APIVersion ResourceVersion
    /// FieldPath}`.
    fn go_reference(&self) -> String {
        let (kind, namespace, name, api_version, field_path) = match self {
            Ask::User(n) => ("User", "", n.as_str(), "", ""),
            Ask::ServiceAccount { namespace, name } => {
                ("ServiceAccount", namespace.as_str(), name.as_str(), "", "")
            }
            Ask::Group(n) => ("Group", "", n.as_str(), "", ""),
            Ask::Extra { key, value } => (
                "UserExtra",
                "",
                value.as_str(),
                "authentication.k8s.io/v1",
                key.as_str(),
            ),
            Ask::Uid(u) => ("UID", "", u.as_str(), "authentication.k8s.io/v1", ""),
        };
        format!("{{{kind} {namespace} {name}  {api_version}  {field_path}}}")
    }

    /// The attributes the ask is authorized with.
    fn attributes(&self, requester: &Arc<UserInfo>) -> Attributes {
        let mut a = Attributes::non_resource(requester.clone(), &http::Method::GET, "");
        a.verb = "impersonate".into();
        a.resource_request = true;
        a.api_version = "v1".into();
        match self {
            Ask::User(name) => {
                a.resource = "users".into();
                a.name = name.clone();
            }
            Ask::ServiceAccount { namespace, name } => {
                a.resource = "serviceaccounts".into();
                a.namespace = namespace.clone();
                a.name = name.clone();
            }
            Ask::Group(name) => {
                a.resource = "groups".into();
                a.name = name.clone();
            }
            Ask::Extra { key, value } => {
                a.api_group = "authentication.k8s.io".into();
                a.resource = "userextras".into();
                a.subresource = key.clone();
                a.name = value.clone();
            }
            Ask::Uid(uid) => {
                a.api_group = "authentication.k8s.io".into();
                a.resource = "uids".into();
                a.name = uid.clone();
            }
        }
        a
    }
}

/// The header's values as text (bytes that are not UTF-8 replaced, never refused: the
/// authorizer decides about the name).
fn values<'a>(headers: &'a HeaderMap, name: &str) -> impl Iterator<Item = String> + 'a {
    headers
        .get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// What the headers ask to act as, or the error upstream gives for groups, extras or a uid
/// without a user. Empty when the request impersonates nobody.
fn asks(headers: &HeaderMap) -> Result<Vec<Ask>, String> {
    let mut asks = Vec::new();
    let user = values(headers, USER_HEADER).next().unwrap_or_default();
    let has_user = !user.is_empty();
    if has_user {
        asks.push(match split_service_account(&user) {
            Some((namespace, name)) => Ask::ServiceAccount { namespace, name },
            None => Ask::User(user),
        });
    }
    let mut others = false;
    for group in values(headers, GROUP_HEADER) {
        others = true;
        asks.push(Ask::Group(group));
    }
    for name in headers.keys() {
        let Some(raw) = name.as_str().strip_prefix(EXTRA_HEADER_PREFIX) else {
            continue;
        };
        others = true;
        let key = unescape_extra_key(raw);
        for value in values(headers, name.as_str()) {
            asks.push(Ask::Extra {
                key: key.clone(),
                value,
            });
        }
    }
    let uid = values(headers, UID_HEADER).next().unwrap_or_default();
    if !uid.is_empty() {
        others = true;
        asks.push(Ask::Uid(uid));
    }
    if others && !has_user {
        let refs: Vec<String> = asks.iter().map(Ask::go_reference).collect();
        return Err(format!(
            "requested [{}] without impersonating a user",
            refs.join(" ")
        ));
    }
    Ok(asks)
}

/// `system:serviceaccount:<namespace>:<name>` with a valid namespace and name, as upstream's
/// `SplitUsername` accepts; anything else is a plain user name.
fn split_service_account(user: &str) -> Option<(String, String)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let mut parts = rest.split(':');
    let (namespace, name) = (parts.next()?, parts.next()?);
    if parts.next().is_some()
        || setpoint_api::names::is_dns1123_label(namespace).is_err()
        || setpoint_api::names::is_dns1123_subdomain(name).is_err()
    {
        return None;
    }
    Some((namespace.to_string(), name.to_string()))
}

/// An extra key as the header spells it, lower case, with `%XX` escapes decoded (how clients
/// send keys with characters a header name cannot hold); a malformed escape leaves the key
/// as it is, as Go's `url.PathUnescape` failing does upstream.
fn unescape_extra_key(raw: &str) -> String {
    let lower = raw.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return lower,
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or(lower)
}

/// The user a request acts as: `requester` itself when it impersonates nobody, else the
/// impersonated user once every ask is authorized for `requester`.
pub fn impersonate(
    authorizers: &Authorizers,
    requester: Arc<UserInfo>,
    headers: &HeaderMap,
) -> Result<Arc<UserInfo>, Refusal> {
    let asks = asks(headers).map_err(Refusal::Malformed)?;
    if asks.is_empty() {
        return Ok(requester);
    }
    let groups_named = asks.iter().any(|a| matches!(a, Ask::Group(_)));
    let mut user = UserInfo::default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for ask in &asks {
        let attributes = ask.attributes(&requester);
        match authorizers.decide(&attributes) {
            Decision::Allow => {}
            Decision::Deny(reason) => {
                return Err(Refusal::Forbidden(forbidden(&attributes, &reason)))
            }
            Decision::NoOpinion => return Err(Refusal::Forbidden(forbidden(&attributes, ""))),
        }
        match ask {
            Ask::User(name) => user.username = name.clone(),
            Ask::ServiceAccount { namespace, name } => {
                user.username = format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}");
                // A ServiceAccount's groups are fixed by its namespace: they are its groups
                // unless the request names others.
                if !groups_named {
                    user.groups = vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{namespace}"),
                    ];
                }
            }
            Ask::Group(g) => user.groups.push(g.clone()),
            Ask::Extra { key, value } => extra.entry(key.clone()).or_default().push(value.clone()),
            Ask::Uid(uid) => user.uid = uid.clone(),
        }
    }
    user.extra = extra;
    if user.username != ANONYMOUS {
        if !user.in_group(AUTHENTICATED) && !user.in_group(UNAUTHENTICATED) {
            user.groups.push(AUTHENTICATED.into());
        }
    } else if !user.in_group(UNAUTHENTICATED) {
        user.groups.push(UNAUTHENTICATED.into());
    }
    tracing::debug!(
        requester = %requester.username,
        user = %user.username,
        "impersonating"
    );
    Ok(Arc::new(user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authentication::MASTERS;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn admin() -> Arc<UserInfo> {
        Arc::new(UserInfo::authenticated("admin", vec![MASTERS.into()]))
    }

    fn forbidden_message(r: Result<Arc<UserInfo>, Refusal>) -> String {
        match r {
            Err(Refusal::Forbidden(e)) => {
                assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
                e.message
            }
            other => panic!("not a 403: {other:?}"),
        }
    }

    #[test]
    fn without_headers_the_requester_goes_on() {
        let bob = Arc::new(UserInfo::authenticated("bob", vec![]));
        let u = impersonate(&Authorizers::default(), bob.clone(), &HeaderMap::new()).unwrap();
        assert!(Arc::ptr_eq(&u, &bob));
    }

    #[test]
    fn an_allowed_requester_becomes_the_user_with_authenticated() {
        let h = headers(&[
            ("Impersonate-User", "alice"),
            ("Impersonate-Group", "dev"),
            ("Impersonate-Group", "ops"),
            ("Impersonate-Uid", "u-1"),
            ("Impersonate-Extra-Scopes", "view"),
            ("Impersonate-Extra-Scopes", "edit"),
            ("Impersonate-Extra-Example.com%2fteam", "a"),
        ]);
        let u = impersonate(&Authorizers::default(), admin(), &h).unwrap();
        assert_eq!(u.username, "alice");
        assert_eq!(u.uid, "u-1");
        assert_eq!(u.groups, ["dev", "ops", AUTHENTICATED]);
        assert_eq!(u.extra["scopes"], ["view", "edit"]);
        assert_eq!(u.extra["example.com/team"], ["a"]);
        assert!(!u.in_group(MASTERS));
    }

    #[test]
    fn service_accounts_get_their_groups_and_anonymous_stays_unauthenticated() {
        let h = headers(&[("Impersonate-User", "system:serviceaccount:a:bot")]);
        let u = impersonate(&Authorizers::default(), admin(), &h).unwrap();
        assert_eq!(u.username, "system:serviceaccount:a:bot");
        assert_eq!(
            u.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:a",
                AUTHENTICATED
            ]
        );
        let h = headers(&[("Impersonate-User", ANONYMOUS)]);
        let u = impersonate(&Authorizers::default(), admin(), &h).unwrap();
        assert_eq!(u.groups, [UNAUTHENTICATED]);
        // Naming system:unauthenticated keeps system:authenticated out.
        let h = headers(&[
            ("Impersonate-User", "x"),
            ("Impersonate-Group", UNAUTHENTICATED),
        ]);
        let u = impersonate(&Authorizers::default(), admin(), &h).unwrap();
        assert_eq!(u.groups, [UNAUTHENTICATED]);
        // Not a valid ServiceAccount name: a plain user.
        assert_eq!(split_service_account("system:serviceaccount:a:b:c"), None);
        assert_eq!(split_service_account("system:serviceaccount:A:b"), None);
        assert_eq!(
            split_service_account("system:serviceaccount:a:b.c"),
            Some(("a".into(), "b.c".into()))
        );
    }

    #[test]
    fn refusals_name_what_was_asked_for_as_upstream() {
        let bob = Arc::new(UserInfo::authenticated("bob", vec![]));
        let az = Authorizers::default();
        let m = forbidden_message(impersonate(
            &az,
            bob.clone(),
            &headers(&[("Impersonate-User", "x")]),
        ));
        assert_eq!(
            m,
            r#"users "x" is forbidden: User "bob" cannot impersonate resource "users" in API group "" at the cluster scope"#
        );
        let m = forbidden_message(impersonate(
            &az,
            bob.clone(),
            &headers(&[("Impersonate-User", "system:serviceaccount:a:bot")]),
        ));
        assert_eq!(
            m,
            r#"serviceaccounts "bot" is forbidden: User "bob" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "a""#
        );
    }

    #[test]
    fn each_ask_is_authorized_on_its_own() {
        /// Allows impersonating users and groups, nothing else.
        struct UsersAndGroups;
        impl crate::authorization::Authorizer for UsersAndGroups {
            fn authorize(&self, a: &Attributes) -> Decision {
                match (a.verb.as_str(), a.resource.as_str()) {
                    ("impersonate", "users" | "groups") => Decision::Allow,
                    _ => Decision::NoOpinion,
                }
            }
        }
        let mut az = Authorizers::default();
        az.push(Box::new(UsersAndGroups));
        let bob = Arc::new(UserInfo::authenticated("bob", vec![]));
        let ok = headers(&[("Impersonate-User", "x"), ("Impersonate-Group", "g")]);
        assert_eq!(impersonate(&az, bob.clone(), &ok).unwrap().username, "x");
        let m = forbidden_message(impersonate(
            &az,
            bob.clone(),
            &headers(&[("Impersonate-User", "x"), ("Impersonate-Extra-Scopes", "s")]),
        ));
        assert_eq!(
            m,
            r#"userextras.authentication.k8s.io "s" is forbidden: User "bob" cannot impersonate resource "userextras/scopes" in API group "authentication.k8s.io" at the cluster scope"#
        );
        let m = forbidden_message(impersonate(
            &az,
            bob,
            &headers(&[("Impersonate-User", "x"), ("Impersonate-Uid", "1")]),
        ));
        assert_eq!(
            m,
            r#"uids.authentication.k8s.io "1" is forbidden: User "bob" cannot impersonate resource "uids" in API group "authentication.k8s.io" at the cluster scope"#
        );
    }

    #[test]
    fn groups_without_a_user_are_refused_with_upstreams_words() {
        let h = headers(&[("Impersonate-Group", "g"), ("Impersonate-Uid", "u")]);
        match impersonate(&Authorizers::default(), admin(), &h) {
            Err(Refusal::Malformed(m)) => assert_eq!(
                m,
                "requested [{Group  g    } {UID  u  authentication.k8s.io/v1  }] without impersonating a user"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(unescape_extra_key("A%2FB"), "a/b");
        assert_eq!(unescape_extra_key("a%zz"), "a%zz");
    }
}
