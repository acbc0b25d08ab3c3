//! The configured JSON pointers merged into one tree, and the walk that finds
//! them in a message while the scanner validates and steps over everything
//! else.

use super::scan::{unescaped_eq, Fail, Found, Scanner};
use crate::bytes::short_le;
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
    /// The same children as [`Child`]ren, for the walk (filled in once the
    /// tree is built).
    kids: Vec<Child>,
}

/// A child node as the walk compares it with a member name: its name's
/// length and first (up to) 8 bytes as one word, so a plain name of at most
/// 8 bytes is matched with two compares and no call.
#[derive(Debug, Clone, Copy)]
struct Child {
    len: usize,
    /// [`head_word`] of the name.
    head: u64,
    node: usize,
    /// Whether the node has children (its value is walked when an object).
    inner: bool,
}

/// The first `min(8, b.len())` bytes of `b` as a little-endian word, the
/// rest zero (under 8 bytes, [`short_le`]).
#[inline(always)]
fn head_word(b: &[u8]) -> u64 {
    match b.first_chunk::<8>() {
        Some(c) => u64::from_le_bytes(*c),
        None => short_le(b),
    }
}

impl Child {
    /// Whether the plain (unescaped) member name `name`, whose
    /// [`head_word`] is `head`, is this child's name.
    #[inline(always)]
    fn is(&self, name: &[u8], head: u64, full: &str) -> bool {
        self.len == name.len()
            && self.head == head
            && (name.len() <= 8 || name.get(8..) == full.as_bytes().get(8..))
    }
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
                kids: Vec::new(),
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
        for n in 0..tree.nodes.len() {
            let kids = tree.nodes[n]
                .children
                .iter()
                .map(|&c| {
                    let name = tree.nodes[c].name.as_bytes();
                    Child {
                        len: name.len(),
                        head: head_word(name),
                        node: c,
                        inner: !tree.nodes[c].children.is_empty(),
                    }
                })
                .collect();
            tree.nodes[n].kids = kids;
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
            kids: Vec::new(),
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
    pub(super) fn find(&self, scanner: &mut Scanner<'_>, slots: &mut [Found]) -> Result<(), Fail> {
        self.find_in(scanner, ROOT, slots)
    }

    fn find_in(&self, sc: &mut Scanner<'_>, node: usize, slots: &mut [Found]) -> Result<(), Fail> {
        let kids = &self.nodes[node].kids;
        if !sc.object_start()? {
            return Ok(());
        }
        let buf = sc.buf();
        loop {
            let (start, end, escaped) = sc.member_name()?;
            let name = &buf[start..end];
            let hit = if escaped {
                kids.iter()
                    .find(|k| unescaped_eq(name, self.nodes[k.node].name.as_bytes()))
            } else {
                let head = head_word(name);
                kids.iter()
                    .find(|k| k.is(name, head, &self.nodes[k.node].name))
            };
            match hit {
                Some(k) => {
                    let c = k.node;
                    if slots[c] != Found::Absent {
                        self.clear_below(c, slots);
                    }
                    // A string is scanned here (`Scanner::value` would do
                    // the same, through a call and a `Result` in memory);
                    // anything else goes to `value`, which also reports the
                    // end of input.
                    slots[c] = match sc.skip_ws() {
                        Some(b'"') => {
                            let (start, end, escaped) = sc.string()?;
                            Found::Str {
                                start,
                                end,
                                escaped,
                            }
                        }
                        Some(b'{') if k.inner => {
                            self.find_in(sc, c, slots)?;
                            Found::Object
                        }
                        _ => sc.value()?,
                    };
                }
                None => sc.skip()?,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_words_are_the_first_bytes_in_order() {
        let bytes: Vec<u8> = (0..12u8)
            .map(|i| 0x81u8.wrapping_add(i.wrapping_mul(37)))
            .collect();
        for n in 0..=bytes.len() {
            let b = &bytes[..n];
            let want = b
                .iter()
                .take(8)
                .rev()
                .fold(0u64, |w, &x| w << 8 | u64::from(x));
            assert_eq!(head_word(b), want, "{n}");
        }
    }

    #[test]
    fn children_match_exactly_their_names() {
        let names = [
            "k",
            "ke",
            "key",
            "keys",
            "value",
            "player",
            "abcdefg",
            "abcdefgh",
            "abcdefgh1",
            "abcdefgh2",
            "abcdefghij",
        ];
        for name in names {
            let child = Child {
                len: name.len(),
                head: head_word(name.as_bytes()),
                node: 1,
                inner: false,
            };
            let is = |other: &[u8]| child.is(other, head_word(other), name);
            assert!(is(name.as_bytes()), "{name}");
            for other in names.iter().filter(|&&o| o != name) {
                assert!(!is(other.as_bytes()), "{name} is not {other}");
            }
            // One byte off anywhere, one byte more or less.
            for i in 0..name.len() {
                let mut off = name.as_bytes().to_vec();
                off[i] ^= 1;
                assert!(!is(&off), "{name} at {i}");
            }
            assert!(!is(&name.as_bytes()[..name.len() - 1]), "{name} shorter");
            assert!(!is(format!("{name}x").as_bytes()), "{name} longer");
        }
    }
}
