//! The projection (docs/boxes.md#messages, docs/boxes.md#epochs-and-arenas): an
//! ingest body scanned once by a validating JSON scanner of our own, and from each
//! message only the key and the configured fields read; every other member is
//! cargo, validated and stepped over, never materialised.
//!
//! What it owns: the [`Projector`], one per worker, holding the plan's
//! pointers merged into a tree (see `paths`) and one slot per tree node; and
//! the rules that turn a body into a [`Batch`] of messages or a [`BodyError`].
//!
//! How a body goes through (`scan` and `paths`):
//! 1. The scanner walks the body once, in place (the body is not copied). It
//!    checks the whole JSON grammar and the UTF-8 of every string, and accepts
//!    exactly what `serde_json::from_slice::<serde_json::Value>` accepts (see
//!    `scan` for the details: serde_json's depth limit, numbers whose value is
//!    finite).
//! 2. In each message object, member names are compared with the configured
//!    pointers (escaped names are compared by their unescaped form, without
//!    materialising them); a match records where its value is (a byte range
//!    of the body for strings and numbers). Other values are validated and
//!    stepped over.
//! 3. When the message object is closed, each found value is type-checked
//!    against the plan and only then decoded: numbers are parsed (f64
//!    correctly rounded), the key and `str` values unescaped into the arena,
//!    so every extracted `&str` borrows from the arena and lives exactly as
//!    long as the epoch. A failed arena allocation is [`BodyError::ArenaFull`],
//!    never a panic.
//!
//! Steady state (a warm arena and a warm projector) allocates nothing outside
//! the arena: `tests/alloc_projection.rs` counts.
//!
//! Decisions (the user-facing ones are in docs/boxes.md#messages):
//! - JSON `null` is treated as absent: the field is left unchanged. A key of
//!   `null` is "key is not a string".
//! - JSON pointer tokens name object members only: a pointer through an array,
//!   or through a scalar, finds nothing (absent), it is not an error.
//! - A member that appears twice in one object: the last one wins, for
//!   intermediate objects too (`{"a":{"b":1},"a":{}}` has no `/a/b`).
//! - `i64` accepts JSON integers within the i64 range; a number written with a
//!   fraction or exponent (`5.0`, `1e3`) or an integer past i64 is the wrong
//!   type. `f64` accepts any number: an integer within i64 is converted
//!   (`-0` is `0.0`), anything else is the correctly rounded nearest f64.
//! - Validity follows serde_json: an integer past u64 (`18446744073709551616`)
//!   is a valid number (an f64); a number whose nearest f64 is infinite
//!   (`1e400`) is refused ("number out of range", 400); `1e-400` is `0.0`;
//!   more than [`MAX_DEPTH`] nested arrays/objects are refused.
//! - `str` limits (`max_len`) count bytes of the unescaped UTF-8 string.
//! - The first problem in a message is reported: the key first, then fields in
//!   plan order. The first problem in the body's bytes is the one an invalid
//!   body is refused for.
//! - A body with no JSON value in it (empty, whitespace only, only blank NDJSON
//!   lines) is invalid JSON.
//! - With [`KeySource::Path`] the body is always one JSON document holding one
//!   object, whatever its format; the body's key member is not read.
//! - NDJSON lines are split on `\n`; a `\r` before it is whitespace. Lines are
//!   scanned one by one, each one JSON document.

mod error;
mod paths;
mod scan;

#[cfg(test)]
mod tests;

pub use error::BodyError;
pub use scan::MAX_DEPTH;

use crate::bytes::{count_lf, find_lf};
use crate::config::FieldType;
use crate::plan::{MessageError, Plan, Value};
use bumpalo::collections::Vec as BumpVec;
use bumpalo::Bump;
use paths::PathTree;
use scan::{Found, Scanner};
use std::sync::Arc;

/// How the body is framed, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// One JSON document: an object or an array of objects.
    Json,
    /// `application/x-ndjson`: one JSON value per line.
    Ndjson,
}

/// Where each message's box key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The message's `plan.key_field` member (`POST /v1/ingest`).
    Body,
    /// The request path (`POST /v1/boxes/{key}`): the body is one object, its
    /// key member is ignored and [`Message::key`] is `""`.
    Path,
}

/// What the top level of the body was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One object: one message, answered with the box's payload or a 422.
    Object,
    /// An array: a batch, answered with counts.
    Array,
    /// NDJSON lines: a batch, answered with counts.
    Ndjson,
}

/// One accepted-so-far message: its key and the configured fields' values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Message<'a> {
    /// The box key (`""` with [`KeySource::Path`]).
    pub key: &'a str,
    /// One per plan field, in plan order; `None` = absent or null (leave the
    /// field unchanged). `count` fields are always `None`.
    pub values: &'a [Option<Value<'a>>],
    /// Where the message's object lies in the body (start and end byte
    /// offsets): what a node of a log produces as the record's value.
    pub span: (u32, u32),
}

/// Every message of a body, in body order; rejected messages keep their place
/// so batch errors can name their index.
#[derive(Debug)]
pub struct Batch<'a> {
    pub shape: Shape,
    pub items: BumpVec<'a, Result<Message<'a>, MessageError>>,
}

/// Check that `doc` is one valid JSON text (any value, not only an object):
/// the projection's grammar without its shape rules. `Err` is
/// [`BodyError::InvalidJson`] with the offset of the first problem.
pub fn validate(doc: &[u8]) -> Result<(), BodyError> {
    scan::validate(doc).map_err(|f| error::invalid_json(f, 0))
}

/// [`validate`], with the skip of a top-level array or object split in two
/// at `target` after `w` steps (see `ahead`), whatever the document's size.
/// Its answer must be [`validate`]'s for any split: the differential fuzz
/// target checks that on arbitrary bytes. Not for use outside tests.
#[doc(hidden)]
pub fn validate_split(doc: &[u8], w: usize, target: usize) -> Result<(), BodyError> {
    scan::validate_split(doc, w, target).map_err(|f| error::invalid_json(f, 0))
}

/// Why a message was not read: the message alone is rejected, or the whole
/// body is (the arena is full).
enum Reject {
    Message(MessageError),
    Body(BodyError),
}

impl From<MessageError> for Reject {
    fn from(e: MessageError) -> Reject {
        Reject::Message(e)
    }
}

/// Parses bodies for one worker. Everything a [`Batch`] borrows is in the
/// caller's arena; the projector itself keeps only the path tree and its
/// slots.
pub struct Projector {
    plan: Arc<Plan>,
    paths: PathTree,
    /// Per path-tree node: what the current message holds there.
    slots: Vec<Found>,
    /// The plan fields that read a value (not `count`), in plan order.
    reads: Vec<FieldRead>,
    /// The key member's slot.
    key_node: usize,
    /// The scanner's [`Scanner::hint`], kept from body to body.
    skip_hint: usize,
}

/// What reading one plan field's value takes, gathered from the plan and the
/// path tree once.
struct FieldRead {
    /// The field's index in the plan (and in [`Message::values`]).
    index: usize,
    /// The slot its pointer ends at.
    node: usize,
    ty: FieldType,
    max_len: usize,
    /// `index` as carried by `MessageError`.
    id: u16,
    /// The index of an earlier field that reads the same slot as the same
    /// type, not `str` (`/value` read by a `last` and a `sum` field): its
    /// value is this one's, decoded once. (An error would have been the
    /// earlier field's, reported first; `str` values are copied into the
    /// arena once per field, as the arena's accounting expects.)
    same_as: Option<usize>,
}

impl Projector {
    pub fn new(plan: Arc<Plan>) -> Projector {
        let paths = PathTree::new(&plan);
        let mut reads: Vec<FieldRead> = Vec::new();
        for (index, field) in plan.fields.iter().enumerate() {
            let Some(node) = paths.field_node(index) else {
                continue;
            };
            let same_as = reads
                .iter()
                .find(|r| r.node == node && r.ty == field.ty && field.ty != FieldType::Str)
                .map(|r| r.index);
            reads.push(FieldRead {
                index,
                node,
                ty: field.ty,
                max_len: field.max_len,
                id: u16::try_from(index).unwrap_or(u16::MAX),
                same_as,
            });
        }
        Projector {
            slots: vec![Found::Absent; paths.len()],
            key_node: paths.key_node(),
            skip_hint: 0,
            paths,
            reads,
            plan,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The heap this projector holds outside the arena (its slots), for
    /// `pollbox_accounted_bytes{part="buffers"}`. It does not grow with the
    /// body: the scanner works in place.
    pub fn working_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Found>()
    }

    /// Scan `body` and read every message in it into `arena`.
    ///
    /// `Err` refuses the whole body (nothing may be applied); `Ok` holds one
    /// item per message, each accepted or rejected on its own.
    ///
    /// The batch borrows the arena, so the epoch cannot be reset while it
    /// lives:
    ///
    /// ```
    /// # use pollbox_table::{arena::Arena, plan::{Plan, Value}, projection::*};
    /// # use std::sync::Arc;
    /// let mut arena = Arena::new(64 * 1024, 1 << 20);
    /// let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    /// let body = br#"{"key":"box-42","value":5,"player":"p-7","cargo":[1,2]}"#;
    /// let batch = projector
    ///     .project(arena.bump(), body, BodyFormat::Json, KeySource::Body)
    ///     .unwrap();
    /// let message = batch.items[0].unwrap();
    /// assert_eq!(message.key, "box-42");
    /// assert_eq!(message.values[0], Some(Value::I64(5)));
    /// drop(batch);
    /// arena.reset();
    /// ```
    ///
    /// ```compile_fail
    /// # use pollbox_table::{arena::Arena, plan::Plan, projection::*};
    /// # use std::sync::Arc;
    /// let mut arena = Arena::new(64 * 1024, 1 << 20);
    /// let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    /// let batch = projector
    ///     .project(arena.bump(), b"{}", BodyFormat::Json, KeySource::Body)
    ///     .unwrap();
    /// arena.reset(); // refused: `batch` still borrows the arena
    /// drop(batch);
    /// ```
    pub fn project<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        format: BodyFormat,
        keys: KeySource,
    ) -> Result<Batch<'a>, BodyError> {
        match (format, keys) {
            (BodyFormat::Ndjson, KeySource::Body) => self.project_ndjson(arena, body),
            _ => self.project_document(arena, body, keys),
        }
    }

    fn project_document<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        keys: KeySource,
    ) -> Result<Batch<'a>, BodyError> {
        let invalid = |f| error::invalid_json(f, 0);
        if body.is_empty() {
            return Err(BodyError::InvalidJson {
                at: 0,
                what: "empty body",
            });
        }
        let mut sc = Scanner::new(body);
        sc.hint = self.skip_hint;
        let mut items = BumpVec::new_in(arena);
        let shape = match sc.skip_ws() {
            None => {
                return Err(BodyError::InvalidJson {
                    at: body.len(),
                    what: "no JSON value",
                })
            }
            Some(b'{') => {
                reserve(&mut items, 1)?;
                items.push(self.message(arena, &mut sc, keys, 0)?);
                Shape::Object
            }
            Some(b'[') if keys == KeySource::Body => {
                if sc.array_start().map_err(invalid)? {
                    loop {
                        let item = if sc.skip_ws() == Some(b'{') {
                            self.message(arena, &mut sc, keys, 0)?
                        } else {
                            sc.value().map_err(invalid)?;
                            Err(MessageError::NotAnObject)
                        };
                        reserve(&mut items, 1)?;
                        items.push(item);
                        if !sc.next_element().map_err(invalid)? {
                            break;
                        }
                    }
                }
                Shape::Array
            }
            Some(_) => {
                // Valid JSON of the wrong shape is 400 too, but invalid JSON
                // is reported as such.
                sc.value().map_err(invalid)?;
                sc.finish().map_err(invalid)?;
                return Err(BodyError::NotObjectOrArray);
            }
        };
        sc.finish().map_err(invalid)?;
        self.skip_hint = sc.hint;
        Ok(Batch { shape, items })
    }

    fn project_ndjson<'a>(&mut self, arena: &'a Bump, body: &[u8]) -> Result<Batch<'a>, BodyError> {
        let mut items = BumpVec::new_in(arena);
        // An upper bound on the number of messages, so the batch never moves.
        reserve(&mut items, count_lf(body) + 1)?;
        let mut start = 0;
        while start < body.len() {
            let end = find_lf(&body[start..]).map_or(body.len(), |n| start + n);
            let line = &body[start..end];
            let mut sc = Scanner::new(line);
            sc.hint = self.skip_hint;
            let invalid = |f| error::invalid_json(f, start);
            match sc.skip_ws() {
                None => {}
                Some(b'{') => {
                    let item = self.message(arena, &mut sc, KeySource::Body, start)?;
                    sc.finish().map_err(invalid)?;
                    reserve(&mut items, 1)?;
                    items.push(item);
                }
                Some(_) => {
                    sc.value().map_err(invalid)?;
                    sc.finish().map_err(invalid)?;
                    reserve(&mut items, 1)?;
                    items.push(Err(MessageError::NotAnObject));
                }
            }
            self.skip_hint = sc.hint;
            start = end + 1;
        }
        if items.is_empty() {
            return Err(BodyError::InvalidJson {
                at: body.len(),
                what: "no JSON value",
            });
        }
        Ok(Batch {
            shape: Shape::Ndjson,
            items,
        })
    }

    /// Scan the message object at the scanner's `{` (its document starting at
    /// byte `base` of the body) and read it. The outer `Err` refuses the whole
    /// body (invalid JSON, or the arena is full); the inner one rejects only
    /// this message.
    fn message<'a>(
        &mut self,
        arena: &'a Bump,
        sc: &mut Scanner<'_>,
        keys: KeySource,
        base: usize,
    ) -> Result<Result<Message<'a>, MessageError>, BodyError> {
        self.slots.fill(Found::Absent);
        let start = sc.pos;
        self.paths
            .find(sc, &mut self.slots)
            .map_err(|f| error::invalid_json(f, base))?;
        match self.read(arena, sc.buf(), keys) {
            Ok(mut m) => {
                m.span = ((base + start) as u32, (base + sc.pos) as u32);
                Ok(Ok(m))
            }
            Err(Reject::Message(e)) => Ok(Err(e)),
            Err(Reject::Body(e)) => Err(e),
        }
    }

    /// Type-check and decode what the scan found, key first, then the fields
    /// in plan order.
    fn read<'a>(
        &self,
        arena: &'a Bump,
        doc: &[u8],
        keys: KeySource,
    ) -> Result<Message<'a>, Reject> {
        let key = match keys {
            KeySource::Path => "",
            KeySource::Body => self.read_key(arena, doc)?,
        };
        let values = arena
            .try_alloc_slice_fill_copy(self.plan.fields.len(), None)
            .map_err(|_| Reject::Body(BodyError::ArenaFull))?;
        for read in &self.reads {
            let value = match read.same_as.and_then(|i| values.get(i)) {
                Some(&earlier) => earlier,
                None => {
                    let Some(&found) = self.slots.get(read.node) else {
                        continue;
                    };
                    read_field(arena, doc, found, read)?
                }
            };
            if let Some(slot) = values.get_mut(read.index) {
                *slot = value;
            }
        }
        Ok(Message {
            key,
            values,
            span: (0, 0),
        })
    }

    fn read_key<'a>(&self, arena: &'a Bump, doc: &[u8]) -> Result<&'a str, Reject> {
        match self.slots[self.key_node] {
            Found::Absent => Err(MessageError::MissingKey.into()),
            Found::Str {
                start,
                end,
                escaped,
            } => {
                let raw = &doc[start..end];
                if !escaped && raw.len() > self.plan.max_key_bytes {
                    return Err(MessageError::KeyTooLong.into());
                }
                let key = arena_str(arena, raw, escaped)?;
                if key.is_empty() {
                    Err(MessageError::EmptyKey.into())
                } else if key.len() > self.plan.max_key_bytes {
                    Err(MessageError::KeyTooLong.into())
                } else if crate::plan::reserved_key(key.as_bytes()) {
                    Err(MessageError::ReservedKey.into())
                } else {
                    Ok(key)
                }
            }
            _ => Err(MessageError::KeyNotString.into()),
        }
    }
}

/// Type-check one found value against its field and decode it. `Ok(None)`
/// for absent and `null`.
#[inline]
fn read_field<'a>(
    arena: &'a Bump,
    doc: &[u8],
    found: Found,
    field: &FieldRead,
) -> Result<Option<Value<'a>>, Reject> {
    let id = field.id;
    let wrong = || Reject::Message(MessageError::WrongType { field: id });
    let value = match (field.ty, found) {
        (_, Found::Absent | Found::Null) => return Ok(None),
        (FieldType::I64, Found::Num { start, end, int }) => {
            let n = int
                .then(|| parse_int(&doc[start..end]))
                .flatten()
                .ok_or_else(wrong)?;
            Value::I64(n)
        }
        (FieldType::F64, Found::Num { start, end, int }) => {
            let text = &doc[start..end];
            match int.then(|| parse_int(text)).flatten() {
                Some(n) => Value::F64(n as f64),
                None => Value::F64(scan::parse_f64(text)),
            }
        }
        (FieldType::Bool, Found::Bool(b)) => Value::Bool(b),
        (
            FieldType::Str,
            Found::Str {
                start,
                end,
                escaped,
            },
        ) => {
            let raw = &doc[start..end];
            // Unescaping never lengthens a string.
            if !escaped && raw.len() > field.max_len {
                return Err(MessageError::StringTooLong { field: id }.into());
            }
            let s = arena_str(arena, raw, escaped)?;
            if s.len() > field.max_len {
                return Err(MessageError::StringTooLong { field: id }.into());
            }
            Value::Str(s)
        }
        _ => return Err(wrong()),
    };
    Ok(Some(value))
}

/// The validated string contents `raw`, unescaped into the arena.
///
/// Inlined for its common case, a short plain ASCII string (keys, most
/// `str` values): a copy and no call but the copy's.
#[inline(always)]
fn arena_str<'a>(arena: &'a Bump, raw: &[u8], escaped: bool) -> Result<&'a str, Reject> {
    if !escaped && raw.len() <= 16 && ascii(raw) {
        let copy: &'a [u8] = arena
            .try_alloc_slice_copy(raw)
            .map_err(|_| Reject::Body(BodyError::ArenaFull))?;
        // SAFETY: `copy` holds the bytes of `raw`, which are all ASCII
        // (just checked), and every ASCII byte sequence is valid UTF-8.
        // Covered by `short_strings_take_the_ascii_path` and every
        // projection test with a string key or field.
        return Ok(unsafe { std::str::from_utf8_unchecked(copy) });
    }
    arena_str_rest(arena, raw, escaped)
}

/// [`arena_str`] for escaped, long or non-ASCII strings.
#[inline(never)]
fn arena_str_rest<'a>(arena: &'a Bump, raw: &[u8], escaped: bool) -> Result<&'a str, Reject> {
    let full = || Reject::Body(BodyError::ArenaFull);
    let copy: &'a [u8] = if escaped {
        let out = arena
            .try_alloc_slice_fill_copy(raw.len(), 0u8)
            .map_err(|_| full())?;
        let n = scan::unescape_into(raw, out);
        &out[..n]
    } else {
        arena.try_alloc_slice_copy(raw).map_err(|_| full())?
    };
    // Keys and short strings are ASCII most of the time, which is checked in
    // a few instructions where `from_utf8` costs ~80 per call.
    if ascii(copy) {
        // SAFETY: every ASCII byte sequence is valid UTF-8 (`is_ascii` was
        // just checked on these very bytes). Covered by every projection
        // test with a string key or field, and by the `projection` and
        // `projection_diff` fuzz targets.
        return Ok(unsafe { std::str::from_utf8_unchecked(copy) });
    }
    // The scanner checked the UTF-8 (and unescaping writes whole characters),
    // so this cannot fail; it is checked rather than assumed.
    std::str::from_utf8(copy).map_err(|e| {
        Reject::Body(BodyError::InvalidJson {
            at: e.valid_up_to(),
            what: "invalid UTF-8",
        })
    })
}

/// [`scan::parse_i64`] of a validated integer's text (`-?[0-9]+`): up to
/// 18 digits, which cannot overflow, without its two overflow checks a digit.
#[inline(always)]
fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.len() > 18 {
        return scan::parse_i64(text);
    }
    // Wrapping only so that text that is not digits (never given) cannot
    // panic in a debug build.
    let n = digits.iter().fold(0i64, |n, &d| {
        n.wrapping_mul(10)
            .wrapping_add(i64::from(d.wrapping_sub(b'0')))
    });
    Some(if negative { n.wrapping_neg() } else { n })
}

/// `b.is_ascii()`, with up to 16 bytes in two overlapping word loads where
/// `is_ascii` goes byte by byte under 8 bytes (and through a loop above).
#[inline(always)]
fn ascii(b: &[u8]) -> bool {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let n = b.len();
    if n > 16 {
        return b.is_ascii();
    }
    let word = |c: Option<&[u8; 8]>| c.map_or(HIGH, |c| u64::from_le_bytes(*c));
    let half = |c: Option<&[u8; 4]>| c.map_or(HIGH, |c| u64::from(u32::from_le_bytes(*c)));
    let any = match n {
        8.. => word(b.first_chunk()) | word(b.last_chunk()),
        4.. => half(b.first_chunk()) | half(b.last_chunk()),
        _ => b.iter().fold(0, |a, &x| a | u64::from(x)),
    };
    any & HIGH == 0
}

fn reserve<T>(items: &mut BumpVec<'_, T>, additional: usize) -> Result<(), BodyError> {
    items
        .try_reserve(additional)
        .map_err(|_| BodyError::ArenaFull)
}
