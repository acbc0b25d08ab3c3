//! The nemesis: a schedule of faults drawn from a seed, and the lanes that
//! inject them into the cluster, each fault recorded in the history when it
//! begins and when it ends.
//!
//! Three lanes run at once, each one fault at a time:
//! - **brokers**: kill -9 a broker (restarted on its data), SIGSTOP one
//!   (SIGCONT later), cut one off from the other brokers, kill -9 the
//!   leader of a partition, move a partition's leader (Kafka's reassignment
//!   and leader-election tools). After each, the lane waits until every
//!   partition has its three replicas in sync again, so two brokers are never
//!   down at once by the nemesis' own doing.
//! - **nodes**: kill -9 a node (restarted from its snapshot), SIGSTOP one,
//!   cut one off from the brokers (its HTTP side still answers). After each,
//!   the lane waits until the node is ready.
//! - **foreign**: bursts of records from a plain Kafka producer on
//!   librdkafka's default partitioner, writing the workload's keys.
//!
//! The schedule (which faults, in which order, on what, how long) depends on
//! the seed only; when each begins also depends on how long recoveries take
//! on the machine. The first faults of each lane are every kind once, so a
//! short run covers them all.
//!
//! What it is not: the checker's business. A fault that cannot be injected
//! (a leader move with no other replica in sync) is recorded as such and
//! the run goes on.

use crate::cluster::kafka::{produce_one, BROKERS};
use crate::cluster::net::Lan;
use crate::cluster::{Cluster, PARTITIONS, TOPIC};
use crate::history::{Event, Outcome, Phase, Recorder};
use crate::rng::Rng;
use crate::workload::Shared;
use serde::Serialize;
use std::time::{Duration, Instant};

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fault {
    KillBroker { broker: usize },
    PauseBroker { broker: usize },
    IsolateBroker { broker: usize },
    KillLeader { partition: i32 },
    MoveLeader { partition: i32 },
    KillNode { node: usize },
    PauseNode { node: usize },
    IsolateNode { node: usize },
    Foreign { records: u32 },
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::KillBroker { .. } => "kill-broker",
            Fault::PauseBroker { .. } => "pause-broker",
            Fault::IsolateBroker { .. } => "isolate-broker",
            Fault::KillLeader { .. } => "kill-leader",
            Fault::MoveLeader { .. } => "move-leader",
            Fault::KillNode { .. } => "kill-node",
            Fault::PauseNode { .. } => "pause-node",
            Fault::IsolateNode { .. } => "isolate-node",
            Fault::Foreign { .. } => "foreign-producer",
        }
    }
}

/// A fault, the pause before it and how long it is held.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Step {
    pub gap_ms: u64,
    pub hold_ms: u64,
    pub fault: Fault,
}

#[derive(Debug, Clone, Serialize)]
pub struct Schedule {
    pub seed: u64,
    pub brokers: Vec<Step>,
    pub nodes: Vec<Step>,
    pub foreign: Vec<Step>,
}

/// The node names the nemesis may fault.
pub const NODES: [&str; 2] = ["a", "b"];

impl Schedule {
    /// Enough steps for `duration` (a lane stops at its end).
    pub fn generate(seed: u64, duration: Duration) -> Schedule {
        let mut rng = Rng::new(seed);
        let n = (duration.as_secs() / 3).max(6) as usize;
        let broker_kinds: [fn(&mut Rng) -> Fault; 5] = [
            |r| Fault::KillBroker {
                broker: r.below(BROKERS),
            },
            |r| Fault::PauseBroker {
                broker: r.below(BROKERS),
            },
            |r| Fault::IsolateBroker {
                broker: r.below(BROKERS),
            },
            |r| Fault::KillLeader {
                partition: r.below(PARTITIONS as usize) as i32,
            },
            |r| Fault::MoveLeader {
                partition: r.below(PARTITIONS as usize) as i32,
            },
        ];
        let node_kinds: [fn(&mut Rng) -> Fault; 3] = [
            |r| Fault::KillNode {
                node: r.below(NODES.len()),
            },
            |r| Fault::PauseNode {
                node: r.below(NODES.len()),
            },
            |r| Fault::IsolateNode {
                node: r.below(NODES.len()),
            },
        ];
        let lane =
            |rng: &mut Rng, kinds: &[fn(&mut Rng) -> Fault], gap: (u64, u64), hold: (u64, u64)| {
                // Every kind once, in a seeded order, then any.
                let mut order: Vec<usize> = (0..kinds.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i + 1));
                }
                (0..n)
                    .map(|i| {
                        let k = if i < order.len() {
                            order[i]
                        } else {
                            rng.below(kinds.len())
                        };
                        Step {
                            gap_ms: rng.range(gap.0, gap.1),
                            hold_ms: rng.range(hold.0, hold.1),
                            fault: kinds[k](rng),
                        }
                    })
                    .collect::<Vec<_>>()
            };
        let brokers = lane(&mut rng, &broker_kinds, (1_000, 3_000), (3_000, 8_000));
        let nodes = lane(&mut rng, &node_kinds, (1_500, 4_000), (2_000, 7_000));
        let foreign = (0..n)
            .map(|_| Step {
                gap_ms: rng.range(3_000, 8_000),
                hold_ms: 0,
                fault: Fault::Foreign {
                    records: rng.range(5, 20) as u32,
                },
            })
            .collect();
        Schedule {
            seed,
            brokers,
            nodes,
            foreign,
        }
    }
}

/// Run the schedule's three lanes until `until`; each lane finishes the
/// fault it is in (heals it) before returning. Returns the faults injected.
pub fn run(
    schedule: &Schedule,
    cluster: &Cluster,
    rec: &Recorder,
    shared: &Shared,
    until: Instant,
) -> u64 {
    let seed = schedule.seed;
    std::thread::scope(|s| {
        let lanes = [&schedule.brokers, &schedule.nodes, &schedule.foreign];
        let handles: Vec<_> = lanes
            .into_iter()
            .enumerate()
            .map(|(lane, steps)| {
                s.spawn(move || {
                    // For what a step draws as it runs (the foreign keys).
                    let mut rng = Rng::new(seed ^ (0x5eed_0000 + lane as u64));
                    let mut done = 0;
                    for step in steps {
                        if !sleep_until(Instant::now() + Duration::from_millis(step.gap_ms), until)
                        {
                            break;
                        }
                        inject(step, cluster, rec, shared, &mut rng);
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    })
}

/// Sleep until `t`, or return false at once if that is past `until`.
fn sleep_until(t: Instant, until: Instant) -> bool {
    if t >= until {
        return false;
    }
    std::thread::sleep(t.saturating_duration_since(Instant::now()));
    true
}

fn start(rec: &Recorder, fault: &str, target: &str, detail: Option<String>) -> u64 {
    eprintln!(
        "pollbox-faults: {:>7.1}s  {fault} {target} {}",
        rec.now() as f64 / 1e6,
        detail.as_deref().unwrap_or("")
    );
    rec.note(
        "nemesis",
        Event::Fault {
            fault: fault.into(),
            target: target.into(),
            phase: Phase::Start,
            detail,
        },
    );
    rec.now()
}

fn end(rec: &Recorder, t0: u64, fault: &str, target: &str, detail: Option<String>) {
    rec.record(
        t0,
        "nemesis",
        Event::Fault {
            fault: fault.into(),
            target: target.into(),
            phase: Phase::End,
            detail,
        },
    );
}

fn inject(step: &Step, c: &Cluster, rec: &Recorder, shared: &Shared, rng: &mut Rng) {
    let hold = Duration::from_millis(step.hold_ms);
    let name = step.fault.name();
    match step.fault {
        Fault::KillBroker { broker } => kill_broker(c, rec, name, broker, None, hold),
        Fault::KillLeader { partition } => {
            let leader = c
                .brokers
                .partitions(TOPIC)
                .ok()
                .and_then(|ps| ps.into_iter().find(|p| p.id == partition))
                .map(|p| p.leader);
            match leader {
                Some(l) if l >= 1 => kill_broker(
                    c,
                    rec,
                    name,
                    (l - 1) as usize,
                    Some(format!("leader of partition {partition}")),
                    hold,
                ),
                other => {
                    let t = start(
                        rec,
                        name,
                        &format!("partition{partition}"),
                        Some(format!("no leader to kill: {other:?}")),
                    );
                    end(rec, t, name, &format!("partition{partition}"), None);
                }
            }
        }
        Fault::PauseBroker { broker } => {
            let target = c.brokers.list[broker].host.clone();
            let t = start(rec, name, &target, None);
            let r = c.brokers.signal(broker, libc::SIGSTOP);
            std::thread::sleep(hold);
            let _ = c.brokers.signal(broker, libc::SIGCONT);
            end(rec, t, name, &target, r.err());
            settle_brokers(c, rec);
        }
        Fault::IsolateBroker { broker } => {
            let target = c.brokers.list[broker].host.clone();
            let t = start(rec, name, &target, Some("from the other brokers".into()));
            let r = c.net.cut(&target, Lan::Replication);
            std::thread::sleep(hold);
            let _ = c.net.heal(&target, Lan::Replication);
            end(rec, t, name, &target, r.err());
            settle_brokers(c, rec);
        }
        Fault::MoveLeader { partition } => {
            let target = format!("partition{partition}");
            let t = start(rec, name, &target, None);
            let r = c.brokers.move_leader(TOPIC, partition, &c.layout.dir);
            end(
                rec,
                t,
                name,
                &target,
                Some(r.unwrap_or_else(|e| format!("failed: {e}"))),
            );
            std::thread::sleep(hold);
            settle_brokers(c, rec);
        }
        Fault::KillNode { node } => {
            let n = c.node(NODES[node]);
            let t = start(rec, name, &n.name, None);
            n.kill();
            std::thread::sleep(hold);
            let r = n.start(&c.net);
            end(rec, t, name, &n.name, r.err());
            settle_node(c, rec, node);
        }
        Fault::PauseNode { node } => {
            let n = c.node(NODES[node]);
            let t = start(rec, name, &n.name, None);
            let r = n.signal(libc::SIGSTOP);
            std::thread::sleep(hold);
            let _ = n.signal(libc::SIGCONT);
            end(rec, t, name, &n.name, r.err());
            settle_node(c, rec, node);
        }
        Fault::IsolateNode { node } => {
            let n = c.node(NODES[node]);
            let t = start(rec, name, &n.name, Some("from the brokers".into()));
            let r = c.net.cut(&n.name, Lan::Kafka);
            std::thread::sleep(hold);
            let _ = c.net.heal(&n.name, Lan::Kafka);
            end(rec, t, name, &n.name, r.err());
            settle_node(c, rec, node);
        }
        Fault::Foreign { records } => {
            let t = start(rec, name, "topic", Some(format!("{records} records")));
            foreign_burst(c, rec, shared, records, rng);
            end(rec, t, name, "topic", None);
        }
    }
}

fn kill_broker(
    c: &Cluster,
    rec: &Recorder,
    name: &str,
    broker: usize,
    detail: Option<String>,
    hold: Duration,
) {
    let target = c.brokers.list[broker].host.clone();
    let t = start(rec, name, &target, detail);
    c.brokers.kill(broker);
    std::thread::sleep(hold);
    let r = c
        .brokers
        .launch(&c.net, broker)
        .and_then(|_| c.brokers.wait_started(broker, Duration::from_secs(120)));
    end(rec, t, name, &target, r.err());
    settle_brokers(c, rec);
}

/// Wait (up to a minute) until every partition has its 3 replicas in sync.
fn settle_brokers(c: &Cluster, rec: &Recorder) {
    if let Err(e) = c.brokers.wait_in_sync(TOPIC, Duration::from_secs(60)) {
        rec.note(
            "nemesis",
            Event::Fault {
                fault: "unsettled".into(),
                target: "brokers".into(),
                phase: Phase::End,
                detail: Some(e),
            },
        );
    }
}

/// Wait (up to a minute) until the node is ready again.
fn settle_node(c: &Cluster, rec: &Recorder, node: usize) {
    if let Err(e) = c.node(NODES[node]).wait_ready(Duration::from_secs(60)) {
        rec.note(
            "nemesis",
            Event::Fault {
                fault: "unsettled".into(),
                target: NODES[node].into(),
                phase: Phase::End,
                detail: Some(e),
            },
        );
    }
}

fn foreign_burst(c: &Cluster, rec: &Recorder, shared: &Shared, records: u32, rng: &mut Rng) {
    let producer = match c.brokers.foreign_producer() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("pollbox-faults: foreign producer: {e}");
            return;
        }
    };
    for _ in 0..records {
        let key = &shared.keys[rng.below(shared.keys.len())];
        let value = shared.next_value();
        let body = format!(r#"{{"value":{value},"player":"f"}}"#);
        let t0 = rec.now();
        let r = produce_one(
            &producer,
            TOPIC,
            value as u64,
            key,
            &body,
            Duration::from_secs(15),
        );
        let (outcome, partition, offset, error) = match r {
            Ok((p, o)) => (Outcome::Ok, Some(p), Some(o), None),
            Err(e) => (Outcome::Indeterminate, None, None, Some(e)),
        };
        rec.record(
            t0,
            "foreign",
            Event::Foreign {
                key: key.clone(),
                value,
                player: "f".into(),
                outcome,
                partition,
                offset,
                error,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_covering_every_kind() {
        let a = Schedule::generate(7, Duration::from_secs(90));
        let b = Schedule::generate(7, Duration::from_secs(90));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        let c = Schedule::generate(8, Duration::from_secs(90));
        assert_ne!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&c).unwrap()
        );
        let first: std::collections::BTreeSet<&str> = a.brokers[..5]
            .iter()
            .chain(&a.nodes[..3])
            .map(|s| s.fault.name())
            .collect();
        assert_eq!(first.len(), 8, "{first:?}");
    }
}
