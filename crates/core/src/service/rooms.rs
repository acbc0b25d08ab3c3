//! Rooms (docs/http.md#rooms): every box under a prefix. A page
//! (`GET /v1/boxes?prefix=P&limit=N&cursor=C`) walks the table's keys in
//! order ([`crate::boxes::KeyOrder`]); an event stream of the prefix lists the
//! boxes there in the same steps, then sends every box under it that moves.
//!
//! A page copies at most `limit + 1` keys out of the key order under one of
//! its mutexes (the one bounded step a creation can wait behind), then reads
//! each box as a poll does, locking nothing.

use super::{Exchange, Reply, RouteLabel, Service, Stream, Target};
use crate::auth::Need;
use crate::boxes::is_prefix;
use crate::http::{percent_decode_into, ManyQuery, Method};
use crate::render::write_json_str;
use crate::service::{Answer, Host, ManyKeys};

/// Boxes a page holds without `limit=`.
pub const DEFAULT_PAGE: usize = 100;
/// Boxes a prefix stream lists in one step (its first listing), before it
/// lets the worker go on.
pub const LIST_STEP: usize = 64;

/// What a prefix stream keeps between events (docs/http.md#rooms): where its
/// first listing stands, and the keys under the prefix that moved while its
/// queue was not empty (sent, each at its newest, once the queue drains).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RoomWatch {
    /// The listing goes on after this key (`Some(empty)`: from the start);
    /// `None`: listed, `event: synced` sent.
    pub listing: Option<Box<[u8]>>,
    /// The keys that moved, as [`ManyKeys`] encodes them, each once.
    pub moved: Vec<u8>,
    /// Too many moved while the client did not read: list the room again
    /// instead (each box at its newest), then `event: synced`.
    pub relist: bool,
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

    /// Whether it has something to send once the queue is empty.
    pub fn pending(&self) -> bool {
        self.listing.is_some() || self.relist || !self.moved.is_empty()
    }

    /// Heap bytes it holds.
    pub fn heap_bytes(&self) -> usize {
        self.moved.capacity() + self.listing.as_ref().map_or(0, |l| l.len())
    }
}

/// The hexadecimal of `key`: a page's `next`, opaque to clients and safe in
/// a URL as it is.
fn write_cursor(key: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in key {
        out.push(HEX[(b >> 4) as usize]);
        out.push(HEX[(b & 15) as usize]);
    }
}

/// The key a [`write_cursor`] cursor names.
fn read_cursor(raw: &[u8]) -> Option<Vec<u8>> {
    if !raw.len().is_multiple_of(2) {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    raw.chunks_exact(2)
        .map(|p| Some(nibble(p[0])? << 4 | nibble(p[1])?))
        .collect()
}

impl Service {
    /// `GET /v1/boxes?prefix=P...`: a page, or an event stream of the prefix.
    pub(super) fn poll_prefix<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        q: &ManyQuery<'_>,
        raw: &[u8],
    ) -> Reply {
        let (frame, buf) = (x.frame, x.buf);
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
        if stream {
            return self.subscribe_prefix(x);
        }
        let max = self.node.config.limits.max_page_boxes;
        let limit = match q.limit {
            None => DEFAULT_PAGE.min(max),
            Some(0) => return self.error(x, route, 400, "limit must be at least 1"),
            Some(n) => (n as usize).min(max),
        };
        let after = match q.cursor.map(read_cursor) {
            None => None,
            Some(Some(key)) => Some(key),
            Some(None) => return self.error(x, route, 400, "cursor is not one a page gave"),
        };
        self.write_page(x, after.as_deref(), limit)
    }

    /// Answer one page: `{"boxes":[...],"next":"..."|null}`.
    fn write_page<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Reply {
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
        self.body.extend_from_slice(b"],\"next\":");
        match (more, last) {
            (true, Some(key)) => {
                self.body.push(b'"');
                write_cursor(key, &mut self.body);
                self.body.push(b'"');
            }
            _ => self.body.extend_from_slice(b"null"),
        }
        self.body.push(b'}');
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            ..x.json(RouteLabel::Page, 200)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// Start an event stream of every box under the prefix in `self.key`:
    /// the head and `retry:`. The listing begins once the server has
    /// registered the stream (so a box that moves meanwhile is not missed)
    /// and goes on as the queue drains ([`Service::stream_room`]). Past
    /// `limits.max_prefix_streams` open on the node: 503.
    fn subscribe_prefix<H: Host>(&mut self, x: &mut Exchange<'_, H>) -> Reply {
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
        let room = RoomWatch {
            listing: Some(Box::default()),
            ..RoomWatch::default()
        };
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

    /// Append what a prefix stream has to send now: the next step of its
    /// listing (at most [`LIST_STEP`] boxes, then `event: synced` once the
    /// room is listed), and each box that moved, at its newest, or
    /// `event: deleted` with `{"k":...}` for one that went. Returns the events
    /// written.
    pub fn stream_room<H: Host>(
        &mut self,
        prefix: &[u8],
        room: &mut RoomWatch,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> usize {
        let mut sent = 0;
        if room.relist {
            // The keys that moved were too many to remember: the room is
            // listed again, and whatever the client holds that the listing
            // does not name by `event: synced` is gone.
            room.relist = false;
            room.moved = Vec::new();
            room.listing = Some(Box::default());
            out.extend_from_slice(b"event: reset\ndata: {}\n\n");
            sent += 1;
        }
        if !room.moved.is_empty() {
            let moved = std::mem::take(&mut room.moved);
            for key in ManyKeys(&moved) {
                sent += self.room_event(key, true, out, host);
            }
            room.moved = moved;
            room.moved.clear();
        }
        if let Some(after) = room.listing.take() {
            self.scratch.clear();
            let from = (!after.is_empty()).then_some(&after[..]);
            let (n, more) =
                self.node
                    .boxes
                    .order()
                    .page(prefix, from, LIST_STEP, &mut self.scratch);
            let keys = std::mem::take(&mut self.scratch);
            let mut last = None;
            for key in ManyKeys(&keys) {
                sent += self.room_event(key, false, out, host);
                last = Some(key);
            }
            room.listing = match (more, last) {
                (true, Some(k)) if n > 0 => Some(k.into()),
                _ => {
                    out.extend_from_slice(b"event: synced\ndata: {}\n\n");
                    sent += 1;
                    None
                }
            };
            self.scratch = keys;
        }
        sent
    }

    /// One box of a room as an event: its payload, or (`gone_too`: it was
    /// listed, so the client has it) `event: deleted` if it is gone.
    fn room_event<H: Host>(
        &mut self,
        key: &[u8],
        gone_too: bool,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> usize {
        self.body.clear();
        match self.node.boxes.poll(key, &mut self.body) {
            Some(_) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&self.body);
                out.extend_from_slice(b"\n\n");
            }
            None if gone_too => {
                out.extend_from_slice(b"event: deleted\ndata: {\"k\":");
                write_json_str(std::str::from_utf8(key).unwrap_or_default(), out);
                out.extend_from_slice(b"}\n\n");
            }
            None => return 0,
        }
        host.sse_event(0);
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_hex_and_read_back() {
        let mut c = Vec::new();
        write_cursor("room-17/é".as_bytes(), &mut c);
        assert_eq!(c, b"726f6f6d2d31372fc3a9");
        assert_eq!(read_cursor(&c).as_deref(), Some("room-17/é".as_bytes()));
        assert_eq!(read_cursor(b"abc"), None);
        assert_eq!(read_cursor(b"zz"), None);
        assert_eq!(read_cursor(b""), Some(Vec::new()));
    }

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
