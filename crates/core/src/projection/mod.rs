//! The projection (SPEC §3, §4): an ingest body parsed with simd-json inside
//! the worker's arena, and from each message only the key and the configured
//! fields read; every other member is cargo, stepped over on the tape and never
//! materialised.
//!
//! What it owns: the [`Projector`], one per worker, holding simd-json's working
//! memory ([`simd_json::Buffers`] and the [`simd_json::Tape`]), which cannot
//! live in a bump arena, so it is kept and reused from request to request; and
//! the rules that turn a body into a [`Batch`] of messages or a [`BodyError`].
//!
//! How a body goes through:
//! 1. It is copied into the arena with [`simd_json::INPUT_PADDING`] bytes
//!    after it (a failed arena allocation is [`BodyError::ArenaFull`], never a
//!    panic), and parsed there in place with `fill_tape_padded`: strings are
//!    unescaped inside the arena copy, so every extracted `&str` borrows from
//!    the arena and lives exactly as long as the epoch.
//! 2. The tape is walked: for each message object, member names are compared
//!    with the configured pointers (merged in a small tree, see `paths`);
//!    other values are skipped by their tape node count. No DOM is built.
//! 3. Each found value is type-checked against the plan.
//!
//! Steady state (a warm arena and a warm projector) allocates nothing outside
//! the arena: `tests/alloc_projection.rs` counts.
//!
//! Decisions where the SPEC is silent:
//! - JSON `null` is treated as absent: the field is left unchanged. A key of
//!   `null` is "key is not a string".
//! - JSON pointer tokens name object members only: a pointer through an array,
//!   or through a scalar, finds nothing (absent), it is not an error.
//! - A member that appears twice in one object: the last one wins, for
//!   intermediate objects too (`{"a":{"b":1},"a":{}}` has no `/a/b`).
//! - `i64` accepts JSON integers within the i64 range; a number written with a
//!   fraction or exponent (`5.0`, `1e3`) or an integer past i64 is the wrong
//!   type. `f64` accepts any number. simd-json itself refuses integers past
//!   u64 (`18446744073709551616`) and numbers past f64 (`1e400`) as invalid
//!   numbers, so such a body is 400 (serde_json refuses `1e400` too).
//! - `str` limits (`max_len`) count bytes of the unescaped UTF-8 string.
//! - The first problem in a message is reported: the key first, then fields in
//!   plan order.
//! - A body with no JSON value in it (empty, whitespace only, only blank NDJSON
//!   lines) is invalid JSON.
//! - With [`KeySource::Path`] the body is always one JSON document holding one
//!   object, whatever its format; the body's key member is not read.
//! - NDJSON lines are split on `\n`; a `\r` before it is whitespace. Lines are
//!   parsed one by one, so simd-json's working memory is sized by the longest
//!   line, not the whole body.

mod error;
mod paths;
mod scan;

#[cfg(test)]
mod tests;

pub use error::BodyError;
pub use scan::{validate, MAX_DEPTH};

use crate::bytes::find_lf;
use crate::config::FieldType;
use crate::plan::{FieldPlan, MessageError, Plan, Value};
use bumpalo::collections::Vec as BumpVec;
use bumpalo::Bump;
use paths::{PathTree, ABSENT};
use simd_json::{Buffers, Node, StaticNode, Tape, INPUT_PADDING};
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
}

/// Every message of a body, in body order; rejected messages keep their place
/// so batch errors can name their index.
#[derive(Debug)]
pub struct Batch<'a> {
    pub shape: Shape,
    pub items: BumpVec<'a, Result<Message<'a>, MessageError>>,
}

/// Documents longer than this make the projector give back simd-json's working
/// memory after the request, so one large body does not pin megabytes per
/// worker. Bodies up to it reuse the memory and allocate nothing.
pub const DEFAULT_RETAIN_DOCUMENT_BYTES: usize = 256 * 1024;

/// Parses bodies for one worker. Keeps simd-json's buffers and tape between
/// requests; everything a [`Batch`] borrows is in the caller's arena.
pub struct Projector {
    plan: Arc<Plan>,
    paths: PathTree,
    /// Per path-tree node: tape index of its value in the current message, or
    /// `ABSENT`.
    slots: Vec<usize>,
    /// Each plan field's index as carried by `MessageError`.
    field_ids: Vec<u16>,
    buffers: Buffers,
    /// Always empty between calls, so its `'static` lifetime borrows nothing.
    tape: Tape<'static>,
    retain_document_bytes: usize,
    /// Longest document parsed since the buffers were last given back.
    longest_document: usize,
}

impl Projector {
    pub fn new(plan: Arc<Plan>) -> Projector {
        let paths = PathTree::new(&plan);
        let field_ids = (0..plan.fields.len())
            .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
            .collect();
        Projector {
            slots: vec![ABSENT; paths.len()],
            paths,
            field_ids,
            plan,
            // The padded parse never uses the input copy `Buffers::new(n)`
            // sizes; the rest grows on first use.
            buffers: Buffers::new(0),
            tape: Tape(Vec::new()),
            retain_document_bytes: DEFAULT_RETAIN_DOCUMENT_BYTES,
            longest_document: 0,
        }
    }

    /// Give back simd-json's working memory after any document longer than
    /// `bytes` (default [`DEFAULT_RETAIN_DOCUMENT_BYTES`]).
    pub fn with_retain_limit(mut self, bytes: usize) -> Projector {
        self.retain_document_bytes = bytes;
        self
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// An estimate of the heap this projector holds outside the arena (tape
    /// plus simd-json's string and index buffers), for
    /// `pollbox_accounted_bytes{part="buffers"}`. simd-json does not expose its
    /// buffers' capacities, so those are estimated from the longest document.
    pub fn working_bytes(&self) -> usize {
        self.tape.0.capacity() * std::mem::size_of::<Node<'static>>()
            + self.longest_document * 2
            + self.slots.capacity() * std::mem::size_of::<usize>()
    }

    /// Parse `body` into `arena` and read every message in it.
    ///
    /// `Err` refuses the whole body (nothing may be applied); `Ok` holds one
    /// item per message, each accepted or rejected on its own.
    ///
    /// The batch borrows the arena, so the epoch cannot be reset while it
    /// lives:
    ///
    /// ```
    /// # use pollbox_core::{epoch::Epoch, plan::{Plan, Value}, projection::*};
    /// # use std::sync::Arc;
    /// let mut epoch = Epoch::new(64 * 1024, 1 << 20);
    /// let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    /// let body = br#"{"key":"box-42","value":5,"player":"p-7","cargo":[1,2]}"#;
    /// let batch = projector
    ///     .project(epoch.arena(), body, BodyFormat::Json, KeySource::Body)
    ///     .unwrap();
    /// let message = batch.items[0].unwrap();
    /// assert_eq!(message.key, "box-42");
    /// assert_eq!(message.values[0], Some(Value::I64(5)));
    /// drop(batch);
    /// epoch.reset();
    /// ```
    ///
    /// ```compile_fail
    /// # use pollbox_core::{epoch::Epoch, plan::Plan, projection::*};
    /// # use std::sync::Arc;
    /// let mut epoch = Epoch::new(64 * 1024, 1 << 20);
    /// let mut projector = Projector::new(Arc::new(Plan::default_plan()));
    /// let batch = projector
    ///     .project(epoch.arena(), b"{}", BodyFormat::Json, KeySource::Body)
    ///     .unwrap();
    /// epoch.reset(); // refused: `batch` still borrows the arena
    /// drop(batch);
    /// ```
    pub fn project<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        format: BodyFormat,
        keys: KeySource,
    ) -> Result<Batch<'a>, BodyError> {
        // The kept tape is empty; give it the arena's lifetime for this call.
        let mut tape: Tape<'a> = std::mem::replace(&mut self.tape, Tape(Vec::new())).reset();
        let result = match (format, keys) {
            (BodyFormat::Ndjson, KeySource::Body) => self.project_ndjson(arena, body, &mut tape),
            _ => self.project_document(arena, body, keys, &mut tape),
        };
        // Emptied again before it is kept, so it holds no arena borrow.
        self.tape = tape.reset();
        if self.longest_document > self.retain_document_bytes {
            self.give_back_working_memory();
        }
        result
    }

    #[cold]
    fn give_back_working_memory(&mut self) {
        self.buffers = Buffers::new(0);
        self.tape = Tape(Vec::new());
        self.longest_document = 0;
    }

    /// Copy `doc` into the arena and parse it onto `tape`.
    fn parse<'a>(
        &mut self,
        arena: &'a Bump,
        doc: &[u8],
        base: usize,
        tape: &mut Tape<'a>,
    ) -> Result<(), BodyError> {
        let copy = copy_padded(arena, doc)?;
        self.longest_document = self.longest_document.max(doc.len());
        simd_json::fill_tape_padded(copy, doc.len(), &mut self.buffers, tape)
            .map_err(|e| error::invalid_json(&e, doc, base))
    }

    fn project_document<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        keys: KeySource,
        tape: &mut Tape<'a>,
    ) -> Result<Batch<'a>, BodyError> {
        if body.is_empty() {
            return Err(BodyError::InvalidJson {
                at: 0,
                what: "empty body",
            });
        }
        self.parse(arena, body, 0, tape)?;
        let nodes = tape.0.as_slice();
        let mut items = BumpVec::new_in(arena);
        match nodes.first() {
            Some(Node::Object { .. }) => {
                reserve(&mut items, 1)?;
                items.push(self.message(arena, nodes, 0, keys)?);
                Ok(Batch {
                    shape: Shape::Object,
                    items,
                })
            }
            Some(&Node::Array { len, .. }) if keys == KeySource::Body => {
                reserve(&mut items, len)?;
                let mut at = 1;
                for _ in 0..len {
                    let Some(node) = nodes.get(at) else { break };
                    let item = match node {
                        Node::Object { .. } => self.message(arena, nodes, at, keys)?,
                        _ => Err(MessageError::NotAnObject),
                    };
                    items.push(item);
                    at += paths::span(node);
                }
                Ok(Batch {
                    shape: Shape::Array,
                    items,
                })
            }
            _ => Err(BodyError::NotObjectOrArray),
        }
    }

    fn project_ndjson<'a>(
        &mut self,
        arena: &'a Bump,
        body: &[u8],
        tape: &mut Tape<'a>,
    ) -> Result<Batch<'a>, BodyError> {
        let mut items = BumpVec::new_in(arena);
        // An upper bound on the number of messages, so the batch never moves.
        reserve(&mut items, count_newlines(body) + 1)?;
        let mut start = 0;
        while start < body.len() {
            let end = find_lf(&body[start..]).map_or(body.len(), |n| start + n);
            let line = &body[start..end];
            if !is_blank(line) {
                self.parse(arena, line, start, tape)?;
                let nodes = tape.0.as_slice();
                let item = match nodes.first() {
                    Some(Node::Object { .. }) => self.message(arena, nodes, 0, KeySource::Body)?,
                    _ => Err(MessageError::NotAnObject),
                };
                reserve(&mut items, 1)?;
                items.push(item);
            }
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

    /// Read one message from the object at `tape[object]`. The outer `Err` is
    /// an arena failure (the whole body is refused); the inner one rejects
    /// only this message.
    fn message<'a>(
        &mut self,
        arena: &'a Bump,
        tape: &[Node<'a>],
        object: usize,
        keys: KeySource,
    ) -> Result<Result<Message<'a>, MessageError>, BodyError> {
        self.slots.fill(ABSENT);
        self.paths.find(tape, object, &mut self.slots);
        let key = match keys {
            KeySource::Path => "",
            KeySource::Body => match self.check_key(tape) {
                Ok(key) => key,
                Err(e) => return Ok(Err(e)),
            },
        };
        let values = arena
            .try_alloc_slice_fill_copy(self.plan.fields.len(), None)
            .map_err(|_| BodyError::ArenaFull)?;
        for (i, (field, slot)) in self.plan.fields.iter().zip(values.iter_mut()).enumerate() {
            let Some(node) = self.paths.field_node(i) else {
                continue;
            };
            let Some(found) = self.slots.get(node).and_then(|&s| tape.get(s)) else {
                continue;
            };
            match read_field(found, field, self.field_ids[i]) {
                Ok(v) => *slot = v,
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(Message { key, values }))
    }

    fn check_key<'a>(&self, tape: &[Node<'a>]) -> Result<&'a str, MessageError> {
        let slot = self.slots[self.paths.key_node()];
        match tape.get(slot) {
            None => Err(MessageError::MissingKey),
            Some(&Node::String(key)) => {
                if key.is_empty() {
                    Err(MessageError::EmptyKey)
                } else if key.len() > self.plan.max_key_bytes {
                    Err(MessageError::KeyTooLong)
                } else {
                    Ok(key)
                }
            }
            Some(_) => Err(MessageError::KeyNotString),
        }
    }
}

/// Type-check one found value against its field. `Ok(None)` for `null`.
#[inline]
fn read_field<'a>(
    node: &Node<'a>,
    field: &FieldPlan,
    id: u16,
) -> Result<Option<Value<'a>>, MessageError> {
    let value = match (field.ty, *node) {
        (_, Node::Static(StaticNode::Null)) => return Ok(None),
        (FieldType::I64, Node::Static(StaticNode::I64(n))) => Value::I64(n),
        (FieldType::I64, Node::Static(StaticNode::U64(n))) => match i64::try_from(n) {
            Ok(n) => Value::I64(n),
            Err(_) => return Err(MessageError::WrongType { field: id }),
        },
        (FieldType::F64, Node::Static(StaticNode::I64(n))) => Value::F64(n as f64),
        (FieldType::F64, Node::Static(StaticNode::U64(n))) => Value::F64(n as f64),
        (FieldType::F64, Node::Static(StaticNode::F64(x))) => Value::F64(x),
        (FieldType::Bool, Node::Static(StaticNode::Bool(b))) => Value::Bool(b),
        (FieldType::Str, Node::String(s)) => {
            if s.len() > field.max_len {
                return Err(MessageError::StringTooLong { field: id });
            }
            Value::Str(s)
        }
        _ => return Err(MessageError::WrongType { field: id }),
    };
    Ok(Some(value))
}

fn reserve<T>(items: &mut BumpVec<'_, T>, additional: usize) -> Result<(), BodyError> {
    items
        .try_reserve(additional)
        .map_err(|_| BodyError::ArenaFull)
}

/// Copy `src` into the arena followed by `INPUT_PADDING` spaces, as
/// `fill_tape_padded` requires. (Filling first and copying over costs a
/// memset of the body; it keeps this module free of `unsafe`.)
fn copy_padded<'a>(arena: &'a Bump, src: &[u8]) -> Result<&'a mut [u8], BodyError> {
    let total = src
        .len()
        .checked_add(INPUT_PADDING)
        .ok_or(BodyError::ArenaFull)?;
    let copy = arena
        .try_alloc_slice_fill_copy(total, b' ')
        .map_err(|_| BodyError::ArenaFull)?;
    copy[..src.len()].copy_from_slice(src);
    Ok(copy)
}

/// JSON whitespace only (or nothing): a blank NDJSON line.
fn is_blank(line: &[u8]) -> bool {
    line.iter()
        .all(|&b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

fn count_newlines(body: &[u8]) -> usize {
    body.iter().filter(|&&b| b == b'\n').count()
}
