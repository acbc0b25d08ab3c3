//! The cargo skip: a value the projection does not read, validated and
//! stepped over in one loop over its bytes, containers tracked on a stack of
//! their kinds instead of by recursion. Its grammar is written once
//! (`skip_grammar!`) for its two users: [`walk`], one cursor to the end, and
//! [`step`], one value at a time, which `projection::ahead` runs for two
//! cursors in turn.
//!
//! What it is not: where a skip starts and how a large container is split
//! (`Scanner::skip`, `projection::ahead`), or the grammar of a string or a
//! number (`string`, `number`), which it calls.

use super::number::{number_end, number_fast};
use super::string::{member_head, string_end};
use super::token::{at_end_or, byte, literal_end, name_end, next, ws};
use super::{Fail, UNEXPECTED};

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
pub(super) enum Stop {
    /// The skipped value ended here.
    End(usize),
    /// At an opening bracket past `warm`: time to consider a split.
    Warm(Cursor),
}

/// The cargo skip with one cursor, from `cur` (a value's start) on: one loop
/// over the bytes, containers tracked on `kinds` (see [`Scanner::skip`](super::Scanner::skip)).
/// Stops at the end of the skipped value, or at the first opening bracket
/// at or past `warm`. The grammar is [`skip_grammar`]'s, as [`step`]'s is;
/// as one loop it keeps the hot path's values in registers, where a loop
/// over `step` spills some.
#[inline(never)]
pub(super) fn walk(
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
pub(in crate::projection) struct Cursor {
    pub(in crate::projection) i: usize,
    pub(in crate::projection) level: u32,
    pub(in crate::projection) object: bool,
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
pub(in crate::projection) fn step(
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
