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
//! Where the kernel has `IORING_OP_EPOLL_WAIT` (Linux 6.15+), the wait for the next
//! readiness events rides in the same call: the worker's `epoll_wait` becomes an
//! entry of the ring, and one `io_uring_enter` both sends the last turn's responses
//! and sleeps until the next events (or the next tick). A turn that served k
//! connections then costs k `recv`s and one `io_uring_enter`.
//!
//! Every entry carries `MSG_DONTWAIT`: a full socket completes at once with
//! `EAGAIN` (the connection then waits for its writable edge from epoll, as with
//! `send`) instead of leaving the write pending in the kernel. [`SendBatch::submit`]
//! returns only when every entry has completed, so the bytes the entries point
//! into are never changed while the kernel may still read them.
//!
//! What it is not: the choice between `send` and the ring ([`super::transmit`]).

use io_uring::{opcode, types, IoUring, Probe};
use pollbox_core::buffers::SendQueue;
use std::io;
use std::os::fd::RawFd;

/// What became of a connection's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    /// This many bytes went out (all, or as much as the socket took).
    Bytes(usize),
    /// The socket's buffer is full: wait for the writable edge.
    WouldBlock,
    /// The connection is dead.
    Failed,
    /// Noted for the end of the turn (or, in a failed turn's results: not sent).
    Deferred,
}

/// Most entries in one submission (the ring's size).
pub(super) const MAX_BATCH: usize = 256;
/// Most buffers of one connection in one entry.
const MAX_IOV: usize = 16;
/// Most readiness events one wait returns.
pub(super) const MAX_EVENTS: usize = 1024;
/// `user_data` of the EPOLL_WAIT entry and of its cancellation (sends use their
/// index, below MAX_BATCH).
const EPOLL_TAG: u64 = u64::MAX;
const CANCEL_TAG: u64 = u64::MAX - 1;

const EMPTY_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

pub(super) struct SendBatch {
    ring: IoUring,
    /// Per entry: the iovecs a `SENDMSG` points to, and its header.
    iovs: Box<[[libc::iovec; MAX_IOV]]>,
    msgs: Box<[libc::msghdr]>,
    /// Per entry, filled by `submit`.
    results: Vec<i32>,
    queued: usize,
    /// The worker's epoll instance, when the wait rides in the ring.
    epoll: Option<RawFd>,
    /// Where the EPOLL_WAIT entry writes its events.
    events: Box<[libc::epoll_event]>,
    /// An EPOLL_WAIT entry is in the kernel (it may write `events` any time).
    epoll_armed: bool,
    /// Events written by the last EPOLL_WAIT completion and not taken yet.
    events_ready: usize,
    /// Created disabled: [`SendBatch::enable`] not called yet.
    disabled: bool,
}

// SAFETY: the raw pointers in `iovs` and `msgs` are written by `push` and read by
// the kernel during the `submit` that follows, both on the thread that owns the
// batch; between submissions they are stale and nothing reads them. The batch is
// created on the starting thread and then moved, whole, to its worker thread.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// A ring for one worker, or an error where the kernel refuses io_uring or
    /// lacks `SEND`/`SENDMSG` (the worker then writes with `send`).
    pub(super) fn new() -> io::Result<SendBatch> {
        // Single issuer with deferred task work: completions that need the
        // worker's task (the EPOLL_WAIT's) run when it waits in io_uring_enter,
        // with no interrupt. Created disabled, so that the worker thread that
        // enables it ([`SendBatch::enable`]) becomes its one issuer.
        let (ring, disabled) = match IoUring::builder()
            .setup_r_disabled()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_cqsize(2 * MAX_BATCH as u32)
            .build(MAX_BATCH as u32)
        {
            Ok(r) => (r, true),
            Err(_) => (
                IoUring::builder()
                    .setup_cqsize(2 * MAX_BATCH as u32)
                    .build(MAX_BATCH as u32)
                    .or_else(|_| IoUring::new(MAX_BATCH as u32))?,
                false,
            ),
        };
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
            epoll: None,
            events: Vec::new().into_boxed_slice(),
            epoll_armed: false,
            events_ready: 0,
            disabled,
        })
    }

    /// Enable the ring on the thread that will use it (its single issuer). Call
    /// once, on the worker thread, before anything is submitted.
    pub(super) fn enable(&mut self) -> io::Result<()> {
        if self.disabled {
            self.ring.submitter().register_enable_rings()?;
            self.disabled = false;
        }
        Ok(())
    }

    /// Wait for `epoll_fd`'s events through the ring from now on, if the kernel
    /// can (`IORING_OP_EPOLL_WAIT`). Returns whether it will.
    pub(super) fn attach_epoll(&mut self, epoll_fd: RawFd) -> bool {
        let mut probe = Probe::new();
        if self.ring.submitter().register_probe(&mut probe).is_err()
            || !probe.is_supported(opcode::EpollWait::CODE)
        {
            return false;
        }
        self.events = vec![libc::epoll_event { events: 0, u64: 0 }; MAX_EVENTS].into_boxed_slice();
        self.epoll = Some(epoll_fd);
        true
    }

    /// Whether the worker waits for its events with [`SendBatch::submit_and_wait`].
    pub(super) fn waits_for_events(&self) -> bool {
        self.epoll.is_some()
    }

    /// Heap bytes the batch holds (its ring is mapped memory outside the heap).
    pub(super) fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.iovs)
            + std::mem::size_of_val(&*self.msgs)
            + std::mem::size_of_val(&*self.events)
            + self.results.capacity() * std::mem::size_of::<i32>()
    }

    /// Entries queued for the next [`SendBatch::submit`].
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.queued
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queued == 0
    }

    pub(super) fn is_full(&self) -> bool {
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
    pub(super) unsafe fn push(&mut self, fd: RawFd, q: &SendQueue) -> Option<usize> {
        if self.is_full() {
            return None;
        }
        let i = self.queued;
        let iov = &mut self.iovs[i];
        let mut n = 0;
        for (slot, chunk) in iov.iter_mut().zip(q.chunks()) {
            *slot = libc::iovec {
                iov_base: chunk.as_ptr() as *mut libc::c_void,
                iov_len: chunk.len(),
            };
            n += 1;
        }
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
    /// be used (no send was left in flight): the caller writes those queues
    /// another way and stops using the batch.
    pub(super) fn submit(&mut self) -> io::Result<()> {
        self.submit_inner(None)
    }

    /// Like [`SendBatch::submit`], and also wait (at most `timeout`) for the next
    /// readiness events of the attached epoll instance, in the same call; take
    /// them with [`SendBatch::take_events`].
    pub(super) fn submit_and_wait(&mut self, timeout: std::time::Duration) -> io::Result<()> {
        self.submit_inner(Some(timeout))
    }

    fn submit_inner(&mut self, timeout: Option<std::time::Duration>) -> io::Result<()> {
        let n = self.queued;
        self.results.clear();
        self.results.resize(n, -libc::EAGAIN);
        if let (Some(timeout), Some(fd)) = (timeout, self.epoll) {
            // Events already taken off the ring and not handled: no wait.
            if self.events_ready == 0 {
                if !self.epoll_armed {
                    let entry = opcode::EpollWait::new(
                        types::Fd(fd),
                        self.events.as_mut_ptr().cast::<types::epoll_event>(),
                        self.events.len() as u32,
                    )
                    .build()
                    .user_data(EPOLL_TAG);
                    // SAFETY: `events` is a heap buffer owned by the batch and
                    // neither moved nor freed while the entry is armed: it is read
                    // only after the entry's completion, and `disarm` (run on drop
                    // too) cancels the entry and waits for that completion.
                    if unsafe { self.ring.submission().push(&entry) }.is_err() {
                        // The queue is full of sends: submit them first.
                        self.ring.submit()?;
                        // SAFETY: as above.
                        unsafe { self.ring.submission().push(&entry) }
                            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
                    }
                    self.epoll_armed = true;
                }
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                match self.ring.submitter().submit_with_args(n + 1, &args) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) => {}
                    Err(e) => return self.after_error(e, n, 0),
                }
            }
        }
        let mut reaped = self.reap();
        while reaped < n {
            match self.ring.submit_and_wait(n - reaped) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => return self.after_error(e, n, reaped),
            }
            reaped += self.reap();
        }
        self.queued = 0;
        Ok(())
    }

    /// An `io_uring_enter` failed for good. If no send is in the kernel, drop the
    /// unsubmitted ones and report it (the ring is not used again); otherwise the
    /// sends point into live buffers and must complete first: keep waiting.
    fn after_error(&mut self, e: io::Error, n: usize, mut reaped: usize) -> io::Result<()> {
        loop {
            let unsubmitted = self.ring.submission().len();
            if reaped + unsubmitted >= n {
                self.queued = 0;
                return Err(e);
            }
            let _ = self.ring.submit_and_wait(1);
            reaped += self.reap();
            if reaped >= n {
                self.queued = 0;
                return Ok(());
            }
        }
    }

    /// Take every completion off the ring; returns how many were sends.
    fn reap(&mut self) -> usize {
        let mut sends = 0;
        for cqe in self.ring.completion() {
            match cqe.user_data() {
                EPOLL_TAG => {
                    self.epoll_armed = false;
                    self.events_ready = usize::try_from(cqe.result()).unwrap_or(0);
                }
                CANCEL_TAG => {}
                i => {
                    if let Some(r) = self.results.get_mut(i as usize) {
                        *r = cqe.result();
                    }
                    sends += 1;
                }
            }
        }
        sends
    }

    /// Append the events of the last wait to `out` as `(token, epoll flags)`.
    pub(super) fn take_events(&mut self, out: &mut Vec<(u64, u32)>) {
        let n = self.events_ready.min(self.events.len());
        for ev in &self.events[..n] {
            // Copies: the struct is packed on x86-64.
            let (data, flags) = (ev.u64, ev.events);
            out.push((data, flags));
        }
        self.events_ready = 0;
    }

    /// Cancel an armed EPOLL_WAIT and wait for its completion (events it had
    /// already taken are kept for [`SendBatch::take_events`]). After this the
    /// kernel holds no pointer into the batch.
    pub(super) fn disarm(&mut self) {
        if self.disabled {
            return;
        }
        let mut tries = 0;
        while self.epoll_armed {
            if tries == 0 {
                let cancel = opcode::AsyncCancel::new(EPOLL_TAG)
                    .build()
                    .user_data(CANCEL_TAG);
                // SAFETY: a cancellation points at no memory.
                let _ = unsafe { self.ring.submission().push(&cancel) };
            }
            let _ = self.ring.submit_and_wait(1);
            self.reap();
            tries += 1;
            if tries > 1000 {
                // The kernel never completed it: never free the buffer it may write.
                std::mem::forget(std::mem::take(&mut self.events));
                self.epoll_armed = false;
            }
        }
    }

    /// The result of entry `i` of the last submission: bytes written,
    /// [`Sent::WouldBlock`] or [`Sent::Failed`] (never `Deferred`).
    pub(super) fn result(&self, i: usize) -> Sent {
        match self.results.get(i).copied() {
            Some(r) if r > 0 => Sent::Bytes(r as usize),
            Some(r) if r == -libc::EAGAIN || r == -libc::EINTR => Sent::WouldBlock,
            _ => Sent::Failed,
        }
    }
}

impl Drop for SendBatch {
    fn drop(&mut self) {
        self.disarm();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollbox_core::buffers::BufferPool;
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
        q.append(pool, |out| out.extend_from_slice(bytes));
    }

    #[test]
    fn one_submission_writes_every_queue() {
        let mut batch = SendBatch::new().expect("io_uring with SEND/SENDMSG on this kernel");
        batch.enable().unwrap();
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
        batch.enable().unwrap();
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
                Sent::Failed | Sent::Deferred => panic!("a live socket failed"),
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
                Sent::Deferred => unreachable!("a batch result is never deferred"),
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(failed, "writes to a closed peer never failed");
    }

    /// An epoll instance watching `fd` for input, edge-triggered, with `token`.
    fn epoll_with(fd: RawFd, token: u64) -> std::os::fd::OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscalls on descriptors this test owns; the new epoll fd
        // is owned by the returned OwnedFd.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(ep >= 0);
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: token,
            };
            assert_eq!(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev), 0);
            std::os::fd::OwnedFd::from_raw_fd(ep)
        }
    }

    #[test]
    fn the_wait_for_events_rides_with_the_sends() {
        use std::io::Write;
        use std::time::{Duration, Instant};
        let mut batch = SendBatch::new().expect("io_uring with SEND/SENDMSG on this kernel");
        batch.enable().unwrap();
        let (a, mut b) = pair();
        let ep = epoll_with(a.as_raw_fd(), 42);
        if !batch.attach_epoll(ep.as_raw_fd()) {
            eprintln!("no IORING_OP_EPOLL_WAIT before Linux 6.15: sends only");
            return;
        }
        let mut pool = BufferPool::new(8);
        let mut events = Vec::new();

        // Nothing readable: the wait ends at its timeout with no events.
        let t = Instant::now();
        batch.submit_and_wait(Duration::from_millis(30)).unwrap();
        batch.take_events(&mut events);
        assert!(events.is_empty());
        assert!(t.elapsed() >= Duration::from_millis(25));

        // A send and the wait in one call; the peer's answer wakes it.
        let mut q = SendQueue::default();
        fill(&mut q, &mut pool, b"ping");
        // SAFETY: `q` and `a` live until after `submit_and_wait`.
        let i = unsafe { batch.push(a.as_raw_fd(), &q) }.unwrap();
        let answer = std::thread::spawn(move || {
            let mut got = [0u8; 4];
            b.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"ping");
            b.write_all(b"pong").unwrap();
            b
        });
        let mut waited = 0;
        while events.is_empty() && waited < 100 {
            batch.submit_and_wait(Duration::from_millis(100)).unwrap();
            if waited == 0 {
                assert_eq!(batch.result(i), Sent::Bytes(4));
            }
            batch.take_events(&mut events);
            waited += 1;
        }
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].0, 42);
        assert!(events[0].1 & libc::EPOLLIN as u32 != 0);
        let _b = answer.join().unwrap();

        // Dropping the batch with the wait armed cancels it first.
        batch.submit_and_wait(Duration::ZERO).unwrap();
        drop(batch);
    }
}
