//! Presence (docs/presence.md): who is in a room, on this node.
//!
//! A client is present in a room (a prefix, docs/http.md#rooms) while it holds
//! a presence connection: an event stream or long-poll that names it as a
//! member (`member=`). Its connections hold a [`Membership`] each; the same
//! member on several connections is present once. When its last one ends,
//! it leaves `leave_grace_ms` later unless a connection comes back first.
//!
//! A room's presence is served as a box: the key `<room>~presence`
//! ([`PRESENCE_SUFFIX`]) reads `{"k":...,"ver":V,"count":N,"members":[...]}`,
//! rendered once per change, so polls, ETags, long-polls, event streams and
//! many-box streams serve it as they serve any box. Its version moves with
//! every join and leave; the watchers of the key are woken through the
//! host as for a box update, at once while the room lists its members, at
//! most once per `count_interval_ms` past `max_listed` (a join storm reaches
//! each watcher as a few count events).
//!
//! What it is not: presence over a log (each node would see only its own
//! members; docs/presence.md says where that stands), nor the HTTP side
//! (`service::presence` parses the parameters and answers).

use crate::render::write_json_str;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::plan::{reserved_key, PRESENCE_SUFFIX};

pub mod log;
mod logged;
pub use logged::{Hold, Outbound};
mod settings;
pub use settings::PresenceConfig;

/// The most bytes a member's `info` takes, as compact JSON.
pub const MAX_INFO_BYTES: usize = 400;
/// The most bytes of a member's id.
pub const MAX_MEMBER_BYTES: usize = 128;
/// Rooms are spread over this many mutexes.
const SHARDS: usize = 64;

/// The room whose presence `key` names (`room-17/` for `room-17/~presence`),
/// or `None` for any other key.
#[inline]
pub fn room_of(key: &[u8]) -> Option<&[u8]> {
    let room = key.strip_suffix(PRESENCE_SUFFIX)?;
    crate::boxes::is_prefix(room).then_some(room)
}

/// Whether the box `key` at `version` is news to a client at `last` (a
/// long-poll's `after`, a stream's last id). A box's versions only grow, so
/// a newer one is news; a room's presence on a node of a log can read at
/// [`log::FORGOTTEN`] after a higher version (an emptied room forgotten),
/// so for it any other version is news: a watcher is never left holding a
/// state that is gone.
#[inline]
pub fn moved(key: &[u8], version: u64, last: u64) -> bool {
    if version > last {
        return true;
    }
    version != last && room_of(key).is_some()
}

/// Why a presence connection was refused (each its own answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinError {
    /// The room holds `presence.max_members` members (503).
    RoomFull,
    /// The member holds `presence.max_connections_per_member` here (429).
    MemberConnections,
    /// The node holds `presence.max_connections` presence connections (503).
    NodeConnections,
}

impl JoinError {
    /// Every refusal, in the order of [`PresenceStats::refused`].
    pub const ALL: [JoinError; 3] = [
        JoinError::RoomFull,
        JoinError::MemberConnections,
        JoinError::NodeConnections,
    ];

    pub fn status(self) -> u16 {
        match self {
            JoinError::MemberConnections => 429,
            JoinError::RoomFull | JoinError::NodeConnections => 503,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            JoinError::RoomFull => "room full",
            JoinError::MemberConnections => "too many presence connections for this member",
            JoinError::NodeConnections => "too many presence connections",
        }
    }

    /// The setting that bounds it (the answer names it; the metric's label).
    pub fn limit(self) -> &'static str {
        match self {
            JoinError::RoomFull => "presence.max_members",
            JoinError::MemberConnections => "presence.max_connections_per_member",
            JoinError::NodeConnections => "presence.max_connections",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The metric's label: the setting it names.
    pub fn label(self) -> &'static str {
        self.limit()
    }
}

/// What the node counts of presence (docs/metrics: `pollbox_presence_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PresenceStats {
    pub rooms: u64,
    pub members: u64,
    pub connections: u64,
    pub joins: u64,
    pub leaves: u64,
    /// On a node of a log: node incarnations whose lease lapsed, as this
    /// node's view of the presence topic counts them.
    pub lease_expiries: u64,
    /// Refusals by [`JoinError`], in its order.
    pub refused: [u64; 3],
}

/// Who is in each room of this node.
pub struct Presence {
    cfg: PresenceConfig,
    hasher: std::collections::hash_map::RandomState,
    shards: Box<[Mutex<Shard>]>,
    /// The earliest leave or deferred wake-up of any shard (ms); `u64::MAX`:
    /// none.
    due_ms: AtomicU64,
    /// The clock of the last [`Presence::tick`]: when a connection that ends
    /// between two ticks ended.
    now_ms: AtomicU64,
    connections: AtomicUsize,
    rooms: AtomicUsize,
    members: AtomicUsize,
    joins: AtomicU64,
    leaves: AtomicU64,
    lease_expiries: AtomicU64,
    refused: [AtomicU64; 3],
    /// On a node of a log ([`Presence::logged`]): the rooms as the log's
    /// view gives them, which is what is served; the local shards then only
    /// hold this node's connections, whose joins and leaves go out as
    /// records ([`Presence::take_outbound`]).
    served: Option<Box<[Mutex<Shard>]>>,
    outbound: Mutex<Vec<Outbound>>,
    /// The presence topic read to where it ended when the node started (a
    /// node of a log says ready only then); a standalone node always is.
    caught_up: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Shard {
    rooms: HashMap<Box<[u8]>, Room>,
    /// Members whose last connection ended: when they leave, their room,
    /// themselves. An entry whose member came back meanwhile is skipped.
    leaving: BinaryHeap<Reverse<Leaving>>,
    /// Rooms whose watchers wait for the count interval to be woken.
    waking: Vec<Box<[u8]>>,
    /// The highest version a room of this shard had when it emptied: an
    /// empty room reads at it, a new one starts past it.
    floor: u64,
}

/// When a member leaves, its room, itself.
type Leaving = (u64, Box<[u8]>, Box<[u8]>);

struct Room {
    version: u64,
    members: BTreeMap<Box<[u8]>, Member>,
    /// The room's presence as served, rendered at each change.
    payload: Vec<u8>,
    /// When its watchers were last woken.
    woke_ms: u64,
    /// A wake-up waits for the count interval (the room is in `waking`).
    wake_waits: bool,
    /// The first page as last rendered: (version, limit, body); a read of
    /// the same page at the same version copies it.
    first_page: Option<Box<(u64, usize, Vec<u8>)>>,
}

struct Member {
    /// Its presence connections on this node.
    conns: u32,
    /// When it leaves (its last connection ended); 0 while connected.
    leave_ms: u64,
    /// Compact JSON object, at most [`MAX_INFO_BYTES`].
    info: Option<Box<[u8]>>,
}

/// One presence connection's hold on its member: dropping it (the long-poll
/// answered, the stream ended, the connection closed) lets the member go
/// after the grace, unless another connection holds it.
pub struct Membership {
    presence: Arc<Presence>,
    room: Box<[u8]>,
    member: Box<[u8]>,
}

impl fmt::Debug for Membership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Membership")
            .field("room", &String::from_utf8_lossy(&self.room))
            .field("member", &String::from_utf8_lossy(&self.member))
            .finish()
    }
}

impl Membership {
    /// Heap bytes it holds.
    pub fn heap_bytes(&self) -> usize {
        self.room.len() + self.member.len()
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.presence.release(&self.room, &self.member);
    }
}

/// The key of `room`'s presence.
pub fn presence_key(room: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(room.len() + PRESENCE_SUFFIX.len());
    k.extend_from_slice(room);
    k.extend_from_slice(PRESENCE_SUFFIX);
    k
}

/// Check `info=` (or a token's `info` claim): a JSON object, at most
/// [`MAX_INFO_BYTES`] once compact. Returns it compact.
pub fn check_info(raw: &[u8]) -> Result<Vec<u8>, &'static str> {
    let v: serde_json::Value = serde_json::from_slice(raw).map_err(|_| "info is not valid JSON")?;
    if !v.is_object() {
        return Err("info is not a JSON object");
    }
    let compact = serde_json::to_vec(&v).map_err(|_| "info is not valid JSON")?;
    if compact.len() > MAX_INFO_BYTES {
        return Err("info is longer than 400 bytes");
    }
    Ok(compact)
}

/// Check a member's id: 1 to [`MAX_MEMBER_BYTES`] bytes of UTF-8.
pub fn check_member(id: &[u8]) -> Result<(), &'static str> {
    if id.is_empty() {
        return Err("member is empty");
    }
    if id.len() > MAX_MEMBER_BYTES {
        return Err("member is longer than 128 bytes");
    }
    if std::str::from_utf8(id).is_err() {
        return Err("member is not valid UTF-8");
    }
    Ok(())
}

impl Presence {
    /// `start`: the version clock now (µs since the epoch, or 0): an empty
    /// room reads at it (at least 1: a version 0 is no box), so versions a
    /// node served before a restart are never served again for other
    /// members.
    pub fn new(cfg: PresenceConfig, start: u64) -> Presence {
        let floor = start.max(1);
        Presence {
            cfg,
            hasher: Default::default(),
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        floor,
                        ..Shard::default()
                    })
                })
                .collect(),
            due_ms: AtomicU64::new(u64::MAX),
            now_ms: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            rooms: AtomicUsize::new(0),
            members: AtomicUsize::new(0),
            joins: AtomicU64::new(0),
            leaves: AtomicU64::new(0),
            lease_expiries: AtomicU64::new(0),
            refused: Default::default(),
            served: None,
            outbound: Mutex::new(Vec::new()),
            caught_up: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Presence on a node of a log (docs/presence.md#on-a-log-cluster): this
    /// node's holds go out as records, and what is served is what the
    /// presence thread says the log's view holds ([`Presence::serve`]). A
    /// room no node knows reads at [`log::FORGOTTEN`], on every node alike.
    pub fn logged(cfg: PresenceConfig) -> Presence {
        let served = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    floor: log::FORGOTTEN,
                    ..Shard::default()
                })
            })
            .collect();
        Presence {
            served: Some(served),
            caught_up: std::sync::atomic::AtomicBool::new(false),
            ..Presence::new(cfg, 1)
        }
    }

    /// Whether this node's presence comes from a log.
    pub fn is_logged(&self) -> bool {
        self.served.is_some()
    }

    pub fn config(&self) -> &PresenceConfig {
        &self.cfg
    }

    fn shard(&self, room: &[u8]) -> MutexGuard<'_, Shard> {
        let i = self.hasher.hash_one(room) as usize % SHARDS;
        // A panic under the lock leaves a room as it was between two steps:
        // serve on.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shard a room is served from: the local one, or on a node of a
    /// log the view's.
    fn serving(&self, room: &[u8]) -> MutexGuard<'_, Shard> {
        match &self.served {
            Some(served) => {
                let i = self.hasher.hash_one(room) as usize % SHARDS;
                served[i].lock().unwrap_or_else(|p| p.into_inner())
            }
            None => self.shard(room),
        }
    }

    /// `member` opens a presence connection to `room` (with `info`, compact
    /// JSON, or none). `clock` is the version clock (µs since the epoch, or
    /// 0): a room that starts starts past it. Returns the connection's hold
    /// and whether the room changed (a join, or new info): then its
    /// watchers are to be woken with [`Presence::wake_now`]'s answer.
    pub fn join(
        self: &Arc<Self>,
        room: &[u8],
        member: &[u8],
        info: Option<&[u8]>,
        now_ms: u64,
        clock: u64,
    ) -> Result<(Membership, bool), JoinError> {
        if self.connections.fetch_add(1, Relaxed) >= self.cfg.max_connections {
            self.connections.fetch_sub(1, Relaxed);
            return Err(self.refuse(JoinError::NodeConnections));
        }
        let changed = {
            let mut shard = self.shard(room);
            let shard = &mut *shard;
            if !shard.rooms.contains_key(room) {
                self.rooms.fetch_add(1, Relaxed);
                let version = clock.max(shard.floor + 1).saturating_sub(1);
                shard.rooms.insert(room.into(), Room::new(version));
            }
            let Some(r) = shard.rooms.get_mut(room) else {
                // Inserted just above, under the same lock.
                self.connections.fetch_sub(1, Relaxed);
                return Err(self.refuse(JoinError::NodeConnections));
            };
            let full = r.members.len() >= self.cfg.max_members;
            let refusal = match r.members.get_mut(member) {
                Some(m) if m.conns as usize >= self.cfg.max_connections_per_member => {
                    Err(JoinError::MemberConnections)
                }
                Some(m) => {
                    m.conns += 1;
                    m.leave_ms = 0;
                    let new_info = info.is_some_and(|i| m.info.as_deref() != Some(i));
                    if new_info {
                        m.info = info.map(Into::into);
                    }
                    Ok(new_info)
                }
                None if full => Err(JoinError::RoomFull),
                None => {
                    r.members.insert(
                        member.into(),
                        Member {
                            conns: 1,
                            leave_ms: 0,
                            info: info.map(Into::into),
                        },
                    );
                    self.members.fetch_add(1, Relaxed);
                    self.joins.fetch_add(1, Relaxed);
                    Ok(true)
                }
            };
            match refusal {
                Ok(changed) => {
                    if changed && self.served.is_none() {
                        r.version += 1;
                        r.render(room, self.cfg.max_listed);
                    }
                    changed
                }
                Err(e) => {
                    if r.members.is_empty() {
                        shard.rooms.remove(room);
                        self.rooms.fetch_sub(1, Relaxed);
                    }
                    self.connections.fetch_sub(1, Relaxed);
                    return Err(self.refuse(e));
                }
            }
        };
        let hold = Membership {
            presence: Arc::clone(self),
            room: room.into(),
            member: member.into(),
        };
        if self.served.is_some() {
            if changed {
                self.send(Outbound::Join {
                    room: room.to_vec(),
                    member: member.to_vec(),
                    info: info.map(<[u8]>::to_vec),
                });
            }
            // Served once the log's view has it, as every node serves it.
            return Ok((hold, false));
        }
        Ok((hold, changed && self.wake_now(room, now_ms)))
    }

    fn refuse(&self, e: JoinError) -> JoinError {
        self.refused[e.index()].fetch_add(1, Relaxed);
        e
    }

    /// Whether the watchers of `room`, which just changed, are woken now:
    /// while it lists its members, or once the count interval has passed
    /// since the last wake-up; else the wake-up waits for a later tick.
    fn wake_now(&self, room: &[u8], now_ms: u64) -> bool {
        let mut shard = self.shard(room);
        self.woken(&mut shard, room, now_ms)
    }

    /// [`Presence::wake_now`] for `room` of `shard` (a local shard, or on a
    /// node of a log a served one), its lock held.
    fn woken(&self, shard: &mut Shard, room: &[u8], now_ms: u64) -> bool {
        let Some(r) = shard.rooms.get_mut(room) else {
            return true;
        };
        if r.members.len() <= self.cfg.max_listed
            || now_ms >= r.woke_ms.saturating_add(self.cfg.count_interval_ms)
        {
            r.woke_ms = now_ms;
            return true;
        }
        if !r.wake_waits {
            r.wake_waits = true;
            shard.waking.push(room.into());
            self.due_ms
                .fetch_min(r.woke_ms + self.cfg.count_interval_ms, Relaxed);
        }
        false
    }

    /// A connection of `member` ended.
    fn release(&self, room: &[u8], member: &[u8]) {
        self.connections.fetch_sub(1, Relaxed);
        let at = self.now_ms.load(Relaxed) + self.cfg.leave_grace_ms;
        let mut shard = self.shard(room);
        let Some(m) = shard
            .rooms
            .get_mut(room)
            .and_then(|r| r.members.get_mut(member))
        else {
            return;
        };
        m.conns = m.conns.saturating_sub(1);
        if m.conns == 0 {
            m.leave_ms = at;
            shard
                .leaving
                .push(Reverse((at, room.into(), member.into())));
            self.due_ms.fetch_min(at, Relaxed);
        }
    }

    /// Each worker's tick at `now_ms`: members whose grace ran out leave,
    /// and the wake-ups that waited for the count interval are due; `wake`
    /// is called with each room whose watchers are woken (after its lock is
    /// let go).
    pub fn tick(&self, now_ms: u64, mut wake: impl FnMut(&[u8])) {
        self.now_ms.fetch_max(now_ms, Relaxed);
        if now_ms < self.due_ms.load(Relaxed) {
            return;
        }
        // One worker does it; another tick meanwhile finds nothing due (and
        // puts back a later deadline it took by mistake).
        let due = self.due_ms.swap(u64::MAX, Relaxed);
        if due > now_ms {
            self.due_ms.fetch_min(due, Relaxed);
            return;
        }
        let mut woken: Vec<Box<[u8]>> = Vec::new();
        let served = self.served.as_deref().unwrap_or(&[]);
        for s in self.shards.iter().chain(served.iter()) {
            let mut shard = s.lock().unwrap_or_else(|p| p.into_inner());
            let next = self.tick_shard(&mut shard, now_ms, &mut woken);
            self.due_ms.fetch_min(next, Relaxed);
            drop(shard);
            for room in woken.drain(..) {
                wake(&room);
            }
        }
    }

    /// [`Presence::tick`] for one shard; returns when it is due next.
    fn tick_shard(&self, shard: &mut Shard, now_ms: u64, woken: &mut Vec<Box<[u8]>>) -> u64 {
        let Shard {
            rooms,
            leaving,
            waking,
            floor,
        } = shard;
        while let Some(Reverse((at, _, _))) = leaving.peek() {
            if *at > now_ms {
                break;
            }
            let Some(Reverse((at, room, member))) = leaving.pop() else {
                break;
            };
            let Some(r) = rooms.get_mut(&room) else {
                continue;
            };
            let gone = r
                .members
                .get(&member)
                .is_some_and(|m| m.conns == 0 && m.leave_ms == at);
            if !gone {
                continue;
            }
            r.members.remove(&member);
            r.version += 1;
            self.members.fetch_sub(1, Relaxed);
            self.leaves.fetch_add(1, Relaxed);
            if self.served.is_some() {
                // Gone from here: every node serves the leave once the log
                // has it.
                self.send(Outbound::Leave {
                    room: room.to_vec(),
                    member: member.to_vec(),
                });
                if r.members.is_empty() {
                    rooms.remove(&room);
                    self.rooms.fetch_sub(1, Relaxed);
                }
                continue;
            }
            if r.members.is_empty() {
                *floor = (*floor).max(r.version);
                rooms.remove(&room);
                self.rooms.fetch_sub(1, Relaxed);
                woken.push(room);
                continue;
            }
            r.render(&room, self.cfg.max_listed);
            if r.members.len() <= self.cfg.max_listed
                || now_ms >= r.woke_ms.saturating_add(self.cfg.count_interval_ms)
            {
                r.woke_ms = now_ms;
                woken.push(room);
            } else if !r.wake_waits {
                r.wake_waits = true;
                waking.push(room);
            }
        }
        let interval = self.cfg.count_interval_ms;
        let mut next = leaving.peek().map_or(u64::MAX, |Reverse((at, _, _))| *at);
        waking.retain(|room| {
            let Some(r) = rooms.get_mut(room) else {
                return false;
            };
            if !r.wake_waits {
                return false;
            }
            let due = r.woke_ms.saturating_add(interval);
            if due <= now_ms {
                r.wake_waits = false;
                r.woke_ms = now_ms;
                woken.push(room.clone());
                false
            } else {
                next = next.min(due);
                true
            }
        });
        next
    }

    /// `room`'s presence as served, into `out`; returns its version.
    pub fn read(&self, room: &[u8], out: &mut Vec<u8>) -> u64 {
        let shard = self.serving(room);
        match shard.rooms.get(room) {
            Some(r) => {
                out.extend_from_slice(&r.payload);
                r.version
            }
            None => {
                let v = shard.floor;
                drop(shard);
                render_empty(room, v, out);
                v
            }
        }
    }

    /// `room`'s version (an empty room: its shard's floor).
    pub fn version(&self, room: &[u8]) -> u64 {
        let shard = self.serving(room);
        shard.rooms.get(room).map_or(shard.floor, |r| r.version)
    }

    /// A page of `room`'s members, by id, after `after` (none: from the
    /// first), at most `limit`: `{"k":...,"ver":V,"count":N,"members":[...],
    /// "next":...}` into `out`, with `write_next` writing the cursor of
    /// the last id given (or `null` at the end). Returns the version.
    pub fn page(
        &self,
        room: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
        write_next: impl FnOnce(Option<&[u8]>, &mut Vec<u8>),
    ) -> u64 {
        let mut shard = self.serving(room);
        let floor = shard.floor;
        let Some(r) = shard.rooms.get_mut(room) else {
            render_head(room, floor, 0, out);
            out.extend_from_slice(b",\"members\":[],\"next\":");
            write_next(None, out);
            out.push(b'}');
            return floor;
        };
        if after.is_none() {
            // The first page, what most readers ask: rendered once a version.
            if let Some(cached) = r.first_page.as_deref() {
                if cached.0 == r.version && cached.1 == limit {
                    out.extend_from_slice(&cached.2);
                    return r.version;
                }
            }
            let start = out.len();
            r.render_page(room, None, limit, out, write_next);
            let body = out[start..].to_vec();
            r.first_page = Some(Box::new((r.version, limit, body)));
            return r.version;
        }
        r.render_page(room, after, limit, out, write_next);
        r.version
    }

    /// Whether no leave and no deferred wake-up waits for a tick (a worker
    /// with no connection may then sleep).
    pub fn idle(&self) -> bool {
        self.due_ms.load(Relaxed) == u64::MAX
    }

    /// What the node counts now.
    pub fn stats(&self) -> PresenceStats {
        PresenceStats {
            rooms: self.rooms.load(Relaxed) as u64,
            members: self.members.load(Relaxed) as u64,
            connections: self.connections.load(Relaxed) as u64,
            joins: self.joins.load(Relaxed),
            leaves: self.leaves.load(Relaxed),
            lease_expiries: self.lease_expiries.load(Relaxed),
            refused: [0, 1, 2].map(|i| self.refused[i].load(Relaxed)),
        }
    }
}

impl Room {
    /// A room at `version`, no one in it yet.
    fn new(version: u64) -> Room {
        Room {
            version,
            members: BTreeMap::new(),
            payload: Vec::new(),
            woke_ms: 0,
            wake_waits: false,
            first_page: None,
        }
    }

    /// A page of its members after `after`, at most `limit` (see
    /// [`Presence::page`]).
    fn render_page(
        &self,
        room: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<u8>,
        write_next: impl FnOnce(Option<&[u8]>, &mut Vec<u8>),
    ) {
        render_head(room, self.version, self.members.len(), out);
        out.extend_from_slice(b",\"members\":[");
        let lower = match after {
            Some(a) => Bound::Excluded(a),
            None => Bound::Unbounded,
        };
        let mut it = self
            .members
            .range::<[u8], _>((lower, Bound::Unbounded))
            .peekable();
        let mut last: Option<&[u8]> = None;
        let mut n = 0;
        while n < limit {
            let Some((id, m)) = it.next() else {
                break;
            };
            if n > 0 {
                out.push(b',');
            }
            render_member(id, m, out);
            last = Some(id);
            n += 1;
        }
        let more = it.peek().is_some();
        out.extend_from_slice(b"],\"next\":");
        write_next(last.filter(|_| more), out);
        out.push(b'}');
    }

    /// Render the payload: every member while at most `max_listed`, else the
    /// count alone.
    fn render(&mut self, room: &[u8], max_listed: usize) {
        self.first_page = None;
        let mut out = std::mem::take(&mut self.payload);
        out.clear();
        render_head(room, self.version, self.members.len(), &mut out);
        if self.members.len() <= max_listed {
            out.extend_from_slice(b",\"members\":[");
            for (i, (id, m)) in self.members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                render_member(id, m, &mut out);
            }
            out.push(b']');
        }
        out.push(b'}');
        self.payload = out;
    }
}

/// `{"k":"<room>~presence","ver":V,"count":N` (ids and rooms are UTF-8:
/// checked before they join).
fn render_head(room: &[u8], version: u64, count: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"k\":");
    let key = presence_key(room);
    write_json_str(std::str::from_utf8(&key).unwrap_or(""), out);
    out.extend_from_slice(b",\"ver\":");
    out.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
    out.extend_from_slice(b",\"count\":");
    out.extend_from_slice(itoa::Buffer::new().format(count).as_bytes());
}

fn render_empty(room: &[u8], version: u64, out: &mut Vec<u8>) {
    render_head(room, version, 0, out);
    out.extend_from_slice(b",\"members\":[]}");
}

/// `{"id":"alice","info":{...}}`.
fn render_member(id: &[u8], m: &Member, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"id\":");
    write_json_str(std::str::from_utf8(id).unwrap_or(""), out);
    if let Some(info) = &m.info {
        out.extend_from_slice(b",\"info\":");
        out.extend_from_slice(info);
    }
    out.push(b'}');
}

#[cfg(test)]
mod tests;
