//! A connection's turn: read what its socket has into its state machine,
//! apply the actions it pushed ([`pollbox_core::conn::Action`]), write its
//! answers, then put it back or close it; and what wakes a connection that
//! waits (another worker's ingest, the log's reports).
//!
//! The worker keeps nothing of the connection's state: what it keeps is what
//! it made when applying an action (the registration of a watch in
//! [`super::waiting`], the wheel's timer), and the connection asks for it to
//! be undone.

use super::conns::Conn;
use super::transmit::Sent;
use super::{ConnTimer, Worker, STREAM_NOTSENT_LOWAT};
use crate::wakeups::{PrefixWake, Wake};
use pollbox_core::conn::{Action, SEND_BACKPRESSURE};
use pollbox_core::service::Listener;
use std::io::{self, Read};

impl Worker {
    /// Do what the connection asks until it asks for nothing more: read (when it
    /// stopped early and may go on), apply its actions, write its answers;
    /// then close it or put it back.
    pub(super) fn settle(&mut self, slot: usize, mut c: Box<Conn>) {
        let mut close = false;
        // A page of a prefix takes one step a settle: the worker serves other
        // connections between two (`Worker::serve` gives it its turns).
        if c.core.paging() {
            self.timed(|cx| c.core.page_step(cx));
        }
        loop {
            if c.unread && c.core.wants_read() && !self.read(&mut c) {
                return self.close(slot, c);
            }
            if c.peer_hup {
                // The client shut its side: a poll it parked is read by nobody,
                // so its slot is freed now, not at the deadline.
                c.core.peer_hung_up();
            }
            if c.core.has_actions() {
                close |= self.apply(slot, &mut c);
            }
            if !c.core.send_queue().is_empty() {
                let urgent = c.core.closing().is_some()
                    || c.core.send_queue().pending() >= SEND_BACKPRESSURE;
                let sent = self
                    .transmit
                    .send(slot, &mut c, &mut self.buffers.send, urgent);
                match sent {
                    Sent::Bytes(n) => self.counts.sent_bytes += n as u64,
                    Sent::Failed => return self.close(slot, c),
                    Sent::WouldBlock | Sent::Deferred => {}
                }
            }
            // An event stream whose box moved while its queue was not empty
            // sends the newest version now that the queue drained.
            if c.core.stream_dirty() && c.core.send_queue().is_empty() {
                let sent = self.timed(|cx| c.core.on_send_drained(cx));
                if sent {
                    continue;
                }
            }
            if c.core.shuts_down_write() && !c.write_shut {
                // The answer is out (or the connection ends now): the client reads
                // it, then the end of the stream.
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
                c.write_shut = true;
                if c.core.wants_read() {
                    // Lingering: drop what the client still sends, which may already
                    // be in the socket (no edge will announce it).
                    c.unread = true;
                    continue;
                }
            }
            // Reading stopped for back-pressure and the write drained the queue
            // without the socket saying WouldBlock: no edge will come, read on.
            // (Not if reading stopped for want of buffer budget: that waits for
            // the next tick.)
            if !(c.unread && c.core.wants_read()) || c.core.starved() {
                break;
            }
        }
        // What the writes changed (the close, the bytes), and the timer.
        if self.apply(slot, &mut c) || close {
            return self.close(slot, c);
        }
        if c.core.starved() && !c.starved {
            c.starved = true;
            self.timers.starved.push((slot, c.gen));
        }
        self.list_room(slot, &mut c);
        self.sockets.conns.put(slot, c);
    }

    /// A room stream that has something marked past its cut goes on the
    /// list the next tick looks at again with a new cut; one whose listing
    /// goes on with nothing queued, on the list the next turn steps.
    pub(super) fn list_room(&mut self, slot: usize, c: &mut Conn) {
        if !c.room_listed && c.core.room_waits() {
            c.room_listed = true;
            self.timers.rooms.push((slot, c.gen));
        }
        if !c.room_stepping && c.core.room_lists_on() {
            c.room_stepping = true;
            self.timers.listing.push((slot, c.gen));
        }
    }

    /// Room streams whose listing goes on take their next step (a bounded
    /// one: [`pollbox_core::service::QUIET_LIST_STEPS`]); those that still
    /// go on with nothing queued are listed again for the next turn.
    pub(super) fn step_listings(&mut self) {
        if self.timers.listing.is_empty() {
            return;
        }
        let mut listing = std::mem::take(&mut self.timers.listing);
        // What this turn lists again goes to the (emptied) list's twin.
        self.timers.listing = std::mem::take(&mut self.scratch.listing);
        for &(slot, gen) in &listing {
            let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
                continue;
            };
            c.room_stepping = false;
            self.timed(|cx| c.core.on_send_drained(cx));
            self.settle(slot, c);
        }
        listing.clear();
        self.scratch.listing = listing;
    }

    /// Apply what the connection asked since the last time, once each.
    /// Returns whether it asked to be closed.
    pub(super) fn apply(&mut self, slot: usize, c: &mut Conn) -> bool {
        let mut close = false;
        loop {
            let (mut watched, mut room) = (false, false);
            let conn = (slot, c.gen);
            let shared = self.host.shared();
            let stats = &shared.stats()[self.id];
            for a in c.core.actions() {
                match a {
                    Action::Watch(w) => {
                        c.watch = Some(self.waiting.watch(w, conn, shared.wakeups(), stats));
                        if w.stream && !c.lowat_set {
                            // A reader that stops reading: the kernel takes at most
                            // this much unsent data for it (not the 4 MB a send
                            // buffer grows to), then the stream waits with one event
                            // queued and coalesces. Bytes in flight are not
                            // limited, so a stream over a long round trip is not
                            // slowed.
                            let _ = socket2::SockRef::from(&c.stream)
                                .set_tcp_notsent_lowat(STREAM_NOTSENT_LOWAT);
                            c.lowat_set = true;
                        }
                        watched = true;
                        room |= w.prefix;
                    }
                    Action::Unwatch => {
                        if let Some(r) = c.watch.take() {
                            self.waiting.unwatch(r, conn, shared.wakeups(), stats);
                        }
                    }
                    Action::Await(request) => self.waiting.await_reports(request, conn),
                    Action::Unawait(request) => self.waiting.unawait(request),
                    Action::Arm(at) => {
                        if let Some(t) = c.timer.take() {
                            self.timers.wheel.cancel(t);
                        }
                        c.timer =
                            Some(self.timers.wheel.insert(at, ConnTimer { slot, gen: c.gen }));
                    }
                    Action::Bytes { send, watch } => {
                        self.counts.conn_send_bytes =
                            self.counts.conn_send_bytes.wrapping_add_signed(send);
                        self.counts.conn_watch_bytes =
                            self.counts.conn_watch_bytes.wrapping_add_signed(watch);
                    }
                    Action::Close => close = true,
                }
            }
            if !watched {
                return close;
            }
            if room {
                // A room begins at a fresh cut (its listing waits at a box
                // marked past the cut it stands at). Wake-ups taken now for
                // this connection (taken out) are for changes its listing
                // reads anyway.
                self.wake_rooms();
            }
            // An ingest may have landed between the version check and the
            // registration: look again now that wake-ups reach it.
            self.timed(|cx| c.core.on_box_updated(cx));
        }
    }

    /// Read what the socket has, answering as it comes, until it would block or
    /// the connection stops reading. Returns false if the connection is dead.
    pub(super) fn read(&mut self, c: &mut Conn) -> bool {
        self.host.start();
        let alive = self.read_answering(c);
        self.host.finish();
        alive
    }

    /// [`Worker::read`]'s loop; the answers of each read are timed together
    /// (`WorkerHost::finish`).
    pub(super) fn read_answering(&mut self, c: &mut Conn) -> bool {
        loop {
            let mut cx = cx!(self);
            let Some(buf) = c.core.read_buffer(&mut cx) else {
                // Stopped early: `unread` stays set.
                return true;
            };
            let room = buf.len();
            match c.stream.read(buf) {
                Ok(0) => {
                    c.core.eof(&mut cx);
                    c.unread = false;
                    return true;
                }
                Ok(n) => {
                    c.core.received(n, &mut cx);
                    self.host.finish();
                    self.counts.read_bytes += n as u64;
                    if n < room && !c.peer_hup {
                        // A short read drained the socket: with edge-triggered
                        // epoll, bytes arriving later raise a new event, so the
                        // read that would only say WouldBlock is skipped (one
                        // syscall less per request).
                        c.unread = false;
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.unread = false;
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    /// Settle the result of a write made at the end of the turn.
    pub(super) fn after_turn_write(&mut self, slot: usize, sent: Sent) {
        let Some(c) = self.sockets.conns.take(slot) else {
            return;
        };
        match sent {
            Sent::Bytes(n) => self.counts.sent_bytes += n as u64,
            Sent::Failed => return self.close(slot, c),
            Sent::WouldBlock | Sent::Deferred => {}
        }
        self.settle(slot, c);
    }

    pub(super) fn close(&mut self, slot: usize, mut c: Box<Conn>) {
        let _ = self.sockets.poll.registry().deregister(&mut c.stream);
        // Released, the connection asks for what it had to be undone (its
        // watch, its awaited request, its bytes).
        c.core.release(&mut cx!(self));
        self.apply(slot, &mut c);
        if let Some(t) = c.timer.take() {
            self.timers.wheel.cancel(t);
        }
        self.sockets.conns.release(slot);
        let shared = self.host.shared();
        shared.connection_closed();
        shared.stats()[self.id].connections_open.sub(1);
    }

    /// Keys moved under prefixes streamed or long-polled here
    /// (docs/http.md#rooms). The cut is taken first, then every such wake-up
    /// is taken (each stream remembers its keys; a long-poll is answered),
    /// then the streams woken send what they have, standing at the cut: so
    /// an id never names a change whose wake-up was still on its way
    /// (docs/boxes.md#watermarks). After an overflow, every prefix stream
    /// lists its room again.
    pub(super) fn wake_rooms(&mut self) {
        self.service.take_cut();
        let mut woken = std::mem::take(&mut self.scratch.rooms);
        woken.clear();
        // Only what was sent before the cut: a key sent after it moved in a
        // change published after it, which the next cut takes (and a stream
        // of busy writers cannot keep the worker here).
        let waiting = self.host.shared().wakeups().moved_waiting(self.id);
        for _ in 0..waiting {
            let Some(moved) = self.host.shared().wakeups().next_moved(self.id) else {
                break;
            };
            let (wake, key) = match &moved {
                PrefixWake::Moved(hash, key) => (Wake::Key(*hash), Some(&key[..])),
                PrefixWake::All => (Wake::All, None),
            };
            self.scratch.woken.clear();
            self.waiting.rooms_woken(wake, &mut self.scratch.woken);
            for i in 0..self.scratch.woken.len() {
                let (slot, gen) = self.scratch.woken[i];
                let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
                    continue;
                };
                let wrote = self.timed(|cx| match key {
                    Some(key) => c.core.on_prefix_moved(key, cx),
                    None => c.core.on_prefix_overflow(cx),
                });
                if c.core.room_pending() && !woken.contains(&(slot, gen)) {
                    woken.push((slot, gen));
                }
                if wrote || c.core.has_actions() {
                    self.settle(slot, c);
                } else {
                    // A stream only noted the key: nothing to write yet.
                    self.list_room(slot, &mut c);
                    self.sockets.conns.put(slot, c);
                }
            }
        }
        self.service.cut_drained();
        self.flush_rooms(&woken);
        self.scratch.rooms = woken;
    }

    /// The prefix streams (and long-polls) `conns` send what they have now.
    pub(super) fn flush_rooms(&mut self, conns: &[(usize, u32)]) {
        for &(slot, gen) in conns {
            let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
                continue;
            };
            self.timed(|cx| c.core.flush_room(cx));
            self.settle(slot, c);
        }
    }

    /// Another worker (or this one) applied an update to keys we wait on; or,
    /// on a node of a log, records our ingests wait for met their fate.
    pub(super) fn on_wake(&mut self) {
        while let Some(stream) = self.host.shared().placement().next(self.id) {
            self.adopt(stream, Listener::Main);
        }
        while let Some(r) = self.host.shared().wakeups().next_report(self.id) {
            let Some((slot, gen)) = self.waiting.awaiting(r.request) else {
                continue; // answered already (timed out) or closed
            };
            let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
                continue;
            };
            self.timed(|cx| c.core.on_log_reports(r.index, r.report, r.count, cx));
            self.settle(slot, c);
        }
        self.wake_rooms();
        while let Some(wake) = self.host.shared().wakeups().next(self.id) {
            self.scratch.woken.clear();
            self.waiting.woken(wake, &mut self.scratch.woken);
            for i in 0..self.scratch.woken.len() {
                let (slot, gen) = self.scratch.woken[i];
                let Some(mut c) = self.sockets.conns.take_gen(slot, gen) else {
                    continue;
                };
                // A stream of many boxes looks only at the keys with the
                // woken hash (the keys were registered in their order).
                let watch = c.watch.as_ref();
                let moved = |i: usize| watch.is_some_and(|r| r.moved(wake, i));
                self.timed(|cx| c.core.on_keys_updated(&moved, cx));
                self.settle(slot, c);
            }
        }
    }
}
