//! Presence on a log cluster, the part every node computes alike
//! (docs/presence.md#on-a-log-cluster): the records nodes write to the
//! presence topic, and [`PresenceView`], the members and versions they give
//! when applied in log order. Sans-IO: the server's threads produce and
//! consume; this decides what each record does.
//!
//! The rules, each chosen so that two nodes agree (the property test in
//! `log/tests.rs` starts one node at the beginning and one late and compares):
//! - **Leases in the log's time.** Before each record, a node whose last record
//!   is older than the record's timestamp less the lease is expired: its
//!   holds are dropped. Timestamps are the records' own, so every node expires
//!   the same nodes at the same record. An expired node's later records are
//!   ignored until it says `hello` again (it sees its own expiry in its view,
//!   and joins its members again under a new incarnation).
//! - **A `hello` clears the node's earlier incarnation** at once.
//! - **A member is present while any live node holds it**; its info is the one
//!   its holder with the smallest node id gave.
//! - **Versions.** A room's version is the offset + 1 of the last record that
//!   changed a node's holds in it: a join or a leave (even of a member that
//!   another node holds too), a node's expiry or new incarnation. A `sync` (a
//!   node's whole presence, every lease) changes nothing for a node that read
//!   everything; for one that started late it fills in the holds, and the
//!   room takes the version the sync announced (what its writer served) if
//!   higher: whatever a late node missed, the next sync of the room brings.
//! - **Empty rooms** keep their version for two leases of log time, then are
//!   forgotten, on every node at the same record; a forgotten room reads as
//!   version [`FORGOTTEN`].
//!
//! A node that starts late reads from the records of [`LATE_START_LEASES`]
//! leases ago: it has every live node's `sync`, every change since, and the
//! members of every room emptied in the two leases before.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The version a room reads at when no node knows it (never present, or
/// empty for two leases).
pub const FORGOTTEN: u64 = 1;

/// How far back (in leases of log time) a node that starts late reads.
pub const LATE_START_LEASES: u64 = 5;

/// A record of the presence topic (JSON; key: the node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase")]
pub enum PresenceRecord {
    /// A node (re)starts: whatever an earlier incarnation held is dropped.
    Hello { node: String, inc: u64 },
    /// A node is alive (every lease / 3).
    Lease { node: String, inc: u64 },
    Join {
        node: String,
        inc: u64,
        room: String,
        member: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        info: Option<serde_json::Value>,
    },
    Leave {
        node: String,
        inc: u64,
        room: String,
        member: String,
    },
    /// Part `seq` of a node's whole presence: these rooms, each as the node
    /// holds it and at the version the node serves. `last`: the rooms no part
    /// of this sync named are held by the node no more.
    Sync {
        node: String,
        inc: u64,
        seq: u64,
        last: bool,
        rooms: Vec<SyncRoom>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRoom {
    pub room: String,
    pub ver: u64,
    pub members: Vec<SyncMember>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncMember {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<serde_json::Value>,
}

impl PresenceRecord {
    pub fn node(&self) -> (&str, u64) {
        match self {
            PresenceRecord::Hello { node, inc }
            | PresenceRecord::Lease { node, inc }
            | PresenceRecord::Join { node, inc, .. }
            | PresenceRecord::Leave { node, inc, .. }
            | PresenceRecord::Sync { node, inc, .. } => (node, *inc),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // Strings and JSON values only: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<PresenceRecord, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// A member's info as a record carries it (compact JSON in, a JSON value
/// out; info that is not JSON is none).
pub fn info_value(compact: &[u8]) -> Option<serde_json::Value> {
    serde_json::from_slice(compact).ok()
}

/// One part of a node's sync, as [`PresenceRecord::Sync`] carries it.
struct SyncPart<'a> {
    seq: u64,
    last: bool,
    rooms: &'a [SyncRoom],
}

#[derive(Debug, Clone, Default)]
struct NodeView {
    inc: u64,
    /// The timestamp of its last record.
    seen_ms: u64,
    /// Lapsed: its holds were dropped; it is ignored until a newer `hello`.
    expired: bool,
    /// (room, member) → info, as compact JSON.
    holds: BTreeMap<(String, String), Option<String>>,
    /// The sync being read: its `seq` and the rooms its parts named.
    sync: Option<(u64, BTreeSet<String>)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct RoomView {
    version: u64,
    /// Each member's holders (node ids, sorted: the first gives the info).
    members: BTreeMap<String, BTreeSet<String>>,
    /// When it emptied (log time), while it is kept.
    emptied_ms: Option<u64>,
}

/// The members and versions of every room, from the presence topic.
#[derive(Debug, Clone)]
pub struct PresenceView {
    lease_ms: u64,
    /// Node incarnations whose lease lapsed so far (`pollbox_presence_lease_expiries_total`).
    pub expiries: u64,
    nodes: BTreeMap<String, NodeView>,
    rooms: BTreeMap<String, RoomView>,
}

/// One member as a view gives it: id and info (compact JSON).
pub type Listed = (String, Option<String>);

impl PresenceView {
    pub fn new(lease_ms: u64) -> PresenceView {
        PresenceView {
            lease_ms,
            expiries: 0,
            nodes: BTreeMap::new(),
            rooms: BTreeMap::new(),
        }
    }

    /// Apply the record at `offset` with timestamp `ts_ms`; returns the rooms
    /// whose members or version changed.
    pub fn apply(&mut self, offset: i64, ts_ms: u64, rec: &PresenceRecord) -> BTreeSet<String> {
        let version = (offset.max(0) as u64) + 1;
        let mut changed = BTreeSet::new();
        self.expire(ts_ms, version, &mut changed);
        let (node, inc) = rec.node();
        let known = self.nodes.get(node).map(|n| (n.inc, n.expired));
        let fresh = match (known, rec) {
            (Some((k, _)), _) if inc < k => return changed,
            (Some((k, true)), _) if inc == k => return changed,
            (Some((k, false)), PresenceRecord::Hello { .. }) if inc == k => false,
            (Some((k, false)), _) if inc == k => false,
            _ => true,
        };
        if fresh {
            // A newer incarnation (or a node first seen): the older one's
            // holds go.
            self.drop_node(node, version, ts_ms, &mut changed);
            self.nodes.insert(
                node.to_string(),
                NodeView {
                    inc,
                    ..NodeView::default()
                },
            );
        }
        if let Some(n) = self.nodes.get_mut(node) {
            n.seen_ms = ts_ms;
        }
        match rec {
            PresenceRecord::Hello { .. } | PresenceRecord::Lease { .. } => {}
            // A join or a leave moves its room's version whether or not the
            // member list changes (another node may hold the member too):
            // so a node that started late, not knowing every hold yet, moves
            // the same versions.
            PresenceRecord::Join {
                room, member, info, ..
            } => {
                let info = info.as_ref().map(|v| v.to_string());
                self.hold(node, room, member, info);
                self.bump(room, version, ts_ms, &mut changed);
            }
            PresenceRecord::Leave { room, member, .. } => {
                self.release(node, room, member, ts_ms);
                self.bump(room, version, ts_ms, &mut changed);
            }
            PresenceRecord::Sync {
                seq, last, rooms, ..
            } => {
                let part = SyncPart {
                    seq: *seq,
                    last: *last,
                    rooms,
                };
                self.sync(node, part, ts_ms, &mut changed);
            }
        }
        changed
    }

    /// Nodes silent for a lease lose their holds; rooms empty for two leases
    /// are forgotten.
    fn expire(&mut self, ts_ms: u64, version: u64, changed: &mut BTreeSet<String>) {
        let lapsed: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| !n.expired && n.seen_ms.saturating_add(self.lease_ms) < ts_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lapsed {
            self.expiries += 1;
            self.drop_node(&id, version, ts_ms, changed);
            if let Some(n) = self.nodes.get_mut(&id) {
                n.expired = true;
            }
        }
        let keep = self.lease_ms.saturating_mul(2);
        self.rooms.retain(|room, r| {
            let gone = r
                .emptied_ms
                .is_some_and(|at| at.saturating_add(keep) < ts_ms);
            if gone {
                changed.insert(room.clone());
            }
            !gone
        });
    }

    /// Drop every hold of `node` (its expiry, or a newer incarnation): each
    /// room it held moves to `version`.
    fn drop_node(&mut self, node: &str, version: u64, ts_ms: u64, changed: &mut BTreeSet<String>) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        n.sync = None;
        let holds: Vec<(String, String)> = std::mem::take(&mut n.holds).into_keys().collect();
        for (room, member) in holds {
            self.release(node, &room, &member, ts_ms);
            self.bump(&room, version, ts_ms, changed);
        }
    }

    /// `node` holds `member` of `room` (with `info`).
    fn hold(&mut self, node: &str, room: &str, member: &str, info: Option<String>) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        n.holds.insert((room.to_string(), member.to_string()), info);
        let r = self.rooms.entry(room.to_string()).or_default();
        r.members
            .entry(member.to_string())
            .or_default()
            .insert(node.to_string());
        r.emptied_ms = None;
    }

    /// `node` holds `member` of `room` no more (if it did).
    fn release(&mut self, node: &str, room: &str, member: &str, ts_ms: u64) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.holds.remove(&(room.to_string(), member.to_string()));
        }
        let Some(r) = self.rooms.get_mut(room) else {
            return;
        };
        if let Some(holders) = r.members.get_mut(member) {
            holders.remove(node);
            if holders.is_empty() {
                r.members.remove(member);
                if r.members.is_empty() {
                    r.emptied_ms = Some(ts_ms);
                }
            }
        }
    }

    /// A node's whole presence, a part at a time. It fills in what a node
    /// that started late has not seen, and moves no version of its own (the
    /// rooms take the versions it announces, if higher): for a node that read
    /// everything it changes nothing.
    fn sync(&mut self, node: &str, part: SyncPart<'_>, ts_ms: u64, changed: &mut BTreeSet<String>) {
        let SyncPart { seq, last, rooms } = part;
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.sync.as_ref().is_none_or(|(s, _)| *s != seq) {
            n.sync = Some((seq, BTreeSet::new()));
        }
        for sr in rooms {
            if let Some((_, named)) = self.nodes.get_mut(node).and_then(|n| n.sync.as_mut()) {
                named.insert(sr.room.clone());
            }
            let want: BTreeMap<String, Option<String>> = sr
                .members
                .iter()
                .map(|m| (m.id.clone(), m.info.as_ref().map(|v| v.to_string())))
                .collect();
            let before: Vec<Listed> = self.members(&sr.room);
            for (member, _) in self.held_in(node, &sr.room) {
                if !want.contains_key(&member) {
                    self.release(node, &sr.room, &member, ts_ms);
                }
            }
            for (member, info) in want {
                self.hold(node, &sr.room, &member, info);
            }
            let moved = self.members(&sr.room) != before;
            let r = self.rooms.entry(sr.room.clone()).or_default();
            if r.members.is_empty() && r.emptied_ms.is_none() {
                r.emptied_ms = Some(ts_ms);
            }
            if sr.ver > r.version || moved {
                r.version = r.version.max(sr.ver);
                changed.insert(sr.room.clone());
            }
        }
        if last {
            let named = self
                .nodes
                .get_mut(node)
                .and_then(|n| n.sync.take())
                .map(|(_, named)| named)
                .unwrap_or_default();
            let stale: Vec<(String, String)> = self
                .nodes
                .get(node)
                .map(|n| {
                    n.holds
                        .keys()
                        .filter(|(room, _)| !named.contains(room))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            for (room, member) in stale {
                self.release(node, &room, &member, ts_ms);
                changed.insert(room);
            }
        }
    }

    fn held_in(&self, node: &str, room: &str) -> Vec<(String, Option<String>)> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        n.holds
            .range((room.to_string(), String::new())..)
            .take_while(|((r, _), _)| r == room)
            .map(|((_, m), i)| (m.clone(), i.clone()))
            .collect()
    }

    fn bump(&mut self, room: &str, version: u64, ts_ms: u64, changed: &mut BTreeSet<String>) {
        let r = self.rooms.entry(room.to_string()).or_default();
        r.version = r.version.max(version);
        if r.members.is_empty() && r.emptied_ms.is_none() {
            r.emptied_ms = Some(ts_ms);
        }
        changed.insert(room.to_string());
    }

    /// What a member shows: `None` if absent, else its info, which is its
    /// first holder's (by node id).
    fn shown(&self, room: &str, member: &str) -> Option<Option<String>> {
        let holders = self.rooms.get(room)?.members.get(member)?;
        let first = holders.first()?;
        let n = self.nodes.get(first)?;
        Some(
            n.holds
                .get(&(room.to_string(), member.to_string()))
                .cloned()
                .flatten(),
        )
    }

    /// Whether the view knows `room` (members, or empty for less than two
    /// leases).
    pub fn knows(&self, room: &str) -> bool {
        self.rooms.contains_key(room)
    }

    /// A room's version ([`FORGOTTEN`] for a room no node knows).
    pub fn version(&self, room: &str) -> u64 {
        self.rooms.get(room).map_or(FORGOTTEN, |r| r.version)
    }

    /// A room's members, by id, with their info.
    pub fn members(&self, room: &str) -> Vec<Listed> {
        let Some(r) = self.rooms.get(room) else {
            return Vec::new();
        };
        r.members
            .keys()
            .map(|m| (m.clone(), self.shown(room, m).flatten()))
            .collect()
    }

    /// Every room a view knows, with its version and members (tests compare
    /// two views with it).
    pub fn rooms(&self) -> BTreeMap<String, (u64, Vec<Listed>)> {
        self.rooms
            .keys()
            .map(|room| (room.clone(), (self.version(room), self.members(room))))
            .collect()
    }

    /// Whether `node`'s incarnation `inc` is expired in this view (the node
    /// itself then says `hello` again and joins its members anew).
    pub fn expired(&self, node: &str, inc: u64) -> bool {
        self.nodes
            .get(node)
            .is_some_and(|n| n.inc == inc && n.expired)
    }
}

#[cfg(test)]
mod tests;
