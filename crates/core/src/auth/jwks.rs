//! A JWKS (RFC 7517) loaded into keys, each bound to one algorithm by its
//! key type (RFC 8725 §3.1): `oct` → HS256, `EC` P-256 → ES256, `OKP`
//! Ed25519 → EdDSA, `RSA` → RS256. A token's `alg` never chooses how its
//! key is used; it must be the key's.

use jsonwebtoken::jwk::{
    AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm, PublicKeyUse,
};
use jsonwebtoken::{Algorithm, DecodingKey};

/// One verification key.
pub struct Key {
    pub kid: Option<String>,
    pub alg: Algorithm,
    pub key: DecodingKey,
    /// Which key this is, across re-reads of the set: a hash of its `kid` and
    /// its parameters (the key material). A token verified with a key whose
    /// identity is still in a re-read set is valid without verifying it again
    /// ([`super::Access::grant`]). Not a secret, and not chosen by a client: the
    /// set is the operator's file.
    pub identity: u64,
}

/// The keys of a JWKS.
#[derive(Default)]
pub struct KeySet {
    keys: Vec<Key>,
}

/// Why a JWKS was refused (at start: `check-config` and `serve` say it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwksError {
    #[error("not a JWKS (a JSON object with a `keys` array of JWKs): {0}")]
    NotJwks(String),
    #[error("the set holds no key")]
    Empty,
    #[error("key {0}: {1}")]
    Key(String, String),
    #[error("key {0}: a `kid` is required when the set holds more than one key")]
    MissingKid(String),
    #[error("kid `{0}` is used twice")]
    DuplicateKid(String),
}

impl KeySet {
    pub fn from_jwks(text: &str) -> Result<KeySet, JwksError> {
        let set: JwkSet =
            serde_json::from_str(text).map_err(|e| JwksError::NotJwks(e.to_string()))?;
        if set.keys.is_empty() {
            return Err(JwksError::Empty);
        }
        let mut keys: Vec<Key> = Vec::with_capacity(set.keys.len());
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = match &jwk.common.key_id {
                Some(kid) => format!("`{kid}`"),
                None => format!("#{i}"),
            };
            let key = load(jwk).map_err(|why| JwksError::Key(name.clone(), why))?;
            if set.keys.len() > 1 && key.kid.is_none() {
                return Err(JwksError::MissingKid(name));
            }
            if let Some(kid) = &key.kid {
                if keys.iter().any(|k| k.kid.as_ref() == Some(kid)) {
                    return Err(JwksError::DuplicateKid(kid.clone()));
                }
            }
            keys.push(key);
        }
        Ok(KeySet { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set holds the key of this [`Key::identity`].
    pub fn holds(&self, identity: u64) -> bool {
        self.keys.iter().any(|k| k.identity == identity)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key a token's header names: by `kid`, or the only key when the
    /// header has none and the set holds one.
    pub fn find(&self, kid: Option<&str>) -> Option<&Key> {
        match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None if self.keys.len() == 1 => self.keys.first(),
            None => None,
        }
    }
}

/// One JWK as a verification key bound to its algorithm.
fn load(jwk: &Jwk) -> Result<Key, String> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return Err("`use` is \"enc\": not a signature key".into());
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::OctetKey(p) => {
            // RFC 7518 §3.2: an HS256 key is at least the hash's size.
            let len = p.value.trim_end_matches('=').len() * 3 / 4;
            if len < 32 {
                return Err(format!(
                    "an HS256 secret must be at least 32 bytes, this one is {len}"
                ));
            }
            Algorithm::HS256
        }
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::EllipticCurve(p) => {
            return Err(format!("curve {:?}: only P-256 (ES256) is served", p.curve))
        }
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        AlgorithmParameters::OctetKeyPair(p) => {
            return Err(format!(
                "curve {:?}: only Ed25519 (EdDSA) is served",
                p.curve
            ))
        }
        AlgorithmParameters::RSA(p) => {
            // RFC 7518 §3.3: 2048 bits or more.
            let bits = p.n.trim_end_matches('=').len() * 6;
            if bits < 2040 {
                return Err(format!(
                    "an RS256 modulus must be 2048 bits or more, this one is about {bits}"
                ));
            }
            Algorithm::RS256
        }
        _ => return Err("unknown `kty` (served: oct, EC P-256, OKP Ed25519, RSA)".into()),
    };
    if let Some(declared) = jwk.common.key_algorithm {
        let fits = matches!(
            (declared, alg),
            (KeyAlgorithm::HS256, Algorithm::HS256)
                | (KeyAlgorithm::ES256, Algorithm::ES256)
                | (KeyAlgorithm::EdDSA, Algorithm::EdDSA)
                | (KeyAlgorithm::RS256, Algorithm::RS256)
        );
        if !fits {
            return Err(format!(
                "`alg` {declared:?} does not fit its key type (which is for {alg:?})"
            ));
        }
    }
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("unusable: {e}"))?;
    Ok(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
        identity: identity(jwk),
    })
}

/// [`Key::identity`]: the same `kid` and key material hash the same in
/// every read of the file (std's SipHash with its fixed keys).
fn identity(jwk: &Jwk) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    jwk.common.key_id.hash(&mut h);
    serde_json::to_string(&jwk.algorithm)
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A set with one key of each type (made by crates/server/tests/mint_jwt.py).
    pub(crate) const JWKS: &str = include_str!("testdata/jwks.json");

    #[test]
    fn each_key_type_is_bound_to_its_algorithm() {
        let set = KeySet::from_jwks(JWKS).unwrap();
        assert_eq!(set.len(), 4);
        for (kid, alg) in [
            ("hs", Algorithm::HS256),
            ("es", Algorithm::ES256),
            ("ed", Algorithm::EdDSA),
            ("rs", Algorithm::RS256),
        ] {
            assert_eq!(set.find(Some(kid)).unwrap().alg, alg, "{kid}");
        }
        assert!(set.find(Some("nope")).is_none());
        assert!(
            set.find(None).is_none(),
            "kid required with more than one key"
        );
    }

    #[test]
    fn a_key_is_the_same_key_in_every_read_and_another_with_other_material() {
        let a = KeySet::from_jwks(JWKS).unwrap();
        let b = KeySet::from_jwks(JWKS).unwrap();
        for kid in ["hs", "es", "ed", "rs"] {
            let id = a.find(Some(kid)).unwrap().identity;
            assert!(b.holds(id), "{kid}");
        }
        let one = |kid: &str, k: &str| {
            KeySet::from_jwks(&format!(
                r#"{{"keys":[{{"kty":"oct","kid":"{kid}","k":"{k}"}}]}}"#
            ))
            .unwrap()
        };
        let secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA";
        let other = "b3RoZXItb3RoZXItb3RoZXItb3RoZXItb3RoZXItb3RoZXI";
        let id = one("a", secret).keys[0].identity;
        assert!(one("a", secret).holds(id));
        assert!(!one("a", other).holds(id), "same kid, other material");
        assert!(!one("b", secret).holds(id), "same material, other kid");
    }

    #[test]
    fn one_key_needs_no_kid() {
        let one =
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA"}]}"#;
        let set = KeySet::from_jwks(one).unwrap();
        assert_eq!(set.find(None).unwrap().alg, Algorithm::HS256);
    }

    #[test]
    fn refusals() {
        let secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA";
        let cases: &[(&str, &str)] = &[
            ("[]", "not a JWKS"),
            (r#"{"keys":[]}"#, "no key"),
            (
                r#"{"keys":[{"kty":"oct","k":"c2hvcnQ"}]}"#,
                "at least 32 bytes",
            ),
            (
                &format!(
                    r#"{{"keys":[{{"kty":"oct","k":"{secret}"}},{{"kty":"oct","kid":"b","k":"{secret}"}}]}}"#
                ),
                "`kid` is required",
            ),
            (
                &format!(
                    r#"{{"keys":[{{"kty":"oct","kid":"a","k":"{secret}"}},{{"kty":"oct","kid":"a","k":"{secret}"}}]}}"#
                ),
                "used twice",
            ),
            (
                &format!(r#"{{"keys":[{{"kty":"oct","alg":"RS256","k":"{secret}"}}]}}"#),
                "does not fit",
            ),
            (
                &format!(r#"{{"keys":[{{"kty":"oct","use":"enc","k":"{secret}"}}]}}"#),
                "not a signature key",
            ),
            (
                r#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#,
                "2048 bits",
            ),
        ];
        for (text, want) in cases {
            let e = KeySet::from_jwks(text).err().expect(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
