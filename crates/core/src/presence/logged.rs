//! Presence on a node of a log, the workers' side (docs/presence.md#on-a-log-cluster):
//! this node's joins and leaves queued for the presence thread, the members
//! it holds (its syncs), and what the log's view says is served.
//!
//! What it is not: the view (`log.rs`), or the thread (the server's
//! `log/presence.rs`).

use super::*;

/// A member this node holds: room, member, info (compact JSON).
pub type Hold = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);

/// A change of this node's own holds, for the presence topic (a node of a
/// log): a member's first connection here, new info, or its leave here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outbound {
    Join {
        room: Vec<u8>,
        member: Vec<u8>,
        info: Option<Vec<u8>>,
    },
    Leave {
        room: Vec<u8>,
        member: Vec<u8>,
    },
}

impl Presence {
    /// Whether what is served is the log's presence: on a node of a log,
    /// once the presence topic was read to where it ended at start.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Relaxed)
    }

    /// The presence thread read the topic to its end at start.
    pub fn set_caught_up(&self) {
        self.caught_up.store(true, Relaxed);
    }

    /// The view's count of lapsed leases (the presence thread says it).
    pub fn set_lease_expiries(&self, n: u64) {
        self.lease_expiries.store(n, Relaxed);
    }

    pub(super) fn send(&self, o: Outbound) {
        self.outbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(o);
    }

    /// This node's joins and leaves since the last call, in order (the
    /// presence thread produces them).
    pub fn take_outbound(&self) -> Vec<Outbound> {
        std::mem::take(&mut *self.outbound.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every member this node holds (connected, or in its grace), by room:
    /// what its `sync` says and what it joins again as a new incarnation.
    pub fn local_holds(&self) -> Vec<Hold> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let shard = s.lock().unwrap_or_else(|p| p.into_inner());
            for (room, r) in &shard.rooms {
                for (member, m) in &r.members {
                    out.push((
                        room.to_vec(),
                        member.to_vec(),
                        m.info.as_deref().map(<[u8]>::to_vec),
                    ));
                }
            }
        }
        out
    }

    /// The log's view says `room` is at `version` with `members` (id, info
    /// as compact JSON): serve that. Returns whether its watchers are woken
    /// now (else at a later tick, past `max_listed`).
    pub fn serve(
        &self,
        room: &[u8],
        version: u64,
        members: &[(String, Option<String>)],
        now_ms: u64,
    ) -> bool {
        let Some(served) = &self.served else {
            return false;
        };
        let i = self.hasher.hash_one(room) as usize % SHARDS;
        let mut shard = served[i].lock().unwrap_or_else(|p| p.into_inner());
        let shard = &mut *shard;
        let r = shard
            .rooms
            .entry(room.into())
            .or_insert_with(|| Room::new(version));
        r.version = version;
        r.members = members
            .iter()
            .map(|(id, info)| {
                let m = Member {
                    conns: 0,
                    leave_ms: 0,
                    info: info.as_ref().map(|i| i.as_bytes().into()),
                };
                (id.as_bytes().into(), m)
            })
            .collect();
        r.render(room, self.cfg.max_listed);
        self.woken(shard, room, now_ms)
    }

    /// The log's view forgot `room` (empty for two leases): it reads as no
    /// one's, at [`log::FORGOTTEN`].
    pub fn forget(&self, room: &[u8]) {
        if let Some(served) = &self.served {
            let i = self.hasher.hash_one(room) as usize % SHARDS;
            served[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .rooms
                .remove(room);
        }
    }
}
