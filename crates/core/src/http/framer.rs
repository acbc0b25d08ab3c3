//! The per-connection request framer: head scan, head parse, body framing.
//!
//! The head is found by a resumable scan that also enforces the line rules the
//! module doc lists (CRLF only, no obs-fold, header count, head size); only a
//! complete head is parsed, once, by the grammar in `head.rs`. The body is then framed by
//! `Content-Length` or by the chunked decoder in `chunked.rs`.

use std::ops::Range;

use super::chunked::Dechunk;
use super::head::{self, Malformed};
use super::{Frame, FramerState, HttpError, Limits, Progress, Version};
use crate::bytes::{find_lf, parse_decimal};

/// The most header lines a head may have, whatever `Limits::max_headers` says
/// (the config refuses more than this).
pub const MAX_HEADERS: usize = 1024;

/// Frames the requests of one connection, one at a time. Holds no buffer: the
/// caller owns the bytes; the framer remembers only positions in them, so it is
/// reusable and allocates nothing.
#[derive(Debug)]
pub struct Framer {
    limits: Limits,
    phase: Phase,
    /// Bytes examined so far, over the framer's life: lets tests check that
    /// progress is kept between calls instead of rescanning.
    examined: u64,
}

// A frame is kept by value, not boxed: boxing would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Phase {
    Head(HeadScan),
    Body {
        frame: Frame,
        body: BodyFraming,
    },
    /// A refused request: the same error again until `reset`, since the next
    /// request boundary is unknown.
    Failed(HttpError),
}

#[derive(Debug)]
enum BodyFraming {
    /// Body ends at this index.
    Length {
        end: usize,
    },
    Chunked(Dechunk),
}

/// Progress of the search for the blank line that ends a head. All positions
/// index the caller's slice, which starts at the request boundary.
#[derive(Debug, Default, Clone, Copy)]
struct HeadScan {
    /// Next byte to examine.
    pos: usize,
    /// First byte of the request line, once a non-empty line began.
    start: Option<usize>,
    /// First byte of the line being scanned.
    line_start: usize,
    /// Lines completed since the request line began (the request line included).
    lines: usize,
}

/// A parsed head: what it says about the body, and the frame to complete.
struct Head {
    frame: Frame,
    body: BodyKind,
}

enum BodyKind {
    None,
    Length(usize),
    Chunked,
}

impl Framer {
    pub fn new(limits: Limits) -> Framer {
        Framer {
            limits: Limits {
                max_headers: limits.max_headers.min(MAX_HEADERS),
                ..limits
            },
            phase: Phase::Head(HeadScan::default()),
            examined: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// `buf` starts at a request boundary and holds every byte received since
    /// it. Between `Partial` calls the caller may append bytes at the end (and
    /// may move the whole slice) but never drops bytes from the front. After
    /// `Complete`, the caller handles the request, then continues with
    /// `&mut buf[frame.consumed..]`. Progress is kept between calls, so each byte
    /// is examined a bounded number of times. Chunked bodies are decoded in
    /// place, so bytes of `buf` after the head may be rewritten.
    pub fn advance(&mut self, buf: &mut [u8]) -> Result<Progress, HttpError> {
        let mut send_continue = false;
        if let Phase::Head(scan) = &mut self.phase {
            // The common request: a whole, well-formed head at the front of
            // `buf`, read in one pass. Anything else (a partial head, a
            // refusal, empty lines first) is scanned, then parsed.
            let one_pass = match buf.first() {
                Some(b) if scan.pos == 0 && *b != b'\r' && *b != b'\n' => {
                    parse_head(buf, 0, &self.limits, Pass::One)
                }
                _ => Err(Failed::Scan),
            };
            let (head, head_end) = match one_pass {
                Ok((head, end)) => {
                    self.examined += end as u64;
                    (head, end)
                }
                Err(Failed::Refused(e)) => return Err(self.fail(e)),
                Err(Failed::Scan) => {
                    let before = scan.pos;
                    let found = scan_head(scan, buf, &self.limits);
                    self.examined += scan.pos.saturating_sub(before) as u64;
                    let head_end = match found {
                        Ok(Some(end)) => end,
                        Ok(None) => return Ok(Progress::Partial { send_continue }),
                        Err(e) => return Err(self.fail(e)),
                    };
                    let start = scan.start.unwrap_or(0);
                    match parse_head(&buf[..head_end], start, &self.limits, Pass::Scanned) {
                        Ok(parsed) => parsed,
                        Err(Failed::Refused(e)) => return Err(self.fail(e)),
                        // Not returned for a scanned head.
                        Err(Failed::Scan) => return Err(self.fail(HttpError::MalformedHeader)),
                    }
                }
            };
            let body = match head.body {
                BodyKind::None => {
                    return Ok(self.complete(head.frame, head_end..head_end, head_end))
                }
                BodyKind::Length(n) => match head_end.checked_add(n) {
                    Some(end) => BodyFraming::Length { end },
                    // Only with a max_body_bytes near usize::MAX.
                    None => return Err(self.fail(HttpError::BodyTooLarge)),
                },
                BodyKind::Chunked => BodyFraming::Chunked(Dechunk::new(head_end)),
            };
            send_continue = head.frame.expect_continue;
            self.phase = Phase::Body {
                frame: head.frame,
                body,
            };
        }
        match &mut self.phase {
            Phase::Head(_) => Ok(Progress::Partial { send_continue }),
            Phase::Failed(e) => Err(*e),
            Phase::Body { frame, body } => {
                let (body_range, consumed) = match body {
                    BodyFraming::Length { end } => {
                        if buf.len() < *end {
                            return Ok(Progress::Partial { send_continue });
                        }
                        (frame.body.start..*end, *end)
                    }
                    BodyFraming::Chunked(d) => {
                        let before = d.raw();
                        let done = d.run(buf, &self.limits);
                        self.examined += d.raw().saturating_sub(before) as u64;
                        match done {
                            Ok(true) => (d.body(), d.raw()),
                            Ok(false) => return Ok(Progress::Partial { send_continue }),
                            Err(e) => return Err(self.fail(e)),
                        }
                    }
                };
                let frame = frame.clone();
                Ok(self.complete(frame, body_range, consumed))
            }
        }
    }

    pub fn state(&self) -> FramerState {
        match &self.phase {
            Phase::Head(scan) if scan.start.is_none() => FramerState::Idle,
            Phase::Head(_) | Phase::Failed(_) => FramerState::Head,
            Phase::Body { .. } => FramerState::Body,
        }
    }

    /// The head of the request whose body is still awaited
    /// ([`FramerState::Body`]): rules that need only the head can be applied
    /// before the body comes.
    pub fn awaited_head(&self) -> Option<&Frame> {
        match &self.phase {
            Phase::Body { frame, .. } => Some(frame),
            _ => None,
        }
    }

    /// Forget a partial (or refused) request; the next `advance` starts at a
    /// request boundary.
    pub fn reset(&mut self) {
        self.phase = Phase::Head(HeadScan::default());
    }

    /// Bytes examined over the framer's life (head scan and chunk decoding; the
    /// one parse of each complete head is not counted). For tests
    /// that check progress is kept between calls.
    pub fn bytes_examined(&self) -> u64 {
        self.examined
    }

    fn fail(&mut self, e: HttpError) -> HttpError {
        self.phase = Phase::Failed(e);
        e
    }

    fn complete(&mut self, mut frame: Frame, body: Range<usize>, consumed: usize) -> Progress {
        frame.body = body;
        frame.consumed = consumed;
        self.phase = Phase::Head(HeadScan::default());
        Progress::Complete(frame)
    }
}

/// Scan for the end of the head from where the last call stopped. Returns the
/// index just past the blank line, or `None` when more bytes are needed.
///
/// Only LFs are searched for (a word at a time); each must follow a CR. The
/// first byte of each line is judged once it has arrived: whitespace there is
/// obs-fold, and a line starting with CR must be the blank line. A bare CR
/// inside a line is left to the head grammar, which refuses it (see `bare_cr_error`).
/// Only the first `max_header_bytes` bytes are looked at: past them the head
/// is too large whatever follows.
fn scan_head(s: &mut HeadScan, buf: &[u8], limits: &Limits) -> Result<Option<usize>, HttpError> {
    let limit = buf.len().min(limits.max_header_bytes);
    while s.pos < limit {
        if s.pos == s.line_start {
            let first = buf[s.pos];
            if s.start.is_none() {
                if first != b'\r' && first != b'\n' {
                    s.start = Some(s.pos);
                }
            } else if first == b' ' || first == b'\t' {
                return Err(HttpError::ObsFold);
            }
        }
        let Some(found) = find_lf(&buf[s.pos..limit]) else {
            s.pos = limit;
            break;
        };
        let lf = s.pos + found;
        s.pos = lf + 1;
        // The byte before an LF is ours (the slice starts at the request
        // boundary), unless the LF is the very first byte.
        if lf == 0 || buf[lf - 1] != b'\r' {
            return Err(HttpError::BareLf);
        }
        let empty = lf - 1 == s.line_start;
        if !empty && buf[s.line_start] == b'\r' {
            return Err(HttpError::BareCr);
        }
        s.line_start = lf + 1;
        if s.start.is_some() {
            if empty {
                return Ok(Some(lf + 1));
            }
            s.lines += 1;
            // The request line is not a header.
            if s.lines - 1 > limits.max_headers {
                return Err(HttpError::TooManyHeaders);
            }
        }
    }
    if buf.len() > limits.max_header_bytes {
        return Err(HttpError::HeadTooLarge);
    }
    Ok(None)
}

/// The head grammar refuses a CR not followed by LF wherever it is; say so precisely
/// instead of "malformed".
fn bare_cr_error(head: &[u8], otherwise: HttpError) -> HttpError {
    let bare = head.windows(2).any(|w| w[0] == b'\r' && w[1] != b'\n');
    if bare {
        HttpError::BareCr
    } else {
        otherwise
    }
}

/// Why [`parse_head`] gave no head.
enum Failed {
    /// The request is refused.
    Refused(HttpError),
    /// One pass ([`Pass::One`]) cannot tell: the head is incomplete, breaks a
    /// rule, or is over a limit. The scan, then a parse of the complete head,
    /// says which.
    Scan,
}

/// How [`parse_head`] is called.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// On a whole head that the scan found: `buf` ends with its blank line.
    Scanned,
    /// On a request's bytes from its first byte, before any scan: succeeds
    /// only where the scan would have found nothing to refuse, so that the
    /// common request is read in one pass.
    One,
}

/// Parse the head at `buf[start..]` (bytes before `start` are empty lines).
/// Every range in the frame indexes `buf`. Returns the head and where it ends
/// (just past its blank line). Inlined into both callers, so the frame is
/// built where it is returned instead of being copied out (callgrind).
#[inline(always)]
fn parse_head(
    buf: &[u8],
    start: usize,
    limits: &Limits,
    pass: Pass,
) -> Result<(Head, usize), Failed> {
    let refuse = |why: Malformed| {
        if pass == Pass::One {
            return Failed::Scan;
        }
        let e = match why {
            Malformed::RequestLine => HttpError::MalformedRequestLine,
            Malformed::Header => HttpError::MalformedHeader,
            Malformed::Version => version_error(&buf[start..]),
        };
        Failed::Refused(bare_cr_error(&buf[start..], e))
    };
    let line = head::request_line(buf, start).map_err(refuse)?;
    let version = line.version;
    let method = line.method;
    let (path, query) = match (buf[line.target.start], line.question, line.hash) {
        // Origin-form, the norm: split where the line scan saw `?` and `#`.
        (b'/', question, hash) => {
            let end = hash.unwrap_or(line.target.end);
            match question.filter(|&q| q < end) {
                Some(q) => (line.target.start..q, q + 1..end),
                None => (line.target.start..end, end..end),
            }
        }
        _ => split_target(buf, line.target.clone()),
    };

    let mut content_length: Option<u64> = None;
    let mut te = TransferCodings::default();
    let mut close = false;
    let mut keep_alive_token = false;
    let mut expect = false;
    let mut if_none_match = None;
    let mut authorization = None;
    let mut hosts: u8 = 0;
    let mut content_type = None;
    let mut origin = None;
    let mut accept = None;
    let mut last_event_id = None;
    // A field's meaning is refused only once the whole head has passed the
    // grammar: a malformed line anywhere is reported first.
    let mut refused: Option<HttpError> = None;

    let mut fields = head::Fields::new(buf, line.end);
    let mut lines = 0;
    while let Some((name, range)) = fields.next_field().map_err(refuse)? {
        lines += 1;
        let value = &buf[range.clone()];
        match name.len() {
            4 if name_is(name, b"host") => hosts = hosts.saturating_add(1),
            6 if name_is(name, b"expect") => {
                expect |= value.eq_ignore_ascii_case(b"100-continue");
            }
            6 if name_is(name, b"origin") => {
                origin = origin.or_else(|| range32(range));
            }
            6 if name_is(name, b"accept") => {
                accept = accept.or_else(|| range32(range));
            }
            10 if name_is(name, b"connection") => {
                for token in list_elements(value) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
            }
            12 if name_is(name, b"content-type") => {
                content_type = content_type.or_else(|| range32(range));
            }
            13 if name_is(name, b"if-none-match") => {
                if_none_match = if_none_match.or_else(|| range32(range));
            }
            13 if name_is(name, b"authorization") => {
                authorization = authorization.or_else(|| range32(range));
            }
            13 if name_is(name, b"last-event-id") => {
                last_event_id = last_event_id.or_else(|| range32(range));
            }
            14 if name_is(name, b"content-length") => {
                // `1*DIGIT`: no sign, no list, no overflow.
                match parse_decimal(value) {
                    Ok(n) if content_length.is_some_and(|seen| seen != n) => {
                        refused.get_or_insert(HttpError::ConflictingContentLength);
                    }
                    Ok(n) => content_length = Some(n),
                    Err(_) => {
                        refused.get_or_insert(HttpError::InvalidContentLength);
                    }
                }
            }
            17 if name_is(name, b"transfer-encoding") => te.add(value),
            _ => {}
        }
    }
    let head_end = fields.end();
    if pass == Pass::One && (lines > limits.max_headers || head_end > limits.max_header_bytes) {
        return Err(Failed::Scan);
    }
    if let Some(e) = refused {
        return Err(Failed::Refused(e));
    }
    let body = match (te.present, content_length) {
        (true, Some(_)) => {
            return Err(Failed::Refused(HttpError::ContentLengthAndTransferEncoding))
        }
        (true, None) => {
            if version == Version::Http10 {
                return Err(Failed::Refused(HttpError::TransferEncodingInHttp10));
            }
            te.check().map_err(Failed::Refused)?;
            BodyKind::Chunked
        }
        (false, Some(n)) => {
            if n > limits.max_body_bytes as u64 {
                return Err(Failed::Refused(HttpError::BodyTooLarge));
            }
            // Fits: n <= max_body_bytes, a usize.
            BodyKind::Length(n as usize)
        }
        (false, None) => BodyKind::None,
    };
    let keep_alive = match version {
        Version::Http11 => !close,
        Version::Http10 => keep_alive_token && !close,
    };
    Ok((
        Head {
            frame: Frame {
                method,
                version,
                keep_alive,
                expect_continue: expect && version == Version::Http11,
                path,
                query,
                if_none_match,
                authorization,
                hosts,
                content_type,
                origin,
                accept,
                last_event_id,
                body: head_end..head_end,
                consumed: head_end,
            },
            body,
        },
        head_end,
    ))
}

/// A header name (tchars only: the grammar checked) is `lower`, a lowercase
/// name of letters, digits and `-`, in any case. Eight bytes at a time with
/// bit 0x20 set in each: for a tchar that is exact (the only other byte that
/// matches a lowercase letter is its capital; a digit or `-` is matched
/// otherwise only by a control byte, never a tchar). Callgrind: a
/// byte-at-a-time compare was ~7 instructions a byte of `Authorization`.
#[inline(always)]
fn name_is(name: &[u8], lower: &[u8]) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    let word = |b: &[u8], at: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let n = lower.len();
    if name.len() != n {
        return false;
    }
    if n < 8 {
        return name.iter().zip(lower).all(|(a, b)| (a | 0x20) == *b);
    }
    let mut at = 0;
    while at + 8 <= n {
        if word(name, at) | CASE != word(lower, at) | CASE {
            return false;
        }
        at += 8;
    }
    // The last eight bytes, overlapping what was compared.
    at == n || word(name, n - 8) | CASE == word(lower, n - 8) | CASE
}

/// The grammar says "bad version" both for `HTTP/2.0` (a version we do not
/// support: 505) and for junk where the version should be (400).
fn version_error(head: &[u8]) -> HttpError {
    let line_end = head.iter().position(|&b| b == b'\r').unwrap_or(head.len());
    let mut parts = head[..line_end].split(|&b| b == b' ');
    let version = (parts.next(), parts.next(), parts.next(), parts.next());
    match version {
        (Some(_), Some(_), Some([b'H', b'T', b'T', b'P', b'/', major, b'.', minor]), None)
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            HttpError::UnsupportedVersion
        }
        _ => HttpError::MalformedRequestLine,
    }
}

/// The codings of every `Transfer-Encoding` field, as one list.
#[derive(Default)]
struct TransferCodings {
    present: bool,
    codings: usize,
    chunked: usize,
    last_is_chunked: bool,
}

impl TransferCodings {
    fn add(&mut self, value: &[u8]) {
        self.present = true;
        for coding in list_elements(value) {
            let is_chunked = coding.eq_ignore_ascii_case(b"chunked");
            self.codings += 1;
            self.chunked += usize::from(is_chunked);
            self.last_is_chunked = is_chunked;
        }
    }

    fn check(&self) -> Result<(), HttpError> {
        if !self.last_is_chunked {
            Err(HttpError::TransferEncodingNotChunked)
        } else if self.chunked > 1 {
            Err(HttpError::ChunkedTwice)
        } else if self.codings > 1 {
            Err(HttpError::UnsupportedTransferCoding)
        } else {
            Ok(())
        }
    }
}

/// Elements of a comma-separated field value (RFC 9110 §5.6.1), OWS trimmed,
/// empty elements skipped.
fn list_elements(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim_ows)
        .filter(|e| !e.is_empty())
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// A head's range with `u32` positions (`None` past 4 GiB, which no head
/// allowed by `max_header_bytes` reaches).
fn range32(r: Range<usize>) -> Option<Range<u32>> {
    Some(u32::try_from(r.start).ok()?..u32::try_from(r.end).ok()?)
}

/// Split a request target into path and query (see the module doc).
fn split_target(buf: &[u8], target: Range<usize>) -> (Range<usize>, Range<usize>) {
    let t = &buf[target.clone()];
    let mut path_start = 0;
    if t.first() != Some(&b'/') {
        // absolute-form: skip "scheme://authority".
        if let Some(i) = t.windows(3).position(|w| w == b"://") {
            let after = i + 3;
            path_start = t[after..]
                .iter()
                .position(|&b| matches!(b, b'/' | b'?' | b'#'))
                .map_or(t.len(), |p| after + p);
        }
    }
    let end = t.iter().position(|&b| b == b'#').unwrap_or(t.len());
    let path_end = t[..end].iter().position(|&b| b == b'?').unwrap_or(end);
    let path_start = path_start.min(path_end);
    let query_start = if path_end < end { path_end + 1 } else { end };
    let base = target.start;
    (
        base + path_start..base + path_end,
        base + query_start..base + end,
    )
}

#[cfg(test)]
mod name_tests {
    use super::name_is;

    /// `name_is` is `eq_ignore_ascii_case` on every name the grammar lets
    /// through: each field name the framer reads, with every tchar at every
    /// position, and in both cases.
    #[test]
    fn name_is_ignores_case_exactly_on_tchars() {
        let names: [&[u8]; 10] = [
            b"host",
            b"expect",
            b"origin",
            b"accept",
            b"connection",
            b"content-type",
            b"if-none-match",
            b"authorization",
            b"content-length",
            b"transfer-encoding",
        ];
        let tchars = (0..=255u8).filter(|&b| super::super::head::TOKEN[b as usize]);
        for lower in names {
            assert!(name_is(&lower.to_ascii_uppercase(), lower));
            assert!(!name_is(&lower[1..], lower));
            for at in 0..lower.len() {
                for b in tchars.clone() {
                    let mut name = lower.to_vec();
                    name[at] = b;
                    assert_eq!(
                        name_is(&name, lower),
                        name.eq_ignore_ascii_case(lower),
                        "{:?} against {:?}",
                        String::from_utf8_lossy(&name),
                        String::from_utf8_lossy(lower)
                    );
                }
            }
        }
    }
}
