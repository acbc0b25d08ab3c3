//! The hashed timer wheel (docs/boxes.md#epochs-and-arenas): one per worker,
//! it drives arena resets, header/body/idle timeouts and long-poll deadlines.
//!
//! Time is cut into ticks of `tick_ms`; a timer due in tick `t` lives in slot
//! `t % slots`, in a doubly linked list threaded through a slab of entries, so
//! insert and cancel are O(1) and the steady state allocates nothing (freed
//! entries are reused through a free list). A timer many rotations away simply
//! waits in its slot: every visit re-checks its deadline, so no round counter
//! is needed. The wheel has no clock: callers pass `now_ms` in.

/// Handle to cancel a timer. Each slab entry carries a generation bumped when
/// it is freed, so an id whose timer already fired or was cancelled is
/// recognised as stale and cancels nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId {
    index: u32,
    generation: u32,
}

const NIL: u32 = u32::MAX;

struct Entry<T> {
    deadline_ms: u64,
    generation: u32,
    /// The slot this entry is listed in (live entries only).
    slot: u32,
    prev: u32,
    /// Next in the slot list, or in the free list once freed.
    next: u32,
    /// `Some` exactly while the timer is live.
    value: Option<T>,
}

#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// A hashed timer wheel holding values of type `T` (a connection token, say).
pub struct Wheel<T> {
    tick_ms: u64,
    slots: Box<[List]>,
    entries: Vec<Entry<T>>,
    free: u32,
    len: usize,
    /// The earliest tick whose slot may still hold timers: `advance` starts
    /// there. Invariant: every live timer is in slot `max(due tick, tick) % slots`.
    tick: u64,
    now_ms: u64,
}

impl<T> Wheel<T> {
    /// A wheel of `slots` slots of `tick_ms` each, starting at `now_ms`. One
    /// rotation (`tick_ms * slots`) should cover the common timeouts; longer
    /// ones work, they are just looked at once per rotation.
    pub fn new(tick_ms: u64, slots: usize, now_ms: u64) -> Wheel<T> {
        let tick_ms = tick_ms.max(1);
        Wheel {
            tick_ms,
            slots: vec![EMPTY; slots.max(1)].into_boxed_slice(),
            entries: Vec::new(),
            free: NIL,
            len: 0,
            tick: now_ms / tick_ms,
            now_ms,
        }
    }

    /// Live timers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The time of the last `advance` (or of `new`).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Add a timer firing at `deadline_ms` (a deadline already past fires at
    /// the next `advance`).
    ///
    /// # Panics
    /// With more than `u32::MAX - 1` timers alive at once.
    pub fn insert(&mut self, deadline_ms: u64, value: T) -> TimerId {
        let slot = self.slot_of(deadline_ms);
        let index = if self.free != NIL {
            let index = self.free;
            let e = &mut self.entries[index as usize];
            self.free = e.next;
            e.deadline_ms = deadline_ms;
            e.value = Some(value);
            index
        } else {
            let index = u32::try_from(self.entries.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("fewer than 2^32 - 1 timers alive");
            self.entries.push(Entry {
                deadline_ms,
                generation: 0,
                slot: 0,
                prev: NIL,
                next: NIL,
                value: Some(value),
            });
            index
        };
        self.link(index, slot);
        self.len += 1;
        TimerId {
            index,
            generation: self.entries[index as usize].generation,
        }
    }

    /// Remove a live timer and give its value back; `None` for a stale id
    /// (already fired or cancelled).
    pub fn cancel(&mut self, id: TimerId) -> Option<T> {
        let e = self.entries.get(id.index as usize)?;
        if e.generation != id.generation || e.value.is_none() {
            return None;
        }
        self.unlink(id.index);
        Some(self.release(id.index))
    }

    /// The deadline of a live timer, `None` for a stale id.
    pub fn deadline(&self, id: TimerId) -> Option<u64> {
        let e = self.entries.get(id.index as usize)?;
        (e.generation == id.generation && e.value.is_some()).then_some(e.deadline_ms)
    }

    /// Move time to `now_ms` (time never goes back: an earlier `now_ms` counts
    /// as the last one) and push every timer with `deadline <= now_ms` onto
    /// `fired`. Timers fire in tick order when the step is shorter than one
    /// rotation; a longer jump visits each slot once, in slot order.
    pub fn advance(&mut self, now_ms: u64, fired: &mut Vec<T>) {
        let now = now_ms.max(self.now_ms);
        self.now_ms = now;
        let now_tick = now / self.tick_ms;
        let n = self.slots.len() as u64;
        let visits = (now_tick - self.tick).saturating_add(1).min(n);
        for k in 0..visits {
            let slot = ((self.tick + k) % n) as u32;
            let mut index = self.slots[slot as usize].head;
            while index != NIL {
                let e = &self.entries[index as usize];
                let next = e.next;
                if e.deadline_ms <= now {
                    self.unlink(index);
                    fired.push(self.release(index));
                }
                index = next;
            }
        }
        self.tick = now_tick;
    }

    /// The earliest deadline of all live timers (`None` when there is none),
    /// for sizing the event loop's poll timeout. Walks slots from the current
    /// tick until it finds a timer due within this rotation; only when every
    /// timer is a rotation or more away does it scan them all.
    pub fn next_deadline_hint(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let n = self.slots.len() as u64;
        for k in 0..n {
            let tick = self.tick + k;
            let mut best: Option<u64> = None;
            let mut index = self.slots[(tick % n) as usize].head;
            while index != NIL {
                let e = &self.entries[index as usize];
                if self.due_tick(e.deadline_ms) == tick {
                    best = Some(best.map_or(e.deadline_ms, |b| b.min(e.deadline_ms)));
                }
                index = e.next;
            }
            if best.is_some() {
                return best;
            }
        }
        self.entries
            .iter()
            .filter(|e| e.value.is_some())
            .map(|e| e.deadline_ms)
            .min()
    }

    /// The tick a timer due at `deadline_ms` is listed under.
    fn due_tick(&self, deadline_ms: u64) -> u64 {
        (deadline_ms / self.tick_ms).max(self.tick)
    }

    fn slot_of(&self, deadline_ms: u64) -> u32 {
        // The slot count came from a usize, and a u32 index is enough for any
        // wheel that fits in memory.
        (self.due_tick(deadline_ms) % self.slots.len() as u64) as u32
    }

    /// Append entry `index` to the tail of `slot` (FIFO within a tick).
    fn link(&mut self, index: u32, slot: u32) {
        let tail = self.slots[slot as usize].tail;
        {
            let e = &mut self.entries[index as usize];
            e.slot = slot;
            e.prev = tail;
            e.next = NIL;
        }
        if tail == NIL {
            self.slots[slot as usize].head = index;
        } else {
            self.entries[tail as usize].next = index;
        }
        self.slots[slot as usize].tail = index;
    }

    fn unlink(&mut self, index: u32) {
        let (slot, prev, next) = {
            let e = &self.entries[index as usize];
            (e.slot as usize, e.prev, e.next)
        };
        if prev == NIL {
            self.slots[slot].head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.slots[slot].tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    /// Free an unlinked live entry and return its value.
    fn release(&mut self, index: u32) -> T {
        let e = &mut self.entries[index as usize];
        e.generation = e.generation.wrapping_add(1);
        e.next = self.free;
        e.prev = NIL;
        self.free = index;
        self.len -= 1;
        // Only live entries are linked, and only linked entries are released.
        e.value.take().expect("released entry was live")
    }
}

impl<T> std::fmt::Debug for Wheel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wheel")
            .field("tick_ms", &self.tick_ms)
            .field("slots", &self.slots.len())
            .field("len", &self.len)
            .field("now_ms", &self.now_ms)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn fire<T>(w: &mut Wheel<T>, now: u64) -> Vec<T> {
        let mut fired = Vec::new();
        w.advance(now, &mut fired);
        fired
    }

    #[test]
    fn fires_in_deadline_order_and_not_before() {
        let mut w = Wheel::new(16, 64, 1000);
        w.insert(1100, "c");
        w.insert(1020, "a");
        w.insert(1050, "b");
        w.insert(1020, "a2");
        assert_eq!(w.len(), 4);
        assert!(fire(&mut w, 1019).is_empty());
        assert_eq!(fire(&mut w, 1020), ["a", "a2"]);
        assert!(fire(&mut w, 1049).is_empty());
        assert_eq!(fire(&mut w, 1200), ["b", "c"]);
        assert!(w.is_empty());
    }

    #[test]
    fn timers_within_the_current_tick_wait_for_their_millisecond() {
        let mut w = Wheel::new(16, 8, 0);
        w.insert(5, 1);
        w.insert(9, 2);
        assert!(fire(&mut w, 4).is_empty());
        assert_eq!(fire(&mut w, 5), [1]);
        assert!(fire(&mut w, 8).is_empty());
        assert_eq!(fire(&mut w, 9), [2]);
    }

    #[test]
    fn past_deadlines_fire_at_the_next_advance() {
        let mut w = Wheel::new(16, 8, 10_000);
        w.insert(0, "long ago");
        w.insert(9_999, "just now");
        assert_eq!(fire(&mut w, 10_000), ["long ago", "just now"]);
    }

    #[test]
    fn cancel_and_stale_ids() {
        let mut w = Wheel::new(10, 8, 0);
        let a = w.insert(50, 'a');
        let b = w.insert(50, 'b');
        let c = w.insert(50, 'c');
        assert_eq!(w.deadline(b), Some(50));
        assert_eq!(w.cancel(b), Some('b'));
        assert_eq!(w.cancel(b), None, "twice");
        assert_eq!(w.deadline(b), None);
        // The freed entry is reused: the old id must not touch the new timer.
        let d = w.insert(60, 'd');
        assert_eq!(d.index, b.index);
        assert_eq!(w.cancel(b), None);
        assert_eq!(fire(&mut w, 50), ['a', 'c']);
        assert_eq!(w.cancel(a), None, "fired");
        assert_eq!(w.cancel(c), None, "fired");
        assert_eq!(w.cancel(d), Some('d'));
        assert!(w.is_empty());
        assert_eq!(w.next_deadline_hint(), None);
    }

    #[test]
    fn cancel_head_middle_tail_keeps_the_list_whole() {
        let mut w = Wheel::new(10, 4, 0);
        let ids: Vec<_> = (0..5).map(|i| w.insert(15, i)).collect();
        assert_eq!(w.cancel(ids[0]), Some(0));
        assert_eq!(w.cancel(ids[2]), Some(2));
        assert_eq!(w.cancel(ids[4]), Some(4));
        w.insert(15, 5);
        assert_eq!(fire(&mut w, 15), [1, 3, 5]);
    }

    #[test]
    fn far_deadlines_wait_many_rotations() {
        // One rotation is 8 * 10 = 80 ms; these are 10 and 100 rotations away.
        let mut w = Wheel::new(10, 8, 0);
        w.insert(805, "ten");
        w.insert(8_000, "hundred");
        w.insert(30, "soon");
        let mut all = Vec::new();
        let mut now = 0;
        while now < 9_000 {
            now += 10;
            let fired = fire(&mut w, now);
            for f in &fired {
                all.push((*f, now));
            }
        }
        assert_eq!(all, [("soon", 30), ("ten", 810), ("hundred", 8_000)]);
    }

    #[test]
    fn large_jumps_fire_everything_due_and_nothing_else() {
        let mut w = Wheel::new(16, 64, 0);
        for i in 0..1000u64 {
            w.insert(i * 37, i);
        }
        let mut fired = fire(&mut w, 20_000);
        fired.sort_unstable();
        assert_eq!(fired, (0..=540).collect::<Vec<_>>());
        assert_eq!(w.len(), 1000 - 541);
        assert_eq!(w.next_deadline_hint(), Some(541 * 37));
        let mut rest = fire(&mut w, u64::MAX);
        rest.sort_unstable();
        assert_eq!(rest, (541..1000).collect::<Vec<_>>());
    }

    #[test]
    fn time_does_not_go_back() {
        let mut w = Wheel::new(16, 8, 1000);
        w.insert(1500, 1);
        assert!(fire(&mut w, 1400).is_empty());
        assert!(fire(&mut w, 100).is_empty());
        assert_eq!(w.now_ms(), 1400);
        assert_eq!(fire(&mut w, 1500), [1]);
    }

    #[test]
    fn hint_is_the_earliest_deadline() {
        let mut w = Wheel::new(10, 8, 0);
        assert_eq!(w.next_deadline_hint(), None);
        w.insert(5_000, "far");
        assert_eq!(
            w.next_deadline_hint(),
            Some(5_000),
            "only far timers: full scan"
        );
        w.insert(37, "a");
        w.insert(33, "b");
        assert_eq!(w.next_deadline_hint(), Some(33));
        // A far timer sharing a slot with a near one does not hide the near one.
        w.insert(33 + 80 * 3, "c");
        assert_eq!(w.next_deadline_hint(), Some(33));
    }

    #[test]
    fn steady_state_reuses_entries() {
        let mut w = Wheel::new(16, 64, 0);
        let mut fired = Vec::with_capacity(16);
        for round in 0..100u64 {
            for i in 0..10 {
                w.insert(round * 100 + i, i);
            }
            fired.clear();
            w.advance(round * 100 + 99, &mut fired);
            assert_eq!(fired.len(), 10);
        }
        assert_eq!(w.entries.len(), 10, "the slab did not grow past the peak");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert { at: i64 },
        Cancel { pick: usize },
        Advance { by: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (-100i64..3_000).prop_map(|at| Op::Insert { at }),
            1 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
            3 => prop_oneof![0u64..40, 0u64..2_000, 0u64..50_000].prop_map(|by| Op::Advance { by }),
        ]
    }

    proptest! {
        #[test]
        fn behaves_like_a_sorted_map(
            tick in 1u64..40,
            slots in 1usize..16,
            start in 0u64..100_000,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut w = Wheel::new(tick, slots, start);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new(); // value -> deadline
            let mut ids: Vec<(TimerId, u64)> = Vec::new();
            let mut now = start;
            for (n, op) in ops.into_iter().enumerate() {
                let value = n as u64;
                match op {
                    Op::Insert { at } => {
                        let deadline = now.saturating_add_signed(at);
                        ids.push((w.insert(deadline, value), value));
                        model.insert(value, deadline);
                    }
                    Op::Cancel { pick } => {
                        if !ids.is_empty() {
                            let (id, v) = ids[pick % ids.len()];
                            let expect = model.remove(&v).map(|_| v);
                            prop_assert_eq!(w.cancel(id), expect);
                        }
                    }
                    Op::Advance { by } => {
                        now += by;
                        let mut fired = Vec::new();
                        w.advance(now, &mut fired);
                        fired.sort_unstable();
                        let due: Vec<u64> =
                            model.iter().filter(|(_, d)| **d <= now).map(|(v, _)| *v).collect();
                        for v in &due {
                            model.remove(v);
                        }
                        prop_assert_eq!(fired, due);
                    }
                }
                prop_assert_eq!(w.len(), model.len());
                prop_assert_eq!(w.next_deadline_hint(), model.values().min().copied());
            }
        }
    }
}
