//! Presence on a node of a log (docs/presence.md#on-a-log-cluster): the
//! thread `pollbox-presence`, which writes this node's joins, leaves,
//! leases and syncs to the presence topic (`<log.topic>-presence`, one
//! partition) and reads every node's back, in log order, into the view
//! ([`pollbox_core::presence::log::PresenceView`]) that every node computes
//! alike; what the view says is what the node serves
//! ([`pollbox_core::presence::Presence::serve`]), and the watchers of a room
//! that moved are woken as for a box.
//!
//! What it is not: the rules of the view (the core's, property-tested), or
//! this node's connections and their grace (the workers', through the core's
//! [`pollbox_core::presence::Presence`]).

use super::client_config;
use crate::lifecycle::Lifecycle;
use crate::wakeups::Wakeups;
use pollbox_core::boxes::Watchers;
use pollbox_core::presence::log::{
    info_value, PresenceRecord, PresenceView, SyncMember, SyncRoom, LATE_START_LEASES,
};
use pollbox_core::presence::{presence_key, Outbound};
use pollbox_core::service::Node;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Rooms a part of a sync holds at most (a record stays far under Kafka's
/// 1 MB default).
const SYNC_ROOMS: usize = 64;
/// Members a part of a sync holds at most.
const SYNC_MEMBERS: usize = 2000;

/// How long a turn of the thread waits for records when none come: this
/// node's joins and leaves go out within it, and an idle node's thread
/// wakes this often.
const TURN_MS: u64 = 100;

/// What the presence thread is handed.
pub(crate) struct Presencing {
    pub(crate) node: Arc<Node>,
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// The listen address: with the host name, the node's default name.
    pub(crate) listen: SocketAddr,
}

/// The presence topic of a log whose topic is `topic`.
pub(crate) fn presence_topic(topic: &str) -> String {
    format!("{topic}-presence")
}

/// This node's name on the presence topic: `presence.node`, else the host
/// name and the listen port.
fn node_name(p: &Presencing) -> String {
    let named = &p.node.config.presence.node;
    if !named.is_empty() {
        return named.clone();
    }
    let host = host_name();
    format!("{host}:{}", p.listen.port())
}

/// The machine's host name (`gethostname`), or `pollbox` if it has none.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into `buf`, which
    // lives for the call; the result is read only up to its first NUL (or
    // the whole buffer, if it was cut short without one).
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if !ok || end == 0 {
        return "pollbox".to_string();
    }
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A new incarnation: the wall clock in microseconds, past any earlier one.
fn incarnation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

struct Writer<'a> {
    producer: &'a BaseProducer,
    topic: &'a str,
    node: &'a str,
}

impl Writer<'_> {
    fn send(&self, rec: &PresenceRecord) {
        let bytes = rec.encode();
        // Partition 0 whatever the topic has: one order for every node.
        let mut r = BaseRecord::to(self.topic)
            .partition(0)
            .key(self.node)
            .payload(&bytes);
        // A full queue: wait for it to drain (the records are few and small).
        for _ in 0..100 {
            match self.producer.send(r) {
                Ok(()) => return,
                Err((_, back)) => {
                    r = back;
                    self.producer.poll(Duration::from_millis(10));
                }
            }
        }
        eprintln!(
            "pollbox: presence: a record could not be queued for {}",
            self.topic
        );
    }
}

/// Make the presence topic if the brokers do not have it: one partition
/// (one order for every node), as many replicas as the log's topic has, and
/// records kept at least [`LATE_START_LEASES`] leases (a late node reads that
/// far back). A topic made by an operator is taken as it is.
fn ensure_topic(cfg: &pollbox_core::config::Config, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let Ok(admin) = client_config(&cfg.log).create::<AdminClient<DefaultClientContext>>() else {
        return;
    };
    let timeout = Duration::from_secs(5);
    let Ok(md) = admin.inner().fetch_metadata(None, timeout) else {
        return;
    };
    if md
        .topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none())
    {
        return;
    }
    let replicas = md
        .topics()
        .iter()
        .find(|t| t.name() == cfg.log.topic)
        .and_then(|t| t.partitions().first().map(|p| p.replicas().len()))
        .unwrap_or(1)
        .max(1) as i32;
    let retention = (cfg.presence.lease_ms * LATE_START_LEASES * 4)
        .max(3_600_000)
        .to_string();
    let new =
        NewTopic::new(topic, 1, TopicReplication::Fixed(replicas)).set("retention.ms", &retention);
    let opts = AdminOptions::new().operation_timeout(Some(timeout));
    match futures_executor::block_on(admin.create_topics([&new], &opts)) {
        Ok(results) => {
            for r in results {
                if let Err((name, e)) = r {
                    if e != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                        eprintln!("pollbox: presence: cannot make the topic {name}: {e}");
                    }
                }
            }
        }
        Err(e) => eprintln!("pollbox: presence: cannot make the topic {topic}: {e}"),
    }
}

/// The thread: until the workers have stopped.
pub(crate) fn run(p: &Presencing) {
    let cfg = &p.node.config;
    let topic = presence_topic(&cfg.log.topic);
    let lease = cfg.presence.lease_ms;
    let node = node_name(p);
    ensure_topic(cfg, &topic);
    let producer: BaseProducer = match client_config(&cfg.log)
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pollbox: presence: no producer for {topic}: {e}");
            return;
        }
    };
    let consumer: BaseConsumer = match client_config(&cfg.log)
        .set("group.id", "pollbox-presence")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        // As the consuming threads: a record answers a fetch at once; this is
        // how often an idle topic is asked again.
        .set("fetch.wait.max.ms", super::consume::FETCH_WAIT_MS)
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pollbox: presence: no consumer for {topic}: {e}");
            return;
        }
    };
    // Start where a late node must: the records of LATE_START_LEASES leases ago.
    let since = wall_ms().saturating_sub(LATE_START_LEASES * lease);
    let mut at = TopicPartitionList::new();
    let _ = at.add_partition_offset(&topic, 0, Offset::Offset(since as i64));
    let start = consumer
        .offsets_for_times(at, Duration::from_secs(10))
        .ok()
        .and_then(|l| l.elements().first().map(|e| e.offset()))
        .map(|o| match o {
            Offset::Offset(n) => Offset::Offset(n),
            _ => Offset::End,
        })
        .unwrap_or(Offset::End);
    let mut assign = TopicPartitionList::new();
    let _ = assign.add_partition_offset(&topic, 0, start);
    // Ready once read to where the topic ends now (what every node serves);
    // without an answer, at once (the log's own checks say what is wrong).
    let end = consumer
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .ok()
        .map(|(_, high)| high);
    let mut catching_up = match (end, start) {
        (Some(high), Offset::Offset(from)) if from < high => Some(high),
        _ => None,
    };
    if catching_up.is_none() {
        p.node.presence.set_caught_up();
    }
    if let Err(e) = consumer.assign(&assign) {
        eprintln!("pollbox: presence: cannot read {topic}: {e}");
        p.node.presence.set_caught_up();
        return;
    }
    let w = Writer {
        producer: &producer,
        topic: &topic,
        node: &node,
    };
    let mut inc = incarnation();
    w.send(&PresenceRecord::Hello {
        node: node.clone(),
        inc,
    });
    let mut view = PresenceView::new(lease);
    let began = Instant::now();
    let (mut last_lease, mut last_sync, mut seq) = (Instant::now(), Instant::now(), 0u64);
    let presence = &p.node.presence;
    let mut wakeups: &Wakeups = &p.wakeups;
    while !p.lifecycle.workers_stopped() {
        for o in presence.take_outbound() {
            w.send(&match o {
                Outbound::Join { room, member, info } => PresenceRecord::Join {
                    node: node.clone(),
                    inc,
                    room: lossy(&room),
                    member: lossy(&member),
                    info: info.and_then(|i| info_value(&i)),
                },
                Outbound::Leave { room, member } => PresenceRecord::Leave {
                    node: node.clone(),
                    inc,
                    room: lossy(&room),
                    member: lossy(&member),
                },
            });
        }
        if last_lease.elapsed() >= Duration::from_millis(lease / 3) {
            last_lease = Instant::now();
            w.send(&PresenceRecord::Lease {
                node: node.clone(),
                inc,
            });
        }
        if last_sync.elapsed() >= Duration::from_millis(lease) {
            last_sync = Instant::now();
            seq += 1;
            sync(&w, &view, presence.local_holds(), inc, seq);
        }
        producer.poll(Duration::ZERO);
        // Read what came, a bounded batch a turn. The first wait is the
        // turn's idle time: what the workers queue goes out within it.
        for k in 0..1000 {
            let timeout = Duration::from_millis(if k == 0 { TURN_MS } else { 0 });
            let Some(m) = consumer.poll(timeout) else {
                break;
            };
            let Ok(m) = m else {
                break;
            };
            if catching_up.is_some_and(|high| m.offset() + 1 >= high) {
                // Ready after this record (decodable or not) is applied.
                catching_up = Some(0);
            }
            let Some(rec) = m.payload().and_then(|b| PresenceRecord::decode(b).ok()) else {
                if catching_up == Some(0) {
                    catching_up = None;
                    presence.set_caught_up();
                }
                continue;
            };
            let ts = m.timestamp().to_millis().unwrap_or(0).max(0) as u64;
            let now_ms = began.elapsed().as_millis() as u64;
            for room in view.apply(m.offset(), ts, &rec) {
                let r = room.as_bytes();
                let members = view.members(&room);
                let known = view.knows(&room);
                let wake = if known {
                    presence.serve(r, view.version(&room), &members, now_ms)
                } else {
                    presence.forget(r);
                    true
                };
                if wake {
                    wakeups.box_updated(&presence_key(r));
                }
            }
            if catching_up == Some(0) {
                catching_up = None;
                presence.set_caught_up();
            }
        }
        presence.set_lease_expiries(view.expiries);
        if view.expired(&node, inc) {
            // Our records stopped for a lease (a stall): every node dropped
            // what we held. A new incarnation joins it all again.
            inc = incarnation();
            w.send(&PresenceRecord::Hello {
                node: node.clone(),
                inc,
            });
            for (room, member, info) in presence.local_holds() {
                w.send(&PresenceRecord::Join {
                    node: node.clone(),
                    inc,
                    room: lossy(&room),
                    member: lossy(&member),
                    info: info.and_then(|i| info_value(&i)),
                });
            }
        }
    }
    let _ = producer.flush(Duration::from_secs(1));
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// This node's whole presence, in parts, each room at the version the view
/// serves.
fn sync(
    w: &Writer<'_>,
    view: &PresenceView,
    holds: Vec<pollbox_core::presence::Hold>,
    inc: u64,
    seq: u64,
) {
    let mut rooms: BTreeMap<String, Vec<SyncMember>> = BTreeMap::new();
    for (room, member, info) in holds {
        rooms.entry(lossy(&room)).or_default().push(SyncMember {
            id: lossy(&member),
            info: info.and_then(|i| info_value(&i)),
        });
    }
    let mut parts: Vec<Vec<SyncRoom>> = vec![Vec::new()];
    let mut members_in_part = 0;
    for (room, members) in rooms {
        let last = parts.last().map_or(0, Vec::len);
        if last >= SYNC_ROOMS || (last > 0 && members_in_part + members.len() > SYNC_MEMBERS) {
            parts.push(Vec::new());
            members_in_part = 0;
        }
        members_in_part += members.len();
        if let Some(part) = parts.last_mut() {
            part.push(SyncRoom {
                ver: view.version(&room),
                room,
                members,
            });
        }
    }
    let count = parts.len();
    for (k, rooms) in parts.into_iter().enumerate() {
        w.send(&PresenceRecord::Sync {
            node: w.node.to_string(),
            inc,
            seq,
            last: k + 1 == count,
            rooms,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_name_is_the_kernels() {
        let name = host_name();
        assert!(!name.is_empty() && !name.contains('\0'));
        if let Ok(kernel) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            assert_eq!(name, kernel.trim());
        }
    }

    #[test]
    fn the_presence_topic_follows_the_logs() {
        assert_eq!(presence_topic("scores"), "scores-presence");
    }
}
