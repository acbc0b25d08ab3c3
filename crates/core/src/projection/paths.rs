//! The configured JSON pointers merged into one tree, and the walk that finds
//! them in a message while the scanner validates and steps over everything
//! else.

use super::scan::{unescaped_eq, Fail, Found, Heads, Scanner};
use crate::plan::Plan;

/// Index of the tree node standing for the message object itself.
const ROOT: usize = 0;

/// One member name on the way to a configured field (or the key member).
#[derive(Debug)]
struct PathNode {
    /// Unescaped member name, compared with the (unescaped) names in the body.
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

    /// With the scanner at a message object's `{`: scan the whole object,
    /// validating it, and record in `slots[node]` what each configured member
    /// holds; other slots stay [`Found::Absent`]. `slots` must be all
    /// `Absent` on entry.
    ///
    /// Members not in the tree are validated and stepped over. A member that
    /// appears twice is recorded twice, the last one winning: what an earlier
    /// one recorded below it is cleared first, so nested members are found
    /// only in the winning value.
    pub(super) fn find(
        &self,
        scanner: &mut Scanner<'_>,
        slots: &mut [Found],
        heads: &mut Heads,
    ) -> Result<(), Fail> {
        self.find_in(scanner, ROOT, slots, heads)
    }

    fn find_in(
        &self,
        sc: &mut Scanner<'_>,
        node: usize,
        slots: &mut [Found],
        heads: &mut Heads,
    ) -> Result<(), Fail> {
        let children = &self.nodes[node].children;
        if !sc.object_start()? {
            return Ok(());
        }
        let buf = sc.buf();
        loop {
            let (start, end, escaped) = sc.member_name()?;
            let name = &buf[start..end];
            let hit = if escaped {
                children
                    .iter()
                    .find(|&&c| unescaped_eq(name, self.nodes[c].name.as_bytes()))
            } else {
                children
                    .iter()
                    .find(|&&c| self.nodes[c].name.as_bytes() == name)
            };
            match hit {
                Some(&c) => {
                    if slots[c] != Found::Absent {
                        self.clear_below(c, slots);
                    }
                    slots[c] = if !self.nodes[c].children.is_empty() && sc.skip_ws() == Some(b'{') {
                        self.find_in(sc, c, slots, heads)?;
                        Found::Object
                    } else {
                        sc.value(heads)?
                    };
                }
                None => sc.skip(heads)?,
            }
            if !sc.next_member()? {
                return Ok(());
            }
        }
    }

    /// Forget what an earlier duplicate of member `node` recorded below it.
    #[cold]
    fn clear_below(&self, node: usize, slots: &mut [Found]) {
        for &c in &self.nodes[node].children {
            slots[c] = Found::Absent;
            self.clear_below(c, slots);
        }
    }
}
