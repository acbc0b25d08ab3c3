//! The answers that refuse: 401 without a valid token, an error of a route,
//! a framing error that closes the connection, and a client past its limits
//! (429, or 503 past `max_connections`).
//!
//! What it is not: the decision to refuse (auth, the per-client limits and
//! the framer make it) or the error bodies' wording ([`super::answer`]).

use super::*;

impl Service {
    pub(super) fn unauthorized<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
    ) -> Reply {
        error_body(&mut self.body, "missing or invalid bearer token");
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            extra: &[(b"WWW-Authenticate", b"Bearer")],
            ..x.json(route, 401)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// Answer with `{"error":"<what>"}`.
    pub(super) fn error<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        code: u16,
        what: &str,
    ) -> Reply {
        error_body(&mut self.body, what);
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            ..x.json(route, code)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// An answer that ends the connection: `{"error":"<what>"}` with `code`.
    pub fn closing_error<H: Host>(
        &mut self,
        code: u16,
        what: &str,
        out: &mut Vec<u8>,
        host: &mut H,
    ) {
        // No request head to take an Origin from (or one that timed out).
        self.heads.begin(None);
        error_body(&mut self.body, what);
        let a = Answer::json(RouteLabel::Other, code, Version::Http11, false);
        self.heads.write(out, host, &a, &self.body);
    }

    /// Answer 429 to a request a per-client limit refuses (`request`: its
    /// frame and the bytes its ranges index; `None` when no request came in
    /// time), with `Retry-After` and the limit named:
    /// `{"error":"too many requests","limit":"requests_per_s_per_ip"}`.
    /// `keep_alive` false: the connection closes after it.
    pub fn refuse_client<H: Host>(
        &mut self,
        refusal: ClientRefusal,
        request: Option<(&Frame, &[u8])>,
        keep_alive: bool,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Reply {
        let limit = refusal.limit;
        host.limit_refused(limit);
        let (version, head_only) = match request {
            Some((frame, buf)) => {
                self.heads.begin(frame.field(&frame.origin, buf));
                (frame.version, frame.method == Method::Head)
            }
            None => {
                self.heads.begin(None);
                (Version::Http11, false)
            }
        };
        self.body.clear();
        self.body.extend_from_slice(b"{\"error\":\"");
        self.body.extend_from_slice(limit.message().as_bytes());
        self.body.extend_from_slice(b"\",\"limit\":\"");
        self.body.extend_from_slice(limit.key().as_bytes());
        self.body.extend_from_slice(b"\"}");
        let mut digits = itoa::Buffer::new();
        let retry_after = digits.format(refusal.retry_after_s).as_bytes();
        let a = Answer {
            head_only,
            extra: &[(b"Retry-After", retry_after)],
            ..Answer::json(RouteLabel::Other, 429, version, keep_alive)
        };
        self.heads.write(out, host, &a, &self.body);
        if keep_alive {
            Reply::KeepAlive
        } else {
            Reply::Close
        }
    }

    /// Answer a framing error (the connection closes after it).
    pub fn refuse<H: Host>(&mut self, e: HttpError, out: &mut Vec<u8>, host: &mut H) {
        self.closing_error(e.status(), e.reason(), out, host);
    }
}
