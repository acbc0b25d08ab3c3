//! A second cursor ahead: the cargo skip of a large container split in two
//! and the halves validated interleaved, a step of each in turn.
//!
//! Why: the skip is bound by the latency of its cursor, not by its
//! instructions (BENCHMARKS.md, "Tried, not kept"): each token's end is computed from its
//! bytes, and the next token's loads wait for it. Two cursors over two
//! parts of the document are two independent chains, which the CPU
//! overlaps (BENCHMARKS.md, "Ingest", measures the gain).
//!
//! How, without knowing what the second part is:
//! - The first cursor `a` is the skip itself, exact. The second, `b`, starts
//!   at a `,` found near the middle of what is left, *speculating* that it
//!   is outside any string and guessing its container's kind from what
//!   follows (`,"name":` is an object, anything else an array). It keeps its
//!   levels relative to where it started (`BASE`). When it closes the
//!   container it started in, it guesses the kind of the one below from what
//!   follows the bracket, and records each guess and where each such level
//!   ended.
//! - `b` stops at its first error, before the step that failed, or when a
//!   guess cannot be made. Either way it is only ever a speculation.
//! - The two run a step each in turn until `a` reaches `b`'s start. The
//!   speculation holds when `a` arrives exactly there, at the start of a
//!   value in a container of the kind `b` guessed, and `b`'s guesses for the
//!   levels below equal `a`'s kinds, and `b`'s depth fits in `a`'s room.
//!   Then what `b` validated is what `a` would have validated from there, in
//!   the same state, so `a` takes `b`'s cursor (or ends the skip where `b`
//!   closed its container) and goes on alone. Otherwise `b`'s work is
//!   dropped and `a` goes on alone from where it is.
//! - An error is only ever reported by `a`: where `b` stopped at one, `a`
//!   meets it again from the same state, so the error and its offset are
//!   exactly those of a skip with one cursor.

use super::{member_head, name_end, next, step, Cursor, Fail, MAX_DEPTH};

/// Bytes a skip goes alone before it considers a split, at the next
/// opening bracket: smaller containers (most of them) never pay for one.
/// (A large array of scalars alone, with no bracket past this, is not
/// split.)
pub(super) const WARM: usize = 512;
/// The least distance from `a` to the expected end worth a split.
pub(super) const MIN_SPLIT: usize = 1024;
/// `b`'s level where it starts, in its own `kinds`.
const BASE: u32 = 128;
/// The most levels `b` opens above its start.
const ABOVE: u32 = 64;
/// How far from the middle `b` looks for a `,` to start at.
const SEEK: usize = 256;

/// Split the skip at `target`: `a` has validated everything before its
/// cursor, at `a.level` with `kinds`, `room` levels allowed. `Ok(Some(end))`
/// when the skipped value ended at `end`; `Ok(None)` when `a` goes on alone
/// from its (updated) cursor; an error is `a`'s, exact.
#[inline(never)]
pub(super) fn split(
    buf: &[u8],
    a: &mut Cursor,
    kinds: &mut [bool; 256],
    room: u32,
    target: usize,
) -> Result<Option<usize>, Fail> {
    let Some((mut b, base_kind)) = start(buf, target) else {
        return Ok(None);
    };
    let at = b.i;
    let mut bk = [false; 256];
    bk[BASE as usize] = base_kind;
    let mut below = Below::new(base_kind);
    // Both cursors in locals (registers), not behind references: `down`
    // takes `b` by value, so its address never escapes.
    let mut ca = *a;
    let mut floor = below.floor;
    'both: while ca.i < at {
        if step(buf, &mut ca, kinds, room, 0)? {
            return Ok(Some(ca.i));
        }
        match step(buf, &mut b, &mut bk, BASE + ABOVE, floor) {
            Ok(false) => continue,
            Ok(true) => {
                if let Some(on) = below.down(buf, b, &mut bk) {
                    b = on;
                    floor = below.floor;
                    continue;
                }
            }
            Err(_) => {}
        }
        // `b` stopped: `a` alone up to `b`'s start.
        while ca.i < at {
            if step(buf, &mut ca, kinds, room, 0)? {
                return Ok(Some(ca.i));
            }
        }
        break 'both;
    }
    *a = ca;
    Ok(below.join(a, kinds, room, &b, &bk, at))
}

/// At a `,` from `target` (within [`SEEK`] bytes): `b`'s cursor at the value
/// after it, and the kind of container it guesses that is.
fn start(buf: &[u8], target: usize) -> Option<(Cursor, bool)> {
    let end = buf.len().min(target.saturating_add(SEEK));
    let comma = target + buf.get(target..end)?.iter().position(|&c| c == b',')?;
    let (i, object) = after_comma(buf, comma)?;
    Some((
        Cursor {
            i,
            level: BASE,
            object,
        },
        object,
    ))
}

/// After the `,` at `comma`, in a container of unknown kind: where the next
/// value starts and whether the container is an object (`,"name":`, read as
/// [`step`] reads it), else an array. `None` when a name's string is bad.
fn after_comma(buf: &[u8], comma: usize) -> Option<(usize, bool)> {
    if let Some(value) = member_head(buf, comma) {
        return Some((value, true));
    }
    let (j, d) = next(buf, comma + 1);
    if d == b'"' {
        if let Ok(value) = name_end(buf, j) {
            return Some((value, true));
        }
        // A string with no `:` after it: an array's element (or an error
        // that `a` finds).
        super::string_end(buf, j).ok()?;
    }
    Some((comma + 1, false))
}

/// What `b` guessed of the levels under its start, and where it closed them.
struct Below {
    /// `b`'s lowest level so far, less one: [`step`] stops there.
    floor: u32,
    /// `guess[l]`: the kind `b` took level `l` to be, for `floor < l <= BASE`.
    guess: [bool; BASE as usize + 1],
    /// `closed[l]`: the offset after the bracket that took `b` from level
    /// `l + 1` to `l`, for `floor < l < BASE`.
    closed: [usize; BASE as usize + 1],
    /// `b` is after a value at level `floor + 1` but could not go on (it is
    /// not at the start of a value, so `a` cannot take its cursor).
    stuck: bool,
}

impl Below {
    fn new(base_kind: bool) -> Below {
        let mut guess = [false; BASE as usize + 1];
        guess[BASE as usize] = base_kind;
        Below {
            floor: BASE - 1,
            guess,
            closed: [0; BASE as usize + 1],
            stuck: false,
        }
    }

    /// `b` closed level `floor + 1` and is after the bracket, at `floor`,
    /// a level it knows nothing of: guess its kind from what follows, and
    /// close more levels while brackets follow. `b`'s cursor when it is at
    /// the start of a value again.
    #[cold]
    fn down(&mut self, buf: &[u8], mut b: Cursor, bk: &mut [bool; 256]) -> Option<Cursor> {
        loop {
            let level = b.level;
            self.closed[level as usize] = b.i;
            self.floor = level - 1;
            let (j, c) = next(buf, b.i);
            let kind = match c {
                b',' => match after_comma(buf, j) {
                    Some((value, object)) => {
                        self.guess[level as usize] = object;
                        bk[level as usize] = object;
                        return Some(Cursor {
                            i: value,
                            level,
                            object,
                        });
                    }
                    None => break,
                },
                b'}' => true,
                b']' => false,
                _ => break,
            };
            self.guess[level as usize] = kind;
            if level == 1 {
                break;
            }
            b = Cursor {
                i: j + 1,
                level: level - 1,
                object: false,
            };
        }
        self.stuck = true;
        None
    }

    /// `a` is at `b`'s start or past it. Take what `b` validated when the
    /// speculation holds; `Some(end)` when the skipped value ended there.
    fn join(
        &self,
        a: &mut Cursor,
        kinds: &mut [bool; 256],
        room: u32,
        b: &Cursor,
        bk: &[bool; 256],
        at: usize,
    ) -> Option<usize> {
        let d = a.level;
        if d == 0 || a.i != at || a.object != self.guess[BASE as usize] || d + ABOVE > room {
            return None;
        }
        // `b`'s level `l` is `a`'s `d + l - BASE`; each level `b` guessed
        // must be what `a` knows, down to the skipped value's own level 1.
        let lowest = self.floor + 1;
        for l in (lowest..=BASE).rev() {
            let la = d + l - BASE;
            if la == 0 {
                // `b` closed the skipped value: it ended there.
                return Some(self.closed[l as usize]);
            }
            if kinds[la as usize] != self.guess[l as usize] {
                return None;
            }
        }
        if self.stuck {
            return None;
        }
        // `a` takes `b`'s cursor: the levels `b` opened over its lowest one
        // are `b`'s, those under it `a`'s.
        for l in lowest + 1..=b.level {
            kinds[(d + l - BASE) as usize] = bk[l as usize];
        }
        *a = Cursor {
            i: b.i,
            level: d + b.level - BASE,
            object: b.object,
        };
        None
    }
}

/// The skip of the container at `i`, split at `target` after `w` steps
/// alone, whatever its size: for the tests and the differential fuzz target
/// (through `projection::validate_split`), which check that it answers as
/// one cursor does for any split.
pub(super) fn skip_split(buf: &[u8], i: usize, w: usize, target: usize) -> Result<usize, Fail> {
    let mut kinds = [false; 256];
    let mut a = Cursor {
        i,
        level: 0,
        object: false,
    };
    for _ in 0..w {
        if step(buf, &mut a, &mut kinds, MAX_DEPTH, 0)? {
            return Ok(a.i);
        }
    }
    if let Some(end) = split(buf, &mut a, &mut kinds, MAX_DEPTH, target)? {
        return Ok(end);
    }
    while !step(buf, &mut a, &mut kinds, MAX_DEPTH, 0)? {}
    Ok(a.i)
}
