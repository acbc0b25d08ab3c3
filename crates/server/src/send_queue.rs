//! Where bytes are written: each connection's queue of owned, pooled buffers.
//!
//! Responses are rendered straight into the queue's tail buffer, so a batch of
//! pipelined responses usually sits in one buffer and goes out in one `write`;
//! when several buffers are queued (a large response, or back-pressure), they go
//! out together with one `writev`. Drained buffers return to the worker's
//! [`BufferPool`] with their capacity, so the steady state allocates nothing.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

/// Buffers are started at this capacity and kept up to [`MAX_POOLED`].
pub const BUFFER_CAPACITY: usize = 16 * 1024;
/// A buffer that grew past this is dropped instead of pooled.
const MAX_POOLED: usize = 256 * 1024;
/// A response is appended to the tail buffer while it stays under this size.
const APPEND_LIMIT: usize = 64 * 1024;
/// Most buffers passed to one `writev`.
const MAX_IOV: usize = 64;

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
    /// The buffer to render the next response into (appending keeps order).
    /// The caller must call [`SendQueue::commit`] after appending to it.
    pub fn tail(&mut self, pool: &mut BufferPool) -> &mut Vec<u8> {
        let need_new = match self.bufs.back() {
            None => true,
            Some(b) => b.len() >= APPEND_LIMIT,
        };
        if need_new {
            self.bufs.push_back(pool.get());
        }
        // A buffer was pushed above if there was none.
        let len = self.bufs.len();
        &mut self.bufs[len - 1]
    }

    /// Record that `n` bytes were appended to the tail.
    pub fn commit(&mut self, n: usize) {
        self.pending += n;
    }

    /// Unsent bytes.
    pub fn pending(&self) -> usize {
        self.pending
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Write as much as the socket takes. Returns the bytes written; `Ok` with
    /// unsent bytes left means the socket would block.
    pub fn flush<W: Write>(&mut self, w: &mut W, pool: &mut BufferPool) -> io::Result<usize> {
        let mut total = 0;
        while self.pending > 0 {
            let res = if self.bufs.len() == 1 {
                w.write(&self.bufs[0][self.head_written..])
            } else {
                let mut iov: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
                let mut n = 0;
                for (i, b) in self.bufs.iter().enumerate().take(MAX_IOV) {
                    let start = if i == 0 { self.head_written } else { 0 };
                    iov[n] = IoSlice::new(&b[start..]);
                    n += 1;
                }
                w.write_vectored(&iov[..n])
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    total += n;
                    self.consume(n, pool);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Point `out` at the unsent bytes, in order, one entry per buffer (at most
    /// `out.len()` buffers). Returns how many entries were filled. For a writer that
    /// sends later ([`crate::uring`]): the entries stay valid until the queue is next
    /// changed (appended to, advanced, cleared or dropped).
    pub fn unsent(&self, out: &mut [libc::iovec]) -> usize {
        let mut n = 0;
        for (i, b) in self.bufs.iter().enumerate().take(out.len()) {
            let start = if i == 0 { self.head_written } else { 0 };
            let rest = &b[start..];
            if rest.is_empty() {
                continue;
            }
            out[n] = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            n += 1;
        }
        n
    }

    /// Record that `n` bytes from the front were written (by a writer that took
    /// them from [`SendQueue::unsent`]).
    pub fn advance(&mut self, n: usize, pool: &mut BufferPool) {
        debug_assert!(n <= self.pending);
        self.consume(n.min(self.pending), pool);
    }

    fn consume(&mut self, mut n: usize, pool: &mut BufferPool) {
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
        // Keep one empty buffer out of the queue: it goes back to the pool.
        if self.pending == 0 {
            self.head_written = 0;
            while let Some(b) = self.bufs.pop_front() {
                pool.put(b);
            }
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

    /// A writer that takes at most `chunk` bytes per call, then would block
    /// after `budget` bytes.
    struct Trickle {
        out: Vec<u8>,
        chunk: usize,
        budget: usize,
        calls: usize,
    }
    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.budget == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = b.len().min(self.chunk).min(self.budget);
            self.out.extend_from_slice(&b[..n]);
            self.budget -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn push(q: &mut SendQueue, pool: &mut BufferPool, bytes: &[u8]) {
        let t = q.tail(pool);
        t.extend_from_slice(bytes);
        q.commit(bytes.len());
    }

    #[test]
    fn batches_go_out_in_one_write_and_in_order() {
        let mut pool = BufferPool::new(8);
        let mut q = SendQueue::default();
        for i in 0..100u8 {
            push(&mut q, &mut pool, &[i; 10]);
        }
        let mut w = Trickle {
            out: vec![],
            chunk: usize::MAX,
            budget: usize::MAX,
            calls: 0,
        };
        assert_eq!(q.flush(&mut w, &mut pool).unwrap(), 1000);
        assert_eq!(w.calls, 1);
        assert!(q.is_empty());
        let expect: Vec<u8> = (0..100u8).flat_map(|i| [i; 10]).collect();
        assert_eq!(w.out, expect);
        assert_eq!(pool.free.len(), 1, "the buffer went back to the pool");
    }

    #[test]
    fn unsent_and_advance_walk_the_queue_in_order() {
        let mut pool = BufferPool::new(8);
        let mut q = SendQueue::default();
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        push(&mut q, &mut pool, &big);
        push(&mut q, &mut pool, b"tail");
        let mut out = Vec::new();
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        // Take 7001 bytes at a time, as a socket that takes partial writes would.
        while !q.is_empty() {
            let n = q.unsent(&mut iov);
            assert!(n >= 1);
            let first = iov[0];
            // SAFETY: the entry points into the queue's front buffer, which is not
            // changed until `advance` below.
            let bytes =
                unsafe { std::slice::from_raw_parts(first.iov_base as *const u8, first.iov_len) };
            let take = bytes.len().min(7001);
            out.extend_from_slice(&bytes[..take]);
            q.advance(take, &mut pool);
        }
        let mut expect = big.clone();
        expect.extend_from_slice(b"tail");
        assert_eq!(out, expect);
        assert_eq!(q.unsent(&mut iov), 0);
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let mut pool = BufferPool::new(8);
        let mut q = SendQueue::default();
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        push(&mut q, &mut pool, &big);
        push(&mut q, &mut pool, b"tail");
        let mut w = Trickle {
            out: vec![],
            chunk: 7001,
            budget: 50_000,
            calls: 0,
        };
        q.flush(&mut w, &mut pool).unwrap();
        assert_eq!(q.pending(), 200_004 - 50_000);
        w.budget = usize::MAX;
        q.flush(&mut w, &mut pool).unwrap();
        assert!(q.is_empty());
        let mut expect = big.clone();
        expect.extend_from_slice(b"tail");
        assert_eq!(w.out, expect);
    }
}
