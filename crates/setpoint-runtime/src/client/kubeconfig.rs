//! Reading a kubeconfig: the current context's server, CA, and client credentials (embedded
//! `*-data` or file paths relative to the kubeconfig).

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
    }
}
