//! Presence over HTTP (docs/presence.md): the box `<room>~presence` read as
//! any box (its payload from [`crate::presence::Presence`]), its pages
//! (`?limit=N&cursor=C`), and the `member=` (with `info=`) that makes an event
//! stream or long-poll of a room, or of its presence, a presence connection.
//!
//! What it is not: who is in a room, nor when they leave
//! ([`crate::presence`]); reading the box where any box is read
//! (`presence_box.rs`).

use super::cursor::{read_hex, write_hex};
use super::presence_box::{parse_presence_query, PresenceQuery};
use super::{Exchange, Host, Reply, RouteLabel, Service};
use crate::http::{percent_decode_into, Method};
use crate::presence::{check_info, check_member, presence_key, JoinError, Membership};

/// Members a page of a room's presence holds without `limit=` (as a page of
/// a room's boxes).
const MEMBERS_PAGE: usize = 100;

impl Service {
    /// A request of `<room>~presence` (the key in `self.key`): a page of its
    /// members (answered here), or a poll, long-poll or stream that goes on
    /// as for any box, joined first if it names a member (`held`: a stream,
    /// or a long-poll that may wait).
    pub(super) fn presence_request<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        room: &[u8],
        held: bool,
    ) -> Result<(), Reply> {
        let route = RouteLabel::Poll;
        let q = match parse_presence_query(&x.buf[x.frame.query.clone()]) {
            Ok(q) => q,
            Err(what) => return Err(self.error(x, route, 400, what)),
        };
        if q.limit.is_some() || q.cursor.is_some() {
            if q.member.is_some() {
                return Err(self.error(
                    x,
                    route,
                    400,
                    "member= goes on a stream or a long-poll, not a page",
                ));
            }
            return Err(self.presence_page(x, room, &q));
        }
        self.join_presence(x, route, room, &q, held)
    }

    /// The hold of the presence connection the request just answered
    /// opened, if it did: the connection keeps it while it waits or
    /// streams, and drops it when that ends (the member then leaves after
    /// the grace unless it comes back).
    pub fn take_joined(&mut self) -> Option<Membership> {
        self.joined.take()
    }

    /// `member=` on a request of `room` (an event stream or a long-poll: the
    /// caller says which with `held`): join it, or the refusal's answer.
    /// On a node whose reads need a token, the member is the token's `sub`
    /// (`member=` must name it) and its info the token's `pollbox.info`.
    pub(super) fn join_presence<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        room: &[u8],
        q: &PresenceQuery<'_>,
        held: bool,
    ) -> Result<(), Reply> {
        let Some(raw) = q.member else {
            if q.info.is_some() {
                return Err(self.error(x, route, 400, "info goes with member="));
            }
            return Ok(());
        };
        if !held {
            return Err(self.error(
                x,
                route,
                400,
                "member= needs an event stream or a long-poll (after=V&wait_ms=N)",
            ));
        }
        let mut member = Vec::new();
        if percent_decode_into(raw, &mut member).is_err() {
            return Err(self.error(x, route, 400, "bad percent-encoding in member"));
        }
        if let Err(what) = check_member(&member) {
            return Err(self.error(x, route, 400, what));
        }
        let info = if self.access.reads_need_token {
            if q.info.is_some() {
                return Err(self.error(
                    x,
                    route,
                    400,
                    "info comes from the token's pollbox.info claim on this node",
                ));
            }
            match x.creds.member() {
                Some((sub, info)) if sub.as_bytes() == member => info.map(<[u8]>::to_vec),
                _ => {
                    x.host.auth_refused(super::AuthRefused::Forbidden);
                    return Err(self.error(x, route, 403, "member is not the token's sub"));
                }
            }
        } else {
            match q.info {
                None => None,
                Some(raw) => {
                    let mut decoded = Vec::new();
                    if percent_decode_into(raw, &mut decoded).is_err() {
                        return Err(self.error(x, route, 400, "bad percent-encoding in info"));
                    }
                    match check_info(&decoded) {
                        Ok(compact) => Some(compact),
                        Err(what) => return Err(self.error(x, route, 400, what)),
                    }
                }
            }
        };
        if let Some(i) = &info {
            if i.len() > crate::presence::MAX_INFO_BYTES {
                return Err(self.error(x, route, 400, "info is longer than 400 bytes"));
            }
        }
        let clock = self.node.boxes.version_clock();
        match self
            .node
            .presence
            .join(room, &member, info.as_deref(), self.now_ms, clock)
        {
            Ok((hold, wake)) => {
                if wake {
                    x.host.box_updated(&presence_key(room));
                }
                self.joined = Some(hold);
                Ok(())
            }
            Err(e) => Err(self.refuse_presence(x, route, e)),
        }
    }

    /// `{"error":"room full","limit":"presence.max_members"}` and the like.
    fn refuse_presence<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        e: JoinError,
    ) -> Reply {
        self.body.clear();
        self.body.extend_from_slice(b"{\"error\":\"");
        self.body.extend_from_slice(e.message().as_bytes());
        self.body.extend_from_slice(b"\",\"limit\":\"");
        self.body.extend_from_slice(e.limit().as_bytes());
        self.body.extend_from_slice(b"\"}");
        let a = super::Answer {
            head_only: x.frame.method == Method::Head,
            extra: &[(b"Retry-After", b"1")],
            ..x.json(route, e.status())
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }

    /// `GET /v1/boxes/<room>~presence?limit=N&cursor=C`: a page of the room's
    /// members by id, `{"k":...,"ver":V,"count":N,"members":[...],"next":C}`.
    pub(super) fn presence_page<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        room: &[u8],
        q: &PresenceQuery<'_>,
    ) -> Reply {
        let route = RouteLabel::Page;
        let max = self.node.config.limits.max_page_boxes;
        let limit = match q.limit {
            None => MEMBERS_PAGE.min(max),
            Some(0) => return self.error(x, route, 400, "limit must be at least 1"),
            Some(n) => (n as usize).min(max),
        };
        let cursor = match q.cursor {
            None => None,
            Some(raw) => {
                let mut v = Vec::new();
                match percent_decode_into(raw, &mut v)
                    .ok()
                    .and_then(|()| read_hex(&v))
                {
                    Some(id) => Some(id),
                    None => return self.error(x, route, 400, "cursor is not one a page gave"),
                }
            }
        };
        self.body.clear();
        let version = self.node.presence.page(
            room,
            cursor.as_deref(),
            limit,
            &mut self.body,
            |last, out| match last {
                Some(id) => {
                    out.push(b'"');
                    write_hex(id, out);
                    out.push(b'"');
                }
                None => out.extend_from_slice(b"null"),
            },
        );
        let a = super::Answer {
            head_only: x.frame.method == Method::Head,
            etag: Some(version),
            ..x.json(route, 200)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }
}
