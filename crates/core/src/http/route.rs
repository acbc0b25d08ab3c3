//! What a request target means for pollbox: the route table (docs/http.md#routes), the
//! percent-decoding of box keys and the long-poll query.

use super::Method;
use crate::bytes::{parse_decimal, DecimalError};

/// Where a request goes. Keys are raw (still percent-encoded) slices of the
/// path; decode them with [`percent_decode_into`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// `GET`/`HEAD /v1/boxes/{key}`
    Poll {
        key: &'a [u8],
    },
    /// `POST /v1/boxes/{key}`
    IngestKey {
        key: &'a [u8],
    },
    /// `DELETE /v1/boxes/{key}`
    Delete {
        key: &'a [u8],
    },
    /// `GET`/`HEAD /v1/boxes?keys=a,b,c` (docs/http.md#many-boxes-at-once)
    PollMany,
    /// `POST /v1/ingest`
    Ingest,
    Metrics,
    Healthz,
    Readyz,
    NotFound,
    /// 405; `allow` is the `Allow` field value.
    MethodNotAllowed {
        allow: &'static str,
    },
}

const BOXES_PREFIX: &[u8] = b"/v1/boxes/";

/// Route a request by method and raw path (before `?`). Everything after
/// `/v1/boxes/` is the key, slashes included (`/v1/boxes/room-17/alice` is the
/// box `room-17/alice`, as `room-17%2Falice` is); an empty key is not a box
/// path: 404. What a slashed key may hold is [`check_key_segments`]'s.
#[inline]
pub fn route(method: Method, path: &[u8]) -> Route<'_> {
    let get_or_head = matches!(method, Method::Get | Method::Head);
    if let Some(key) = path.strip_prefix(BOXES_PREFIX) {
        if key.is_empty() {
            return Route::NotFound;
        }
        return match method {
            Method::Get | Method::Head => Route::Poll { key },
            Method::Post => Route::IngestKey { key },
            Method::Delete => Route::Delete { key },
            _ => Route::MethodNotAllowed {
                allow: "GET, HEAD, POST, DELETE",
            },
        };
    }
    let read_only = |found: Route<'static>| {
        if get_or_head {
            found
        } else {
            Route::MethodNotAllowed { allow: "GET, HEAD" }
        }
    };
    match path {
        b"/v1/boxes" => read_only(Route::PollMany),
        b"/v1/ingest" if method == Method::Post => Route::Ingest,
        b"/v1/ingest" => Route::MethodNotAllowed { allow: "POST" },
        b"/metrics" => read_only(Route::Metrics),
        b"/healthz" => read_only(Route::Healthz),
        b"/readyz" => read_only(Route::Readyz),
        _ => Route::NotFound,
    }
}

/// A key written with literal slashes in a path must mean the same to every
/// hop: browsers (the URL standard) and proxies (nginx's `merge_slashes`,
/// path normalization) rewrite an empty segment and a `.` or `..` segment
/// (`%2E` counts as a dot), so a request would reach another key than the one
/// written. Such a key is refused (400) with this reason; percent-encoded
/// (`%2F` for each slash) it is one segment that nobody rewrites, and works.
/// `raw` is the raw key (before decoding); a key without a literal `/` is one
/// segment, refused only if it is a dot segment.
#[inline]
pub fn check_key_segments(raw: &[u8]) -> Result<(), &'static str> {
    if !raw.contains(&b'/') {
        return match is_dot_segment(raw) {
            false => Ok(()),
            true => Err("key is a . or .. path segment: send it as %2E"),
        };
    }
    for segment in raw.split(|&b| b == b'/') {
        if segment.is_empty() {
            return Err("key has an empty path segment (a // or a / at an end): \
                        send its slashes as %2F");
        }
        if is_dot_segment(segment) {
            return Err("key has a . or .. path segment: send its slashes as %2F");
        }
    }
    Ok(())
}

/// `.` or `..`, with any dot written `%2E` (the URL standard's dot segments).
fn is_dot_segment(s: &[u8]) -> bool {
    let dot = |s: &[u8]| -> Option<usize> {
        match s {
            [b'.', ..] => Some(1),
            [b'%', b'2', e, ..] if e.eq_ignore_ascii_case(&b'e') => Some(3),
            _ => None,
        }
    };
    match dot(s) {
        Some(n) if n == s.len() => true,
        Some(n) => dot(&s[n..]).is_some_and(|m| n + m == s.len()),
        None => false,
    }
}

/// A `%` not followed by two hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad percent-escape at byte {at}")]
pub struct BadEscape {
    /// Index of the `%` in the raw input.
    pub at: usize,
}

/// Clear `out` and write the percent-decoded `raw` into it. Strict: a `%` not
/// followed by two hex digits is an error (and `out` is left empty); `+` stays
/// `+` (it means space only in form bodies, not in paths). Allocates only if
/// `out` lacks the capacity.
pub fn percent_decode_into(raw: &[u8], out: &mut Vec<u8>) -> Result<(), BadEscape> {
    out.clear();
    // percent-encoding's decoder passes bad escapes through as-is; refuse them
    // first so a key has exactly one spelling.
    let mut i = 0;
    while let Some(p) = raw[i..].iter().position(|&b| b == b'%') {
        let at = i + p;
        match raw.get(at + 1..at + 3) {
            Some([h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => i = at + 3,
            _ => return Err(BadEscape { at }),
        }
    }
    out.extend(percent_encoding::percent_decode(raw));
    Ok(())
}

/// The long-poll parameters of `GET /v1/boxes/{key}?after=V&wait_ms=N`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollQuery {
    /// Answer only once the box's version is greater than this.
    pub after: Option<u64>,
    /// How long to wait for that, in milliseconds (capped by the caller).
    pub wait_ms: Option<u64>,
    /// An event stream resumes after this version (as `Last-Event-ID` does;
    /// for clients that cannot set that header on the first connect).
    pub last_event_id: Option<u64>,
}

/// Parse a raw query string (after `?`). Unknown parameters are ignored; a
/// known one must be a decimal u64, given at most once. A plain poll has no
/// query: that is answered here, inlined, without a call.
#[inline]
pub fn parse_poll_query(q: &[u8]) -> Result<PollQuery, &'static str> {
    if q.is_empty() {
        return Ok(PollQuery::default());
    }
    parse_query_pairs(q)
}

/// The parameters of `GET /v1/boxes?keys=a,b,c&wait_ms=N`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManyQuery<'a> {
    /// The raw (percent-encoded) keys, comma-separated.
    pub keys: &'a [u8],
    /// How long a poll whose `If-None-Match` is current waits for any of the
    /// boxes to move, in milliseconds (capped by the caller).
    pub wait_ms: Option<u64>,
    /// Where an event stream resumes (as `Last-Event-ID` does), raw.
    pub last_event_id: Option<&'a [u8]>,
    /// `prefix=P` (raw), instead of `keys`: every box under P
    /// (docs/boxes.md#rooms).
    pub prefix: Option<&'a [u8]>,
    /// A page's most boxes (`limit=N`).
    pub limit: Option<u64>,
    /// Where a page goes on (`cursor=C`, the previous page's `next`), raw.
    pub cursor: Option<&'a [u8]>,
    /// A prefix's long-poll: the watermark it waits past (`after=W`), raw.
    pub after: Option<&'a [u8]>,
}

/// Parse the query of a many-box poll: `keys` or `prefix` is required (once,
/// not both); `wait_ms` as for one box; `limit` and `cursor` page a prefix;
/// unknown parameters are ignored.
pub fn parse_many_query(q: &[u8]) -> Result<ManyQuery<'_>, &'static str> {
    let mut keys = None;
    let mut wait_ms = None;
    let mut last_event_id = None;
    let (mut prefix, mut limit, mut cursor, mut after) = (None, None, None, None);
    for pair in q.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        match name {
            b"keys" if keys.is_some() => return Err("keys given more than once"),
            b"keys" => keys = Some(value),
            b"wait_ms" if wait_ms.is_some() => return Err("wait_ms given more than once"),
            b"last_event_id" if last_event_id.is_some() => {
                return Err("last_event_id given more than once")
            }
            b"last_event_id" => last_event_id = Some(value),
            b"prefix" if prefix.is_some() => return Err("prefix given more than once"),
            b"prefix" => prefix = Some(value),
            b"after" if after.is_some() => return Err("after given more than once"),
            b"after" => after = Some(value),
            b"cursor" if cursor.is_some() => return Err("cursor given more than once"),
            b"cursor" => cursor = Some(value),
            b"limit" if limit.is_some() => return Err("limit given more than once"),
            b"limit" => {
                limit = Some(parse_decimal(value).map_err(|e| match e {
                    DecimalError::NotDecimal => "limit is not a non-negative decimal integer",
                    DecimalError::TooLarge => "limit is too large",
                })?);
            }
            b"wait_ms" => {
                wait_ms = Some(parse_decimal(value).map_err(|e| match e {
                    DecimalError::NotDecimal => "wait_ms is not a non-negative decimal integer",
                    DecimalError::TooLarge => "wait_ms is too large",
                })?);
            }
            _ => {}
        }
    }
    if keys.is_some() && prefix.is_some() {
        return Err("keys and prefix given together: ask for one");
    }
    if prefix.is_none() && (limit.is_some() || cursor.is_some()) {
        return Err("limit and cursor page a prefix (GET /v1/boxes?prefix=P&limit=N)");
    }
    Ok(ManyQuery {
        keys: match (keys, prefix) {
            (Some(k), _) => k,
            (None, Some(_)) => b"",
            (None, None) => {
                return Err(
                    "keys is missing (GET /v1/boxes?keys=a,b,c), or prefix (?prefix=room-17/)",
                )
            }
        },
        wait_ms,
        last_event_id,
        prefix,
        limit,
        cursor,
        after,
    })
}

fn parse_query_pairs(q: &[u8]) -> Result<PollQuery, &'static str> {
    let mut query = PollQuery::default();
    for pair in q.split(|&b| b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|&b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, &b""[..]),
        };
        match name {
            b"after" => {
                if query.after.is_some() {
                    return Err("after given more than once");
                }
                query.after = Some(parse_decimal(value).map_err(|e| match e {
                    DecimalError::NotDecimal => "after is not a non-negative decimal integer",
                    DecimalError::TooLarge => "after is too large",
                })?);
            }
            b"wait_ms" => {
                if query.wait_ms.is_some() {
                    return Err("wait_ms given more than once");
                }
                query.wait_ms = Some(parse_decimal(value).map_err(|e| match e {
                    DecimalError::NotDecimal => "wait_ms is not a non-negative decimal integer",
                    DecimalError::TooLarge => "wait_ms is too large",
                })?);
            }
            b"last_event_id" => {
                if query.last_event_id.is_some() {
                    return Err("last_event_id given more than once");
                }
                query.last_event_id = Some(parse_decimal(value).map_err(|e| match e {
                    DecimalError::NotDecimal => {
                        "last_event_id is not a non-negative decimal integer"
                    }
                    DecimalError::TooLarge => "last_event_id is too large",
                })?);
            }
            _ => {}
        }
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_routes_by_method() {
        for m in [Method::Get, Method::Head] {
            assert_eq!(
                route(m, b"/v1/boxes/box-42"),
                Route::Poll { key: b"box-42" }
            );
        }
        assert_eq!(
            route(Method::Post, b"/v1/boxes/a%20b"),
            Route::IngestKey { key: b"a%20b" }
        );
        assert_eq!(
            route(Method::Delete, b"/v1/boxes/a%20b"),
            Route::Delete { key: b"a%20b" }
        );
        for m in [Method::Put, Method::Patch, Method::Options, Method::Other] {
            assert_eq!(
                route(m, b"/v1/boxes/k"),
                Route::MethodNotAllowed {
                    allow: "GET, HEAD, POST, DELETE"
                }
            );
        }
    }

    #[test]
    fn everything_after_boxes_is_the_key() {
        assert_eq!(route(Method::Get, b"/v1/boxes/"), Route::NotFound);
        assert_eq!(route(Method::Put, b"/v1/boxes/"), Route::NotFound);
        assert_eq!(
            route(Method::Get, b"/v1/boxes/room-17/alice"),
            Route::Poll {
                key: b"room-17/alice"
            }
        );
        assert_eq!(
            route(Method::Post, b"/v1/boxes/a/b/c"),
            Route::IngestKey { key: b"a/b/c" }
        );
        assert_eq!(
            route(Method::Delete, b"/v1/boxes/a/b"),
            Route::Delete { key: b"a/b" }
        );
        assert_eq!(
            route(Method::Get, b"/v1/boxes/a%2Fb"),
            Route::Poll { key: b"a%2Fb" }
        );
        // Segments are the key's to check (400, not 404): the route is a box.
        assert_eq!(
            route(Method::Get, b"/v1/boxes//"),
            Route::Poll { key: b"/" }
        );
    }

    #[test]
    fn slashed_keys_with_segments_a_hop_rewrites_are_refused() {
        for ok in [
            &b"a"[..],
            b"room-17/alice",
            b"a/b/c",
            b"a%2F%2Fb",
            b"a%2F..%2Fb",
            b"a/.b",
            b"a/..b",
            b"a/b.",
            b"a/%2E%2E%2E",
            b"...",
            b"a%2F.",
        ] {
            assert_eq!(
                check_key_segments(ok),
                Ok(()),
                "{}",
                String::from_utf8_lossy(ok)
            );
        }
        for bad in [
            &b"a//b"[..],
            b"/a",
            b"a/",
            b"/",
            b"a/./b",
            b"a/../b",
            b"a/.",
            b"./a",
            b"a/%2e%2E/b",
            b"a/.%2e",
            b"a/%2E.",
            b"a/%2e",
            b"..",
            b".",
            b"%2e%2E",
        ] {
            assert!(
                check_key_segments(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // `/v1/boxes` itself is the many-box poll (its keys are in the query).
        assert_eq!(route(Method::Get, b"/v1/boxes"), Route::PollMany);
        assert_eq!(route(Method::Head, b"/v1/boxes"), Route::PollMany);
        assert_eq!(
            route(Method::Post, b"/v1/boxes"),
            Route::MethodNotAllowed { allow: "GET, HEAD" }
        );
    }

    #[test]
    fn ingest_is_post_only() {
        assert_eq!(route(Method::Post, b"/v1/ingest"), Route::Ingest);
        for m in [Method::Get, Method::Head, Method::Put, Method::Other] {
            assert_eq!(
                route(m, b"/v1/ingest"),
                Route::MethodNotAllowed { allow: "POST" }
            );
        }
        assert_eq!(route(Method::Post, b"/v1/ingest/"), Route::NotFound);
    }

    #[test]
    fn operational_routes_are_get_or_head() {
        for (p, r) in [
            (&b"/metrics"[..], Route::Metrics),
            (b"/healthz", Route::Healthz),
            (b"/readyz", Route::Readyz),
        ] {
            assert_eq!(route(Method::Get, p), r);
            assert_eq!(route(Method::Head, p), r);
            assert_eq!(
                route(Method::Post, p),
                Route::MethodNotAllowed { allow: "GET, HEAD" }
            );
            assert_eq!(
                route(Method::Delete, p),
                Route::MethodNotAllowed { allow: "GET, HEAD" }
            );
        }
    }

    #[test]
    fn unknown_paths_are_not_found() {
        for p in [
            &b"/"[..],
            b"",
            b"/metrics/",
            b"/v1",
            b"/V1/boxes/a",
            b"*",
            b"/healthz2",
        ] {
            assert_eq!(route(Method::Get, p), Route::NotFound);
            assert_eq!(route(Method::Post, p), Route::NotFound);
        }
    }

    #[test]
    fn percent_decoding() {
        let mut out = b"stale".to_vec();
        percent_decode_into(b"a%20b%2Fc+d%e2%82%AC", &mut out).unwrap();
        assert_eq!(out, "a b/c+d€".as_bytes());
        percent_decode_into(b"plain", &mut out).unwrap();
        assert_eq!(out, b"plain");
        percent_decode_into(b"", &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn bad_escapes_are_refused() {
        let mut out = Vec::new();
        for (raw, at) in [
            (&b"%"[..], 0),
            (b"ab%", 2),
            (b"ab%4", 2),
            (b"%4g", 0),
            (b"%g4", 0),
            (b"%41%", 3),
            (b"x%%41", 1),
        ] {
            out.extend_from_slice(b"junk");
            assert_eq!(percent_decode_into(raw, &mut out), Err(BadEscape { at }));
            assert!(out.is_empty());
        }
    }

    #[test]
    fn poll_query() {
        assert_eq!(parse_poll_query(b""), Ok(PollQuery::default()));
        assert_eq!(
            parse_poll_query(b"after=7&wait_ms=2500"),
            Ok(PollQuery {
                after: Some(7),
                wait_ms: Some(2500),
                ..Default::default()
            })
        );
        assert_eq!(
            parse_poll_query(b"x=1&&wait_ms=0&y&after=18446744073709551615"),
            Ok(PollQuery {
                after: Some(u64::MAX),
                wait_ms: Some(0),
                ..Default::default()
            })
        );
        assert_eq!(
            parse_poll_query(b"after=1"),
            Ok(PollQuery {
                after: Some(1),
                wait_ms: None,
                ..Default::default()
            })
        );
    }

    #[test]
    fn poll_query_errors_are_specific() {
        for (q, msg) in [
            (
                &b"after=-1"[..],
                "after is not a non-negative decimal integer",
            ),
            (b"after=", "after is not a non-negative decimal integer"),
            (b"after", "after is not a non-negative decimal integer"),
            (b"after=+5", "after is not a non-negative decimal integer"),
            (b"after=1.5", "after is not a non-negative decimal integer"),
            (b"after=18446744073709551616", "after is too large"),
            (
                b"wait_ms=abc",
                "wait_ms is not a non-negative decimal integer",
            ),
            (b"wait_ms=99999999999999999999", "wait_ms is too large"),
            (b"after=1&after=2", "after given more than once"),
            (b"wait_ms=1&wait_ms=1", "wait_ms given more than once"),
        ] {
            assert_eq!(
                parse_poll_query(q),
                Err(msg),
                "{:?}",
                String::from_utf8_lossy(q)
            );
        }
    }
}
