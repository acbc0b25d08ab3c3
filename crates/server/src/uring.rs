//! Batched writes through io_uring.
//!
//! A worker answers the requests of every ready connection first and writes
//! afterwards: each connection with bytes waiting gets one entry (`SEND` for one
//! buffer, `SENDMSG` for several) and a single `io_uring_enter` submits them all
//! and waits for all their completions. A loop turn that served k connections
//! costs one `epoll_wait`, k `recv`s and one `io_uring_enter` instead of k
//! `send`s, so a busy worker makes about one syscall per non-pipelined request
//! instead of two.
//!
//! Every entry carries `MSG_DONTWAIT`: a full socket completes at once with
//! `EAGAIN` (the connection then waits for its writable edge from epoll, as with
//! `send`) instead of leaving the write pending in the kernel. [`SendBatch::submit`]
//! returns only when every entry has completed, so the bytes the entries point
//! into are never changed while the kernel may still read them.

use crate::send_queue::SendQueue;
use io_uring::{opcode, types, IoUring, Probe};
use std::io;
use std::os::fd::RawFd;

/// Most entries in one submission (the ring's size).
pub const MAX_BATCH: usize = 256;
/// Most buffers of one connection in one entry.
const MAX_IOV: usize = 16;

const EMPTY_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// The result of one entry: bytes written, or the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Bytes(usize),
    /// The socket's buffer is full: wait for the writable edge.
    WouldBlock,
    /// The connection is dead (reset, closed, or the send wrote nothing).
    Failed,
}

pub struct SendBatch {
    ring: IoUring,
    /// Per entry: the iovecs a `SENDMSG` points to, and its header.
    iovs: Box<[[libc::iovec; MAX_IOV]]>,
    msgs: Box<[libc::msghdr]>,
    /// Per entry, filled by `submit`.
    results: Vec<i32>,
    queued: usize,
}

// SAFETY: the raw pointers in `iovs` and `msgs` are written by `push` and read by
// the kernel during the `submit` that follows, both on the thread that owns the
// batch; between submissions they are stale and nothing reads them. The batch is
// created on the starting thread and then moved, whole, to its worker thread.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// A ring for one worker, or an error where the kernel refuses io_uring or
    /// lacks `SEND`/`SENDMSG` (the worker then writes with `send`).
    pub fn new() -> io::Result<SendBatch> {
        let ring = IoUring::builder()
            // Completions are reaped only in `submit`: no need to interrupt the
            // worker to post them.
            .setup_coop_taskrun()
            .setup_cqsize(2 * MAX_BATCH as u32)
            .build(MAX_BATCH as u32)
            .or_else(|_| IoUring::new(MAX_BATCH as u32))?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Send::CODE) || !probe.is_supported(opcode::SendMsg::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without SEND/SENDMSG",
            ));
        }
        // SAFETY: an all-zero msghdr is a valid value (null pointers, zero lengths).
        let empty_msg: libc::msghdr = unsafe { std::mem::zeroed() };
        Ok(SendBatch {
            ring,
            iovs: vec![[EMPTY_IOV; MAX_IOV]; MAX_BATCH].into_boxed_slice(),
            msgs: vec![empty_msg; MAX_BATCH].into_boxed_slice(),
            results: Vec::with_capacity(MAX_BATCH),
            queued: 0,
        })
    }

    /// Heap bytes the batch holds (its ring is mapped memory outside the heap).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.iovs)
            + std::mem::size_of_val(&*self.msgs)
            + self.results.capacity() * std::mem::size_of::<i32>()
    }

    /// Entries queued for the next [`SendBatch::submit`].
    pub fn len(&self) -> usize {
        self.queued
    }

    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    pub fn is_full(&self) -> bool {
        self.queued == MAX_BATCH
    }

    /// Queue a write of `q`'s unsent bytes to socket `fd`; returns the entry's
    /// index (its result is `results[index]` after `submit`), or `None` when the
    /// batch is full or `q` has nothing to send.
    ///
    /// # Safety
    /// `q` must not be changed, moved or dropped, and `fd` must stay open, until
    /// the next [`SendBatch::submit`] has returned: the entry points into `q`'s
    /// buffers.
    pub unsafe fn push(&mut self, fd: RawFd, q: &SendQueue) -> Option<usize> {
        if self.is_full() {
            return None;
        }
        let i = self.queued;
        let iov = &mut self.iovs[i];
        let n = q.unsent(iov);
        if n == 0 {
            return None;
        }
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        let entry = if n == 1 {
            let len = u32::try_from(iov[0].iov_len).unwrap_or(u32::MAX);
            opcode::Send::new(types::Fd(fd), iov[0].iov_base as *const u8, len)
                .flags(flags)
                .build()
        } else {
            let msg = &mut self.msgs[i];
            msg.msg_iov = iov.as_mut_ptr();
            msg.msg_iovlen = n as _;
            opcode::SendMsg::new(types::Fd(fd), msg as *const libc::msghdr)
                .flags(flags as u32)
                .build()
        }
        .user_data(i as u64);
        // SAFETY: the entry points into `q`'s buffers (valid until `submit` returns,
        // by this function's contract) and into `self.iovs[i]`/`self.msgs[i]`,
        // which are not written again before `submit` has reaped every completion.
        // The ring has MAX_BATCH entries and at most MAX_BATCH are queued between
        // submissions, so the push cannot fail.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            return None;
        }
        self.queued += 1;
        Some(i)
    }

    /// Submit the queued entries and wait until every one has completed; their
    /// results are then in [`SendBatch::result`]. An error means the ring cannot
    /// be used (nothing was left in flight): the caller writes those queues
    /// another way and stops using the batch.
    pub fn submit(&mut self) -> io::Result<()> {
        let n = self.queued;
        self.results.clear();
        self.results.resize(n, -libc::EAGAIN);
        let mut reaped = 0;
        while reaped < n {
            match self.ring.submit_and_wait(n - reaped) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    let unsubmitted = self.ring.submission().len();
                    if reaped + unsubmitted == n {
                        // Nothing is in the kernel: drop what was never submitted.
                        // The ring goes with the batch (the caller stops using it).
                        self.queued = 0;
                        return Err(e);
                    }
                    // Entries are in flight and point into live buffers: they
                    // must complete before anything moves. Keep waiting.
                }
            }
            for cqe in self.ring.completion() {
                if let Some(r) = self.results.get_mut(cqe.user_data() as usize) {
                    *r = cqe.result();
                }
                reaped += 1;
            }
        }
        self.queued = 0;
        Ok(())
    }

    /// The result of entry `i` of the last submission.
    pub fn result(&self, i: usize) -> Sent {
        match self.results.get(i).copied() {
            Some(r) if r > 0 => Sent::Bytes(r as usize),
            Some(r) if r == -libc::EAGAIN || r == -libc::EINTR => Sent::WouldBlock,
            _ => Sent::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send_queue::BufferPool;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        a.set_nonblocking(true).unwrap();
        (a, b)
    }

    fn fill(q: &mut SendQueue, pool: &mut BufferPool, bytes: &[u8]) {
        q.tail(pool).extend_from_slice(bytes);
        q.commit(bytes.len());
    }

    #[test]
    fn one_submission_writes_every_queue() {
        let mut batch = SendBatch::new().expect("io_uring with SEND/SENDMSG on this kernel");
        let mut pool = BufferPool::new(8);
        let socks: Vec<_> = (0..5).map(|_| pair()).collect();
        let mut queues: Vec<SendQueue> = (0..5).map(|_| SendQueue::default()).collect();
        for (i, q) in queues.iter_mut().enumerate() {
            fill(q, &mut pool, format!("response {i};").as_bytes());
            if i == 3 {
                // Several buffers: goes out as one SENDMSG, in order.
                let big = vec![b'x'; 70_000];
                fill(q, &mut pool, &big);
                fill(q, &mut pool, b"end");
            }
        }
        let mut idx = Vec::new();
        for (i, q) in queues.iter().enumerate() {
            // SAFETY: the queues and sockets live until after `submit`.
            idx.push(unsafe { batch.push(socks[i].0.as_raw_fd(), q) }.unwrap());
        }
        assert_eq!(batch.len(), 5);
        batch.submit().unwrap();
        assert!(batch.is_empty());
        for (i, q) in queues.iter_mut().enumerate() {
            let want = q.pending();
            assert_eq!(batch.result(idx[i]), Sent::Bytes(want), "queue {i}");
            q.advance(want, &mut pool);
            let mut got = vec![0u8; want];
            let mut b = &socks[i].1;
            b.read_exact(&mut got).unwrap();
            assert!(got.starts_with(format!("response {i};").as_bytes()));
            if i == 3 {
                assert!(got.ends_with(b"end"));
            }
        }
    }

    #[test]
    fn a_full_socket_says_would_block_and_a_closed_one_fails() {
        let mut batch = SendBatch::new().expect("io_uring with SEND/SENDMSG on this kernel");
        let mut pool = BufferPool::new(8);
        // The peer never reads: sends fill its buffers, then EAGAIN.
        let (a, _b) = pair();
        let mut q = SendQueue::default();
        let chunk = vec![7u8; 60_000];
        let mut saw_block = false;
        for _ in 0..2000 {
            while q.pending() < 1_000_000 {
                fill(&mut q, &mut pool, &chunk);
            }
            // SAFETY: `q` and `a` live until after `submit`.
            let i = unsafe { batch.push(a.as_raw_fd(), &q) }.unwrap();
            batch.submit().unwrap();
            match batch.result(i) {
                Sent::Bytes(n) => q.advance(n, &mut pool),
                Sent::WouldBlock => {
                    saw_block = true;
                    break;
                }
                Sent::Failed => panic!("a live socket failed"),
            }
        }
        assert!(saw_block, "the socket never filled");

        // A connection whose peer is gone: the send fails (EPIPE/ECONNRESET), and
        // MSG_NOSIGNAL keeps SIGPIPE away from the test process.
        let (c, d) = pair();
        drop(d);
        let mut q2 = SendQueue::default();
        let mut failed = false;
        for _ in 0..50 {
            fill(&mut q2, &mut pool, b"hello");
            // SAFETY: `q2` and `c` live until after `submit`.
            let i = unsafe { batch.push(c.as_raw_fd(), &q2) }.unwrap();
            batch.submit().unwrap();
            match batch.result(i) {
                Sent::Bytes(n) => q2.advance(n, &mut pool),
                Sent::Failed => {
                    failed = true;
                    break;
                }
                Sent::WouldBlock => {}
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(failed, "writes to a closed peer never failed");
    }
}
