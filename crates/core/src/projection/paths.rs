//! The configured JSON pointers merged into one tree, and the tape walk that
//! finds them in a message while stepping over everything else.

use crate::plan::Plan;
use simd_json::Node;

/// No member found for this tree node in the current message.
pub(super) const ABSENT: usize = usize::MAX;

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
pub(super) struct PathTree {
    nodes: Vec<PathNode>,
    /// The node of the key member (`plan.key_field`, a top-level member).
    key: usize,
    /// For each plan field, the node its pointer ends at; `None` for `count`.
    fields: Vec<Option<usize>>,
}

impl PathTree {
    pub(super) fn new(plan: &Plan) -> PathTree {
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
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(super) fn key_node(&self) -> usize {
        self.key
    }

    /// The tree node of plan field `i` (`None` for `count` fields).
    pub(super) fn field_node(&self, i: usize) -> Option<usize> {
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
    pub(super) fn find(&self, tape: &[Node<'_>], object: usize, slots: &mut [usize]) {
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
pub(super) fn span(node: &Node<'_>) -> usize {
    match *node {
        Node::Object { count, .. } | Node::Array { count, .. } => count + 1,
        _ => 1,
    }
}
