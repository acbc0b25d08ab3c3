//! When each connection sends. Open-loop: connection `i` of `C` intends its `k`-th
//! request at `i/R + k·C/R`, and a wake-up is kept per connection for the next one
//! due. Closed-loop: the connection's pipeline is kept full.
//!
//! What it is not: the rendering and writing of the requests (`driver`), nor the
//! measure of their latency (counted from the intended time where answers are).

use std::cmp::Reverse;

use super::connection::State;
use super::driver::Driver;

impl Driver<'_> {
    /// Intended send time of connection `c`'s `k`-th open-loop request.
    #[inline]
    pub(super) fn intended(&self, global: usize, k: u64, interval: f64) -> u64 {
        let stagger = interval * global as f64 / self.plan.connections as f64;
        (stagger + k as f64 * interval) as u64
    }

    /// How many requests this thread's schedule puts in the measured window.
    pub(super) fn scheduled_in_window(&self) -> u64 {
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

    pub(super) fn schedule(&mut self, i: usize, due: u64) {
        if self.conns[i].wake_at != Some(due) {
            self.conns[i].wake_at = Some(due);
            self.heap.push(Reverse((due, i)));
        }
    }

    pub(super) fn wake(&mut self, i: usize, now: u64) {
        match self.conns[i].state {
            State::Open => self.pump(i, now),
            State::Down { retry_at } if now >= retry_at => self.reconnect(i, now),
            State::Down { retry_at } => self.schedule(i, retry_at),
            State::Connecting => {}
        }
    }

    /// Queues every request that is due on connection `i` and writes them at once.
    pub(super) fn pump(&mut self, i: usize, now: u64) {
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
}
