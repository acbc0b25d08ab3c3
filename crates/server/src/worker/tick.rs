//! What a worker does once an epoch (`epoch_ms`): reset the arena, follow
//! the wall clock and the key set, publish its gauges and busy share, retry
//! connections starved of buffers, fire the timers, run one bounded step of
//! box expiry; and the steps of a drain at shutdown.

use super::{Worker, DRAIN_LIMIT, QUIET_TICKS_BEFORE_SLEEP};
use std::time::{Instant, SystemTime};

impl Worker {
    /// Publish the share of the time since the last tick this worker spent
    /// not waiting for events, smoothed, for placing new connections.
    pub(super) fn publish_busy(&mut self, now: Instant) {
        let window = now.duration_since(self.load.busy_since).as_nanos() as u64;
        if window == 0 {
            return;
        }
        let busy = 1000 - (self.load.idle_ns.min(window) * 1000 / window) as u32;
        self.load.busy = (self.load.busy * 7 + busy) / 8;
        self.load.idle_ns = 0;
        self.load.busy_since = now;
        self.host
            .shared()
            .placement()
            .set_busy(self.id, self.load.busy);
    }

    pub(super) fn tick(&mut self) {
        let tick_start = Instant::now();
        let late = self.clocks.now_ms.saturating_sub(self.clocks.next_tick_ms);
        if late >= self.clocks.epoch_ms {
            self.host.stats().epoch_overruns.inc();
        }
        self.clocks.next_tick_ms = self.clocks.now_ms + self.clocks.epoch_ms
            - (late % self.clocks.epoch_ms).min(self.clocks.epoch_ms - 1);
        let reset_start = Instant::now();
        let r = self.service.reset_arena();
        let reset_ns = reset_start.elapsed().as_nanos() as u64;
        self.service.set_time(SystemTime::now());
        if self.service.follow_access() {
            self.recheck_held_tokens();
        }
        let buffers = self.buffer_total() as u64;
        let high_water = self.service.arena().high_water_bytes() as u64;
        let st = self.host.stats();
        st.arena_resets.inc();
        st.arena_reset.observe_ns(reset_ns);
        st.arena_used_before_reset.set(r.used_before as u64);
        st.arena_capacity.set(r.capacity_after as u64);
        st.arena_high_water.set(high_water);
        if r.replaced {
            st.arena_replaced.inc();
        }
        st.bytes_received.set(self.counts.read_bytes);
        st.bytes_sent.set(self.counts.sent_bytes);
        st.buffer_bytes.set(buffers);
        st.send_queue_bytes.set(self.counts.conn_send_bytes as u64);
        crate::alloc_stats::publish_thread_counters(st);
        st.buffered_bytes.set(self.buffered() as u64);
        // Connections that waited for buffer budget try again (others may have
        // given buffers back since).
        for (slot, gen) in std::mem::take(&mut self.timers.starved) {
            if let Some(mut c) = self.sockets.conns.take_gen(slot, gen) {
                c.starved = false;
                c.unread = true;
                self.settle(slot, c);
            }
        }
        self.publish_busy(tick_start);
        let mut fired = std::mem::take(&mut self.scratch.fired);
        self.timers.wheel.advance(self.clocks.now_ms, &mut fired);
        for t in fired.drain(..) {
            let Some(mut c) = self.sockets.conns.take_gen(t.slot, t.gen) else {
                continue;
            };
            c.timer = None;
            self.timed(|cx| c.core.on_timer(cx));
            self.settle(t.slot, c);
        }
        self.scratch.fired = fired;
        // Rooms with something past the last cut (or whose writer had not
        // published when they looked) look again, at a new cut.
        self.recheck_rooms();
        // A bounded step of box expiry (SweepBudget::PER_TICK): the boxes'
        // long-polls are woken through the same path as an ingest's.
        let table_ms = self.host.shared().table_clock(self.clocks.now_ms);
        self.service.expire(table_ms, &mut self.host);
        // Members whose grace ran out leave (docs/presence.md).
        self.service
            .presence_tick(self.clocks.now_ms, &mut self.host);
        // Clients gone whose request bucket has refilled are forgotten, a
        // shard a tick (docs/private-boxes.md#per-client-limits).
        let clients = &self.host.shared().node().clients;
        if clients.limits().rate_limited() {
            clients.sweep(self.clocks.now_ms.saturating_mul(1000));
        }
        self.clocks.quiet_ticks = if self.is_quiet() {
            self.clocks.quiet_ticks.saturating_add(1)
        } else {
            0
        };
        if self.clocks.quiet_ticks == QUIET_TICKS_BEFORE_SLEEP {
            // Gone quiet: what this thread freed is not about to be reused,
            // so its allocator gives the pages back now, not over
            // `dirty_decay_ms` (a burst of ingest, then nothing).
            crate::alloc_stats::give_back_idle_memory();
        }
        let work = tick_start.elapsed().as_nanos() as u64;
        let st = self.host.stats();
        st.tick.observe_ns(work);
        if work > st.epoch_work_max_ns.get() {
            st.epoch_work_max_ns.set(work);
        }
    }

    /// Prefix streams with something waiting and long-polls of a prefix look
    /// again at a new cut (taken with the wake-ups, as on a wake-up).
    fn recheck_rooms(&mut self) {
        if self.timers.rooms.is_empty() {
            return;
        }
        self.wake_rooms();
        // Those listed as waiting for a cut: off the list, and back on it
        // when they still wait (`Worker::list_room`).
        let listed = std::mem::take(&mut self.timers.rooms);
        for &(slot, gen) in &listed {
            if let Some(c) = self.sockets.conns.get_mut(slot).filter(|c| c.gen == gen) {
                c.room_listed = false;
            }
        }
        self.flush_rooms(&listed);
    }

    /// This worker took a new read of the key set and static token files:
    /// held requests whose token it no longer holds end now (a 401, or
    /// `event: expired`), not at their token's end. Only on a re-read.
    pub(super) fn recheck_held_tokens(&mut self) {
        for slot in self.sockets.conns.slots() {
            if !self
                .sockets
                .conns
                .get_mut(slot)
                .is_some_and(|c| c.core.holds_token())
            {
                continue;
            }
            let Some(mut c) = self.sockets.conns.take(slot) else {
                continue;
            };
            self.timed(|cx| c.core.on_access_changed(cx));
            self.settle(slot, c);
        }
    }

    /// Nothing a tick would do: no connection (so no timer), no arena memory
    /// to give back, no box that may expire, not shutting down.
    pub(super) fn is_quiet(&self) -> bool {
        let shared = self.shared();
        let arena = self.service.arena();
        self.sockets.conns.is_empty()
            && self.scratch.later.is_empty()
            && self.timers.starved.is_empty()
            && arena.capacity_bytes() <= arena.working_size().saturating_mul(4)
            && (shared.node().config.boxes.ttl_s == 0 || shared.node().boxes.is_empty())
            && shared.node().presence.idle()
            && !shared.lifecycle().is_draining_relaxed()
    }

    /// One step of draining. Returns true when the worker may exit.
    pub(super) fn drain_step(&mut self) -> bool {
        if self.clocks.draining_since.is_none() {
            // Stop accepting: the port refuses new connections, which a load
            // balancer retries on another node whatever their method (it
            // cannot retry a POST that a 503 answered). The metrics listener
            // stays for the drain.
            if let Some(mut l) = self.sockets.listener.take() {
                let _ = self.sockets.poll.registry().deregister(&mut l);
            }
        }
        let since = *self.clocks.draining_since.get_or_insert_with(Instant::now);
        let overdue = since.elapsed() >= DRAIN_LIMIT;
        for slot in self.sockets.conns.slots() {
            if let Some(mut c) = self.sockets.conns.take(slot) {
                // Bytes already in the socket are a request in flight, not idleness.
                if c.core.wants_read() && !self.read(&mut c) {
                    self.close(slot, c);
                    continue;
                }
                self.timed(|cx| c.core.drain(overdue, cx));
                self.settle(slot, c);
            }
        }
        self.sockets.conns.is_empty()
    }
}
