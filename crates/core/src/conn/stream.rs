//! An event stream on a connection (docs/http.md#event-streams): the newest
//! version when woken, coalesced behind a client that does not read its
//! events, then `event: deleted` or the end.
//!
//! What it is not: the events' bytes ([`crate::service::Stream`] writes them).

use super::*;

impl Connection {
    /// The send queue was written out: an event stream whose box moved
    /// meanwhile sends the newest version now (the versions between were
    /// coalesced). Returns whether something was queued.
    pub fn on_send_drained<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        let dirty = matches!(&self.wait, Wait::Streaming(s) if s.dirty);
        if !dirty || !self.sendq.is_empty() || self.closing.is_some() {
            return false;
        }
        self.stream_update(cx)
    }

    /// Whether [`Connection::on_send_drained`] has something to send once the
    /// queue is empty.
    pub fn stream_dirty(&self) -> bool {
        matches!(&self.wait, Wait::Streaming(s) if s.dirty) && self.closing.is_none()
    }

    /// The streamed box moved (or went): send its newest version, unless the
    /// client has not read what is queued (then only remember it: at most one
    /// event is ever queued); or `event: deleted` and the end.
    pub(super) fn stream_update<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        let Wait::Streaming(s) = &mut self.wait else {
            return false;
        };
        if self.closing.is_some() {
            return false;
        }
        if s.room.is_some() || s.many.is_some() {
            // Many boxes, or a prefix: what is marked (the boxes that moved;
            // a prefix's listing, a step at a time) is looked at once the
            // queue is empty, each box coalesced on its own; a box that goes
            // is an event, and the stream goes on.
            if !s.dirty || !self.sendq.is_empty() {
                return false;
            }
            let Ctx {
                service,
                buffers,
                host,
                now_ms,
            } = cx;
            let sent =
                self.sendq
                    .append(&mut buffers.send, |out| match (&mut s.room, &mut s.many) {
                        (Some(room), _) => service.stream_room(&s.key, room, out, *host),
                        (None, Some(watching)) => service.stream_many(&s.key, watching, out, *host),
                        (None, None) => 0,
                    });
            s.dirty = s.room.as_ref().is_some_and(|r| r.pending());
            if sent > 0 {
                s.heartbeat_ms = *now_ms + service.node().config.http.sse_heartbeat_ms;
            }
            return sent > 0;
        }
        let version = cx.service.version(&s.key);
        if version == 0 {
            if !s.stream.existed {
                // Not created yet: it is waited for.
                return false;
            }
            self.sendq
                .append(&mut cx.buffers.send, |out| out.extend_from_slice(DELETED));
            self.end_stream(cx.now_ms, cx.service);
            return true;
        }
        if !crate::presence::moved(&s.key, version, s.stream.last) {
            return false;
        }
        if !self.sendq.is_empty() {
            s.dirty = true;
            return false;
        }
        s.dirty = false;
        let Ctx {
            service,
            buffers,
            host,
            now_ms,
        } = cx;
        let sent = self.sendq.append(&mut buffers.send, |out| {
            service.stream_event(&s.key, &mut s.stream, out, *host)
        });
        match sent {
            Event::Sent(_) => {
                s.heartbeat_ms = *now_ms + service.node().config.http.sse_heartbeat_ms;
                true
            }
            Event::Unchanged => false,
            Event::NoBox => {
                // Gone between the two looks: the next wake-up says so.
                false
            }
        }
    }

    /// End the event stream: the connection closes once what is queued is
    /// sent, or at the idle timeout from now if the client does not read it.
    pub(super) fn end_stream(&mut self, now_ms: u64, service: &Service) {
        self.end_wait();
        self.client.unhold();
        self.closing = Some(Closing::AfterSend);
        self.deadline_ms = now_ms + service.node().config.limits.idle_timeout_ms;
    }
}
