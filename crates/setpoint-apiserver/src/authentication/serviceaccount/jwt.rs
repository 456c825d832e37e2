//! Compact JWS (JWT) encoding with ES256: `base64url(header).base64url(claims).base64url(sig)`.
//!
//! Only what service-account tokens need: the header names `alg: ES256` and the signing key's
//! `kid`; parsing refuses anything else before a signature is checked.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};

use super::key::SigningKey;

/// The one algorithm these tokens are signed with.
pub const ES256: &str = "ES256";

/// A token's parts, decoded but not yet verified.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The JOSE header.
    pub header: Value,
    /// The claims.
    pub claims: Value,
    /// `header.claims` as sent: what the signature covers.
    signing_input: String,
    /// The signature's bytes.
    signature: Vec<u8>,
}

impl Parsed {
    /// Whether the signature is `public_key`'s (an uncompressed P-256 point), with `alg` ES256.
    pub fn verify_with(&self, public_key: &[u8]) -> bool {
        self.header["alg"] == ES256
            && super::key::verify_es256(public_key, self.signing_input.as_bytes(), &self.signature)
    }

    /// Whether the signature is `key`'s.
    pub fn verify(&self, key: &SigningKey) -> bool {
        self.verify_with(key.public_key())
    }
}

/// Signs `claims` into a compact JWS with `key`.
pub fn sign(key: &SigningKey, claims: &Value) -> String {
    let header = json!({"alg": ES256, "kid": key.kid()});
    let mut token = String::new();
    token.push_str(&URL_SAFE_NO_PAD.encode(header.to_string()));
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(claims.to_string()));
    let signature = key.sign(token.as_bytes());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(signature));
    token
}

/// Splits and decodes a compact JWS; `None` when it is not one (three base64url parts, a
/// JSON object header and claims).
pub fn parse(token: &str) -> Option<Parsed> {
    let mut parts = token.split('.');
    let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let object = |part: &str| -> Option<Value> {
        let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        v.is_object().then_some(v)
    };
    Some(Parsed {
        header: object(h)?,
        claims: object(c)?,
        signing_input: token[..h.len() + 1 + c.len()].to_string(),
        signature: URL_SAFE_NO_PAD.decode(s).ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_token_parses_back_and_verifies() {
        let key = SigningKey::generate().unwrap();
        let claims = json!({"sub": "x", "exp": 5});
        let token = sign(&key, &claims);
        assert_eq!(token.split('.').count(), 3);
        let p = parse(&token).unwrap();
        assert_eq!(p.claims, claims);
        assert_eq!(p.header["kid"], key.kid());
        assert!(p.verify(&key));
        let other = SigningKey::generate().unwrap();
        assert!(!p.verify(&other));
    }

    #[test]
    fn a_tampered_token_fails() {
        let key = SigningKey::generate().unwrap();
        let token = sign(&key, &json!({"sub": "x"}));
        let parts: Vec<&str> = token.split('.').collect();
        // Other claims under the same signature.
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(r#"{"sub":"admin"}"#),
            parts[2]
        );
        assert!(!parse(&forged).unwrap().verify(&key));
        // A flipped signature bit.
        let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        sig[10] ^= 1;
        let flipped = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(sig));
        assert!(!parse(&flipped).unwrap().verify(&key));
        // `alg: none` is never accepted.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            parts[1]
        );
        assert!(!parse(&none).unwrap().verify(&key));
    }

    #[test]
    fn non_jwts_do_not_parse() {
        for t in ["", "abc", "a.b", "a.b.c.d", "!!.e30.", "e30.W10.AA"] {
            assert!(parse(t).is_none(), "{t}");
        }
    }
}
