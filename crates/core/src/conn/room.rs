//! A room on a connection (docs/http.md#rooms): a prefix stream told the
//! keys that moved under its prefix, one by one, then sending what it has at
//! the server's cut; a long-poll of a prefix answered when something under it
//! moved past its watermark.
//!
//! What it is not: the events and answers themselves
//! ([`crate::service::RoomWatch`] and the service write them).

use super::*;

/// A page of a prefix this connection answers next ([`Wait::Paging`]).
#[derive(Debug)]
pub(super) struct PagingWait {
    pub(super) frame: Frame,
    pub(super) paging: Box<Paging>,
}

impl Connection {
    /// Whether a page of a prefix is being built here: the server gives it
    /// a step at each of its turns ([`Connection::page_step`]).
    pub fn paging(&self) -> bool {
        matches!(self.wait, Wait::Paging(_)) && self.closing.is_none()
    }

    /// One step of the page being built; the last one writes the answer
    /// and serves what was pipelined behind it. Returns whether it was
    /// answered.
    pub fn page_step<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        let Wait::Paging(p) = &mut self.wait else {
            return false;
        };
        if !cx.service.page_step(&mut p.paging) {
            return false;
        }
        let Wait::Paging(p) = self.take_wait(|w| matches!(w, Wait::Paging(_))) else {
            return false;
        };
        self.answer_held(&p.frame, cx, |service, request, out, host| {
            service.page_answer(request, &p.paging, out, host)
        });
        true
    }

    /// The box of `key`, under the prefix this connection streams or
    /// long-polls, was created, updated, deleted or expired
    /// (docs/http.md#rooms). A long-poll is answered now if something under
    /// its prefix moved past its watermark; a stream only remembers the key:
    /// the server sends what it has with [`Connection::flush_room`] once it
    /// has taken every wake-up up to its cut (docs/boxes.md#watermarks).
    /// Returns whether something was written.
    pub fn on_prefix_moved<H: Host>(&mut self, key: &[u8], cx: &mut Ctx<'_, H>) -> bool {
        match &mut self.wait {
            Wait::Parked(p) if p.park.room => {
                let due = cx.service.park_due(&p.key, &p.park);
                if due {
                    self.answer_parked(false, cx);
                } else {
                    // Its writer may not have published the change yet.
                    p.recheck = true;
                }
                due
            }
            Wait::Streaming(s) => {
                if let Some(room) = s.room.as_mut() {
                    room.moved(key);
                    s.dirty = room.pending();
                }
                false
            }
            _ => false,
        }
    }

    /// A prefix stream sends what it has now (its queue empty), standing at
    /// the server's cut; a long-poll of a prefix is answered if it is due.
    /// Returns whether something was written.
    pub fn flush_room<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        if let Wait::Parked(p) = &mut self.wait {
            if !p.park.room {
                return false;
            }
            let due = cx.service.park_due(&p.key, &p.park);
            if due {
                self.answer_parked(false, cx);
            } else {
                p.recheck = false;
            }
            return due;
        }
        self.stream_update(cx)
    }

    /// Whether a prefix stream has something to send (once its queue
    /// drains), or a long-poll of a prefix waits: the server flushes it once
    /// it has taken its wake-ups.
    pub fn room_pending(&self) -> bool {
        match &self.wait {
            Wait::Parked(p) => p.park.room,
            Wait::Streaming(s) => s.room.as_ref().is_some_and(|r| r.pending()),
            _ => false,
        }
    }

    /// Whether a prefix stream's last look found something marked past its
    /// cut: the server looks at it again with its next cut (the next tick).
    pub fn room_waits(&self) -> bool {
        match &self.wait {
            Wait::Parked(p) => p.recheck,
            Wait::Streaming(s) => s.room.as_ref().is_some_and(|r| r.waits_cut),
            _ => false,
        }
    }

    /// Whether a prefix stream's listing goes on and nothing it queued will
    /// bring its next step (its queue is empty: its last steps found nothing
    /// to send): the server gives it another step at its next turn
    /// ([`Connection::on_send_drained`]).
    pub fn room_lists_on(&self) -> bool {
        matches!(&self.wait, Wait::Streaming(s) if s.room.as_ref().is_some_and(|r| r.lists_on()))
            && self.sendq.is_empty()
            && self.closing.is_none()
    }

    /// Too many wake-ups at once reached this worker (its inbox overflowed):
    /// a prefix stream lists its room again, each box at its newest (after
    /// `event: reset`); a long-poll of a prefix looks again.
    pub fn on_prefix_overflow<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        match &mut self.wait {
            Wait::Streaming(s) => {
                if let Some(room) = s.room.as_mut() {
                    room.relist = true;
                    s.dirty = true;
                }
                false
            }
            Wait::Parked(p) if p.park.room => self.flush_room(cx),
            _ => false,
        }
    }
}
