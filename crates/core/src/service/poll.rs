//! One box read and removed: the poll with its ETag (200, 304, 404), the
//! long-poll that parks until the box passes `after` and its answer when woken
//! or due, and `DELETE`.
//!
//! What it is not: many boxes at once ([`super::many`]) or event streams
//! ([`super::stream`]).

use super::*;

pub(super) fn render_etag(version: u64, buf: &mut [u8; 24]) -> &[u8] {
    let mut it = itoa::Buffer::new();
    let digits = it.format(version).as_bytes();
    buf[0] = b'"';
    buf[1..1 + digits.len()].copy_from_slice(digits);
    buf[1 + digits.len()] = b'"';
    &buf[..digits.len() + 2]
}

/// `If-None-Match`: `*`, or a comma-separated list of (possibly weak) tags.
pub(super) fn etag_matches(header: &[u8], etag: &[u8]) -> bool {
    header.split(|&b| b == b',').any(|t| {
        let t = t.trim_ascii();
        let t = t.strip_prefix(b"W/").unwrap_or(t);
        t == etag || t == b"*"
    })
}

impl Service {
    /// `GET /v1/boxes/{key}`, with or without the long-poll query.
    pub(super) fn poll<H: Host>(&mut self, x: &mut Exchange<'_, H>, raw_key: &[u8]) -> Reply {
        let (frame, buf) = (x.frame, x.buf);
        // A bad query or a bad key: one 400 with the specific reason.
        let query = parse_poll_query(&buf[frame.query.clone()])
            .and_then(|q| self.decode_key(raw_key).map(|()| q));
        let q = match query {
            Ok(q) => q,
            Err(what) => return self.error(x, RouteLabel::Poll, 400, what),
        };
        if self.access.reads_need_token {
            if let Err(r) = self.check_access(x, RouteLabel::Poll, Need::Read, Target::One) {
                return r;
            }
        }
        let stream = frame.method == Method::Get && wants_event_stream(frame, buf);
        if let Some(room) = presence_box::presence_room(&self.key) {
            let room = room.to_vec();
            let held = stream || (q.after.is_some() && q.wait_ms.is_some_and(|w| w > 0));
            if let Err(r) = self.presence_request(x, &room, held) {
                return r;
            }
        } else if !frame.query.is_empty() && presence_box::names_member(&buf[frame.query.clone()]) {
            return self.error(x, RouteLabel::Poll, 400, presence_box::MEMBER_WHERE);
        }
        if stream {
            return self.subscribe(x, q.last_event_id);
        }
        let (label, not_modified) = match (q.after, q.wait_ms) {
            (Some(after), Some(wait)) => {
                let wait = wait.min(self.node.config.limits.max_wait_ms);
                let version = self.version(&self.key);
                let unchanged = !crate::presence::moved(&self.key, version, after);
                if unchanged && wait > 0 {
                    return Reply::Park {
                        park: Park {
                            after,
                            wait_ms: wait,
                            existed: version > 0,
                            many: false,
                            room: false,
                        },
                        key: self.key.as_slice().into(),
                    };
                }
                // Nothing newer and no time to wait: the wait has run out (304).
                (RouteLabel::LongPoll, unchanged)
            }
            _ => (RouteLabel::Poll, false),
        };
        self.write_poll(x, label, not_modified)
    }

    /// Answer a parked long-poll of `key`: the box moved past `park.after`
    /// (200), it was deleted or expired (404), or the wait ran out (`timed_out`:
    /// 304 unless it moved after all). Of many boxes (`park.many`, `key` their
    /// keys): 200 once their ETag moved from `park.after`, else 304.
    pub fn answer_parked<H: Host>(
        &mut self,
        request: Request<'_>,
        key: &[u8],
        park: Park,
        timed_out: bool,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Reply {
        let Request { frame, buf, .. } = request;
        self.heads.begin(frame.field(&frame.origin, buf));
        self.key.clear();
        self.key.extend_from_slice(key);
        let not_modified = !park.room && timed_out && !self.park_due(key, &park);
        // Its access was checked when it parked.
        let creds = &mut Credentials::default();
        let x = &mut Exchange::new(request, out, host, creds);
        if park.room {
            return self.answer_parked_room(x, key, timed_out);
        }
        if park.many {
            return self.write_many(x, RouteLabel::LongPoll, not_modified);
        }
        self.write_poll(x, RouteLabel::LongPoll, not_modified)
    }

    /// `DELETE /v1/boxes/{key}`: 204 and the box is gone (its long-polls are
    /// woken and answered 404), 404 for an unknown key; a token as for ingest.
    pub(super) fn delete<H: Host>(&mut self, x: &mut Exchange<'_, H>, raw_key: &[u8]) -> Reply {
        let route = RouteLabel::Delete;
        if !self.access.scoped && !self.authorized(x) {
            return self.unauthorized(x, route);
        }
        if let Err(what) = self.decode_key(raw_key) {
            return self.error(x, route, 400, what);
        }
        if crate::presence::reserved_key(&self.key) {
            return self.error(
                x,
                route,
                400,
                "a room's presence is not deleted: its members leave when their connections end",
            );
        }
        if let Err(r) = self.check_access(x, route, Need::Write, Target::One) {
            return r;
        }
        if self.logged {
            return self.delete_logged(x);
        }
        if self.node.boxes.remove(&self.key).is_none() {
            return self.error(x, route, 404, "no such box");
        }
        x.host.box_updated(&self.key);
        self.node.boxes.lanes().publish();
        x.host.boxes_removed(Removal::Deleted, 1);
        let a = Answer {
            content_type: b"",
            ..x.json(route, 204)
        };
        self.heads.write(x.out, x.host, &a, b"");
        x.reply()
    }

    /// Answer a (long-)poll for the key in `self.key`. `not_modified`: the wait
    /// ran out, so the box answers 304.
    pub(super) fn write_poll<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        not_modified: bool,
    ) -> Reply {
        self.body.clear();
        let frame = x.frame;
        let head = frame.method == Method::Head;
        let Some(version) = super::presence_box::read_box(&self.node, &self.key, &mut self.body)
        else {
            if not_modified {
                // Nothing was ever ingested for this key while we waited.
                let a = Answer {
                    head_only: true,
                    ..x.json(route, 304)
                };
                self.heads.write(x.out, x.host, &a, b"");
                return x.reply();
            }
            return self.error(x, route, 404, "no such box");
        };
        let not_modified = not_modified
            || frame.field(&frame.if_none_match, x.buf).is_some_and(|v| {
                let mut etag_buf = [0u8; 24];
                etag_matches(v, render_etag(version, &mut etag_buf))
            });
        // A 304 carries the Content-Length the 200 would have (RFC 9110 §8.6), no body.
        let a = Answer {
            head_only: head || not_modified,
            etag: Some(version),
            ..x.json(route, if not_modified { 304 } else { 200 })
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }
}
