//! Two nodes agree: a simulated cluster of three nodes joins, leaves, crashes,
//! restarts and goes quiet while time passes; one view reads the whole
//! presence topic, another starts late (at [`LATE_START_LEASES`] leases
//! before the end). Both must serve the same members, info and versions, and
//! those members must be exactly what the live nodes hold.

use super::*;
use proptest::prelude::*;
use serde_json::json;

const LEASE: u64 = 1000;

#[derive(Debug, Clone)]
enum Op {
    Join(usize, usize, usize, u8),
    Leave(usize, usize, usize),
    Advance(u64),
    Crash(usize),
    Restart(usize),
    /// A node's records are held back (a broker stall) past its lease.
    Stall(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, 0..3usize, 0..5usize, 0..3u8).prop_map(|(n, r, m, i)| Op::Join(n, r, m, i)),
        4 => (0..3usize, 0..3usize, 0..5usize).prop_map(|(n, r, m)| Op::Leave(n, r, m)),
        4 => (1..2 * LEASE).prop_map(Op::Advance),
        // Node 0 never crashes: a cluster with no node left writes nothing,
        // and serves no one.
        1 => (1..3usize).prop_map(Op::Crash),
        1 => (1..3usize).prop_map(Op::Restart),
        1 => (0..3usize).prop_map(Op::Stall),
    ]
}

struct SimNode {
    id: String,
    inc: u64,
    alive: bool,
    /// Its records go nowhere until this log time (a stall).
    stalled_until: u64,
    holds: BTreeMap<(String, String), Option<serde_json::Value>>,
    last_lease: u64,
    last_sync: u64,
    seq: u64,
}

struct Sim {
    ts: u64,
    log: Vec<(u64, PresenceRecord)>,
    /// The view of a node that reads everything as it is written.
    view: PresenceView,
    nodes: Vec<SimNode>,
}

impl Sim {
    fn new() -> Sim {
        let mut s = Sim {
            ts: 1_000_000,
            log: Vec::new(),
            view: PresenceView::new(LEASE),
            nodes: (0..3)
                .map(|i| SimNode {
                    id: format!("node-{i}"),
                    inc: 1,
                    alive: true,
                    stalled_until: 0,
                    holds: BTreeMap::new(),
                    last_lease: 0,
                    last_sync: 0,
                    seq: 0,
                })
                .collect(),
        };
        for i in 0..3 {
            let (id, inc) = (s.nodes[i].id.clone(), s.nodes[i].inc);
            s.produce(PresenceRecord::Hello { node: id, inc });
        }
        s
    }

    fn produce(&mut self, rec: PresenceRecord) {
        // Through the wire format, as the topic carries it.
        let rec = PresenceRecord::decode(&rec.encode()).unwrap();
        let offset = self.log.len() as i64;
        self.view.apply(offset, self.ts, &rec);
        self.log.push((self.ts, rec));
    }

    fn writes(&self, i: usize) -> bool {
        self.nodes[i].alive && self.nodes[i].stalled_until <= self.ts
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Join(i, r, m, info) if self.writes(i) => {
                let (room, member) = (format!("room-{r}/"), format!("m-{m}"));
                let info = (info > 0).then(|| json!({ "v": info }));
                let n = &mut self.nodes[i];
                if n.holds.get(&(room.clone(), member.clone())) != Some(&info) {
                    n.holds.insert((room.clone(), member.clone()), info.clone());
                    let (node, inc) = (n.id.clone(), n.inc);
                    self.produce(PresenceRecord::Join {
                        node,
                        inc,
                        room,
                        member,
                        info,
                    });
                }
            }
            Op::Leave(i, r, m) if self.writes(i) => {
                let (room, member) = (format!("room-{r}/"), format!("m-{m}"));
                let n = &mut self.nodes[i];
                if n.holds.remove(&(room.clone(), member.clone())).is_some() {
                    let (node, inc) = (n.id.clone(), n.inc);
                    self.produce(PresenceRecord::Leave {
                        node,
                        inc,
                        room,
                        member,
                    });
                }
            }
            Op::Advance(ms) => self.advance(ms),
            Op::Crash(i) => {
                self.nodes[i].alive = false;
                self.nodes[i].holds.clear();
            }
            Op::Restart(i) if !self.nodes[i].alive => {
                let n = &mut self.nodes[i];
                n.alive = true;
                n.inc += 1;
                n.last_lease = self.ts;
                let (node, inc) = (n.id.clone(), n.inc);
                self.produce(PresenceRecord::Hello { node, inc });
            }
            Op::Stall(i) => self.nodes[i].stalled_until = self.ts + 2 * LEASE,
            _ => {}
        }
        self.tick();
    }

    /// Time passes in steps of at most a quarter lease, each a tick.
    fn advance(&mut self, ms: u64) {
        let mut left = ms;
        while left > 0 {
            let d = left.min(LEASE / 4);
            self.ts += d;
            left -= d;
            self.tick();
        }
    }

    /// What each writing node does by itself: leases, syncs, and a new
    /// incarnation once its view says it expired.
    fn tick(&mut self) {
        for i in 0..self.nodes.len() {
            if !self.writes(i) {
                continue;
            }
            let (id, inc) = (self.nodes[i].id.clone(), self.nodes[i].inc);
            if self.view.expired(&id, inc) {
                let n = &mut self.nodes[i];
                n.inc += 1;
                let inc = n.inc;
                let holds: Vec<_> = n.holds.clone().into_iter().collect();
                self.produce(PresenceRecord::Hello {
                    node: id.clone(),
                    inc,
                });
                for ((room, member), info) in holds {
                    self.produce(PresenceRecord::Join {
                        node: id.clone(),
                        inc,
                        room,
                        member,
                        info,
                    });
                }
                self.nodes[i].last_lease = self.ts;
                continue;
            }
            if self.ts >= self.nodes[i].last_lease + LEASE / 3 {
                self.nodes[i].last_lease = self.ts;
                self.produce(PresenceRecord::Lease {
                    node: id.clone(),
                    inc,
                });
            }
            if self.ts >= self.nodes[i].last_sync + LEASE {
                self.nodes[i].last_sync = self.ts;
                self.nodes[i].seq += 1;
                self.sync(i);
            }
        }
    }

    /// A node's whole presence, two rooms a part.
    fn sync(&mut self, i: usize) {
        let n = &self.nodes[i];
        let (node, inc, seq) = (n.id.clone(), n.inc, n.seq);
        let mut rooms: BTreeMap<String, Vec<SyncMember>> = BTreeMap::new();
        for ((room, member), info) in &n.holds {
            rooms.entry(room.clone()).or_default().push(SyncMember {
                id: member.clone(),
                info: info.clone(),
            });
        }
        let rooms: Vec<SyncRoom> = rooms
            .into_iter()
            .map(|(room, members)| SyncRoom {
                ver: self.view.version(&room),
                room,
                members,
            })
            .collect();
        let parts: Vec<Vec<SyncRoom>> = if rooms.is_empty() {
            vec![Vec::new()]
        } else {
            rooms.chunks(2).map(<[SyncRoom]>::to_vec).collect()
        };
        let count = parts.len();
        for (k, part) in parts.into_iter().enumerate() {
            self.produce(PresenceRecord::Sync {
                node: node.clone(),
                inc,
                seq,
                last: k + 1 == count,
                rooms: part,
            });
        }
    }

    /// What the live nodes hold: room → member → the first holder's info.
    fn held(&self) -> BTreeMap<String, BTreeMap<String, Option<String>>> {
        let mut out: BTreeMap<String, BTreeMap<String, Option<String>>> = BTreeMap::new();
        for n in self.nodes.iter().filter(|n| n.alive) {
            for ((room, member), info) in &n.holds {
                out.entry(room.clone())
                    .or_default()
                    .entry(member.clone())
                    .or_insert_with(|| info.as_ref().map(|v| v.to_string()));
            }
        }
        out
    }
}

/// A view's rooms that have members (an empty room is compared by version
/// only where both views know it).
fn listed(v: &PresenceView) -> BTreeMap<String, BTreeMap<String, Option<String>>> {
    v.rooms()
        .into_iter()
        .filter(|(_, (_, m))| !m.is_empty())
        .map(|(room, (_, m))| (room, m.into_iter().collect()))
        .collect()
}

fn run(ops: &[Op]) {
    let mut sim = Sim::new();
    for op in ops {
        sim.step(op);
    }
    // Quiet for long enough that every stall ends, every crash lapses, and a
    // late starter's window holds only what is settled.
    sim.advance(3 * LEASE);
    assert_eq!(
        listed(&sim.view),
        sim.held(),
        "members are what live nodes hold"
    );
    let end = sim.ts;
    let from = sim
        .log
        .iter()
        .position(|(ts, _)| *ts + LATE_START_LEASES * LEASE >= end)
        .unwrap_or(0);
    let mut late = PresenceView::new(LEASE);
    for (offset, (ts, rec)) in sim.log.iter().enumerate().skip(from) {
        late.apply(offset as i64, *ts, rec);
    }
    assert_eq!(
        late.rooms(),
        sim.view.rooms(),
        "a node that started late agrees"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn a_late_node_serves_the_same_members_and_versions(ops in proptest::collection::vec(op(), 0..80)) {
        run(&ops);
    }
}

#[test]
fn a_crashed_nodes_members_go_at_the_first_record_past_its_lease() {
    let mut v = PresenceView::new(LEASE);
    let join = |node: &str, member: &str| PresenceRecord::Join {
        node: node.into(),
        inc: 1,
        room: "r/".into(),
        member: member.into(),
        info: None,
    };
    v.apply(0, 0, &join("a", "ann"));
    v.apply(1, 0, &join("b", "ben"));
    assert_eq!(v.members("r/").len(), 2);
    let lease_b = PresenceRecord::Lease {
        node: "b".into(),
        inc: 1,
    };
    v.apply(2, LEASE, &lease_b);
    assert_eq!(v.members("r/").len(), 2, "at the lease, not past it");
    let changed = v.apply(3, LEASE + 1, &lease_b);
    assert!(changed.contains("r/"));
    assert_eq!(v.members("r/"), [("ben".to_string(), None)]);
    assert_eq!(v.version("r/"), 4, "the version of the record it lapsed at");
    assert_eq!(v.expiries, 1);
    // Its later records are ignored until it says hello again.
    v.apply(4, LEASE + 2, &join("a", "amy"));
    assert_eq!(v.members("r/").len(), 1);
    assert!(v.expired("a", 1));
    v.apply(
        5,
        LEASE + 3,
        &PresenceRecord::Hello {
            node: "a".into(),
            inc: 2,
        },
    );
    v.apply(
        6,
        LEASE + 3,
        &PresenceRecord::Join {
            node: "a".into(),
            inc: 2,
            room: "r/".into(),
            member: "ann".into(),
            info: None,
        },
    );
    assert_eq!(v.members("r/").len(), 2);
    assert_eq!(v.version("r/"), 7);
}

#[test]
fn a_hello_clears_the_earlier_incarnation_at_once() {
    let mut v = PresenceView::new(LEASE);
    v.apply(
        0,
        0,
        &PresenceRecord::Join {
            node: "a".into(),
            inc: 1,
            room: "r/".into(),
            member: "ann".into(),
            info: Some(json!({"x": 1})),
        },
    );
    assert_eq!(v.members("r/"), [("ann".into(), Some(r#"{"x":1}"#.into()))]);
    v.apply(
        1,
        10,
        &PresenceRecord::Hello {
            node: "a".into(),
            inc: 2,
        },
    );
    assert!(v.members("r/").is_empty());
    assert_eq!(v.version("r/"), 2);
    // An old incarnation's late record changes nothing.
    v.apply(
        2,
        11,
        &PresenceRecord::Leave {
            node: "a".into(),
            inc: 1,
            room: "r/".into(),
            member: "ann".into(),
        },
    );
    assert_eq!(v.version("r/"), 2);
}
