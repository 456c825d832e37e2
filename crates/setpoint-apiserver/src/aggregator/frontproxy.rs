//! The front-proxy identity: a CA of its own (kube-apiserver's `--requestheader-client-ca-file`
//! side) and the client certificate the API server presents to extension API servers
//! (`--proxy-client-cert-file`), with the user's identity in `X-Remote-*` headers. Extension
//! servers learn the CA and the allowed names from the `kube-system/extension-apiserver-authentication`
//! ConfigMap, as they do from kube-apiserver.

use std::path::Path;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};

use crate::authentication::UserInfo;
use crate::tls::{write_private, TlsError};

/// The client certificate's common name, the one name `requestheader-allowed-names` allows
/// (kubeadm's choice).
pub(crate) const CLIENT_NAME: &str = "front-proxy-client";
/// The header naming the user.
pub(crate) const USER_HEADER: &str = "X-Remote-User";
/// The header naming a group, once per group.
pub(crate) const GROUP_HEADER: &str = "X-Remote-Group";
/// The prefix of the headers carrying the user's extra values.
pub(crate) const EXTRA_PREFIX: &str = "X-Remote-Extra-";

/// The front-proxy CA and the client certificate it signed.
pub(crate) struct FrontProxy {
    /// The front-proxy CA's certificate (PEM).
    pub ca_pem: String,
    cert: CertificateDer<'static>,
    key_pem: String,
}

fn params(cn: &str) -> Result<CertificateParams, rcgen::Error> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(p)
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut p = params("front-proxy-ca")?;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

impl FrontProxy {
    /// Loads the CA and client certificate from `data_dir/pki` (kubeadm's file names),
    /// creating them the first time; in memory without a data dir.
    pub(crate) fn load_or_create(data_dir: Option<&Path>) -> Result<FrontProxy, TlsError> {
        let dir = data_dir.map(|d| d.join("pki"));
        const FILES: [&str; 3] = [
            "front-proxy-ca.crt",
            "front-proxy-client.crt",
            "front-proxy-client.key",
        ];
        let existing = dir.as_ref().and_then(|d| {
            let read = |n: &str| std::fs::read_to_string(d.join(n)).ok();
            Some((read(FILES[0])?, read(FILES[1])?, read(FILES[2])?))
        });
        let (ca_pem, cert_pem, key_pem) = match existing {
            Some(v) => v,
            None => {
                let ca_key = KeyPair::generate()?;
                let ca_p = ca_params()?;
                let ca = ca_p.self_signed(&ca_key)?;
                let issuer = Issuer::from_params(&ca_p, &ca_key);
                let key = KeyPair::generate()?;
                let mut client = params(CLIENT_NAME)?;
                client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                client.key_usages = vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ];
                let cert = client.signed_by(&key, &issuer)?;
                let v = (ca.pem(), cert.pem(), key.serialize_pem());
                if let Some(d) = &dir {
                    std::fs::create_dir_all(d)?;
                    std::fs::write(d.join(FILES[0]), &v.0)?;
                    write_private(&d.join("front-proxy-ca.key"), ca_key.serialize_pem())?;
                    std::fs::write(d.join(FILES[1]), &v.1)?;
                    write_private(&d.join(FILES[2]), &v.2)?;
                }
                v
            }
        };
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TlsError::Pem(format!("front-proxy-client.crt: {e}")))?;
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Pem(format!("front-proxy-client.key: {e}")))?;
        Ok(FrontProxy {
            ca_pem,
            cert,
            key_pem,
        })
    }

    /// Client TLS towards an extension server: its certificate verified against `ca_bundle`
    /// (base64 PEM, as the APIService's `caBundle`; the host's roots when empty) or not at
    /// all with `insecure`, this proxy's client certificate presented.
    pub(crate) fn client_config(
        &self,
        ca_bundle: &str,
        insecure: bool,
    ) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = if insecure {
            builder
                .dangerous()
                .with_custom_certificate_verifier(setpoint_api::tls::AnyServerCert::new(provider))
        } else {
            let roots =
                crate::webhook::client::root_store(Some(ca_bundle)).map_err(|e| match e {
                    crate::webhook::client::CallError::Config(m) => m,
                    other => other.to_string(),
                })?;
            builder.with_root_certificates(roots)
        };
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| format!("front-proxy-client.key: {e}"))?;
        let config = builder
            .with_client_auth_cert(vec![self.cert.clone()], key)
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(config))
    }
}

/// Replaces whatever `X-Remote-*` headers the caller sent (an extension server must only
/// believe the proxy's) with `user`'s name, groups and extra values.
pub(crate) fn set_identity(headers: &mut HeaderMap, user: &UserInfo) {
    let spoofed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-remote-"))
        .cloned()
        .collect();
    for name in spoofed {
        headers.remove(name);
    }
    if let Ok(v) = HeaderValue::from_str(&user.username) {
        headers.insert(USER_HEADER, v);
    }
    for group in &user.groups {
        if let Ok(v) = HeaderValue::from_str(group) {
            headers.append(GROUP_HEADER, v);
        }
    }
    for (key, values) in &user.extra {
        // Keys are escaped as URL path segments (upstream's `url.PathEscape`), since header
        // names cannot hold every character a key may.
        let name = format!("{EXTRA_PREFIX}{}", path_escape(key));
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for value in values {
            if let Ok(v) = HeaderValue::from_str(value) {
                headers.append(name.clone(), v);
            }
        }
    }
}

/// Go's `url.PathEscape`: everything but unreserved characters and the sub-delimiters a path
/// segment allows is percent-encoded.
fn path_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_' | b'.' | b'~' | b'$' | b'&' | b'+' | b',' | b';' | b'=' | b':' | b'@'
            );
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `kube-system/extension-apiserver-authentication`: how extension servers authenticate
/// requests, the keys kube-apiserver publishes (`client-ca-file` only when it verifies client
/// certificates).
pub(crate) fn authentication_config_map(client_ca: Option<&str>, front_proxy_ca: &str) -> Value {
    let list = |items: &[&str]| serde_json::to_string(items).expect("strings");
    let mut data = json!({
        "requestheader-client-ca-file": front_proxy_ca,
        "requestheader-allowed-names": list(&[CLIENT_NAME]),
        "requestheader-username-headers": list(&[USER_HEADER]),
        "requestheader-group-headers": list(&[GROUP_HEADER]),
        "requestheader-extra-headers-prefix": list(&[EXTRA_PREFIX]),
    });
    if let Some(ca) = client_ca {
        data["client-ca-file"] = json!(ca);
    }
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use std::collections::BTreeMap;

    #[test]
    fn the_callers_remote_headers_are_replaced_by_the_users() {
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", HeaderValue::from_static("mallory"));
        headers.insert("x-remote-extra-scopes", HeaderValue::from_static("all"));
        let user = UserInfo {
            username: "alice".into(),
            uid: String::new(),
            groups: vec!["dev".into(), "system:authenticated".into()],
            extra: BTreeMap::from([("example.com/team".to_string(), vec!["a".to_string()])]),
        };
        set_identity(&mut headers, &user);
        assert_eq!(headers.get_all(USER_HEADER).iter().count(), 1);
        assert_eq!(headers[USER_HEADER], "alice");
        let groups: Vec<_> = headers.get_all(GROUP_HEADER).iter().collect();
        assert_eq!(groups, ["dev", "system:authenticated"]);
        assert!(headers.get("x-remote-extra-scopes").is_none());
        assert_eq!(headers["x-remote-extra-example.com%2Fteam"], "a");
    }

    #[test]
    fn the_config_map_lists_the_request_header_settings_as_json() {
        let cm = authentication_config_map(Some("CLIENT"), "FRONT");
        assert_eq!(
            cm["data"]["requestheader-allowed-names"],
            "[\"front-proxy-client\"]"
        );
        assert_eq!(
            cm["data"]["requestheader-extra-headers-prefix"],
            "[\"X-Remote-Extra-\"]"
        );
        assert_eq!(cm["data"]["requestheader-client-ca-file"], "FRONT");
        assert_eq!(cm["data"]["client-ca-file"], "CLIENT");
    }

    #[test]
    fn a_client_config_presents_the_proxy_certificate() {
        let fp = FrontProxy::load_or_create(None).unwrap();
        assert!(fp
            .client_config("", true)
            .unwrap()
            .client_auth_cert_resolver
            .has_certs());
        let ca = base64::engine::general_purpose::STANDARD.encode(&fp.ca_pem);
        assert!(fp.client_config(&ca, false).is_ok());
        assert!(fp.client_config("not base64!", false).is_err());
    }
}
