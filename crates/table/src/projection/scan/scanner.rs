//! The [`Scanner`]: a cursor over one JSON document that the projection drives
//! value by value (an object's members, an array's elements, a value whole),
//! and what it reports of each value ([`Found`]). Values the projection does
//! not want are stepped over by the cargo skip (`skip`), started from here.
//!
//! What it is not: the grammar of a string or a number (`string`, `number`),
//! the loop of the cargo skip (`skip`), or the choice of which members to read
//! (the configured paths, `projection::paths`).

use super::ahead;
use super::number::number_end;
use super::skip::{walk, Cursor, Stop};
use super::string::{string_head, string_rest};
use super::token::{at_end_or, next, ws};
use super::{Fail, EOF, MAX_DEPTH, UNEXPECTED};

/// What a scanned value was. Strings and numbers are byte ranges of the
/// document; containers were validated and stepped over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::projection) enum Found {
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
pub(in crate::projection) struct Scanner<'b> {
    buf: &'b [u8],
    pub(in crate::projection) pos: usize,
    /// Arrays and objects open now.
    depth: u32,
    /// The length of the last container skipped that was large enough to
    /// split (0: none yet): where the next one is expected to end, since
    /// the messages of one body, and of one worker, tend to look alike.
    pub(in crate::projection) hint: usize,
    /// The cargo skip's `kinds[l]`: whether the container open at level `l`
    /// (1-based) is an object. Each level is written when it opens, before
    /// it is read, so one array serves every skip of the document, zeroed
    /// once (not once a skip: a bench 8 KiB message has 73 skips).
    kinds: [bool; 256],
}

impl<'b> Scanner<'b> {
    pub(in crate::projection) fn new(buf: &'b [u8]) -> Scanner<'b> {
        Scanner {
            buf,
            pos: 0,
            depth: 0,
            hint: 0,
            kinds: [false; 256],
        }
    }

    /// The document being scanned.
    pub(in crate::projection) fn buf(&self) -> &'b [u8] {
        self.buf
    }

    /// Step over whitespace; the next byte, if any.
    #[inline(always)]
    pub(in crate::projection) fn skip_ws(&mut self) -> Option<u8> {
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
    pub(in crate::projection) fn finish(&mut self) -> Result<(), Fail> {
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
    pub(in crate::projection) fn object_start(&mut self) -> Result<bool, Fail> {
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
    pub(in crate::projection) fn member_name(&mut self) -> Result<(usize, usize, bool), Fail> {
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
    pub(in crate::projection) fn next_member(&mut self) -> Result<bool, Fail> {
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
    pub(in crate::projection) fn array_start(&mut self) -> Result<bool, Fail> {
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
    pub(in crate::projection) fn next_element(&mut self) -> Result<bool, Fail> {
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
    pub(in crate::projection) fn value(&mut self) -> Result<Found, Fail> {
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
    pub(in crate::projection) fn skip(&mut self) -> Result<(), Fail> {
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
    pub(in crate::projection) fn string(&mut self) -> Result<(usize, usize, bool), Fail> {
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
