//! What a framed request gets back: routing, polls, ingest, auth, and the
//! response bytes rendered into the connection's send queue.
//!
//! Everything here runs on a worker between reads; nothing here blocks. The
//! parsed body lives in the worker's arena only for the duration of [`handle`].

use crate::metrics;
use crate::send_queue::{BufferPool, SendQueue};
use crate::stats::{RouteLabel, WorkerStats};
use crate::Shared;
use pollbox_core::epoch::Epoch;
use pollbox_core::http::{
    parse_poll_query, percent_decode_into, route, write_head_end, write_response_head, DateCache,
    Frame, HttpError, Method, Route, Version,
};
use pollbox_core::plan::MessageError;
use pollbox_core::projection::{BodyFormat, KeySource, Projector, Shape};

const JSON: &[u8] = b"application/json";
const TEXT: &[u8] = b"text/plain; charset=utf-8";
/// At most this many errors are listed in a batch answer (SPEC §2).
const MAX_LISTED_ERRORS: usize = 16;

/// The start of the most common response heads (200 and 304, JSON, keep-alive
/// HTTP/1.1), pre-rendered with the current `Date` and rebuilt only when the
/// date changes: a poll's head is then one copy plus its length and `ETag`.
pub struct HeadCache {
    date: Vec<u8>,
    ok_json: Vec<u8>,
    not_modified_json: Vec<u8>,
}

impl HeadCache {
    pub fn new(date: &[u8]) -> HeadCache {
        let mut h = HeadCache {
            date: Vec::with_capacity(32),
            ok_json: Vec::with_capacity(128),
            not_modified_json: Vec::with_capacity(128),
        };
        h.refresh(date);
        h
    }

    /// Re-render if `date` changed (called at each tick).
    pub fn refresh(&mut self, date: &[u8]) {
        if self.date == date {
            return;
        }
        self.date.clear();
        self.date.extend_from_slice(date);
        for (code, out) in [(200, &mut self.ok_json), (304, &mut self.not_modified_json)] {
            out.clear();
            // Everything write_response_head writes before the length's digits.
            write_response_head(out, code, JSON, 0, date, true, Version::Http11, &[]);
            let cut = out.len() - b"0\r\n\r\n".len();
            out.truncate(cut);
        }
    }

    /// The cached prefix for this head, if there is one.
    #[inline]
    fn prefix(
        &self,
        code: u16,
        content_type: &[u8],
        keep_alive: bool,
        version: Version,
    ) -> Option<&[u8]> {
        if !keep_alive || version != Version::Http11 || content_type != JSON {
            return None;
        }
        match code {
            200 => Some(&self.ok_json),
            304 => Some(&self.not_modified_json),
            _ => None,
        }
    }
}

/// The parts of a worker a request handler uses (everything but the connections).
pub struct Ctx {
    pub shared: std::sync::Arc<Shared>,
    pub worker: usize,
    pub epoch: Epoch,
    pub projector: Projector,
    pub pool: BufferPool,
    pub date: DateCache,
    pub heads: HeadCache,
    /// Percent-decoded key of the current request.
    pub key: Vec<u8>,
    /// Rendered body of the current response.
    pub body: Vec<u8>,
}

impl Ctx {
    #[inline]
    pub fn stats(&self) -> &WorkerStats {
        &self.shared.stats[self.worker]
    }
}

/// What the connection does after a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    KeepAlive,
    Close,
}

/// A long-poll that has to wait: the connection parks until the box's version
/// passes `after` or the deadline comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Park {
    pub after: u64,
    pub wait_ms: u64,
}

/// What [`handle`] did with a request.
pub enum Handled {
    Answered(After),
    Park(Park),
}

/// Answer one framed request. `buf` is the slice the frame's ranges index.
pub fn handle(
    ctx: &mut Ctx,
    frame: &Frame,
    buf: &[u8],
    q: &mut SendQueue,
    draining: bool,
) -> Handled {
    let keep_alive = frame.keep_alive && !draining;
    let path = &buf[frame.path.clone()];
    let head = frame.method == Method::Head;
    let r = route(frame.method, path);
    let after = if keep_alive {
        After::KeepAlive
    } else {
        After::Close
    };
    match r {
        Route::Poll { key } => {
            let query = &buf[frame.query.clone()];
            // A bad query or a bad key: one 400 with the specific reason.
            let pq = match parse_poll_query(query).and_then(|pq| decode_key(ctx, key).map(|()| pq))
            {
                Ok(pq) => pq,
                Err(what) => {
                    return Handled::Answered(error(
                        ctx,
                        q,
                        frame,
                        RouteLabel::Poll,
                        400,
                        what,
                        keep_alive,
                    ))
                }
            };
            if let (Some(after_v), Some(wait)) = (pq.after, pq.wait_ms) {
                let now_v = ctx.shared.boxes.version(&ctx.key).unwrap_or(0);
                let wait = wait.min(ctx.shared.config.limits.max_wait_ms);
                if now_v <= after_v && wait > 0 {
                    return Handled::Park(Park {
                        after: after_v,
                        wait_ms: wait,
                    });
                }
            }
            let label = if pq.after.is_some() && pq.wait_ms.is_some() {
                RouteLabel::LongPoll
            } else {
                RouteLabel::Poll
            };
            Handled::Answered(answer_poll(
                ctx, q, frame, buf, label, head, keep_alive, false,
            ))
        }
        Route::IngestKey { key } => {
            if let Some(a) = check_auth(ctx, q, frame, buf, RouteLabel::IngestKey, keep_alive) {
                return Handled::Answered(a);
            }
            if let Err(what) = decode_key(ctx, key) {
                return Handled::Answered(error(
                    ctx,
                    q,
                    frame,
                    RouteLabel::IngestKey,
                    400,
                    what,
                    keep_alive,
                ));
            }
            Handled::Answered(ingest(ctx, q, frame, buf, KeySource::Path, keep_alive))
        }
        Route::Ingest => {
            if let Some(a) = check_auth(ctx, q, frame, buf, RouteLabel::Ingest, keep_alive) {
                return Handled::Answered(a);
            }
            Handled::Answered(ingest(ctx, q, frame, buf, KeySource::Body, keep_alive))
        }
        Route::Metrics => {
            ctx.body.clear();
            metrics::render(&ctx.shared, &mut ctx.body);
            respond(
                ctx,
                q,
                frame.version,
                RouteLabel::Metrics,
                200,
                metrics::CONTENT_TYPE,
                head,
                keep_alive,
                &[],
            );
            Handled::Answered(after)
        }
        Route::Healthz => {
            ctx.body.clear();
            ctx.body.extend_from_slice(b"ok");
            respond(
                ctx,
                q,
                frame.version,
                RouteLabel::Healthz,
                200,
                TEXT,
                head,
                keep_alive,
                &[],
            );
            Handled::Answered(after)
        }
        Route::Readyz => {
            let ready = ctx.shared.is_ready() && !draining;
            ctx.body.clear();
            ctx.body.extend_from_slice(if ready {
                b"ready".as_slice()
            } else {
                b"draining"
            });
            let code = if ready { 200 } else { 503 };
            respond(
                ctx,
                q,
                frame.version,
                RouteLabel::Readyz,
                code,
                TEXT,
                head,
                keep_alive,
                &[],
            );
            Handled::Answered(after)
        }
        Route::NotFound => Handled::Answered(error(
            ctx,
            q,
            frame,
            RouteLabel::Other,
            404,
            "not found",
            keep_alive,
        )),
        Route::MethodNotAllowed { allow } => {
            json_error_body(&mut ctx.body, "method not allowed");
            respond(
                ctx,
                q,
                frame.version,
                RouteLabel::Other,
                405,
                JSON,
                head,
                keep_alive,
                &[(b"Allow", allow.as_bytes())],
            );
            Handled::Answered(after)
        }
    }
}

/// Answer a (long-)poll for the key in `ctx.key`. `parked_timeout`: the wait
/// ran out, so an unchanged box answers 304.
#[allow(clippy::too_many_arguments)]
pub fn answer_poll(
    ctx: &mut Ctx,
    q: &mut SendQueue,
    frame: &Frame,
    buf: &[u8],
    label: RouteLabel,
    head: bool,
    keep_alive: bool,
    parked_timeout: bool,
) -> After {
    ctx.body.clear();
    let Some(version) = ctx.shared.boxes.poll(&ctx.key, &mut ctx.body) else {
        if parked_timeout {
            // Nothing was ever ingested for this key while we waited.
            ctx.body.clear();
            respond(
                ctx,
                q,
                frame.version,
                label,
                304,
                JSON,
                true,
                keep_alive,
                &[],
            );
            return after(keep_alive);
        }
        return error(ctx, q, frame, label, 404, "no such box", keep_alive);
    };
    let mut etag_buf = [0u8; 24];
    let etag = render_etag(version, &mut etag_buf);
    let not_modified = frame
        .if_none_match
        .clone()
        .is_some_and(|r| etag_matches(&buf[r], etag))
        || parked_timeout;
    let code = if not_modified { 304 } else { 200 };
    // A 304 carries the Content-Length the 200 would have (RFC 9110 §8.6), no body.
    respond(
        ctx,
        q,
        frame.version,
        label,
        code,
        JSON,
        head || not_modified,
        keep_alive,
        &[(b"ETag", etag)],
    );
    after(keep_alive)
}

fn after(keep_alive: bool) -> After {
    if keep_alive {
        After::KeepAlive
    } else {
        After::Close
    }
}

fn render_etag(version: u64, buf: &mut [u8; 24]) -> &[u8] {
    let mut it = itoa::Buffer::new();
    let digits = it.format(version).as_bytes();
    buf[0] = b'"';
    buf[1..1 + digits.len()].copy_from_slice(digits);
    buf[1 + digits.len()] = b'"';
    &buf[..digits.len() + 2]
}

/// `If-None-Match`: `*`, or a comma-separated list of (possibly weak) tags.
fn etag_matches(header: &[u8], etag: &[u8]) -> bool {
    header.split(|&b| b == b',').any(|t| {
        let t = t.trim_ascii();
        let t = t.strip_prefix(b"W/").unwrap_or(t);
        t == etag || t == b"*"
    })
}

fn decode_key(ctx: &mut Ctx, raw: &[u8]) -> Result<(), &'static str> {
    percent_decode_into(raw, &mut ctx.key).map_err(|_| "bad percent-encoding in key")?;
    if std::str::from_utf8(&ctx.key).is_err() {
        return Err("key is not valid UTF-8");
    }
    Ok(())
}

/// `None` when the request may ingest; otherwise the 401 was answered.
fn check_auth(
    ctx: &mut Ctx,
    q: &mut SendQueue,
    frame: &Frame,
    buf: &[u8],
    label: RouteLabel,
    keep_alive: bool,
) -> Option<After> {
    let tokens = &ctx.shared.tokens;
    if tokens.is_empty() {
        return None;
    }
    let given = frame.authorization.clone().map(|r| &buf[r]).and_then(|h| {
        let h = h.trim_ascii();
        (h.len() > 7 && h[..7].eq_ignore_ascii_case(b"bearer ")).then(|| h[7..].trim_ascii())
    });
    // Compare against every token, always fully, so timing says nothing.
    let ok = given.is_some_and(|g| {
        tokens
            .iter()
            .fold(false, |acc, t| acc | constant_time_eq(g, t))
    });
    if ok {
        return None;
    }
    json_error_body(&mut ctx.body, "missing or invalid bearer token");
    respond(
        ctx,
        q,
        frame.version,
        label,
        401,
        JSON,
        frame.method == Method::Head,
        keep_alive,
        &[(b"WWW-Authenticate", b"Bearer")],
    );
    Some(after(keep_alive))
}

/// Equal-length inputs are compared in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

fn ingest(
    ctx: &mut Ctx,
    q: &mut SendQueue,
    frame: &Frame,
    buf: &[u8],
    keys: KeySource,
    keep_alive: bool,
) -> After {
    let label = match keys {
        KeySource::Path => RouteLabel::IngestKey,
        KeySource::Body => RouteLabel::Ingest,
    };
    let body = &buf[frame.body.clone()];
    let format = match &frame.content_type {
        Some(r) if is_ndjson(&buf[r.clone()]) => BodyFormat::Ndjson,
        _ => BodyFormat::Json,
    };
    // Split the context: the batch borrows the arena while answers are written.
    let Ctx {
        shared,
        worker,
        epoch,
        projector,
        pool,
        date,
        heads,
        key: path_key,
        body: out,
    } = ctx;
    let stats = &shared.stats[*worker];
    let boxes = &shared.boxes;
    let mut answer = Answer {
        pool,
        date,
        heads,
        stats,
        q,
        version: frame.version,
        label,
        keep_alive,
    };
    out.clear();
    let batch = match projector.project(epoch.arena(), body, format, keys) {
        Ok(b) => b,
        Err(e) => {
            stats.ingest_result("invalid_body");
            out.extend_from_slice(b"{\"error\":\"");
            e.write_message(out);
            out.extend_from_slice(b"\"}");
            answer.send(e.status(), JSON, out, false, &[]);
            return after(keep_alive);
        }
    };
    if batch.shape == Shape::Object {
        // One message: answer with the box's new payload, or 422/507.
        let (key, result) = match batch.items.first() {
            Some(Ok(m)) => {
                let key = match keys {
                    KeySource::Path => std::str::from_utf8(path_key).unwrap_or(""),
                    KeySource::Body => m.key,
                };
                (key, boxes.apply(key, m.values, Some(out)))
            }
            Some(Err(e)) => ("", Err(*e)),
            None => ("", Err(MessageError::NotAnObject)),
        };
        match result {
            Ok(_) => {
                shared.waiters.notify(key.as_bytes());
                stats.ingest_accepted(1);
                answer.send(200, JSON, out, false, &[]);
            }
            Err(e) => {
                stats.ingest_result(e.metric_label());
                out.clear();
                out.extend_from_slice(b"{\"error\":\"");
                e.write_reason(boxes.plan(), out);
                out.extend_from_slice(b"\"}");
                answer.send(e.status(), JSON, out, false, &[]);
            }
        }
        return after(keep_alive);
    }
    // A batch: apply in order, list up to 16 errors.
    let mut accepted = 0u64;
    let mut rejected = 0u64;
    out.extend_from_slice(b"{\"accepted\":");
    let counts_at = out.len();
    out.extend_from_slice(b",\"errors\":[");
    for (i, item) in batch.items.iter().enumerate() {
        let res = match item {
            Ok(m) => boxes.apply(m.key, m.values, None).map(|_| {
                shared.waiters.notify(m.key.as_bytes());
            }),
            Err(e) => Err(*e),
        };
        match res {
            Ok(()) => accepted += 1,
            Err(e) => {
                stats.ingest_result(e.metric_label());
                if (rejected as usize) < MAX_LISTED_ERRORS {
                    if rejected > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(b"{\"i\":");
                    out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
                    out.extend_from_slice(b",\"error\":\"");
                    e.write_reason(boxes.plan(), out);
                    out.extend_from_slice(b"\"}");
                }
                rejected += 1;
            }
        }
    }
    stats.ingest_accepted(accepted);
    out.extend_from_slice(b"]}");
    // The counts are known only now: splice them in before the error list.
    let mut counts = [0u8; 64];
    let mut n = 0;
    for part in [
        itoa::Buffer::new().format(accepted).as_bytes(),
        b",\"rejected\":",
        itoa::Buffer::new().format(rejected).as_bytes(),
    ] {
        counts[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    out.splice(counts_at..counts_at, counts[..n].iter().copied());
    answer.send(200, JSON, out, false, &[]);
    after(keep_alive)
}

/// Where an answer goes, for code that holds the context in parts.
struct Answer<'a> {
    pool: &'a mut BufferPool,
    date: &'a DateCache,
    heads: &'a HeadCache,
    stats: &'a WorkerStats,
    q: &'a mut SendQueue,
    version: Version,
    label: RouteLabel,
    keep_alive: bool,
}

impl Answer<'_> {
    fn send(
        &mut self,
        code: u16,
        content_type: &[u8],
        body: &[u8],
        head_only: bool,
        extra: &[(&[u8], &[u8])],
    ) {
        write_answer(
            self.pool,
            self.date,
            self.heads,
            self.stats,
            self.q,
            self.version,
            self.label,
            code,
            content_type,
            body,
            head_only,
            self.keep_alive,
            extra,
        );
    }
}

fn is_ndjson(content_type: &[u8]) -> bool {
    let mime = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or(b"")
        .trim_ascii();
    mime.eq_ignore_ascii_case(b"application/x-ndjson")
        || mime.eq_ignore_ascii_case(b"application/ndjson")
        || mime.eq_ignore_ascii_case(b"application/jsonl")
}

fn json_error_body(out: &mut Vec<u8>, what: &str) {
    out.clear();
    out.extend_from_slice(b"{\"error\":\"");
    out.extend_from_slice(what.as_bytes());
    out.extend_from_slice(b"\"}");
}

/// Answer with `{"error":"<what>"}`.
fn error(
    ctx: &mut Ctx,
    q: &mut SendQueue,
    frame: &Frame,
    label: RouteLabel,
    code: u16,
    what: &str,
    keep_alive: bool,
) -> After {
    json_error_body(&mut ctx.body, what);
    respond(
        ctx,
        q,
        frame.version,
        label,
        code,
        JSON,
        frame.method == Method::Head,
        keep_alive,
        &[],
    );
    after(keep_alive)
}

/// Answer a framing error (the connection closes after it).
pub fn framing_error(ctx: &mut Ctx, q: &mut SendQueue, e: HttpError) {
    json_error_body(&mut ctx.body, e.reason());
    respond(
        ctx,
        q,
        Version::Http11,
        RouteLabel::Other,
        e.status(),
        JSON,
        false,
        false,
        &[],
    );
}

/// Answer 408 (header or body timeout); the connection closes after it.
pub fn timeout(ctx: &mut Ctx, q: &mut SendQueue) {
    json_error_body(&mut ctx.body, "request timeout");
    respond(
        ctx,
        q,
        Version::Http11,
        RouteLabel::Other,
        408,
        JSON,
        false,
        false,
        &[],
    );
}

/// Answer 503 (arena full, or a connection over the cap).
pub fn unavailable(ctx: &mut Ctx, q: &mut SendQueue, what: &str) {
    json_error_body(&mut ctx.body, what);
    respond(
        ctx,
        q,
        Version::Http11,
        RouteLabel::Other,
        503,
        JSON,
        false,
        false,
        &[],
    );
}

/// Write the head for `ctx.body` (and the body unless `head_only`) to the queue.
#[allow(clippy::too_many_arguments)]
pub fn respond(
    ctx: &mut Ctx,
    q: &mut SendQueue,
    version: Version,
    label: RouteLabel,
    code: u16,
    content_type: &[u8],
    head_only: bool,
    keep_alive: bool,
    extra: &[(&[u8], &[u8])],
) {
    write_answer(
        &mut ctx.pool,
        &ctx.date,
        &ctx.heads,
        &ctx.shared.stats[ctx.worker],
        q,
        version,
        label,
        code,
        content_type,
        &ctx.body,
        head_only,
        keep_alive,
        extra,
    );
}

/// Render one response (head, then `body` unless `head_only`) into the queue
/// and count it.
#[allow(clippy::too_many_arguments)]
fn write_answer(
    pool: &mut BufferPool,
    date: &DateCache,
    heads: &HeadCache,
    stats: &WorkerStats,
    q: &mut SendQueue,
    version: Version,
    label: RouteLabel,
    code: u16,
    content_type: &[u8],
    body: &[u8],
    head_only: bool,
    keep_alive: bool,
    extra: &[(&[u8], &[u8])],
) {
    let out = q.tail(pool);
    let before = out.len();
    match heads.prefix(code, content_type, keep_alive, version) {
        Some(prefix) => {
            out.extend_from_slice(prefix);
            out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
            write_head_end(out, extra);
        }
        None => write_response_head(
            out,
            code,
            content_type,
            body.len(),
            date.get(),
            keep_alive,
            version,
            extra,
        ),
    }
    if !head_only {
        out.extend_from_slice(body);
    }
    let n = out.len() - before;
    q.commit(n);
    stats.request(label, code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_match_lists_weak_and_star() {
        assert!(etag_matches(b"\"5\"", b"\"5\""));
        assert!(etag_matches(b"\"4\", W/\"5\"", b"\"5\""));
        assert!(etag_matches(b"*", b"\"5\""));
        assert!(!etag_matches(b"\"55\"", b"\"5\""));
        assert!(!etag_matches(b"5", b"\"5\""));
    }

    #[test]
    fn cached_heads_equal_written_heads() {
        let date = b"Sun, 06 Nov 1994 08:49:37 GMT";
        let h = HeadCache::new(date);
        for code in [200u16, 304] {
            let extra: &[(&[u8], &[u8])] = &[(b"ETag", b"\"7\"")];
            let mut want = Vec::new();
            write_response_head(
                &mut want,
                code,
                JSON,
                53,
                date,
                true,
                Version::Http11,
                extra,
            );
            let mut got = h
                .prefix(code, JSON, true, Version::Http11)
                .unwrap()
                .to_vec();
            got.extend_from_slice(b"53\r\nETag: \"7\"\r\n\r\n");
            assert_eq!(
                String::from_utf8(got).unwrap(),
                String::from_utf8(want).unwrap()
            );
        }
        assert!(h.prefix(200, JSON, false, Version::Http11).is_none());
        assert!(h.prefix(200, JSON, true, Version::Http10).is_none());
        assert!(h.prefix(404, JSON, true, Version::Http11).is_none());
        assert!(h.prefix(200, TEXT, true, Version::Http11).is_none());
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn etag_renders_quoted() {
        let mut b = [0u8; 24];
        assert_eq!(render_etag(42, &mut b), b"\"42\"");
        assert_eq!(render_etag(u64::MAX, &mut b), b"\"18446744073709551615\"");
    }
}
