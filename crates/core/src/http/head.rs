//! The request-line and header-line grammar of a complete head, one pass, by
//! hand: it replaced `httparse`, whose general-purpose parse (runtime SIMD
//! dispatch, a header array to fill, UTF-8 checks of every target) was ~560
//! of the ~1,270 instructions the framer spent on a pipelined poll.
//!
//! It accepts exactly what `httparse` 1.10 accepts in its default request
//! configuration (the fuzz target `framing` checks the two against each other
//! on every input), given what `scan_head` has already enforced: every LF
//! follows a CR, no line starts with SP/HT (obs-fold), at most `max_headers`
//! header lines, and the slice ends with the blank line.
//!
//! - method: `1*tchar`, then exactly one SP;
//! - request-target: `1*(%x21-7E / %x80-FF)`, valid UTF-8, then exactly one SP;
//! - version: `HTTP/1.0` or `HTTP/1.1`, then CRLF;
//! - header line: `1*tchar ":" *(SP / HT) *(HT / SP / VCHAR / obs-text) CRLF`
//!   (no space before the colon); the value is returned with trailing SP/HT
//!   trimmed.

use std::ops::Range;

use super::{Method, Version};

/// Why the grammar refused a head; [`super::framer`] maps each to its
/// [`super::HttpError`] (after looking for a bare CR, which it names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Malformed {
    /// The method, the target, or what follows the version.
    RequestLine,
    /// Not `HTTP/1.0` or `HTTP/1.1` where the version should be.
    Version,
    /// A header line's name or value.
    Header,
}

/// The request line of a head.
#[derive(Debug)]
pub(super) struct RequestLine {
    pub(super) method: Method,
    pub(super) target: Range<usize>,
    /// First `?` in the target, if any (absolute index).
    pub(super) question: Option<usize>,
    /// First `#` in the target, if any (absolute index).
    pub(super) hash: Option<usize>,
    pub(super) version: Version,
    /// Index of the first header line.
    pub(super) end: usize,
}

/// `tchar` (RFC 9110 §5.6.2).
pub(super) static TOKEN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
};

const ONES: u64 = 0x0101_0101_0101_0101;
const HTTP_1_1: u64 = u64::from_le_bytes(*b"HTTP/1.1");
const HTTP_1_0: u64 = u64::from_le_bytes(*b"HTTP/1.0");
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Parse the request line at `buf[start..]`. Inlined into the head parse
/// (callgrind: the call and its result cost ~30 of ~150 instructions).
#[inline(always)]
pub(super) fn request_line(buf: &[u8], start: usize) -> Result<RequestLine, Malformed> {
    let mut at = start;
    // Method: the common two without a loop.
    let (method_end, method) = match buf.get(at..at + 5) {
        Some([b'G', b'E', b'T', b' ', _]) => (at + 3, Method::Get),
        Some(b"POST ") => (at + 4, Method::Post),
        _ => {
            let len = buf[at..].iter().take_while(|&&b| TOKEN[b as usize]).count();
            if len == 0 {
                return Err(Malformed::RequestLine);
            }
            (at + len, Method::from_bytes(&buf[at..at + len]))
        }
    };
    if buf.get(method_end) != Some(&b' ') {
        return Err(Malformed::RequestLine);
    }
    at = method_end + 1;

    // Target: visible ASCII or obs-text up to one SP; `?` and `#` noted.
    let target_start = at;
    let mut question = None;
    let mut hash = None;
    let mut high = false;
    loop {
        at = plain_target_bytes(buf, at);
        let Some(&b) = buf.get(at) else {
            return Err(Malformed::RequestLine);
        };
        match b {
            b'?' => {
                question.get_or_insert(at);
            }
            b'#' => {
                hash.get_or_insert(at);
            }
            0x21..=0x7e => {}
            0x80..=0xff => high = true,
            _ => break,
        }
        at += 1;
    }
    if at == target_start || buf[at] != b' ' {
        return Err(Malformed::RequestLine);
    }
    let target = target_start..at;
    if high && std::str::from_utf8(&buf[target.clone()]).is_err() {
        return Err(Malformed::RequestLine);
    }
    at += 1;

    // The version and the CRLF after it as two loads and compares.
    let word = buf
        .get(at..)
        .and_then(|b| b.first_chunk::<8>())
        .map_or(0, |w| u64::from_le_bytes(*w));
    let version = match word {
        HTTP_1_1 => Version::Http11,
        HTTP_1_0 => Version::Http10,
        _ => return Err(Malformed::Version),
    };
    at += 8;
    if buf.get(at..).and_then(|b| b.first_chunk::<2>()) != Some(b"\r\n") {
        return Err(Malformed::RequestLine);
    }
    Ok(RequestLine {
        method,
        target,
        question,
        hash,
        version,
        end: at + 2,
    })
}

/// One header line: its name, and where its value lies (SP/HT trimmed).
pub(super) type Field<'a> = (&'a [u8], Range<usize>);

/// Skip target bytes that need no look (`%x21-7E` but `?`, `#` and DEL),
/// eight at a time: where the next byte to judge one by one is.
#[inline]
fn plain_target_bytes(buf: &[u8], mut at: usize) -> usize {
    while let Some(word) = buf.get(at..at + 8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes);
        // The lowest flag of each test is exact (see `value_end`); high bytes
        // are flagged by their own top bit.
        let low = x.wrapping_sub(ONES * 0x21) & !x & HIGHS;
        let flags = low | (x & HIGHS) | equal(x, 0x7f) | equal(x, b'?') | equal(x, b'#');
        if flags != 0 {
            return at + (flags.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at
}

/// The top bit of each byte of `x` equal to `b`; the lowest is exact.
#[inline]
fn equal(x: u64, b: u8) -> u64 {
    let y = x ^ (ONES * u64::from(b));
    y.wrapping_sub(ONES) & !y & HIGHS
}

/// The header lines from `at` to the blank line, each as (name, value) with
/// the value's leading and trailing SP/HT left out. Stops at the first line
/// the grammar refuses.
pub(super) struct Fields<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    pub(super) fn new(buf: &'a [u8], at: usize) -> Fields<'a> {
        Fields { buf, at }
    }

    /// Just past the blank line, once [`Fields::next_field`] has said `None`.
    pub(super) fn end(&self) -> usize {
        self.at
    }

    /// The next header line, `None` at the blank line. Inlined into the
    /// head parse's loop (callgrind: ~25 instructions a line less).
    #[inline(always)]
    pub(super) fn next_field(&mut self) -> Result<Option<Field<'a>>, Malformed> {
        let buf = self.buf;
        let name_start = self.at;
        match buf.get(name_start) {
            Some(b'\r') => {
                return if buf.get(name_start + 1) == Some(&b'\n') {
                    self.at = name_start + 2;
                    Ok(None)
                } else {
                    Err(Malformed::Header)
                };
            }
            None => return Err(Malformed::Header),
            Some(_) => {}
        }
        let mut at = name_start;
        while at < buf.len() && TOKEN[buf[at] as usize] {
            at += 1;
        }
        if at == name_start || buf.get(at) != Some(&b':') {
            return Err(Malformed::Header);
        }
        let name = &buf[name_start..at];
        at += 1;
        while matches!(buf.get(at), Some(b' ' | b'\t')) {
            at += 1;
        }
        let value_start = at;
        let value_end = value_end(buf, at)?;
        let mut trimmed = value_end;
        while trimmed > value_start && matches!(buf[trimmed - 1], b' ' | b'\t') {
            trimmed -= 1;
        }
        self.at = value_end + 2;
        Ok(Some((name, value_start..trimmed)))
    }
}

/// Where the value starting at `at` ends: the index of its CR, which must be
/// followed by LF; any other control byte (HT aside) or DEL refuses the line.
/// Sixteen bytes at a time while they are plain (a bearer token or a cookie
/// is hundreds: callgrind, benches/auth-poll/), then eight, then one.
#[inline]
fn value_end(buf: &[u8], mut at: usize) -> Result<usize, Malformed> {
    while let Some(chunk) = buf.get(at..).and_then(<[u8]>::first_chunk::<16>) {
        let stops = value_stops16(chunk);
        if stops == 0 {
            at += 16;
            continue;
        }
        at += stops.trailing_zeros() as usize;
        if buf[at] == b'\t' {
            at += 1;
            continue;
        }
        return line_end(buf, at);
    }
    while let Some(word) = buf.get(at..at + 8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes);
        // Bytes below 0x20, and bytes equal to 0x7f. The lowest flag of each
        // is exact (borrows only add flags above a true one), so the lowest
        // flag of their union is the first such byte.
        let low = x.wrapping_sub(ONES * 0x20) & !x & HIGHS;
        let flags = low | equal(x, 0x7f);
        if flags == 0 {
            at += 8;
            continue;
        }
        at += (flags.trailing_zeros() / 8) as usize;
        if buf[at] == b'\t' {
            at += 1;
            continue;
        }
        return line_end(buf, at);
    }
    loop {
        match buf.get(at) {
            Some(b'\t' | 0x20..=0x7e | 0x80..=0xff) => at += 1,
            _ => return line_end(buf, at),
        }
    }
}

/// The bytes of a 16-byte chunk of a header value that end its fast path
/// (a control byte, HT included, or DEL), one bit per byte (bit `k`: byte `k`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn value_stops16(chunk: &[u8; 16]) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY: `chunk` is 16 readable bytes and `_mm_loadu_si128` reads
    // exactly 16 with no alignment needed; the other intrinsics only compute
    // on values. They are `unsafe` otherwise only for the CPU feature they
    // need, SSE2, which every x86_64 CPU has (the target's baseline).
    // Checked against the byte-at-a-time definition for every byte at every
    // position (`value_stops16_is_the_grammar` below), and on arbitrary heads
    // by the `framing` fuzz target (against httparse).
    unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        // Unsigned `v <= 0x1f`: `min(v, 0x1f) == v`.
        let low = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        let del = _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f));
        _mm_movemask_epi8(_mm_or_si128(low, del)) as u32
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn value_stops16(chunk: &[u8; 16]) -> u32 {
    value_stops16_bytewise(chunk)
}

/// [`value_stops16`] a byte at a time: its definition.
#[cfg_attr(target_arch = "x86_64", cfg(test))]
fn value_stops16_bytewise(chunk: &[u8; 16]) -> u32 {
    let mut stops = 0u32;
    for (k, &b) in chunk.iter().enumerate() {
        if b < 0x20 || b == 0x7f {
            stops |= 1 << k;
        }
    }
    stops
}

/// `at` holds a byte outside the value grammar: the value's end if it is CRLF.
fn line_end(buf: &[u8], at: usize) -> Result<usize, Malformed> {
    if buf.get(at) == Some(&b'\r') && buf.get(at + 1) == Some(&b'\n') {
        Ok(at)
    } else {
        Err(Malformed::Header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_stops16_is_the_grammar() {
        for b in 0..=255u8 {
            for k in 0..16 {
                let mut chunk = [b'a'; 16];
                chunk[k] = b;
                chunk[15 - k] = b;
                assert_eq!(
                    value_stops16(&chunk),
                    value_stops16_bytewise(&chunk),
                    "byte {b:#04x} at {k}"
                );
            }
        }
    }

    type Owned = Vec<(Vec<u8>, Vec<u8>)>;

    fn fields(head: &[u8]) -> Result<Owned, Malformed> {
        let line = request_line(head, 0)?;
        let mut f = Fields::new(head, line.end);
        let mut out = Vec::new();
        while let Some((name, value)) = f.next_field()? {
            out.push((name.to_vec(), head[value].to_vec()));
        }
        Ok(out)
    }

    #[test]
    fn request_line_parts() {
        let head = b"GET /v1/boxes/a?after=3#x HTTP/1.1\r\n\r\n";
        let line = request_line(head, 0).unwrap();
        assert_eq!(line.method, Method::Get);
        assert_eq!(&head[line.target.clone()], b"/v1/boxes/a?after=3#x");
        assert_eq!(line.question, Some(15));
        assert_eq!(line.hash, Some(23));
        assert_eq!(line.version, Version::Http11);
        assert_eq!(line.end, head.len() - 2);
        let line = request_line(b"M-SEARCH * HTTP/1.0\r\n\r\n", 0).unwrap();
        assert_eq!(line.method, Method::Other);
        for (head, m) in [
            (&b"POST / HTTP/1.1\r\n\r\n"[..], Method::Post),
            (b"GETS / HTTP/1.1\r\n\r\n", Method::Other),
            (b"HEAD / HTTP/1.1\r\n\r\n", Method::Head),
            (b"DELETE / HTTP/1.1\r\n\r\n", Method::Delete),
            (b"OPTIONS * HTTP/1.1\r\n\r\n", Method::Options),
        ] {
            assert_eq!(request_line(head, 0).unwrap().method, m, "{head:?}");
        }
        assert_eq!(line.version, Version::Http10);
    }

    #[test]
    fn request_line_refusals() {
        for (head, why) in [
            (&b"GET  / HTTP/1.1\r\n\r\n"[..], Malformed::RequestLine),
            (b"GET / HTTP/1.1 \r\n\r\n", Malformed::RequestLine),
            (b"G@T / HTTP/1.1\r\n\r\n", Malformed::RequestLine),
            (b" GET / HTTP/1.1\r\n\r\n", Malformed::RequestLine),
            (b"GET /\x7f HTTP/1.1\r\n\r\n", Malformed::RequestLine),
            (b"GET /\xff HTTP/1.1\r\n\r\n", Malformed::RequestLine),
            (b"GET / HTTP/2.0\r\n\r\n", Malformed::Version),
            (b"GET / http/1.1\r\n\r\n", Malformed::Version),
            (b"GET /\r\n\r\n", Malformed::RequestLine),
        ] {
            assert_eq!(request_line(head, 0).unwrap_err(), why, "{head:?}");
        }
        // Valid UTF-8 in the target is fine.
        assert!(request_line("GET /é HTTP/1.1\r\n\r\n".as_bytes(), 0).is_ok());
    }

    #[test]
    fn header_values_trimmed_and_checked() {
        let got = fields(
            b"GET / HTTP/1.1\r\nHost: a \t\r\nX-Long:  0123456789abcdef\tghij \r\nE:\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                (b"Host".to_vec(), b"a".to_vec()),
                (b"X-Long".to_vec(), b"0123456789abcdef\tghij".to_vec()),
                (b"E".to_vec(), b"".to_vec()),
            ]
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nHost : a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\n: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHo(st: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\x01b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: 01234567\x7f89\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: 0123456789\x00abcdef\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
        ] {
            assert_eq!(fields(bad).unwrap_err(), Malformed::Header, "{bad:?}");
        }
    }
}
