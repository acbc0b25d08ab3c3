//! Who may read and write which box (docs/private-boxes.md): signed tokens
//! ([`token`], keys from a JWKS: [`jwks`]), static tokens with scopes
//! (`[[auth.token]]`), and the scopes both carry ([`scope`]).
//!
//! A connection keeps the last token it presented and what it was found to
//! be ([`Credentials`]): a token is verified once per connection and again
//! only when it changes, so a keep-alive poll with a token costs a compare
//! of its bytes, not a signature check.
//!
//! What it is not: the answers. The service writes the 401 and 403
//! (crates/core/src/service/mod.rs); this module only decides.

pub mod jwks;
pub mod scope;
pub mod token;

pub use jwks::{JwksError, KeySet};
pub use scope::{Need, Pattern, Scopes};
pub use token::{Refusal, Verified, Verifier};

use crate::config::{AuthConfig, ReadAccess};
use crate::http::Frame;
use crate::service::constant_time_eq;

/// Why a request that needs a token has none that is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No token at all: `WWW-Authenticate: Bearer` alone.
    NoToken,
    /// A token that is not valid, and why.
    Invalid(Refusal),
}

/// The scoped tokens a node accepts, and where requests carry them.
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
}

impl Access {
    /// From `[auth]`; the JWKS text is `auth.jwt.keys` ([`crate::config::Config::add_jwks`]).
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
        })
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
    /// is the token verified last.
    pub fn grant<'c>(
        &self,
        creds: &'c mut Credentials,
        token: Option<&[u8]>,
        now_s: u64,
    ) -> Result<&'c Scopes, Denied> {
        let Some(token) = token else {
            return Err(Denied::NoToken);
        };
        let cached = creds.outcome.is_some() && creds.token == token;
        if !cached {
            creds.token.clear();
            creds.token.extend_from_slice(token);
            creds.outcome = self.judge(token, now_s);
        }
        if matches!(&creds.outcome, Some(Ok((_, exp_s))) if now_s >= *exp_s) {
            creds.outcome = Some(Err(Refusal::Expired));
        }
        match &creds.outcome {
            Some(Ok((scopes, _))) => Ok(scopes),
            Some(Err(r)) => Err(Denied::Invalid(*r)),
            // Not yet valid: not kept, it may be valid on the next request.
            None => Err(Denied::Invalid(Refusal::NotYetValid)),
        }
    }

    /// A token not seen before on this connection: an ingest token, a
    /// static token (each compared in constant time), or a signed token.
    /// `None`: not yet valid.
    fn judge(&self, token: &[u8], now_s: u64) -> Option<Result<(Scopes, u64), Refusal>> {
        let ingest = self
            .ingest
            .iter()
            .fold(false, |acc, t| acc | constant_time_eq(token, t));
        if ingest {
            let writes = Scopes {
                read: Vec::new(),
                write: vec![Pattern::Any],
            };
            return Some(Ok((writes, u64::MAX)));
        }
        let mut found = None;
        for (t, scopes) in &self.statics {
            if constant_time_eq(token, t) && found.is_none() {
                found = Some(scopes);
            }
        }
        if let Some(scopes) = found {
            return Some(Ok((scopes.clone(), u64::MAX)));
        }
        let Some(v) = &self.verifier else {
            return Some(Err(Refusal::UnknownToken));
        };
        match v.verify(token, now_s) {
            Ok(t) => Some(Ok((t.scopes, t.exp_s))),
            Err(Refusal::NotYetValid) => None,
            Err(r) => Some(Err(r)),
        }
    }
}

/// One connection's last token and what it was found to be. Its buffer is
/// kept: a token of the same size or smaller that replaces it allocates
/// nothing.
#[derive(Debug, Default)]
pub struct Credentials {
    token: Vec<u8>,
    /// The scopes and when they end (`exp` plus leeway; `u64::MAX` for a
    /// static token), or why the token was refused. `None`: nothing kept.
    outcome: Option<Result<(Scopes, u64), Refusal>>,
}

impl Credentials {
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
    use crate::config::{JwtConfig, StaticTokenConfig};

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
