//! Bootstrap tokens: `<id>.<secret>` bearer tokens a machine joining the cluster presents
//! before it has a certificate, backed by Secrets `bootstrap-token-<id>` of type
//! `bootstrap.kubernetes.io/token` in `kube-system`, as kube-apiserver's
//! `--enable-bootstrap-token-auth` authenticator reads them.
//!
//! A token is accepted when its Secret exists and is not being deleted, has the right type,
//! names the same id and secret, allows authentication (`usage-bootstrap-authentication:
//! "true"`) and has not expired. The user is `system:bootstrap:<id>` in `system:bootstrappers`
//! plus the Secret's `auth-extra-groups`, each of which must be a `system:bootstrappers:…`
//! group.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::Value;

use super::{TokenAuthenticator, UserInfo};
use crate::watchcache::Caches;

/// The namespace bootstrap-token Secrets live in.
pub const NAMESPACE: &str = "kube-system";
/// The type of a bootstrap-token Secret.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The prefix of a bootstrap-token Secret's name; the token id follows.
pub const SECRET_PREFIX: &str = "bootstrap-token-";
/// The prefix of a bootstrap token's user name; the token id follows.
pub const USER_PREFIX: &str = "system:bootstrap:";
/// The group every bootstrap token's user is in.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";

/// The `(id, secret)` of a well-formed token (`[a-z0-9]{6}.[a-z0-9]{16}`), else `None`.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// Whether `group` may be one of a token's extra groups: upstream's
/// `^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$`.
pub fn valid_extra_group(group: &str) -> bool {
    let Some(rest) = group.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    let Some(last) = rest.bytes().last() else {
        return false;
    };
    rest.len() <= 256
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
}

/// A value of a Secret's `data` (base64), as text.
fn data(secret: &Value, key: &str) -> Option<String> {
    let encoded = secret.get("data")?.get(key)?.as_str()?;
    String::from_utf8(STANDARD.decode(encoded).ok()?).ok()
}

/// Constant-time equality, so the comparison does not tell how much of a guess was right.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// What the Secret `bootstrap-token-<id>` (if any) makes of the token `<id>.<token_secret>`
/// at `now`: `Ok(Some(user))` when it is valid, `Ok(None)` when the Secret does not back it,
/// `Err(reason)` when it does but the token may not be used (expired, bad extra groups).
pub fn user_for(
    secret: Option<&Value>,
    id: &str,
    token_secret: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Option<UserInfo>, String> {
    let Some(secret) = secret else {
        return Ok(None);
    };
    if secret.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(None);
    }
    if secret.get("type").and_then(Value::as_str) != Some(SECRET_TYPE) {
        return Ok(None);
    }
    match data(secret, "token-secret") {
        Some(stored) if same(&stored, token_secret) => {}
        _ => return Ok(None),
    }
    if data(secret, "token-id").as_deref() != Some(id) {
        return Ok(None);
    }
    if let Some(expiration) = data(secret, "expiration") {
        // An expiration that does not parse counts as past, as upstream's.
        let expired = chrono::DateTime::parse_from_rfc3339(&expiration)
            .map(|t| t <= now)
            .unwrap_or(true);
        if expired {
            return Err(format!("bootstrap token {id} has expired"));
        }
    }
    if data(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Ok(None);
    }
    let mut groups = vec![BOOTSTRAPPERS.to_string()];
    if let Some(extra) = data(secret, "auth-extra-groups") {
        for group in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            if !valid_extra_group(group) {
                return Err(format!(
                    "bootstrap token {id} has an invalid auth-extra-groups entry {group:?}"
                ));
            }
            if !groups.iter().any(|g| g == group) {
                groups.push(group.to_string());
            }
        }
    }
    Ok(Some(UserInfo::authenticated(
        format!("{USER_PREFIX}{id}"),
        groups,
    )))
}

/// The bootstrap-token authenticator over the watch cache's Secrets.
pub struct Authenticator {
    caches: Arc<Caches>,
}

impl Authenticator {
    /// An authenticator reading Secrets from `caches`.
    pub fn new(caches: Arc<Caches>) -> Authenticator {
        Authenticator { caches }
    }
}

impl TokenAuthenticator for Authenticator {
    fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        Ok(self.authenticate_until(token)?.map(|(user, _)| user))
    }

    fn authenticate_until(&self, token: &str) -> Result<Option<(UserInfo, Option<i64>)>, String> {
        let Some((id, token_secret)) = parse_token(token) else {
            return Ok(None);
        };
        let prefix = crate::registry::storage_prefix("", "secrets");
        let key = format!("{prefix}{NAMESPACE}/{SECRET_PREFIX}{id}");
        let secret = self.caches.get(&prefix).get(&key).map(|o| o.object());
        let Some(user) = user_for(secret.as_ref(), id, token_secret, chrono::Utc::now())? else {
            return Ok(None);
        };
        Ok(Some((user, secret.as_ref().and_then(expiration))))
    }
}

/// A bootstrap-token Secret's `expiration` (Unix seconds), when it has one that parses (one
/// that does not is refused by [`user_for`] before this is asked).
fn expiration(secret: &Value) -> Option<i64> {
    let text = data(secret, "expiration")?;
    chrono::DateTime::parse_from_rfc3339(&text)
        .ok()
        .map(|t| t.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn secret(extra: &[(&str, &str)]) -> Value {
        let mut data = serde_json::Map::new();
        for (k, v) in [
            ("token-id", "abcdef"),
            ("token-secret", "0123456789abcdef"),
            ("usage-bootstrap-authentication", "true"),
        ]
        .iter()
        .chain(extra)
        {
            data.insert(k.to_string(), json!(b64(v)));
        }
        json!({
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "type": SECRET_TYPE,
            "data": data,
        })
    }

    fn now() -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
            .unwrap()
            .into()
    }

    #[test]
    fn tokens_parse_only_in_their_shape() {
        assert_eq!(
            parse_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcde",
            "abcdef.0123456789abcdef0",
            "abcdef.0123456789abcde_",
        ] {
            assert_eq!(parse_token(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_valid_token_names_its_bootstrap_user() {
        let s = secret(&[(
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token",
        )]);
        let user = user_for(Some(&s), "abcdef", "0123456789abcdef", now())
            .unwrap()
            .unwrap();
        assert_eq!(user.username, "system:bootstrap:abcdef");
        assert_eq!(
            user.groups,
            [
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token",
                "system:authenticated"
            ]
        );
    }

    #[test]
    fn a_wrong_secret_or_secret_object_is_not_a_match() {
        let s = secret(&[]);
        assert_eq!(
            user_for(None, "abcdef", "0123456789abcdef", now()),
            Ok(None)
        );
        assert_eq!(
            user_for(Some(&s), "abcdef", "0123456789abcdee", now()),
            Ok(None)
        );
        let mut wrong_type = s.clone();
        wrong_type["type"] = json!("Opaque");
        assert_eq!(
            user_for(Some(&wrong_type), "abcdef", "0123456789abcdef", now()),
            Ok(None)
        );
        let mut deleting = s.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2029-01-01T00:00:00Z");
        assert_eq!(
            user_for(Some(&deleting), "abcdef", "0123456789abcdef", now()),
            Ok(None)
        );
        let no_usage = secret(&[("usage-bootstrap-authentication", "false")]);
        assert_eq!(
            user_for(Some(&no_usage), "abcdef", "0123456789abcdef", now()),
            Ok(None)
        );
    }

    #[test]
    fn an_expired_token_is_refused() {
        let future = secret(&[("expiration", "2030-01-02T00:00:00Z")]);
        assert!(user_for(Some(&future), "abcdef", "0123456789abcdef", now())
            .unwrap()
            .is_some());
        let past = secret(&[("expiration", "2029-12-31T23:59:59Z")]);
        assert!(user_for(Some(&past), "abcdef", "0123456789abcdef", now()).is_err());
        let garbage = secret(&[("expiration", "tomorrow")]);
        assert!(user_for(Some(&garbage), "abcdef", "0123456789abcdef", now()).is_err());
        // What a cache of the answer is bounded by.
        assert_eq!(expiration(&future), Some(now().timestamp() + 86_400));
        assert_eq!(expiration(&secret(&[])), None);
    }

    #[test]
    fn extra_groups_must_be_bootstrapper_groups() {
        assert!(valid_extra_group("system:bootstrappers:worker"));
        assert!(!valid_extra_group("system:bootstrappers:"));
        assert!(!valid_extra_group("system:masters"));
        assert!(!valid_extra_group("system:bootstrappers:Worker"));
        assert!(!valid_extra_group("system:bootstrappers:worker-"));
        let s = secret(&[("auth-extra-groups", "system:masters")]);
        assert!(user_for(Some(&s), "abcdef", "0123456789abcdef", now()).is_err());
    }
}
