//! A validating single-pass JSON scanner (RFC 8259, with serde_json's limits).
//!
//! The [`Scanner`] is a cursor over one document. It checks the whole grammar
//! and the UTF-8 of every string as it goes, but materialises nothing: a
//! string is reported as the byte range of its (still escaped) contents, a
//! number as the range of its text. The projection decides which of those it
//! needs and decodes only them (see [`unescape_into`], [`parse_i64`],
//! [`parse_f64`]); everything else is stepped over once, validated, and
//! forgotten.
//!
//! What is accepted is exactly what `serde_json::from_slice::<Value>` accepts
//! (with its `float_roundtrip` rounding):
//! - whitespace is space, tab, CR and LF only;
//! - strings: no raw control characters (`< 0x20`), valid UTF-8, the escapes
//!   `\" \\ \/ \b \f \n \r \t \uXXXX`, and `\u` escapes of surrogates only as
//!   a high-low pair;
//! - numbers: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` whose value,
//!   correctly rounded to f64, is finite (`1e400` is out of range; `1e-400` is
//!   0; an integer past u64 is a valid number);
//! - at most [`MAX_DEPTH`] arrays and objects nested (serde_json's recursion
//!   limit of 128 refuses the 128th).
//!
//! Errors carry the byte offset in the document of the first problem.

/// A problem at a byte offset of the scanned document.
pub(super) type Fail = (usize, &'static str);

use super::ahead;

/// Most arrays/objects open at once: serde_json refuses the 128th.
pub const MAX_DEPTH: u32 = 127;

pub(super) const UNEXPECTED: &str = "unexpected character";
pub(super) const EOF: &str = "unexpected end of input";
const BAD_NUMBER: &str = "invalid number";
const OUT_OF_RANGE: &str = "number out of range";
const BAD_ESCAPE: &str = "invalid escape in string";
const BAD_UNICODE: &str = "invalid unicode escape in string";
const BAD_UTF8: &str = "invalid UTF-8";

/// What a scanned value was. Strings and numbers are byte ranges of the
/// document; containers were validated and stepped over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// Not in the message (a slot's initial state).
    Absent,
    Null,
    Bool(bool),
    /// The number's text; `int` when written without fraction or exponent.
    Num {
        start: usize,
        end: usize,
        int: bool,
    },
    /// The string's contents between the quotes, still escaped; `escaped`
    /// when there is at least one `\`.
    Str {
        start: usize,
        end: usize,
        escaped: bool,
    },
    Object,
    Array,
}

/// A cursor over one JSON document.
pub(super) struct Scanner<'b> {
    buf: &'b [u8],
    pub(super) pos: usize,
    /// Arrays and objects open now.
    depth: u32,
    /// The length of the last container skipped that was large enough to
    /// split (0: none yet): where the next one is expected to end, since
    /// the messages of one body, and of one worker, tend to look alike.
    pub(super) hint: usize,
    /// The cargo skip's `kinds[l]`: whether the container open at level `l`
    /// (1-based) is an object. Each level is written when it opens, before
    /// it is read, so one array serves every skip of the document, zeroed
    /// once (not once a skip: a bench 8 KiB message has 73 skips).
    kinds: [bool; 256],
}

impl<'b> Scanner<'b> {
    pub(super) fn new(buf: &'b [u8]) -> Scanner<'b> {
        Scanner {
            buf,
            pos: 0,
            depth: 0,
            hint: 0,
            kinds: [false; 256],
        }
    }

    /// The document being scanned.
    pub(super) fn buf(&self) -> &'b [u8] {
        self.buf
    }

    /// Step over whitespace; the next byte, if any.
    #[inline(always)]
    pub(super) fn skip_ws(&mut self) -> Option<u8> {
        self.pos = ws(self.buf, self.pos);
        self.buf.get(self.pos).copied()
    }

    /// Step over whitespace; the next byte, 0 at the end (see [`next`]).
    #[inline(always)]
    fn peek(&mut self) -> u8 {
        let c;
        (self.pos, c) = next(self.buf, self.pos);
        c
    }

    /// The error for an unexpected byte at the cursor (the end of input if
    /// there is none).
    #[cold]
    fn unexpected(&self, what: &'static str) -> Fail {
        at_end_or(self.buf, self.pos, what)
    }

    /// After the top-level value: only whitespace may follow.
    pub(super) fn finish(&mut self) -> Result<(), Fail> {
        let end = self.pos;
        match self.skip_ws() {
            None => Ok(()),
            // Another object or array on a line of its own: NDJSON sent
            // without its content type, the mistake worth naming.
            Some(b'{' | b'[') if self.buf[end..self.pos].contains(&b'\n') => Err((
                self.pos,
                "trailing characters after the value (one JSON value a line? send Content-Type: application/x-ndjson)",
            )),
            Some(_) => Err((self.pos, "trailing characters after the value")),
        }
    }

    #[inline]
    fn enter(&mut self) -> Result<(), Fail> {
        if self.depth >= MAX_DEPTH {
            return Err((self.pos, "nesting too deep"));
        }
        self.depth += 1;
        Ok(())
    }

    /// At `{`: open the object. `Ok(true)` when it has a first member (the
    /// cursor is then at its name's `"`), `Ok(false)` when it was `{}`.
    #[inline]
    pub(super) fn object_start(&mut self) -> Result<bool, Fail> {
        self.enter()?;
        self.pos += 1;
        match self.peek() {
            b'"' => Ok(true),
            b'}' => {
                self.pos += 1;
                self.depth -= 1;
                Ok(false)
            }
            _ => Err(self.unexpected("expected a string member name")),
        }
    }

    /// At a member name's `"`: read it and the `:` after it; the cursor is
    /// left before the member's value.
    #[inline]
    pub(super) fn member_name(&mut self) -> Result<(usize, usize, bool), Fail> {
        let name = self.string()?;
        if self.peek() == b':' {
            self.pos += 1;
            Ok(name)
        } else {
            Err(self.unexpected("expected ':'"))
        }
    }

    /// After a member's value: `Ok(true)` at the next member's name,
    /// `Ok(false)` when the object closed.
    #[inline]
    pub(super) fn next_member(&mut self) -> Result<bool, Fail> {
        match self.peek() {
            b',' => {
                self.pos += 1;
                if self.peek() == b'"' {
                    Ok(true)
                } else {
                    Err(self.unexpected("expected a string member name"))
                }
            }
            b'}' => {
                self.pos += 1;
                self.depth -= 1;
                Ok(false)
            }
            _ => Err(self.unexpected("expected ',' or '}'")),
        }
    }

    /// At `[`: open the array. `Ok(true)` when it has a first element.
    #[inline]
    pub(super) fn array_start(&mut self) -> Result<bool, Fail> {
        self.enter()?;
        self.pos += 1;
        match self.skip_ws() {
            Some(b']') => {
                self.pos += 1;
                self.depth -= 1;
                Ok(false)
            }
            Some(_) => Ok(true),
            None => Err((self.pos, EOF)),
        }
    }

    /// After an element: `Ok(true)` before the next one, `Ok(false)` when the
    /// array closed.
    #[inline]
    pub(super) fn next_element(&mut self) -> Result<bool, Fail> {
        match self.skip_ws() {
            Some(b',') => {
                self.pos += 1;
                Ok(true)
            }
            Some(b']') => {
                self.pos += 1;
                self.depth -= 1;
                Ok(false)
            }
            Some(_) => Err((self.pos, "expected ',' or ']'")),
            None => Err((self.pos, EOF)),
        }
    }

    /// Scan any value (after optional whitespace), validating all of it.
    pub(super) fn value(&mut self) -> Result<Found, Fail> {
        match self.peek() {
            b'"' => {
                let (start, end, escaped) = self.string()?;
                Ok(Found::Str {
                    start,
                    end,
                    escaped,
                })
            }
            b'{' => {
                self.skip()?;
                Ok(Found::Object)
            }
            b'[' => {
                self.skip()?;
                Ok(Found::Array)
            }
            b't' => self.literal(b"true", Found::Bool(true)),
            b'f' => self.literal(b"false", Found::Bool(false)),
            b'n' => self.literal(b"null", Found::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => Err(self.unexpected(UNEXPECTED)),
        }
    }

    /// Validate and step over one value (after optional whitespace), keeping
    /// nothing: the cargo path. One loop over the bytes, containers tracked
    /// on a stack of their kinds (object or array), so nesting costs no
    /// recursion. Each byte that starts a token is read once
    /// ([`next`]: whitespace is stepped over only when the byte is one), and
    /// the end of the document reads as a 0 byte, which no token starts with,
    /// so the hot path tests no `Option`s; the end is told apart from a NUL
    /// only on the way to an error (the loop is [`walk`]). A container still
    /// open [`ahead::WARM`] bytes in has the rest of it validated by two
    /// cursors in turn (see `ahead`): the same verdict and the same error,
    /// about 1.2× faster on a core with execution slots to spare
    /// (BENCHMARKS.md, "Ingest").
    pub(super) fn skip(&mut self) -> Result<(), Fail> {
        let buf = self.buf;
        let (i, c) = next(buf, self.pos);
        if c != b'{' && c != b'[' {
            return self.value().map(|_| ());
        }
        // Containers open below the value, at most this many at once.
        let room = MAX_DEPTH - self.depth.min(MAX_DEPTH);
        let cur = Cursor {
            i,
            level: 0,
            object: false,
        };
        // Past this offset, at the next opening bracket, a large container
        // is split once (see `ahead`).
        self.pos = match walk(buf, cur, &mut self.kinds, room, i + ahead::WARM)? {
            Stop::End(end) => end,
            Stop::Warm(at) => self.large(at, room)?,
        };
        Ok(())
    }

    /// The rest of a large container's skip from `cur`, at an opening
    /// bracket [`ahead::WARM`] bytes or more from its start at `self.pos`:
    /// split once, then one cursor to the end. Where it ended.
    #[cold]
    #[inline(never)]
    fn large(&mut self, mut cur: Cursor, room: u32) -> Result<usize, Fail> {
        let end = match self.split(&mut cur, room)? {
            Some(end) => end,
            None => loop {
                match walk(self.buf, cur, &mut self.kinds, room, usize::MAX)? {
                    Stop::End(end) => break end,
                    // Not with `warm` at the end of memory; would only go on.
                    Stop::Warm(at) => cur = at,
                }
            },
        };
        // Where the next large container may end.
        self.hint = end - self.pos;
        Ok(end)
    }

    /// The skip at a large container's `cur` (a value's start, past
    /// [`ahead::WARM`] bytes from its start at `self.pos`): split what is left in two where
    /// it is expected to end far enough away. `Some(end)` when the skipped
    /// value ended at `end`, else `cur` to go on from.
    #[inline(never)]
    fn split(&mut self, cur: &mut Cursor, room: u32) -> Result<Option<usize>, Fail> {
        let (buf, start) = (self.buf, self.pos);
        let end = match self.hint {
            0 => buf.len(),
            hint => buf.len().min(start + hint),
        };
        if end < cur.i + ahead::MIN_SPLIT {
            return Ok(None);
        }
        let target = cur.i + (end - cur.i) / 2;
        ahead::split(buf, cur, &mut self.kinds, room, target)
    }

    #[inline]
    fn literal(&mut self, word: &[u8], found: Found) -> Result<Found, Fail> {
        if self.buf.get(self.pos..self.pos + word.len()) == Some(word) {
            self.pos += word.len();
            Ok(found)
        } else {
            Err((self.pos, UNEXPECTED))
        }
    }

    /// At a `"`: scan the string, validating escapes, control characters and
    /// UTF-8. Returns its contents' range and whether it has escapes.
    #[inline]
    pub(super) fn string(&mut self) -> Result<(usize, usize, bool), Fail> {
        let open = self.pos;
        match string_head(self.buf, open + 1) {
            Ok(close) => {
                self.pos = close + 1;
                Ok((open + 1, close, false))
            }
            Err(i) => {
                let (end, escaped) = string_rest(self.buf, open, i)?;
                self.pos = end;
                Ok((open + 1, end - 1, escaped))
            }
        }
    }

    /// At `-` or a digit: scan a number.
    fn number(&mut self) -> Result<Found, Fail> {
        let start = self.pos;
        let (end, int) = number_end(self.buf, start)?;
        self.pos = end;
        Ok(Found::Num { start, end, int })
    }
}

/// The cargo skip's grammar, once, for its two users: [`walk`] (one cursor,
/// one loop) and [`step`] (one value at a time, for two cursors in turn).
/// From a value's start at `$i` (`$level` containers deep, the innermost an
/// object when `$object`, kinds in `$kinds`, at most `$room` levels): the
/// value and what follows it. Then `$go_on` at the next value's start, or
/// `$whole` when level `$floor + 1` closed (`$i` after its bracket). `$open`
/// runs first at each opening bracket. Errors `return` from the caller.
/// A macro, not a function: each user keeps its own control flow (`walk` a
/// `continue`, `step` a `return`), which is what keeps `walk`'s hot values
/// in registers (BENCHMARKS.md, "Ingest").
macro_rules! skip_grammar {
    (
        $buf:ident, $i:ident, $level:ident, $object:ident, $kinds:ident, $room:expr, $floor:expr,
        open: $open:block,
        go_on: $go_on:block,
        whole: $whole:block $(,)?
    ) => {
        let c = byte($buf, $i);
        'done: {
            match c {
                b'"' => $i = string_end($buf, $i)?,
                b'{' | b'[' => {
                    $open
                    if $level >= $room {
                        return Err(($i, "nesting too deep"));
                    }
                    let is_object = c == b'{';
                    if is_object {
                        if let Some(value) = member_head($buf, $i) {
                            // `{"name":` read whole: at the member's value.
                            $i = value;
                            $level += 1;
                            $kinds[$level as usize & 255] = true;
                            $object = true;
                            $go_on
                        }
                    }
                    let mut d = byte($buf, $i + 1);
                    $i += 1;
                    if d <= b' ' {
                        ($i, d) = next($buf, $i);
                    }
                    if is_object && d == b'"' {
                        $i = name_end($buf, $i)?;
                    } else if is_object && d != b'}' {
                        return Err(at_end_or($buf, $i, "expected a string member name"));
                    } else if !is_object && d != b']' {
                        // An array's first element: `d` read again next.
                    } else {
                        // Empty: a whole value.
                        $i += 1;
                        if $level == $floor {
                            $whole
                        }
                        break 'done;
                    }
                    $level += 1;
                    $kinds[$level as usize & 255] = is_object;
                    $object = is_object;
                    $go_on
                }
                b't' => $i = literal_end($buf, $i, b"true")?,
                b'f' => $i = literal_end($buf, $i, b"false")?,
                b'n' => $i = literal_end($buf, $i, b"null")?,
                b'-' | b'0'..=b'9' => {
                    $i = match number_fast($buf, $i) {
                        Some(end) => end,
                        None => number_end($buf, $i)?.0,
                    }
                }
                b' ' | b'\t' | b'\n' | b'\r' => {
                    $i = ws($buf, $i);
                    $go_on
                }
                _ => return Err(at_end_or($buf, $i, UNEXPECTED)),
            }
        }
        // After a value inside a container: close containers until one
        // goes on.
        loop {
            match byte($buf, $i) {
                b',' if $object => {
                    if let Some(value) = member_head($buf, $i) {
                        $i = value;
                        $go_on
                    }
                    let mut d = byte($buf, $i + 1);
                    $i += 1;
                    if d != b'"' {
                        ($i, d) = next($buf, $i);
                        if d != b'"' {
                            return Err(at_end_or($buf, $i, "expected a string member name"));
                        }
                    }
                    $i = name_end($buf, $i)?;
                    $go_on
                }
                b',' => {
                    $i += 1;
                    $go_on
                }
                b'}' if $object => {}
                b']' if !$object => {}
                b' ' | b'\t' | b'\n' | b'\r' => {
                    $i = ws($buf, $i);
                    continue;
                }
                _ if $object => return Err(at_end_or($buf, $i, "expected ',' or '}'")),
                _ => return Err(at_end_or($buf, $i, "expected ',' or ']'")),
            }
            $i += 1;
            $level -= 1;
            if $level == $floor {
                $whole
            }
            $object = $kinds[$level as usize & 255];
        }
    };
}

/// How [`walk`] stopped.
enum Stop {
    /// The skipped value ended here.
    End(usize),
    /// At an opening bracket past `warm`: time to consider a split.
    Warm(Cursor),
}

/// The cargo skip with one cursor, from `cur` (a value's start) on: one loop
/// over the bytes, containers tracked on `kinds` (see [`Scanner::skip`]).
/// Stops at the end of the skipped value, or at the first opening bracket
/// at or past `warm`. The grammar is [`skip_grammar`]'s, as [`step`]'s is;
/// as one loop it keeps the hot path's values in registers, where a loop
/// over `step` spills some.
#[inline(never)]
fn walk(
    buf: &[u8],
    cur: Cursor,
    kinds: &mut [bool; 256],
    room: u32,
    warm: usize,
) -> Result<Stop, Fail> {
    let Cursor {
        mut i,
        mut level,
        mut object,
    } = cur;
    'value: loop {
        skip_grammar!(buf, i, level, object, kinds, room, 0,
            open: {
                if i >= warm {
                    return Ok(Stop::Warm(Cursor { i, level, object }));
                }
            },
            go_on: { continue 'value },
            whole: { return Ok(Stop::End(i)) },
        );
    }
}

/// Where a cursor of the cargo skip ([`walk`], [`step`]) is in a container
/// value being skipped: at the start of a value (after whitespace, or not),
/// `level` containers deep (1-based, below the skipped value), the innermost
/// one an object when `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) i: usize,
    pub(super) level: u32,
    pub(super) object: bool,
}

/// The cargo skip's one step: validate the value at the cursor and what
/// follows it, up to the start of the next value. A container's opening
/// goes one level up and stops at its first value; after a value,
/// containers are closed until one goes on with a `,`. `Ok(true)` when that
/// closed level `floor + 1`: the cursor is then after the closing bracket,
/// at level `floor` (for the skip itself `floor` is 0: its value is
/// whole). `kinds[l]` is whether level `l` is an object (indices are taken
/// modulo 256); `room` is the most levels open at once. On an error the
/// cursor is left where the step began.
#[inline(always)]
pub(super) fn step(
    buf: &[u8],
    cur: &mut Cursor,
    kinds: &mut [bool; 256],
    room: u32,
    floor: u32,
) -> Result<bool, Fail> {
    let Cursor {
        mut i,
        mut level,
        mut object,
    } = *cur;
    skip_grammar!(buf, i, level, object, kinds, room, floor,
        open: {},
        go_on: {
            *cur = Cursor { i, level, object };
            return Ok(false);
        },
        whole: {
            *cur = Cursor { i, level, object };
            return Ok(true);
        },
    );
}

/// Step over whitespace from `i`.
#[inline(always)]
fn ws(buf: &[u8], mut i: usize) -> usize {
    while let Some(&b) = buf.get(i) {
        if b > b' ' || !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            break;
        }
        i += 1;
    }
    i
}

/// The byte at `i`; 0 past the end (a byte no token starts with).
#[inline(always)]
pub(super) fn byte(buf: &[u8], i: usize) -> u8 {
    match buf.get(i) {
        Some(&b) => b,
        None => 0,
    }
}

/// The first byte from `i` that is not whitespace, and its offset; 0 at the
/// end. One load and one compare when `buf[i]` is no whitespace.
#[inline(always)]
pub(super) fn next(buf: &[u8], i: usize) -> (usize, u8) {
    let c = byte(buf, i);
    if c > b' ' {
        (i, c)
    } else {
        next_after_ws(buf, i)
    }
}

#[inline(never)]
fn next_after_ws(buf: &[u8], i: usize) -> (usize, u8) {
    let i = ws(buf, i);
    (i, byte(buf, i))
}

/// The error for an unexpected byte at `i`: the end of input if there is none.
#[cold]
fn at_end_or(buf: &[u8], i: usize, what: &'static str) -> Fail {
    if i >= buf.len() {
        (i, EOF)
    } else {
        (i, what)
    }
}

#[inline(always)]
fn literal_end(buf: &[u8], i: usize, word: &[u8]) -> Result<usize, Fail> {
    if buf.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err((i, UNEXPECTED))
    }
}

/// At a member name's `"`: the offset after the name and its `:`.
#[inline(always)]
pub(super) fn name_end(buf: &[u8], i: usize) -> Result<usize, Fail> {
    let i = string_end(buf, i)?;
    if byte(buf, i) == b':' {
        return Ok(i + 1);
    }
    let (i, c) = next(buf, i);
    if c == b':' {
        Ok(i + 1)
    } else {
        Err(at_end_or(buf, i, "expected ':'"))
    }
}

/// The bytes of a 16-byte chunk of a string that end its fast path (`"`,
/// `\\`, a control character or any non-ASCII byte), one bit per byte (bit
/// `k`: byte `k`), the quotes among them, and the colons (for a member
/// name's `:`; a caller that does not read them pays nothing for them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn stops16(chunk: &[u8; 16]) -> (u32, u32, u32) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_set_epi64x,
    };
    let [a, b, c, d, e, f, g, h, rest @ ..] = *chunk;
    let lo = u64::from_le_bytes([a, b, c, d, e, f, g, h]);
    let hi = u64::from_le_bytes(rest);
    // SAFETY: these intrinsics only compute on values (no pointer, no
    // memory access); they are `unsafe` only for the CPU feature they need,
    // SSE2, which every x86_64 CPU has (it is part of the target's
    // baseline). Covered by the scanner's tests and JSONTestSuite, and on
    // arbitrary bytes by the `projection` and `projection_diff` fuzz targets.
    // They compile to one unaligned load and five vector instructions.
    unsafe {
        let v = _mm_set_epi64x(hi as i64, lo as i64);
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        // Signed: below 0x20, and every byte from 0x80 (negative).
        let low = _mm_cmplt_epi8(v, _mm_set1_epi8(0x20));
        let stops = _mm_or_si128(_mm_or_si128(quote, backslash), low);
        let colon = _mm_cmpeq_epi8(v, _mm_set1_epi8(b':' as i8));
        (
            _mm_movemask_epi8(stops) as u32,
            _mm_movemask_epi8(quote) as u32,
            _mm_movemask_epi8(colon) as u32,
        )
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn stops16(chunk: &[u8; 16]) -> (u32, u32, u32) {
    let (mut stops, mut quotes, mut colons) = (0u32, 0u32, 0u32);
    for (k, &b) in chunk.iter().enumerate() {
        let quote = b == b'"';
        if quote || b == b'\\' || !(0x20..0x80).contains(&b) {
            stops |= 1 << k;
        }
        quotes |= u32::from(quote) << k;
        colons |= u32::from(b == b':') << k;
    }
    (stops, quotes, colons)
}

/// The 16 bytes from `i`, if there are as many.
#[inline(always)]
fn chunk16(buf: &[u8], i: usize) -> Option<&[u8; 16]> {
    buf.get(i..).and_then(<[u8]>::first_chunk)
}

/// A string's first 16 bytes from `i`: `Ok(close)` when they hold its
/// closing quote at `close` and nothing to check before it, else
/// `Err(offset)` of the first byte [`string_rest`] must look at.
#[inline(always)]
fn string_head(buf: &[u8], i: usize) -> Result<usize, usize> {
    let Some(chunk) = chunk16(buf, i) else {
        return Err(i);
    };
    let (stops, quotes, _) = stops16(chunk);
    let first = stops & stops.wrapping_neg();
    if first & quotes != 0 {
        Ok(i + first.trailing_zeros() as usize)
    } else {
        Err(i + (stops.trailing_zeros() as usize).min(16))
    }
}

/// At a `{`, or a `,` in an object, the common case in one 16-byte read:
/// when the bytes from `i` are `{"name":` or `,"name":` with a plain name
/// (no escape, control character or non-ASCII byte) and no space, the
/// offset after the `:`. `None` sends the caller to the byte-by-byte path,
/// which validates the same bytes and finds the error if there is one.
#[inline(always)]
pub(super) fn member_head(buf: &[u8], i: usize) -> Option<usize> {
    let (stops, quotes, colons) = stops16(chunk16(buf, i)?);
    // Byte 1 opens the name (tested on the mask, not by reading the byte
    // again, which makes the compiler rebuild the vector from pieces).
    let open = quotes & 2 != 0;
    // Bit `k` of these: byte `i + 2 + k`, the name's `k`-th byte.
    let (stops, quotes) = (stops >> 2, quotes >> 2);
    let first = stops & stops.wrapping_neg();
    // The first stop is the closing quote and the byte after it a colon.
    if open && first & quotes & (colons >> 3) != 0 {
        Some(i + 2 + first.trailing_zeros() as usize + 2)
    } else {
        None
    }
}

/// At a `"`: the offset after the string's closing quote, validating it.
/// Plain ASCII is checked 16 bytes at a time here; escapes and non-ASCII
/// go to [`string_rest`].
#[inline(always)]
pub(super) fn string_end(buf: &[u8], open: usize) -> Result<usize, Fail> {
    match string_head(buf, open + 1) {
        Ok(close) => Ok(close + 1),
        Err(i) => string_rest(buf, open, i).map(|(end, _)| end),
    }
}

/// The string opened at `open`, from `i` on: the offset after its closing
/// quote and whether it has escapes.
#[inline(never)]
fn string_rest(buf: &[u8], open: usize, mut i: usize) -> Result<(usize, bool), Fail> {
    let mut escaped = false;
    loop {
        while let Some(chunk) = chunk16(buf, i) {
            let (stops, _, _) = stops16(chunk);
            if stops != 0 {
                i += stops.trailing_zeros() as usize;
                break;
            }
            i += 16;
        }
        let Some(&b) = buf.get(i) else {
            return Err((open, "unterminated string"));
        };
        match b {
            b'"' => return Ok((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                i = escape(buf, i)?;
            }
            0x00..=0x1F => return Err((i, "control character in string")),
            0x80..=0xFF => i = utf8(buf, i)?,
            _ => i += 1,
        }
    }
}

/// At `-` or a digit: the offset after the number when it is a plain one
/// (an integer, or with a fraction, of at most 308 integer digits and no
/// exponent); `None` for anything else, valid or not, which [`number_end`]
/// then reads. An `Option` stays in registers where `number_end`'s
/// `Result` goes through memory.
#[inline(always)]
fn number_fast(buf: &[u8], start: usize) -> Option<usize> {
    let digit = |i: usize| byte(buf, i).wrapping_sub(b'0') < 10;
    let int_start = start + usize::from(byte(buf, start) == b'-');
    let mut i = int_start + 1;
    match byte(buf, int_start) {
        b'0' => {}
        b'1'..=b'9' => {
            while digit(i) {
                i += 1;
            }
        }
        _ => return None,
    }
    match byte(buf, i) {
        b'.' => {
            let mut j = i + 1;
            while digit(j) {
                j += 1;
            }
            match byte(buf, j) {
                _ if j == i + 1 => None,
                b'e' | b'E' => None,
                _ if i - int_start > 308 => None,
                _ => Some(j),
            }
        }
        // An exponent, or a digit after a leading zero.
        b'e' | b'E' | b'0'..=b'9' => None,
        _ if i - int_start > 308 => None,
        _ => Some(i),
    }
}

/// At `-` or a digit: the offset after the number, and whether it is an
/// integer (no fraction, no exponent).
#[inline(always)]
fn number_end(buf: &[u8], start: usize) -> Result<(usize, bool), Fail> {
    let digit = |i: usize| byte(buf, i).wrapping_sub(b'0') < 10;
    let int_start = start + usize::from(byte(buf, start) == b'-');
    let mut i = int_start + 1;
    match byte(buf, int_start) {
        b'0' => {
            if digit(i) {
                return Err((i, BAD_NUMBER));
            }
        }
        b'1'..=b'9' => {
            while digit(i) {
                i += 1;
            }
        }
        _ => return Err((int_start, BAD_NUMBER)),
    }
    let int_digits = i - int_start;
    match byte(buf, i) {
        // A fraction without an exponent, the common case, is read here;
        // [`number_rest`] takes exponents and the rare long integer part.
        b'.' if int_digits <= 308 => {
            let mut j = i + 1;
            while digit(j) {
                j += 1;
            }
            match byte(buf, j) {
                _ if j == i + 1 => Err((j, BAD_NUMBER)),
                b'e' | b'E' => number_rest(buf, start, i, int_digits),
                _ => Ok((j, false)),
            }
        }
        b'.' | b'e' | b'E' => number_rest(buf, start, i, int_digits),
        _ if int_digits > 308 => number_rest(buf, start, i, int_digits),
        _ => Ok((i, true)),
    }
}

/// A number's fraction and exponent, from `i`, and its range.
#[inline(never)]
fn number_rest(
    buf: &[u8],
    start: usize,
    mut i: usize,
    int_digits: usize,
) -> Result<(usize, bool), Fail> {
    let digit = |i: usize| matches!(buf.get(i), Some(b'0'..=b'9'));
    let mut int = true;
    if buf.get(i) == Some(&b'.') {
        i += 1;
        if !digit(i) {
            return Err((i, BAD_NUMBER));
        }
        while digit(i) {
            i += 1;
        }
        int = false;
    }
    // An upper bound of the number's decimal magnitude: |value| <
    // 10^magnitude.
    let mut magnitude = int_digits as i64;
    if let Some(b'e' | b'E') = buf.get(i) {
        int = false;
        i += 1;
        let negative = match buf.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        if !digit(i) {
            return Err((i, BAD_NUMBER));
        }
        let mut exp: i64 = 0;
        while let Some(&d) = buf.get(i).filter(|d| d.is_ascii_digit()) {
            exp = (exp * 10 + i64::from(d - b'0')).min(1 << 40);
            i += 1;
        }
        if !negative {
            magnitude += exp;
        }
    }
    // Below 10^308 every number is finite; past it, round it to see.
    if magnitude > 308 && !parse_f64(&buf[start..i]).is_finite() {
        return Err((start, OUT_OF_RANGE));
    }
    Ok((i, int))
}

/// At `buf[i] == b'\\'`: check one escape; the offset after it.
#[inline]
fn escape(buf: &[u8], i: usize) -> Result<usize, Fail> {
    match buf.get(i + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 2),
        Some(b'u') => {
            let unit = hex4(buf, i + 2).ok_or((i, BAD_UNICODE))?;
            match unit {
                0xD800..=0xDBFF => {
                    // A high surrogate must be followed by an escaped low one.
                    let low = (buf.get(i + 6) == Some(&b'\\') && buf.get(i + 7) == Some(&b'u'))
                        .then(|| hex4(buf, i + 8))
                        .flatten();
                    if matches!(low, Some(0xDC00..=0xDFFF)) {
                        Ok(i + 12)
                    } else {
                        Err((i, BAD_UNICODE))
                    }
                }
                0xDC00..=0xDFFF => Err((i, BAD_UNICODE)),
                _ => Ok(i + 6),
            }
        }
        Some(_) => Err((i, BAD_ESCAPE)),
        None => Err((i, EOF)),
    }
}

fn hex4(buf: &[u8], at: usize) -> Option<u32> {
    let digits = buf.get(at..at + 4)?;
    digits.iter().try_fold(0u32, |acc, &d| {
        let v = (d as char).to_digit(16)?;
        Some(acc * 16 + v)
    })
}

/// At a non-ASCII byte `buf[i]`: check one UTF-8 sequence (RFC 3629: no
/// overlong forms, no surrogates, nothing past U+10FFFF); the offset after it.
#[inline]
fn utf8(buf: &[u8], i: usize) -> Result<usize, Fail> {
    let cont =
        |at: usize, lo: u8, hi: u8| matches!(buf.get(at), Some(&b) if (lo..=hi).contains(&b));
    let ok = match buf[i] {
        0xC2..=0xDF => cont(i + 1, 0x80, 0xBF).then_some(2),
        0xE0 => (cont(i + 1, 0xA0, 0xBF) && cont(i + 2, 0x80, 0xBF)).then_some(3),
        0xE1..=0xEC | 0xEE..=0xEF => {
            (cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF)).then_some(3)
        }
        0xED => (cont(i + 1, 0x80, 0x9F) && cont(i + 2, 0x80, 0xBF)).then_some(3),
        0xF0 => (cont(i + 1, 0x90, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
            .then_some(4),
        0xF1..=0xF3 => {
            (cont(i + 1, 0x80, 0xBF) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
                .then_some(4)
        }
        0xF4 => (cont(i + 1, 0x80, 0x8F) && cont(i + 2, 0x80, 0xBF) && cont(i + 3, 0x80, 0xBF))
            .then_some(4),
        _ => None,
    };
    ok.map(|n| i + n).ok_or((i, BAD_UTF8))
}

/// One decoded unit of an escaped string: the UTF-8 bytes of an escape, or
/// one raw byte. `raw` must have passed [`Scanner::string`].
#[inline]
fn next_unit<'r>(raw: &'r [u8], i: &mut usize, tmp: &'r mut [u8; 4]) -> &'r [u8] {
    let at = *i;
    if raw[at] != b'\\' {
        *i += 1;
        return &raw[at..at + 1];
    }
    let byte = match raw.get(at + 1) {
        Some(b'b') => 0x08,
        Some(b'f') => 0x0C,
        Some(b'n') => b'\n',
        Some(b'r') => b'\r',
        Some(b't') => b'\t',
        Some(b'u') => {
            let unit = hex4(raw, at + 2).unwrap_or(0xFFFD);
            let c = if (0xD800..=0xDBFF).contains(&unit) {
                let low = hex4(raw, at + 8).unwrap_or(0xDC00);
                *i += 12;
                0x10000 + ((unit - 0xD800) << 10) + (low.wrapping_sub(0xDC00) & 0x3FF)
            } else {
                *i += 6;
                unit
            };
            let c = char::from_u32(c).unwrap_or('\u{FFFD}');
            return c.encode_utf8(tmp).as_bytes();
        }
        Some(&other) => other,
        None => b'\\',
    };
    *i += 2;
    tmp[0] = byte;
    &tmp[..1]
}

/// Write the unescaped form of the validated string contents `raw` into
/// `out` (at least `raw.len()` bytes: unescaping never grows a string); the
/// number of bytes written.
pub(super) fn unescape_into(raw: &[u8], out: &mut [u8]) -> usize {
    let mut i = 0;
    let mut n = 0;
    let mut tmp = [0u8; 4];
    while i < raw.len() {
        // Copy the run up to the next escape in one go.
        let run = raw[i..]
            .iter()
            .position(|&b| b == b'\\')
            .unwrap_or(raw.len() - i);
        if let (Some(dst), Some(src)) = (out.get_mut(n..n + run), raw.get(i..i + run)) {
            dst.copy_from_slice(src);
        }
        n += run;
        i += run;
        if i < raw.len() {
            let unit = next_unit(raw, &mut i, &mut tmp);
            if let Some(dst) = out.get_mut(n..n + unit.len()) {
                dst.copy_from_slice(unit);
            }
            n += unit.len();
        }
    }
    n.min(out.len())
}

/// Whether the validated, escaped string contents `raw` unescape to `name`,
/// without materialising them.
pub(super) fn unescaped_eq(raw: &[u8], name: &[u8]) -> bool {
    let mut i = 0;
    let mut at = 0;
    let mut tmp = [0u8; 4];
    while i < raw.len() {
        let unit = next_unit(raw, &mut i, &mut tmp);
        if name.get(at..at + unit.len()) != Some(unit) {
            return false;
        }
        at += unit.len();
    }
    at == name.len()
}

/// An integer's text (`-?[0-9]+`, validated) as i64; `None` past i64.
#[inline]
pub(super) fn parse_i64(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    // Accumulate negatively so that i64::MIN fits.
    let mut n: i64 = 0;
    for &d in digits {
        n = n
            .checked_mul(10)?
            .checked_sub(i64::from(d.wrapping_sub(b'0')))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

/// A validated number's text as the nearest f64 (correctly rounded).
#[inline]
pub(super) fn parse_f64(text: &[u8]) -> f64 {
    // Validated number text is ASCII, so this cannot fail.
    std::str::from_utf8(text)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// Validate `doc` as one JSON text: `Ok` for any valid JSON value.
pub fn validate(doc: &[u8]) -> Result<(), (usize, &'static str)> {
    let mut s = Scanner::new(doc);
    if s.skip_ws().is_none() {
        return Err((doc.len(), "no JSON value"));
    }
    s.value()?;
    s.finish()
}

/// [`validate`] with a top-level container's skip split at `target` after
/// `w` steps ([`ahead::skip_split`]).
pub fn validate_split(doc: &[u8], w: usize, target: usize) -> Result<(), Fail> {
    let mut s = Scanner::new(doc);
    match s.skip_ws() {
        None => return Err((doc.len(), "no JSON value")),
        Some(b'{' | b'[') => s.pos = ahead::skip_split(doc, s.pos, w, target)?,
        Some(_) => {
            s.value()?;
        }
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(doc: &str) {
        assert_eq!(validate(doc.as_bytes()), Ok(()), "{doc:?}");
        assert!(
            serde_json::from_str::<serde_json::Value>(doc).is_ok(),
            "serde_json refuses {doc:?}"
        );
    }

    fn bad(doc: &[u8]) -> (usize, &'static str) {
        let got = validate(doc).expect_err(&String::from_utf8_lossy(doc));
        assert!(
            serde_json::from_slice::<serde_json::Value>(doc).is_err(),
            "serde_json accepts {:?}",
            String::from_utf8_lossy(doc)
        );
        got
    }

    #[test]
    fn accepts_the_grammar() {
        for doc in [
            "0",
            "-0",
            "1.5e-3",
            "1E+2",
            "-0.0e0",
            " true ",
            "null",
            "\"\"",
            r#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00""#,
            "\"\u{e9}\u{20ac}\u{10348}\"",
            "[]",
            "{}",
            r#"{"a":[1,{"b":null}],"c":"d"}"#,
            "18446744073709551616",
            "1e-400",
            "0e99999999999999999999",
            "1.7976931348623157e308",
            "123456789012345678901234567890",
            "\t\r\n[ 1 , 2 ]\n",
        ] {
            ok(doc);
        }
    }

    #[test]
    fn refuses_with_the_offset() {
        assert_eq!(bad(b"01"), (1, BAD_NUMBER));
        assert_eq!(bad(b"-"), (1, BAD_NUMBER));
        assert_eq!(bad(b"1."), (2, BAD_NUMBER));
        assert_eq!(bad(b"1e"), (2, BAD_NUMBER));
        assert_eq!(bad(b".5"), (0, UNEXPECTED));
        assert_eq!(bad(b"1e400"), (0, OUT_OF_RANGE));
        assert_eq!(bad(b"-1.8e308"), (0, OUT_OF_RANGE));
        assert_eq!(bad(&[b'1'; 400]), (0, OUT_OF_RANGE));
        assert_eq!(bad(b"[1,]"), (3, UNEXPECTED));
        assert_eq!(bad(b"[1 2]"), (3, "expected ',' or ']'"));
        assert_eq!(bad(b"{\"a\" 1}"), (5, "expected ':'"));
        assert_eq!(bad(b"{\"a\":1,}"), (7, "expected a string member name"));
        assert_eq!(bad(b"{1:1}"), (1, "expected a string member name"));
        assert_eq!(bad(b"\"a\\x\""), (2, BAD_ESCAPE));
        assert_eq!(bad(b"\"\\ud800\""), (1, BAD_UNICODE));
        assert_eq!(bad(b"\"\\ud800\\u0041\""), (1, BAD_UNICODE));
        assert_eq!(bad(b"\"\\udc00\""), (1, BAD_UNICODE));
        assert_eq!(bad(b"\"\\u12\""), (1, BAD_UNICODE));
        assert_eq!(bad(b"\"ab\x1f\""), (3, "control character in string"));
        assert_eq!(bad(b"\"abcdefghij\x7f\xff\""), (12, BAD_UTF8));
        assert_eq!(bad(b"\"\xed\xa0\x80\""), (1, BAD_UTF8)); // a surrogate
        assert_eq!(bad(b"\"\xc0\xaf\""), (1, BAD_UTF8)); // overlong
        assert_eq!(bad(b"\"\xf4\x90\x80\x80\""), (1, BAD_UTF8)); // past U+10FFFF
        assert_eq!(bad(b"\"abc"), (0, "unterminated string"));
        assert_eq!(bad(b"tru"), (0, UNEXPECTED));
        assert_eq!(bad(b"[] x"), (3, "trailing characters after the value"));
        assert_eq!(
            bad(b"{}\n{}"),
            (
                3,
                "trailing characters after the value (one JSON value a line? send Content-Type: application/x-ndjson)"
            )
        );
        assert_eq!(bad(b"{} {}").1, "trailing characters after the value");
        assert_eq!(bad(b"\xef\xbb\xbf{}"), (0, UNEXPECTED)); // no BOM
        assert_eq!(bad(b"\x0c1"), (0, UNEXPECTED)); // form feed is not whitespace
        assert_eq!(bad(b"[").1, EOF);
        assert_eq!(bad(b" ").1, "no JSON value");
    }

    #[test]
    fn depth_limit_is_serde_jsons() {
        let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        ok(&nest(MAX_DEPTH as usize));
        assert_eq!(
            bad(nest(MAX_DEPTH as usize + 1).as_bytes()),
            (MAX_DEPTH as usize, "nesting too deep")
        );
        let objects = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
        ok(&objects(MAX_DEPTH as usize));
        bad(objects(MAX_DEPTH as usize + 1).as_bytes());
    }

    #[test]
    fn plain_numbers_fast_and_the_rest_on_the_full_path() {
        // `number_fast` answers only where `number_end` accepts, and with the
        // same end; what it leaves is left to `number_end`.
        let plain = [
            "0",
            "7",
            "12",
            "-3",
            "-0",
            "1.5",
            "-2.25",
            "0.0",
            "10.01",
            "123456789012",
        ];
        let other = [
            "1e5", "1E5", "1.5e3", "-0.5E-2", "01", "-01", "00", "-", "1.", "-.5", ".5", "1.e3",
            "-a", "1.x",
        ];
        for (text, fast) in plain
            .iter()
            .map(|t| (t, true))
            .chain(other.iter().map(|t| (t, false)))
        {
            for tail in ["", ",", "]", " ", "x"] {
                let doc = format!("{text}{tail}");
                let buf = doc.as_bytes();
                let full = number_end(buf, 0).ok().map(|(end, _)| end);
                let got = number_fast(buf, 0);
                assert_eq!(got.is_some(), fast, "{doc:?}");
                if let Some(end) = got {
                    assert_eq!(Some(end), full, "{doc:?}");
                    assert_eq!(end, text.len(), "{doc:?}");
                }
            }
        }
        let long = "9".repeat(309);
        assert_eq!(number_fast(long.as_bytes(), 0), None);
        assert_eq!(number_fast(format!("{long}.5").as_bytes(), 0), None);
        let most = "9".repeat(308);
        assert_eq!(number_fast(most.as_bytes(), 0), Some(308));
        bad(format!("[{long}0{long}]").as_bytes());
        ok(&format!("[{most},{most}.5,-{most}]"));
    }

    #[test]
    fn member_heads_on_both_paths() {
        // `{"name":` and `,"name":` read in one chunk, and every way of leaving that path:
        // a space, an escape, a non-ASCII byte, a name too long for the
        // chunk, the end of the input inside the chunk.
        for name in [
            "a",
            "tags",
            "a_name_of_13c",
            "a_name_of_14ch",
            "a_long_name_of_many_bytes",
        ] {
            for sep in [",", ", ", ",\n"] {
                for colon in [":", " :", ": "] {
                    ok(&format!(r#"{{"x":1{sep}"{name}"{colon}2}}"#));
                    ok(&format!(r#"[{{"x":[1]{sep}"{name}"{colon}{{}}}}]"#));
                }
            }
        }
        for name in [
            "a",
            "a_name_of_13c",
            "a_name_of_14ch",
            "a_long_name_of_many_bytes",
        ] {
            for open in ["{", "{ ", "[{"] {
                for colon in [":", " :", ": "] {
                    let close = if open == "[{" { "}]" } else { "}" };
                    ok(&format!(r#"{open}"{name}"{colon}[]{close}"#));
                }
            }
        }
        ok(r#"{"\u0041":{"\u0041":2}}"#);
        assert_eq!(bad(br#"{"ab"2}"#), (5, "expected ':'"));
        assert_eq!(bad(br#"[{"ab":}]"#), (7, UNEXPECTED));
        assert_eq!(bad(br#"[{"a\qb":2}]"#), (4, BAD_ESCAPE));
        ok(r#"{"x":1,"\u0041":2}"#);
        ok("{\"x\":1,\"\u{e9}t\u{e9}\":2}");
        assert_eq!(bad(br#"{"x":1,"ab"2}"#), (11, "expected ':'"));
        assert_eq!(bad(br#"{"x":1,"ab";2}"#), (11, "expected ':'"));
        assert_eq!(bad(br#"{"x":1,"a\qb":2}"#), (9, BAD_ESCAPE));
        assert_eq!(
            bad(b"{\"x\":1,\"a\x01\":2}"),
            (9, "control character in string")
        );
        assert_eq!(bad(br#"{"x":1,"ab":}"#), (12, UNEXPECTED));
        assert_eq!(bad(br#"{"x":1,"ab":"#), (12, EOF));
        assert_eq!(bad(br#"{"x":1,"ab""#), (11, EOF));
        assert_eq!(bad(br#"{"x":1,1:2}"#), (7, "expected a string member name"));
    }

    #[test]
    fn stops16_marks_exactly_the_stops() {
        // Every byte value at every position, beside plain bytes and a later
        // quote: the masks are exactly the bytes a string scan must stop at.
        for at in 0..16 {
            for b in 0..=255u8 {
                let mut chunk = [b'a'; 16];
                chunk[at] = b;
                if at < 15 {
                    chunk[15] = b'"';
                }
                let got = stops16(&chunk);
                let stop = matches!(b, b'"' | b'\\' | 0x00..=0x1F | 0x80..=0xFF);
                let mut want_stops = u32::from(stop) << at;
                let mut want_quotes = u32::from(b == b'"') << at;
                let want_colons = u32::from(b == b':') << at;
                if at < 15 {
                    want_stops |= 1 << 15;
                    want_quotes |= 1 << 15;
                }
                assert_eq!(got, (want_stops, want_quotes, want_colons), "{chunk:?}");
            }
        }
        for plain in [b' ', b'!', b'#', b'[', b']', b'~', 0x7F, b'a'] {
            assert_eq!(stops16(&[plain; 16]), (0, 0, 0));
        }
    }

    #[test]
    fn unescapes_and_compares() {
        let raw = br#"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00z"#;
        let want = "a\"\\/\u{8}\u{c}\n\r\t\u{e9}\u{1f600}z";
        let mut out = [0u8; 64];
        let n = unescape_into(raw, &mut out);
        assert_eq!(&out[..n], want.as_bytes());
        assert!(unescaped_eq(raw, want.as_bytes()));
        assert!(!unescaped_eq(raw, &want.as_bytes()[..want.len() - 1]));
        assert!(!unescaped_eq(br"\u0041", b"AB"));
        assert!(unescaped_eq(br"\u0041B", b"AB"));
    }

    #[test]
    fn integers_at_the_edges() {
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-9223372036854775809"), None);
        assert_eq!(parse_i64(b"-0"), Some(0));
        assert_eq!(parse_i64(b"18446744073709551616"), None);
    }

    #[test]
    fn floats_are_correctly_rounded() {
        // Halfway and near-halfway cases that naive multiplication gets wrong.
        for text in [
            "9007199254740993",
            "2.2250738585072011e-308",
            "1.7976931348623158e308",
            "0.1",
            "4.9406564584124654e-324",
        ] {
            assert_eq!(
                parse_f64(text.as_bytes()).to_bits(),
                text.parse::<f64>().map(f64::to_bits).unwrap_or(0)
            );
        }
    }
}
