//! The service-account signing key: an ECDSA P-256 key (ES256), kept as PKCS#8.
//!
//! Where it lives decides who shares it:
//! - with a shared store (etcd, several API servers), under [`STORE_KEY`] in the store: the
//!   first server to start writes it with `Precondition::NotExists` and every server uses the
//!   one that won, so a token minted by one server verifies on all of them;
//! - else, with a data dir, in `sa.key` there (mode 0600), so tokens survive restarts;
//! - else (tests) only in memory.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
use serde_json::{json, Value};
use setpoint_store::{Precondition, Store, StoreError};

/// The store key the shared signing key is kept under (outside every resource's prefix, so no
/// watch cache or list ever serves it).
pub const STORE_KEY: &str = "/registry/_keys/service-account";

/// The file name of the key in the data dir.
pub const KEY_FILE: &str = "sa.key";

/// The DER prefix of a P-256 public key's SubjectPublicKeyInfo (id-ecPublicKey, prime256v1,
/// then a BIT STRING of the 65-byte uncompressed point): what Go's `MarshalPKIXPublicKey`
/// writes, which upstream hashes into the key id.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// Why a key could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The PKCS#8 bytes are not a P-256 ECDSA key.
    #[error("not an ECDSA P-256 PKCS#8 key: {0}")]
    Rejected(String),
    /// Generating a key failed.
    #[error("generating a key failed")]
    Generate,
    /// Reading or writing the key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// Reading or writing the shared key in the store failed.
    #[error("the shared key in the store: {0}")]
    Store(#[from] StoreError),
}

/// An ES256 signing key with its public half and key id.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    pkcs8: Vec<u8>,
    kid: String,
    rng: SystemRandom,
}

impl std::fmt::Debug for SigningKey {
    // Never print the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .finish()
    }
}

impl SigningKey {
    /// A fresh random key.
    pub fn generate() -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let doc = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| KeyError::Generate)?;
        SigningKey::from_pkcs8(doc.as_ref())
    }

    /// The key in these PKCS#8 bytes.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let pair =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng)
                .map_err(|e| KeyError::Rejected(e.to_string()))?;
        let kid = key_id(pair.public_key().as_ref());
        Ok(SigningKey {
            pair,
            pkcs8: pkcs8.to_vec(),
            kid,
            rng,
        })
    }

    /// The key id: upstream's, the unpadded base64url SHA-256 of the public key's DER
    /// SubjectPublicKeyInfo.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The PKCS#8 encoding of the key.
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    /// The public key: the 65-byte uncompressed point.
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// An ES256 signature (r ‖ s, 64 bytes, as JWS wants it) of `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        // Signing with a valid key pair fails only if the system's random source does, which
        // ring treats as fatal everywhere else too.
        self.pair
            .sign(&self.rng, message)
            .expect("the system random source works")
            .as_ref()
            .to_vec()
    }

    /// Whether `signature` is this key's ES256 signature of `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        verify_es256(self.public_key(), message, signature)
    }

    /// The public key as a JSON Web Key (`kty: EC`, `crv: P-256`, `x`, `y`, `kid`, `use: sig`,
    /// `alg: ES256`), as `/openid/v1/jwks` lists it.
    pub fn jwk(&self) -> Value {
        let point = self.public_key();
        json!({
            "use": "sig",
            "kty": "EC",
            "kid": self.kid,
            "crv": "P-256",
            "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
        })
    }

    /// The key this server uses: the shared one in `store` when several servers share it,
    /// else `sa.key` in `data_dir`, else a new one kept in memory.
    pub async fn load_or_create(
        store: &dyn Store,
        shared: bool,
        data_dir: Option<&Path>,
    ) -> Result<SigningKey, KeyError> {
        if shared {
            return SigningKey::shared(store, data_dir).await;
        }
        match data_dir {
            Some(dir) => SigningKey::file(&dir.join(KEY_FILE)),
            None => SigningKey::generate(),
        }
    }

    /// The key in the store, written there first if no server has yet (this server's
    /// `sa.key`, if it has one, else a new key).
    async fn shared(store: &dyn Store, data_dir: Option<&Path>) -> Result<SigningKey, KeyError> {
        if let Some(kv) = store.get(STORE_KEY).await? {
            return SigningKey::from_pkcs8(&kv.value);
        }
        let candidate = match data_dir.map(|d| d.join(KEY_FILE)) {
            Some(path) if path.exists() => SigningKey::file(&path)?,
            _ => SigningKey::generate()?,
        };
        match store
            .put(
                STORE_KEY,
                Bytes::copy_from_slice(candidate.pkcs8()),
                Precondition::NotExists,
            )
            .await
        {
            Ok(_) => Ok(candidate),
            // Another server won the race: everyone uses its key.
            Err(e @ StoreError::AlreadyExists { .. }) => match store.get(STORE_KEY).await? {
                Some(kv) => SigningKey::from_pkcs8(&kv.value),
                None => Err(KeyError::Store(e)),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// The key in `path`, created (mode 0600) if the file does not exist.
    fn file(path: &Path) -> Result<SigningKey, KeyError> {
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        match std::fs::read(path) {
            Ok(bytes) => SigningKey::from_pkcs8(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = SigningKey::generate()?;
                write_private(path, key.pkcs8()).map_err(io)?;
                Ok(key)
            }
            Err(e) => Err(io(e)),
        }
    }
}

/// Writes `bytes` to a new file readable only by its owner.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Whether `signature` (r ‖ s) is a valid ES256 signature of `message` by the P-256 public
/// key `public_key` (an uncompressed point).
pub fn verify_es256(public_key: &[u8], message: &[u8], signature: &[u8]) -> bool {
    UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, public_key)
        .verify(message, signature)
        .is_ok()
}

/// Upstream's key id of a P-256 public key (an uncompressed point).
fn key_id(point: &[u8]) -> String {
    let mut der = P256_SPKI_PREFIX.to_vec();
    der.extend_from_slice(point);
    URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, &der))
}

/// The P-256 public key (an uncompressed point) a JWK names, if it is one.
pub fn public_key_of_jwk(jwk: &Value) -> Option<Vec<u8>> {
    if jwk["kty"] != "EC" || jwk["crv"] != "P-256" {
        return None;
    }
    let x = URL_SAFE_NO_PAD.decode(jwk["x"].as_str()?).ok()?;
    let y = URL_SAFE_NO_PAD.decode(jwk["y"].as_str()?).ok()?;
    if x.len() != 32 || y.len() != 32 {
        return None;
    }
    let mut point = vec![0x04];
    point.extend_from_slice(&x);
    point.extend_from_slice(&y);
    Some(point)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_survives_its_pkcs8_and_signs_verifiably() {
        let key = SigningKey::generate().unwrap();
        let again = SigningKey::from_pkcs8(key.pkcs8()).unwrap();
        assert_eq!(key.kid(), again.kid());
        let sig = key.sign(b"message");
        assert_eq!(sig.len(), 64);
        assert!(again.verify(b"message", &sig));
        assert!(!again.verify(b"messagf", &sig));
        assert!(SigningKey::from_pkcs8(b"not a key").is_err());
        // The kid is a base64url SHA-256: 43 characters without padding.
        assert_eq!(key.kid().len(), 43);
    }

    #[test]
    fn the_jwk_names_the_public_key() {
        let key = SigningKey::generate().unwrap();
        let jwk = key.jwk();
        assert_eq!(
            (jwk["alg"].as_str(), jwk["use"].as_str()),
            (Some("ES256"), Some("sig"))
        );
        assert_eq!(public_key_of_jwk(&jwk).unwrap(), key.public_key());
    }

    #[test]
    fn the_key_file_is_made_once_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let a = SigningKey::file(&path).unwrap();
        let b = SigningKey::file(&path).unwrap();
        assert_eq!(a.kid(), b.kid());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[tokio::test]
    async fn servers_on_one_store_share_the_first_key() {
        let store = setpoint_store::memory::MemoryStore::default();
        let a = SigningKey::load_or_create(&store, true, None)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        // A second server with a key of its own in its data dir still takes the shared one.
        SigningKey::file(&dir.path().join(KEY_FILE)).unwrap();
        let b = SigningKey::load_or_create(&store, true, Some(dir.path()))
            .await
            .unwrap();
        assert_eq!(a.kid(), b.kid());
    }
}
