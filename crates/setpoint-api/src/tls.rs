//! The one TLS rule the components share: a client that does not verify who the server is.
//!
//! Kubernetes skips server verification in three places, and so does Setpoint: HTTPS probes
//! (containers serve self-signed certificates), the API server's connections to node agents
//! (kube-apiserver verifies kubelets only when given `--kubelet-certificate-authority`), and a
//! kubeconfig with `insecure-skip-tls-verify: true`. The handshake signatures are still
//! checked, so the connection is encrypted to whoever holds the certificate's key.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::DigitallySignedStruct;

/// Accepts any server certificate; checks the handshake signatures with the provider's
/// algorithms.
#[derive(Debug)]
pub struct AnyServerCert(Arc<CryptoProvider>);

impl AnyServerCert {
    /// With `provider`'s signature algorithms.
    pub fn new(provider: Arc<CryptoProvider>) -> Arc<AnyServerCert> {
        Arc::new(AnyServerCert(provider))
    }

    /// With ring's algorithms (the provider the whole workspace uses).
    pub fn ring() -> Arc<AnyServerCert> {
        AnyServerCert::new(Arc::new(rustls::crypto::ring::default_provider()))
    }
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
