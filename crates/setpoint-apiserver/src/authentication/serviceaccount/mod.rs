//! ServiceAccount tokens, as kube-apiserver's bound tokens: ES256 JWTs signed by the server's
//! service-account key ([`key`]), minted by the `serviceaccounts/token` subresource
//! (TokenRequest, [`tokenrequest`]) and verified by [`Authenticator`], which also checks that
//! the ServiceAccount and the Pod or Secret the token is bound to still exist with the uids
//! the token names. The issuer's discovery documents (`/.well-known/openid-configuration`,
//! `/openid/v1/jwks`) let others verify the tokens too.

pub mod jwt;
pub mod key;
pub(crate) mod tokenrequest;

use std::sync::Arc;

use serde_json::{json, Value};

use super::{TokenAuthenticator, UserInfo};
use crate::watchcache::Caches;
use key::SigningKey;

/// The issuer kube-apiserver's own setups use (`--service-account-issuer`); tokens name it in
/// `iss`, and it is the API's audience.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// How far `exp` and `nbf` may be off the clock (go-jose's default leeway, which upstream's
/// validation uses), and how long a bound object may have been marked for deletion before
/// its tokens stop working.
pub const LEEWAY_SECONDS: i64 = 60;

/// The `expirationSeconds` of a TokenRequest that names none.
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The group of every service account.
pub const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// Extra keys of a service account's user, as upstream names them.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// The bound pod's uid.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// The bound pod's node name.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// The bound pod's node uid.
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";
/// `JTI=<the token's jti>`.
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// The user name of a service account: `system:serviceaccount:<namespace>:<name>`.
pub fn username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The groups of a service account in `namespace`: `system:serviceaccounts` and
/// `system:serviceaccounts:<namespace>`.
pub fn groups(namespace: &str) -> Vec<String> {
    vec![
        SERVICE_ACCOUNTS_GROUP.to_string(),
        format!("{SERVICE_ACCOUNTS_GROUP}:{namespace}"),
    ]
}

/// An object a token names: its name and uid.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ObjectRef {
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
}

impl ObjectRef {
    fn to_json(&self) -> Value {
        json!({"name": self.name, "uid": self.uid})
    }

    fn from_json(v: &Value) -> Option<ObjectRef> {
        Some(ObjectRef {
            name: v.get("name")?.as_str()?.to_string(),
            uid: v.get("uid")?.as_str()?.to_string(),
        })
    }
}

/// Whom a token speaks for and what it is bound to (the `kubernetes.io` claim).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Binding {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: ObjectRef,
    /// The pod the token is bound to, if any.
    pub pod: Option<ObjectRef>,
    /// The node that pod runs on, when it has one (named in the token as upstream does, but
    /// not checked), or the node the token is bound to when it names no pod.
    pub node: Option<ObjectRef>,
    /// The secret the token is bound to, if any.
    pub secret: Option<ObjectRef>,
}

impl Binding {
    fn to_json(&self) -> Value {
        let mut k = json!({
            "namespace": self.namespace,
            "serviceaccount": self.service_account.to_json(),
        });
        if let Some(p) = &self.pod {
            k["pod"] = p.to_json();
        }
        if let Some(n) = &self.node {
            k["node"] = n.to_json();
        }
        if let Some(s) = &self.secret {
            k["secret"] = s.to_json();
        }
        k
    }

    fn from_json(k: &Value) -> Option<Binding> {
        let optional = |field: &str| match k.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => ObjectRef::from_json(v).map(Some).ok_or(()),
        };
        Some(Binding {
            namespace: k.get("namespace")?.as_str()?.to_string(),
            service_account: ObjectRef::from_json(k.get("serviceaccount")?)?,
            pod: optional("pod").ok()?,
            node: optional("node").ok()?,
            secret: optional("secret").ok()?,
        })
    }
}

/// The kinds of object a token's validity depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The ServiceAccount itself.
    ServiceAccount,
    /// A bound Pod.
    Pod,
    /// A bound Secret.
    Secret,
    /// A bound Node (cluster-scoped: looked up without the namespace).
    Node,
}

/// What a lookup found of an object a token names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its uid.
    pub uid: String,
    /// When it was marked for deletion (Unix seconds), if it was.
    pub deleting_since: Option<i64>,
}

/// Where the authenticator looks objects up (the watch cache in the server; a map in tests).
pub trait Lookup: Send + Sync {
    /// The object of `kind` named `namespace`/`name`, if it exists.
    fn find(&self, kind: Kind, namespace: &str, name: &str) -> Option<Found>;
}

/// The server's token issuer: its key, its name and the API's audiences.
pub struct Issuer {
    key: SigningKey,
    issuer: String,
    audiences: Vec<String>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("issuer", &self.issuer)
            .field("kid", &self.key.kid())
            .finish()
    }
}

/// A token and when it expires (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Minted {
    /// The JWT.
    pub token: String,
    /// Its `exp`.
    pub expires: i64,
}

impl Issuer {
    /// An issuer named `issuer` signing with `key`; the API's audiences are the issuer, as
    /// kube-apiserver's default `--api-audiences`.
    pub fn new(key: SigningKey, issuer: impl Into<String>) -> Issuer {
        let issuer = issuer.into();
        Issuer {
            key,
            audiences: vec![issuer.clone()],
            issuer,
        }
    }

    /// An issuer named `issuer` for an API that identifies as `audiences` (kube-apiserver's
    /// `--api-audiences`; the issuer when empty).
    pub fn with_audiences(
        key: SigningKey,
        issuer: impl Into<String>,
        audiences: Vec<String>,
    ) -> Issuer {
        let mut i = Issuer::new(key, issuer);
        if !audiences.is_empty() {
            i.audiences = audiences;
        }
        i
    }

    /// The issuer's name (`iss`).
    pub fn name(&self) -> &str {
        &self.issuer
    }

    /// The audiences the API server identifies as.
    pub fn api_audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The signing key.
    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    /// Mints a token for `binding`, valid for `audiences` from `now` for `seconds` (Unix
    /// seconds).
    pub fn mint(&self, binding: &Binding, audiences: &[String], now: i64, seconds: i64) -> Minted {
        let expires = now.saturating_add(seconds);
        // A single audience is a plain string, as go-jose writes it.
        let aud = match audiences {
            [one] => json!(one),
            many => json!(many),
        };
        let claims = json!({
            "aud": aud,
            "exp": expires,
            "iat": now,
            "iss": self.issuer,
            "jti": uuid::Uuid::new_v4().to_string(),
            "kubernetes.io": binding.to_json(),
            "nbf": now,
            "sub": username(&binding.namespace, &binding.service_account.name),
        });
        Minted {
            token: jwt::sign(&self.key, &claims),
            expires,
        }
    }

    /// Who `token` speaks for at `now` (Unix seconds): `Ok(None)` when it is not this
    /// issuer's token, `Err(reason)` when it is but is not valid (bad signature, expired, not
    /// for this API, its service account or bound object gone or replaced).
    pub fn verify(
        &self,
        token: &str,
        now: i64,
        lookup: &dyn Lookup,
    ) -> Result<Option<UserInfo>, String> {
        Ok(self
            .verify_for(token, now, lookup, &self.audiences)?
            .map(|(user, _)| user))
    }

    /// [`Self::verify`] for a token meant for any of `accepted` audiences (a TokenReview's):
    /// the user and the token's audiences among them.
    pub fn verify_for(
        &self,
        token: &str,
        now: i64,
        lookup: &dyn Lookup,
        accepted: &[String],
    ) -> Result<Option<(UserInfo, Vec<String>)>, String> {
        Ok(self
            .verify_claims(token, now, lookup, accepted)?
            .map(|(user, valid, _)| (user, valid)))
    }

    /// [`Self::verify`], and the token's `exp` (Unix seconds), past which nothing may keep
    /// taking the token for valid (a cache of answers, say).
    pub fn verify_until(
        &self,
        token: &str,
        now: i64,
        lookup: &dyn Lookup,
    ) -> Result<Option<(UserInfo, i64)>, String> {
        Ok(self
            .verify_claims(token, now, lookup, &self.audiences)?
            .map(|(user, _, exp)| (user, exp)))
    }

    /// The checks of [`Self::verify_for`]; also returns the token's `exp`.
    fn verify_claims(
        &self,
        token: &str,
        now: i64,
        lookup: &dyn Lookup,
        accepted: &[String],
    ) -> Result<Option<(UserInfo, Vec<String>, i64)>, String> {
        let Some(parsed) = jwt::parse(token) else {
            return Ok(None);
        };
        let claims = &parsed.claims;
        // Tokens of other issuers are for other authenticators.
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Ok(None);
        }
        if !parsed.verify(&self.key) {
            return Err("invalid signature".into());
        }
        let time = |name: &str| claims.get(name).and_then(Value::as_i64);
        let exp = match time("exp") {
            Some(exp) if now <= exp + LEEWAY_SECONDS => exp,
            Some(_) => return Err("token has expired".into()),
            None => return Err("token has no expiry".into()),
        };
        if let Some(nbf) = time("nbf") {
            if now + LEEWAY_SECONDS < nbf {
                return Err("token is not valid yet".into());
            }
        }
        if let Some(iat) = time("iat") {
            if now + LEEWAY_SECONDS < iat {
                return Err("token was issued in the future".into());
            }
        }
        let audiences: Vec<&str> = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.as_str()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let valid: Vec<String> = audiences
            .iter()
            .filter(|a| accepted.iter().any(|b| b == *a))
            .map(|a| a.to_string())
            .collect();
        if valid.is_empty() {
            return Err("token audiences are invalid for the API's audiences".into());
        }
        let binding = claims
            .get("kubernetes.io")
            .and_then(Binding::from_json)
            .ok_or("token has no kubernetes.io claim")?;
        let sub = username(&binding.namespace, &binding.service_account.name);
        if claims.get("sub").and_then(Value::as_str) != Some(sub.as_str()) {
            return Err("token subject does not match its service account".into());
        }
        let check = |kind: Kind, r: &ObjectRef| -> Result<(), String> {
            let namespace = if kind == Kind::Node {
                ""
            } else {
                binding.namespace.as_str()
            };
            let what = format!("{kind:?} {namespace}/{}", r.name);
            match lookup.find(kind, namespace, &r.name) {
                None => Err(format!("{what} has been deleted")),
                Some(f) if f.uid != r.uid => Err(format!(
                    "{what} uid ({}) does not match the token's ({})",
                    f.uid, r.uid
                )),
                Some(Found {
                    deleting_since: Some(t),
                    ..
                }) if t < now - LEEWAY_SECONDS => Err(format!("{what} is being deleted")),
                Some(_) => Ok(()),
            }
        };
        check(Kind::ServiceAccount, &binding.service_account)?;
        if let Some(pod) = &binding.pod {
            check(Kind::Pod, pod)?;
        }
        if let Some(secret) = &binding.secret {
            check(Kind::Secret, secret)?;
        }
        // A pod's node is informational; a token bound to a node alone lives with the node.
        if let (None, Some(node)) = (&binding.pod, &binding.node) {
            check(Kind::Node, node)?;
        }
        let mut user = UserInfo::authenticated(sub, groups(&binding.namespace));
        user.uid = binding.service_account.uid.clone();
        if let Some(pod) = &binding.pod {
            user.extra
                .insert(EXTRA_POD_NAME.into(), vec![pod.name.clone()]);
            user.extra
                .insert(EXTRA_POD_UID.into(), vec![pod.uid.clone()]);
        }
        if let Some(node) = &binding.node {
            user.extra
                .insert(EXTRA_NODE_NAME.into(), vec![node.name.clone()]);
            user.extra
                .insert(EXTRA_NODE_UID.into(), vec![node.uid.clone()]);
        }
        if let Some(jti) = claims.get("jti").and_then(Value::as_str) {
            user.extra
                .insert(EXTRA_CREDENTIAL_ID.into(), vec![format!("JTI={jti}")]);
        }
        Ok(Some((user, valid, exp)))
    }

    /// `/.well-known/openid-configuration`: the issuer's OpenID Connect discovery document;
    /// `server` is the `host:port` the keys are served on.
    pub fn openid_configuration(&self, server: &str) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("https://{server}/openid/v1/jwks"),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": [jwt::ES256],
        })
    }

    /// `/openid/v1/jwks`: the public keys tokens are signed with.
    pub fn jwks(&self) -> Value {
        json!({"keys": [self.key.jwk()]})
    }
}

/// The service-account token authenticator: an [`Issuer`] that looks objects up in the watch
/// cache.
pub struct Authenticator {
    issuer: Arc<Issuer>,
    lookup: CacheLookup,
}

impl Authenticator {
    /// Verifies the tokens of `issuer` against the objects in `caches`.
    pub fn new(issuer: Arc<Issuer>, caches: Arc<Caches>) -> Authenticator {
        Authenticator {
            issuer,
            lookup: CacheLookup(caches),
        }
    }
}

impl TokenAuthenticator for Authenticator {
    fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        self.issuer
            .verify(token, chrono::Utc::now().timestamp(), &self.lookup)
    }

    fn authenticate_until(&self, token: &str) -> Result<Option<(UserInfo, Option<i64>)>, String> {
        Ok(self
            .issuer
            .verify_until(token, chrono::Utc::now().timestamp(), &self.lookup)?
            .map(|(user, exp)| (user, Some(exp))))
    }

    fn authenticate_for(
        &self,
        token: &str,
        audiences: &[String],
        _api_audiences: &[String],
    ) -> Result<Option<(UserInfo, Vec<String>)>, String> {
        self.issuer.verify_for(
            token,
            chrono::Utc::now().timestamp(),
            &self.lookup,
            audiences,
        )
    }
}

/// Objects looked up in the watch cache (synchronously: the authenticator runs before any
/// request handler).
struct CacheLookup(Arc<Caches>);

impl Lookup for CacheLookup {
    fn find(&self, kind: Kind, namespace: &str, name: &str) -> Option<Found> {
        let plural = match kind {
            Kind::ServiceAccount => "serviceaccounts",
            Kind::Pod => "pods",
            Kind::Secret => "secrets",
            Kind::Node => "nodes",
        };
        let prefix = crate::registry::storage_prefix("", plural);
        let key = if namespace.is_empty() {
            format!("{prefix}{name}")
        } else {
            format!("{prefix}{namespace}/{name}")
        };
        let obj = self.0.get(&prefix).get(&key)?;
        let metadata = obj.metadata();
        let deleting_since = metadata
            .get("deletionTimestamp")
            .and_then(Value::as_str)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp());
        Some(Found {
            uid: metadata.get("uid")?.as_str()?.to_string(),
            deleting_since,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Objects by (kind, namespace, name).
    #[derive(Default)]
    struct Objects(HashMap<(&'static str, String), Found>);

    fn kind_key(kind: Kind) -> &'static str {
        match kind {
            Kind::ServiceAccount => "sa",
            Kind::Pod => "pod",
            Kind::Secret => "secret",
            Kind::Node => "node",
        }
    }

    impl Objects {
        fn add(&mut self, kind: Kind, name: &str, uid: &str) {
            let ns = if kind == Kind::Node { "" } else { "a" };
            self.0.insert(
                (kind_key(kind), format!("{ns}/{name}")),
                Found {
                    uid: uid.into(),
                    deleting_since: None,
                },
            );
        }
    }

    impl Lookup for Objects {
        fn find(&self, kind: Kind, namespace: &str, name: &str) -> Option<Found> {
            self.0
                .get(&(kind_key(kind), format!("{namespace}/{name}")))
                .cloned()
        }
    }

    fn issuer() -> Issuer {
        Issuer::new(SigningKey::generate().unwrap(), DEFAULT_ISSUER)
    }

    fn bot() -> Binding {
        Binding {
            namespace: "a".into(),
            service_account: ObjectRef {
                name: "bot".into(),
                uid: "sa-uid".into(),
            },
            ..Binding::default()
        }
    }

    fn objects() -> Objects {
        let mut o = Objects::default();
        o.add(Kind::ServiceAccount, "bot", "sa-uid");
        o
    }

    const NOW: i64 = 1_700_000_000;

    #[test]
    fn a_minted_token_authenticates_as_its_service_account() {
        let i = issuer();
        let m = i.mint(&bot(), i.api_audiences(), NOW, 3600);
        assert_eq!(m.expires, NOW + 3600);
        let user = i.verify(&m.token, NOW + 10, &objects()).unwrap().unwrap();
        assert_eq!(user.username, "system:serviceaccount:a:bot");
        assert_eq!(user.uid, "sa-uid");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:a",
                "system:authenticated"
            ]
        );
        let claims = jwt::parse(&m.token).unwrap().claims;
        assert_eq!(claims["aud"], DEFAULT_ISSUER);
        assert_eq!(claims["sub"], "system:serviceaccount:a:bot");
        assert_eq!(claims["kubernetes.io"]["serviceaccount"]["uid"], "sa-uid");
        assert_eq!(
            user.extra[EXTRA_CREDENTIAL_ID],
            [format!("JTI={}", claims["jti"].as_str().unwrap())]
        );
    }

    #[test]
    fn verify_until_names_the_tokens_expiry() {
        let i = issuer();
        let m = i.mint(&bot(), i.api_audiences(), NOW, 600);
        let (user, exp) = i.verify_until(&m.token, NOW, &objects()).unwrap().unwrap();
        assert_eq!(user.username, "system:serviceaccount:a:bot");
        assert_eq!(exp, NOW + 600);
    }

    #[test]
    fn expiry_and_not_before_hold_with_a_minute_of_leeway() {
        let i = issuer();
        let m = i.mint(&bot(), i.api_audiences(), NOW, 600);
        let o = objects();
        assert!(i.verify(&m.token, NOW + 600 + LEEWAY_SECONDS, &o).is_ok());
        let e = i
            .verify(&m.token, NOW + 601 + LEEWAY_SECONDS, &o)
            .unwrap_err();
        assert!(e.contains("expired"), "{e}");
        assert!(i.verify(&m.token, NOW - LEEWAY_SECONDS, &o).is_ok());
        assert!(i.verify(&m.token, NOW - LEEWAY_SECONDS - 1, &o).is_err());
    }

    #[test]
    fn the_audience_must_be_the_apis() {
        let i = issuer();
        let m = i.mint(&bot(), &["vault".to_string()], NOW, 600);
        assert!(i.verify(&m.token, NOW, &objects()).is_err());
        let both = i.mint(
            &bot(),
            &["vault".to_string(), DEFAULT_ISSUER.to_string()],
            NOW,
            600,
        );
        assert!(i.verify(&both.token, NOW, &objects()).unwrap().is_some());
    }

    #[test]
    fn a_review_for_another_audience_authenticates_tokens_minted_for_it() {
        let i = issuer();
        let vault = vec!["vault".to_string()];
        let m = i.mint(&bot(), &vault, NOW, 600);
        let (user, valid) = i
            .verify_for(&m.token, NOW, &objects(), &vault)
            .unwrap()
            .unwrap();
        assert_eq!(user.username, "system:serviceaccount:a:bot");
        assert_eq!(valid, vault);
        let other = vec!["other".to_string()];
        assert!(i.verify_for(&m.token, NOW, &objects(), &other).is_err());
        let api = i.mint(&bot(), i.api_audiences(), NOW, 600);
        assert!(i.verify_for(&api.token, NOW, &objects(), &vault).is_err());
    }

    #[test]
    fn api_audiences_can_be_other_than_the_issuer() {
        let i = Issuer::with_audiences(
            SigningKey::generate().unwrap(),
            DEFAULT_ISSUER,
            vec!["api".into(), "vault".into()],
        );
        assert_eq!(i.api_audiences(), ["api", "vault"]);
        let m = i.mint(&bot(), &["vault".to_string()], NOW, 600);
        assert!(i.verify(&m.token, NOW, &objects()).unwrap().is_some());
        let m = i.mint(&bot(), &[DEFAULT_ISSUER.to_string()], NOW, 600);
        assert!(i.verify(&m.token, NOW, &objects()).is_err());
    }

    #[test]
    fn other_issuers_and_keys() {
        let i = issuer();
        // Another server's key under the same issuer name: a bad signature, refused.
        let other = issuer();
        let m = other.mint(&bot(), other.api_audiences(), NOW, 600);
        assert!(i.verify(&m.token, NOW, &objects()).is_err());
        // Another issuer: not this authenticator's token.
        let foreign = Issuer::new(SigningKey::generate().unwrap(), "https://elsewhere");
        let m = foreign.mint(&bot(), foreign.api_audiences(), NOW, 600);
        assert_eq!(i.verify(&m.token, NOW, &objects()), Ok(None));
        assert_eq!(i.verify("not-a-jwt", NOW, &objects()), Ok(None));
    }

    #[test]
    fn a_token_dies_with_its_service_account_or_bound_object() {
        let i = issuer();
        let mut b = bot();
        b.pod = Some(ObjectRef {
            name: "p".into(),
            uid: "pod-uid".into(),
        });
        let m = i.mint(&b, i.api_audiences(), NOW, 600);
        let mut o = objects();
        assert!(i.verify(&m.token, NOW, &o).is_err(), "the pod is missing");
        o.add(Kind::Pod, "p", "pod-uid");
        let user = i.verify(&m.token, NOW, &o).unwrap().unwrap();
        assert_eq!(user.extra[EXTRA_POD_NAME], ["p"]);
        assert_eq!(user.extra[EXTRA_POD_UID], ["pod-uid"]);
        // Recreated under the same name: another uid, refused.
        o.add(Kind::Pod, "p", "other");
        assert!(i.verify(&m.token, NOW, &o).is_err());
        // Marked for deletion: still valid for a minute, then not.
        o.0.insert(
            ("pod", "a/p".into()),
            Found {
                uid: "pod-uid".into(),
                deleting_since: Some(NOW - 30),
            },
        );
        assert!(i.verify(&m.token, NOW, &o).is_ok());
        assert!(i.verify(&m.token, NOW + 31, &o).is_err());
        // The service account recreated.
        o.add(Kind::Pod, "p", "pod-uid");
        o.add(Kind::ServiceAccount, "bot", "new");
        assert!(i.verify(&m.token, NOW, &o).is_err());
    }

    #[test]
    fn a_secret_bound_token_lives_while_the_secret_does() {
        let i = issuer();
        let mut b = bot();
        b.secret = Some(ObjectRef {
            name: "s".into(),
            uid: "secret-uid".into(),
        });
        let m = i.mint(&b, i.api_audiences(), NOW, 600);
        let mut o = objects();
        o.add(Kind::Secret, "s", "secret-uid");
        assert!(i.verify(&m.token, NOW, &o).unwrap().is_some());
        o.0.remove(&("secret", "a/s".into()));
        assert!(i.verify(&m.token, NOW, &o).is_err());
    }

    #[test]
    fn a_node_bound_token_lives_with_the_node_and_a_pods_node_is_not_checked() {
        let i = issuer();
        let node = ObjectRef {
            name: "n1".into(),
            uid: "node-uid".into(),
        };
        let mut b = bot();
        b.node = Some(node.clone());
        let m = i.mint(&b, i.api_audiences(), NOW, 600);
        let mut o = objects();
        assert!(i.verify(&m.token, NOW, &o).is_err(), "the node is missing");
        o.add(Kind::Node, "n1", "node-uid");
        let user = i.verify(&m.token, NOW, &o).unwrap().unwrap();
        assert_eq!(user.extra[EXTRA_NODE_NAME], ["n1"]);
        // Bound to a pod on that node: the pod decides, not the node.
        b.pod = Some(ObjectRef {
            name: "p".into(),
            uid: "pod-uid".into(),
        });
        let m = i.mint(&b, i.api_audiences(), NOW, 600);
        let mut o = objects();
        o.add(Kind::Pod, "p", "pod-uid");
        assert!(i.verify(&m.token, NOW, &o).unwrap().is_some());
    }

    #[test]
    fn the_jwks_verifies_a_token() {
        let i = issuer();
        let m = i.mint(&bot(), i.api_audiences(), NOW, 600);
        let jwks = i.jwks();
        let parsed = jwt::parse(&m.token).unwrap();
        let jwk = jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["kid"] == parsed.header["kid"])
            .unwrap();
        let public = key::public_key_of_jwk(jwk).unwrap();
        assert!(parsed.verify_with(&public));
        let doc = i.openid_configuration("127.0.0.1:6443");
        assert_eq!(doc["issuer"], DEFAULT_ISSUER);
        assert_eq!(doc["jwks_uri"], "https://127.0.0.1:6443/openid/v1/jwks");
        assert_eq!(doc["id_token_signing_alg_values_supported"][0], "ES256");
    }
}
