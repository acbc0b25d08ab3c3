//! The topic as read from its start at the end (the history's `record`
//! operations): each record, where each value landed, and the model of every
//! key, its state after each record of its home partition, by version.
//!
//! What it is not: a check. The model is what a correct node would hold;
//! `log_promises` compares the nodes' observations with it.

use super::reading::{Checker, Message, Payload};
use crate::history::{Event, Op};
use crate::partition;
use std::collections::{BTreeMap, HashMap};

/// A record of the topic as read at the end.
pub(super) struct Rec<'a> {
    pub(super) i: usize,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) key: Option<&'a str>,
    pub(super) msg: Option<Message>,
    pub(super) tombstone: bool,
}

impl Rec<'_> {
    /// Whether the record is in its key's home partition (one without a key
    /// is in none).
    pub(super) fn is_home(&self, partitions: i32) -> bool {
        self.key
            .is_some_and(|k| partition::home(k, partitions) == self.partition)
    }
}

/// Where a value is: (key, in its home partition?, the record).
pub(super) type Place<'r, 'a> = (Option<&'a str>, bool, &'r Rec<'a>);

/// What the checks read of the topic.
pub(super) struct Topic<'r, 'a> {
    pub(super) partitions: i32,
    /// The model: per key, its state after each home-partition record, by
    /// version.
    pub(super) model: HashMap<&'a str, BTreeMap<u64, Option<Payload>>>,
    /// Where each value is.
    pub(super) places: HashMap<i64, Vec<Place<'r, 'a>>>,
}

impl<'r, 'a> Topic<'r, 'a> {
    pub(super) fn new(recs: &'r [Rec<'a>], partitions: i32) -> Topic<'r, 'a> {
        let mut home_recs: BTreeMap<&str, Vec<&Rec>> = BTreeMap::new();
        for r in recs {
            if let (Some(k), true) = (r.key, r.is_home(partitions)) {
                home_recs.entry(k).or_default().push(r);
            }
        }
        let mut model: HashMap<&str, BTreeMap<u64, Option<Payload>>> = HashMap::new();
        for (key, rs) in &mut home_recs {
            rs.sort_by_key(|r| r.offset);
            let mut states = BTreeMap::new();
            let mut cur: Option<Payload> = None;
            for r in rs.iter() {
                let ver = (r.offset + 1) as u64;
                if r.tombstone {
                    cur = None;
                } else if let Some(m) = &r.msg {
                    let p = cur.get_or_insert(Payload {
                        k: key.to_string(),
                        ver,
                        v: None,
                        sum: Some(0),
                        n: Some(0),
                        by: None,
                    });
                    p.ver = ver;
                    p.v = Some(m.value);
                    p.sum = Some(p.sum.unwrap_or(0) + m.value);
                    p.n = Some(p.n.unwrap_or(0) + 1);
                    p.by = Some(m.player.clone());
                } else {
                    continue; // an invalid record: applied by no node
                }
                states.insert(ver, cur.clone());
            }
            model.insert(key, states);
        }
        let mut places: HashMap<i64, Vec<Place>> = HashMap::new();
        for r in recs {
            if let Some(m) = &r.msg {
                places
                    .entry(m.value)
                    .or_default()
                    .push((r.key, r.is_home(partitions), r));
            }
        }
        Topic {
            partitions,
            model,
            places,
        }
    }
}

impl<'a> Checker<'a> {
    /// The topic as read at the end.
    pub(super) fn records(&self) -> Vec<Rec<'a>> {
        let ops: &'a [Op] = self.ops;
        let mut recs = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Event::Record {
                partition,
                offset,
                key,
                value,
            } = &op.event
            {
                recs.push(Rec {
                    i,
                    partition: *partition,
                    offset: *offset,
                    key: key.as_deref(),
                    msg: value.as_deref().and_then(|v| serde_json::from_str(v).ok()),
                    tombstone: value.is_none(),
                });
            }
        }
        recs
    }
}
