//! The presence workload: members who come and go in two rooms, each an
//! event stream of its room's presence (`GET /v1/boxes/{room}~presence?member=ID`)
//! held by the suite to one node, and readers of every room's presence on
//! every node. Every open, close and read goes into the history
//! (`presence-open`, `presence-close`, `presence-read`), which is what the
//! checker's presence properties judge (docs/presence.md#on-a-log-cluster).
//!
//! - **members**: [`PER_NODE`] per node (`a-m0`..`a-m2`, `b-m0`..), the first
//!   two in room [`ROOMS`]`[0]`, the third in [`ROOMS`]`[1]`, and one member
//!   ([`SHARED`]) held on every node at once (present while any live node
//!   holds it). Each opens its stream, holds it 1.5–6 s, closes it, stays out
//!   0.5–3 s, and so on; a stream that breaks (its node killed) is recorded
//!   closed and opened again, to the same node, as soon as it answers.
//! - **settling**: once faults stopped, each member picks, from the seed,
//!   whether it ends in the room (about two in three) and gets there: it
//!   then holds (or stays out) until the end, reopening a stream that breaks.
//! - **readers**: one per node, `GET` of each room's presence every 250 ms.
//!
//! What it is not: a check. What must hold of these operations is the
//! checker's (`checker/presence.rs`).

use crate::history::{Event, Recorder};
use crate::http::{Client, EventStream, Failure};
use crate::rng::Rng;
use crate::workload::Target;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The rooms members are present in.
pub const ROOMS: [&str; 2] = ["pr1/", "pr2/"];
/// Members held on one node each.
pub const PER_NODE: usize = 3;
/// The member held on every node at once, in `ROOMS[0]`.
pub const SHARED: &str = "all-m";

pub use crate::cluster::node::{LEASE_MS, LEAVE_GRACE_MS};

const RUN: u8 = 0;
const SETTLE: u8 = 1;
const DONE: u8 = 2;

struct State {
    phase: AtomicU8,
    settled: AtomicUsize,
}

/// The running presence workload.
pub struct Presence {
    state: Arc<State>,
    members: Vec<JoinHandle<()>>,
    readers: Vec<JoinHandle<()>>,
    /// Member threads (what [`Presence::settle`] waits for).
    count: usize,
}

fn room_of(i: usize) -> &'static str {
    if i < 2 {
        ROOMS[0]
    } else {
        ROOMS[1]
    }
}

/// The path of a member's presence stream.
pub fn member_path(room: &str, member: &str) -> String {
    format!("/v1/boxes/{room}~presence?member={member}")
}

impl Presence {
    /// Start every member and reader, against `nodes` (a and b).
    pub fn start(rec: &Recorder, nodes: &[Target], seed: u64) -> Presence {
        let state = Arc::new(State {
            phase: AtomicU8::new(RUN),
            settled: AtomicUsize::new(0),
        });
        let mut members = Vec::new();
        let mut n = 0u64;
        for t in nodes {
            let mut held: Vec<(String, &str)> = (0..PER_NODE)
                .map(|i| (format!("{}-m{i}", t.name), room_of(i)))
                .collect();
            held.push((SHARED.to_string(), ROOMS[0]));
            for (member, room) in held {
                let (st, rec, t) = (state.clone(), rec.clone(), t.clone());
                let s = seed ^ (0x9e37_0000 + n);
                n += 1;
                let name = format!("pm-{}-{member}", t.name);
                members.push(spawn(&name, move || {
                    hold_member(&st, &rec, &member, room, &t, s)
                }));
            }
        }
        let count = members.len();
        let readers = nodes
            .iter()
            .map(|t| {
                let (st, rec, t) = (state.clone(), rec.clone(), t.clone());
                spawn(&format!("pr-{}", t.name), move || reader(&st, &rec, &t))
            })
            .collect();
        Presence {
            state,
            members,
            readers,
            count,
        }
    }

    /// Faults are over: every member gets to its final state (in or out of
    /// its room) and holds it. Waits (up to `timeout`) until all are there;
    /// false if some are not (a node that does not answer).
    pub fn settle(&self, timeout: Duration) -> bool {
        self.state.phase.store(SETTLE, Ordering::SeqCst);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.state.settled.load(Ordering::SeqCst) >= self.count {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// End every member's stream and thread.
    pub fn finish(&mut self) {
        self.state.phase.store(DONE, Ordering::SeqCst);
        for h in self.members.drain(..).chain(self.readers.drain(..)) {
            join(h);
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.finish();
    }
}

fn join(h: JoinHandle<()>) {
    let name = h.thread().name().unwrap_or("?").to_string();
    if h.join().is_err() {
        eprintln!("pollbox-faults: presence client {name} panicked");
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .expect("a presence thread")
}

/// One member on one node: opens, holds, closes, and again; see the
/// module's doc.
fn hold_member(st: &State, rec: &Recorder, member: &str, room: &str, t: &Target, seed: u64) {
    let mut rng = Rng::new(seed);
    let path = member_path(room, member);
    let mut want_open = rng.below(2) == 0;
    let mut settled = false;
    let mut es: Option<EventStream> = None;
    let mut until = Instant::now();
    let record_close = |cause: String| {
        rec.note(
            "presence",
            Event::PresenceClose {
                member: member.to_string(),
                room: room.to_string(),
                via: t.name.clone(),
                cause,
            },
        );
    };
    loop {
        let phase = st.phase.load(Ordering::SeqCst);
        if phase == DONE {
            if es.take().is_some() {
                record_close("client".into());
            }
            return;
        }
        if phase == SETTLE && !settled {
            // The final state: in the room about two times in three.
            want_open = rng.below(3) != 0;
            if !want_open && es.take().is_some() {
                record_close("client".into());
            }
            if !want_open || es.is_some() {
                settled = true;
                st.settled.fetch_add(1, Ordering::SeqCst);
            }
        }
        if want_open && es.is_none() {
            let before = t.run_now();
            let t0 = rec.now();
            match EventStream::open(t.addr, &path, None, Duration::from_secs(5)) {
                Ok(Ok(s)) => {
                    rec.record(
                        t0,
                        "presence",
                        Event::PresenceOpen {
                            member: member.to_string(),
                            room: room.to_string(),
                            via: t.name.clone(),
                            run: t.served(before),
                        },
                    );
                    es = Some(s);
                    until = Instant::now() + Duration::from_millis(rng.range(1_500, 6_000));
                    if phase == SETTLE && !settled {
                        settled = true;
                        st.settled.fetch_add(1, Ordering::SeqCst);
                    }
                }
                // Sent and not answered (a paused node): the node may
                // take it once it runs again, and hold the member until
                // it sees the connection gone; the checker allows for it.
                Err(e @ Failure::Receive(_)) => {
                    rec.record(
                        t0,
                        "presence",
                        Event::PresenceUnanswered {
                            member: member.to_string(),
                            room: room.to_string(),
                            via: t.name.clone(),
                            error: e.to_string(),
                        },
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
                // Refused (a 503 while the node starts), or not sent (the
                // node down): try again shortly.
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
            continue;
        }
        if let Some(s) = es.as_mut() {
            // Holding: read what comes (and see the stream break).
            if let Err(e) = s.next(Duration::from_millis(300)) {
                es = None;
                record_close(format!("broken: {e}"));
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            if phase == RUN && Instant::now() >= until {
                es = None;
                record_close("client".into());
                want_open = false;
                until = Instant::now() + Duration::from_millis(rng.range(500, 3_000));
            }
            continue;
        }
        // Out of the room.
        std::thread::sleep(Duration::from_millis(100));
        if phase == RUN && Instant::now() >= until {
            want_open = true;
        }
    }
}

/// `GET` of each room's presence on one node, every 250 ms, until the
/// readers stop.
fn reader(st: &State, rec: &Recorder, t: &Target) {
    let mut cl = Client::new(t.addr);
    while st.phase.load(Ordering::SeqCst) != DONE {
        for room in ROOMS {
            if read_presence(rec, &mut cl, t, room, None).is_none() {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One `GET /v1/boxes/{room}~presence` on `t`, recorded when it answered
/// (any status); `None` when no answer came.
pub fn read_presence(
    rec: &Recorder,
    cl: &mut Client,
    t: &Target,
    room: &str,
    round: Option<u32>,
) -> Option<u16> {
    let t0 = rec.now();
    let r = cl.request(
        "GET",
        &format!("/v1/boxes/{room}~presence"),
        &[],
        b"",
        Duration::from_secs(5),
    );
    match r {
        Ok(resp) => {
            rec.record(
                t0,
                if round.is_some() { "final" } else { "presence" },
                Event::PresenceRead {
                    via: t.name.clone(),
                    room: room.to_string(),
                    round,
                    status: resp.status,
                    payload: Some(resp.text()),
                },
            );
            Some(resp.status)
        }
        Err(_) => None,
    }
}
