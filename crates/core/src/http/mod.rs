//! HTTP/1.1 as pollbox speaks it, sans-IO: bytes in, framed requests and
//! response heads out. No sockets, threads or clocks live here.
//!
//! What this module owns:
//! - [`Framer`] (in `framer.rs`, with `chunked.rs`): finds one complete request
//!   at the front of a connection's buffer: the head (its grammar by hand in `head.rs`),
//!   then its body by `Content-Length` or `Transfer-Encoding: chunked`, decoded
//!   in place. It keeps its progress between calls, so a request trickling in
//!   byte by byte costs time linear in its size.
//! - [`HttpError`]: one variant per way a request can be refused at the framing
//!   level, each with its status, reason text and metric label (docs/http.md#bad-input).
//! - [`write_response_head`] and [`DateCache`] (`response.rs`, `date.rs`): the
//!   bytes of a response head, with the `Date` rendered once per second.
//! - [`route`], [`percent_decode_into`], [`parse_poll_query`] (`route.rs`): what
//!   a request target means for pollbox.
//!
//! # Framing rules, and the choices where RFC 9112 leaves one
//!
//! - **Line endings.** Every line (request line, header lines, chunk-size lines,
//!   the CRLF after chunk data, trailer lines) must end in CRLF. A bare LF is
//!   refused with [`HttpError::BareLf`] and a CR not followed by LF with
//!   [`HttpError::BareCr`], everywhere alike: a server that is lenient where a
//!   proxy in front of it is strict (or the reverse) is how requests get smuggled.
//! - **Empty lines before a request** (RFC 9112 §2.2) are skipped; they count
//!   towards `max_header_bytes`, and while only such lines have arrived the
//!   framer is [`FramerState::Idle`].
//! - **Head size.** `max_header_bytes` bounds everything from the request
//!   boundary through the blank line that ends the head. Once more than that has
//!   arrived without the blank line, the answer is 431 without waiting for more.
//!   More than `max_headers` header lines is 431 as soon as the line that makes
//!   one too many has been seen (`max_headers` is capped at [`MAX_HEADERS`]).
//! - **Obsolete line folding** (a header line starting with SP or HT) is 400.
//! - **Content-Length** must be one or more ASCII digits (no sign, no list, no
//!   overflow of u64) or it is 400. Several `Content-Length` fields are accepted
//!   when they all hold the same number, and refused with 400 when two differ.
//!   A length over `max_body_bytes` is 413 at once, before any body byte.
//! - **Transfer-Encoding** together with `Content-Length` is 400, whatever the
//!   values. The codings of all `Transfer-Encoding` fields, taken as one list,
//!   must be exactly `chunked` (case-insensitive): if the final coding is not
//!   `chunked` it is 400 (RFC 9112 §6.3 requires it); `chunked` listed twice is
//!   400; another coding before a final `chunked` (`gzip, chunked`) is 501, since
//!   pollbox implements no content transfer-coding. In an HTTP/1.0 request any
//!   `Transfer-Encoding` is 400 (RFC 9112 §6.1: such framing is faulty).
//! - **Chunked bodies** are decoded in place: the body bytes are moved down over
//!   the chunk framing, so [`Frame::body`] is one contiguous range. A chunk size
//!   of more than 16 hex digits is 400 (16 digits hold any u64, so there is no
//!   separate overflow case); a non-hex size is 400; chunk extensions are
//!   skipped; the running decoded total is checked against `max_body_bytes`
//!   digit by digit, so 413 comes as soon as a size announces too much. Trailer
//!   fields are skipped, bounded by `max_header_bytes` (431 past it). Because
//!   the caller keeps the encoded bytes until the request is complete, the chunk
//!   framing itself (sizes, extensions, CRLFs, trailers) is bounded too: more
//!   than `max_body_bytes + max_header_bytes` of it is 413.
//! - **No `Content-Length` and no `Transfer-Encoding`**: the body is empty, for
//!   every method. GET and HEAD with a body are framed like any request.
//! - **Keep-alive.** HTTP/1.1: persistent unless a `Connection` field lists
//!   `close`. HTTP/1.0: persistent only when a `Connection` field lists
//!   `keep-alive` and none lists `close`. Any [`HttpError`] closes.
//! - **`Expect: 100-continue`** is honoured for HTTP/1.1 only (RFC 9110 §10.1.1
//!   says a 1.0 request's expectation is ignored); other expectations are ignored
//!   rather than answered 417.
//! - **`Host`** fields are counted, not judged: an HTTP/1.1 request without one
//!   or with several is refused by the connection ([`HttpError::MissingHost`],
//!   [`HttpError::MultipleHost`], RFC 9112 §3.2); HTTP/1.0 may omit it. When
//!   `If-None-Match`, `Authorization`, `Content-Type`, `Origin`, `Accept` or
//!   `Last-Event-ID` appear more than once,
//!   the first one is reported.
//! - **Request target.** Origin-form is the norm; in absolute-form
//!   (`http://host/path`) the path starts at the first `/` after the authority.
//!   The path ends at the first `?` or `#`; the query runs from after `?` to `#`.

mod chunked;
mod date;
mod framer;
mod head;
mod response;
mod route;

use std::ops::Range;

pub use date::DateCache;
pub use framer::{Framer, MAX_HEADERS};
pub use response::{
    status_reason, write_fields, write_head_end, write_response_head, write_response_start,
    ResponseHead, CONTINUE,
};
pub use route::{
    check_key_segments, parse_many_query, parse_poll_query, percent_decode_into, route, BadEscape,
    ManyQuery, PollQuery, Route,
};

/// Framing limits of one connection (docs/config.md#limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest request head, from the request boundary through the blank line;
    /// also the longest trailer section of a chunked body.
    pub max_header_bytes: usize,
    /// Most header lines in one head (capped at [`MAX_HEADERS`]).
    pub max_headers: usize,
    /// Longest body, after chunked decoding.
    pub max_body_bytes: usize,
}

impl Default for Limits {
    /// The defaults of docs/config.md#limits: 8 KiB head, 64 headers, 1 MiB body.
    fn default() -> Self {
        Limits {
            max_header_bytes: 8192,
            max_headers: 64,
            max_body_bytes: 1 << 20,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Patch,
    Options,
    /// Any other token; routing answers it 405.
    Other,
}

impl Method {
    /// Methods are case-sensitive (RFC 9110 §9.1): `get` is `Other`.
    pub fn from_bytes(m: &[u8]) -> Method {
        match m {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"PATCH" => Method::Patch,
            b"OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Version {
    Http10,
    Http11,
}

/// A complete request framed in the buffer. All ranges index the slice passed
/// to [`Framer::advance`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub method: Method,
    pub version: Version,
    /// 1.1: unless `Connection: close`; 1.0: only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// An HTTP/1.1 request with `Expect: 100-continue`.
    pub expect_continue: bool,
    /// Request-target path, before `?`, still percent-encoded.
    pub path: Range<usize>,
    /// After `?`, empty if none.
    pub query: Range<usize>,
    /// Field values, OWS trimmed; the first field when repeated. Positions of
    /// field values are `u32` ([`Frame::field`] reads them): a head is far
    /// shorter than 4 GiB, and a frame this much smaller is moved without a
    /// `memcpy` call (with `usize` ranges a pipelined poll cost ~60
    /// instructions more, callgrind).
    pub if_none_match: Option<Range<u32>>,
    pub authorization: Option<Range<u32>>,
    /// How many `Host` fields the head has (saturating); the connection refuses
    /// an HTTP/1.1 request with other than one (RFC 9112 §3.2).
    pub hosts: u8,
    pub content_type: Option<Range<u32>>,
    /// `Origin`: the page's origin on a browser's cross-origin request (CORS).
    pub origin: Option<Range<u32>>,
    /// `Accept` (an event stream is asked with `text/event-stream`).
    pub accept: Option<Range<u32>>,
    /// `Last-Event-ID`: where an `EventSource` that reconnects resumes from.
    pub last_event_id: Option<Range<u32>>,
    /// Body bytes; for chunked bodies, decoded in place in the buffer.
    pub body: Range<usize>,
    /// Bytes of the slice this request occupied (empty lines before it, head,
    /// framed body, trailers).
    pub consumed: usize,
}

impl Frame {
    /// The bytes of a field value (`if_none_match`, `authorization`, ...) in
    /// `buf`, the slice the frame's ranges index.
    #[inline]
    pub fn field<'b>(&self, range: &Option<Range<u32>>, buf: &'b [u8]) -> Option<&'b [u8]> {
        let r = range.as_ref()?;
        buf.get(r.start as usize..r.end as usize)
    }
}

/// What one [`Framer::advance`] call found.
// The frame is returned by value, not boxed: boxing would allocate per request.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    Complete(Frame),
    /// More bytes are needed. `send_continue` is true exactly once per request:
    /// on the call that parsed the head of an HTTP/1.1 request with
    /// `Expect: 100-continue` whose body is not complete yet. The server then
    /// writes [`CONTINUE`].
    Partial {
        send_continue: bool,
    },
}

/// Where the framer is within the current request, for choosing between the
/// idle, header and body timeouts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FramerState {
    /// No byte of a next request yet (empty lines before a request included).
    Idle,
    /// Inside a request head.
    Head,
    /// Head parsed, body not complete.
    Body,
}

/// One row per refusal cause: variant, status, metric label, reason text.
/// Generated so the four can never drift apart.
macro_rules! http_errors {
    ($( $(#[$doc:meta])* $name:ident => ($status:expr, $label:tt, $reason:tt), )*) => {
        /// Why a request was refused at the framing level. Every error means
        /// "answer with [`HttpError::status`], then close the connection": after
        /// a framing error the next request boundary is unknown.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
        pub enum HttpError {
            $( $(#[$doc])* #[error($reason)] $name, )*
        }

        impl HttpError {
            /// Every variant, for tests and for pre-registering metric labels.
            pub const ALL: &'static [HttpError] = &[$(HttpError::$name,)*];

            /// The status code to answer with.
            pub fn status(&self) -> u16 {
                match self { $(HttpError::$name => $status,)* }
            }

            /// Specific text for the response body and logs.
            pub fn reason(&self) -> &'static str {
                match self { $(HttpError::$name => $reason,)* }
            }

            /// Short snake_case label for metrics.
            pub fn metric_label(&self) -> &'static str {
                match self { $(HttpError::$name => $label,)* }
            }
        }
    };
}

http_errors! {
    /// Request line not `method SP target SP HTTP/x.y`.
    MalformedRequestLine => (400, "bad_request_line", "malformed request line"),
    /// A header line that is not `name: value` with valid bytes.
    MalformedHeader => (400, "bad_header", "malformed header field"),
    /// A header line starting with SP or HT (RFC 9112 §5.2).
    ObsFold => (400, "obs_fold", "obsolete line folding (header line starting with whitespace)"),
    /// A line ended by LF alone.
    BareLf => (400, "bare_lf", "bare LF; lines must end with CRLF"),
    /// A CR not followed by LF.
    BareCr => (400, "bare_cr", "CR not followed by LF"),
    /// A PROXY v2 header from a peer that is not a trusted proxy: its bytes
    /// are no request (the connection's framer would call them a bare LF).
    UntrustedProxyHeader => (400, "proxy_untrusted", "a PROXY protocol header from a peer not in server.trusted_proxies"),
    /// More than `max_header_bytes` without the end of the head.
    HeadTooLarge => (431, "head_too_large", "request head over max_header_bytes"),
    /// More than `max_headers` header lines.
    TooManyHeaders => (431, "too_many_headers", "more than max_headers header fields"),
    /// `HTTP/x.y` other than 1.0 and 1.1.
    UnsupportedVersion => (505, "bad_version", "HTTP version not supported"),
    /// Declared or decoded body over `max_body_bytes`.
    BodyTooLarge => (413, "body_too_large", "body over max_body_bytes"),
    ContentLengthAndTransferEncoding => (400, "cl_and_te", "both Content-Length and Transfer-Encoding"),
    ConflictingContentLength => (400, "conflicting_cl", "two different Content-Length values"),
    /// Not 1*DIGIT, or over u64.
    InvalidContentLength => (400, "invalid_cl", "invalid Content-Length"),
    /// The final transfer-coding is not `chunked` (or the field is empty).
    TransferEncodingNotChunked => (400, "te_not_chunked", "Transfer-Encoding does not end in chunked"),
    /// `chunked` listed more than once.
    ChunkedTwice => (400, "te_chunked_twice", "chunked applied more than once"),
    /// A coding other than `chunked` before the final `chunked`.
    UnsupportedTransferCoding => (501, "te_unsupported", "unsupported transfer-coding"),
    /// `Transfer-Encoding` in an HTTP/1.0 request.
    TransferEncodingInHttp10 => (400, "te_in_http10", "Transfer-Encoding in an HTTP/1.0 request"),
    /// Chunk-size line without hex digits, or with junk after them.
    ChunkSizeNotHex => (400, "chunk_size_not_hex", "chunk size not a hex number"),
    /// More than 16 hex digits in a chunk size.
    ChunkSizeTooLong => (400, "chunk_size_too_long", "chunk size longer than 16 hex digits"),
    /// Chunk data not followed by CRLF.
    MissingChunkCrlf => (400, "chunk_missing_crlf", "chunk data not followed by CRLF"),
    /// Trailer section over `max_header_bytes`.
    TrailersTooLarge => (431, "trailers_too_large", "trailer section over max_header_bytes"),
    /// Chunk framing (sizes, extensions, CRLFs, trailers) over
    /// `max_body_bytes + max_header_bytes`.
    ChunkFramingTooLarge => (413, "chunk_framing_too_large", "chunked framing overhead too large"),
    /// An HTTP/1.1 request without a `Host` field (RFC 9112 §3.2).
    MissingHost => (400, "missing_host", "HTTP/1.1 request without a Host header"),
    /// More than one `Host` field (RFC 9112 §3.2).
    MultipleHost => (400, "multiple_host", "more than one Host header"),
}

#[cfg(test)]
mod tests;

/// Whether `Accept` asks for `text/event-stream` (what `EventSource` sends).
/// Any list element of that media type counts, parameters and weights ignored.
pub fn wants_event_stream(frame: &Frame, buf: &[u8]) -> bool {
    let Some(accept) = frame.field(&frame.accept, buf) else {
        return false;
    };
    accept.split(|&b| b == b',').any(|t| {
        let t = t.split(|&b| b == b';').next().unwrap_or(t).trim_ascii();
        t.eq_ignore_ascii_case(b"text/event-stream")
    })
}
