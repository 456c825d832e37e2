//! Registry credentials from a pod's `imagePullSecrets`, chosen for an image as the kubelet's
//! keyring chooses them.
//!
//! - A `kubernetes.io/dockerconfigjson` Secret holds `{"auths": {<registry>: <entry>}}` under
//!   `.dockerconfigjson`; a `kubernetes.io/dockercfg` Secret holds the `{<registry>: <entry>}`
//!   map itself under `.dockercfg`. An entry has `username` and `password`, or `auth`
//!   (base64 of `user:password`), and optionally `identitytoken` / `registrytoken`.
//! - A registry key may carry a scheme and a path (`https://index.docker.io/v1/`,
//!   `registry.example/team`); the scheme is dropped, `/v1/` and `/v2/` mean the host.
//! - An image matches a key when their hosts have the same number of dot-separated parts,
//!   each matching the key's part as a glob (`*.example.com`), ports included, and the
//!   image's path starts with the key's. Keys are tried longest first; an image of Docker
//!   Hub also gets the credentials of `index.docker.io`.
//! - The image is compared in its normalised form (`busybox` is
//!   `docker.io/library/busybox`), without its tag or digest.
//!
//! Every credential that matches is returned, in order: the pull tries each in turn, as the
//! kubelet does, and an anonymous pull only when none matches. Credentials never reach a log
//! or an error message (the CRI `AuthConfig`'s `Debug` redacts them).

use std::collections::BTreeMap;

use base64::Engine;
use serde::Deserialize;

use super::api as cri;

/// The Secret type of `.dockerconfigjson` pull secrets.
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
/// The Secret type of legacy `.dockercfg` pull secrets.
pub const DOCKER_CFG_TYPE: &str = "kubernetes.io/dockercfg";
/// The data key of a `kubernetes.io/dockerconfigjson` Secret.
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// The data key of a `kubernetes.io/dockercfg` Secret.
pub const DOCKER_CFG_KEY: &str = ".dockercfg";

/// Docker Hub's host in credential keys.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One registry entry of a docker config.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
pub struct DockerConfigEntry {
    /// The user name.
    #[serde(default)]
    pub username: String,
    /// The password.
    #[serde(default)]
    pub password: String,
    /// base64 of `username:password`, when those are not given apart.
    #[serde(default)]
    pub auth: String,
    /// An OAuth identity token.
    #[serde(default, rename = "identitytoken")]
    pub identity_token: String,
    /// A bearer token for the registry.
    #[serde(default, rename = "registrytoken")]
    pub registry_token: String,
}

impl std::fmt::Debug for DockerConfigEntry {
    /// Only the user name: the rest are secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerConfigEntry")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, DockerConfigEntry>,
}

/// Why a pull secret could not be read (never with its content).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PullSecretError {
    /// The Secret lacks the key its type calls for.
    #[error("secret has no {0} key")]
    MissingKey(&'static str),
    /// The key's value is not a docker config.
    #[error("{key} is not a valid docker config: {reason}")]
    Invalid {
        /// The data key.
        key: &'static str,
        /// What is wrong, in serde's words (which quote no values of the secret's entries).
        reason: String,
    },
}

/// The registry entries of a pull secret of type `type_` with `data` (decoded bytes per
/// key). A Secret of another type has none, as the kubelet ignores it.
pub fn parse_secret(
    type_: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<BTreeMap<String, DockerConfigEntry>, PullSecretError> {
    let invalid = |key: &'static str| {
        move |e: serde_json::Error| PullSecretError::Invalid {
            key,
            reason: format!(
                "line {} column {}: {:?}",
                e.line(),
                e.column(),
                e.classify()
            ),
        }
    };
    match type_ {
        DOCKER_CONFIG_JSON_TYPE => {
            let raw = data
                .get(DOCKER_CONFIG_JSON_KEY)
                .ok_or(PullSecretError::MissingKey(DOCKER_CONFIG_JSON_KEY))?;
            let config: DockerConfigJson =
                serde_json::from_slice(raw).map_err(invalid(DOCKER_CONFIG_JSON_KEY))?;
            Ok(config.auths)
        }
        DOCKER_CFG_TYPE => {
            let raw = data
                .get(DOCKER_CFG_KEY)
                .ok_or(PullSecretError::MissingKey(DOCKER_CFG_KEY))?;
            serde_json::from_slice(raw).map_err(invalid(DOCKER_CFG_KEY))
        }
        _ => Ok(BTreeMap::new()),
    }
}

/// A credential key as the keyring files it: no scheme, `/v1/` and `/v2/` dropped, no
/// trailing `/` alone.
fn key_of(registry: &str) -> String {
    let rest = registry
        .strip_prefix("https://")
        .or_else(|| registry.strip_prefix("http://"))
        .unwrap_or(registry);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path
        .strip_prefix("/v2/")
        .or_else(|| path.strip_prefix("/v1/"))
        .map(|p| format!("/{p}"))
        .unwrap_or_else(|| path.to_string());
    if path.is_empty() || path == "/" {
        host.to_string()
    } else {
        format!("{host}{path}")
    }
}

/// The image's repository in its normalised form, without tag or digest:
/// `busybox:1` → `docker.io/library/busybox`.
pub fn normalized_repository(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    // A tag is after the last `:` that follows the last `/` (a `:` before it is a port).
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match without_digest[last_slash..].find(':') {
        Some(i) => &without_digest[..last_slash + i],
        None => without_digest,
    };
    let (first, rest) = match repo.find('/') {
        Some(i) => (&repo[..i], Some(&repo[i + 1..])),
        None => (repo, None),
    };
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    match (is_host, rest) {
        (true, Some(_)) => repo.to_string(),
        (false, Some(_)) => format!("docker.io/{repo}"),
        (_, None) => format!("docker.io/library/{repo}"),
    }
}

/// Go's `filepath.Match` for the patterns credential keys use: `*` (any run without `/`),
/// `?` and literal characters. Character classes are taken literally.
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether credential key `key` covers repository `repo` (both without scheme).
fn key_matches(key: &str, repo: &str) -> bool {
    let split = |s: &str| -> (String, String) {
        match s.find('/') {
            Some(i) => (s[..i].to_string(), s[i..].to_string()),
            None => (s.to_string(), String::new()),
        }
    };
    let (key_host, key_path) = split(key);
    let (repo_host, repo_path) = split(repo);
    let key_parts: Vec<&str> = key_host.split('.').collect();
    let repo_parts: Vec<&str> = repo_host.split('.').collect();
    key_parts.len() == repo_parts.len()
        && repo_path.starts_with(&key_path)
        && key_parts
            .iter()
            .zip(&repo_parts)
            .all(|(k, r)| glob_match(k, r))
}

/// Whether `repo` (normalised) is on Docker Hub.
fn is_default_registry(repo: &str) -> bool {
    let host = repo.split('/').next().unwrap_or_default();
    host == "docker.io" || host == DEFAULT_REGISTRY_HOST
}

/// The CRI credentials for `image` from the entries of a pod's pull secrets (in the order
/// of `imagePullSecrets`), every match in the order the pull should try them.
pub fn credentials_for(
    image: &str,
    secrets: &[BTreeMap<String, DockerConfigEntry>],
) -> Vec<cri::AuthConfig> {
    let repo = normalized_repository(image);
    // The keyring: every key with its entries, longest (most specific) first.
    let mut keyring: Vec<(String, &DockerConfigEntry)> = secrets
        .iter()
        .flat_map(|s| s.iter().map(|(k, e)| (key_of(k), e)))
        .collect();
    keyring.sort_by(|a, b| b.0.cmp(&a.0));
    let mut found: Vec<&DockerConfigEntry> = keyring
        .iter()
        .filter(|(k, _)| key_matches(k, &repo))
        .map(|(_, e)| *e)
        .collect();
    if found.is_empty() && is_default_registry(&repo) {
        found = keyring
            .iter()
            .filter(|(k, _)| k == DEFAULT_REGISTRY_HOST)
            .map(|(_, e)| *e)
            .collect();
    }
    let mut out: Vec<cri::AuthConfig> = Vec::new();
    for entry in found {
        let auth = to_cri(entry);
        if !out.contains(&auth) {
            out.push(auth);
        }
    }
    out
}

/// An entry as CRI's `AuthConfig`: `auth` decoded into user and password when those are
/// not given apart.
fn to_cri(entry: &DockerConfigEntry) -> cri::AuthConfig {
    let (mut username, mut password) = (entry.username.clone(), entry.password.clone());
    if username.is_empty() && password.is_empty() && !entry.auth.is_empty() {
        if let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(entry.auth.trim()) {
            let decoded = String::from_utf8_lossy(&decoded).into_owned();
            if let Some((u, p)) = decoded.split_once(':') {
                (username, password) = (u.to_string(), p.to_string());
            }
        }
    }
    cri::AuthConfig {
        username,
        password,
        identity_token: entry.identity_token.clone(),
        registry_token: entry.registry_token.clone(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(user: &str, pass: &str) -> DockerConfigEntry {
        DockerConfigEntry {
            username: user.into(),
            password: pass.into(),
            ..Default::default()
        }
    }

    fn data(key: &str, value: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([(key.to_string(), value.as_bytes().to_vec())])
    }

    #[test]
    fn both_secret_types_parse() {
        let json = r#"{"auths":{"https://index.docker.io/v1/":{"auth":"dTpw"},"reg.example:5000":{"username":"a","password":"b"}}}"#;
        let parsed =
            parse_secret(DOCKER_CONFIG_JSON_TYPE, &data(DOCKER_CONFIG_JSON_KEY, json)).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed["reg.example:5000"], entry("a", "b"));
        let cfg = r#"{"reg.example":{"username":"c","password":"d","email":"x@y"}}"#;
        let parsed = parse_secret(DOCKER_CFG_TYPE, &data(DOCKER_CFG_KEY, cfg)).unwrap();
        assert_eq!(parsed["reg.example"], entry("c", "d"));
        assert_eq!(
            parse_secret(DOCKER_CFG_TYPE, &data(DOCKER_CONFIG_JSON_KEY, cfg)),
            Err(PullSecretError::MissingKey(".dockercfg"))
        );
        let bad = parse_secret(
            DOCKER_CONFIG_JSON_TYPE,
            &data(
                DOCKER_CONFIG_JSON_KEY,
                r#"{"auths":{"r":{"password":"hunter2""#,
            ),
        )
        .unwrap_err();
        assert!(!bad.to_string().contains("hunter2"), "{bad}");
        assert!(parse_secret("Opaque", &data("x", "y")).unwrap().is_empty());
    }

    #[test]
    fn images_normalise_as_docker_references() {
        assert_eq!(
            normalized_repository("busybox"),
            "docker.io/library/busybox"
        );
        assert_eq!(
            normalized_repository("busybox:1.36"),
            "docker.io/library/busybox"
        );
        assert_eq!(normalized_repository("team/app:v1"), "docker.io/team/app");
        assert_eq!(
            normalized_repository("reg.example:5000/team/app:v1"),
            "reg.example:5000/team/app"
        );
        assert_eq!(
            normalized_repository("localhost/app@sha256:abc"),
            "localhost/app"
        );
    }

    #[test]
    fn keys_lose_scheme_and_api_version() {
        assert_eq!(key_of("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(key_of("http://reg.example/v2/team"), "reg.example/team");
        assert_eq!(key_of("reg.example/"), "reg.example");
        assert_eq!(key_of("reg.example:5000"), "reg.example:5000");
    }

    #[test]
    fn credentials_match_by_host_glob_port_and_path() {
        let secrets = vec![
            BTreeMap::from([
                ("*.example.com".to_string(), entry("glob", "1")),
                ("reg.example.com/team".to_string(), entry("team", "2")),
                ("reg.example.com:5000".to_string(), entry("port", "3")),
            ]),
            BTreeMap::from([(
                "https://index.docker.io/v1/".to_string(),
                DockerConfigEntry {
                    auth: base64::engine::general_purpose::STANDARD.encode("hub:4"),
                    ..Default::default()
                },
            )]),
        ];
        let users = |image: &str| -> Vec<String> {
            credentials_for(image, &secrets)
                .into_iter()
                .map(|a| format!("{}:{}", a.username, a.password))
                .collect()
        };
        // The most specific key first, then the glob.
        assert_eq!(users("reg.example.com/team/app:1"), ["team:2", "glob:1"]);
        assert_eq!(users("reg.example.com/other/app"), ["glob:1"]);
        // A port is part of the host: only the key with that port.
        assert_eq!(users("reg.example.com:5000/app"), ["port:3"]);
        // The glob covers one label only.
        assert!(users("a.reg.example.com/app").is_empty());
        assert!(users("example.com/app").is_empty());
        // Docker Hub images get index.docker.io's credentials.
        assert_eq!(users("busybox"), ["hub:4"]);
        assert_eq!(users("docker.io/team/app"), ["hub:4"]);
        assert!(users("quay.io/team/app").is_empty());
    }

    #[test]
    fn globs_are_filepath_match() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("re?", "reg"));
        assert!(glob_match("*:5000", "reg:5000"));
        assert!(!glob_match("reg", "reg2"));
        assert!(!glob_match("*x", "abc"));
    }

    #[test]
    fn debug_shows_no_secret() {
        let e = DockerConfigEntry {
            username: "u".into(),
            password: "hunter2".into(),
            auth: "aHVudGVyMg==".into(),
            ..Default::default()
        };
        let shown = format!("{e:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("aHVudGVyMg"),
            "{shown}"
        );
    }
}
