//! Who may read and write which box (docs/private-boxes.md): signed tokens
//! ([`token`], keys from a JWKS: [`jwks`]), static tokens with scopes
//! (`[[auth.token]]`), and the scopes both carry ([`scope`]).
//!
//! A connection keeps the last token it presented and what it was found to
//! be ([`Credentials`]): a token is verified once per connection and again
//! only when it changes, so a keep-alive poll with a token costs a compare
//! of its bytes, not a signature check.
//!
//! The key set and the static token files are re-read while serving (the
//! server watches them): each read is a new [`Access`], installed in the
//! node's [`LiveAccess`] and taken by each worker at its next tick. What a
//! connection cached under an older read stays valid only if what made it
//! valid is still there ([`Access::grant`], [`Access::held`]).
//!
//! What it is not: the answers. The service writes the 401 and 403
//! (crates/core/src/service/mod.rs); this module only decides.

mod bearer;
pub mod jwks;
pub mod scope;
mod settings;
pub mod token;

pub use bearer::{constant_time_eq, Tokens};
pub use jwks::{JwksError, KeySet};
pub use scope::{Need, Pattern, Scopes};
pub use settings::{AuthConfig, JwtConfig, ReadAccess, StaticTokenConfig};
pub use token::{Refusal, Verified, Verifier};

use crate::http::Frame;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Why a request that needs a token has none that is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No token at all: `WWW-Authenticate: Bearer` alone.
    NoToken,
    /// A token that is not valid, and why.
    Invalid(Refusal),
}

/// The scoped tokens a node accepts, and where requests carry them: one
/// read of the key set and the static token files ([`LiveAccess`] holds the
/// current one).
pub struct Access {
    /// `auth.read = "token"`.
    pub reads_need_token: bool,
    /// Scoped tokens are configured: writes are checked against scopes (and
    /// `auth.ingest_tokens` write every key). Without them, writes are as
    /// `auth.ingest_tokens` alone decide (crates/core/src/service/auth.rs).
    pub scoped: bool,
    ingest: Vec<Box<[u8]>>,
    statics: Vec<(Box<[u8]>, Scopes)>,
    verifier: Option<Verifier>,
    cookie: Box<[u8]>,
    query_param: bool,
    /// Which read of the files this is ([`LiveAccess::replace`] numbers
    /// them): what a connection cached under another is checked again.
    generation: u64,
}

impl Access {
    /// From `[auth]`; the JWKS text is `auth.jwt.keys` ([`crate::config::Config::add_jwks`]),
    /// the static tokens' values `auth.token[i].token`.
    pub fn new(auth: &AuthConfig) -> Result<Access, JwksError> {
        let verifier = match (auth.jwt.keys_file.is_empty(), auth.jwt.keys.is_empty()) {
            (true, _) => None,
            // Configured but not read (a config checked alone): no key, so
            // every signed token is refused as of an unknown key.
            (false, true) => Some(Verifier::new(KeySet::default(), &auth.jwt)),
            (false, false) => Some(Verifier::new(KeySet::from_jwks(&auth.jwt.keys)?, &auth.jwt)),
        };
        let statics = auth
            .token
            .iter()
            .map(|t| {
                let scopes = Scopes::new(
                    t.read.iter().map(String::as_str),
                    t.write.iter().map(String::as_str),
                );
                (t.token.as_bytes().into(), scopes)
            })
            .collect();
        Ok(Access {
            reads_need_token: auth.read == ReadAccess::Token,
            scoped: auth.scoped_tokens(),
            ingest: auth
                .ingest_tokens
                .iter()
                .map(|t| t.as_bytes().into())
                .collect(),
            statics,
            verifier,
            cookie: auth.jwt.cookie.as_bytes().into(),
            query_param: auth.jwt.query_param,
            generation: 0,
        })
    }

    /// Which read of the files this is (0 at start).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Keys in the set (0 without signed tokens).
    pub fn keys(&self) -> usize {
        self.verifier.as_ref().map_or(0, |v| v.keys().len())
    }

    /// Static tokens (`[[auth.token]]`).
    pub fn static_tokens(&self) -> usize {
        self.statics.len()
    }

    /// Whether a browser may send its cookie token cross-origin (CORS then
    /// says `Access-Control-Allow-Credentials: true` to listed origins).
    pub fn cookie_tokens(&self) -> bool {
        self.scoped && !self.cookie.is_empty()
    }

    /// The token a request presents: `Authorization: Bearer`, else the
    /// cookie `auth.jwt.cookie`, else `?access_token=` when
    /// `auth.jwt.query_param` is on.
    pub fn presented<'b>(&self, frame: &Frame, buf: &'b [u8]) -> Option<&'b [u8]> {
        if let Some(t) = frame.field(&frame.authorization, buf).and_then(bearer) {
            return Some(t);
        }
        if !self.cookie.is_empty() {
            let head = buf.get(..frame.body.start).unwrap_or(b"");
            if let Some(t) = cookie(head, &self.cookie) {
                return Some(t);
            }
        }
        if self.query_param {
            return query_token(buf.get(frame.query.clone()).unwrap_or(b""));
        }
        None
    }

    /// What `token` grants at `now_s`, from the connection's cache when it
    /// is the token verified last (and, if the files were re-read since,
    /// what made it valid is still there: [`Access::carry_over`]).
    pub fn grant<'c>(
        &self,
        creds: &'c mut Credentials,
        token: Option<&[u8]>,
        now_s: u64,
    ) -> Result<&'c Scopes, Denied> {
        let Some(token) = token else {
            return Err(Denied::NoToken);
        };
        let cached = creds.outcome.is_some()
            && creds.token == token
            && (creds.generation == self.generation || self.carry_over(creds));
        if !cached {
            creds.token.clear();
            creds.token.extend_from_slice(token);
            creds.outcome = self.judge(token, now_s);
            creds.generation = self.generation;
        }
        if matches!(&creds.outcome, Some(Ok(g)) if now_s >= g.end_s) {
            creds.outcome = Some(Err(Refusal::Expired));
        }
        match &creds.outcome {
            Some(Ok(g)) => Ok(&g.scopes),
            Some(Err(r)) => Err(Denied::Invalid(*r)),
            // Not yet valid: not kept, it may be valid on the next request.
            None => Err(Denied::Invalid(Refusal::NotYetValid)),
        }
    }

    /// Whether the token a held request (a parked long-poll, an event
    /// stream) was granted with still holds at `now_s` under this read of
    /// the files: `Ok` with when it ends (`exp` plus leeway; `u64::MAX` for
    /// a static token), or why not. Cheap enough to ask of every held
    /// request after a re-read: a signed token holds while the key that
    /// verified it is in the set, and is not verified again (a key taken
    /// out refuses it as an unknown key, without a signature check); a
    /// static token is looked up again.
    pub fn held(&self, creds: &mut Credentials, now_s: u64) -> Result<u64, Refusal> {
        if creds.generation != self.generation && !self.carry_over(creds) {
            let signed =
                matches!(&creds.outcome, Some(Ok(g)) if matches!(g.source, Source::Signed(_)));
            creds.generation = self.generation;
            if signed {
                // The next request with it is judged in full.
                creds.outcome = None;
                return Err(Refusal::UnknownKey);
            }
            let token = std::mem::take(&mut creds.token);
            creds.outcome = self.judge(&token, now_s);
            creds.token = token;
        }
        if matches!(&creds.outcome, Some(Ok(g)) if now_s >= g.end_s) {
            creds.outcome = Some(Err(Refusal::Expired));
        }
        match &creds.outcome {
            Some(Ok(g)) => Ok(g.end_s),
            Some(Err(r)) => Err(*r),
            None => Err(Refusal::NotYetValid),
        }
    }

    /// After a re-read of the files: whether what the connection cached is
    /// still valid without judging its token again (then it is marked as of
    /// this read). An ingest token is (the config is not re-read); a static
    /// token if it is still one (its scopes those of its entry now); a
    /// signed token if the key that verified it is still in the set. A
    /// refusal is not: the token is judged again (its key may have come).
    fn carry_over(&self, creds: &mut Credentials) -> bool {
        let kept = match &mut creds.outcome {
            Some(Ok(g)) => match g.source {
                Source::Ingest => true,
                Source::Static => match self.static_scopes(&creds.token) {
                    Some(scopes) => {
                        if g.scopes != *scopes {
                            g.scopes = scopes.clone();
                        }
                        true
                    }
                    None => false,
                },
                Source::Signed(key) => self.verifier.as_ref().is_some_and(|v| v.keys().holds(key)),
            },
            _ => false,
        };
        if kept {
            creds.generation = self.generation;
        }
        kept
    }

    /// The scopes of the static token `token` (each compared in constant time).
    fn static_scopes(&self, token: &[u8]) -> Option<&Scopes> {
        let mut found = None;
        for (t, scopes) in &self.statics {
            if constant_time_eq(token, t) && found.is_none() {
                found = Some(scopes);
            }
        }
        found
    }

    /// A token not seen before on this connection: an ingest token, a
    /// static token (each compared in constant time), or a signed token.
    /// `None`: not yet valid.
    fn judge(&self, token: &[u8], now_s: u64) -> Option<Result<Grant, Refusal>> {
        let ingest = self
            .ingest
            .iter()
            .fold(false, |acc, t| acc | constant_time_eq(token, t));
        if ingest {
            let writes = Scopes {
                read: Vec::new(),
                write: vec![Pattern::Any],
            };
            return Some(Ok(Grant {
                scopes: writes,
                end_s: u64::MAX,
                source: Source::Ingest,
                member: None,
            }));
        }
        if let Some(scopes) = self.static_scopes(token) {
            return Some(Ok(Grant {
                scopes: scopes.clone(),
                end_s: u64::MAX,
                source: Source::Static,
                member: None,
            }));
        }
        let Some(v) = &self.verifier else {
            return Some(Err(Refusal::UnknownToken));
        };
        match v.verify(token, now_s) {
            Ok(t) => Some(Ok(Grant {
                scopes: t.scopes,
                end_s: t.exp_s,
                source: Source::Signed(t.key),
                member: t.sub.map(|sub| (sub, t.info)),
            })),
            Err(Refusal::NotYetValid) => None,
            Err(r) => Some(Err(r)),
        }
    }
}

/// The node's [`Access`], replaced whole when the key set or a static token
/// file is re-read (docs/private-boxes.md#key-rotation).
///
/// Each worker keeps its own `Arc<Access>` and asks here once a tick
/// whether a newer one was installed: one relaxed atomic load a tick, none
/// per request, and the lock only when there is something to take. (An
/// `arc-swap` would let every request load the newest set at the price of
/// an atomic per load, and it is not among our dependencies; a tick, a few
/// milliseconds, is soon enough for a rotation.) What a connection cached
/// under an older read is checked again on its next request
/// ([`Access::grant`]), and its held request at the tick that takes the new
/// read ([`Access::held`]).
pub struct LiveAccess {
    current: Mutex<Arc<Access>>,
    /// The generation of `current`, for a look without the lock.
    generation: AtomicU64,
}

impl LiveAccess {
    pub fn new(access: Access) -> LiveAccess {
        LiveAccess {
            generation: AtomicU64::new(access.generation),
            current: Mutex::new(Arc::new(access)),
        }
    }

    /// The generation installed last (relaxed: the lock in
    /// [`LiveAccess::current`] orders what comes with it).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The access installed last.
    pub fn current(&self) -> Arc<Access> {
        match self.current.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Install `access` as the next generation; returns it.
    pub fn replace(&self, mut access: Access) -> u64 {
        let mut g = match self.current.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        access.generation = g.generation + 1;
        let generation = access.generation;
        *g = Arc::new(access);
        self.generation.store(generation, Ordering::Relaxed);
        generation
    }
}

/// What a token was found to grant.
#[derive(Debug, Clone, PartialEq)]
struct Grant {
    scopes: Scopes,
    /// When it ends: `exp` plus leeway, `u64::MAX` for a static or ingest token.
    end_s: u64,
    source: Source,
    /// A signed token's `sub` and `pollbox.info` (docs/presence.md).
    member: Option<Subject>,
}

/// Who a token names: its `sub`, and its `pollbox.info` (compact JSON).
type Subject = (Box<str>, Option<Box<[u8]>>);

/// Where a granted token was found: what a re-read of the files must still
/// hold for it to stay valid ([`Access::carry_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// `auth.ingest_tokens` (the config: not re-read).
    Ingest,
    /// An `[[auth.token]]` (its `token_file` is re-read).
    Static,
    /// A signed token, verified with the key of this [`jwks::Key::identity`].
    Signed(u64),
}

/// One connection's last token and what it was found to be. Its buffer is
/// kept: a token of the same size or smaller that replaces it allocates
/// nothing.
#[derive(Debug, Default)]
pub struct Credentials {
    token: Vec<u8>,
    /// The scopes and when they end, or why the token was refused. `None`:
    /// nothing kept.
    outcome: Option<Result<Grant, Refusal>>,
    /// The [`Access::generation`] it was judged under.
    generation: u64,
}

impl Credentials {
    /// The member the last granted token names (its `sub`) and its info
    /// (docs/presence.md); `None`: no token, or one that names no one.
    pub fn member(&self) -> Option<(&str, Option<&[u8]>)> {
        match &self.outcome {
            Some(Ok(g)) => g
                .member
                .as_ref()
                .map(|(sub, info)| (&**sub, info.as_deref())),
            _ => None,
        }
    }

    /// Heap bytes it holds.
    pub fn heap_bytes(&self) -> usize {
        self.token.capacity()
    }
}

/// `Bearer <token>` (the scheme in any case). Public for the fuzz target
/// `auth` (fuzz/fuzz_targets/auth.rs), not an API.
#[doc(hidden)]
pub fn bearer(h: &[u8]) -> Option<&[u8]> {
    let h = h.trim_ascii();
    (h.len() > 7 && h[..7].eq_ignore_ascii_case(b"bearer ")).then(|| h[7..].trim_ascii())
}

/// The value of cookie `name` in a request head's `Cookie` fields (RFC 6265
/// §5.4: `a=1; b=2`, a value may be quoted). The head is scanned here, only
/// when a token is needed and none came in `Authorization`: the framer keeps
/// no `Cookie` range, so a frame stays as small as it is on every request.
/// Public for the fuzz target `auth`, not an API.
#[doc(hidden)]
pub fn cookie<'b>(head: &'b [u8], name: &[u8]) -> Option<&'b [u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|&b| b == b':')?;
        if !line[..colon].eq_ignore_ascii_case(b"cookie") {
            return None;
        }
        line[colon + 1..].split(|&b| b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            if pair[..eq].trim_ascii() != name {
                return None;
            }
            let v = pair[eq + 1..].trim_ascii();
            let v = v
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(v);
            (!v.is_empty()).then_some(v)
        })
    })
}

/// `access_token=` in a query, as it is (a JWT needs no escape). Public for
/// the fuzz target `auth`, not an API.
#[doc(hidden)]
pub fn query_token(q: &[u8]) -> Option<&[u8]> {
    q.split(|&b| b == b'&')
        .find_map(|pair| pair.strip_prefix(b"access_token="))
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::{JwtConfig, StaticTokenConfig};

    #[test]
    fn cookies() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1; pollbox_token=tok.en.x; b=2\r\n\r\n";
        assert_eq!(cookie(head, b"pollbox_token"), Some(&b"tok.en.x"[..]));
        assert_eq!(cookie(head, b"a"), Some(&b"1"[..]));
        assert_eq!(cookie(head, b"c"), None);
        let quoted = b"GET / HTTP/1.1\r\ncookie:  t=\"v\" \r\n\r\n";
        assert_eq!(cookie(quoted, b"t"), Some(&b"v"[..]));
        let two = b"GET / HTTP/1.1\r\nCookie: a=1\r\nCOOKIE: t=2\r\n\r\n";
        assert_eq!(cookie(two, b"t"), Some(&b"2"[..]));
        // The request line is not a field, nor is a prefix of the name.
        assert_eq!(cookie(b"GET /cookie:t=1 HTTP/1.1\r\n\r\n", b"t"), None);
        assert_eq!(
            cookie(b"GET / HTTP/1.1\r\nCookie: tt=1\r\n\r\n", b"t"),
            None
        );
        assert_eq!(cookie(b"GET / HTTP/1.1\r\nCookie: t=\r\n\r\n", b"t"), None);
    }

    #[test]
    fn query_and_bearer() {
        assert_eq!(query_token(b"after=1&access_token=abc"), Some(&b"abc"[..]));
        assert_eq!(query_token(b"xaccess_token=abc"), None);
        assert_eq!(query_token(b"access_token="), None);
        assert_eq!(bearer(b" bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
    }

    fn access() -> Access {
        let auth = AuthConfig {
            ingest_tokens: vec!["ingest-secret".into()],
            token: vec![StaticTokenConfig {
                token: "static-secret".into(),
                read: vec!["room-17/*".into()],
                ..Default::default()
            }],
            jwt: JwtConfig {
                keys_file: "jwks.json".into(),
                keys: jwks::tests::JWKS.into(),
                ..JwtConfig::default()
            },
            ..AuthConfig::default()
        };
        Access::new(&auth).unwrap()
    }

    #[test]
    fn ingest_static_and_signed_tokens() {
        let a = access();
        let mut c = Credentials::default();
        let s = a.grant(&mut c, Some(b"ingest-secret"), 0).unwrap();
        assert!(s.allows(Need::Write, b"any") && !s.allows(Need::Read, b"any"));
        let s = a.grant(&mut c, Some(b"static-secret"), 0).unwrap();
        assert!(s.allows(Need::Read, b"room-17/a") && !s.allows(Need::Write, b"room-17/a"));
        assert_eq!(
            a.grant(&mut c, Some(b"other"), 0),
            Err(Denied::Invalid(Refusal::Malformed))
        );
        assert_eq!(a.grant(&mut c, None, 0), Err(Denied::NoToken));
        let tokens: std::collections::HashMap<String, String> =
            serde_json::from_str(include_str!("testdata/tokens.json")).unwrap();
        let es = tokens["es"].as_bytes();
        assert!(a.grant(&mut c, Some(es), 1500).is_ok());
        // Cached: the same token is not verified again, but its expiry holds.
        assert!(a.grant(&mut c, Some(es), 2029).is_ok());
        assert_eq!(
            a.grant(&mut c, Some(es), 2030),
            Err(Denied::Invalid(Refusal::Expired))
        );
        // Not yet valid is not kept: later it is.
        let mut c = Credentials::default();
        assert_eq!(
            a.grant(&mut c, Some(es), 900),
            Err(Denied::Invalid(Refusal::NotYetValid))
        );
        assert!(a.grant(&mut c, Some(es), 1000).is_ok());
    }

    /// The test set without the key `kid`.
    fn jwks_without(kid: &str) -> String {
        let mut set: serde_json::Value = serde_json::from_str(jwks::tests::JWKS).unwrap();
        let keys = set["keys"].as_array_mut().unwrap();
        keys.retain(|k| k["kid"] != kid);
        set.to_string()
    }

    fn reread(live: &LiveAccess, keys: &str, static_token: &str) -> Arc<Access> {
        let mut auth = AuthConfig {
            ingest_tokens: vec!["ingest-secret".into()],
            token: vec![StaticTokenConfig {
                token: static_token.into(),
                read: vec!["room-17/*".into()],
                ..Default::default()
            }],
            jwt: JwtConfig {
                keys_file: "jwks.json".into(),
                ..JwtConfig::default()
            },
            ..AuthConfig::default()
        };
        auth.jwt.keys = keys.into();
        live.replace(Access::new(&auth).unwrap());
        live.current()
    }

    #[test]
    fn a_reread_keeps_what_is_still_there_and_refuses_what_was_taken_out() {
        let live = LiveAccess::new(access());
        let tokens: std::collections::HashMap<String, String> =
            serde_json::from_str(include_str!("testdata/tokens.json")).unwrap();
        let (es, ed) = (tokens["es"].as_bytes(), tokens["ed"].as_bytes());
        let a0 = live.current();
        assert_eq!(live.generation(), 0);
        let (mut c_es, mut c_ed, mut c_st, mut c_in) = Default::default();
        let mut c_held = Credentials::default();
        assert!(a0.grant(&mut c_es, Some(es), 1500).is_ok());
        assert!(a0.grant(&mut c_ed, Some(ed), 1500).is_ok());
        assert!(a0.grant(&mut c_held, Some(es), 1500).is_ok());
        assert!(a0.grant(&mut c_st, Some(b"static-secret"), 1500).is_ok());
        assert!(a0.grant(&mut c_in, Some(b"ingest-secret"), 1500).is_ok());
        assert_eq!(a0.held(&mut c_held, 1500), Ok(2030));

        // The same files again: everything carries over.
        let a1 = reread(&live, jwks::tests::JWKS, "static-secret");
        assert_eq!((live.generation(), a1.generation()), (1, 1));
        assert_eq!(a1.held(&mut c_held, 1500), Ok(2030));
        assert!(a1.grant(&mut c_es, Some(es), 1500).is_ok());

        // The key `es` taken out, the static token rotated.
        let a2 = reread(&live, &jwks_without("es"), "static-rotated");
        assert_eq!(a2.held(&mut c_held, 1500), Err(Refusal::UnknownKey));
        assert_eq!(
            a2.grant(&mut c_es, Some(es), 1500),
            Err(Denied::Invalid(Refusal::UnknownKey))
        );
        assert!(a2.grant(&mut c_ed, Some(ed), 1500).is_ok(), "its key stays");
        assert_eq!(
            a2.grant(&mut c_st, Some(b"static-secret"), 1500),
            Err(Denied::Invalid(Refusal::Malformed))
        );
        assert!(a2
            .grant(&mut c_st, Some(b"static-rotated"), 1500)
            .unwrap()
            .allows(Need::Read, b"room-17/x"));
        assert!(a2.grant(&mut c_in, Some(b"ingest-secret"), 1500).is_ok());

        // The key back: a token refused under the last read is judged again.
        let a3 = reread(&live, jwks::tests::JWKS, "static-rotated");
        assert!(a3.grant(&mut c_es, Some(es), 1500).is_ok());
        // A static token held over a read that drops it.
        let mut c = Credentials::default();
        assert!(a3.grant(&mut c, Some(b"static-rotated"), 1500).is_ok());
        assert_eq!(a3.held(&mut c, 1500), Ok(u64::MAX));
        let a4 = reread(&live, jwks::tests::JWKS, "static-again");
        assert_eq!(a4.held(&mut c, 1500), Err(Refusal::Malformed));
        // And expiry, as for a request.
        let mut c = Credentials::default();
        assert!(a4.grant(&mut c, Some(es), 1500).is_ok());
        assert_eq!(a4.held(&mut c, 2029), Ok(2030));
        assert_eq!(a4.held(&mut c, 2030), Err(Refusal::Expired));
    }

    #[test]
    fn without_signed_tokens_an_unknown_token_says_so() {
        let auth = AuthConfig {
            token: vec![StaticTokenConfig {
                token: "s".into(),
                write: vec!["*".into()],
                ..Default::default()
            }],
            ..AuthConfig::default()
        };
        let a = Access::new(&auth).unwrap();
        assert_eq!(
            a.grant(&mut Credentials::default(), Some(b"x"), 0),
            Err(Denied::Invalid(Refusal::UnknownToken))
        );
    }
}
