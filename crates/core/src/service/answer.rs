//! The one answer writer: a response head (from the pre-rendered prefix when
//! there is one) and its body, appended to a connection's bytes and counted.
//! Every answer to a request from an allowed origin carries that origin's CORS
//! lines, chosen once per request ([`Heads::begin`]).

use super::cors::{Allowed, Cors};
use super::{Host, RouteLabel};
use crate::http::{
    write_fields, write_response_head, write_response_start, DateCache, ResponseHead, Version,
};
use std::time::SystemTime;

pub const JSON: &[u8] = b"application/json";
pub const TEXT: &[u8] = b"text/plain; charset=utf-8";

/// One response, all but its body.
#[derive(Clone, Copy)]
pub struct Answer<'a> {
    pub route: RouteLabel,
    pub code: u16,
    pub content_type: &'a [u8],
    pub version: Version,
    pub keep_alive: bool,
    /// Write the head only (HEAD, 304): `Content-Length` still says the body's.
    pub head_only: bool,
    /// `ETag: "<version>"`, the first field after the fixed ones (polls).
    pub etag: Option<u64>,
    /// Fields after the `ETag`, in order.
    pub extra: &'a [(&'a [u8], &'a [u8])],
}

impl Answer<'_> {
    /// A JSON answer with no extra header.
    pub fn json(
        route: RouteLabel,
        code: u16,
        version: Version,
        keep_alive: bool,
    ) -> Answer<'static> {
        Answer {
            route,
            code,
            content_type: JSON,
            version,
            keep_alive,
            head_only: false,
            etag: None,
            extra: &[],
        }
    }
}

/// The `Date` and the start of the most common response heads (200 and 304,
/// JSON, keep-alive HTTP/1.1), pre-rendered with it and rebuilt only when the
/// date changes: a poll's head is then one copy plus its length and `ETag`
/// (and, for an allowed origin, one copy of its pre-rendered CORS lines).
pub struct Heads {
    date: DateCache,
    rendered_for: Vec<u8>,
    ok_json: Vec<u8>,
    not_modified_json: Vec<u8>,
    cors: Cors,
    /// The CORS lines the answers of the request being answered carry.
    allowed: Option<Allowed>,
}

impl Heads {
    pub fn new(now: SystemTime, cors: Cors) -> Heads {
        let mut h = Heads {
            date: DateCache::new(),
            rendered_for: Vec::with_capacity(32),
            ok_json: Vec::with_capacity(128),
            not_modified_json: Vec::with_capacity(128),
            cors,
            allowed: None,
        };
        h.refresh(now);
        h
    }

    pub fn cors(&self) -> &Cors {
        &self.cors
    }

    /// A request is about to be answered: its answers carry the CORS lines of
    /// its `Origin` if that origin is allowed, none otherwise (also `None`: a
    /// request whose head could not be read). Returns whether it is allowed.
    #[inline]
    pub fn begin(&mut self, origin: Option<&[u8]>) -> bool {
        self.allowed = self.cors.allow(origin);
        self.allowed.is_some()
    }

    /// Follow the clock (called at each tick); re-render if the `Date` changed.
    pub fn refresh(&mut self, now: SystemTime) {
        self.date.update(now);
        let date = self.date.get();
        if self.rendered_for == date {
            return;
        }
        self.rendered_for.clear();
        self.rendered_for.extend_from_slice(date);
        for (code, out) in [(200, &mut self.ok_json), (304, &mut self.not_modified_json)] {
            out.clear();
            // Everything write_response_head writes before the length's digits.
            let head = ResponseHead {
                status: code,
                content_type: JSON,
                content_length: 0,
                date,
                keep_alive: true,
                version: Version::Http11,
            };
            write_response_head(out, &head, &[]);
            let cut = out.len() - b"0\r\n\r\n".len();
            out.truncate(cut);
        }
    }

    /// The cached prefix for this head, if there is one.
    #[inline]
    fn prefix(&self, a: &Answer<'_>) -> Option<&[u8]> {
        if !a.keep_alive || a.version != Version::Http11 || a.content_type != JSON {
            return None;
        }
        match a.code {
            200 => Some(&self.ok_json),
            304 => Some(&self.not_modified_json),
            _ => None,
        }
    }

    /// Append the answer (head, then `body` unless `head_only`) to `out` and
    /// count it. A poll's head is three copies: the cached prefix, the rest
    /// of the head (its length, `ETag` and blank line, assembled on the
    /// stack), and the body.
    #[inline]
    pub fn write<H: Host>(&self, out: &mut Vec<u8>, host: &mut H, a: &Answer<'_>, body: &[u8]) {
        // The rest is assembled from its end (numbers are written from their
        // last digit): the blank line when nothing follows, the `ETag`, the length.
        let plain = a.extra.is_empty() && self.allowed.is_none();
        let mut rest = Piece::new();
        if plain {
            rest.prepend(b"\r\n");
        }
        if let Some(version) = a.etag {
            rest.prepend(b"\"\r\n");
            rest.prepend_number(version);
            rest.prepend(b"ETag: \"");
        }
        match self.prefix(a) {
            Some(prefix) => {
                rest.prepend(b"\r\n");
                rest.prepend_number(body.len() as u64);
                out.extend_from_slice(prefix);
            }
            None => write_response_start(
                out,
                &ResponseHead {
                    status: a.code,
                    content_type: a.content_type,
                    content_length: body.len(),
                    date: self.date.get(),
                    keep_alive: a.keep_alive,
                    version: a.version,
                },
            ),
        }
        out.extend_from_slice(rest.bytes());
        if !plain {
            write_fields(out, a.extra);
            if let Some(allowed) = self.allowed {
                out.extend_from_slice(self.cors.lines(allowed));
            }
            out.extend_from_slice(b"\r\n");
        }
        if !a.head_only {
            out.extend_from_slice(body);
        }
        host.answered(a.route, a.code);
    }
}

impl Heads {
    /// The head of an event stream (docs/http.md#event-streams), then its `retry:`
    /// line, counted as a 200 on `route`. No `Content-Length`: the stream's body
    /// ends with the connection, which the head says (`Connection: close`); the
    /// other exception besides 204. `Cache-Control: no-cache` keeps caches and
    /// proxies from holding it; an allowed origin gets its CORS lines.
    pub fn write_stream_head<H: Host>(
        &self,
        out: &mut Vec<u8>,
        host: &mut H,
        route: RouteLabel,
        retry_ms: u64,
    ) {
        // The status line says HTTP/1.1 whatever the request's version; a
        // close-delimited body is valid for 1.0 and 1.1 alike.
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\nDate: ");
        out.extend_from_slice(self.date.get());
        out.extend_from_slice(
            b"\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\
              Connection: close\r\n",
        );
        if let Some(allowed) = self.allowed {
            out.extend_from_slice(self.cors.lines(allowed));
        }
        out.extend_from_slice(b"\r\nretry: ");
        out.extend_from_slice(itoa::Buffer::new().format(retry_ms).as_bytes());
        out.extend_from_slice(b"\n\n");
        host.answered(route, 200);
    }
}

/// "00" to "99".
static DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// A few bytes of a head assembled on the stack, from the end, and appended
/// with one copy instead of one per piece (a length, an `ETag` line, the
/// blank line: 55 bytes at most).
struct Piece {
    buf: [u8; 64],
    /// The bytes are `buf[start..]`.
    start: usize,
}

impl Piece {
    #[inline]
    fn new() -> Piece {
        Piece {
            buf: [0; 64],
            start: 64,
        }
    }

    #[inline]
    fn prepend(&mut self, bytes: &[u8]) {
        let start = self.start - bytes.len();
        self.buf[start..self.start].copy_from_slice(bytes);
        self.start = start;
    }

    /// `n` in decimal, written from its last digits, two at a time.
    #[inline]
    fn prepend_number(&mut self, mut n: u64) {
        while n >= 100 {
            let pair = (n % 100) as usize * 2;
            n /= 100;
            self.prepend(&DIGIT_PAIRS[pair..pair + 2]);
        }
        if n >= 10 {
            let pair = n as usize * 2;
            self.prepend(&DIGIT_PAIRS[pair..pair + 2]);
        } else {
            self.prepend(&[b'0' + n as u8]);
        }
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// `{"error":"<what>"}` into `out` (cleared first). `what` needs no escaping.
pub fn error_body(out: &mut Vec<u8>, what: &str) {
    out.clear();
    out.extend_from_slice(b"{\"error\":\"");
    out.extend_from_slice(what.as_bytes());
    out.extend_from_slice(b"\"}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::testing::Recorder;

    #[test]
    fn cached_heads_equal_written_heads() {
        let h = Heads::new(SystemTime::UNIX_EPOCH, Cors::default());
        let date = h.date.get().to_vec();
        let mut host = Recorder::default();
        for code in [200u16, 304] {
            let extra: &[(&[u8], &[u8])] = &[(b"ETag", b"\"7\"")];
            let mut want = Vec::new();
            let head = ResponseHead {
                status: code,
                content_type: JSON,
                content_length: 2,
                date: &date,
                keep_alive: true,
                version: Version::Http11,
            };
            write_response_head(&mut want, &head, extra);
            want.extend_from_slice(b"{}");
            let a = Answer {
                extra,
                ..Answer::json(RouteLabel::Poll, code, Version::Http11, true)
            };
            assert!(h.prefix(&a).is_some());
            let mut got = Vec::new();
            h.write(&mut got, &mut host, &a, b"{}");
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
        assert_eq!(
            host.answers,
            vec![(RouteLabel::Poll, 200), (RouteLabel::Poll, 304)]
        );
        let a = Answer::json(RouteLabel::Poll, 200, Version::Http11, true);
        assert!(h
            .prefix(&Answer {
                keep_alive: false,
                ..a
            })
            .is_none());
        assert!(h
            .prefix(&Answer {
                version: Version::Http10,
                ..a
            })
            .is_none());
        assert!(h.prefix(&Answer { code: 404, ..a }).is_none());
        assert!(h
            .prefix(&Answer {
                content_type: TEXT,
                ..a
            })
            .is_none());
    }

    #[test]
    fn an_allowed_origin_gets_its_cors_lines_after_the_extra_fields() {
        let cors = Cors::new(&["https://game.example".into()]);
        let mut h = Heads::new(SystemTime::UNIX_EPOCH, cors);
        let extra: &[(&[u8], &[u8])] = &[(b"ETag", b"\"7\"")];
        let tail = "ETag: \"7\"\r\nAccess-Control-Allow-Origin: https://game.example\r\n\
                    Vary: Origin\r\nAccess-Control-Expose-Headers: ETag\r\n\r\n{}";
        for (code, keep_alive) in [(200, true), (304, true), (404, true), (200, false)] {
            assert!(h.begin(Some(b"https://game.example")));
            let a = Answer {
                extra,
                ..Answer::json(RouteLabel::Poll, code, Version::Http11, keep_alive)
            };
            let mut out = Vec::new();
            h.write(&mut out, &mut Recorder::default(), &a, b"{}");
            let s = String::from_utf8(out).unwrap();
            assert!(s.ends_with(tail), "{s}");
            // Another origin, or none: no CORS line at all.
            for origin in [Some(&b"https://evil.example"[..]), None] {
                assert!(!h.begin(origin));
                let mut out = Vec::new();
                h.write(&mut out, &mut Recorder::default(), &a, b"{}");
                let s = String::from_utf8(out).unwrap();
                assert!(!s.contains("Access-Control") && !s.contains("Vary"), "{s}");
                assert!(s.ends_with("ETag: \"7\"\r\n\r\n{}"), "{s}");
            }
        }
    }

    #[test]
    fn an_etag_is_the_field_extra_would_write() {
        let cors = Cors::new(&["https://game.example".into()]);
        let mut h = Heads::new(SystemTime::UNIX_EPOCH, cors);
        for version in [0, 1, 9, 10, 99, 12_345, u64::MAX] {
            let tag = format!("\"{version}\"");
            for origin in [None, Some(&b"https://game.example"[..])] {
                for (code, keep_alive, head_only) in
                    [(200, true, false), (304, true, true), (200, false, false)]
                {
                    h.begin(origin);
                    let a = Answer {
                        head_only,
                        ..Answer::json(RouteLabel::Poll, code, Version::Http11, keep_alive)
                    };
                    let (mut got, mut want) = (Vec::new(), Vec::new());
                    let mut host = Recorder::default();
                    let body = b"{\"k\":\"a\",\"ver\":1}";
                    h.write(
                        &mut got,
                        &mut host,
                        &Answer {
                            etag: Some(version),
                            ..a
                        },
                        body,
                    );
                    let extra: &[(&[u8], &[u8])] = &[(b"ETag", tag.as_bytes())];
                    h.write(&mut want, &mut host, &Answer { extra, ..a }, body);
                    assert_eq!(
                        String::from_utf8(got).unwrap(),
                        String::from_utf8(want).unwrap()
                    );
                }
            }
        }
        // Before other fields, and the longest head piece fits.
        h.begin(None);
        let a = Answer {
            etag: Some(u64::MAX),
            extra: &[(b"X", b"y")],
            ..Answer::json(RouteLabel::Poll, 200, Version::Http11, true)
        };
        let mut out = Vec::new();
        h.write(&mut out, &mut Recorder::default(), &a, &[b'x'; 1 << 20]);
        let s = String::from_utf8_lossy(&out[..out.len() - (1 << 20)]).into_owned();
        assert!(
            s.ends_with(
                "Content-Length: 1048576\r\nETag: \"18446744073709551615\"\r\nX: y\r\n\r\n"
            ),
            "{s}"
        );
    }

    #[test]
    fn head_only_keeps_the_length_and_drops_the_body() {
        let h = Heads::new(SystemTime::UNIX_EPOCH, Cors::default());
        let mut out = Vec::new();
        let a = Answer {
            head_only: true,
            ..Answer::json(RouteLabel::Poll, 200, Version::Http11, true)
        };
        h.write(&mut out, &mut Recorder::default(), &a, b"{\"k\":1}");
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("Content-Length: 7\r\n"), "{s}");
        assert!(s.ends_with("\r\n\r\n"), "{s}");
    }
}
