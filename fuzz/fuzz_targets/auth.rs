//! Fuzz target `auth`: where a request's token is found (`Authorization:
//! Bearer`, the cookie, `?access_token=`), what a connection's cached verdict
//! says, and the signed-token verifier, with an HS256 key, an EdDSA key, and
//! a set of both.
//!
//! Input layout (everything derived from the fuzzer's bytes):
//! - byte 0: the key set (HS256, EdDSA, both), `% 3`;
//! - byte 1: bit 0 `issuer`/`audience` configured ("game", "pollbox"), bit 1
//!   `query_param`, bits 2-3 the cookie name ("pollbox_token", "", "t", "a b");
//! - bytes 2-3: the time, 1000 + a little-endian `u16` seconds;
//! - byte 4: the mode, `% 3`:
//!   - 0: the rest is a request stream, framed as the server frames it, and a
//!     token, given to the verifier and to the three token finders as it is;
//!   - 1: the rest describes a token built and signed here (header choices,
//!     claims, which key signs), then edited at the positions it names: with
//!     no edit the verdict must be the model's, exactly;
//!   - 2: the rest is a header and claims JSON (split at the first 0 byte),
//!     signed here with the key the header names, then edited.
//!
//! Properties:
//! - nothing panics;
//! - a token found lies inside the request, in its head or its query, is not
//!   empty and holds no line break; a well-formed token put in the header, the
//!   cookie or the query is found there, as it is, when that place is on;
//! - a verdict is the same from the connection's cache as from a fresh
//!   connection, at the same time or later;
//! - the verifier accepts a token only when it is signed: three base64url
//!   parts, the header's `alg` the key's and its `kid` the key's, no `crit`,
//!   the signature (checked here with `hmac-sha256` and `ed25519-compact`, not
//!   the verifier's crates) over the first two parts, `exp` a number not past,
//!   `nbf` not to come, `iss`/`aud` a string equal to the configured one (`aud`:
//!   or an array of strings holding it); and it grants exactly the token's
//!   `pollbox` scopes until `exp` plus the leeway.
#![no_main]

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use pollbox_core::auth::{self, Access, Credentials, Denied, KeySet, Refusal, Scopes, Verifier};
use pollbox_core::config::{AuthConfig, JwtConfig, StaticTokenConfig};
use pollbox_core::http::{Framer, Limits, Progress};
use serde_json::{json, Value};
use std::sync::OnceLock;

const HS_SECRET: &[u8] = b"pollbox-fuzz-hs256-secret-0123456789";
const ED_SEED: [u8; 32] = [0x42; 32];
const LEEWAY_S: u64 = 30;
const ISSUER: &str = "game";
const AUDIENCE: &str = "pollbox";
const COOKIES: [&str; 4] = ["pollbox_token", "", "t", "a b"];
const INGEST: &str = "ingest-secret";
const STATIC: &str = "static-secret";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Alg {
    Hs256,
    EdDsa,
}

impl Alg {
    fn name(self) -> &'static str {
        match self {
            Alg::Hs256 => "HS256",
            Alg::EdDsa => "EdDSA",
        }
    }
    fn kid(self) -> &'static str {
        match self {
            Alg::Hs256 => "hs",
            Alg::EdDsa => "ed",
        }
    }
}

/// The key sets: HS256 alone, EdDSA alone, both.
const SETS: [&[Alg]; 3] = [&[Alg::Hs256], &[Alg::EdDsa], &[Alg::Hs256, Alg::EdDsa]];

fn ed_pair() -> &'static ed25519_compact::KeyPair {
    static PAIR: OnceLock<ed25519_compact::KeyPair> = OnceLock::new();
    PAIR.get_or_init(|| ed25519_compact::KeyPair::from_seed(ed25519_compact::Seed::new(ED_SEED)))
}

fn jwks(set: &[Alg]) -> String {
    let keys: Vec<Value> = set
        .iter()
        .map(|a| match a {
            Alg::Hs256 => {
                json!({"kty": "oct", "kid": "hs", "alg": "HS256", "k": B64.encode(HS_SECRET)})
            }
            Alg::EdDsa => json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "alg": "EdDSA",
                                  "x": B64.encode(ed_pair().pk.as_ref())}),
        })
        .collect();
    json!({ "keys": keys }).to_string()
}

fn jwt_config(set: &[Alg], checked: bool, cookie: &str, query_param: bool) -> JwtConfig {
    JwtConfig {
        keys_file: "jwks.json".into(),
        keys: jwks(set),
        issuer: if checked {
            ISSUER.into()
        } else {
            String::new()
        },
        audience: if checked {
            AUDIENCE.into()
        } else {
            String::new()
        },
        leeway_s: LEEWAY_S,
        cookie: cookie.into(),
        query_param,
    }
}

/// One verifier per key set and claim checks: `[set][checked]`.
fn verifiers() -> &'static Vec<[Verifier; 2]> {
    static V: OnceLock<Vec<[Verifier; 2]>> = OnceLock::new();
    V.get_or_init(|| {
        SETS.iter()
            .map(|set| {
                [false, true].map(|checked| {
                    let c = jwt_config(set, checked, "", false);
                    let keys = KeySet::from_jwks(&c.keys).expect("the fuzz key set loads");
                    Verifier::new(keys, &c)
                })
            })
            .collect()
    })
}

/// One `Access` per key set and config byte: `[set][byte 1 % 16]`.
fn accesses() -> &'static Vec<Vec<Access>> {
    static A: OnceLock<Vec<Vec<Access>>> = OnceLock::new();
    A.get_or_init(|| {
        SETS.iter()
            .map(|set| {
                (0u8..16)
                    .map(|b| {
                        let (checked, query, cookie) = config_bits(b);
                        let auth = AuthConfig {
                            ingest_tokens: vec![INGEST.into()],
                            token: vec![StaticTokenConfig {
                                token: STATIC.into(),
                                read: vec!["room-1/*".into()],
                                ..Default::default()
                            }],
                            jwt: jwt_config(set, checked, cookie, query),
                            ..AuthConfig::default()
                        };
                        Access::new(&auth).expect("the fuzz access config loads")
                    })
                    .collect()
            })
            .collect()
    })
}

fn config_bits(b: u8) -> (bool, bool, &'static str) {
    (b & 1 != 0, b & 2 != 0, COOKIES[usize::from((b >> 2) & 3)])
}

struct Case<'a> {
    set: usize,
    checked: bool,
    query_param: bool,
    cookie: &'static str,
    access: &'a Access,
    verifier: &'a Verifier,
    now_s: u64,
}

fuzz_target!(|data: &[u8]| {
    let Some((&[set, conf, t0, t1, mode], rest)) = data.split_first_chunk::<5>() else {
        return;
    };
    let set = usize::from(set % 3);
    let (checked, query_param, cookie) = config_bits(conf & 15);
    let case = Case {
        set,
        checked,
        query_param,
        cookie,
        access: &accesses()[set][usize::from(conf & 15)],
        verifier: &verifiers()[set][usize::from(checked)],
        now_s: 1000 + u64::from(u16::from_le_bytes([t0, t1])),
    };
    match mode % 3 {
        0 => raw(&case, rest),
        1 => modelled(&case, rest),
        _ => signed_json(&case, rest),
    }
});

// ---------------------------------------------------------------------------
// Mode 0: arbitrary bytes

fn raw(case: &Case, bytes: &[u8]) {
    check_verdict(
        case,
        case.now_s,
        bytes,
        case.verifier.verify(bytes, case.now_s),
    );
    inside(bytes, auth::bearer(bytes), "bearer");
    for name in COOKIES {
        inside(bytes, auth::cookie(bytes, name.as_bytes()), "cookie");
    }
    inside(bytes, auth::query_token(bytes), "query_token");
    // The same bytes as requests on one connection.
    let limits = Limits {
        max_header_bytes: 8192,
        max_headers: 64,
        max_body_bytes: 1 << 16,
    };
    let mut buf = bytes.to_vec();
    let mut framer = Framer::new(limits);
    let mut at = 0;
    let mut creds = Credentials::default();
    while let Ok(Progress::Complete(frame)) = framer.advance(&mut buf[at..]) {
        let req = &buf[at..at + frame.consumed];
        let found = case.access.presented(&frame, req);
        if let Some(t) = found {
            let head = &req[..frame.body.start];
            let query = &req[frame.query.clone()];
            assert!(
                within(head, t) || within(query, t),
                "token {t:?} neither in the head nor in the query"
            );
            assert!(!t.is_empty(), "an empty token");
            assert!(
                !t.contains(&b'\n') && !t.contains(&b'\r'),
                "a line break in {t:?}"
            );
        }
        grant_is_cached_faithfully(case, &mut creds, found);
        at += frame.consumed;
    }
}

/// `found` is a non-empty slice of `input`.
fn inside(input: &[u8], found: Option<&[u8]>, what: &str) {
    if let Some(t) = found {
        assert!(
            within(input, t),
            "{what}: {t:?} is not a slice of the input"
        );
        assert!(!t.is_empty(), "{what}: empty token");
    }
}

fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr() as usize, inner.as_ptr() as usize);
    i >= o && i + inner.len() <= o + outer.len()
}

/// The verdict on `token` from a connection's cache, now and a little later,
/// is the verdict of a fresh connection then.
fn grant_is_cached_faithfully(case: &Case, creds: &mut Credentials, token: Option<&[u8]>) {
    let owned = |r: Result<&Scopes, Denied>| r.cloned();
    for later in [0, 1, LEEWAY_S, 5000] {
        let now = case.now_s + later;
        let cached = owned(case.access.grant(creds, token, now));
        let fresh = owned(case.access.grant(&mut Credentials::default(), token, now));
        assert_eq!(
            cached, fresh,
            "cached and fresh verdicts differ at +{later} s"
        );
        if let (Ok(_), Some(t)) = (&fresh, token) {
            if t != INGEST.as_bytes() && t != STATIC.as_bytes() {
                let checked = case.checked;
                let v = &verifiers()[case.set][usize::from(checked)];
                check_verdict(case, now, t, v.verify(t, now));
                assert!(v.verify(t, now).is_ok(), "granted but not verified");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Mode 1: a token built from a model of the rules

#[derive(Debug)]
struct Model {
    /// The key that signs (`None`: a signature of zeros).
    signer: Option<Alg>,
    alg: &'static str,
    kid: Option<&'static str>,
    crit: bool,
    exp: Value,
    nbf: Value,
    iss: Value,
    aud: Value,
    read: Vec<String>,
    write: Vec<String>,
}

fn modelled(case: &Case, bytes: &[u8]) {
    let Some((&[h, s, e0, e1, ek, n0, n1, nk, ia], edits)) = bytes.split_first_chunk::<9>() else {
        return;
    };
    let set = SETS[case.set];
    let signer = match s % 4 {
        0 | 1 => Some(set[usize::from(s / 4) % set.len()]),
        2 => Some(if set[0] == Alg::Hs256 {
            Alg::EdDsa
        } else {
            Alg::Hs256
        }),
        _ => None,
    };
    let alg = ["HS256", "EdDSA", "none", "RS256", "ES256", "HS512"][usize::from(h % 6)];
    let kid = [Some("hs"), Some("ed"), None, Some("other")][usize::from((h / 6) % 4)];
    let num = |lo: u8, hi: u8, kind: u8| -> Value {
        let n = 900 + u64::from(u16::from_le_bytes([lo, hi]));
        match kind % 6 {
            0 => Value::Null, // absent
            1 | 2 => json!(n),
            3 => json!(n as f64 + 0.5),
            4 => json!(-(n as i64)),
            _ => json!(n.to_string()),
        }
    };
    let iss = [
        Value::Null,
        json!(ISSUER),
        json!("other"),
        json!(5),
        json!([ISSUER]),
    ][usize::from(ia % 5)]
    .clone();
    let aud = [
        Value::Null,
        json!(AUDIENCE),
        json!("other"),
        json!(["x", AUDIENCE]),
        json!(["x"]),
        json!(5),
        json!([]),
        json!([AUDIENCE, 5]),
    ][usize::from((ia / 5) % 8)]
    .clone();
    let m = Model {
        signer,
        alg,
        kid,
        crit: h >= 240,
        exp: num(e0, e1, ek),
        nbf: num(n0, n1, nk % 4),
        iss,
        aud,
        read: vec![format!("room-{}/*", ek % 3)],
        write: if nk & 8 != 0 {
            vec!["*".into()]
        } else {
            Vec::new()
        },
    };
    let mut header = json!({"alg": m.alg, "typ": "JWT"});
    if let Some(kid) = m.kid {
        header["kid"] = json!(kid);
    }
    if m.crit {
        header["crit"] = json!(["exp"]);
    }
    let mut claims = json!({"pollbox": {"read": m.read, "write": m.write}});
    for (name, v) in [
        ("exp", &m.exp),
        ("nbf", &m.nbf),
        ("iss", &m.iss),
        ("aud", &m.aud),
    ] {
        if !v.is_null() {
            claims[name] = v.clone();
        }
    }
    let token = sign(
        m.signer,
        header.to_string().as_bytes(),
        claims.to_string().as_bytes(),
    );
    let got = case.verifier.verify(&token, case.now_s);
    let edited = edit(&token, edits);
    if edited == token {
        // The key's identity (which key of the set verified it) is not
        // modelled: compared without it.
        let strip = |r: Result<auth::Verified, Refusal>| r.map(|v| (v.scopes, v.exp_s));
        assert_eq!(strip(got), strip(expected(case, &m)), "model {m:?}");
    }
    let verdict = case.verifier.verify(&edited, case.now_s);
    check_verdict(case, case.now_s, &edited, verdict);
    placed(case, &edited, edits.first().copied().unwrap_or(0));
}

/// What the rules say of the token `m` describes.
fn expected(case: &Case, m: &Model) -> Result<auth::Verified, Refusal> {
    let set = SETS[case.set];
    if m.alg == "none" {
        return Err(Refusal::BadSignature);
    }
    // RFC 7515 §4.1.11: `crit` names extensions that must be understood, and
    // pollbox understands none.
    if m.crit {
        return Err(Refusal::Malformed);
    }
    let key = match m.kid {
        Some(kid) => set.iter().find(|a| a.kid() == kid),
        None if set.len() == 1 => set.first(),
        None => None,
    }
    .copied()
    .ok_or(Refusal::UnknownKey)?;
    if m.alg != key.name() || m.signer != Some(key) {
        return Err(Refusal::BadSignature);
    }
    let number = |v: &Value| v.as_f64();
    if m.exp.is_string() || m.nbf.is_string() {
        return Err(Refusal::Malformed); // not a number: the claims do not parse
    }
    if case.checked {
        if m.iss != json!(ISSUER) {
            return Err(Refusal::WrongIssuer);
        }
        if !aud_holds(&m.aud) {
            return Err(Refusal::WrongAudience);
        }
    }
    let exp = number(&m.exp)
        .filter(|e| *e >= 0.0)
        .ok_or(Refusal::Malformed)? as u64;
    if case.now_s >= exp.saturating_add(LEEWAY_S) {
        return Err(Refusal::Expired);
    }
    if let Some(nbf) = number(&m.nbf) {
        if nbf > (case.now_s + LEEWAY_S) as f64 {
            return Err(Refusal::NotYetValid);
        }
    }
    Ok(auth::Verified {
        scopes: Scopes::new(
            m.read.iter().map(String::as_str),
            m.write.iter().map(String::as_str),
        ),
        exp_s: exp.saturating_add(LEEWAY_S),
        // Not modelled (see the caller): the key, and who the token names.
        key: 0,
        sub: None,
        info: None,
    })
}

fn aud_holds(aud: &Value) -> bool {
    match aud {
        Value::String(s) => s == AUDIENCE,
        Value::Array(a) => a.iter().all(Value::is_string) && a.iter().any(|v| v == AUDIENCE),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// Mode 2: header and claims JSON as they come

fn signed_json(case: &Case, bytes: &[u8]) {
    let (header, rest) = match bytes.iter().position(|&b| b == 0) {
        Some(i) => (&bytes[..i], &bytes[i + 1..]),
        None => (bytes, &b""[..]),
    };
    let (claims, edits) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    };
    // Signed with the key the header names, if it names one of the set's.
    let named = serde_json::from_slice::<Value>(header).ok();
    let kid = named
        .as_ref()
        .and_then(|h| h.get("kid"))
        .and_then(Value::as_str);
    let set = SETS[case.set];
    let signer = set
        .iter()
        .find(|a| Some(a.kid()) == kid)
        .or(set.first())
        .copied();
    let token = edit(&sign(signer, header, claims), edits);
    check_verdict(
        case,
        case.now_s,
        &token,
        case.verifier.verify(&token, case.now_s),
    );
    placed(case, &token, edits.first().copied().unwrap_or(0));
}

// ---------------------------------------------------------------------------
// Tokens: signing, editing, placing, judging

fn sign(signer: Option<Alg>, header: &[u8], claims: &[u8]) -> Vec<u8> {
    let mut token = format!("{}.{}", B64.encode(header), B64.encode(claims)).into_bytes();
    let sig = signature(signer, &token);
    token.push(b'.');
    token.extend_from_slice(B64.encode(sig).as_bytes());
    token
}

fn signature(signer: Option<Alg>, message: &[u8]) -> Vec<u8> {
    match signer {
        Some(Alg::Hs256) => hmac_sha256::HMAC::mac(message, HS_SECRET).to_vec(),
        Some(Alg::EdDsa) => ed_pair().sk.sign(message, None).to_vec(),
        None => vec![0; 64],
    }
}

/// Edits as (position, byte) pairs: overwrite, or past the end, append.
fn edit(token: &[u8], edits: &[u8]) -> Vec<u8> {
    let mut t = token.to_vec();
    for pair in edits.chunks_exact(2).take(4) {
        let at = usize::from(pair[0]) * t.len().max(1) / 256;
        match t.get_mut(at) {
            Some(b) if pair[1] != 0 => *b = pair[1],
            Some(_) => {
                t.remove(at);
            }
            None => t.push(pair[1]),
        }
    }
    t
}

/// The token in a request: in `Authorization`, the cookie, or the query
/// (`place % 3`). A well-formed token is found where it was put, when that
/// place is on; the verdict is the same from the cache as fresh.
fn placed(case: &Case, token: &[u8], place: u8) {
    let clean = !token.is_empty()
        && token
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !clean {
        return;
    }
    let t = String::from_utf8_lossy(token);
    let (target, field, on) = match place % 3 {
        0 => (
            "/v1/boxes/k".to_string(),
            format!("Authorization: Bearer {t}\r\n"),
            true,
        ),
        1 => (
            "/v1/boxes/k".to_string(),
            format!("Cookie: a=1; {}={t}; b=2\r\n", case.cookie),
            !case.cookie.is_empty(),
        ),
        _ => (
            format!("/v1/boxes/k?after=1&access_token={t}"),
            String::new(),
            case.query_param,
        ),
    };
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: x\r\n{field}\r\n").into_bytes();
    let limits = Limits {
        max_header_bytes: 1 << 16,
        max_headers: 64,
        max_body_bytes: 0,
    };
    let Ok(Progress::Complete(frame)) = Framer::new(limits).advance(&mut req) else {
        panic!("a request with a clean token did not frame: {req:?}");
    };
    let found = case.access.presented(&frame, &req);
    if on {
        assert_eq!(found, Some(token), "not found in place {}", place % 3);
    } else {
        assert_eq!(found, None, "found in a place that is off");
    }
    grant_is_cached_faithfully(case, &mut Credentials::default(), found);
}

/// The header and claim members the checks read.
#[derive(serde::Deserialize, serde::Serialize)]
struct Members {
    #[serde(skip_serializing_if = "Option::is_none")]
    alg: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kid: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    crit: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nbf: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pollbox: Option<ScopeMembers>,
}

#[derive(serde::Deserialize, serde::Serialize)]
struct ScopeMembers {
    #[serde(skip_serializing_if = "Option::is_none")]
    read: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    write: Option<Value>,
}

/// The verifier accepted `token` only if it is signed and its claims hold
/// (checked here, independently of the verifier's crates).
fn check_verdict(case: &Case, now_s: u64, token: &[u8], verdict: Result<auth::Verified, Refusal>) {
    let Ok(v) = verdict else { return };
    let parts: Vec<&[u8]> = token.split(|&b| b == b'.').collect();
    assert_eq!(parts.len(), 3, "accepted a token of {} parts", parts.len());
    let decode = |p: &[u8]| {
        B64.decode(p)
            .unwrap_or_else(|e| panic!("accepted bad base64 {p:?}: {e}"))
    };
    // The members checked, each as a JSON value. Members not named here are
    // skipped as serde skips them (a string's bytes unchecked): what an
    // ignored member holds is the signer's business.
    let json = |p: &[u8]| -> Value {
        let members: Members = serde_json::from_slice(&decode(p))
            .unwrap_or_else(|e| panic!("accepted a part that is no JSON object {p:?}: {e}"));
        serde_json::to_value(members).expect("members to a value")
    };
    let header = json(parts[0]);
    let claims = json(parts[1]);
    let set = SETS[case.set];
    let kid = header.get("kid").map(|k| k.as_str().expect("kid a string"));
    let key = match kid {
        Some(kid) => set.iter().find(|a| a.kid() == kid),
        None => {
            assert_eq!(set.len(), 1, "no kid, yet a key chosen from {set:?}");
            set.first()
        }
    };
    let key = *key.unwrap_or_else(|| panic!("accepted kid {kid:?} of no key"));
    assert_eq!(
        header.get("alg"),
        Some(&json!(key.name())),
        "alg not the key's: {header}"
    );
    assert!(
        header.get("crit").is_none(),
        "accepted a `crit` header: {header}"
    );
    let message = &token[..parts[0].len() + 1 + parts[1].len()];
    let sig = decode(parts[2]);
    let signed = match key {
        Alg::Hs256 => hmac_sha256::HMAC::mac(message, HS_SECRET).as_slice() == sig.as_slice(),
        Alg::EdDsa => ed25519_compact::Signature::from_slice(&sig)
            .is_ok_and(|s| ed_pair().pk.verify(message, &s).is_ok()),
    };
    assert!(signed, "accepted a token its key did not sign");
    let exp = claims
        .get("exp")
        .and_then(Value::as_f64)
        .expect("accepted without a numeric exp");
    assert!(
        exp >= 0.0 && now_s < (exp as u64).saturating_add(LEEWAY_S),
        "accepted past exp {exp}"
    );
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf.as_f64().expect("accepted a non-numeric nbf");
        assert!(
            nbf <= (now_s + LEEWAY_S) as f64,
            "accepted before nbf {nbf}"
        );
    }
    if case.checked {
        assert_eq!(
            claims.get("iss"),
            Some(&json!(ISSUER)),
            "accepted iss {:?}",
            claims.get("iss")
        );
        assert!(
            claims.get("aud").is_some_and(aud_holds),
            "accepted aud {:?}",
            claims.get("aud")
        );
    }
    assert_eq!(v.exp_s, (exp as u64).saturating_add(LEEWAY_S));
    let list = |name: &str| -> Vec<String> {
        claims
            .get("pollbox")
            .and_then(|p| p.get(name))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| s.as_str().expect("a pattern").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (read, write) = (list("read"), list("write"));
    assert_eq!(
        v.scopes,
        Scopes::new(
            read.iter().map(String::as_str),
            write.iter().map(String::as_str)
        ),
        "scopes not the token's"
    );
}
