//! Rooms (docs/http.md#rooms): every box under a prefix. A page
//! (`GET /v1/boxes?prefix=P&limit=N&cursor=C`) walks the table's keys in
//! order ([`crate::boxes::KeyOrder`]); an event stream of the prefix lists the
//! boxes there in the same steps, then sends every box under it that moves;
//! a long-poll (`?prefix=P&after=W&wait_ms=N`) answers what moved past a
//! watermark.
//!
//! The watermark is a **cut** of the table's lanes (docs/boxes.md#watermarks):
//! a client at a cut holds every box under its prefix as of that cut, and
//! what moved since is what is marked past it. Nothing marked past the cut
//! the answer stands at is sent (it waits for the next cut), so an id or an
//! `after` never names less than what the client was given, and a reconnect
//! is sent exactly what moved since.
//!
//! A page copies at most `limit + 1` keys out of the key order under one of
//! its mutexes (the one bounded step a creation can wait behind), then reads
//! each box as a poll does, locking nothing.

use super::cursor::{
    parked_cut, parked_key, parked_prefix, read_hex, read_watermark, write_hex, write_next_after,
    write_watermark,
};
use super::pages::Paging;
use super::{Exchange, Park, Reply, RouteLabel, Service, Stream, Target};
use crate::auth::Need;
use crate::boxes::{is_prefix, past, MarkedKeys};
use crate::http::{percent_decode_into, ManyQuery, Method};
use crate::render::write_json_str;
use crate::service::{Answer, Host, ManyKeys};

/// Boxes a page holds without `limit=`.
pub const DEFAULT_PAGE: usize = 100;
/// Keys a prefix stream lists in one step (its listing), before it lets the
/// worker go on.
pub const LIST_STEP: usize = 64;
/// Steps a prefix stream's listing takes in one call while they find nothing
/// to send (a resumed room where little moved): at most this many keys'
/// worth of work before the worker serves others; the next steps come at
/// its next turn ([`RoomWatch::lists_on`]).
pub const QUIET_LIST_STEPS: usize = 16;
/// Keys a long-poll of a prefix looks at under one hold of a mutex of the
/// key order.
const SCAN_STEP: usize = 1024;
/// What a prefix stream keeps between events (docs/http.md#rooms): where its
/// listing stands, and the keys under the prefix that moved while its queue
/// was not empty or past the cut (sent, each at its newest, later).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoomWatch {
    /// The listing goes on after this key (`Some(empty)`: from the start);
    /// `None`: listed, `event: synced` sent.
    pub listing: Option<Box<[u8]>>,
    /// A listing of what moved since this cut (a reconnect whose
    /// `Last-Event-ID` is honored); `None`: of every box.
    pub since: Option<Box<[u64]>>,
    /// The cut the client holds the listed keys at (the last one this
    /// stream sent at, or the one it resumed from): a key that moved but is
    /// marked at or below it was sent already (a wake-up can come after the
    /// change it tells of was sent with a later one).
    pub held: Option<Box<[u64]>>,
    /// The keys that moved, as [`ManyKeys`] encodes them, each once.
    pub moved: Vec<u8>,
    /// Too many moved while the client did not read: list the room again
    /// instead (each box at its newest), after `event: reset`.
    pub relist: bool,
    /// `event: synced` was sent for the last listing: the listing is done
    /// and nothing it found waits for a later cut.
    pub synced: bool,
    /// Its last look found something marked past its cut: the server looks
    /// again with a new one (at the next tick, if no wake-up comes first).
    pub waits_cut: bool,
}

/// Keys a prefix stream remembers as moved before it lists the room again
/// instead (bounds what a client that does not read costs).
pub const MOVED_CAP: usize = 1024;

impl RoomWatch {
    /// A key under the prefix moved: remember it, unless the listing has
    /// not reached it yet (the listing sends it as it is then).
    pub fn moved(&mut self, key: &[u8]) {
        if let Some(after) = &self.listing {
            if after.is_empty() || key > &after[..] {
                return;
            }
        }
        self.remember(key);
    }

    /// A key marked past the cut: a key that moved waits in `moved`
    /// (`Some(0)`: nothing sent); a listing waits for the next cut (`None`).
    fn later(&mut self, key: &[u8], listed: Option<u64>) -> Option<usize> {
        self.waits_cut = true;
        if listed.is_some() {
            return None;
        }
        self.remember(key);
        Some(0)
    }

    fn remember(&mut self, key: &[u8]) {
        if self.relist || ManyKeys(&self.moved).any(|k| k == key) {
            return;
        }
        if ManyKeys(&self.moved).count() >= MOVED_CAP {
            self.moved = Vec::new();
            self.relist = true;
            return;
        }
        self.moved
            .extend_from_slice(&(key.len().min(u16::MAX as usize) as u16).to_le_bytes());
        self.moved.extend_from_slice(key);
    }

    /// Whether it has something to send (or to look at again) once the
    /// queue is empty.
    pub fn pending(&self) -> bool {
        self.listing.is_some() || !self.synced || self.relist || !self.moved.is_empty()
    }

    /// Whether its listing goes on at once (it does not wait for a later
    /// cut): the server gives it its next step at its next turn if the last
    /// one queued nothing (no drain of the queue will bring it).
    pub fn lists_on(&self) -> bool {
        self.listing.is_some() && !self.waits_cut
    }

    /// Heap bytes it holds.
    pub fn heap_bytes(&self) -> usize {
        self.moved.capacity()
            + self.listing.as_ref().map_or(0, |l| l.len())
            + self.since.as_ref().map_or(0, |s| s.len() * 8)
            + self.held.as_ref().map_or(0, |s| s.len() * 8)
    }
}

/// What a look at the keys of a room moved past a cut found.
#[derive(Default)]
struct Moved {
    /// The boxes' payloads, comma-separated.
    boxes: Vec<u8>,
    /// The removed keys, as JSON strings, comma-separated.
    deleted: Vec<u8>,
    found: usize,
    /// Where a next page goes on (the last key looked at).
    next: Option<Vec<u8>>,
}

impl Service {
    /// The cut a page or a long-poll stands at: read now (it reads the
    /// boxes themselves, not the wake-ups, so any published cut will do, and
    /// the newest misses least).
    fn walk_cut(&mut self) {
        self.node.boxes.lanes().cut(&mut self.walk_cut);
    }

    /// The cut a stream stands at: the server's, taken before the wake-ups
    /// it has taken; else (one thread) read now.
    fn room_cut<H: Host>(&mut self, host: &H) {
        if !host.takes_cuts() || self.cut.len() != self.node.boxes.lanes().count() {
            self.node.boxes.lanes().cut(&mut self.cut);
        }
    }

    /// `GET /v1/boxes?prefix=P...`: a page, a long-poll, or an event stream
    /// of the prefix.
    pub(super) fn poll_prefix<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        q: &ManyQuery<'_>,
        raw: &[u8],
    ) -> Reply {
        let (frame, buf) = (x.frame, x.buf);
        if !self.node.plan.rooms {
            return self.error(
                x,
                RouteLabel::Page,
                404,
                "rooms are off (boxes.rooms = false)",
            );
        }
        self.key.clear();
        if percent_decode_into(raw, &mut self.key).is_err() {
            return self.error(x, RouteLabel::Page, 400, "bad percent-encoding in prefix");
        }
        if std::str::from_utf8(&self.key).is_err() {
            return self.error(x, RouteLabel::Page, 400, "prefix is not valid UTF-8");
        }
        if !is_prefix(&self.key) {
            return self.error(
                x,
                RouteLabel::Page,
                400,
                "a prefix is empty or ends with a separator (/, : or .): room-17/",
            );
        }
        if self.key.len() > self.node.config.boxes.max_key_bytes {
            return self.error(
                x,
                RouteLabel::Page,
                400,
                "prefix is longer than a key may be",
            );
        }
        let stream = frame.method == Method::Get && super::wants_event_stream(frame, buf);
        let route = if stream {
            RouteLabel::PrefixStream
        } else {
            RouteLabel::Page
        };
        if self.access.reads_need_token {
            if let Err(r) = self.check_access(x, route, Need::Read, Target::Prefix) {
                return r;
            }
        }
        // `member=`: a stream or long-poll of the room that is a presence
        // connection (docs/presence.md).
        let pq = match super::parse_presence_query(&buf[frame.query.clone()]) {
            Ok(pq) => pq,
            Err(what) => return self.error(x, route, 400, what),
        };
        if pq.member.is_some() || pq.info.is_some() {
            let held = stream || (q.after.is_some() && q.wait_ms.is_some_and(|w| w > 0));
            let room = self.key.clone();
            if let Err(r) = self.join_presence(x, route, &room, &pq, held) {
                return r;
            }
        }
        if stream {
            let id = super::many::resume_id(frame, buf, q.last_event_id);
            return self.subscribe_prefix(x, id.as_deref());
        }
        let max = self.node.config.limits.max_page_boxes;
        let limit = match q.limit {
            None => DEFAULT_PAGE.min(max),
            Some(0) => return self.error(x, route, 400, "limit must be at least 1"),
            Some(n) => (n as usize).min(max),
        };
        // Both may come percent-encoded (a client encodes what it puts in a
        // query: the watermark's commas).
        let decoded = |raw: &[u8]| {
            let mut v = Vec::new();
            percent_decode_into(raw, &mut v).ok().map(|()| v)
        };
        let cursor = match q.cursor.map(|c| decoded(c).as_deref().and_then(read_hex)) {
            None => None,
            Some(Some(key)) => Some(key),
            Some(None) => return self.error(x, route, 400, "cursor is not one a page gave"),
        };
        let since = match q.after.map(decoded) {
            None => None,
            Some(raw) => match raw.as_deref().and_then(read_watermark) {
                Some(w) => Some(w),
                None => return self.error(x, route, 400, "after is not a watermark pollbox gave"),
            },
        };
        self.walk_cut();
        let after = cursor;
        let asked = since.is_some();
        let honored = since.filter(|(run, cut)| self.node.boxes.lanes().honors(*run, cut));
        match (asked, honored) {
            (true, Some((_, since))) => {
                let moved = self.moved_since(&since, after.as_deref(), limit);
                let wait = q
                    .wait_ms
                    .unwrap_or(0)
                    .min(self.node.config.limits.max_wait_ms);
                if moved.found == 0 && moved.next.is_none() && wait > 0 {
                    return Reply::Park {
                        park: Park {
                            after: 0,
                            wait_ms: wait,
                            existed: false,
                            many: false,
                            room: true,
                        },
                        key: parked_key(&self.key, &since),
                    };
                }
                self.write_moved(x, moved, RouteLabel::LongPoll, false)
            }
            // A watermark of another run, or from before removals no longer
            // kept: the whole room again, as a reset.
            (true, None) => self.write_page(x, after.as_deref(), limit, true),
            (false, _) => {
                self.walk_cut();
                let page = Paging::new(&self.key, after, limit, &self.walk_cut);
                Reply::Page(Box::new(page))
            }
        }
    }

    /// Answer one page: `{"boxes":[...],"next":"..."|null,"after":"W"}`
    /// (and `"reset":true` in place of a long-poll whose watermark is not
    /// honored).
    fn write_page<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        after: Option<&[u8]>,
        limit: usize,
        reset: bool,
    ) -> Reply {
        self.walk_cut();
        self.scratch.clear();
        let boxes = &self.node.boxes;
        let (_, more) = boxes
            .order()
            .page(&self.key, after, limit, &mut self.scratch);
        self.body.clear();
        self.body.extend_from_slice(b"{\"boxes\":[");
        let (mut last, mut first): (Option<&[u8]>, bool) = (None, true);
        for key in ManyKeys(&self.scratch) {
            let mark = self.body.len();
            if !first {
                self.body.push(b',');
            }
            // Gone since the keys were copied: not in the page (a box that
            // lived through the walk is never missing).
            if boxes.poll(key, &mut self.body).is_some() {
                first = false;
            } else {
                self.body.truncate(mark);
            }
            last = Some(key);
        }
        let next = last.filter(|_| more);
        write_next_after(next, boxes.lanes().run(), &self.walk_cut, &mut self.body);
        if reset {
            self.body.extend_from_slice(b",\"reset\":true");
        }
        self.body.push(b'}');
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            ..x.json(
                if reset {
                    RouteLabel::LongPoll
                } else {
                    RouteLabel::Page
                },
                200,
            )
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// What moved under the prefix in `self.key` past `since` and not past
    /// the cut, from `after` on, at most `limit` entries (a box, or a
    /// removed key).
    fn moved_since(&mut self, since: &[u64], after: Option<&[u8]>, limit: usize) -> Moved {
        let mut m = Moved::default();
        let mut from: Option<Vec<u8>> = after.map(<[u8]>::to_vec);
        loop {
            self.scratch.clear();
            let (_, more) = self.node.boxes.order().page_marked(
                &self.key,
                from.as_deref(),
                SCAN_STEP,
                &mut self.scratch,
            );
            let keys = std::mem::take(&mut self.scratch);
            let mut last = None;
            for (key, tomb) in MarkedKeys(&keys) {
                let at = m.boxes.len();
                let hit = if tomb != 0 {
                    past(tomb, since) && !past(tomb, &self.walk_cut)
                } else {
                    if !m.boxes.is_empty() {
                        m.boxes.push(b',');
                    }
                    let hit = matches!(
                        self.node.boxes.poll_marked(key, &mut m.boxes),
                        Some((_, mark)) if past(mark, since) && !past(mark, &self.walk_cut)
                    );
                    if !hit {
                        m.boxes.truncate(at);
                    }
                    hit
                };
                if hit && m.found == limit {
                    // A page of what moved ends at the last key it looked
                    // at before this one: `next` goes on from there.
                    m.boxes.truncate(at);
                    m.next = last.map(<[u8]>::to_vec).or_else(|| from.clone());
                    break;
                }
                if hit {
                    m.found += 1;
                    if tomb != 0 {
                        if !m.deleted.is_empty() {
                            m.deleted.push(b',');
                        }
                        write_json_str(
                            std::str::from_utf8(key).unwrap_or_default(),
                            &mut m.deleted,
                        );
                    }
                }
                last = Some(key);
            }
            let next = m.next.is_some();
            let last = last.map(<[u8]>::to_vec);
            self.scratch = keys;
            if next || !more {
                // A page of what moved ends at its last entry, not at the
                // key after it: `next` names the last one given.
                return m;
            }
            from = last;
        }
    }

    /// Answer what moved: `{"boxes":[...],"deleted":[...],"next":..,"after":"W"}`,
    /// or 304 when nothing did (`not_modified`).
    fn write_moved<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        m: Moved,
        route: RouteLabel,
        not_modified: bool,
    ) -> Reply {
        self.body.clear();
        self.body.extend_from_slice(b"{\"boxes\":[");
        self.body.extend_from_slice(&m.boxes);
        self.body.extend_from_slice(b"],\"deleted\":[");
        self.body.extend_from_slice(&m.deleted);
        self.body.extend_from_slice(b"],\"next\":");
        match &m.next {
            Some(key) => {
                self.body.push(b'"');
                write_hex(key, &mut self.body);
                self.body.push(b'"');
            }
            None => self.body.extend_from_slice(b"null"),
        }
        self.body.extend_from_slice(b",\"after\":\"");
        write_watermark(
            self.node.boxes.lanes().run(),
            &self.walk_cut,
            &mut self.body,
        );
        self.body.extend_from_slice(b"\"}");
        let a = Answer {
            head_only: x.frame.method == Method::Head || not_modified,
            ..x.json(route, if not_modified { 304 } else { 200 })
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// Whether a parked long-poll of a prefix (its key: [`parked_key`]) has
    /// something to answer: a box or a removal under it past its cut and
    /// not past the cut now.
    pub(super) fn room_due(&mut self, key: &[u8]) -> bool {
        let prefix = parked_prefix(key);
        let since = parked_cut(key);
        self.key.clear();
        self.key.extend_from_slice(prefix);
        self.walk_cut();
        self.moved_since(&since, None, 1).found > 0
    }

    /// Answer a parked long-poll of a prefix, woken or at its deadline.
    pub(super) fn answer_parked_room<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        key: &[u8],
        timed_out: bool,
    ) -> Reply {
        let since = parked_cut(key);
        self.key.clear();
        self.key.extend_from_slice(parked_prefix(key));
        self.walk_cut();
        let limit = DEFAULT_PAGE.min(self.node.config.limits.max_page_boxes);
        let m = self.moved_since(&since, None, limit);
        let nothing = m.found == 0 && m.next.is_none();
        self.write_moved(x, m, RouteLabel::LongPoll, timed_out && nothing)
    }

    /// Start an event stream of every box under the prefix in `self.key`:
    /// the head and `retry:`. The listing begins once the server has
    /// registered the stream (so a box that moves meanwhile is not missed)
    /// and goes on as the queue drains ([`Service::stream_room`]). A
    /// `Last-Event-ID` the table honors makes it a listing of what moved
    /// since; one it does not, `event: reset` and the whole room. Past
    /// `limits.max_prefix_streams` open on the node: 503.
    fn subscribe_prefix<H: Host>(&mut self, x: &mut Exchange<'_, H>, id: Option<&[u8]>) -> Reply {
        if x.host.prefix_streams() >= self.node.config.limits.max_prefix_streams {
            return self.error(
                x,
                RouteLabel::PrefixStream,
                503,
                "too many prefix streams (limits.max_prefix_streams)",
            );
        }
        let (out, host) = (&mut *x.out, &mut *x.host);
        let retry_ms = self.node.config.http.sse_retry_ms;
        self.heads
            .write_stream_head(out, host, RouteLabel::PrefixStream, retry_ms);
        let lanes = self.node.boxes.lanes();
        let mut room = RoomWatch {
            listing: Some(Box::default()),
            ..RoomWatch::default()
        };
        match id.filter(|i| !i.is_empty()).map(read_watermark) {
            None => {}
            Some(Some((run, cut))) if lanes.honors(run, &cut) => {
                room.held = Some(cut.clone().into());
                room.since = Some(cut.into());
            }
            Some(_) => out.extend_from_slice(b"event: reset\ndata: {}\n\n"),
        }
        Reply::Stream {
            stream: Stream {
                last: 0,
                existed: false,
                many: true,
            },
            key: self.key.as_slice().into(),
            watching: None,
            room: Some(Box::new(room)),
        }
    }

    /// Append what a prefix stream has to send now, standing at the cut:
    /// each box that moved, at its newest, or `event: deleted` with
    /// `{"k":...}` for one that went; then the next step of its listing (at
    /// most [`LIST_STEP`] keys; `event: synced` once the room is listed).
    /// What is marked past the cut waits in `room.moved` for a later cut.
    /// Once listed, the last event carries the cut as its `id:`. Returns the
    /// events written.
    pub fn stream_room<H: Host>(
        &mut self,
        prefix: &[u8],
        room: &mut RoomWatch,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> usize {
        self.room_cut(&*host);
        room.waits_cut = false;
        let mut sent = 0;
        if room.relist {
            // The keys that moved were too many to remember: the room is
            // listed again, and whatever the client holds that the listing
            // does not name by `event: synced` is gone.
            room.relist = false;
            room.synced = false;
            room.moved = Vec::new();
            room.since = None;
            room.held = None;
            room.listing = Some(Box::default());
            out.extend_from_slice(b"event: reset\ndata: {}\n\n");
            sent += 1;
        }
        if !room.moved.is_empty() {
            let moved = std::mem::take(&mut room.moved);
            for key in ManyKeys(&moved) {
                sent += self.room_event(key, None, room, out, host).unwrap_or(0);
            }
        }
        // Steps that send nothing (keys that did not move since the cut a
        // resumed stream holds) go on in this call, up to a bound; the
        // listing never waits for a drain that nothing queued will bring.
        let mut quiet_steps = 0;
        while let Some(after) = room.listing.take() {
            self.scratch.clear();
            let from = (!after.is_empty()).then_some(&after[..]);
            let (n, more) =
                self.node
                    .boxes
                    .order()
                    .page_marked(prefix, from, LIST_STEP, &mut self.scratch);
            let keys = std::mem::take(&mut self.scratch);
            let (mut last, mut paused) = (None, false);
            for (key, tomb) in MarkedKeys(&keys) {
                match self.room_event(key, Some(tomb), room, out, host) {
                    Some(n) => sent += n,
                    // Marked past the cut: the listing waits here for the
                    // next one, so it stays in key order.
                    None => {
                        paused = true;
                        break;
                    }
                }
                last = Some(key);
            }
            if paused {
                room.listing = Some(last.map_or(after, Into::into));
            } else if let (true, Some(k)) = (more && n > 0, last) {
                room.listing = Some(k.into());
            }
            self.scratch = keys;
            quiet_steps += 1;
            if paused || sent > 0 || quiet_steps == QUIET_LIST_STEPS {
                break;
            }
        }
        // Listed, and nothing it found waits for a later cut: the client
        // holds the room.
        if room.listing.is_none() && !room.synced && room.moved.is_empty() {
            room.since = None;
            room.synced = true;
            out.extend_from_slice(b"event: synced\ndata: {}\n\n");
            sent += 1;
        }
        // Every key that moved was sent or waits past the cut: the client
        // holds the listed keys at the cut, or at the one it held them at
        // where that is further (it came from a worker whose cut was).
        match room.held.as_mut() {
            Some(h) if h.len() == self.cut.len() => {
                for (h, &c) in h.iter_mut().zip(&self.cut) {
                    *h = (*h).max(c);
                }
            }
            _ => room.held = Some(self.cut.as_slice().into()),
        }
        if let (true, true, Some(held)) = (sent > 0, room.synced, room.held.as_deref()) {
            // Listed: the cut goes on the last event, before its blank line.
            out.pop();
            out.extend_from_slice(b"id: ");
            write_watermark(self.node.boxes.lanes().run(), held, out);
            out.extend_from_slice(b"\n\n");
        }
        sent
    }

    /// One key of a room as an event, standing at the cut: its payload, or
    /// `event: deleted` if it is gone (`listed`: the key order's entry seen
    /// by a listing, 0 or a tombstone's mark). Returns the events written; a
    /// change past the cut waits in `room.moved`, or (`None`) stops the
    /// listing there. In a listing of what moved since a cut, what did not
    /// move is not sent.
    fn room_event<H: Host>(
        &mut self,
        key: &[u8],
        listed: Option<u64>,
        room: &mut RoomWatch,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Option<usize> {
        self.body.clear();
        // A listing sends what moved since its cut (all, without one); a key
        // that moved, what is past the cut the client holds it at.
        let since = match listed {
            Some(_) => room.since.as_deref(),
            None => room.held.as_deref(),
        };
        let found = match listed {
            Some(tomb) if tomb != 0 => Err(tomb),
            Some(_) => self.node.boxes.poll_marked(key, &mut self.body).ok_or(0),
            None => self
                .node
                .boxes
                .poll_marked(key, &mut self.body)
                .ok_or_else(|| self.node.boxes.order().mark_of(key).unwrap_or(0)),
        };
        match found {
            // The client has it (a cut it holds may be past this worker's).
            Ok((_, mark)) if since.is_some_and(|s| !past(mark, s)) => {}
            Ok((_, mark)) if past(mark, &self.cut) => return room.later(key, listed),
            Ok(_) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&self.body);
                out.extend_from_slice(b"\n\n");
                host.sse_event(0);
                return Some(1);
            }
            // A removal past the cut waits as a change does.
            Err(tomb) if tomb != 0 && past(tomb, &self.cut) => return room.later(key, listed),
            Err(tomb) if !tell_removal(listed, tomb, since) => {}
            Err(_) => {
                out.extend_from_slice(b"event: deleted\ndata: {\"k\":");
                write_json_str(std::str::from_utf8(key).unwrap_or_default(), out);
                out.extend_from_slice(b"}\n\n");
                host.sse_event(0);
                return Some(1);
            }
        }
        Some(0)
    }
}

/// Whether a key found gone is sent as `event: deleted`: in a first
/// listing, never (it names the boxes there); otherwise a removal past the
/// cut the client holds (or one whose tombstone is unseen: raced, or no
/// longer kept).
fn tell_removal(listed: Option<u64>, tomb: u64, since: Option<&[u64]>) -> bool {
    match (listed, since) {
        // A key that moved: unless its removal was told already.
        (None, Some(s)) => tomb == 0 || past(tomb, s),
        (None, None) => true,
        (Some(_), None) => false,
        (Some(_), Some(s)) => tomb == 0 || past(tomb, s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_room_remembers_each_moved_key_once_and_relists_past_its_cap() {
        let mut r = RoomWatch {
            listing: Some(b"room/m"[..].into()),
            ..RoomWatch::default()
        };
        r.moved(b"room/z");
        assert!(r.moved.is_empty(), "not listed yet: the listing sends it");
        r.moved(b"room/a");
        r.moved(b"room/a");
        assert_eq!(ManyKeys(&r.moved).count(), 1);
        r.listing = None;
        for i in 0..MOVED_CAP + 1 {
            r.moved(format!("room/{i}").as_bytes());
        }
        assert!(r.relist && r.moved.is_empty() && r.pending());
    }
}
