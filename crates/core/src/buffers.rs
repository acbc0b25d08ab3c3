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
const MAX_POOLED: usize = 256 * 1024;
/// A response is appended to the tail buffer while it stays under this size.
const APPEND_LIMIT: usize = 64 * 1024;
/// Read buffers are this size (larger for large bodies). A connection holds one
/// only while it has bytes of an unfinished request; between requests it goes
/// back to the pool, so idle keep-alive connections cost no buffer.
pub const READ_BUF: usize = 16 * 1024;
/// Most idle read buffers a worker keeps.
const READ_POOL_MAX: usize = 256;
/// Most idle send buffers a worker keeps.
const SEND_POOL_MAX: usize = 1024;

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

/// Idle read buffers, each [`READ_BUF`] long (zero-filled once, reused as is).
pub struct ReadPool {
    free: Vec<Vec<u8>>,
}

impl ReadPool {
    pub fn take(&mut self) -> Vec<u8> {
        self.free.pop().unwrap_or_else(|| vec![0; READ_BUF])
    }

    /// Keep `b` if it is a standard buffer and the pool has room.
    pub fn put(&mut self, b: Vec<u8>) {
        if b.len() == READ_BUF && self.free.len() < READ_POOL_MAX {
            self.free.push(b);
        }
    }

    pub fn pooled_bytes(&self) -> usize {
        self.free.len() * READ_BUF
    }
}

/// The pools of one worker.
pub struct Buffers {
    pub send: BufferPool,
    pub read: ReadPool,
}

impl Default for Buffers {
    fn default() -> Self {
        Buffers {
            send: BufferPool::new(SEND_POOL_MAX),
            read: ReadPool {
                free: Vec::with_capacity(READ_POOL_MAX),
            },
        }
    }
}

impl Buffers {
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
        self.pending += tail.len() - before;
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
        let r = b.read.take();
        assert_eq!(r.len(), READ_BUF);
        b.read.put(r);
        b.read.put(vec![0; READ_BUF * 2]);
        assert_eq!(b.read.pooled_bytes(), READ_BUF);
    }
}
