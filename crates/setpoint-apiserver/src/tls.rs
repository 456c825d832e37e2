//! Certificates and serving: a CA, a serving certificate and an admin client certificate,
//! generated into the data dir (kept across restarts), an admin kubeconfig, and the accept
//! loops for HTTPS (with client-certificate authentication) and plain HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::authentication::{certificate_user, Identity};
use crate::connection::serve_connection;
use crate::connection::ConnectionConfig;

/// TLS material errors.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Making a certificate or key failed.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// Reading or writing a certificate file failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// rustls refused the certificates or keys.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// A PEM file did not hold what it should.
    #[error("PEM: {0}")]
    Pem(String),
}

/// The cluster's certificates, as PEM.
#[derive(Clone, Debug)]
pub struct Pki {
    /// The cluster CA's certificate, which signs every other one.
    pub ca_cert: String,
    /// The cluster CA's private key.
    pub ca_key: String,
    /// The API server's serving certificate.
    pub server_cert: String,
    /// The serving certificate's private key.
    pub server_key: String,
    /// The admin client certificate (`system:masters`), the one the kubeconfig holds.
    pub admin_cert: String,
    /// The admin client certificate's private key.
    pub admin_key: String,
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "setpoint-ca");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(p)
}

fn leaf(
    cn: &str,
    org: Option<&str>,
    sans: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<CertificateParams, rcgen::Error> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    p.distinguished_name = dn;
    p.subject_alt_names = sans;
    p.extended_key_usages = vec![usage];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(p)
}

/// Writes `contents` to `path` readable by its owner only (0600), through a temporary file
/// renamed into place once synced, so a crash leaves the old file or the new one.
pub fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents.as_ref())?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

impl Pki {
    /// Loads the CA and admin certificate from `data_dir/pki` (creating them the first time)
    /// and issues a fresh serving certificate for `addr`. Without a data dir everything is
    /// generated in memory.
    pub fn load_or_create(data_dir: Option<&Path>, addr: SocketAddr) -> Result<Pki, TlsError> {
        Self::load_or_create_naming(data_dir, &[addr.ip()])
    }

    /// [`Pki::load_or_create`] with a serving certificate that names each of `ips` besides
    /// loopback, `10.96.0.1` and the `kubernetes` Service's names (unspecified and loopback
    /// addresses are left out: loopback is always named).
    pub fn load_or_create_naming(
        data_dir: Option<&Path>,
        ips: &[std::net::IpAddr],
    ) -> Result<Pki, TlsError> {
        let dir = data_dir.map(|d| d.join("pki"));
        let existing = dir.as_ref().and_then(|d| {
            let read = |n: &str| std::fs::read_to_string(d.join(n)).ok();
            Some((
                read("ca.crt")?,
                read("ca.key")?,
                read("admin.crt")?,
                read("admin.key")?,
            ))
        });
        let ca_p = ca_params()?;
        let (ca_cert, ca_key_pem, admin_cert, admin_key_pem) = match existing {
            Some(v) => v,
            None => {
                let ca_key = KeyPair::generate()?;
                let ca_cert = ca_p.self_signed(&ca_key)?;
                let issuer = Issuer::from_params(&ca_p, &ca_key);
                let admin_key = KeyPair::generate()?;
                let admin = leaf(
                    "admin",
                    Some("system:masters"),
                    vec![],
                    ExtendedKeyUsagePurpose::ClientAuth,
                )?
                .signed_by(&admin_key, &issuer)?;
                let v = (
                    ca_cert.pem(),
                    ca_key.serialize_pem(),
                    admin.pem(),
                    admin_key.serialize_pem(),
                );
                if let Some(d) = &dir {
                    std::fs::create_dir_all(d)?;
                    std::fs::write(d.join("ca.crt"), &v.0)?;
                    write_private(&d.join("ca.key"), &v.1)?;
                    std::fs::write(d.join("admin.crt"), &v.2)?;
                    write_private(&d.join("admin.key"), &v.3)?;
                }
                v
            }
        };
        let ca_key = KeyPair::from_pem(&ca_key_pem)?;
        let issuer = Issuer::from_params(&ca_p, &ca_key);
        let mut sans = vec![
            SanType::DnsName("localhost".try_into()?),
            SanType::DnsName("kubernetes".try_into()?),
            SanType::DnsName("kubernetes.default".try_into()?),
            SanType::DnsName("kubernetes.default.svc".try_into()?),
            SanType::IpAddress("127.0.0.1".parse().expect("ip")),
            SanType::IpAddress("::1".parse().expect("ip")),
            SanType::IpAddress("10.96.0.1".parse().expect("ip")),
        ];
        let mut named = Vec::new();
        for ip in ips {
            if !ip.is_unspecified() && !ip.is_loopback() && !named.contains(ip) {
                named.push(*ip);
                sans.push(SanType::IpAddress(*ip));
            }
        }
        let server_key = KeyPair::generate()?;
        let server = leaf(
            "setpoint-apiserver",
            None,
            sans,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?
        .signed_by(&server_key, &issuer)?;
        Ok(Pki {
            ca_cert,
            ca_key: ca_key_pem,
            server_cert: server.pem(),
            server_key: server_key.serialize_pem(),
            admin_cert,
            admin_key: admin_key_pem,
        })
    }

    /// Issues the certificate the API server presents to node agents (for `pods/log`), signed
    /// by the CA, and returns (certificate PEM, key PEM).
    pub fn issue_agent_client(&self) -> Result<(String, String), TlsError> {
        let ca_key = KeyPair::from_pem(&self.ca_key)?;
        let ca_p = ca_params()?;
        let issuer = Issuer::from_params(&ca_p, &ca_key);
        let key = KeyPair::generate()?;
        let cert = leaf(
            "setpoint-apiserver-kubelet-client",
            Some("system:masters"),
            vec![],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?
        .signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `data_dir/kubeconfig` for the admin user and returns its path.
    pub fn write_kubeconfig(&self, data_dir: &Path, server_url: &str) -> Result<PathBuf, TlsError> {
        let path = data_dir.join("kubeconfig");
        write_private(&path, self.kubeconfig(server_url))?;
        Ok(path)
    }

    /// An admin kubeconfig with the certificates embedded.
    pub fn kubeconfig(&self, server_url: &str) -> String {
        self.client_kubeconfig(server_url, "admin", &self.admin_cert, &self.admin_key)
    }

    /// A kubeconfig for `server_url` with the CA and this user's client certificate and key
    /// embedded.
    pub fn client_kubeconfig(&self, server_url: &str, user: &str, cert: &str, key: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: setpoint\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {}\nusers:\n- name: {user:?}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: setpoint\n  context:\n    cluster: setpoint\n    user: {user:?}\n    namespace: default\ncurrent-context: setpoint\n",
            b64(&self.ca_cert),
            b64(cert),
            b64(key)
        )
    }

    /// Issues a client certificate signed by the cluster CA for user `cn` in group `org` (the
    /// certificate's CN and O, as the API server reads them), returning (certificate PEM,
    /// key PEM).
    pub fn issue_client(&self, cn: &str, org: Option<&str>) -> Result<(String, String), TlsError> {
        let ca_key = KeyPair::from_pem(&self.ca_key)?;
        let ca_p = ca_params()?;
        let issuer = Issuer::from_params(&ca_p, &ca_key);
        let key = KeyPair::generate()?;
        let cert =
            leaf(cn, org, vec![], ExtendedKeyUsagePurpose::ClientAuth)?.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `path`, a kubeconfig for `server_url` as user `cn` in group `org`, with a client
    /// certificate issued for it, readable by its owner only.
    pub fn write_client_kubeconfig(
        &self,
        path: &Path,
        server_url: &str,
        cn: &str,
        org: Option<&str>,
    ) -> Result<(), TlsError> {
        let (cert, key) = self.issue_client(cn, org)?;
        write_private(path, self.client_kubeconfig(server_url, cn, &cert, &key))?;
        Ok(())
    }

    /// The rustls server configuration: our serving certificate, HTTP/2 and HTTP/1.1, and
    /// optional client certificates verified against the CA.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.server_cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Pem(e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(self.server_key.as_bytes())
            .map_err(|e| TlsError::Pem(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_cert.as_bytes()) {
            roots.add(c.map_err(|e| TlsError::Pem(e.to_string()))?)?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Pem(e.to_string()))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// Serves HTTPS until `shutdown` turns true.
pub async fn serve_tls(
    listener: TcpListener,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    config: ConnectionConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let config = Arc::new(config);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
            },
            _ = shutdown.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let config = config.clone();
        tokio::spawn(async move {
            // A client that never finishes its handshake must not hold the connection.
            let handshake =
                tokio::time::timeout(config.tls_handshake_timeout, acceptor.accept(tcp)).await;
            let stream = match handshake {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            // The handshake verified the chain against the cluster CA; the leaf's subject
            // names the user.
            let identity = match stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|leaf| certificate_user(leaf.as_ref()))
            {
                Some(user) => Identity::Certificate(Arc::new(user)),
                None => Identity::NoCertificate,
            };
            let http2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
            serve_connection(stream, router, identity, peer, &config, http2).await;
        });
    }
}

/// Serves plain HTTP (no authentication) until `shutdown` turns true.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    config: ConnectionConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = Arc::new(config);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
            },
            _ = shutdown.changed() => return,
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let config = config.clone();
        tokio::spawn(async move {
            serve_connection(tcp, router, Identity::Internal, peer, &config, false).await
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_client_certificates_name_the_user_and_group() {
        let pki = Pki::load_or_create(None, "127.0.0.1:0".parse().unwrap()).unwrap();
        let (cert, key) = pki
            .issue_client("system:node:n1", Some("system:nodes"))
            .unwrap();
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap();
        let user = certificate_user(&der).unwrap();
        assert_eq!(user.username, "system:node:n1");
        assert_eq!(user.groups, ["system:nodes", "system:authenticated"]);
        let kubeconfig =
            pki.client_kubeconfig("https://127.0.0.1:6443", "system:node:n1", &cert, &key);
        assert!(kubeconfig.contains("user: \"system:node:n1\""));
    }

    #[test]
    fn the_serving_certificate_names_the_listen_and_advertised_addresses() {
        let advertised: std::net::IpAddr = "192.0.2.7".parse().unwrap();
        let pki =
            Pki::load_or_create_naming(None, &["0.0.0.0".parse().unwrap(), advertised]).unwrap();
        let der = CertificateDer::from_pem_slice(pki.server_cert.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let ips: Vec<Vec<u8>> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::IPAddress(ip) => Some(ip.to_vec()),
                _ => None,
            })
            .collect();
        for want in [[192, 0, 2, 7], [10, 96, 0, 1], [127, 0, 0, 1]] {
            assert!(ips.contains(&want.to_vec()), "{want:?} not in {ips:?}");
        }
        assert!(!ips.contains(&vec![0, 0, 0, 0]), "{ips:?}");
    }
}
