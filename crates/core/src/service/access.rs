//! Access checks on every route (docs/private-boxes.md): reads when
//! `auth.read = "token"`, writes when scoped tokens are configured, and the
//! answers RFC 6750 gives: 401 with `WWW-Authenticate: Bearer` alone when no
//! token came, `Bearer error="invalid_token", error_description="..."` when
//! one came that is not valid, and 403 `{"error":"forbidden","key":"..."}`
//! with `Bearer error="insufficient_scope"` for a valid token without the
//! scope. Without scoped tokens, writes are as `auth.ingest_tokens` decide
//! ([`super::Tokens`]), unchanged.

use super::{error_body, Answer, Exchange, Host, ManyKeys, Reply, RouteLabel, Service};
use crate::auth::{Denied, Need, Refusal, Scopes};
use crate::http::Method;
use crate::render::write_json_str;

/// Why a request was refused by access control, in
/// `pollbox_auth_refused_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthRefused {
    NoToken,
    Invalid(Refusal),
    /// A valid token without the scope (a whole request, or one message of a
    /// batch).
    Forbidden,
}

impl AuthRefused {
    pub const ALL: [AuthRefused; 10] = [
        AuthRefused::NoToken,
        AuthRefused::Invalid(Refusal::ALL[0]),
        AuthRefused::Invalid(Refusal::ALL[1]),
        AuthRefused::Invalid(Refusal::ALL[2]),
        AuthRefused::Invalid(Refusal::ALL[3]),
        AuthRefused::Invalid(Refusal::ALL[4]),
        AuthRefused::Invalid(Refusal::ALL[5]),
        AuthRefused::Invalid(Refusal::ALL[6]),
        AuthRefused::Invalid(Refusal::ALL[7]),
        AuthRefused::Forbidden,
    ];

    /// Its position in [`AuthRefused::ALL`].
    pub fn index(self) -> usize {
        match self {
            AuthRefused::NoToken => 0,
            AuthRefused::Invalid(r) => 1 + Refusal::ALL.iter().position(|&x| x == r).unwrap_or(0),
            AuthRefused::Forbidden => 9,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            AuthRefused::NoToken => "no_token",
            AuthRefused::Invalid(r) => r.label(),
            AuthRefused::Forbidden => "forbidden",
        }
    }
}

/// What a request reads or writes, for its access check: the key in
/// `Service::key`, the keys there (`ManyKeys`), or every key under a prefix
/// (the prefix in `Service::key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    One,
    Many,
    Prefix,
}

pub(super) const INSUFFICIENT_SCOPE: &[u8] = b"Bearer error=\"insufficient_scope\"";

impl Service {
    /// Whether the request may go on to `need` the key in `self.key` (or,
    /// with `many`, each of the keys there): `Err` carries the reply once the
    /// 401 or 403 is written.
    pub(super) fn check_access<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        need: Need,
        target: Target,
    ) -> Result<(), Reply> {
        let access = &self.access;
        let checked = match need {
            Need::Read => access.reads_need_token,
            Need::Write => access.scoped,
        };
        if !checked {
            return Ok(());
        }
        let token = access.presented(x.frame, x.buf);
        let scopes = match access.grant(x.creds, token, self.now_s) {
            Ok(s) => s,
            Err(denied) => return Err(self.refuse_token(x, route, denied)),
        };
        let outside = match target {
            Target::Many => ManyKeys(&self.key)
                .enumerate()
                .find(|(_, k)| !scopes.allows(need, k)),
            Target::One => (!scopes.allows(need, &self.key)).then_some((0, &self.key[..])),
            Target::Prefix => (!scopes.covers(need, &self.key)).then_some((0, &self.key[..])),
        };
        let Some((i, key)) = outside else {
            return Ok(());
        };
        x.host.auth_refused(AuthRefused::Forbidden);
        match target {
            Target::Prefix => forbidden_prefix_body(&mut self.body, key),
            _ => forbidden_body(&mut self.body, key, (target == Target::Many).then_some(i)),
        }
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            extra: &[(b"WWW-Authenticate", INSUFFICIENT_SCOPE)],
            ..x.json(route, 403)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        Err(x.reply())
    }

    /// With scoped tokens, whether the request has a valid token (a batch's
    /// messages are then checked one by one): `Err` once the 401 is written.
    pub(super) fn check_token<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
    ) -> Result<(), Reply> {
        let access = &self.access;
        if !access.scoped {
            return Ok(());
        }
        let token = access.presented(x.frame, x.buf);
        match access.grant(x.creds, token, self.now_s) {
            Ok(_) => Ok(()),
            Err(denied) => Err(self.refuse_token(x, route, denied)),
        }
    }

    /// 401 for a request that needs a token and has none that is valid.
    fn refuse_token<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        denied: Denied,
    ) -> Reply {
        let (header, counted): (&'static [u8], _) = match denied {
            Denied::NoToken => (b"Bearer", AuthRefused::NoToken),
            Denied::Invalid(r) => (r.www_authenticate(), AuthRefused::Invalid(r)),
        };
        x.host.auth_refused(counted);
        match denied {
            Denied::NoToken => error_body(&mut self.body, "missing bearer token"),
            Denied::Invalid(r) => {
                self.body.clear();
                self.body
                    .extend_from_slice(b"{\"error\":\"invalid_token\",\"error_description\":\"");
                self.body.extend_from_slice(r.description().as_bytes());
                self.body.extend_from_slice(b"\"}");
            }
        }
        let extra = [(&b"WWW-Authenticate"[..], header)];
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            extra: &extra,
            ..x.json(route, 401)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }
}

impl Service {
    /// A parked long-poll whose token ended (expired, or no longer valid
    /// after a re-read of the key set): the 401 a request with that token
    /// gets now.
    pub fn refuse_parked<H: Host>(
        &mut self,
        request: super::Request<'_>,
        why: Refusal,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Reply {
        let super::Request { frame, buf, .. } = request;
        self.heads.begin(frame.field(&frame.origin, buf));
        let creds = &mut crate::auth::Credentials::default();
        let x = &mut Exchange::new(request, out, host, creds);
        self.refuse_token(x, RouteLabel::LongPoll, Denied::Invalid(why))
    }

    /// An event stream whose token ended: `event: expired` (counted as a
    /// refusal of its reason); the connection then ends the stream.
    pub fn stream_expired<H: Host>(&mut self, why: Refusal, out: &mut Vec<u8>, host: &mut H) {
        host.auth_refused(AuthRefused::Invalid(why));
        super::write_expired(out, why);
    }
}

/// The write scope of the request's token for a batch, checked message by
/// message; `None` when writes are not scoped. The request passed
/// [`Service::check_access`], so its token is the connection's cached one.
pub(super) fn write_scopes<'c>(
    access: &crate::auth::Access,
    creds: &'c mut crate::auth::Credentials,
    frame: &crate::http::Frame,
    buf: &[u8],
    now_s: u64,
) -> Option<&'c Scopes> {
    /// What a token that is somehow no longer valid may write: nothing.
    static NOTHING: Scopes = Scopes {
        read: Vec::new(),
        write: Vec::new(),
    };
    if !access.scoped {
        return None;
    }
    let token = access.presented(frame, buf);
    Some(access.grant(creds, token, now_s).unwrap_or(&NOTHING))
}

/// Whether `scopes` (`None`: writes are not scoped) may write `key`.
#[inline]
pub(super) fn may_write(scopes: Option<&Scopes>, key: &[u8]) -> bool {
    scopes.is_none_or(|s| s.allows(Need::Write, key))
}

/// The 403 of a single message whose key is outside the write scope.
pub(super) fn write_forbidden<H: Host>(
    heads: &super::Heads,
    out: &mut Vec<u8>,
    host: &mut H,
    answer: Answer<'_>,
    text: &mut Vec<u8>,
    key: &[u8],
) {
    host.auth_refused(AuthRefused::Forbidden);
    forbidden_body(text, key, None);
    let a = Answer {
        code: 403,
        extra: &[(b"WWW-Authenticate", INSUFFICIENT_SCOPE)],
        ..answer
    };
    heads.write(out, host, &a, text);
}

/// `{"error":"forbidden","key":"..."}`, with `"i":N` for a key of many.
/// `{"error":"forbidden","prefix":"room-17/"}`: no read pattern of the
/// token covers the whole prefix.
fn forbidden_prefix_body(out: &mut Vec<u8>, prefix: &[u8]) {
    out.clear();
    out.extend_from_slice(b"{\"error\":\"forbidden\",\"prefix\":");
    write_json_str(&String::from_utf8_lossy(prefix), out);
    out.push(b'}');
}

pub(super) fn forbidden_body(out: &mut Vec<u8>, key: &[u8], i: Option<usize>) {
    out.clear();
    out.extend_from_slice(b"{\"error\":\"forbidden\",\"key\":");
    write_json_str(&String::from_utf8_lossy(key), out);
    if let Some(i) = i {
        out.extend_from_slice(b",\"i\":");
        out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
    }
    out.push(b'}');
}
