//! One load thread's run: its connections set up on the sockets it was given, then
//! a mio event loop until the end of the drain period: wake-ups due, progress
//! published each second, readiness handed to the driver, and what is still
//! unanswered at the end counted as timeouts.
//!
//! What it is not: the split of the load between threads or the report of the run
//! (the crate's `run`), nor what happens on one connection (`driver`, `pacing`,
//! `connection`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::io;
use std::time::Instant;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use super::connection::{Conn, State};
use super::driver::Driver;
use super::key_sets::KeySets;
use super::versions::Versions;
use super::Plan;
use crate::keys::Rng;
use crate::progress::{Board, Tally};
use crate::stats::{ErrorKind, Stats};
use crate::timer::Timer;

/// Token of the thread's timer; connections use their index.
const TIMER: Token = Token(usize::MAX);
/// Input buffer per connection; grown only for an answer larger than this.
const INPUT_BUFFER: usize = 64 * 1024;
const SECOND_NS: u64 = 1_000_000_000;

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
