//! Joining machines, as `kubeadm join` does it.
//!
//! `setpoint up` creates a bootstrap token (a `bootstrap-token-<id>` Secret in `kube-system`,
//! valid 24 hours) and the `cluster-info` ConfigMap in `kube-public` (a kubeconfig naming the
//! server and its CA, readable by anonymous callers through the Role and RoleBinding
//! `kubeadm:bootstrap-signer-clusterinfo`), and prints `setpoint agent --server … --token …
//! --ca-cert-hash sha256:…`.
//!
//! The agent on the other machine reads `cluster-info` without trusting the server yet, and
//! trusts its CA only if the SHA-256 of the CA's SubjectPublicKeyInfo is the hash it was
//! given (kubeadm's public-key pinning). It then authenticates with the token, submits a
//! CertificateSigningRequest for `system:node:<name>` in `system:nodes` to the signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, waits for the controllers to approve and
//! sign it, and writes its own kubeconfig in its data dir, which later starts reuse.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;

use setpoint_runtime::client::{Client, HttpsTransport, Kubeconfig, Transport};

/// How long the token `setpoint up` creates is valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The signer of node client certificates.
const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The file the agent keeps its kubeconfig in, within its data dir.
pub const KUBECONFIG_FILE: &str = "node.kubeconfig";
/// The name of the Role and RoleBinding that let anonymous callers read `cluster-info`.
const CLUSTER_INFO_RBAC: &str = "kubeadm:bootstrap-signer-clusterinfo";

/// `sha256:<hex>` of the SubjectPublicKeyInfo of the first certificate in `ca_pem`.
pub fn ca_cert_hash(ca_pem: &str) -> anyhow::Result<String> {
    let (_, block) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())
        .map_err(|e| anyhow!("the CA certificate is not PEM: {e}"))?;
    let cert = block
        .parse_x509()
        .map_err(|e| anyhow!("the CA certificate does not parse: {e}"))?;
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.public_key().raw);
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// Random lower-case letters and digits.
fn random_token_chars(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let rng = ring::rand::SystemRandom::new();
    let mut out = String::with_capacity(n);
    while out.len() < n {
        let mut b = [0u8; 32];
        ring::rand::SecureRandom::fill(&rng, &mut b).expect("the system RNG works");
        // 252 is the largest multiple of 36 below 256: no value is likelier than another.
        for x in b.iter().filter(|x| **x < 252) {
            if out.len() < n {
                out.push(ALPHABET[usize::from(*x) % ALPHABET.len()] as char);
            }
        }
    }
    out
}

/// A new token `<id>.<secret>`.
pub fn new_token() -> (String, String) {
    (random_token_chars(6), random_token_chars(16))
}

/// The Secret that backs the token `id.secret`, expiring at `expiration` (RFC 3339).
pub fn token_secret(id: &str, secret: &str, expiration: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": "The bootstrap token setpoint up prints in its join command.",
            "token-id": id,
            "token-secret": secret,
            "expiration": expiration,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
        },
    })
}

/// A kubeconfig with one cluster and, if given, one user.
fn kubeconfig_yaml(server: &str, ca_pem: &str, user: Option<(&str, &str)>) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "setpoint", "cluster": {
            "server": server,
            "certificate-authority-data": b64(ca_pem),
        }}],
        // A context naming the cluster alone, so that it reads as a kubeconfig of its own.
        "contexts": [{"name": "setpoint", "context": {"cluster": "setpoint"}}],
        "current-context": "setpoint",
        "users": [],
        "preferences": {},
    });
    if let Some((cert, key)) = user {
        doc["users"] = json!([{"name": "node", "user": {
            "client-certificate-data": b64(cert),
            "client-key-data": b64(key),
        }}]);
        doc["contexts"][0]["context"]["user"] = json!("node");
    }
    // JSON is YAML.
    serde_json::to_string_pretty(&doc).expect("serializes")
}

pub(crate) async fn send(
    client: &Client,
    method: http::Method,
    path: &str,
    body: &Value,
) -> anyhow::Result<Value> {
    Ok(client
        .request(
            method,
            path,
            Some("application/json"),
            Bytes::from(serde_json::to_vec(body)?),
        )
        .await?)
}

/// Creates `obj` at `path`, or replaces what is there (keeping nothing of it).
pub(crate) async fn create_or_replace(
    client: &Client,
    path: &str,
    name: &str,
    obj: &Value,
) -> anyhow::Result<()> {
    match send(client, http::Method::POST, path, obj).await {
        Ok(_) => Ok(()),
        Err(e) if e.to_string().contains("already exists") => {
            send(client, http::Method::PUT, &format!("{path}/{name}"), obj).await?;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// What `setpoint up` does for joining machines: keeps `cluster-info` (for `server` and
/// `ca_pem`) readable anonymously and creates a new token, which it returns as `<id>.<secret>`.
pub async fn prepare(client: &Client, server: &str, ca_pem: &str) -> anyhow::Result<String> {
    let cluster_info = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": kubeconfig_yaml(server, ca_pem, None)},
    });
    create_or_replace(
        client,
        "/api/v1/namespaces/kube-public/configmaps",
        "cluster-info",
        &cluster_info,
    )
    .await
    .context("writing kube-public/cluster-info")?;
    let rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-public";
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": CLUSTER_INFO_RBAC, "namespace": "kube-public"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"], "verbs": ["get"]}],
    });
    create_or_replace(client, &format!("{rbac}/roles"), CLUSTER_INFO_RBAC, &role).await?;
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": CLUSTER_INFO_RBAC, "namespace": "kube-public"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CLUSTER_INFO_RBAC},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}],
    });
    create_or_replace(
        client,
        &format!("{rbac}/rolebindings"),
        CLUSTER_INFO_RBAC,
        &binding,
    )
    .await?;
    let (id, secret) = new_token();
    let expiration = (chrono::Utc::now() + chrono::Duration::from_std(TOKEN_TTL)?)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    send(
        client,
        http::Method::POST,
        "/api/v1/namespaces/kube-system/secrets",
        &token_secret(&id, &secret, &expiration),
    )
    .await
    .context("creating the bootstrap token")?;
    Ok(format!("{id}.{secret}"))
}

/// How to join: `--server`, `--token`, `--ca-cert-hash`.
pub struct JoinFlags {
    /// The API server's URL.
    pub server: String,
    /// The bootstrap token `<id>.<secret>`.
    pub token: String,
    /// `sha256:<hex>` of the CA's public key.
    pub ca_cert_hash: String,
}

/// What a node asks for its certificate with: the API server, the CA it trusts there, and
/// the bootstrap token.
pub struct Bootstrap {
    /// The API server's URL.
    pub server: String,
    /// The cluster CA (PEM).
    pub ca_pem: String,
    /// The bootstrap token `<id>.<secret>`.
    pub token: String,
}

impl Bootstrap {
    /// From the join flags: the CA read from `cluster-info` without trusting the server yet,
    /// and trusted only if its public key has the pinned hash.
    pub async fn discover(flags: &JoinFlags) -> anyhow::Result<Bootstrap> {
        let anonymous = Client::from_kubeconfig(&Kubeconfig {
            server: flags.server.clone(),
            insecure_skip_tls_verify: true,
            ..Kubeconfig::default()
        })?;
        let info = anonymous
            .request(
                http::Method::GET,
                "/api/v1/namespaces/kube-public/configmaps/cluster-info",
                None,
                Bytes::new(),
            )
            .await
            .context("reading kube-public/cluster-info")?;
        let text = info
            .pointer("/data/kubeconfig")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("cluster-info has no kubeconfig"))?;
        let ca_pem = Kubeconfig::parse(text, None)?
            .ca_pem
            .ok_or_else(|| anyhow!("cluster-info names no CA"))?;
        let hash = ca_cert_hash(&ca_pem)?;
        if !hash.eq_ignore_ascii_case(&flags.ca_cert_hash) {
            bail!(
                "the cluster CA's public key hash is {hash}, not {}: refusing to trust this server",
                flags.ca_cert_hash
            );
        }
        Ok(Bootstrap {
            server: flags.server.clone(),
            ca_pem,
            token: flags.token.clone(),
        })
    }

    /// From a bootstrap kubeconfig (the kubelet's `--bootstrap-kubeconfig`): its server, its
    /// cluster's CA (which it vouches for itself) and its user's token.
    pub fn from_kubeconfig(path: &Path) -> anyhow::Result<Bootstrap> {
        let kc = Kubeconfig::read(path)
            .with_context(|| format!("reading the bootstrap kubeconfig {}", path.display()))?;
        let ca_pem = kc.ca_pem.ok_or_else(|| {
            anyhow!(
                "the bootstrap kubeconfig {} names no certificate authority",
                path.display()
            )
        })?;
        let token = kc.token.ok_or_else(|| {
            anyhow!(
                "the bootstrap kubeconfig {} has no token for its user",
                path.display()
            )
        })?;
        Ok(Bootstrap {
            server: kc.server,
            ca_pem,
            token,
        })
    }

    /// A client authenticating with the token (`system:bootstrap:<id>`). Not rate-limited:
    /// it sends a few requests per node, once, and many nodes may be joining at once.
    pub fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::from_kubeconfig(&Kubeconfig {
            server: self.server.clone(),
            ca_pem: Some(self.ca_pem.clone()),
            token: Some(self.token.clone()),
            ..Kubeconfig::default()
        })?
        .without_rate_limit())
    }
}

/// The node kubeconfig in `data_dir`, if there is one for `server` whose certificate is still
/// valid (a restarted agent reuses it rather than asking again).
pub fn existing(server: &str, data_dir: &Path) -> Option<Kubeconfig> {
    let path: PathBuf = data_dir.join(KUBECONFIG_FILE);
    let kc = Kubeconfig::read(&path).ok()?;
    (kc.server == server && remaining_life(&kc).is_some_and(|d| d > Duration::ZERO)).then(|| {
        tracing::info!(path = %path.display(), "using the node's existing credentials");
        kc
    })
}

/// The node's kubeconfig: the one in `data_dir` when its certificate is still valid, else a
/// new one from a signed CSR (written there).
pub async fn join(flags: &JoinFlags, node: &str, data_dir: &Path) -> anyhow::Result<Kubeconfig> {
    if let Some(kc) = existing(&flags.server, data_dir) {
        return Ok(kc);
    }
    let bootstrap = Bootstrap::discover(flags).await?;
    join_with(&bootstrap, &bootstrap.client()?, node, data_dir).await
}

/// The kubeconfig of `node` in `data_dir`, reused when still valid, else from a CSR submitted
/// through `client` (a client of `bootstrap`'s token) and signed for `system:node:<node>`.
pub async fn join_with(
    bootstrap: &Bootstrap,
    client: &Client,
    node: &str,
    data_dir: &Path,
) -> anyhow::Result<Kubeconfig> {
    if let Some(kc) = existing(&bootstrap.server, data_dir) {
        return Ok(kc);
    }
    let path: PathBuf = data_dir.join(KUBECONFIG_FILE);
    let (cert, key) = request_certificate(client, node).await?;
    let text = kubeconfig_yaml(&bootstrap.server, &bootstrap.ca_pem, Some((&cert, &key)));
    std::fs::create_dir_all(data_dir)?;
    write_private(&path, &text)?;
    tracing::info!(node, path = %path.display(), "joined: wrote the node's kubeconfig");
    Ok(Kubeconfig::read(&path)?)
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    setpoint_apiserver::tls::write_private(path, text)
        .with_context(|| format!("writing {}", path.display()))
}

/// Submits a CSR for `system:node:<node>` through `client` and waits for its certificate:
/// (certificate PEM, key PEM).
pub async fn request_certificate(client: &Client, node: &str) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    let request = params.serialize_request(&key)?.pem()?;
    let csr = json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": "node-csr-"},
        "spec": {
            "request": base64::engine::general_purpose::STANDARD.encode(request),
            "signerName": SIGNER,
            // An ECDSA key: no key encipherment, as upstream's kubelet asks.
            "usages": ["digital signature", "client auth"],
        },
    });
    let path = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
    let created = send(client, http::Method::POST, path, &csr)
        .await
        .context("creating the node's CertificateSigningRequest")?;
    let name = created
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    println!("Waiting for CertificateSigningRequest {name} to be approved and signed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15 * 60);
    loop {
        let csr = client
            .request(
                http::Method::GET,
                &format!("{path}/{name}"),
                None,
                Bytes::new(),
            )
            .await?;
        let conditions = csr
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(c) = conditions
            .iter()
            .find(|c| matches!(c["type"].as_str(), Some("Denied" | "Failed")))
        {
            bail!(
                "CertificateSigningRequest {name} was {}: {}",
                c["type"].as_str().unwrap_or_default().to_lowercase(),
                c["message"].as_str().unwrap_or_default()
            );
        }
        if let Some(cert) = csr.pointer("/status/certificate").and_then(Value::as_str) {
            if !cert.is_empty() {
                let pem = base64::engine::general_purpose::STANDARD.decode(cert)?;
                return Ok((String::from_utf8(pem)?, key.serialize_pem()));
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!("CertificateSigningRequest {name} was not signed within 15 minutes");
        }
        // Polling, not a fixed wait for something: the request is read again each second.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The client certificate's validity, `(not before, not after)` in seconds since the epoch.
pub fn validity(kc: &Kubeconfig) -> Option<(i64, i64)> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(kc.client_cert_pem.as_ref()?.as_bytes()).ok()?;
    let cert = block.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// When to renew a certificate valid from `not_before` to `not_after`: after `fraction`
/// (0.7 to 0.9, drawn at random so that nodes joined together do not renew together) of its
/// lifetime, as upstream's kubelet certificate manager does.
pub fn renew_at(not_before: i64, not_after: i64, fraction: f64) -> i64 {
    let fraction = fraction.clamp(0.7, 0.9);
    let life = (not_after - not_before).max(0) as f64;
    not_before + (life * fraction) as i64
}

/// A fraction of a certificate's life between 0.7 and 0.9, at random.
fn jittered_fraction() -> f64 {
    let mut b = [0u8; 2];
    let rng = ring::rand::SystemRandom::new();
    let _ = ring::rand::SecureRandom::fill(&rng, &mut b);
    0.7 + 0.2 * f64::from(u16::from_be_bytes(b)) / f64::from(u16::MAX)
}

/// An HTTPS transport whose client certificate can be replaced while the client is in use:
/// requests after a renewal connect with the new certificate.
pub struct RotatingTransport {
    current: std::sync::RwLock<Arc<HttpsTransport>>,
}

impl RotatingTransport {
    /// A transport for `kc`.
    pub fn new(kc: &Kubeconfig) -> anyhow::Result<Arc<RotatingTransport>> {
        Ok(Arc::new(RotatingTransport {
            current: std::sync::RwLock::new(Arc::new(HttpsTransport::from_kubeconfig(kc)?)),
        }))
    }

    fn replace(&self, kc: &Kubeconfig) -> anyhow::Result<()> {
        let next = Arc::new(HttpsTransport::from_kubeconfig(kc)?);
        *self.current.write().expect("not poisoned") = next;
        Ok(())
    }
}

/// The handle a [`Client`] owns.
pub struct Rotating(pub Arc<RotatingTransport>);

#[async_trait::async_trait]
impl Transport for Rotating {
    async fn send(
        &self,
        req: http::Request<Bytes>,
    ) -> Result<http::Response<setpoint_runtime::client::Body>, setpoint_runtime::ClientError> {
        let current = self.0.current.read().expect("not poisoned").clone();
        current.send(req).await
    }
}

/// Renews the node's certificate for as long as the agent runs: at 70–90 % of its life, a new
/// CSR made as the node itself (approved as `selfnodeclient`), the kubeconfig in `data_dir`
/// rewritten, and `transport` switched to the new certificate.
pub async fn renew(
    client: Client,
    transport: Arc<RotatingTransport>,
    node: String,
    data_dir: PathBuf,
) {
    let path = data_dir.join(KUBECONFIG_FILE);
    loop {
        let kc = match Kubeconfig::read(&path) {
            Ok(kc) => kc,
            Err(e) => {
                tracing::error!(error = %e, "the node's kubeconfig cannot be read: not renewing");
                return;
            }
        };
        let Some((not_before, not_after)) = validity(&kc) else {
            tracing::error!("the node's certificate cannot be read: not renewing");
            return;
        };
        let at = renew_at(not_before, not_after, jittered_fraction());
        let wait = u64::try_from(at - chrono::Utc::now().timestamp()).unwrap_or(0);
        tracing::info!(in_seconds = wait, "the node's certificate will be renewed");
        tokio::time::sleep(Duration::from_secs(wait)).await;
        let renewed = async {
            let (cert, key) = request_certificate(&client, &node).await?;
            let ca = kc
                .ca_pem
                .clone()
                .ok_or_else(|| anyhow!("the kubeconfig names no CA"))?;
            write_private(
                &path,
                &kubeconfig_yaml(&kc.server, &ca, Some((&cert, &key))),
            )?;
            transport.replace(&Kubeconfig::read(&path)?)?;
            anyhow::Ok(())
        };
        match renewed.await {
            Ok(()) => tracing::info!("renewed the node's certificate"),
            Err(e) => {
                tracing::warn!(error = %e, "renewing the node's certificate failed; retrying");
                // Retried after a minute rather than at once: the server may be away.
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        }
    }
}

/// How long the kubeconfig's client certificate remains valid, if it has one.
pub fn remaining_life(kc: &Kubeconfig) -> Option<Duration> {
    let (_, block) =
        x509_parser::pem::parse_x509_pem(kc.client_cert_pem.as_ref()?.as_bytes()).ok()?;
    let cert = block.parse_x509().ok()?;
    let left = cert.validity().not_after.timestamp() - chrono::Utc::now().timestamp();
    Some(Duration::from_secs(u64::try_from(left).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_renewed_at_seventy_to_ninety_percent_of_their_life() {
        assert_eq!(renew_at(1000, 2000, 0.7), 1700);
        assert_eq!(renew_at(1000, 2000, 0.9), 1900);
        assert_eq!(renew_at(1000, 2000, 0.5), 1700, "clamped");
        for _ in 0..100 {
            let f = jittered_fraction();
            assert!((0.7..=0.9).contains(&f), "{f}");
        }
    }

    #[tokio::test]
    async fn a_node_certificate_comes_from_an_approved_and_signed_csr() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let cluster = setpoint_testing::TestCluster::start_with_controller_options(
            setpoint_controllers::manager::Options {
                cluster_signing: Some(setpoint_controllers::csrsigning::SigningCa {
                    cert_pem: ca.pem(),
                    key_pem: ca_key.serialize_pem(),
                    max_duration: setpoint_controllers::csrsigning::DEFAULT_DURATION,
                }),
                ..Default::default()
            },
        )
        .await;
        let (cert, key) = request_certificate(&cluster.client(), "n1").await.unwrap();
        let kc = Kubeconfig::parse(
            &kubeconfig_yaml("https://10.0.0.1:6443", &ca.pem(), Some((&cert, &key))),
            None,
        )
        .unwrap();
        let (not_before, not_after) = validity(&kc).unwrap();
        assert_eq!(
            not_after - not_before,
            DEFAULT_SIGNING_SECONDS,
            "the signer's maximum"
        );
        let (_, block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).unwrap();
        let parsed = block.parse_x509().unwrap();
        let subject = parsed.subject().to_string();
        assert!(subject.contains("CN=system:node:n1"), "{subject}");
        assert!(subject.contains("O=system:nodes"), "{subject}");
        // The certificate is for the key the agent kept.
        let kept = rcgen::KeyPair::from_pem(&key).unwrap();
        assert_eq!(
            parsed.public_key().raw,
            rcgen::PublicKeyData::subject_public_key_info(&kept).as_slice()
        );
        cluster.stop().await;
    }

    const DEFAULT_SIGNING_SECONDS: i64 = 365 * 24 * 3600;

    #[tokio::test]
    async fn a_certificate_past_its_renewal_time_is_renewed_and_the_kubeconfig_rewritten() {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let cluster = setpoint_testing::TestCluster::start_with_controller_options(
            setpoint_controllers::manager::Options {
                cluster_signing: Some(setpoint_controllers::csrsigning::SigningCa {
                    cert_pem: ca.pem(),
                    key_pem: ca_key.serialize_pem(),
                    max_duration: setpoint_controllers::csrsigning::DEFAULT_DURATION,
                }),
                ..Default::default()
            },
        )
        .await;
        // A node certificate long past its renewal time (it expired in 2021).
        let old_key = rcgen::KeyPair::generate().unwrap();
        let mut old = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        old.not_before = rcgen::date_time_ymd(2020, 1, 1);
        old.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let old_cert = old.signed_by(&old_key, &issuer).unwrap().pem();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KUBECONFIG_FILE);
        let text = kubeconfig_yaml(
            "https://127.0.0.1:1",
            &ca.pem(),
            Some((&old_cert, &old_key.serialize_pem())),
        );
        write_private(&path, &text).unwrap();
        let kc = Kubeconfig::read(&path).unwrap();
        let transport = RotatingTransport::new(&kc).unwrap();
        let task = tokio::spawn(renew(
            cluster.client(),
            transport,
            "n1".into(),
            dir.path().to_path_buf(),
        ));
        let renewed = setpoint_testing::eventually("the renewed certificate", || {
            let path = path.clone();
            async move {
                let kc = Kubeconfig::read(&path).ok()?;
                let (_, not_after) = validity(&kc)?;
                (not_after > chrono::Utc::now().timestamp()).then_some(kc)
            }
        })
        .await;
        task.abort();
        assert_ne!(renewed.client_cert_pem.as_deref(), Some(old_cert.as_str()));
        assert_eq!(renewed.server, "https://127.0.0.1:1");
        cluster.stop().await;
    }

    #[test]
    fn tokens_have_the_bootstrap_shape() {
        let (id, secret) = new_token();
        assert_eq!((id.len(), secret.len()), (6, 16));
        assert!(format!("{id}{secret}")
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(new_token(), new_token());
        let s = token_secret(&id, &secret, "2030-01-01T00:00:00Z");
        assert_eq!(s["metadata"]["name"], format!("bootstrap-token-{id}"));
        assert_eq!(s["stringData"]["usage-bootstrap-authentication"], "true");
    }

    #[test]
    fn the_ca_hash_is_of_the_public_key_and_cluster_info_carries_the_ca() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let cert = params.self_signed(&key).unwrap().pem();
        let hash = ca_cert_hash(&cert).unwrap();
        let expected = ring::digest::digest(
            &ring::digest::SHA256,
            &rcgen::PublicKeyData::subject_public_key_info(&key),
        );
        let hex: String = expected
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hash, format!("sha256:{hex}"));
        // Another certificate for the same key has the same hash (the key is what is pinned).
        let again = rcgen::CertificateParams::new(vec!["x".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        assert_eq!(ca_cert_hash(&again).unwrap(), hash);
        let info = kubeconfig_yaml("https://10.0.0.1:6443", &cert, None);
        let kc = Kubeconfig::parse(&info, None).unwrap();
        assert_eq!(kc.server, "https://10.0.0.1:6443");
        assert_eq!(kc.ca_pem.as_deref(), Some(cert.as_str()));
    }
}
