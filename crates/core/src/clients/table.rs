//! The per-client table all workers share: for each client address, its open
//! connections, its held requests (event streams and parked long-polls) and
//! its request bucket.
//!
//! A connection looks its client up once (when the client becomes known) and
//! keeps the entry ([`Client`], behind an `Arc`): each request then costs a
//! compare-and-swap on the entry's bucket, never a lookup. Entries are looked
//! up, added and removed under their shard's lock; an entry is cloned out of
//! the table only under that lock, so an entry the table alone holds
//! (`Arc::strong_count == 1`) has no connection and no held request, and
//! goes once its bucket is full again.
//!
//! Memory is bounded: entries held by connections are at most the open
//! connections; the others (a client gone with a bucket not yet refilled)
//! are removed by [`ClientTable::sweep`] once refilled, and a shard that
//! still grows past its share of [`ClientTable::idle_capacity`] forgets them
//! (those clients start again with a full bucket).

use super::{Limit, Refusal};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Shards of the table (a power of two): connections of different clients
/// opening at once seldom wait on one another.
const SHARDS: usize = 64;

/// What a client waits, at least, before it is let in after a refusal by a
/// cap on what it holds (connections, streams): it frees one by closing it,
/// which the server cannot foresee.
pub const RETRY_HELD_S: u64 = 1;

/// The limits of `[limits]` that count per client; 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientLimits {
    pub connections: u32,
    pub streams: u32,
    /// The bucket refills one request every `interval_us` (0: no rate limit).
    interval_us: u64,
    /// How far ahead of now the bucket's theoretical arrival time may run:
    /// the burst, in microseconds of refill.
    tolerance_us: u64,
}

impl ClientLimits {
    /// `max_connections_per_ip`, `max_streams_per_ip`, `requests_per_s_per_ip`
    /// and `requests_burst_per_ip` of `[limits]` (0: that limit is off; a
    /// burst of 0 is the rate).
    pub fn new(connections: usize, streams: usize, rate: u64, burst: u64) -> ClientLimits {
        // Checked with `[limits]`: each at most MAX_PER_CLIENT.
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        let burst = if burst == 0 { rate } else { burst };
        let interval_us = if rate == 0 {
            0
        } else {
            1_000_000_u64.div_ceil(rate)
        };
        ClientLimits {
            connections: clamp(connections as u64),
            streams: clamp(streams as u64),
            interval_us,
            tolerance_us: interval_us.saturating_mul(burst),
        }
    }

    /// Whether any per-client limit is on.
    pub fn any(&self) -> bool {
        self.connections > 0 || self.streams > 0 || self.interval_us > 0
    }

    pub fn rate_limited(&self) -> bool {
        self.interval_us > 0
    }
}

/// One client: what it holds now and its request bucket.
#[derive(Debug)]
pub struct Client {
    addr: IpAddr,
    /// Connections counted against it (changed under its shard's lock).
    connections: AtomicU32,
    /// Event streams and parked long-polls it holds.
    streams: AtomicU32,
    /// The bucket as a theoretical arrival time (GCRA), in microseconds of
    /// the server's clock: the bucket is full when it is not after now, and
    /// each request moves it one interval later.
    tat_us: AtomicU64,
}

impl Client {
    fn new(addr: IpAddr) -> Client {
        Client {
            addr,
            connections: AtomicU32::new(0),
            streams: AtomicU32::new(0),
            tat_us: AtomicU64::new(0),
        }
    }

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn connections(&self) -> u32 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn streams(&self) -> u32 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Take one request from the bucket at `now_us`, or say how long until
    /// one is there (a refusal takes nothing).
    #[inline]
    pub fn take_request(&self, limits: &ClientLimits, now_us: u64) -> Result<(), Refusal> {
        let mut tat = self.tat_us.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now_us) + limits.interval_us;
            let ahead = next - now_us;
            if ahead > limits.tolerance_us {
                let wait_us = ahead - limits.tolerance_us;
                return Err(Refusal {
                    limit: Limit::Requests,
                    retry_after_s: wait_us.div_ceil(1_000_000).max(1),
                });
            }
            match self
                .tat_us
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(seen) => tat = seen,
            }
        }
    }

    /// [`Client::take_request`] when there is a request in the bucket (the
    /// common case, inlined): whether one was taken. `false` takes nothing;
    /// the caller then asks [`Client::take_request`] for the refusal.
    #[inline]
    pub fn try_take_request(&self, limits: &ClientLimits, now_us: u64) -> bool {
        let tat = self.tat_us.load(Ordering::Relaxed);
        let next = tat.max(now_us) + limits.interval_us;
        next - now_us <= limits.tolerance_us
            && self
                .tat_us
                .compare_exchange(tat, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Hold one more event stream or parked long-poll, within `limits.streams`.
    pub fn hold(&self, limits: &ClientLimits) -> Result<(), Refusal> {
        let cap = limits.streams;
        let r = self
            .streams
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (cap == 0 || n < cap).then_some(n + 1)
            });
        r.map(|_| ()).map_err(|_| Refusal {
            limit: Limit::Streams,
            retry_after_s: RETRY_HELD_S,
        })
    }

    /// A held request ended.
    pub fn unhold(&self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the bucket is full at `now_us` (nothing to remember).
    fn refilled(&self, now_us: u64) -> bool {
        self.tat_us.load(Ordering::Relaxed) <= now_us
    }
}

/// A client a connection is counted against, holding its entry. Give it
/// back with [`ClientTable::leave`].
#[derive(Debug)]
pub struct Seat {
    /// Counted in its `connections`.
    client: Arc<Client>,
}

impl Seat {
    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn addr(&self) -> IpAddr {
        self.client.addr
    }
}

type Shard = HashMap<IpAddr, Arc<Client>, foldhash::quality::RandomState>;

/// Every client with a connection, a held request, or a bucket not yet full.
pub struct ClientTable {
    limits: ClientLimits,
    shards: Box<[Mutex<Shard>]>,
    /// Entries a shard may hold before it forgets idle ones.
    shard_capacity: usize,
    next_sweep: AtomicUsize,
    hasher: foldhash::quality::RandomState,
}

impl ClientTable {
    /// `max_connections`: the server's cap, which sizes how many clients
    /// without a connection the table remembers.
    pub fn new(limits: ClientLimits, max_connections: usize) -> ClientTable {
        let hasher = foldhash::quality::RandomState::default();
        let shards = (0..SHARDS)
            .map(|_| Mutex::new(HashMap::with_hasher(hasher.clone())))
            .collect();
        ClientTable {
            limits,
            shards,
            shard_capacity: Self::idle_capacity(max_connections).div_ceil(SHARDS),
            next_sweep: AtomicUsize::new(0),
            hasher,
        }
    }

    /// How many entries the table keeps beyond those connections hold: four
    /// per connection `max_connections` allows, at least 4,096 (about 100
    /// bytes each).
    pub fn idle_capacity(max_connections: usize) -> usize {
        max_connections.saturating_mul(4).max(4096)
    }

    pub fn limits(&self) -> &ClientLimits {
        &self.limits
    }

    fn shard(&self, addr: &IpAddr) -> MutexGuard<'_, Shard> {
        let h = self.hasher.hash_one(addr) as usize;
        self.shards[h % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection of `addr` opens (or is found to be `addr`'s): count it,
    /// unless `addr` is at `max_connections_per_ip`.
    pub fn enter(&self, addr: IpAddr) -> Result<Seat, Refusal> {
        let mut shard = self.shard(&addr);
        if !shard.contains_key(&addr) && shard.len() >= self.shard_capacity {
            self.forget_idle(&mut shard);
        }
        let client = shard
            .entry(addr)
            .or_insert_with(|| Arc::new(Client::new(addr)));
        let cap = self.limits.connections;
        if cap > 0 && client.connections.load(Ordering::Relaxed) >= cap {
            return Err(Refusal {
                limit: Limit::Connections,
                retry_after_s: RETRY_HELD_S,
            });
        }
        client.connections.fetch_add(1, Ordering::Relaxed);
        Ok(Seat {
            client: client.clone(),
        })
    }

    /// The connection of `seat` closed (or now carries another client's
    /// requests). Its entry goes when nothing else holds it and its bucket is
    /// full at `now_us`.
    pub fn leave(&self, seat: Seat, now_us: u64) {
        let Seat { client } = seat;
        let mut shard = self.shard(&client.addr);
        client.connections.fetch_sub(1, Ordering::Relaxed);
        let addr = client.addr;
        drop(client);
        // Clones are made only under this lock: a count of one is the table's.
        if shard
            .get(&addr)
            .is_some_and(|c| Arc::strong_count(c) == 1 && c.refilled(now_us))
        {
            shard.remove(&addr);
        }
    }

    /// One step of cleaning: the entries of the next shard that nothing
    /// holds and whose bucket is full at `now_us` go. Each worker runs one a
    /// tick while a rate limit is on (without one, an entry goes with its
    /// last connection).
    pub fn sweep(&self, now_us: u64) {
        let i = self.next_sweep.fetch_add(1, Ordering::Relaxed) % SHARDS;
        let mut shard = self.shards[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.retain(|_, c| Arc::strong_count(c) > 1 || !c.refilled(now_us));
    }

    /// A full shard: forget the clients nothing holds (their buckets, full or
    /// not). What remains is held by connections, bounded by them.
    fn forget_idle(&self, shard: &mut Shard) {
        shard.retain(|_, c| Arc::strong_count(c) > 1);
    }

    /// Entries in the table (clients remembered).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(conns: usize, streams: usize, rate: u64, burst: u64) -> ClientLimits {
        ClientLimits::new(conns, streams, rate, burst)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn off_by_default() {
        let l = ClientLimits::new(0, 0, 0, 0);
        assert!(!l.any());
        assert!(limits(1, 0, 0, 0).any());
        assert!(limits(0, 1, 0, 0).any());
        assert!(limits(0, 0, 1, 0).any() && limits(0, 0, 1, 0).rate_limited());
    }

    #[test]
    fn connections_are_capped_per_client_and_freed_on_leave() {
        let t = ClientTable::new(limits(2, 0, 0, 0), 100);
        let a = ip("192.0.2.1");
        let s1 = t.enter(a).unwrap();
        let s2 = t.enter(a).unwrap();
        let e = t.enter(a).unwrap_err();
        assert_eq!(e.limit, Limit::Connections);
        assert_eq!(e.retry_after_s, RETRY_HELD_S);
        // Another client has its own budget.
        let b = t.enter(ip("192.0.2.2")).unwrap();
        assert_eq!(s1.client().connections(), 2);
        t.leave(s1, 0);
        let s3 = t.enter(a).unwrap();
        assert_eq!(s3.client().connections(), 2);
        for s in [s2, s3, b] {
            t.leave(s, 0);
        }
        assert!(t.is_empty(), "no connection, full buckets: nothing kept");
    }

    #[test]
    fn the_bucket_lets_a_burst_through_then_one_a_interval() {
        let l = limits(0, 0, 2, 3);
        let t = ClientTable::new(l, 100);
        let s = t.enter(ip("192.0.2.1")).unwrap();
        let c = s.client();
        let t0 = 5_000_000;
        for _ in 0..3 {
            c.take_request(&l, t0).unwrap();
        }
        let e = c.take_request(&l, t0).unwrap_err();
        assert_eq!(e.limit, Limit::Requests);
        assert_eq!(e.retry_after_s, 1, "half a second rounds up to 1");
        // A refusal takes nothing: half a second later one is there, not two.
        c.take_request(&l, t0 + 500_000).unwrap();
        assert!(c.take_request(&l, t0 + 500_000).is_err());
        assert!(c.take_request(&l, t0 + 999_999).is_err());
        c.take_request(&l, t0 + 1_000_000).unwrap();
        // Idle long enough, the whole burst again, and no more.
        let later = t0 + 10_000_000;
        for _ in 0..3 {
            c.take_request(&l, later).unwrap();
        }
        assert!(c.take_request(&l, later).is_err());
        t.leave(s, later);
        assert_eq!(t.len(), 1, "a bucket not yet full is remembered");
        t.sweep_all(later + 1_000_000);
        assert_eq!(t.len(), 1);
        t.sweep_all(later + 1_500_000);
        assert!(t.is_empty(), "refilled: forgotten");
    }

    #[test]
    fn retry_after_counts_whole_seconds_until_a_request_is_there() {
        // One a second, a bucket of 1: refused for just under a second.
        let l = limits(0, 0, 1, 0);
        let c = Client::new(ip("192.0.2.1"));
        c.take_request(&l, 0).unwrap();
        assert_eq!(c.take_request(&l, 1).unwrap_err().retry_after_s, 1);
        // A slow rate: one a second is the slowest, so at most the burst's
        // refill; a fast rate still says at least 1.
        let fast = limits(0, 0, 1000, 1);
        let c = Client::new(ip("192.0.2.1"));
        c.take_request(&fast, 0).unwrap();
        assert_eq!(c.take_request(&fast, 0).unwrap_err().retry_after_s, 1);
        // Burst 0 means the rate: 5 at once.
        let five = limits(0, 0, 5, 0);
        let c = Client::new(ip("192.0.2.1"));
        for _ in 0..5 {
            c.take_request(&five, 7).unwrap();
        }
        assert!(c.take_request(&five, 7).is_err());
    }

    #[test]
    fn streams_are_capped_and_given_back() {
        let l = limits(0, 2, 0, 0);
        let t = ClientTable::new(l, 100);
        let s = t.enter(ip("2001:db8::1")).unwrap();
        let c = s.client();
        c.hold(&l).unwrap();
        c.hold(&l).unwrap();
        assert_eq!(c.hold(&l).unwrap_err().limit, Limit::Streams);
        c.unhold();
        c.hold(&l).unwrap();
        assert_eq!(c.streams(), 2);
        // No cap: always room.
        let none = limits(1, 0, 0, 0);
        for _ in 0..10 {
            c.hold(&none).unwrap();
        }
    }

    #[test]
    fn idle_entries_are_bounded_by_the_capacity() {
        let l = limits(0, 0, 1, 1000);
        let t = ClientTable::new(l, 1);
        let cap = ClientTable::idle_capacity(1);
        // Clients each leaving a bucket that is not full: remembered, until
        // their shard is full; held ones are never forgotten.
        let held = t.enter(ip("10.0.0.1")).unwrap();
        held.client().take_request(&l, 0).unwrap();
        for i in 0..(cap as u32 * 3) {
            let s = t.enter(IpAddr::V4((0x0b00_0000 + i).into())).unwrap();
            s.client().take_request(&l, 0).unwrap();
            t.leave(s, 0);
        }
        assert!(t.len() <= cap + SHARDS + 1, "{} > {cap}", t.len());
        let again = t.enter(ip("10.0.0.1")).unwrap();
        assert_eq!(again.client().connections(), 2, "the held entry stayed");
        t.leave(again, 0);
        t.leave(held, 0);
    }

    #[test]
    fn workers_counting_at_once_never_pass_a_cap() {
        let l = limits(50, 0, 0, 0);
        let t = Arc::new(ClientTable::new(l, 100));
        let a = ip("192.0.2.1");
        let seats: Vec<Vec<Seat>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..40).filter_map(|_| t.enter(a).ok()).collect()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let n: usize = seats.iter().map(Vec::len).sum();
        assert_eq!(n, 50);
        for s in seats.into_iter().flatten() {
            t.leave(s, 0);
        }
        assert!(t.is_empty());
    }

    impl ClientTable {
        fn sweep_all(&self, now_us: u64) {
            for _ in 0..SHARDS {
                self.sweep(now_us);
            }
        }
    }
}
