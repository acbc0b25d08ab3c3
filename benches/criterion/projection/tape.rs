//! The projection before the scanner, copied here so the benchmark can
//! still measure it: the body copied into the arena with simd-json's padding,
//! `fill_tape_padded` building the tape of the whole message, and the tape
//! walked for the configured paths. Not used by the server.
#![allow(dead_code)]

use bumpalo::collections::Vec as BumpVec;
use bumpalo::Bump;
use paths::{PathTree, ABSENT};
use pollbox_core::config::FieldType;
use pollbox_core::plan::{FieldPlan, MessageError, Plan, Value};
use pollbox_core::projection::{Batch, BodyError, BodyFormat, KeySource, Message, Shape};
use simd_json::{Buffers, Node, StaticNode, Tape, INPUT_PADDING};
use std::sync::Arc;

fn find_lf(s: &[u8]) -> Option<usize> {
    s.iter().position(|&b| b == b'\n')
}

/// The error path is not measured: a plain mapping stands in for the
/// projector's offset search.
fn invalid_json(e: &simd_json::Error, _doc: &[u8], base: usize) -> BodyError {
    BodyError::InvalidJson {
        at: base + e.index(),
        what: "invalid json",
    }
}

/// Documents longer than this make the projector give back simd-json's working
/// memory after the request, so one large body does not pin megabytes per
/// worker. Bodies up to it reuse the memory and allocate nothing.
pub const DEFAULT_RETAIN_DOCUMENT_BYTES: usize = 256 * 1024;

/// The projector as it was before the scanner (simd-json 0.19's tape), kept to
/// be measured beside the scanner. Parses bodies for one worker. Keeps simd-json's buffers and tape between
/// requests; everything a [`Batch`] borrows is in the caller's arena.
pub struct TapeProjector {
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

impl TapeProjector {
    pub fn new(plan: Arc<Plan>) -> TapeProjector {
        let paths = PathTree::new(&plan);
        let field_ids = (0..plan.fields.len())
            .map(|i| u16::try_from(i).unwrap_or(u16::MAX))
            .collect();
        TapeProjector {
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
    pub fn with_retain_limit(mut self, bytes: usize) -> TapeProjector {
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
            .map_err(|e| invalid_json(&e, doc, base))
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
        Ok(Ok(Message {
            key,
            values,
            span: (0, 0),
        }))
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

mod paths {
    use pollbox_core::plan::Plan;
    use simd_json::Node;

    /// No member found for this tree node in the current message.
    pub(crate) const ABSENT: usize = usize::MAX;

    /// Index of the tree node standing for the message object itself.
    const ROOT: usize = 0;

    /// One member name on the way to a configured field (or the key member).
    #[derive(Debug)]
    struct PathNode {
        /// Unescaped member name, compared with the unescaped names on the tape.
        name: Box<str>,
        /// Tree nodes for members of this member's value, when it is an object.
        children: Vec<usize>,
    }

    /// Every configured pointer, sharing prefixes: `/value` read by two fields is
    /// looked up once, `/a/b` and `/a/c` walk `a` once.
    #[derive(Debug)]
    pub(crate) struct PathTree {
        nodes: Vec<PathNode>,
        /// The node of the key member (`plan.key_field`, a top-level member).
        key: usize,
        /// For each plan field, the node its pointer ends at; `None` for `count`.
        fields: Vec<Option<usize>>,
    }

    impl PathTree {
        pub(crate) fn new(plan: &Plan) -> PathTree {
            let mut tree = PathTree {
                nodes: vec![PathNode {
                    name: "".into(),
                    children: Vec::new(),
                }],
                key: ROOT,
                fields: Vec::with_capacity(plan.fields.len()),
            };
            tree.key = tree.child(ROOT, &plan.key_field);
            for f in &plan.fields {
                if f.path.is_empty() {
                    tree.fields.push(None);
                    continue;
                }
                let mut at = ROOT;
                for token in &f.path {
                    at = tree.child(at, token);
                }
                tree.fields.push(Some(at));
            }
            tree
        }

        fn child(&mut self, parent: usize, name: &str) -> usize {
            if let Some(&c) = self.nodes[parent]
                .children
                .iter()
                .find(|&&c| &*self.nodes[c].name == name)
            {
                return c;
            }
            self.nodes.push(PathNode {
                name: name.into(),
                children: Vec::new(),
            });
            let c = self.nodes.len() - 1;
            self.nodes[parent].children.push(c);
            c
        }

        /// How many slots [`PathTree::find`] needs.
        pub(crate) fn len(&self) -> usize {
            self.nodes.len()
        }

        pub(crate) fn key_node(&self) -> usize {
            self.key
        }

        /// The tree node of plan field `i` (`None` for `count` fields).
        pub(crate) fn field_node(&self, i: usize) -> Option<usize> {
            self.fields.get(i).copied().flatten()
        }

        /// Record in `slots[node]` the tape index of the value of every configured
        /// member present in the object at `tape[object]`; other slots are left
        /// [`ABSENT`]. `slots` must be all `ABSENT` on entry.
        ///
        /// Members not in the tree are stepped over by their node count, so cargo
        /// costs one comparison per member name whatever its size or depth. A
        /// member that appears twice is recorded twice, the last one winning, and
        /// nested members are looked up only in the winning value.
        pub(crate) fn find(&self, tape: &[Node<'_>], object: usize, slots: &mut [usize]) {
            self.find_in(tape, object, ROOT, slots);
        }

        fn find_in(&self, tape: &[Node<'_>], object: usize, node: usize, slots: &mut [usize]) {
            let children = &self.nodes[node].children;
            let Some(&Node::Object { len, .. }) = tape.get(object) else {
                return;
            };
            let mut i = object + 1;
            for _ in 0..len {
                // The tape always holds a member name, then its value.
                let Some(&Node::String(name)) = tape.get(i) else {
                    return;
                };
                let value = i + 1;
                if let Some(&c) = children.iter().find(|&&c| *self.nodes[c].name == *name) {
                    slots[c] = value;
                }
                i = value + tape.get(value).map_or(1, span);
            }
            // Descend only after the whole object is read, so a duplicate member's
            // last value is the one searched.
            for &c in children {
                if slots[c] != ABSENT && !self.nodes[c].children.is_empty() {
                    self.find_in(tape, slots[c], c, slots);
                }
            }
        }
    }

    /// Tape nodes taken by the value starting with `node` (itself included).
    #[inline]
    pub(crate) fn span(node: &Node<'_>) -> usize {
        match *node {
            Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
            _ => 1,
        }
    }
}
