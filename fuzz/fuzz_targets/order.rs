//! Fuzz target `order`: the key order (sorted blocks of box ids whose keys
//! are read through a `KeySource`) driven by any bytes, against a
//! `BTreeSet` of the live keys.
//!
//! Each input is a list of operations, two or three bytes each: create a box
//! (one key, or a run of up to 1,020 keys, in order or reversed, so blocks
//! fill, split and hand ids to neighbors), remove one (it leaves a
//! tombstone), move one to another id (as a removal moves a table shard's
//! last box into the hole), or walk a prefix in pages.
//!
//! Properties:
//! - nothing panics;
//! - every walk, whatever its page size, gives exactly the model's keys under
//!   its prefix, in order, each once; with tombstones, the live keys still
//!   come with mark 0 and every key at most once, in order;
//! - a move finds the box it moves;
//! - the tombstones stay within their bounds (count and bytes), and with no
//!   box left the blocks' bytes are all given back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollbox_core::boxes::{
    KeyOrder, KeySource, Lanes, MarkedKeys, ORDER_SHARDS, TOMBSTONES, TOMBSTONE_BYTES,
};
use std::cell::RefCell;
use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};

/// Boxes by id: id `i` is the `i`th key created or moved (empty: gone).
#[derive(Default)]
struct Ids {
    keys: RefCell<Vec<Vec<u8>>>,
    /// The id of each live key.
    of: HashMap<Vec<u8>, u32>,
}

impl KeySource for Ids {
    fn key_into(&self, id: u32, out: &mut Vec<u8>) -> bool {
        out.clear();
        match self.keys.borrow().get(id as usize) {
            Some(k) if !k.is_empty() => {
                out.extend_from_slice(k);
                true
            }
            _ => false,
        }
    }

    fn cmp_key(&self, id: u32, key: &[u8]) -> Option<Ordering> {
        match self.keys.borrow().get(id as usize) {
            Some(k) if !k.is_empty() => Some(k.as_slice().cmp(key)),
            _ => None,
        }
    }
}

impl Ids {
    fn fresh(&mut self, key: &[u8]) -> u32 {
        let mut keys = self.keys.borrow_mut();
        keys.push(key.to_vec());
        let id = (keys.len() - 1) as u32;
        self.of.insert(key.to_vec(), id);
        id
    }
}

/// One of a few sets' prefixes (`ORDER_SHARDS` sets; keys of one prefix lie
/// in one).
fn prefix(b: u8) -> Vec<u8> {
    match b % 5 {
        0 => b"".to_vec(),
        n => format!("s{n}/").into_bytes(),
    }
}

fn key(p: u8, n: u32) -> Vec<u8> {
    let mut k = prefix(1 + p % 4);
    k.extend_from_slice(format!("{n:05}").as_bytes());
    k
}

struct Run {
    order: KeyOrder,
    ids: Ids,
    model: BTreeSet<Vec<u8>>,
    lanes: Lanes,
    mark: u64,
}

impl Run {
    fn create(&mut self, k: Vec<u8>) {
        if self.model.insert(k.clone()) {
            let id = self.ids.fresh(&k);
            self.order.insert(&self.ids, &k, id);
        }
    }

    fn remove(&mut self, k: &[u8]) {
        if !self.model.remove(k) {
            return;
        }
        let id = self.ids.of.remove(k).expect("a live key has an id");
        self.mark += 1;
        self.order.bury((k, id), self.mark, &self.lanes);
        self.ids.keys.borrow_mut()[id as usize].clear();
    }

    fn relocate(&mut self, k: &[u8]) {
        let Some(&from) = self.ids.of.get(k) else {
            return;
        };
        let to = self.ids.keys.borrow().len() as u32;
        assert!(self.order.rename(k, (from, to)), "the moved box is found");
        let mut keys = self.ids.keys.borrow_mut();
        let moved = std::mem::take(&mut keys[from as usize]);
        keys.push(moved);
        self.ids.of.insert(k.to_vec(), to);
    }

    fn walk(&self, p: &[u8], limit: usize, marked: bool) {
        let (mut got, mut after) = (Vec::<(Vec<u8>, u64)>::new(), None::<Vec<u8>>);
        loop {
            let mut buf = Vec::new();
            let page = (p, after.as_deref());
            let (n, more) = if marked {
                self.order.page_marked(&self.ids, page, limit, &mut buf)
            } else {
                self.order.page(&self.ids, page, limit, &mut buf)
            };
            assert!(n <= limit);
            let before = got.len();
            if marked {
                got.extend(MarkedKeys(&buf).map(|(k, m)| (k.to_vec(), m)));
            } else {
                let mut rest = &buf[..];
                while let Some((len, r)) = rest.split_first_chunk::<2>() {
                    let (k, r) = r.split_at(u16::from_le_bytes(*len) as usize);
                    got.push((k.to_vec(), 0));
                    rest = r;
                }
            }
            assert_eq!(got.len() - before, n, "the count is the keys given");
            after = got.last().map(|(k, _)| k.clone());
            if !more || n == 0 {
                break;
            }
        }
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "in order, once");
        assert!(got.iter().all(|(k, _)| k.starts_with(p)));
        let live: Vec<&Vec<u8>> = got
            .iter()
            .filter(|(_, m)| *m == 0)
            .map(|(k, _)| k)
            .collect();
        let want: Vec<&Vec<u8>> = self.model.iter().filter(|k| k.starts_with(p)).collect();
        assert_eq!(live, want, "the walk is the model");
        if marked {
            let dead = got.len() - live.len();
            assert!(dead <= TOMBSTONES * ORDER_SHARDS);
            for (k, m) in &got {
                assert_eq!(*m == 0, self.model.contains(k), "a tombstone is not a box");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut run = Run {
        order: KeyOrder::default(),
        ids: Ids::default(),
        model: BTreeSet::new(),
        lanes: Lanes::new(1),
        mark: 0,
    };
    let mut walks = 0;
    let mut ops = data.chunks_exact(3);
    for op in ops.by_ref().take(2_000) {
        let (a, b, c) = (op[0], op[1], op[2]);
        let n = u32::from(b) << 4 | u32::from(c >> 4);
        match a % 8 {
            0 | 1 => run.create(key(a >> 3, n)),
            2 => {
                // A run of keys from `n`, stepping by 1 to 16 (reversed for
                // odd steps), so blocks fill in order and out of it.
                // At most 6,000 boxes at a time, so a run stays quick.
                let len = (u32::from(c) * 4).min(6_000u32.saturating_sub(run.model.len() as u32));
                let step = 1 + u32::from(a >> 4);
                for i in 0..len {
                    let j = if step % 2 == 1 { len - i } else { i };
                    run.create(key(a >> 3, (n + j * step) % 100_000));
                }
            }
            3 | 4 => run.remove(&key(a >> 3, n)),
            5 => {
                // Remove the first live key at or after it (hits the model).
                let k = key(a >> 3, n);
                if let Some(k) = run.model.range(k..).next().cloned() {
                    run.remove(&k);
                }
            }
            6 => {
                let k = key(a >> 3, n);
                if let Some(k) = run.model.range(k..).next().cloned() {
                    run.relocate(&k);
                }
            }
            // Eight walks an input at most (each pages through every key
            // under its prefix: the slow part).
            _ if walks < 8 => {
                walks += 1;
                run.walk(&prefix(b), 1 + usize::from(c % 64), a & 0x10 != 0);
            }
            _ => {}
        }
        assert!(run.order.tombstone_bytes() <= TOMBSTONE_BYTES * ORDER_SHARDS);
    }
    run.walk(b"", 1000, false);
    run.walk(b"", 61, true);
    let keys: Vec<Vec<u8>> = run.model.iter().cloned().collect();
    for k in keys {
        run.remove(&k);
    }
    assert_eq!(run.order.bytes(), 0, "every block given back");
    run.walk(b"", 10, false);
});
