//! One load thread: a mio event loop over the connections it owns.
//!
//! Timing, in nanoseconds since the run's origin:
//! - open-loop: connection `i` of `C` intends to send its `k`-th request at
//!   `i/R + k·C/R`. A request that cannot go out on time (the connection is waiting on
//!   a pipeline-full of answers, or is reconnecting) waits, and its latency is still
//!   counted from its intended time, so a stalled server shows up in the percentiles
//!   instead of silently slowing the generator down (coordinated omission, corrected as
//!   wrk2 does);
//! - closed-loop: every connection keeps `--pipeline` requests in flight and latency is
//!   counted from the moment a request is queued for writing.
//!
//! Requests intended before the warm-up's end are answered and validated but left out
//! of the statistics. Nothing new is sent after the run's end; answers are awaited for a
//! drain period, and what is still unanswered then counts as a timeout.
//!
//! Hot path: requests are rendered into the connection's reused output buffer and all
//! requests due at once go out in one `write`; answers are framed with httparse straight
//! from the connection's reused input buffer. Steady state allocates nothing.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::keys::{KeySampler, Rng};
use crate::mix::{Mix, Op};
use crate::progress::{Board, Tally};
use crate::request::{key_name, Requests, MAX_KEY_NAME};
use crate::response::{array_items, batch_counts, parse_response, payload_version};
use crate::stats::{ErrorKind, Stats};
use crate::timer::Timer;

/// Token of the thread's timer; connections use their index.
const TIMER: Token = Token(usize::MAX);
/// Input buffer per connection; grown only for an answer larger than this.
const INPUT_BUFFER: usize = 64 * 1024;
/// Wait before reconnecting after a failed connect.
const RECONNECT_BACKOFF_NS: u64 = 100_000_000;
const SECOND_NS: u64 = 1_000_000_000;
/// Key sets each connection draws for `poll_many` and `longpoll_many`.
pub const KEY_SETS: usize = 4;
/// Longest ETag kept to send back as `If-None-Match` (pollbox's are a quoted `u64`,
/// at most 22 bytes); a longer one is not sent back.
const MAX_ETAG: usize = 64;

/// What every thread of a run shares, read-only.
pub struct Plan {
    pub addr: SocketAddr,
    pub requests: Requests,
    pub mix: Mix,
    pub keys: KeySampler,
    pub key_count: u32,
    /// Keys of each `poll_many` and `longpoll_many` request.
    pub keys_per_request: usize,
    pub pipeline: usize,
    /// Open-loop: nanoseconds between two requests of one connection.
    pub interval_ns: Option<f64>,
    /// Connections in the whole run (for the open-loop stagger).
    pub connections: usize,
    pub warmup_ns: u64,
    /// End of the measured window: nothing is sent from here on.
    pub end_ns: u64,
    /// How long after `end_ns` to wait for outstanding answers.
    pub drain_ns: u64,
    pub seed: u64,
    /// With `--sse`: each key's newest ingested version and when it was sent.
    pub published: Option<std::sync::Arc<crate::sse::Published>>,
}

/// A request waiting for its answer.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    op: Op,
    /// The key; for the many-box operations, the key set's index.
    key: u32,
    /// Intended send time.
    intended: u64,
    /// Long-poll: the version sent as `after`. Many-box operations: the
    /// [`etag_id`] of the `If-None-Match` sent, 0 if none.
    after: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Connecting,
    Down { retry_at: u64 },
}

/// Last version seen per key on one connection, to check that versions never go
/// backwards. Direct-mapped with at most 4096 slots, so it is exact up to 4096 keys
/// and a bounded sample above; a slot holds `key + 1` (0 = empty) and the version.
struct Versions {
    slots: Vec<(u32, u64)>,
    exact: bool,
    mask: usize,
}

impl Versions {
    fn new(keys: u32) -> Versions {
        let size = (keys.max(1) as usize).next_power_of_two().min(4096);
        Versions {
            slots: vec![(0, 0); size],
            exact: keys as usize <= size,
            mask: size - 1,
        }
    }

    #[inline]
    fn slot(&self, key: u32) -> usize {
        if self.exact {
            key as usize
        } else {
            ((u64::from(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize) & self.mask
        }
    }

    /// Last version seen for `key`, 0 if none.
    #[inline]
    fn get(&self, key: u32) -> u64 {
        let (k, v) = self.slots[self.slot(key)];
        if k == key.wrapping_add(1) {
            v
        } else {
            0
        }
    }

    #[inline]
    fn set(&mut self, key: u32, version: u64) {
        let i = self.slot(key);
        self.slots[i] = (key.wrapping_add(1), version);
    }
}

/// An ETag as the server sent it, quotes included.
#[derive(Clone, Copy)]
struct Etag {
    len: u8,
    bytes: [u8; MAX_ETAG],
}

/// The key sets of the many-box operations on one connection: [`KEY_SETS`] sets of
/// `--keys-per-request` distinct keys, drawn when the connection is set up (a client
/// watching the same boxes), and the last ETag the connection saw for each, sent back
/// as `If-None-Match`.
struct KeySets {
    per_set: usize,
    /// Set `i` is `keys[i * per_set..(i + 1) * per_set]`.
    keys: Vec<u32>,
    etags: Vec<Option<Etag>>,
}

impl KeySets {
    /// No sets: the mix has no many-box operation.
    fn none() -> KeySets {
        KeySets {
            per_set: 0,
            keys: Vec::new(),
            etags: Vec::new(),
        }
    }

    /// [`KEY_SETS`] sets of `per_set` distinct keys of `0..key_count`, each key drawn
    /// from `sampler` as single-key operations draw theirs. A key already in the set is
    /// drawn again (up to 16 times, then the next free key after it is taken, so a
    /// set as large as the key space fills up too). `per_set` ≤ `key_count`.
    fn draw(sampler: &KeySampler, key_count: u32, per_set: usize, rng: &mut Rng) -> KeySets {
        let key_count = key_count.max(1);
        let per_set = per_set.min(key_count as usize);
        let mut keys = Vec::with_capacity(KEY_SETS * per_set);
        for _ in 0..KEY_SETS {
            let start = keys.len();
            for _ in 0..per_set {
                let mut key = sampler.sample(rng);
                let mut tries = 0;
                while keys[start..].contains(&key) {
                    if tries < 16 {
                        key = sampler.sample(rng);
                        tries += 1;
                    } else {
                        key = (key + 1) % key_count;
                    }
                }
                keys.push(key);
            }
        }
        KeySets {
            per_set,
            keys,
            etags: vec![None; KEY_SETS],
        }
    }

    #[inline]
    fn keys(&self, set: u32) -> &[u32] {
        let at = set as usize * self.per_set;
        &self.keys[at..at + self.per_set]
    }

    #[inline]
    fn etag(&self, set: u32) -> Option<&[u8]> {
        self.etags[set as usize]
            .as_ref()
            .map(|e| &e.bytes[..usize::from(e.len)])
    }

    #[inline]
    fn set_etag(&mut self, set: u32, etag: &[u8]) {
        self.etags[set as usize] = (etag.len() <= MAX_ETAG).then(|| {
            let mut bytes = [0; MAX_ETAG];
            bytes[..etag.len()].copy_from_slice(etag);
            Etag {
                len: etag.len() as u8,
                bytes,
            }
        });
    }
}

/// A fingerprint of an ETag (FNV-1a, never 0), to match an answer's ETag against the
/// `If-None-Match` its request sent without keeping the bytes in flight.
#[inline]
fn etag_id(etag: &[u8]) -> u64 {
    let h = etag.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

struct Conn {
    /// Index among all connections of the run.
    global: usize,
    stream: Option<TcpStream>,
    state: State,
    out: Vec<u8>,
    out_pos: usize,
    /// The socket refused part of `out`; wait for writability.
    want_write: bool,
    input: Vec<u8>,
    in_start: usize,
    in_end: usize,
    inflight: VecDeque<InFlight>,
    rng: Rng,
    versions: Versions,
    sets: KeySets,
    /// Open-loop: requests taken from the schedule so far.
    sent: u64,
    /// Wake-up pending in the heap, if any.
    wake_at: Option<u64>,
}

/// Runs one thread's share of the load until the end of the drain period.
pub fn drive(
    plan: &Plan,
    origin: Instant,
    streams: Vec<(usize, std::net::TcpStream)>,
    board: &Board,
    thread: usize,
) -> io::Result<Stats> {
    let poll = Poll::new()?;
    let mut timer = Timer::new(poll.registry(), TIMER)?;
    let mut conns = Vec::with_capacity(streams.len());
    let many = plan.mix.entries().iter().any(|(op, _)| op.is_many());
    for (i, (global, stream)) in streams.into_iter().enumerate() {
        let mut stream = TcpStream::from_std(stream);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)?;
        conns.push(Conn {
            global,
            stream: Some(stream),
            state: State::Open,
            out: Vec::with_capacity(16 * 1024),
            out_pos: 0,
            want_write: false,
            input: vec![0; INPUT_BUFFER],
            in_start: 0,
            in_end: 0,
            inflight: VecDeque::with_capacity(plan.pipeline),
            rng: Rng::new(plan.seed ^ (global as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            versions: Versions::new(plan.key_count),
            sets: if many {
                // A stream of its own, so the other operations' keys stay as they were.
                let mut rng = Rng::new(
                    plan.seed ^ 0x6b65_7973 ^ (global as u64).wrapping_mul(0xd1b5_4a32_d192_ed03),
                );
                KeySets::draw(&plan.keys, plan.key_count, plan.keys_per_request, &mut rng)
            } else {
                KeySets::none()
            },
            sent: 0,
            wake_at: None,
        });
    }
    let conns_len = conns.len();
    let mut driver = Driver {
        plan,
        origin,
        poll,
        conns,
        // One live wake-up per connection, plus room for stale ones.
        heap: BinaryHeap::with_capacity(2 * conns_len.max(8)),
        stats: Stats::default(),
        tally: Tally::new(),
    };
    driver.stats.scheduled = driver.scheduled_in_window();

    // Start together with the other threads.
    let wait = origin.saturating_duration_since(Instant::now());
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }

    let mut events = Events::with_capacity(1024);
    let mut next_publish = SECOND_NS;
    let drain_deadline = plan.end_ns + plan.drain_ns;
    let mut now = driver.now();
    for i in 0..driver.conns.len() {
        driver.pump(i, now);
    }
    loop {
        now = driver.now();
        while let Some(&Reverse((due, i))) = driver.heap.peek() {
            if due > now {
                break;
            }
            driver.heap.pop();
            if driver.conns[i].wake_at == Some(due) {
                driver.conns[i].wake_at = None;
                if driver.conns[i].state == State::Open && due >= plan.warmup_ns {
                    driver.stats.wake_lateness.saturating_record(now - due);
                }
                driver.wake(i, now);
            }
        }
        if now >= next_publish {
            driver.tally.drain_into(&mut board.slot(thread));
            next_publish = (now / SECOND_NS + 1) * SECOND_NS;
        }
        if now >= plan.end_ns {
            let idle = driver
                .conns
                .iter()
                .all(|c| c.inflight.is_empty() || c.state != State::Open);
            if idle || now >= drain_deadline {
                for i in 0..driver.conns.len() {
                    driver.fail_inflight(i, ErrorKind::Timeout);
                }
                break;
            }
        }
        let mut next = next_publish.min(if now < plan.end_ns {
            plan.end_ns
        } else {
            drain_deadline
        });
        if let Some(&Reverse((due, _))) = driver.heap.peek() {
            next = next.min(due);
        }
        let timeout = timer.arm(next, now)?;
        match driver.poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        // Reads take their own clock reading; this one is for writes and connects.
        let now = driver.now();
        for event in events.iter() {
            if event.token() == TIMER {
                timer.fired();
                continue;
            }
            let i = event.token().0;
            if i >= driver.conns.len() {
                continue;
            }
            match driver.conns[i].state {
                State::Open => {
                    if event.is_writable() && driver.conns[i].want_write {
                        driver.flush(i, now);
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        driver.read(i, now);
                    }
                }
                State::Connecting => driver.finish_connect(i, now),
                State::Down { .. } => {}
            }
        }
    }
    driver.tally.drain_into(&mut board.slot(thread));
    Ok(driver.stats)
}

struct Driver<'p> {
    plan: &'p Plan,
    origin: Instant,
    poll: Poll,
    conns: Vec<Conn>,
    /// Pending wake-ups `(due, connection)`; stale entries are skipped when popped.
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    stats: Stats,
    tally: Tally,
}

impl Driver<'_> {
    #[inline]
    fn now(&self) -> u64 {
        Instant::now()
            .saturating_duration_since(self.origin)
            .as_nanos() as u64
    }

    /// Intended send time of connection `c`'s `k`-th open-loop request.
    #[inline]
    fn intended(&self, global: usize, k: u64, interval: f64) -> u64 {
        let stagger = interval * global as f64 / self.plan.connections as f64;
        (stagger + k as f64 * interval) as u64
    }

    /// How many requests this thread's schedule puts in the measured window.
    fn scheduled_in_window(&self) -> u64 {
        let Some(interval) = self.plan.interval_ns else {
            return 0;
        };
        let per = |limit: u64, global: usize| -> u64 {
            let stagger = interval * global as f64 / self.plan.connections as f64;
            if (limit as f64) <= stagger {
                return 0;
            }
            // Count k with stagger + k·interval < limit.
            let mut k = ((limit as f64 - stagger) / interval).ceil() as u64;
            while k > 0 && self.intended(global, k - 1, interval) >= limit {
                k -= 1;
            }
            while self.intended(global, k, interval) < limit {
                k += 1;
            }
            k
        };
        self.conns
            .iter()
            .map(|c| per(self.plan.end_ns, c.global) - per(self.plan.warmup_ns, c.global))
            .sum()
    }

    fn schedule(&mut self, i: usize, due: u64) {
        if self.conns[i].wake_at != Some(due) {
            self.conns[i].wake_at = Some(due);
            self.heap.push(Reverse((due, i)));
        }
    }

    fn wake(&mut self, i: usize, now: u64) {
        match self.conns[i].state {
            State::Open => self.pump(i, now),
            State::Down { retry_at } if now >= retry_at => self.reconnect(i, now),
            State::Down { retry_at } => self.schedule(i, retry_at),
            State::Connecting => {}
        }
    }

    /// Queues every request that is due on connection `i` and writes them at once.
    fn pump(&mut self, i: usize, now: u64) {
        if self.conns[i].state != State::Open {
            return;
        }
        let plan = self.plan;
        let before = self.conns[i].out.len();
        match plan.interval_ns {
            Some(interval) => {
                let global = self.conns[i].global;
                loop {
                    let c = &self.conns[i];
                    let t = self.intended(global, c.sent, interval);
                    if t >= plan.end_ns {
                        break;
                    }
                    if c.inflight.len() >= plan.pipeline || t > now {
                        if c.inflight.len() < plan.pipeline {
                            self.schedule(i, t);
                        }
                        break;
                    }
                    self.issue(i, t);
                    self.conns[i].sent += 1;
                }
            }
            None => {
                while now < plan.end_ns && self.conns[i].inflight.len() < plan.pipeline {
                    self.issue(i, now);
                }
            }
        }
        if self.conns[i].out.len() > before && !self.conns[i].want_write {
            self.flush(i, now);
        }
    }

    /// Renders one request into connection `i`'s output buffer.
    #[inline]
    fn issue(&mut self, i: usize, intended: u64) {
        let plan = self.plan;
        let c = &mut self.conns[i];
        let op = plan.mix.pick(c.rng.next_u32());
        let mut key = 0;
        let mut after = 0;
        match op {
            Op::Poll => {
                key = plan.keys.sample(&mut c.rng);
                plan.requests.write_poll(&mut c.out, key);
            }
            Op::Ingest => {
                key = plan.keys.sample(&mut c.rng);
                plan.requests.write_ingest(&mut c.out, key, &mut c.rng);
            }
            Op::Batch => plan
                .requests
                .write_batch(&mut c.out, &plan.keys, &mut c.rng),
            Op::LongPoll => {
                key = plan.keys.sample(&mut c.rng);
                after = c.versions.get(key);
                plan.requests.write_longpoll(&mut c.out, key, after);
            }
            Op::PollMany | Op::LongPollMany => {
                key = c.rng.below(KEY_SETS as u32);
                let etag = c.sets.etag(key);
                after = etag.map_or(0, etag_id);
                if op == Op::PollMany {
                    plan.requests
                        .write_poll_many(&mut c.out, c.sets.keys(key), etag);
                } else {
                    plan.requests
                        .write_longpoll_many(&mut c.out, c.sets.keys(key), etag);
                }
            }
        }
        c.inflight.push_back(InFlight {
            op,
            key,
            intended,
            after,
        });
    }

    /// Writes as much of connection `i`'s output as the socket takes.
    fn flush(&mut self, i: usize, now: u64) {
        let c = &mut self.conns[i];
        let Some(stream) = c.stream.as_mut() else {
            return;
        };
        while c.out_pos < c.out.len() {
            match stream.write(&c.out[c.out_pos..]) {
                Ok(0) => return self.fail(i, ErrorKind::Io, now, 0),
                Ok(n) => c.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !c.want_write {
                        c.want_write = true;
                        let r = self.poll.registry().reregister(
                            stream,
                            Token(i),
                            Interest::READABLE | Interest::WRITABLE,
                        );
                        if r.is_err() {
                            return self.fail(i, ErrorKind::Io, now, 0);
                        }
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, ErrorKind::Io, now, 0),
            }
        }
        c.out.clear();
        c.out_pos = 0;
        if c.want_write {
            c.want_write = false;
            if self
                .poll
                .registry()
                .reregister(stream, Token(i), Interest::READABLE)
                .is_err()
            {
                self.fail(i, ErrorKind::Io, now, 0);
            }
        }
    }

    /// Reads what connection `i` has, handles every complete answer, then sends what
    /// became due.
    fn read(&mut self, i: usize, mut now: u64) {
        loop {
            let c = &mut self.conns[i];
            if c.in_end == c.input.len() {
                if c.in_start > 0 {
                    c.input.copy_within(c.in_start..c.in_end, 0);
                    c.in_end -= c.in_start;
                    c.in_start = 0;
                } else {
                    // One answer larger than the buffer: make room for it.
                    let len = c.input.len();
                    c.input.resize(len * 2, 0);
                }
            }
            let Some(stream) = c.stream.as_mut() else {
                return;
            };
            let space = c.input.len() - c.in_end;
            match stream.read(&mut c.input[c.in_end..]) {
                Ok(0) => return self.fail(i, ErrorKind::Closed, now, 0),
                Ok(n) => {
                    c.in_end += n;
                    now = self.now();
                    if !self.answers(i, now) {
                        return;
                    }
                    // A short read emptied the socket; the next data raises a new edge.
                    if n < space {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.fail(i, ErrorKind::Io, now, 0),
            }
        }
        self.pump(i, now);
    }

    /// Handles the complete answers in connection `i`'s input; false when the
    /// connection was given up.
    fn answers(&mut self, i: usize, now: u64) -> bool {
        let plan = self.plan;
        loop {
            let c = &mut self.conns[i];
            let response = match parse_response(&c.input[c.in_start..c.in_end]) {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(_) => {
                    self.fail(i, ErrorKind::Protocol, now, 0);
                    return false;
                }
            };
            let Some(request) = c.inflight.pop_front() else {
                // An answer nobody asked for.
                self.fail(i, ErrorKind::Protocol, now, 0);
                return false;
            };
            let (status, len, close) = (response.status, response.len, response.close);
            let verdict = check(
                plan,
                &mut c.versions,
                &mut c.sets,
                &request,
                status,
                response.body,
                response.etag,
            );
            c.in_start += len;
            let latency = now.saturating_sub(request.intended);
            let measured = request.intended >= plan.warmup_ns;
            let stats = self.stats.op(request.op);
            if measured {
                stats.requests += 1;
                if now <= plan.end_ns {
                    stats.answered_in_window += 1;
                    stats.accepted_in_window += verdict.accepted;
                }
                stats.latency.saturating_record(latency);
                stats.count_status(status);
                match (request.op, status) {
                    (Op::Poll | Op::LongPoll, 404) => stats.not_found += 1,
                    (Op::LongPoll | Op::PollMany | Op::LongPollMany, 304) => {
                        stats.not_modified += 1
                    }
                    _ => {}
                }
                stats.not_found += verdict.missing;
                stats.accepted += verdict.accepted;
                if let Some(kind) = verdict.error {
                    stats.errors[kind as usize] += 1;
                    self.tally.errors += 1;
                }
            } else {
                stats.warmup += 1;
            }
            self.tally.answered += 1;
            self.tally.latency.saturating_record(latency);
            if close {
                // The server said it closes: what else is in flight will not be answered.
                self.fail(i, ErrorKind::Closed, now, 0);
                return false;
            }
        }
        let c = &mut self.conns[i];
        if c.in_start == c.in_end {
            c.in_start = 0;
            c.in_end = 0;
        }
        true
    }

    /// Counts connection `i`'s unanswered requests as `kind` errors and drops it;
    /// it reconnects after `backoff` (if the run is still on).
    fn fail(&mut self, i: usize, kind: ErrorKind, now: u64, backoff: u64) {
        self.fail_inflight(i, kind);
        let c = &mut self.conns[i];
        if let Some(mut stream) = c.stream.take() {
            let _ = self.poll.registry().deregister(&mut stream);
        }
        c.out.clear();
        c.out_pos = 0;
        c.want_write = false;
        c.in_start = 0;
        c.in_end = 0;
        let retry_at = now + backoff;
        c.state = State::Down { retry_at };
        if now < self.plan.end_ns {
            self.schedule(i, retry_at);
        }
    }

    fn fail_inflight(&mut self, i: usize, kind: ErrorKind) {
        let warmup_ns = self.plan.warmup_ns;
        while let Some(request) = self.conns[i].inflight.pop_front() {
            let stats = self.stats.op(request.op);
            stats.unanswered += 1;
            if request.intended >= warmup_ns {
                stats.errors[kind as usize] += 1;
                self.tally.errors += 1;
            }
        }
    }

    fn reconnect(&mut self, i: usize, now: u64) {
        if now >= self.plan.end_ns {
            return;
        }
        let attempt = TcpStream::connect(self.plan.addr).and_then(|mut stream| {
            self.poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            Ok(stream)
        });
        match attempt {
            Ok(stream) => {
                let c = &mut self.conns[i];
                c.stream = Some(stream);
                c.state = State::Connecting;
            }
            Err(_) => self.connect_failed(i, now),
        }
    }

    fn finish_connect(&mut self, i: usize, now: u64) {
        let Some(stream) = self.conns[i].stream.as_mut() else {
            return;
        };
        match stream.take_error() {
            Ok(None) => {}
            Ok(Some(_)) | Err(_) => return self.connect_failed(i, now),
        }
        match stream.peer_addr() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return, // still going
            Err(_) => return self.connect_failed(i, now),
        }
        let _ = stream.set_nodelay(true);
        if self
            .poll
            .registry()
            .reregister(stream, Token(i), Interest::READABLE)
            .is_err()
        {
            return self.connect_failed(i, now);
        }
        self.conns[i].state = State::Open;
        self.pump(i, now);
    }

    fn connect_failed(&mut self, i: usize, now: u64) {
        if now >= self.plan.warmup_ns {
            self.stats.connection_errors[ErrorKind::Connect as usize] += 1;
            self.tally.errors += 1;
        }
        self.fail(i, ErrorKind::Connect, now, RECONNECT_BACKOFF_NS);
    }
}

/// The verdict on one answer: the error it counts as, if any, and the messages the
/// server says it accepted.
struct Verdict {
    error: Option<ErrorKind>,
    accepted: u64,
    /// Many-box answers: the boxes that were `null` (no box yet).
    missing: u64,
}

impl Verdict {
    const OK: Verdict = Verdict {
        error: None,
        accepted: 0,
        missing: 0,
    };

    fn error(kind: ErrorKind) -> Verdict {
        Verdict {
            error: Some(kind),
            ..Verdict::OK
        }
    }
}

/// Checks an answer against its request: the status the operation expects, the payload's
/// shape and key, and that the box's version does not go backwards on this connection.
#[inline]
fn check(
    plan: &Plan,
    versions: &mut Versions,
    sets: &mut KeySets,
    request: &InFlight,
    status: u16,
    body: &[u8],
    etag: Option<&[u8]>,
) -> Verdict {
    let mut name = [0u8; MAX_KEY_NAME];
    match (request.op, status) {
        (Op::PollMany | Op::LongPollMany, 200 | 304) => {
            check_many(versions, sets, request, status, body, etag)
        }
        (Op::Poll, 200) | (Op::Ingest, 200) | (Op::LongPoll, 200) => {
            let n = key_name(request.key, &mut name);
            let Ok(version) = payload_version(body, &name[..n]) else {
                return Verdict::error(ErrorKind::Payload);
            };
            if request.op == Op::Ingest {
                if let Some(p) = &plan.published {
                    p.record(request.key, version, request.intended);
                }
            }
            let last = versions.get(request.key);
            let in_order = match request.op {
                // This connection's ingest made a new version.
                Op::Ingest => version > last,
                // A long-poll answers 200 only for a version newer than `after`.
                Op::LongPoll => version > request.after && version >= last,
                _ => version >= last,
            };
            if version > last {
                versions.set(request.key, version);
            }
            match (in_order, request.op) {
                (false, _) => Verdict::error(ErrorKind::Version),
                (true, Op::Ingest) => Verdict {
                    accepted: 1,
                    ..Verdict::OK
                },
                (true, _) => Verdict::OK,
            }
        }
        (Op::Poll | Op::LongPoll, 404) | (Op::LongPoll, 304) => Verdict::OK,
        (Op::Batch, 200) => match batch_counts(body) {
            Ok((accepted, rejected)) => {
                let error = if accepted + rejected != plan.requests.batch_size() as u64 {
                    Some(ErrorKind::Payload)
                } else if rejected > 0 {
                    Some(ErrorKind::Rejected)
                } else {
                    None
                };
                Verdict {
                    error,
                    accepted,
                    ..Verdict::OK
                }
            }
            Err(_) => Verdict::error(ErrorKind::Payload),
        },
        _ => Verdict::error(ErrorKind::Status),
    }
}

/// Checks a many-box answer: its ETag against the `If-None-Match` sent (a 304 names
/// it, a 200 does not), and a 200's array: one element per key asked, each `null` or
/// that key's payload, in order, no version going backwards on this connection. The
/// ETag of an answer that passes is kept for the set's next request.
fn check_many(
    versions: &mut Versions,
    sets: &mut KeySets,
    request: &InFlight,
    status: u16,
    body: &[u8],
    etag: Option<&[u8]>,
) -> Verdict {
    let Some(etag) = etag else {
        return Verdict::error(ErrorKind::Payload);
    };
    let sent = request.after;
    let set = request.key;
    if status == 304 {
        // Only a request whose If-None-Match is current gets a 304, and it names it.
        if sent == 0 {
            return Verdict::error(ErrorKind::Status);
        }
        if etag_id(etag) != sent {
            return Verdict::error(ErrorKind::Payload);
        }
        sets.set_etag(set, etag);
        return Verdict::OK;
    }
    let mut name = [0u8; MAX_KEY_NAME];
    let mut items = array_items(body);
    let mut missing = 0;
    let mut in_order = true;
    for &key in sets.keys(set) {
        let Some(Ok(item)) = items.next() else {
            return Verdict::error(ErrorKind::Payload);
        };
        if item == b"null" {
            missing += 1;
            continue;
        }
        let n = key_name(key, &mut name);
        let Ok(version) = payload_version(item, &name[..n]) else {
            return Verdict::error(ErrorKind::Payload);
        };
        let last = versions.get(key);
        if version < last {
            in_order = false;
        } else if version > last {
            versions.set(key, version);
        }
    }
    if items.next().is_some() {
        // More elements than keys, or bytes after them.
        return Verdict::error(ErrorKind::Payload);
    }
    // A 200 to a current If-None-Match: the boxes did not move, yet the answer says so.
    let error = if !in_order || etag_id(etag) == sent {
        Some(ErrorKind::Version)
    } else {
        sets.set_etag(set, etag);
        None
    };
    Verdict {
        error,
        missing,
        ..Verdict::OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::KeyDist;
    use crate::request::Requests;

    #[test]
    fn key_sets_are_distinct_keys_drawn_once() {
        for (dist, keys, per_set) in [
            (KeyDist::Uniform, 1000, 20),
            (KeyDist::Zipf, 1000, 64),
            // As many keys per set as there are keys: every key, once.
            (KeyDist::Zipf, 30, 30),
            (KeyDist::Uniform, 1, 1),
        ] {
            let sampler = KeySampler::new(dist, keys, 0.99);
            let sets = KeySets::draw(&sampler, keys, per_set, &mut Rng::new(5));
            for set in 0..KEY_SETS as u32 {
                let mut k = sets.keys(set).to_vec();
                assert_eq!(k.len(), per_set);
                assert!(k.iter().all(|&key| key < keys));
                k.sort_unstable();
                k.dedup();
                assert_eq!(k.len(), per_set, "{dist:?} {keys} {per_set}: repeated key");
                assert_eq!(sets.etag(set), None);
            }
        }
        // Zipf sets hold the hot keys.
        let sampler = KeySampler::new(KeyDist::Zipf, 1000, 0.99);
        let sets = KeySets::draw(&sampler, 1000, 20, &mut Rng::new(5));
        assert!((0..KEY_SETS as u32).all(|s| sets.keys(s).contains(&0)));
    }

    fn plan(per_set: usize) -> Plan {
        Plan {
            addr: "127.0.0.1:1".parse().unwrap(),
            requests: Requests::new("h", 10, 64, 1, 100, None),
            mix: Mix::parse("poll_many:1,longpoll_many:1").unwrap(),
            keys: KeySampler::new(KeyDist::Uniform, 10, 0.0),
            key_count: 10,
            keys_per_request: per_set,
            pipeline: 1,
            interval_ns: None,
            connections: 1,
            warmup_ns: 0,
            end_ns: 0,
            drain_ns: 0,
            seed: 0,
            published: None,
        }
    }

    #[test]
    fn many_box_answers_are_checked_and_their_etags_kept() {
        let plan = plan(3);
        let mut versions = Versions::new(10);
        let mut sets = KeySets {
            per_set: 3,
            keys: vec![4, 0, 7, 1, 2, 3, 5, 6, 8, 9, 4, 1],
            etags: vec![None; KEY_SETS],
        };
        let payload = |k: u32, v: u64| format!(r#"{{"k":"lg-{k}","ver":{v},"v":1}}"#);
        let body = format!("[{},null,{}]", payload(4, 3), payload(7, 5));
        let ask = |op, sent: Option<&[u8]>| InFlight {
            op,
            key: 0,
            intended: 0,
            after: sent.map_or(0, etag_id),
        };
        let mut check = |request: &InFlight, status, body: &str, etag: Option<&[u8]>| {
            check(
                &plan,
                &mut versions,
                &mut sets,
                request,
                status,
                body.as_bytes(),
                etag,
            )
        };

        // The first answer: no If-None-Match sent; one null box; its ETag is kept.
        let v = check(&ask(Op::PollMany, None), 200, &body, Some(b"\"11\""));
        assert_eq!((v.error, v.missing), (None, 1));
        // 304 to the ETag sent, for either operation.
        for op in [Op::PollMany, Op::LongPollMany] {
            let v = check(&ask(op, Some(b"\"11\"")), 304, "", Some(b"\"11\""));
            assert_eq!((v.error, v.missing), (None, 0));
        }
        // A box moved: 200 with a new ETag.
        let moved = format!("[{},null,{}]", payload(4, 4), payload(7, 5));
        let v = check(
            &ask(Op::LongPollMany, Some(b"\"11\"")),
            200,
            &moved,
            Some(b"\"12\""),
        );
        assert_eq!(v.error, None);

        let errors = [
            // 304 without an If-None-Match, or naming another ETag.
            (
                ask(Op::PollMany, None),
                304,
                String::new(),
                Some(&b"\"12\""[..]),
                ErrorKind::Status,
            ),
            (
                ask(Op::PollMany, Some(b"\"12\"")),
                304,
                String::new(),
                Some(b"\"13\""),
                ErrorKind::Payload,
            ),
            // No ETag.
            (
                ask(Op::PollMany, None),
                200,
                moved.clone(),
                None,
                ErrorKind::Payload,
            ),
            // 200 to a current If-None-Match.
            (
                ask(Op::PollMany, Some(b"\"12\"")),
                200,
                moved.clone(),
                Some(b"\"12\""),
                ErrorKind::Version,
            ),
            // A version going backwards.
            (
                ask(Op::PollMany, None),
                200,
                body.clone(),
                Some(b"\"14\""),
                ErrorKind::Version,
            ),
            // Too few, too many, out of order, another key, not an array.
            (
                ask(Op::PollMany, None),
                200,
                format!("[{},null]", payload(4, 4)),
                Some(b"\"1\""),
                ErrorKind::Payload,
            ),
            (
                ask(Op::PollMany, None),
                200,
                format!("[{},null,null,null]", payload(4, 4)),
                Some(b"\"1\""),
                ErrorKind::Payload,
            ),
            (
                ask(Op::PollMany, None),
                200,
                format!("[null,{},null]", payload(4, 4)),
                Some(b"\"1\""),
                ErrorKind::Payload,
            ),
            (
                ask(Op::PollMany, None),
                200,
                format!("[{},null,null]", payload(5, 4)),
                Some(b"\"1\""),
                ErrorKind::Payload,
            ),
            (
                ask(Op::PollMany, None),
                200,
                payload(4, 4),
                Some(b"\"1\""),
                ErrorKind::Payload,
            ),
            // A status the operation does not expect.
            (
                ask(Op::PollMany, None),
                400,
                r#"{"error":"x"}"#.to_string(),
                None,
                ErrorKind::Status,
            ),
            (
                ask(Op::LongPollMany, None),
                404,
                r#"{"error":"x"}"#.to_string(),
                None,
                ErrorKind::Status,
            ),
        ];
        for (request, status, body, etag, want) in errors {
            let v = check(&request, status, &body, etag);
            assert_eq!(v.error, Some(want), "{status} {body} {etag:?}");
        }
        assert_eq!(versions.get(4), 4);
        // The last good ETag (a failed check keeps none of its own).
        assert_eq!(sets.etag(0), Some(&b"\"12\""[..]));
        assert_eq!(sets.etag(1), None);
    }

    #[test]
    fn etags_are_kept_up_to_their_limit() {
        let mut sets = KeySets::draw(
            &KeySampler::new(KeyDist::Uniform, 10, 0.0),
            10,
            2,
            &mut Rng::new(1),
        );
        sets.set_etag(2, &[b'x'; MAX_ETAG]);
        assert_eq!(sets.etag(2), Some(&[b'x'; MAX_ETAG][..]));
        sets.set_etag(2, &[b'x'; MAX_ETAG + 1]);
        assert_eq!(sets.etag(2), None, "too long to send back");
        assert_ne!(etag_id(b""), 0);
        assert_ne!(etag_id(b"\"1\""), etag_id(b"\"2\""));
    }

    #[test]
    fn versions_are_exact_for_small_key_sets_and_bounded_for_large() {
        let mut v = Versions::new(1000);
        assert!(v.exact);
        assert_eq!(v.get(5), 0);
        v.set(5, 9);
        assert_eq!(v.get(5), 9);
        assert_eq!(v.get(6), 0);
        let mut big = Versions::new(1_000_000);
        assert!(!big.exact);
        assert_eq!(big.slots.len(), 4096);
        big.set(999_999, 3);
        assert_eq!(big.get(999_999), 3);
        // A colliding key does not read another key's version.
        let other = (0..1_000_000u32)
            .find(|&k| k != 999_999 && big.slot(k) == big.slot(999_999))
            .unwrap();
        assert_eq!(big.get(other), 0);
    }
}
