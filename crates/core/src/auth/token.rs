//! Verifying a signed token (RFC 7519, JWS compact form) against the key
//! set, with the rules of RFC 8725: the key is found by `kid` (required when
//! the set holds more than one), the token's `alg` must be that key's (so
//! `none` and any other are refused before a signature is looked at), `exp`
//! is required, `nbf` honoured, `iss`/`aud` checked when configured, all
//! with `leeway_s`. The signature itself is `jsonwebtoken`'s.
//!
//! The time is the caller's (seconds since the epoch): this module reads no
//! clock.

use super::jwks::KeySet;
use super::scope::Scopes;
use super::JwtConfig;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;

/// Why a token was refused: each is one `error_description` of the
/// `WWW-Authenticate: Bearer error="invalid_token"` answer (RFC 6750 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `exp` (plus leeway) has passed.
    Expired,
    /// `nbf` (less leeway) is still to come.
    NotYetValid,
    /// The signature does not verify with the key, or the token's `alg` is
    /// not the key's (`none` included).
    BadSignature,
    /// No key has the token's `kid`, or it has none and the set has several.
    UnknownKey,
    /// Not a JWS of three base64url parts with JSON in them, or no `exp`.
    Malformed,
    WrongIssuer,
    WrongAudience,
    /// Not a static token, and signed tokens are not configured.
    UnknownToken,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::Expired,
        Refusal::NotYetValid,
        Refusal::BadSignature,
        Refusal::UnknownKey,
        Refusal::Malformed,
        Refusal::WrongIssuer,
        Refusal::WrongAudience,
        Refusal::UnknownToken,
    ];

    /// The `error_description`.
    pub fn description(self) -> &'static str {
        match self {
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not yet valid",
            Refusal::BadSignature => "bad signature",
            Refusal::UnknownKey => "unknown key",
            Refusal::Malformed => "malformed",
            Refusal::WrongIssuer => "wrong issuer",
            Refusal::WrongAudience => "wrong audience",
            Refusal::UnknownToken => "unknown token",
        }
    }

    /// The whole `WWW-Authenticate` value.
    pub fn www_authenticate(self) -> &'static [u8] {
        match self {
            Refusal::Expired => b"Bearer error=\"invalid_token\", error_description=\"expired\"",
            Refusal::NotYetValid => {
                b"Bearer error=\"invalid_token\", error_description=\"not yet valid\""
            }
            Refusal::BadSignature => {
                b"Bearer error=\"invalid_token\", error_description=\"bad signature\""
            }
            Refusal::UnknownKey => {
                b"Bearer error=\"invalid_token\", error_description=\"unknown key\""
            }
            Refusal::Malformed => {
                b"Bearer error=\"invalid_token\", error_description=\"malformed\""
            }
            Refusal::WrongIssuer => {
                b"Bearer error=\"invalid_token\", error_description=\"wrong issuer\""
            }
            Refusal::WrongAudience => {
                b"Bearer error=\"invalid_token\", error_description=\"wrong audience\""
            }
            Refusal::UnknownToken => {
                b"Bearer error=\"invalid_token\", error_description=\"unknown token\""
            }
        }
    }

    /// The `reason` label of `pollbox_auth_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Expired => "expired",
            Refusal::NotYetValid => "not_yet_valid",
            Refusal::BadSignature => "bad_signature",
            Refusal::UnknownKey => "unknown_key",
            Refusal::Malformed => "malformed",
            Refusal::WrongIssuer => "wrong_issuer",
            Refusal::WrongAudience => "wrong_audience",
            Refusal::UnknownToken => "unknown_token",
        }
    }
}

/// What a verified token grants, and until when.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub scopes: Scopes,
    /// `exp` plus leeway, in seconds since the epoch: valid before it.
    pub exp_s: u64,
    /// The key that verified it ([`super::jwks::Key::identity`]).
    pub key: u64,
    /// Who it names (`sub`, a string): the member it is present as
    /// (docs/presence.md).
    pub sub: Option<Box<str>>,
    /// `pollbox.info` (a JSON object, written compact): the member's info.
    pub info: Option<Box<[u8]>>,
}

/// The claims pollbox reads; the others are ignored. `iss` and `aud` are
/// checked here, not by `jsonwebtoken`: it passes a value it cannot read as
/// a string or a list of strings (`"aud": 5`, `"aud": ["pollbox", 5]`) as
/// if there were none, and takes a list for `iss`.
#[derive(Deserialize)]
struct Claims {
    exp: Option<f64>,
    nbf: Option<f64>,
    iss: Option<serde_json::Value>,
    aud: Option<serde_json::Value>,
    sub: Option<serde_json::Value>,
    #[serde(default)]
    pollbox: ScopeClaim,
}

#[derive(Deserialize, Default)]
struct ScopeClaim {
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    info: Option<serde_json::Value>,
}

/// The key set and the claim rules of `[auth.jwt]`.
pub struct Verifier {
    keys: KeySet,
    /// One per algorithm, the key's: index by [`alg_index`].
    validations: [Validation; 4],
    leeway_s: u64,
    /// `[auth.jwt]` `issuer` and `audience`; "" = not checked.
    issuer: String,
    audience: String,
}

fn alg_index(alg: Algorithm) -> Option<usize> {
    match alg {
        Algorithm::HS256 => Some(0),
        Algorithm::ES256 => Some(1),
        Algorithm::EdDSA => Some(2),
        Algorithm::RS256 => Some(3),
        _ => None,
    }
}

impl Verifier {
    pub fn new(keys: KeySet, config: &JwtConfig) -> Verifier {
        let validation = |alg| {
            let mut v = Validation::new(alg);
            // Times are checked here, against the caller's clock, and so
            // are `iss` and `aud` (see `Claims`): jsonwebtoken checks the
            // signature and the algorithm only.
            v.validate_exp = false;
            v.validate_nbf = false;
            v.validate_aud = false;
            v.required_spec_claims.clear();
            v
        };
        Verifier {
            keys,
            validations: [
                validation(Algorithm::HS256),
                validation(Algorithm::ES256),
                validation(Algorithm::EdDSA),
                validation(Algorithm::RS256),
            ],
            leeway_s: config.leeway_s,
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
        }
    }

    /// The key set.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// Verify `token` at `now_s` (seconds since the epoch).
    pub fn verify(&self, token: &[u8], now_s: u64) -> Result<Verified, Refusal> {
        let header = match jsonwebtoken::decode_header(token) {
            Ok(h) => h,
            // `alg: none` (and any algorithm jsonwebtoken does not know) does not
            // parse as a header: an unsigned token is a bad signature, the rest
            // malformed.
            Err(_) if declares_none(token) => return Err(Refusal::BadSignature),
            Err(_) => return Err(Refusal::Malformed),
        };
        // RFC 7515 §4.1.11: `crit` lists extensions the recipient must
        // understand or refuse the token; pollbox understands none.
        if header.crit.is_some() {
            return Err(Refusal::Malformed);
        }
        let key = self
            .keys
            .find(header.kid.as_deref())
            .ok_or(Refusal::UnknownKey)?;
        if header.alg != key.alg {
            return Err(Refusal::BadSignature);
        }
        let validation = alg_index(key.alg)
            .map(|i| &self.validations[i])
            .ok_or(Refusal::BadSignature)?;
        let data =
            jsonwebtoken::decode::<Claims>(token, &key.key, validation).map_err(|e| {
                match e.kind() {
                    ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => {
                        Refusal::BadSignature
                    }
                    _ => Refusal::Malformed,
                }
            })?;
        let c = data.claims;
        if !self.issuer.is_empty() && !is_string(c.iss.as_ref(), &self.issuer) {
            return Err(Refusal::WrongIssuer);
        }
        if !self.audience.is_empty() && !names_audience(c.aud.as_ref(), &self.audience) {
            return Err(Refusal::WrongAudience);
        }
        let exp = c
            .exp
            .filter(|e| e.is_finite() && *e >= 0.0)
            .ok_or(Refusal::Malformed)? as u64;
        if now_s >= exp.saturating_add(self.leeway_s) {
            return Err(Refusal::Expired);
        }
        if let Some(nbf) = c.nbf {
            if !nbf.is_finite() {
                return Err(Refusal::Malformed);
            }
            if nbf > now_s.saturating_add(self.leeway_s) as f64 {
                return Err(Refusal::NotYetValid);
            }
        }
        let scopes = Scopes::new(
            c.pollbox.read.iter().map(String::as_str),
            c.pollbox.write.iter().map(String::as_str),
        );
        let info = c
            .pollbox
            .info
            .filter(serde_json::Value::is_object)
            .and_then(|v| serde_json::to_vec(&v).ok())
            .map(Vec::into_boxed_slice);
        Ok(Verified {
            scopes,
            exp_s: exp.saturating_add(self.leeway_s),
            key: key.identity,
            sub: c.sub.as_ref().and_then(|s| s.as_str()).map(Into::into),
            info,
        })
    }
}

/// `iss` (RFC 7519 §4.1.1): a string, this one.
fn is_string(claim: Option<&serde_json::Value>, want: &str) -> bool {
    matches!(claim, Some(serde_json::Value::String(s)) if s == want)
}

/// `aud` (RFC 7519 §4.1.3): this string, or an array of strings holding it.
fn names_audience(claim: Option<&serde_json::Value>, want: &str) -> bool {
    match claim {
        Some(serde_json::Value::Array(all)) => {
            all.iter().all(serde_json::Value::is_string) && all.iter().any(|a| a == want)
        }
        other => is_string(other, want),
    }
}

/// Whether a token's header (base64url JSON) says `"alg":"none"` in any case.
fn declares_none(token: &[u8]) -> bool {
    use base64::Engine;
    let head = token.split(|&b| b == b'.').next().unwrap_or(b"");
    let Ok(json) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(head) else {
        return false;
    };
    #[derive(Deserialize)]
    struct Head {
        alg: String,
    }
    serde_json::from_slice::<Head>(&json).is_ok_and(|h| h.alg.eq_ignore_ascii_case("none"))
}

#[cfg(test)]
mod tests {
    use super::super::jwks::tests::JWKS;
    use super::*;
    use std::collections::HashMap;

    fn tokens() -> HashMap<String, String> {
        serde_json::from_str(include_str!("testdata/tokens.json")).unwrap()
    }

    fn verifier(issuer: &str, audience: &str) -> Verifier {
        let config = JwtConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            leeway_s: 30,
            ..JwtConfig::default()
        };
        Verifier::new(KeySet::from_jwks(JWKS).unwrap(), &config)
    }

    #[test]
    fn every_algorithm_verifies_with_its_key() {
        let t = tokens();
        let v = verifier("game", "pollbox");
        for kid in ["hs", "es", "ed", "rs"] {
            let got = v.verify(t[kid].as_bytes(), 1500).expect(kid);
            assert_eq!(got.exp_s, 2030, "{kid}: exp plus leeway");
            assert_eq!(got.scopes, Scopes::new(["room-17/*"], ["room-17/alice"]));
        }
    }

    #[test]
    fn each_refusal_says_why() {
        let t = tokens();
        let v = verifier("game", "pollbox");
        let cases = [
            ("hs_with_public_key", Refusal::BadSignature),
            ("rs_header_on_es_key", Refusal::BadSignature),
            ("none", Refusal::BadSignature),
            ("unknown_kid", Refusal::UnknownKey),
            ("no_kid", Refusal::UnknownKey),
            ("tampered", Refusal::BadSignature),
            ("wrong_iss", Refusal::WrongIssuer),
            ("wrong_aud", Refusal::WrongAudience),
        ];
        for (name, want) in cases {
            assert_eq!(v.verify(t[name].as_bytes(), 1500), Err(want), "{name}");
        }
        let open = verifier("", "");
        assert_eq!(
            open.verify(t["no_exp"].as_bytes(), 1500),
            Err(Refusal::Malformed)
        );
        for junk in [&b""[..], b"abc", b"a.b.c", b"..", b"eyJ.eyJ.x"] {
            assert_eq!(v.verify(junk, 1500), Err(Refusal::Malformed));
        }
    }

    #[test]
    fn times_with_leeway() {
        let t = tokens();
        let v = verifier("", "");
        let es = t["es"].as_bytes();
        // nbf 1000, exp 2000, leeway 30.
        assert_eq!(v.verify(es, 969), Err(Refusal::NotYetValid));
        assert!(v.verify(es, 970).is_ok());
        assert!(v.verify(es, 2029).is_ok());
        assert_eq!(v.verify(es, 2030), Err(Refusal::Expired));
    }

    #[test]
    fn issuer_and_audience_only_when_configured() {
        let t = tokens();
        let open = verifier("", "");
        for name in ["wrong_iss", "wrong_aud", "no_scope"] {
            assert!(open.verify(t[name].as_bytes(), 1500).is_ok(), "{name}");
        }
        // Configured: a token without the claim is refused too.
        let strict = verifier("game", "pollbox");
        assert_eq!(
            strict.verify(t["no_scope"].as_bytes(), 1500),
            Err(Refusal::WrongIssuer)
        );
        assert_eq!(
            open.verify(t["no_scope"].as_bytes(), 1500).unwrap().scopes,
            Scopes::default()
        );
    }

    /// An HS256 token of the test set's key `hs`, with these claims and
    /// header changes.
    fn hs_token(claims: serde_json::Value, crit: Option<Vec<String>>) -> String {
        use base64::Engine;
        let jwks: serde_json::Value = serde_json::from_str(JWKS).unwrap();
        let k = jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["kid"] == "hs")
            .unwrap()["k"]
            .as_str()
            .unwrap()
            .to_string();
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(k)
            .unwrap();
        let mut header = jsonwebtoken::Header::new(Algorithm::HS256);
        header.kid = Some("hs".into());
        header.crit = crit;
        let key = jsonwebtoken::EncodingKey::from_secret(&secret);
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    }

    /// Found by the fuzz target `auth` (fuzz/fuzz_targets/auth.rs):
    /// jsonwebtoken passes an `iss` or `aud` it cannot read as strings, so a
    /// token with `"aud": 5` or `"aud": ["pollbox", 5]` got past a configured
    /// audience.
    #[test]
    fn issuer_and_audience_must_be_strings() {
        use serde_json::json;
        let v = verifier("game", "pollbox");
        let cases = [
            (
                json!({"iss": 5, "aud": "pollbox"}),
                Err(Refusal::WrongIssuer),
            ),
            (
                json!({"iss": ["game"], "aud": "pollbox"}),
                Err(Refusal::WrongIssuer),
            ),
            (
                json!({"iss": {}, "aud": "pollbox"}),
                Err(Refusal::WrongIssuer),
            ),
            (
                json!({"iss": "game", "aud": 5}),
                Err(Refusal::WrongAudience),
            ),
            (
                json!({"iss": "game", "aud": ["pollbox", 5]}),
                Err(Refusal::WrongAudience),
            ),
            (
                json!({"iss": "game", "aud": {"pollbox": 1}}),
                Err(Refusal::WrongAudience),
            ),
            (
                json!({"iss": "game", "aud": []}),
                Err(Refusal::WrongAudience),
            ),
            (json!({"iss": "game", "aud": ["x", "pollbox"]}), Ok(2030)),
            (json!({"iss": "game", "aud": "pollbox"}), Ok(2030)),
        ];
        for (mut claims, want) in cases {
            claims["exp"] = json!(2000);
            let t = hs_token(claims.clone(), None);
            assert_eq!(
                v.verify(t.as_bytes(), 1500).map(|t| t.exp_s),
                want,
                "{claims}"
            );
        }
        // Not configured: not looked at.
        let t = hs_token(json!({"exp": 2000, "iss": 5, "aud": [5]}), None);
        assert!(verifier("", "").verify(t.as_bytes(), 1500).is_ok());
    }

    /// A `crit` header names extensions that must be understood (RFC 7515
    /// §4.1.11); pollbox understands none.
    #[test]
    fn a_critical_extension_is_refused() {
        let v = verifier("", "");
        let claims = serde_json::json!({"exp": 2000});
        assert!(v
            .verify(hs_token(claims.clone(), None).as_bytes(), 1500)
            .is_ok());
        let crit = hs_token(claims, Some(vec!["exp".into()]));
        assert_eq!(v.verify(crit.as_bytes(), 1500), Err(Refusal::Malformed));
    }

    #[test]
    fn descriptions_are_in_the_header() {
        for r in Refusal::ALL {
            let h = std::str::from_utf8(r.www_authenticate()).unwrap();
            assert_eq!(
                h,
                format!(
                    "Bearer error=\"invalid_token\", error_description=\"{}\"",
                    r.description()
                )
            );
        }
    }
}
