//! The model check of the handshake: [`PartitionAcks::applied`] (the
//! consuming thread) and [`PartitionAcks::acknowledged`] (the delivery
//! thread) run on two threads, one step at a time, in **every** order of
//! their steps (each `SeqCst` operation on `next` and `first_held`, and the
//! mutex taken and let go, which a thread waiting for it cannot pass).
//! Sequential consistency is what `SeqCst` promises for these operations, so
//! an order of steps is an execution; a depth-first search over the choice
//! of which thread steps next visits each.
//!
//! The methods are the real ones: the steps are marked inside them
//! ([`super::step`], [`super::lock_step`], [`super::Locked`]'s drop), and a
//! thread that no check runs passes its marks at once.
//!
//! Why not loom: loom treats a `SeqCst` load or store as acquire/release, so
//! it reports a Dekker pair of them as broken when it is not.

use super::{DeliveryTag, PartitionAcks};
use pollbox_core::service::Report;
use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// What a thread waits at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// An atomic operation.
    Step,
    /// Taking the partition's lock.
    Lock,
}

#[derive(Debug, Default)]
struct Turns {
    /// The thread allowed to run until its next mark.
    turn: Option<usize>,
    /// Where each thread waits (none: running, or done).
    at: Vec<Option<Mark>>,
    done: Vec<bool>,
    /// The thread that holds the partition's lock.
    holder: Option<usize>,
}

/// The threads of one run, stepped by the checking thread.
#[derive(Default)]
struct Scheduler {
    turns: Mutex<Turns>,
    moved: Condvar,
}

thread_local! {
    static CURRENT: RefCell<Option<(Arc<Scheduler>, usize)>> = const { RefCell::new(None) };
}

impl Scheduler {
    fn lock(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Thread `me` reached `mark`: wait for its turn.
    fn reach(&self, me: usize, mark: Mark) {
        let mut t = self.lock();
        t.at[me] = Some(mark);
        t.turn = None;
        self.moved.notify_all();
        while t.turn != Some(me) {
            t = self.moved.wait(t).unwrap_or_else(PoisonError::into_inner);
        }
        t.at[me] = None;
        if mark == Mark::Lock {
            t.holder = Some(me);
        }
    }

    fn unlocked(&self, me: usize) {
        let mut t = self.lock();
        if t.holder == Some(me) {
            t.holder = None;
        }
    }

    fn finish(&self, me: usize) {
        let mut t = self.lock();
        t.done[me] = true;
        t.at[me] = None;
        if t.holder == Some(me) {
            t.holder = None;
        }
        t.turn = None;
        self.moved.notify_all();
    }
}

fn with(f: impl FnOnce(&Scheduler, usize)) {
    CURRENT.with(|c| {
        if let Some((s, me)) = &*c.borrow() {
            f(s, *me);
        }
    });
}

pub(super) fn step() {
    with(|s, me| s.reach(me, Mark::Step));
}

pub(super) fn lock_step() {
    with(|s, me| s.reach(me, Mark::Lock));
}

pub(super) fn unlocked() {
    with(|s, me| s.unlocked(me));
}

/// A thread's body.
type Body = Box<dyn FnOnce() + Send>;

/// Run `bodies` on threads of their own, letting one step at a time: at
/// each choice `choose` gets the threads that can step and names one.
/// Returns the threads chosen, in order.
fn run(bodies: Vec<Body>, mut choose: impl FnMut(&[usize]) -> usize) -> Vec<usize> {
    let n = bodies.len();
    let s = Arc::new(Scheduler::default());
    {
        let mut t = s.lock();
        t.at = vec![None; n];
        t.done = vec![false; n];
    }
    let threads: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(me, body)| {
            let s = s.clone();
            std::thread::spawn(move || {
                /// Done even if the body panics, so the run ends.
                struct Finish(Arc<Scheduler>, usize);
                impl Drop for Finish {
                    fn drop(&mut self) {
                        self.0.finish(self.1);
                    }
                }
                let _finish = Finish(s.clone(), me);
                CURRENT.with(|c| *c.borrow_mut() = Some((s, me)));
                body();
                CURRENT.with(|c| *c.borrow_mut() = None);
            })
        })
        .collect();
    let mut chosen = Vec::new();
    loop {
        let mut t = s.lock();
        // Every thread at a mark or done, and none running.
        while t.turn.is_some() || (0..n).any(|i| !t.done[i] && t.at[i].is_none()) {
            t = s.moved.wait(t).unwrap_or_else(PoisonError::into_inner);
        }
        let can: Vec<usize> = (0..n)
            .filter(|&i| match t.at[i] {
                Some(Mark::Step) => true,
                Some(Mark::Lock) => t.holder.is_none(),
                None => false,
            })
            .collect();
        if can.is_empty() {
            assert!(t.done.iter().all(|&d| d), "deadlock after {chosen:?}");
            break;
        }
        let next = choose(&can);
        chosen.push(next);
        t.turn = Some(next);
        s.moved.notify_all();
    }
    for th in threads {
        if let Err(e) = th.join() {
            std::panic::resume_unwind(e);
        }
    }
    chosen
}

/// Run `scenario` in every order of its threads' steps: it builds the
/// threads' bodies afresh, and a check of what they did, which says what
/// went wrong, if anything. Panics with the first order that went wrong.
/// Returns how many orders there were.
fn every_order(
    mut scenario: impl FnMut() -> (Vec<Body>, Box<dyn FnOnce() -> Result<(), String>>),
) -> usize {
    // The choices of the run to come: (index among the threads that could
    // step, how many could).
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut orders = 0;
    loop {
        let (bodies, check) = scenario();
        let mut depth = 0;
        let order = run(bodies, |can| {
            if depth == path.len() {
                path.push((0, can.len()));
            }
            let (i, n) = path[depth];
            assert_eq!(n, can.len(), "the same choices give the same run");
            depth += 1;
            can[i]
        });
        orders += 1;
        if let Err(e) = check() {
            panic!("order {orders} (threads stepping: {order:?}): {e}");
        }
        // The next order: the last choice with another option left.
        while let Some((i, n)) = path.pop() {
            if i + 1 < n {
                path.push((i + 1, n));
                break;
            }
        }
        if path.is_empty() {
            return orders;
        }
    }
}

fn tag(request: u64) -> DeliveryTag {
    DeliveryTag {
        worker: 0,
        request,
        index: 0,
    }
}

/// What a side was told: (tag's request, report).
type Told = Arc<Mutex<Vec<(u64, Report)>>>;

fn teller(told: &Told) -> impl FnMut(DeliveryTag, Report, Instant) + '_ {
    move |t, r, _| told.lock().unwrap().push((t.request, r))
}

/// The consuming thread applies `applies` in order while the delivery
/// thread acknowledges `runs` (each a run of offsets, the tag's request
/// the offset): once both are done, every acknowledged offset below `next`
/// was reported exactly once with its outcome, and every other is still
/// held and is reported by the apply that comes for it.
fn scenario(applies: &'static [(i64, Report)], runs: &'static [&'static [i64]]) -> usize {
    every_order(|| {
        let acks = Arc::new(PartitionAcks::new(0));
        let told: Told = Arc::default();
        let consuming: Body = {
            let (acks, told) = (acks.clone(), told.clone());
            Box::new(move || {
                for &(o, r) in applies {
                    acks.applied(o, r, teller(&told));
                }
            })
        };
        let delivering: Body = {
            let (acks, told) = (acks.clone(), told.clone());
            Box::new(move || {
                for run in runs {
                    let run: Vec<_> = run
                        .iter()
                        .map(|&o| (o, tag(o as u64), Instant::now()))
                        .collect();
                    acks.acknowledged(run, teller(&told));
                }
            })
        };
        let check = Box::new(move || -> Result<(), String> {
            let next = acks.next();
            let outcome = |o: i64| {
                applies
                    .iter()
                    .find(|&&(a, _)| a == o)
                    .map_or(Report::Applied, |&(_, r)| r)
            };
            let acked: Vec<i64> = runs.iter().flat_map(|r| r.iter().copied()).collect();
            let got = told.lock().unwrap().clone();
            for &o in &acked {
                let times: Vec<_> = got.iter().filter(|&&(t, _)| t == o as u64).collect();
                let want = usize::from(o < next);
                if times.len() != want {
                    return Err(format!(
                        "offset {o} reported {} times with next at {next} (want {want}); told {got:?}",
                        times.len()
                    ));
                }
                if let Some(&&(_, r)) = times.first() {
                    if r != outcome(o) {
                        return Err(format!("offset {o} reported {r:?}, not {:?}", outcome(o)));
                    }
                }
            }
            let held = acked.iter().filter(|&&o| o >= next).count();
            if acks.held() != held {
                return Err(format!("{} held, want {held}", acks.held()));
            }
            // What is held is reported by its apply, later.
            for o in next..=acked.iter().copied().max().unwrap_or(-1) {
                acks.applied(o, Report::Applied, teller(&told));
            }
            let got = told.lock().unwrap();
            if got.len() != acked.len() || acks.held() != 0 {
                return Err(format!(
                    "after the later applies: told {got:?}, {} held",
                    acks.held()
                ));
            }
            Ok(())
        });
        (vec![consuming, delivering], check)
    })
}

#[test]
fn a_last_record_acknowledged_as_it_is_applied_is_reported_once_in_every_order() {
    let orders = scenario(&[(0, Report::Applied)], &[&[0]]);
    eprintln!("{orders} orders");
    assert!(orders > 10, "{orders} orders");
}

#[test]
fn a_run_half_applied_is_reported_in_every_order_with_each_outcome() {
    const APPLIES: &[(i64, Report)] = &[(0, Report::Applied), (1, Report::NoBox)];
    const RUNS: &[&[i64]] = &[&[0, 1, 2]];
    let orders = scenario(APPLIES, RUNS);
    eprintln!("{orders} orders");
    assert!(orders > 10, "{orders} orders");
}

#[test]
fn two_runs_meet_three_applies_in_every_order() {
    const APPLIES: &[(i64, Report)] = &[
        (0, Report::Applied),
        (1, Report::Failed),
        (2, Report::Applied),
    ];
    const RUNS: &[&[i64]] = &[&[1], &[2]];
    let orders = scenario(APPLIES, RUNS);
    eprintln!("{orders} orders");
    assert!(orders > 100, "{orders} orders");
}
