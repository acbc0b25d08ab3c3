//! The presence mix (`--presence-members`, `--presence-churn`, `--presence-storm`,
//! `--presence-watchers`; docs/presence.md): members present in rooms, joining and
//! leaving at a rate or all at once, and watchers of the rooms' presence, read by one
//! thread with its own mio loop while the mix runs.
//!
//! - **A member** is an event stream of `GET /v1/boxes/<room>~presence?member=m-<n>`:
//!   present while it is open (the server answers 200 when it has joined). Member `n`
//!   is in the room `--presence-room` gives for `n` ([`PrefixTemplate`], default each
//!   member's `--rooms` room, `room-{n%R}/`). Its events are read and dropped.
//! - **Churn** (`--presence-churn RATE`): RATE times a second, from the start, the
//!   oldest held member closes its stream (it leaves `presence.leave_grace_ms` later)
//!   and a new member (the next id) opens one in the same room, so the run holds
//!   `--presence-members` open throughout.
//! - **A storm** (`--presence-storm N`): at the start of the measured window (after the
//!   warm-up), N more members (ids after the held ones, rooms as the template gives)
//!   open their streams as fast as one thread can connect; the report says how long
//!   until all were written, all answered 200, and every watcher of their rooms saw a
//!   count that includes them.
//! - **A watcher** (`--presence-watchers N`, watcher `i` on the room the template gives
//!   for `i`) streams `<room>~presence` without `member=`: its events and the bytes it
//!   receives in the measured window are counted, and the last `count` it saw kept. The
//!   bytes are set against the room's full member list (`[{"id":"m-0"},...]` as the
//!   server would list the members this run holds open in it at the end): the
//!   acceptance of a join storm (10,000 joins in a second, each of 100 watchers sent at
//!   most 1.5 times the final list's bytes, docs/presence.md) reads off that ratio.
//!
//! The held members and the watchers are connected before the clock starts ([`open`]),
//! as the other streams are; churned and storm members connect during the run, on this
//! thread, with a blocking connect (a localhost connect is tens of µs).

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::rooms::{encode_query_value, PrefixTemplate};
use crate::sse::{find, open as open_stream, Window};

/// What the presence mix does: `--presence-*`.
#[derive(Debug, Clone)]
pub struct PresencePlan {
    /// Member `n` and watcher `i` are in the room this gives for `n` (`i`).
    pub rooms: PrefixTemplate,
    /// Members held present (`--presence-members`).
    pub members: usize,
    /// Members a second that leave and are replaced (`--presence-churn`).
    pub churn_per_s: f64,
    /// Members that join at once at the start of the window (`--presence-storm`).
    pub storm: usize,
    /// Streams of the rooms' presence without `member=` (`--presence-watchers`).
    pub watchers: usize,
}

impl PresencePlan {
    /// What the presence mix of `args` does (nothing when no `--presence-*`
    /// asks for it).
    pub(crate) fn of(args: &crate::args::LoadArgs) -> PresencePlan {
        PresencePlan {
            rooms: args.presence_template(),
            members: args.presence_members,
            churn_per_s: args.presence_churn,
            storm: args.presence_storm,
            watchers: args.presence_watchers,
        }
    }

    /// Whether there is anything to do.
    pub fn active(&self) -> bool {
        self.members > 0 || self.storm > 0 || self.watchers > 0
    }

    /// The distinct rooms of the run: those of the held members, the storm's and the
    /// watchers', in order of first use.
    fn room_names(&self) -> Vec<String> {
        let mut seen = BTreeMap::new();
        let mut names = Vec::new();
        let used = (0..self.members + self.storm).chain(0..self.watchers);
        for i in used {
            let room = self.rooms.render(i);
            if !seen.contains_key(&room) {
                seen.insert(room.clone(), names.len());
                names.push(room);
            }
        }
        names
    }
}

/// The streams of the held members and the watchers, their requests written.
pub struct Opened {
    members: Vec<std::net::TcpStream>,
    watchers: Vec<std::net::TcpStream>,
}

/// The request line (to the path) of member `id` of `room`:
/// `GET /v1/boxes/<room>~presence?member=m-<id>`.
fn member_path(room: &str, id: u64) -> Vec<u8> {
    let mut path = watcher_path(room);
    path.extend_from_slice(b"?member=m-");
    path.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    path
}

/// The request line (to the path) of a watcher of `room`: `GET /v1/boxes/<room>~presence`.
fn watcher_path(room: &str) -> Vec<u8> {
    let mut path = b"GET /v1/boxes/".to_vec();
    encode_query_value(room, &mut path);
    path.extend_from_slice(b"~presence");
    path
}

/// Connect the held members (`m-0` .. `m-<members-1>`) and the watchers, before the
/// clock starts.
pub fn open(addr: SocketAddr, host: &str, plan: &PresencePlan) -> io::Result<Opened> {
    let mut members = Vec::with_capacity(plan.members);
    for n in 0..plan.members {
        let path = member_path(&plan.rooms.render(n), n as u64);
        members.push(open_stream(addr, host, &path)?);
    }
    let mut watchers = Vec::with_capacity(plan.watchers);
    for i in 0..plan.watchers {
        watchers.push(open_stream(
            addr,
            host,
            &watcher_path(&plan.rooms.render(i)),
        )?);
    }
    Ok(Opened { members, watchers })
}

/// What the presence mix saw.
#[derive(Debug, Clone, Default)]
pub struct PresenceStats {
    /// Member streams answered 200 (joined) in the measured window.
    pub joins: u64,
    /// Member streams the generator closed (churn) in the measured window.
    pub leaves: u64,
    /// Member streams refused (not a 200 event stream), failed to connect, or broken.
    pub member_errors: u64,
    /// Refused member streams by status, `connect` (a failed connect), `no_answer`
    /// (closed before its head) or `closed` (after it).
    pub refused: BTreeMap<String, u64>,
    /// Bytes the members' streams received in the measured window, all members.
    pub member_bytes: u64,
    /// Members open (answered 200, not closed) at the end.
    pub members_open: u64,
    /// Watchers refused or broken.
    pub watcher_errors: u64,
    /// Each watcher: events and bytes received in the measured window (head excluded),
    /// the last `count` seen (none before its first event), and its room's index.
    pub watchers: Vec<WatcherStats>,
    /// Rooms by index, and the bytes of each one's full member list at the end.
    pub rooms: Vec<String>,
    pub member_list_bytes: Vec<u64>,
    /// The storm, if there was one.
    pub storm: Option<StormStats>,
}

/// One watcher's counts.
#[derive(Debug, Clone, Default)]
pub struct WatcherStats {
    pub room: usize,
    pub events: u64,
    pub bytes: u64,
    pub last_count: Option<u64>,
    /// Version of its last event (a newer event replaces the last count).
    pub(crate) last_version: u64,
}

/// How a storm went, in ns from its start.
#[derive(Debug, Clone, Default)]
pub struct StormStats {
    pub members: usize,
    /// Every storm member's request written.
    pub opened_ns: u64,
    /// Every storm member answered 200 (none if some were refused).
    pub joined_ns: Option<u64>,
    /// Every watcher of a storm room saw a count of at least the members the run
    /// holds open there, once every storm member had joined (none if never, or no
    /// watcher).
    pub seen_ns: Option<u64>,
    /// Storm members refused or not connected.
    pub errors: u64,
}

/// What a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Watcher(usize),
    /// A member: its id, its room, and its churn slot (none for a storm member).
    Member {
        id: u64,
        room: usize,
        slot: Option<usize>,
    },
}

/// An open stream (a closed one leaves the table, its token free for the next).
struct Conn {
    stream: TcpStream,
    kind: Kind,
    /// What is read and not yet taken: the head, then a watcher's events.
    buf: Vec<u8>,
    head_done: bool,
    /// Answered 200: a member that joined.
    joined: bool,
}

/// Churns done in one turn of the loop at most, so reads go on at any rate.
const MAX_CHURN_A_TURN: u64 = 256;

/// The presence thread's state.
struct Mix<'a> {
    addr: SocketAddr,
    host: &'a str,
    plan: &'a PresencePlan,
    poll: Poll,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// The token of each churn slot's member.
    slots: Vec<usize>,
    room_index: BTreeMap<String, usize>,
    /// Members joined and open, by room.
    room_open: Vec<u64>,
    next_id: u64,
    stats: PresenceStats,
    /// Storm: when it started (ns since origin), its rooms, its members joined so far.
    storm_start: Option<u64>,
    storm_rooms: Vec<usize>,
    storm_joined: usize,
}

/// Read the presence streams through `window`, churning and storming as `plan` says.
pub fn drive(
    addr: SocketAddr,
    host: &str,
    plan: &PresencePlan,
    opened: Opened,
    window: Window,
) -> io::Result<PresenceStats> {
    let Window {
        origin,
        warmup_ns,
        end_ns,
    } = window;
    let rooms = plan.room_names();
    let mut mix = Mix {
        addr,
        host,
        plan,
        poll: Poll::new()?,
        conns: Vec::new(),
        free: Vec::new(),
        slots: Vec::with_capacity(plan.members),
        room_index: rooms
            .iter()
            .enumerate()
            .map(|(i, r)| (r.clone(), i))
            .collect(),
        room_open: vec![0; rooms.len()],
        next_id: plan.members as u64,
        stats: PresenceStats {
            rooms,
            watchers: Vec::with_capacity(plan.watchers),
            ..PresenceStats::default()
        },
        storm_start: None,
        storm_rooms: Vec::new(),
        storm_joined: 0,
    };
    for (n, stream) in opened.members.into_iter().enumerate() {
        let kind = Kind::Member {
            id: n as u64,
            room: mix.room_of(n),
            slot: Some(n),
        };
        let token = mix.add(TcpStream::from_std(stream), kind)?;
        mix.slots.push(token);
    }
    for (i, stream) in opened.watchers.into_iter().enumerate() {
        let room = mix.room_of(i);
        mix.stats.watchers.push(WatcherStats {
            room,
            ..WatcherStats::default()
        });
        mix.add(TcpStream::from_std(stream), Kind::Watcher(i))?;
    }

    let now_ns = || origin.elapsed().as_nanos() as u64;
    let mut events = Events::with_capacity(1024);
    let mut tmp = vec![0u8; 64 * 1024];
    let mut churned = 0u64;
    loop {
        let now = now_ns();
        if now >= end_ns {
            break;
        }
        if plan.storm > 0 && mix.storm_start.is_none() && now >= warmup_ns {
            mix.storm(now_ns);
        }
        if plan.churn_per_s > 0.0 && plan.members > 0 {
            let due = (now as f64 * plan.churn_per_s / 1e9) as u64;
            let until = due.min(churned + MAX_CHURN_A_TURN);
            while churned < until {
                let measured = now >= warmup_ns;
                mix.churn((churned % plan.members as u64) as usize, measured);
                churned += 1;
            }
        }
        let timeout = Duration::from_millis(1).min(Duration::from_nanos(end_ns - now));
        mix.poll.poll(&mut events, Some(timeout))?;
        let mut watcher_saw = false;
        for ev in events.iter() {
            let token = ev.token().0;
            let received = now_ns();
            let measured = received >= warmup_ns && received <= end_ns;
            watcher_saw |= mix.read(token, &mut tmp, received, measured);
        }
        if watcher_saw {
            mix.check_seen(now_ns());
        }
    }
    Ok(mix.finish())
}

impl Mix<'_> {
    /// The index of the room the template gives for `i`.
    fn room_of(&self, i: usize) -> usize {
        let room = self.plan.rooms.render(i);
        // Every room used is indexed up front; a new one (never) goes last.
        self.room_index
            .get(&room)
            .copied()
            .unwrap_or(self.room_index.len())
    }

    /// Register `stream` and give it a token.
    fn add(&mut self, mut stream: TcpStream, kind: Kind) -> io::Result<usize> {
        let token = self.free.pop().unwrap_or(self.conns.len());
        self.poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)?;
        let conn = Conn {
            stream,
            kind,
            buf: Vec::new(),
            head_done: false,
            joined: false,
        };
        if token == self.conns.len() {
            self.conns.push(Some(conn));
        } else {
            self.conns[token] = Some(conn);
        }
        Ok(token)
    }

    /// Connect member `id` of room `room` (index); a failed connect is counted, and
    /// gives no token.
    fn connect_member(&mut self, id: u64, room: usize, slot: Option<usize>) -> Option<usize> {
        let name = self.stats.rooms.get(room).cloned().unwrap_or_default();
        let stream = match open_stream(self.addr, self.host, &member_path(&name, id)) {
            Ok(s) => s,
            Err(_) => {
                self.refuse("connect");
                return None;
            }
        };
        match self.add(TcpStream::from_std(stream), Kind::Member { id, room, slot }) {
            Ok(token) => Some(token),
            Err(_) => {
                self.refuse("connect");
                None
            }
        }
    }

    fn refuse(&mut self, why: &str) {
        self.stats.member_errors += 1;
        *self.stats.refused.entry(why.to_string()).or_default() += 1;
    }

    /// The storm: every storm member connects now.
    fn storm(&mut self, now_ns: impl Fn() -> u64) {
        let start = now_ns();
        self.storm_start = Some(start);
        let mut errors = 0;
        for n in self.plan.members..self.plan.members + self.plan.storm {
            let id = self.next_id;
            self.next_id += 1;
            let room = self.room_of(n);
            self.storm_rooms.push(room);
            if self.connect_member(id, room, None).is_none() {
                errors += 1;
            }
        }
        self.stats.storm = Some(StormStats {
            members: self.plan.storm,
            opened_ns: now_ns().saturating_sub(start),
            errors,
            ..StormStats::default()
        });
        self.storm_rooms.sort_unstable();
        self.storm_rooms.dedup();
    }

    /// Churn slot `slot`: its member closes, and the next id opens in its room.
    fn churn(&mut self, slot: usize, measured: bool) {
        let Some(&token) = self.slots.get(slot) else {
            return;
        };
        let held = match self.conns.get(token) {
            Some(Some(conn)) => match conn.kind {
                Kind::Member {
                    room,
                    slot: Some(s),
                    ..
                } if s == slot => Some(room),
                _ => None,
            },
            _ => None,
        };
        // Its stream failed (and its token may serve another since): only open anew.
        let room = held.unwrap_or_else(|| self.room_of(slot));
        if held.is_some() && self.close(token) && measured {
            self.stats.leaves += 1;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Some(new) = self.connect_member(id, room, Some(slot)) {
            if let Some(s) = self.slots.get_mut(slot) {
                *s = new;
            }
        } else if let Some(s) = self.slots.get_mut(slot) {
            // No stream in this slot until the next churn of it.
            *s = usize::MAX;
        }
    }

    /// Close the stream of `token`. Returns whether it was a joined member's.
    fn close(&mut self, token: usize) -> bool {
        let Some(Some(mut conn)) = self.conns.get_mut(token).map(Option::take) else {
            return false;
        };
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.free.push(token);
        let left = conn.joined;
        if let (true, Kind::Member { room, .. }) = (left, conn.kind) {
            if let Some(n) = self.room_open.get_mut(room) {
                *n = n.saturating_sub(1);
            }
        }
        left
    }

    /// Read what `token`'s stream has: a head (a member joined, or a stream was
    /// refused), a watcher's events, or the end of the stream. Returns whether a
    /// watcher got an event.
    fn read(&mut self, token: usize, tmp: &mut [u8], received: u64, measured: bool) -> bool {
        let Some(Some(conn)) = self.conns.get_mut(token) else {
            return false;
        };
        let watcher = matches!(conn.kind, Kind::Watcher(_));
        // Bytes after the head; those read with the head are counted below.
        let mut bytes = 0u64;
        let mut broke = false;
        loop {
            match conn.stream.read(tmp) {
                Ok(0) => {
                    broke = true;
                    break;
                }
                Ok(n) => {
                    if conn.head_done {
                        bytes += n as u64;
                    }
                    // A member's events are not looked at, only its head.
                    if watcher || !conn.head_done {
                        conn.buf.extend_from_slice(&tmp[..n]);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    broke = true;
                    break;
                }
            }
        }
        let mut joined = false;
        if !conn.head_done {
            if let Some(end) = find(&conn.buf, b"\r\n\r\n") {
                let ok = conn.buf.starts_with(b"HTTP/1.1 200")
                    && find(&conn.buf[..end], b"text/event-stream").is_some();
                if !ok {
                    let status = status_of(&conn.buf);
                    let kind = conn.kind;
                    self.close(token);
                    self.refused(kind, &status);
                    return false;
                }
                conn.head_done = true;
                conn.joined = !watcher;
                joined = !watcher;
                bytes += (conn.buf.len() - end - 4) as u64;
                conn.buf.drain(..end + 4);
            }
        }
        let kind = conn.kind;
        let mut saw = false;
        match kind {
            Kind::Watcher(w) => {
                if let Some(stats) = self.stats.watchers.get_mut(w) {
                    if measured {
                        stats.bytes += bytes;
                    }
                    saw = watcher_events(&mut conn.buf, stats, measured);
                }
            }
            Kind::Member { .. } => {
                if conn.head_done {
                    conn.buf = Vec::new();
                }
                if measured {
                    self.stats.member_bytes += bytes;
                }
            }
        }
        if joined {
            self.joined(kind, received, measured);
        }
        if broke {
            let (was_open, answered) = match self.conns.get(token) {
                Some(Some(c)) => (true, c.head_done),
                _ => (false, false),
            };
            self.close(token);
            if was_open {
                match kind {
                    Kind::Watcher(_) => self.stats.watcher_errors += 1,
                    Kind::Member { .. } if answered => self.refuse("closed"),
                    Kind::Member { .. } => self.refuse("no_answer"),
                }
            }
        }
        saw
    }

    /// A member's stream was answered 200: it is in its room.
    fn joined(&mut self, kind: Kind, received: u64, measured: bool) {
        let Kind::Member { room, slot, .. } = kind else {
            return;
        };
        if measured {
            self.stats.joins += 1;
        }
        if let Some(n) = self.room_open.get_mut(room) {
            *n += 1;
        }
        if slot.is_none() {
            self.storm_joined += 1;
            if let (Some(start), Some(storm)) = (self.storm_start, self.stats.storm.as_mut()) {
                if self.storm_joined == storm.members {
                    storm.joined_ns = Some(received.saturating_sub(start));
                }
            }
        }
    }

    /// A stream was answered with something other than an event stream.
    fn refused(&mut self, kind: Kind, status: &str) {
        match kind {
            Kind::Watcher(_) => self.stats.watcher_errors += 1,
            Kind::Member { slot, .. } => {
                self.refuse(status);
                if let (None, Some(storm)) = (slot, self.stats.storm.as_mut()) {
                    storm.errors += 1;
                }
            }
        }
    }

    /// Once every storm member joined: whether every watcher of a storm room has seen
    /// a count that includes all members open there; the first time, the storm is seen.
    fn check_seen(&mut self, now: u64) {
        let (Some(start), Some(storm)) = (self.storm_start, self.stats.storm.as_mut()) else {
            return;
        };
        if storm.seen_ns.is_some() || storm.joined_ns.is_none() {
            return;
        }
        let mut watched = false;
        for w in &self.stats.watchers {
            if self.storm_rooms.binary_search(&w.room).is_err() {
                continue;
            }
            watched = true;
            let open = self.room_open.get(w.room).copied().unwrap_or(0);
            if w.last_count.unwrap_or(0) < open {
                return;
            }
        }
        if watched {
            storm.seen_ns = Some(now.saturating_sub(start));
        }
    }

    /// The counts, with each room's member list as it would be listed at the end.
    fn finish(mut self) -> PresenceStats {
        let mut ids: Vec<Vec<u64>> = vec![Vec::new(); self.stats.rooms.len()];
        for conn in self.conns.iter().flatten() {
            if let (true, Kind::Member { id, room, .. }) = (conn.joined, conn.kind) {
                if let Some(room) = ids.get_mut(room) {
                    room.push(id);
                }
            }
        }
        self.stats.members_open = ids.iter().map(|r| r.len() as u64).sum();
        self.stats.member_list_bytes = ids.iter().map(|r| member_list_bytes(r)).collect();
        self.stats
    }
}

/// The bytes of the member list `[{"id":"m-<id>"},...]` of members `ids` without
/// info, as the server writes it.
fn member_list_bytes(ids: &[u64]) -> u64 {
    // {"id":"m-"} around each id's digits, a comma between two, the brackets.
    let entries: u64 = ids
        .iter()
        .map(|&id| 11 + itoa::Buffer::new().format(id).len() as u64)
        .sum();
    2 + entries + (ids.len() as u64).saturating_sub(1)
}

/// Take a watcher's complete events out of `buf`: each `data:` event counts (in the
/// window), and its `count` is the last seen when its version is newer. Returns
/// whether there was one.
fn watcher_events(buf: &mut Vec<u8>, stats: &mut WatcherStats, measured: bool) -> bool {
    let mut start = 0;
    let mut saw = false;
    while let Some(end) = find(&buf[start..], b"\n\n") {
        let block = &buf[start..start + end];
        start += end + 2;
        let Some(data) = block
            .split(|&b| b == b'\n')
            .find_map(|l| l.strip_prefix(b"data: "))
        else {
            // `retry:` and heartbeats.
            continue;
        };
        saw = true;
        if measured {
            stats.events += 1;
        }
        if let (Some(version), Some(count)) =
            (number_of(data, b"\"ver\":"), number_of(data, b"\"count\":"))
        {
            if version >= stats.last_version {
                stats.last_version = version;
                stats.last_count = Some(count);
            }
        }
    }
    buf.drain(..start);
    saw
}

/// The whole number after `field` in a payload (`"count":12` gives 12).
fn number_of(payload: &[u8], field: &[u8]) -> Option<u64> {
    let at = find(payload, field)? + field.len();
    let digits = payload[at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    std::str::from_utf8(&payload[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// The status code of a head, as text (`other` if it has none).
fn status_of(head: &[u8]) -> String {
    head.get(9..12)
        .and_then(|s| std::str::from_utf8(s).ok())
        .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        .unwrap_or("other")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rooms: &str, members: usize, storm: usize, watchers: usize) -> PresencePlan {
        PresencePlan {
            rooms: PrefixTemplate::parse(rooms).unwrap(),
            members,
            churn_per_s: 0.0,
            storm,
            watchers,
        }
    }

    #[test]
    fn requests_name_the_rooms_presence_and_the_member() {
        assert_eq!(
            member_path("room-3/", 17),
            b"GET /v1/boxes/room-3/~presence?member=m-17"
        );
        assert_eq!(watcher_path("t:1:"), b"GET /v1/boxes/t:1:~presence");
        assert_eq!(watcher_path(""), b"GET /v1/boxes/~presence", "the node's");
        assert_eq!(watcher_path("a b/"), b"GET /v1/boxes/a%20b/~presence");
    }

    #[test]
    fn rooms_are_those_of_members_storm_and_watchers() {
        assert_eq!(plan("room-0/", 10, 5, 3).room_names(), ["room-0/"]);
        assert_eq!(
            plan("room-{i%3}/", 2, 0, 0).room_names(),
            ["room-0/", "room-1/"]
        );
        // Storm members come after the held ones; watchers from 0.
        assert_eq!(plan("r{i}/", 1, 1, 3).room_names(), ["r0/", "r1/", "r2/"]);
        assert!(!plan("r/", 0, 0, 0).active());
        assert!(plan("r/", 0, 1, 0).active());
    }

    #[test]
    fn member_lists_are_counted_as_the_server_writes_them() {
        let ids = [0u64, 7, 12, 1234];
        let list: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| serde_json::json!({ "id": format!("m-{id}") }))
            .collect();
        let written = serde_json::to_string(&list).unwrap();
        assert_eq!(member_list_bytes(&ids), written.len() as u64);
        assert_eq!(member_list_bytes(&[]), 2, "[]");
    }

    #[test]
    fn watchers_count_events_and_keep_the_newest_count() {
        let mut stats = WatcherStats::default();
        let mut buf = b"retry: 1000\n\nid: 5\ndata: {\"k\":\"r/~presence\",\"ver\":5,\"count\":2,\"members\":[{\"id\":\"a\"},{\"id\":\"b\"}]}\n\n: heartbeat\n\nid: 9\ndata: {\"k\":\"r/~presence\",\"ver\":9,\"count\":140}\n\nid: 10\ndata: {\"k\":\"r/~pre".to_vec();
        assert!(watcher_events(&mut buf, &mut stats, true));
        assert_eq!((stats.events, stats.last_count), (2, Some(140)));
        assert!(buf.starts_with(b"id: 10"), "the partial event is kept");
        buf.extend_from_slice(b"sence\",\"ver\":10,\"count\":141}\n\n");
        assert!(watcher_events(&mut buf, &mut stats, false));
        assert_eq!(stats.events, 2, "outside the window: not counted");
        assert_eq!(
            stats.last_count,
            Some(141),
            "but its count is the last seen"
        );
        assert!(buf.is_empty());
        // An older version (never sent, but) does not replace the count.
        let mut old = b"data: {\"ver\":3,\"count\":1}\n\n".to_vec();
        assert!(watcher_events(&mut old, &mut stats, true));
        assert_eq!((stats.events, stats.last_count), (3, Some(141)));
        assert!(!watcher_events(&mut b": hb\n\n".to_vec(), &mut stats, true));
    }

    #[test]
    fn numbers_and_statuses_are_read_or_none() {
        assert_eq!(
            number_of(br#"{"ver":12,"count":3}"#, b"\"count\":"),
            Some(3)
        );
        assert_eq!(number_of(br#"{"ver":12}"#, b"\"count\":"), None);
        assert_eq!(number_of(br#"{"count":x}"#, b"\"count\":"), None);
        assert_eq!(status_of(b"HTTP/1.1 503 Service Unavailable\r\n"), "503");
        assert_eq!(status_of(b"HTTP/1.1 4"), "other");
        assert_eq!(status_of(b"garbage here\r\n"), "other");
    }
}
