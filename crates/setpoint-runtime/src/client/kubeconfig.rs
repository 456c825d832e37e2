//! Reading a kubeconfig: the current context's server, CA, and client credentials (embedded
//! `*-data` or file paths relative to the kubeconfig); and, for a program running in a pod,
//! the in-cluster configuration client-go's `rest.InClusterConfig` reads: the API server from
//! `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, the pod's service-account token,
//! the cluster CA and the namespace from the files the node projects into
//! [`SERVICE_ACCOUNT_DIR`].

use std::path::{Path, PathBuf};

use base64::Engine;
use serde_json::Value;

use super::ClientError;

/// What a client needs from a kubeconfig's current context.
#[derive(Clone, Debug, Default)]
pub struct Kubeconfig {
    /// The cluster's `server` URL, e.g. `https://127.0.0.1:6443`; empty when the cluster names
    /// none.
    pub server: String,
    /// The context's default `namespace`, if it sets one.
    pub namespace: Option<String>,
    /// The cluster's CA bundle (PEM), from `certificate-authority-data` or the
    /// `certificate-authority` file.
    pub ca_pem: Option<String>,
    /// The user's client certificate (PEM), from `client-certificate-data` or the
    /// `client-certificate` file.
    pub client_cert_pem: Option<String>,
    /// The user's private key (PEM), from `client-key-data` or the `client-key` file.
    pub client_key_pem: Option<String>,
    /// The user's bearer `token`, sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// The user's `tokenFile`: a file holding the bearer token, read again every minute (the
    /// node rewrites a pod's projected token before it expires). Preferred over `token`.
    pub token_file: Option<PathBuf>,
    /// The cluster's `insecure-skip-tls-verify`: accept any server certificate (default false).
    pub insecure_skip_tls_verify: bool,
}

fn named<'a>(doc: &'a Value, list: &str, name: &str, field: &str) -> Option<&'a Value> {
    doc.get(list)?
        .as_array()?
        .iter()
        .find(|e| e.get("name").and_then(Value::as_str) == Some(name))?
        .get(field)
}

/// Where the node puts a pod's service-account credentials (the `kube-api-access-<hash>`
/// volume admission adds): `token`, `ca.crt` and `namespace`.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// client-go's `ErrNotInCluster`, word for word.
const NOT_IN_CLUSTER: &str = "unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined";

/// Where the kubeconfig of this environment is: the first path of a non-empty `$KUBECONFIG`,
/// else `~/.kube/config` when it exists; `None` when there is none (a program in a pod).
fn kubeconfig_path(
    kubeconfig: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    match kubeconfig {
        Some(p) if !p.is_empty() => std::env::split_paths(&p).next(),
        _ => {
            let path = Path::new(&home?).join(".kube").join("config");
            path.exists().then_some(path)
        }
    }
}

impl Kubeconfig {
    /// Reads `$KUBECONFIG` (its first path) or `~/.kube/config`.
    pub fn from_env() -> Result<Self, ClientError> {
        let path = match std::env::var_os("KUBECONFIG") {
            Some(p) if !p.is_empty() => std::env::split_paths(&p).next().unwrap_or_default(),
            _ => {
                let home = std::env::var_os("HOME")
                    .ok_or_else(|| ClientError::Config("no KUBECONFIG and no HOME".into()))?;
                Path::new(&home).join(".kube").join("config")
            }
        };
        Self::read(&path)
    }

    /// The configuration of this environment, as kube-rs's `Config::infer` and client-go's
    /// default loading find it: the kubeconfig of `$KUBECONFIG` or `~/.kube/config` when there
    /// is one, else the in-cluster configuration ([`Kubeconfig::in_cluster`]).
    pub fn infer() -> Result<Self, ClientError> {
        match kubeconfig_path(std::env::var_os("KUBECONFIG"), std::env::var_os("HOME")) {
            Some(path) => Self::read(&path),
            None => Self::in_cluster().map_err(|e| {
                ClientError::Config(format!(
                    "no kubeconfig ($KUBECONFIG unset and no ~/.kube/config) and not in a cluster: {}",
                    match e {
                        ClientError::Config(m) => m,
                        other => other.to_string(),
                    }
                ))
            }),
        }
    }

    /// The in-cluster configuration of a program running in a pod: the API server at
    /// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, authenticated with the
    /// pod's service-account token (re-read every minute), trusting `ca.crt`, and the pod's
    /// namespace as the default one, all from [`SERVICE_ACCOUNT_DIR`].
    pub fn in_cluster() -> Result<Self, ClientError> {
        Self::in_cluster_from(
            std::env::var("KUBERNETES_SERVICE_HOST").ok().as_deref(),
            std::env::var("KUBERNETES_SERVICE_PORT").ok().as_deref(),
            Path::new(SERVICE_ACCOUNT_DIR),
        )
    }

    /// [`Kubeconfig::in_cluster`] with the environment's values and the credentials'
    /// directory given.
    pub fn in_cluster_from(
        host: Option<&str>,
        port: Option<&str>,
        dir: &Path,
    ) -> Result<Self, ClientError> {
        let (Some(host), Some(port)) = (
            host.filter(|h| !h.is_empty()),
            port.filter(|p| !p.is_empty()),
        ) else {
            return Err(ClientError::Config(NOT_IN_CLUSTER.into()));
        };
        let token_file = dir.join("token");
        // Read once now, so a pod without a token fails here rather than on its first request.
        let token = std::fs::read_to_string(&token_file).map_err(|e| {
            ClientError::Config(format!(
                "reading the service-account token {}: {e}",
                token_file.display()
            ))
        })?;
        let ca_file = dir.join("ca.crt");
        let ca = std::fs::read_to_string(&ca_file).map_err(|e| {
            ClientError::Config(format!("reading the cluster CA {}: {e}", ca_file.display()))
        })?;
        // A pod's namespace file is optional for client-go too, which then says `default`.
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .ok()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty());
        // An IPv6 address is bracketed in the URL, as Go's net.JoinHostPort writes it.
        let server = if host.contains(':') && !host.starts_with('[') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        };
        Ok(Kubeconfig {
            server,
            namespace,
            ca_pem: Some(ca),
            token: Some(token.trim().to_string()),
            token_file: Some(token_file),
            ..Kubeconfig::default()
        })
    }

    /// Reads a kubeconfig file.
    pub fn read(path: &Path) -> Result<Self, ClientError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClientError::Config(format!("reading {}: {e}", path.display())))?;
        Self::parse(&text, path.parent())
    }

    /// Parses kubeconfig YAML; relative file paths resolve against `base`.
    pub fn parse(text: &str, base: Option<&Path>) -> Result<Self, ClientError> {
        let doc: Value = serde_saphyr::from_str(text)
            .map_err(|e| ClientError::Config(format!("kubeconfig: {e}")))?;
        let ctx_name = doc
            .get("current-context")
            .and_then(Value::as_str)
            .unwrap_or("");
        let ctx = named(&doc, "contexts", ctx_name, "context")
            .or_else(|| doc.get("contexts")?.as_array()?.first()?.get("context"))
            .ok_or_else(|| ClientError::Config("kubeconfig has no context".into()))?;
        let cluster_name = ctx.get("cluster").and_then(Value::as_str).unwrap_or("");
        let user_name = ctx.get("user").and_then(Value::as_str).unwrap_or("");
        let cluster = named(&doc, "clusters", cluster_name, "cluster").ok_or_else(|| {
            ClientError::Config(format!("kubeconfig has no cluster {cluster_name:?}"))
        })?;
        let user = named(&doc, "users", user_name, "user")
            .cloned()
            .unwrap_or(Value::Null);
        let read = |v: &Value, data: &str, file: &str| -> Result<Option<String>, ClientError> {
            if let Some(d) = v.get(data).and_then(Value::as_str) {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(d.trim())
                    .map_err(|e| ClientError::Config(format!("{data}: {e}")))?;
                return Ok(Some(String::from_utf8_lossy(&bytes).into_owned()));
            }
            if let Some(f) = v.get(file).and_then(Value::as_str) {
                let p = match base {
                    Some(b) if Path::new(f).is_relative() => b.join(f),
                    _ => PathBuf::from(f),
                };
                return std::fs::read_to_string(&p)
                    .map(Some)
                    .map_err(|e| ClientError::Config(format!("reading {}: {e}", p.display())));
            }
            Ok(None)
        };
        Ok(Kubeconfig {
            server: cluster
                .get("server")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            namespace: ctx
                .get("namespace")
                .and_then(Value::as_str)
                .map(String::from),
            ca_pem: read(
                cluster,
                "certificate-authority-data",
                "certificate-authority",
            )?,
            client_cert_pem: read(&user, "client-certificate-data", "client-certificate")?,
            client_key_pem: read(&user, "client-key-data", "client-key")?,
            token: user.get("token").and_then(Value::as_str).map(String::from),
            token_file: user
                .get("tokenFile")
                .and_then(Value::as_str)
                .map(|f| match base {
                    Some(b) if Path::new(f).is_relative() => b.join(f),
                    _ => PathBuf::from(f),
                }),
            insecure_skip_tls_verify: cluster
                .get("insecure-skip-tls-verify")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_current_context() {
        let kc = Kubeconfig::parse(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: aGVsbG8=\nusers:\n- name: u\n  user:\n    token: abc\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: demo\ncurrent-context: x\n",
            None,
        )
        .unwrap();
        assert_eq!(kc.server, "https://127.0.0.1:6443");
        assert_eq!(kc.ca_pem.as_deref(), Some("hello"));
        assert_eq!(kc.token.as_deref(), Some("abc"));
        assert_eq!(kc.namespace.as_deref(), Some("demo"));
        assert_eq!(kc.token_file, None);
    }

    #[test]
    fn token_file_resolves_against_the_kubeconfig() {
        let kc = Kubeconfig::parse(
            "clusters:\n- name: c\n  cluster: {server: https://h:1}\nusers:\n- name: u\n  user: {tokenFile: tok}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
            Some(Path::new("/etc/k")),
        )
        .unwrap();
        assert_eq!(kc.token_file.as_deref(), Some(Path::new("/etc/k/tok")));
    }

    fn service_account_dir(namespace: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "tok-1\n").unwrap();
        std::fs::write(dir.path().join("ca.crt"), "PEM").unwrap();
        if let Some(ns) = namespace {
            std::fs::write(dir.path().join("namespace"), ns).unwrap();
        }
        dir
    }

    #[test]
    fn in_cluster_reads_the_environment_and_the_projected_files() {
        let dir = service_account_dir(Some("team-a"));
        let kc = Kubeconfig::in_cluster_from(Some("10.96.0.1"), Some("443"), dir.path()).unwrap();
        assert_eq!(kc.server, "https://10.96.0.1:443");
        assert_eq!(kc.token.as_deref(), Some("tok-1"));
        assert_eq!(kc.token_file, Some(dir.path().join("token")));
        assert_eq!(kc.ca_pem.as_deref(), Some("PEM"));
        assert_eq!(kc.namespace.as_deref(), Some("team-a"));
        assert!(kc.client_cert_pem.is_none() && !kc.insecure_skip_tls_verify);

        let v6 = Kubeconfig::in_cluster_from(Some("fd00::1"), Some("6443"), dir.path()).unwrap();
        assert_eq!(v6.server, "https://[fd00::1]:6443");
    }

    #[test]
    fn in_cluster_without_a_namespace_file_has_no_namespace() {
        let dir = service_account_dir(None);
        let kc = Kubeconfig::in_cluster_from(Some("h"), Some("1"), dir.path()).unwrap();
        assert_eq!(kc.namespace, None);
    }

    #[test]
    fn in_cluster_needs_the_environment_and_the_token() {
        let dir = service_account_dir(None);
        for (host, port) in [
            (None, Some("443")),
            (Some("h"), None),
            (Some(""), Some("1")),
        ] {
            let err = Kubeconfig::in_cluster_from(host, port, dir.path()).unwrap_err();
            assert_eq!(err.to_string(), format!("configuration: {NOT_IN_CLUSTER}"));
        }
        let empty = tempfile::tempdir().unwrap();
        let err = Kubeconfig::in_cluster_from(Some("h"), Some("1"), empty.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("reading the service-account token"),
            "{err}"
        );
    }

    #[test]
    fn a_kubeconfig_is_found_before_the_cluster() {
        let home = tempfile::tempdir().unwrap();
        assert_eq!(kubeconfig_path(None, Some(home.path().into())), None);
        assert_eq!(kubeconfig_path(Some("".into()), None), None);
        std::fs::create_dir(home.path().join(".kube")).unwrap();
        std::fs::write(home.path().join(".kube/config"), "").unwrap();
        assert_eq!(
            kubeconfig_path(None, Some(home.path().into())),
            Some(home.path().join(".kube/config"))
        );
        // $KUBECONFIG names the file whether or not it exists (reading it then fails).
        assert_eq!(
            kubeconfig_path(Some("/nowhere/a:/b".into()), Some(home.path().into())),
            Some(PathBuf::from("/nowhere/a"))
        );
    }
}
