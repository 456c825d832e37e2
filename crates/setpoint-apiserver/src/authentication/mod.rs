//! Who is calling, decided as kube-apiserver's authentication chain decides it:
//!
//! 1. a client certificate the TLS handshake verified against the cluster CA names the user
//!    (its subject's CN) and the groups (its O values);
//! 2. else an `Authorization: Bearer <token>` header is offered to each token authenticator in
//!    turn (the static token file, then those that later modules add); the first that knows
//!    the token names the user. A token nobody accepts is 401, even when anonymous requests are
//!    allowed, as upstream;
//! 3. else the request is anonymous: `system:anonymous` in group `system:unauthenticated` when
//!    anonymous requests are enabled (`--anonymous-auth`, the default), and 401 otherwise.
//!
//! A token the chain accepted is remembered for up to 10 s ([`cache`]), as upstream's token
//! cache does, so a request does not pay for a signature check every time.
//!
//! Every authenticated user is also in `system:authenticated`. Plain-HTTP servers (tests) and
//! in-process callers (the components `setpoint up` runs in its own process) have no
//! credentials to check; they act as [`UserInfo::internal`].

pub mod bootstrap_token;
pub mod cache;
pub mod impersonation;
pub mod serviceaccount;
mod token_file;

use std::collections::BTreeMap;
use std::sync::Arc;

use http::HeaderMap;
use setpoint_api::ApiError;

pub use token_file::TokenFile;

/// The group of every authenticated user.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of anonymous requests.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The user name of anonymous requests.
pub const ANONYMOUS: &str = "system:anonymous";
/// The group whose members every authorizer lets do anything.
pub const MASTERS: &str = "system:masters";

/// An authenticated (or anonymous) caller, as `user.Info` upstream.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UserInfo {
    /// The user name (`admin`, `system:serviceaccount:<ns>:<name>`, `system:node:<node>`).
    pub username: String,
    /// A unique id, when the authenticator knows one (a ServiceAccount's uid).
    pub uid: String,
    /// The groups the user is in.
    pub groups: Vec<String>,
    /// What else the authenticator knows (a bound token's pod name, say), by key.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with these groups, plus `system:authenticated`.
    pub fn authenticated(username: impl Into<String>, groups: Vec<String>) -> UserInfo {
        let mut user = UserInfo {
            username: username.into(),
            groups,
            ..UserInfo::default()
        };
        if !user.in_group(AUTHENTICATED) {
            user.groups.push(AUTHENTICATED.into());
        }
        user
    }

    /// `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            username: ANONYMOUS.into(),
            groups: vec![UNAUTHENTICATED.into()],
            ..UserInfo::default()
        }
    }

    /// The identity of callers inside the server's trust boundary (plain HTTP, in-process
    /// components): `system:apiserver` in `system:masters`, as kube-apiserver's loopback
    /// client is.
    pub fn internal() -> UserInfo {
        UserInfo::authenticated("system:apiserver", vec![MASTERS.into()])
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }
}

/// What the connection established about its peer before any request was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A client certificate signed by the cluster CA: its subject's user and groups.
    Certificate(Arc<UserInfo>),
    /// A TLS connection without a client certificate: requests authenticate by token, or are
    /// anonymous.
    NoCertificate,
    /// Plain HTTP or an in-process caller: no authentication; see [`UserInfo::internal`].
    Internal,
}

/// A way to turn a bearer token into a user (the static token file, service-account tokens,
/// bootstrap tokens).
pub trait TokenAuthenticator: Send + Sync {
    /// `Ok(Some(user))` when the token is this authenticator's and valid, `Ok(None)` when it is
    /// not one of its tokens, and `Err(reason)` when it is one of its tokens but not valid
    /// (expired, revoked); the reason goes to the log, never to the client.
    fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String>;

    /// [`Self::authenticate`], and when the token stops being valid on its own (Unix
    /// seconds), if it ever does and the authenticator knows: a cached answer must not
    /// outlive it. By default the token has no expiry of its own.
    fn authenticate_until(&self, token: &str) -> Result<Option<(UserInfo, Option<i64>)>, String> {
        Ok(self.authenticate(token)?.map(|user| (user, None)))
    }

    /// For a TokenReview that names `audiences`: the user and the audiences (of those asked)
    /// the token is valid for. By default a token is audience-agnostic, as static and
    /// bootstrap tokens are: upstream treats it as valid for the API's own audiences only
    /// (`api_audiences`), so it authenticates for the asked audiences that are the API's.
    fn authenticate_for(
        &self,
        token: &str,
        audiences: &[String],
        api_audiences: &[String],
    ) -> Result<Option<(UserInfo, Vec<String>)>, String> {
        let valid: Vec<String> = audiences
            .iter()
            .filter(|a| api_audiences.contains(a))
            .cloned()
            .collect();
        if valid.is_empty() {
            return Ok(None);
        }
        Ok(self.authenticate(token)?.map(|user| (user, valid)))
    }
}

/// How the server authenticates (kube-apiserver's flags of the same names).
#[derive(Clone, Debug)]
pub struct AuthenticationConfig {
    /// `--anonymous-auth`: requests without credentials are `system:anonymous` (true, the
    /// default) or refused with 401 (false).
    pub anonymous_auth: bool,
    /// `--token-auth-file`: a CSV file of `token,user,uid,"group1,group2"` lines.
    pub token_auth_file: Option<std::path::PathBuf>,
    /// `--service-account-issuer`: the `iss` of the service-account tokens the server mints
    /// and accepts.
    pub service_account_issuer: String,
    /// `--api-audiences`: the audiences the API identifies as; a token must name one of them.
    /// Empty means the issuer, as upstream defaults it.
    pub api_audiences: Vec<String>,
}

impl Default for AuthenticationConfig {
    fn default() -> Self {
        AuthenticationConfig {
            anonymous_auth: true,
            token_auth_file: None,
            service_account_issuer: serviceaccount::DEFAULT_ISSUER.to_string(),
            api_audiences: Vec::new(),
        }
    }
}

/// The token authenticators, asked in order.
#[derive(Default)]
pub struct Authenticators {
    tokens: Vec<Box<dyn TokenAuthenticator>>,
    anonymous: bool,
    /// The answers for accepted tokens on the request path; `None` asks the chain every time.
    cache: Option<cache::TokenCache>,
}

impl Authenticators {
    /// The chain a config describes. Fails when the token file cannot be read or parsed.
    pub fn from_config(config: &AuthenticationConfig) -> Result<Authenticators, String> {
        let mut tokens: Vec<Box<dyn TokenAuthenticator>> = Vec::new();
        if let Some(path) = &config.token_auth_file {
            tokens.push(Box::new(TokenFile::load(path)?));
        }
        Ok(Authenticators {
            tokens,
            anonymous: config.anonymous_auth,
            cache: Some(cache::TokenCache::default()),
        })
    }

    /// Puts `cache` in front of the token authenticators on the request path (`None`: no
    /// cache, every request's token is checked).
    pub fn set_cache(&mut self, cache: Option<cache::TokenCache>) {
        self.cache = cache;
    }

    /// Appends a token authenticator (asked after those already there).
    pub fn push(&mut self, authenticator: Box<dyn TokenAuthenticator>) {
        self.tokens.push(authenticator);
    }

    /// What the token authenticators make of `token` alone (a TokenReview): the user of the
    /// first that accepts it, `Ok(None)` when none knows it, or the reason the first that
    /// knows it refused it.
    pub fn authenticate_token(&self, token: &str) -> Result<Option<UserInfo>, String> {
        for authenticator in &self.tokens {
            if let Some(user) = authenticator.authenticate(token)? {
                return Ok(Some(user));
            }
        }
        Ok(None)
    }

    /// What a TokenReview for `audiences` makes of `token`: the first authenticator that knows
    /// it answers with the user and the audiences it is valid for.
    pub fn authenticate_token_for(
        &self,
        token: &str,
        audiences: &[String],
        api_audiences: &[String],
    ) -> Result<Option<(UserInfo, Vec<String>)>, String> {
        for authenticator in &self.tokens {
            if let Some(found) = authenticator.authenticate_for(token, audiences, api_audiences)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Who made a request that arrived over a connection with `identity` and has `headers`.
    pub fn authenticate(
        &self,
        identity: &Identity,
        headers: &HeaderMap,
    ) -> Result<Arc<UserInfo>, ApiError> {
        match identity {
            Identity::Certificate(user) => return Ok(user.clone()),
            Identity::Internal => return Ok(Arc::new(UserInfo::internal())),
            Identity::NoCertificate => {}
        }
        if let Some(token) = bearer_token(headers) {
            let now = std::time::Instant::now();
            if let Some(user) = self.cache.as_ref().and_then(|c| c.get(token, now)) {
                return Ok(user);
            }
            for authenticator in &self.tokens {
                match authenticator.authenticate_until(token) {
                    Ok(Some((user, expires))) => {
                        let user = Arc::new(user);
                        if let Some(cache) = &self.cache {
                            let valid_for = expires.map(|exp| {
                                let left = exp.saturating_sub(chrono::Utc::now().timestamp());
                                std::time::Duration::from_secs(left.max(0) as u64)
                            });
                            cache.insert(token, user.clone(), valid_for, now);
                        }
                        return Ok(user);
                    }
                    Ok(None) => {}
                    Err(reason) => {
                        tracing::debug!(%reason, "a bearer token was refused");
                        return Err(ApiError::unauthorized());
                    }
                }
            }
            return Err(ApiError::unauthorized());
        }
        if self.anonymous {
            Ok(Arc::new(UserInfo::anonymous()))
        } else {
            Err(ApiError::unauthorized())
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive, as
/// upstream's); `None` without one or with an empty token.
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a verified client certificate names: CN the user, each O a group.
pub fn certificate_user(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    if cn.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(UserInfo::authenticated(cn, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, auth.parse().unwrap());
        h
    }

    struct One;
    impl TokenAuthenticator for One {
        fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
            match token {
                "good" => Ok(Some(UserInfo::authenticated("u", vec![]))),
                "expired" => Err("expired".into()),
                _ => Ok(None),
            }
        }
    }

    #[test]
    fn the_chain_goes_certificate_token_anonymous() {
        let mut chain = Authenticators::from_config(&AuthenticationConfig::default()).unwrap();
        chain.push(Box::new(One));
        let cert = Identity::Certificate(Arc::new(UserInfo::authenticated("c", vec![])));
        assert_eq!(
            chain
                .authenticate(&cert, &headers("Bearer good"))
                .unwrap()
                .username,
            "c"
        );
        let none = Identity::NoCertificate;
        let u = chain.authenticate(&none, &headers("bearer good")).unwrap();
        assert_eq!(u.username, "u");
        assert!(u.in_group(AUTHENTICATED));
        assert_eq!(
            chain
                .authenticate(&none, &headers("Bearer expired"))
                .unwrap_err()
                .code,
            401
        );
        assert_eq!(
            chain
                .authenticate(&none, &headers("Bearer other"))
                .unwrap_err()
                .code,
            401
        );
        let anon = chain.authenticate(&none, &HeaderMap::new()).unwrap();
        assert_eq!(*anon, UserInfo::anonymous());
        assert!(chain
            .authenticate(&Identity::Internal, &HeaderMap::new())
            .unwrap()
            .in_group(MASTERS));
    }

    /// Counts the checks it makes; "good" is valid for an hour, "ending" only for 2 s more
    /// (a cache must not keep it longer), "bad" is refused.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicUsize);
    impl TokenAuthenticator for Counting {
        fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
            Ok(self.authenticate_until(token)?.map(|(u, _)| u))
        }
        fn authenticate_until(
            &self,
            token: &str,
        ) -> Result<Option<(UserInfo, Option<i64>)>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let now = chrono::Utc::now().timestamp();
            match token {
                "good" => Ok(Some((
                    UserInfo::authenticated("u", vec![]),
                    Some(now + 3600),
                ))),
                "ending" => Ok(Some((UserInfo::authenticated("e", vec![]), Some(now - 1)))),
                "bad" => Err("revoked".into()),
                _ => Ok(None),
            }
        }
    }

    #[test]
    fn accepted_tokens_are_cached_and_refused_ones_are_not() {
        let mut chain = Authenticators::from_config(&AuthenticationConfig::default()).unwrap();
        let counting = std::sync::Arc::new(Counting::default());
        struct Shared(std::sync::Arc<Counting>);
        impl TokenAuthenticator for Shared {
            fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
                self.0.authenticate(token)
            }
            fn authenticate_until(
                &self,
                token: &str,
            ) -> Result<Option<(UserInfo, Option<i64>)>, String> {
                self.0.authenticate_until(token)
            }
        }
        chain.push(Box::new(Shared(counting.clone())));
        let checks = || counting.0.load(std::sync::atomic::Ordering::SeqCst);
        let none = Identity::NoCertificate;
        for _ in 0..3 {
            let u = chain.authenticate(&none, &headers("Bearer good")).unwrap();
            assert_eq!(u.username, "u");
        }
        assert_eq!(checks(), 1, "answered from the cache after the first check");
        for _ in 0..3 {
            let e = chain
                .authenticate(&none, &headers("Bearer bad"))
                .unwrap_err();
            assert_eq!(e.code, 401);
        }
        assert_eq!(checks(), 4, "refusals are checked every time");
        for _ in 0..2 {
            assert_eq!(
                chain
                    .authenticate(&none, &headers("Bearer other"))
                    .unwrap_err()
                    .code,
                401
            );
        }
        assert_eq!(checks(), 6, "unknown tokens are checked every time");
        // A token past its expiry (still inside the verifier's leeway) is not cached.
        for _ in 0..2 {
            chain
                .authenticate(&none, &headers("Bearer ending"))
                .unwrap();
        }
        assert_eq!(checks(), 8);
        // Without a cache every request is checked.
        chain.set_cache(None);
        chain.authenticate(&none, &headers("Bearer good")).unwrap();
        assert_eq!(checks(), 9);
    }

    #[test]
    fn without_anonymous_auth_no_credentials_is_401() {
        let chain = Authenticators::from_config(&AuthenticationConfig {
            anonymous_auth: false,
            ..AuthenticationConfig::default()
        })
        .unwrap();
        let e = chain
            .authenticate(&Identity::NoCertificate, &HeaderMap::new())
            .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (401, "Unauthorized"));
    }

    #[test]
    fn bearer_tokens_are_parsed_like_upstream() {
        assert_eq!(bearer_token(&headers("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&headers("BEARER  abc ")), Some("abc"));
        assert_eq!(bearer_token(&headers("Basic abc")), None);
        assert_eq!(bearer_token(&headers("Bearer ")), None);
    }
}
