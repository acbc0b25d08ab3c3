//! A worker's byte buffers: each connection's read buffer and its queue of
//! response bytes, and the pools they come from and go back to.
//!
//! Responses are rendered straight into the tail buffer of a connection's
//! [`SendQueue`], so a batch of pipelined responses usually sits in one buffer and
//! goes out in one write; drained buffers go back to the worker's
//! [`BufferPool`] with their capacity, so the steady state allocates nothing.
//! This module holds bytes only: writing them to a socket is the server's job
//! ([`SendQueue::chunks`] says what to write, [`SendQueue::advance`] what was).

use std::collections::VecDeque;

/// Send buffers are started at this capacity and kept up to [`MAX_POOLED`].
pub const BUFFER_CAPACITY: usize = 16 * 1024;
/// A buffer that grew past this is dropped instead of pooled.
const MAX_POOLED: usize = 64 * 1024;
/// A response is appended to the tail buffer while it stays under this size.
const APPEND_LIMIT: usize = 64 * 1024;
/// Read buffers are this size (larger for large bodies). A connection holds one
/// only while it has bytes of an unfinished request; between requests it goes
/// back to the pool, so idle keep-alive connections cost no buffer.
pub const READ_BUF: usize = 16 * 1024;
/// Most idle read buffers a worker keeps.
const READ_POOL_MAX: usize = 256;
/// Idle read buffers that grew past [`READ_BUF`] (large bodies, batches) are
/// kept up to this many bytes per worker, so that a connection sending one
/// batch after another does not allocate, zero and copy a large buffer for
/// each (the growth path cost ~330 instructions per 512-byte message of a
/// 100-message batch: BENCHMARKS.md, "Ingest").
const GROWN_POOL_BYTES: usize = 4 * 1024 * 1024;
/// Most idle send buffers a worker keeps (with [`MAX_POOLED`]: at most 16 MiB
/// idle per worker, usually 256 × 16 KiB).
const SEND_POOL_MAX: usize = 256;

/// Per-worker free list of byte buffers.
pub struct BufferPool {
    free: Vec<Vec<u8>>,
    max_free: usize,
    /// Capacity of the buffers currently in `free`.
    pooled_bytes: usize,
}

impl BufferPool {
    pub fn new(max_free: usize) -> BufferPool {
        BufferPool {
            free: Vec::with_capacity(max_free),
            max_free,
            pooled_bytes: 0,
        }
    }

    pub fn get(&mut self) -> Vec<u8> {
        match self.free.pop() {
            Some(b) => {
                self.pooled_bytes -= b.capacity();
                b
            }
            None => Vec::with_capacity(BUFFER_CAPACITY),
        }
    }

    pub fn put(&mut self, mut b: Vec<u8>) {
        if self.free.len() < self.max_free && b.capacity() <= MAX_POOLED && b.capacity() > 0 {
            b.clear();
            self.pooled_bytes += b.capacity();
            self.free.push(b);
        }
    }

    /// Bytes held by idle pooled buffers.
    pub fn pooled_bytes(&self) -> usize {
        self.pooled_bytes
    }
}

/// Idle read buffers, each [`READ_BUF`] long (zero-filled once, reused as is),
/// and a few that grew larger ([`GROWN_POOL_BYTES`]).
pub struct ReadPool {
    free: Vec<Vec<u8>>,
    grown: Vec<Vec<u8>>,
    grown_bytes: usize,
}

impl ReadPool {
    pub fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| vec![0; READ_BUF])
    }

    /// Keep `b` if it is a standard buffer, or a grown one, and the pool has
    /// room.
    pub fn put(&mut self, b: Vec<u8>) {
        if b.len() == READ_BUF {
            if self.free.len() < READ_POOL_MAX {
                self.free.push(b);
            }
        } else if b.len() > READ_BUF && self.grown_bytes + b.len() <= GROWN_POOL_BYTES {
            self.grown_bytes += b.len();
            self.grown.push(b);
        }
    }

    /// The largest idle grown buffer at least `min` long and at most four
    /// times that (so that a small growth does not take a buffer far larger
    /// than it needs out of the budget), and at most `limit`.
    fn take_grown(&mut self, min: usize, limit: usize) -> Option<Vec<u8>> {
        let max = min.saturating_mul(4).min(limit);
        let (at, _) = self
            .grown
            .iter()
            .enumerate()
            .filter(|(_, b)| (min..=max).contains(&b.len()))
            .max_by_key(|(_, b)| b.len())?;
        let b = self.grown.swap_remove(at);
        self.grown_bytes -= b.len();
        Some(b)
    }

    pub fn pooled_bytes(&self) -> usize {
        self.free.len() * READ_BUF + self.grown_bytes
    }
}

/// The pools of one worker, and its share of `max_buffered_bytes` for the read
/// buffers its connections hold.
///
/// Every read buffer a connection holds is handed out here and counted until
/// it comes back ([`Buffers::read_held`]). A connection gets its first buffer
/// while the count is under the budget; a buffer grows (a large body) only while
/// the count stays under the budget less a reserve of an eighth, so that when
/// bodies fill the budget, connections with ordinary requests still get a
/// buffer. A connection refused either waits, unread, and is tried again
/// ([`crate::conn::Connection::starved`]).
pub struct Buffers {
    pub send: BufferPool,
    read: ReadPool,
    read_held: usize,
    budget: usize,
}

impl Default for Buffers {
    /// No budget (tests, tools).
    fn default() -> Self {
        Buffers::new(usize::MAX)
    }
}

impl Buffers {
    /// `budget`: the bytes of read buffers this worker's connections may hold.
    pub fn new(budget: usize) -> Buffers {
        Buffers {
            send: BufferPool::new(SEND_POOL_MAX),
            read: ReadPool {
                free: Vec::with_capacity(READ_POOL_MAX),
                grown: Vec::new(),
                grown_bytes: 0,
            },
            read_held: 0,
            budget,
        }
    }

    /// A standard read buffer, unless the connections' read buffers are at the
    /// budget.
    pub fn take_read(&mut self) -> Option<Vec<u8>> {
        if self.read_held.saturating_add(READ_BUF) > self.budget {
            return None;
        }
        self.read_held += READ_BUF;
        Some(self.read.take())
    }

    /// A read buffer of about `want` bytes: an idle grown one when `want` is
    /// over the standard size, the pool has one between `want` and four times
    /// that (at most `limit`), and the budget allows it as it allows growth
    /// ([`Buffers::grow_read`]); else a standard one ([`Buffers::take_read`]).
    /// For a connection whose last request needed a grown buffer: the next
    /// batch then starts in one instead of growing (and copying) again.
    pub fn take_read_sized(&mut self, want: usize, limit: usize) -> Option<Vec<u8>> {
        if want > READ_BUF {
            if let Some(b) = self.take_grown_counted(want, limit, 0) {
                return Some(b);
            }
        }
        self.take_read()
    }

    /// A pooled grown buffer between `min` and four times that (at most
    /// `limit`), counted as held beyond the `counted` bytes of the buffer it
    /// replaces, if the growth budget ([`Buffers::grow_read`]) allows it;
    /// else it stays pooled.
    fn take_grown_counted(&mut self, min: usize, limit: usize, counted: usize) -> Option<Vec<u8>> {
        let b = self.read.take_grown(min, limit)?;
        if self.grow_read(b.len().saturating_sub(counted)) {
            return Some(b);
        }
        self.read.put(b);
        None
    }

    /// Whether a read buffer may grow by `extra` bytes (and count them if so).
    pub fn grow_read(&mut self, extra: usize) -> bool {
        let limit = self.budget - self.budget / 8;
        if self.read_held.saturating_add(extra) > limit {
            return false;
        }
        self.read_held += extra;
        true
    }

    /// Make the read buffer `buf`, whose first `filled` bytes are in use, at
    /// least `new_len` long: an idle grown buffer when the pool has one of
    /// about that size and at most `limit` long (the bytes in use copied
    /// over, `buf`'s buffer pooled), else `buf` resized. False, and `buf`
    /// unchanged, when the growth is over the budget ([`Buffers::grow_read`]).
    pub fn grow_read_buf(
        &mut self,
        buf: &mut Vec<u8>,
        filled: usize,
        new_len: usize,
        limit: usize,
    ) -> bool {
        let filled = filled.min(buf.len());
        if let Some(mut bigger) = self.take_grown_counted(new_len, limit, buf.len()) {
            bigger[..filled].copy_from_slice(&buf[..filled]);
            // Not subtracted from the held count: `bigger` took its place.
            let old = std::mem::replace(buf, bigger);
            self.read.put(old);
            return true;
        }
        if !self.grow_read(new_len.saturating_sub(buf.len())) {
            return false;
        }
        buf.resize(new_len, 0);
        true
    }

    /// Count a read-side buffer a connection made itself (`n` bytes), to be
    /// given back with [`Buffers::put_read`].
    pub fn hold_read(&mut self, n: usize) {
        self.read_held += n;
    }

    /// A read buffer comes back (any size; standard ones are pooled).
    pub fn put_read(&mut self, b: Vec<u8>) {
        self.read_held = self.read_held.saturating_sub(b.len());
        self.read.put(b);
    }

    /// Bytes of read buffers the connections hold now.
    pub fn read_held(&self) -> usize {
        self.read_held
    }

    /// The read-side budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes held by idle buffers of both pools (and the pools' own lists).
    pub fn pooled_bytes(&self) -> usize {
        self.send.pooled_bytes()
            + self.read.pooled_bytes()
            + (self.send.free.capacity() + self.read.free.capacity())
                * std::mem::size_of::<Vec<u8>>()
    }
}

/// The bytes a connection still has to send, in order.
#[derive(Default)]
pub struct SendQueue {
    bufs: VecDeque<Vec<u8>>,
    /// Bytes of the front buffer already written.
    head_written: usize,
    /// Unsent bytes in total.
    pending: usize,
}

impl SendQueue {
    /// Append to the queue: `render` writes into the tail buffer (appending
    /// keeps order), and what it appended is queued.
    #[inline]
    pub fn append<R>(
        &mut self,
        pool: &mut BufferPool,
        render: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> R {
        let need_new = match self.bufs.back() {
            None => true,
            Some(b) => b.len() >= APPEND_LIMIT,
        };
        if need_new {
            self.bufs.push_back(pool.get());
        }
        // A buffer was pushed above if there was none.
        let last = self.bufs.len() - 1;
        let tail = &mut self.bufs[last];
        let before = tail.len();
        let r = render(tail);
        let after = tail.len();
        self.pending += after - before;
        if after == 0 {
            // Nothing written (a poll that parked): keep no empty buffer in
            // the queue, or every parked poll holds one for its whole wait.
            if let Some(b) = self.bufs.pop_back() {
                pool.put(b);
            }
        }
        r
    }

    /// Unsent bytes.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// The unsent bytes, in order, one slice per buffer. They stay valid until the
    /// queue is next changed (appended to, advanced, cleared or dropped).
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> {
        self.bufs
            .iter()
            .enumerate()
            .map(|(i, b)| &b[if i == 0 { self.head_written } else { 0 }..])
            .filter(|b| !b.is_empty())
    }

    /// Record that `n` bytes from the front were written.
    pub fn advance(&mut self, n: usize, pool: &mut BufferPool) {
        debug_assert!(n <= self.pending);
        let mut n = n.min(self.pending);
        self.pending -= n;
        while n > 0 {
            let Some(front) = self.bufs.front() else {
                break;
            };
            let left = front.len() - self.head_written;
            if n >= left {
                n -= left;
                self.head_written = 0;
                if let Some(b) = self.bufs.pop_front() {
                    pool.put(b);
                }
            } else {
                self.head_written += n;
                n = 0;
            }
        }
        // Keep no empty buffer in the queue: it goes back to the pool.
        if self.pending == 0 {
            self.clear(pool);
        }
    }

    /// Return every buffer to the pool (connection closing).
    pub fn clear(&mut self, pool: &mut BufferPool) {
        while let Some(b) = self.bufs.pop_front() {
            pool.put(b);
        }
        self.pending = 0;
        self.head_written = 0;
    }

    /// Capacity of the buffers held (for memory accounting).
    pub fn capacity_bytes(&self) -> usize {
        self.bufs.iter().map(Vec::capacity).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(q: &mut SendQueue, pool: &mut BufferPool, bytes: &[u8]) {
        q.append(pool, |out| out.extend_from_slice(bytes));
    }

    /// Take at most `chunk` bytes per "write" from the queue, as a socket that
    /// takes partial writes would.
    fn drain(q: &mut SendQueue, pool: &mut BufferPool, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while !q.is_empty() {
            let first = q.chunks().next().expect("pending bytes have a chunk");
            let take = first.len().min(chunk);
            out.extend_from_slice(&first[..take]);
            q.advance(take, pool);
        }
        out
    }

    #[test]
    fn an_append_that_writes_nothing_holds_no_buffer() {
        let mut pool = BufferPool::new(4);
        let mut q = SendQueue::default();
        q.append(&mut pool, |_| ());
        assert!(q.is_empty());
        assert_eq!(q.capacity_bytes(), 0);
        assert_eq!(q.chunks().count(), 0);
        // And the buffer it took is back in the pool for the next one.
        assert!(pool.pooled_bytes() > 0);
        push(&mut q, &mut pool, b"answer");
        assert_eq!(drain(&mut q, &mut pool, 3), b"answer");
    }

    #[test]
    fn pipelined_answers_share_one_buffer_in_order() {
        let mut pool = BufferPool::new(8);
        let mut q = SendQueue::default();
        for i in 0..100u8 {
            push(&mut q, &mut pool, &[i; 10]);
        }
        assert_eq!(q.pending(), 1000);
        assert_eq!(q.chunks().count(), 1, "one buffer, one write");
        let expect: Vec<u8> = (0..100u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(drain(&mut q, &mut pool, usize::MAX), expect);
        assert!(q.is_empty());
        assert_eq!(pool.free.len(), 1, "the buffer went back to the pool");
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let mut pool = BufferPool::new(8);
        let mut q = SendQueue::default();
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        push(&mut q, &mut pool, &big);
        push(&mut q, &mut pool, b"tail");
        assert_eq!(
            q.chunks().count(),
            2,
            "a large answer starts a new buffer after it"
        );
        let mut expect = big.clone();
        expect.extend_from_slice(b"tail");
        assert_eq!(drain(&mut q, &mut pool, 7001), expect);
        assert_eq!(q.chunks().count(), 0);
        assert_eq!(q.capacity_bytes(), 0);
    }

    #[test]
    fn read_pool_keeps_only_standard_buffers() {
        let mut b = Buffers::default();
        let r = b.take_read().unwrap();
        assert_eq!(r.len(), READ_BUF);
        b.put_read(r);
        b.hold_read(READ_BUF * 2);
        b.put_read(vec![0; READ_BUF * 2]);
        assert_eq!(b.read.pooled_bytes(), READ_BUF + READ_BUF * 2);
        assert_eq!(b.read_held(), 0);
        // Odd sizes below the standard one (a parked request's copy) are not kept.
        b.hold_read(100);
        b.put_read(vec![0; 100]);
        assert_eq!(b.read.pooled_bytes(), READ_BUF + READ_BUF * 2);
    }

    #[test]
    fn grown_read_buffers_are_reused_with_their_bytes_and_counted() {
        let mut b = Buffers::new(64 * READ_BUF);
        let mut r = b.take_read().unwrap();
        r[..5].copy_from_slice(b"hello");
        assert!(b.grow_read_buf(&mut r, 5, 2 * READ_BUF, usize::MAX));
        assert_eq!(r.len(), 2 * READ_BUF);
        assert!(b.grow_read_buf(&mut r, 5, 4 * READ_BUF, usize::MAX));
        assert_eq!(&r[..5], b"hello");
        assert_eq!(b.read_held(), 4 * READ_BUF);
        b.put_read(r);
        assert_eq!(b.read_held(), 0);
        assert_eq!(b.read.pooled_bytes(), 4 * READ_BUF);

        // The next connection that grows takes the pooled one, bytes kept, and
        // its standard buffer goes back to the pool.
        let mut r = b.take_read().unwrap();
        assert_eq!(b.read.pooled_bytes(), 4 * READ_BUF);
        r[..3].copy_from_slice(b"abc");
        assert!(b.grow_read_buf(&mut r, 3, 2 * READ_BUF, usize::MAX));
        assert_eq!(r.len(), 4 * READ_BUF, "the pooled grown buffer");
        assert_eq!(&r[..3], b"abc");
        assert_eq!(b.read_held(), 4 * READ_BUF);
        assert_eq!(b.read.pooled_bytes(), READ_BUF);

        // A pooled buffer far larger than the growth needs is left alone.
        b.put_read(r);
        let mut r = b.take_read().unwrap();
        b.hold_read(40 * READ_BUF);
        b.put_read(vec![0; 40 * READ_BUF]);
        assert!(b.grow_read_buf(&mut r, 0, 2 * READ_BUF, 3 * READ_BUF));
        assert_eq!(r.len(), 2 * READ_BUF, "none within the limit");
        b.put_read(r);
        let mut r = b.take_read().unwrap();
        assert!(b.grow_read_buf(&mut r, 0, 2 * READ_BUF, usize::MAX));
        assert_eq!(r.len(), 4 * READ_BUF);
        let mut s = b.take_read().unwrap();
        assert!(b.grow_read_buf(&mut s, 0, 2 * READ_BUF, usize::MAX));
        assert_eq!(s.len(), 2 * READ_BUF, "not the 40x one");

        // Over the budget: refused, the buffer unchanged.
        let mut t = b.take_read().unwrap();
        assert!(!b.grow_read_buf(&mut t, 0, 60 * READ_BUF, usize::MAX));
        assert_eq!(t.len(), READ_BUF);
    }

    #[test]
    fn a_sized_take_starts_in_a_grown_buffer_within_the_budget() {
        let mut b = Buffers::new(16 * READ_BUF);
        b.hold_read(4 * READ_BUF);
        b.put_read(vec![0; 4 * READ_BUF]);
        // Standard size asked: a standard buffer.
        let r = b.take_read_sized(READ_BUF, usize::MAX).unwrap();
        assert_eq!(r.len(), READ_BUF);
        b.put_read(r);
        // Over the limit: a standard one.
        let r = b.take_read_sized(4 * READ_BUF, 2 * READ_BUF).unwrap();
        assert_eq!(r.len(), READ_BUF);
        b.put_read(r);
        // The grown one, counted.
        let r = b.take_read_sized(4 * READ_BUF, usize::MAX).unwrap();
        assert_eq!(r.len(), 4 * READ_BUF);
        assert_eq!(b.read_held(), 4 * READ_BUF);
        // With the budget's growth share used up: a standard one, and the
        // grown one stays pooled.
        b.put_read(r);
        b.hold_read(11 * READ_BUF);
        let r = b.take_read_sized(4 * READ_BUF, usize::MAX).unwrap();
        assert_eq!(r.len(), READ_BUF);
        assert_eq!(b.read.pooled_bytes(), 4 * READ_BUF);
    }

    #[test]
    fn the_grown_pool_is_bounded() {
        let mut b = Buffers::default();
        for _ in 0..10 {
            b.hold_read(GROWN_POOL_BYTES / 4);
            b.put_read(vec![0; GROWN_POOL_BYTES / 4]);
        }
        assert_eq!(b.read.pooled_bytes(), GROWN_POOL_BYTES);
    }

    #[test]
    fn read_buffers_stay_within_the_budget_and_growth_leaves_a_reserve() {
        let mut b = Buffers::new(8 * READ_BUF);
        let mut held: Vec<Vec<u8>> = (0..4).map(|_| b.take_read().unwrap()).collect();
        // Growth stops at 7/8 of the budget...
        assert!(b.grow_read(5 * READ_BUF / 2));
        assert!(!b.grow_read(READ_BUF), "the reserve is for first buffers");
        // ...first buffers at the budget itself.
        held.push(b.take_read().unwrap());
        assert!(b.take_read().is_none());
        assert_eq!(b.read_held(), 8 * READ_BUF - READ_BUF / 2);
        for r in held {
            b.put_read(r);
        }
        assert_eq!(b.read_held(), 5 * READ_BUF / 2);
    }
}
