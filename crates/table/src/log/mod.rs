//! What a record of the log does to the box table (docs/operations.md#the-kafka-log).
//!
//! With `[log]` set, a Kafka topic is the source of truth and every node a
//! replica built from it. A record is one message: its value a JSON object
//! (decoded with the same projection as an HTTP body), its key the box's key
//! (else the message's `key_field`), no value a delete (a tombstone). The
//! box's version is the record's position, [`version_of`] its offset, so every
//! node serves the same version and ETag for the same state, and a key created
//! again starts past every version it served. Expiry counts from the record's
//! timestamp, so every node and every replay removes the same boxes.
//!
//! A key lives in one partition: its home, [`home_partition`] (murmur2 of the
//! key modulo the partition count, Kafka's default partitioner). A record
//! found elsewhere (a producer on another partitioner) is
//! [`Outcome::WrongPartition`] and applied by no node, so live nodes and a
//! node replaying from nothing hold the same bytes under the same version,
//! whatever other producers do.
//!
//! A record the box already holds (a replay after a restart from a snapshot
//! that was taken while records were applied) changes nothing: see
//! [`BoxTable::apply_logged`]. A record that is not a valid message is
//! [`Outcome::Invalid`]: counted and skipped by the caller, never a stop.
//!
//! What it is not: a Kafka client. The server's `log` module owns the
//! client, its threads and sockets; it hands records in here, one at a time,
//! and sends the wake-ups out.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::arena::Arena;
use crate::boxes::{BoxTable, Logged, Watchers};
use crate::plan::{MessageError, Plan, Value};
use crate::projection::{BodyError, BodyFormat, KeySource, Projector, Shape};

/// What happened to one produced record, as the server learns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// This node applied it (a message), or it removed the box (a tombstone).
    Applied,
    /// A tombstone found no box (deleted meanwhile).
    NoBox,
    /// It is in the log, and the apply refused it (a sum that would
    /// overflow, a payload over the limit, `max_boxes`): the box is unchanged
    /// on every node.
    Refused(MessageError),
    /// The log did not take it or did not acknowledge it in time.
    Failed,
}

mod partition;
mod topic;
mod versions;

pub use partition::{home_partition, murmur2};
pub use topic::{TopicSettings, UnsafeSetting};
pub use versions::{parse_version, Bases, Headers, BEGIN_HEADER, VERSION_HEADER};

/// One record of the topic, as the client read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the Unix epoch (the producer's or the broker's
    /// clock, whichever the topic keeps); expiry counts from it.
    pub timestamp_ms: i64,
    pub key: Option<&'a [u8]>,
    /// `None`: a tombstone (delete the box).
    pub value: Option<&'a [u8]>,
    /// What its pollbox headers say (a migration's records only: [`Bases`]).
    pub headers: Headers,
}

/// The version a box gets from the record at `offset`: `offset + 1`, so
/// versions start at 1 and grow with the log.
pub fn version_of(offset: i64) -> u64 {
    u64::try_from(offset).map_or(0, |o| o.saturating_add(1))
}

/// Why a record was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// The value is not one JSON object (the projection's reason).
    Body(BodyError),
    /// A JSON array or NDJSON: a record holds one message.
    NotOneMessage,
    /// The message was refused as an HTTP ingest would refuse it.
    Message(MessageError),
    /// The record key is not UTF-8.
    KeyNotUtf8,
    /// A tombstone without a key.
    TombstoneWithoutKey,
    /// A negative offset (never from a real broker).
    BadOffset,
}

impl Invalid {
    /// The reason, for the log line written once per invalid record.
    pub fn describe(&self, plan: &Plan) -> String {
        match self {
            Invalid::Body(e) => e.to_string(),
            Invalid::NotOneMessage => {
                "a record holds one JSON object (not an array or a scalar)".into()
            }
            Invalid::Message(e) => {
                let mut s = Vec::new();
                e.write_reason(plan, &mut s);
                String::from_utf8_lossy(&s).into_owned()
            }
            Invalid::KeyNotUtf8 => "record key is not valid UTF-8".into(),
            Invalid::TombstoneWithoutKey => "a tombstone (no value) without a key".into(),
            Invalid::BadOffset => "negative offset".into(),
        }
    }
}

/// What one record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The box of this key is at `version` now: wake its waiters.
    Applied { version: u64 },
    /// A tombstone removed the box: wake its waiters.
    Deleted { version: u64 },
    /// A tombstone for a box that is not there (or newer than it).
    NoBox,
    /// The box already holds this record (a replay): nothing changed.
    Replayed,
    /// The record is not in its key's home partition (its producer does not
    /// partition by murmur2): applied by no node.
    WrongPartition { home: i32 },
    /// Not a valid message: counted, logged and skipped.
    Invalid(Invalid),
    /// A marker (no key, no value, a named version): the partition's
    /// versions go on past `version` ([`Bases`]).
    Marker { version: u64 },
    /// The record a migrated topic begins with: the boxes before it are in
    /// the migration's snapshot, which this node did not start from.
    Begin,
}

impl Outcome {
    /// What the connection that produced this record is told. Only a record
    /// this apply changed (or a delete that found no box) is taken: a replay
    /// or a record outside its home partition was not applied here, so its
    /// ingest must not be answered 2xx.
    pub fn report(&self) -> Report {
        match self {
            Outcome::Applied { .. } | Outcome::Deleted { .. } => Report::Applied,
            Outcome::NoBox => Report::NoBox,
            Outcome::Invalid(Invalid::Message(e)) => Report::Refused(*e),
            Outcome::Replayed
            | Outcome::WrongPartition { .. }
            | Outcome::Invalid(_)
            | Outcome::Marker { .. }
            | Outcome::Begin => Report::Failed,
        }
    }

    /// Whether the box changed, so its waiters are woken.
    pub fn changed_box(&self) -> bool {
        matches!(self, Outcome::Applied { .. } | Outcome::Deleted { .. })
    }
}

/// Arena bytes kept for records: a record of the largest message fits.
const RECORD_ARENA_BYTES: usize = 256 * 1024;

/// The lane of a partition's records (docs/boxes.md#watermarks).
fn lane_of_partition(partition: i32) -> usize {
    usize::try_from(partition).unwrap_or(0)
}

/// `Some(WrongPartition)` when `key` does not belong in `rec`'s partition.
fn misplaced(partitions: u32, rec: &Record<'_>, key: &[u8]) -> Option<Outcome> {
    let home = home_partition(key, partitions);
    (home != rec.partition).then_some(Outcome::WrongPartition { home })
}

/// Applies records to the box table: the projection and the arena of the
/// thread that consumes the log, and the topic's partition count (fixed for
/// the topic's life) that names each key's home partition.
pub struct Replica {
    projector: Projector,
    arena: Arena,
    partitions: u32,
    bases: Bases,
}

impl Replica {
    pub fn new(plan: Arc<Plan>, arena_limit_bytes: usize, partitions: u32) -> Replica {
        Replica {
            projector: Projector::new(plan),
            arena: Arena::new(RECORD_ARENA_BYTES.min(arena_limit_bytes), arena_limit_bytes),
            partitions: partitions.max(1),
            bases: Bases::default(),
        }
    }

    /// Start from the partitions' bases a snapshot holds ([`Position::base`]).
    pub fn with_bases(mut self, bases: &BTreeMap<i32, u64>) -> Replica {
        self.bases = Bases::from_map(bases);
        self
    }

    /// Partition `p`'s base now: what its versions are past its offsets.
    pub fn base(&self, p: i32) -> u64 {
        self.bases.get(p)
    }

    /// Apply `rec` to `boxes`, and tell `watchers` when the box changed,
    /// as an HTTP ingest does. The key the record is about is the record
    /// key, or the message's `key_field`: it is written into `key` (cleared
    /// first) whatever the outcome.
    pub fn apply(
        &mut self,
        boxes: &BoxTable,
        rec: &Record<'_>,
        key: &mut Vec<u8>,
        watchers: &mut impl Watchers,
    ) -> Outcome {
        key.clear();
        if rec.offset < 0 {
            return Outcome::Invalid(Invalid::BadOffset);
        }
        let version = self
            .bases
            .version(rec.partition, rec.offset, rec.headers.version);
        let outcome = self.apply_record(boxes, rec, version, key);
        told(boxes, rec.partition, version, key, watchers, outcome)
    }

    fn apply_record(
        &mut self,
        boxes: &BoxTable,
        rec: &Record<'_>,
        version: u64,
        key: &mut Vec<u8>,
    ) -> Outcome {
        if rec.headers.begin {
            return Outcome::Begin;
        }
        if let Some(k) = rec.key {
            if std::str::from_utf8(k).is_err() {
                return Outcome::Invalid(Invalid::KeyNotUtf8);
            }
            key.extend_from_slice(k);
        }
        let Some(value) = rec.value else {
            if rec.key.is_none() {
                if rec.headers.version.is_some() {
                    return Outcome::Marker { version };
                }
                return Outcome::Invalid(Invalid::TombstoneWithoutKey);
            }
            if let Some(wrong) = misplaced(self.partitions, rec, key) {
                return wrong;
            }
            return match boxes.remove_logged(key, version, lane_of_partition(rec.partition)) {
                Some(_) => Outcome::Deleted { version },
                None => Outcome::NoBox,
            };
        };
        let keys = if rec.key.is_some() {
            KeySource::Path
        } else {
            KeySource::Body
        };
        let outcome = match self
            .projector
            .project(self.arena.bump(), value, BodyFormat::Json, keys)
        {
            Err(BodyError::NotObjectOrArray) => Outcome::Invalid(Invalid::NotOneMessage),
            Err(e) => Outcome::Invalid(Invalid::Body(e)),
            Ok(batch) if batch.shape != Shape::Object => Outcome::Invalid(Invalid::NotOneMessage),
            Ok(batch) => match batch.items.first() {
                Some(Ok(m)) => {
                    if rec.key.is_none() {
                        key.extend_from_slice(m.key.as_bytes());
                    }
                    // The key was checked as UTF-8 above or came from the scanner.
                    let k = std::str::from_utf8(key).unwrap_or_default();
                    match misplaced(self.partitions, rec, key) {
                        Some(wrong) => wrong,
                        None => apply_values(boxes, k, m.values, version, rec),
                    }
                }
                Some(Err(e)) => Outcome::Invalid(Invalid::Message(*e)),
                None => Outcome::Invalid(Invalid::NotOneMessage),
            },
        };
        // The record's values are no longer borrowed: empty the arena for
        // the next one (a reset keeps its chunk: a few stores).
        self.arena.reset();
        outcome
    }
}

impl Replica {
    /// [`Replica::apply`] for a keyed record whose message was projected
    /// already: `values` as the projection of `rec.value` gives them (a
    /// write-ahead file's record, projected by the worker that accepted it).
    /// The same outcome, without parsing the message again.
    pub fn apply_projected(
        &mut self,
        boxes: &BoxTable,
        rec: &Record<'_>,
        values: &[Option<Value<'_>>],
        key: &mut Vec<u8>,
        watchers: &mut impl Watchers,
    ) -> Outcome {
        let (Some(k), Some(_), false) = (rec.key, rec.value, rec.offset < 0) else {
            return self.apply(boxes, rec, key, watchers);
        };
        key.clear();
        key.extend_from_slice(k);
        let version = self
            .bases
            .version(rec.partition, rec.offset, rec.headers.version);
        let outcome = match (std::str::from_utf8(k), misplaced(self.partitions, rec, k)) {
            (Err(_), _) => Outcome::Invalid(Invalid::KeyNotUtf8),
            (Ok(_), Some(wrong)) => wrong,
            (Ok(k), None) => apply_values(boxes, k, values, version, rec),
        };
        told(boxes, rec.partition, version, key, watchers, outcome)
    }
}

/// After a record of `partition` at `version`: the box's waiters woken if it
/// changed, and the partition's lane applied through the record
/// (docs/boxes.md#watermarks).
fn told(
    boxes: &BoxTable,
    partition: i32,
    version: u64,
    key: &[u8],
    watchers: &mut impl Watchers,
    outcome: Outcome,
) -> Outcome {
    if outcome.changed_box() {
        watchers.box_updated(key);
    }
    boxes
        .lanes()
        .publish_at(lane_of_partition(partition), version);
    outcome
}

/// Apply a message's projected `values` to box `k` at `version`, with the
/// record's timestamp (expiry counts in the table's clock, which is the
/// wall clock on a node of a log).
fn apply_values(
    boxes: &BoxTable,
    k: &str,
    values: &[Option<Value<'_>>],
    version: u64,
    rec: &Record<'_>,
) -> Outcome {
    let now_ms = u64::try_from(rec.timestamp_ms).unwrap_or(0);
    let at = (version, lane_of_partition(rec.partition));
    match boxes.apply_logged(k, values, at, now_ms, None) {
        Ok(Logged::Applied(version)) => Outcome::Applied { version },
        Ok(Logged::Replayed) => Outcome::Replayed,
        Err(e) => Outcome::Invalid(Invalid::Message(e)),
    }
}

/// Where a node stands in the log: the next offset to read in each partition
/// (what a snapshot holds with the boxes, so a restart replays from there).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub topic: String,
    /// Partition → the next offset to read.
    pub next: BTreeMap<i32, i64>,
    /// Partition → its versions' base at that offset, where not 0 (a
    /// migrated topic's: [`Bases`]).
    pub base: BTreeMap<i32, u64>,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.topic)?;
        let mut sep = " ";
        for (p, o) in &self.next {
            write!(f, "{sep}{p}@{o}")?;
            if let Some(b) = self.base.get(p) {
                write!(f, "+{b}")?;
            }
            sep = ", ";
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica() -> (Replica, BoxTable) {
        let plan = Arc::new(Plan::default_plan());
        (Replica::new(plan.clone(), 1 << 20, 1), BoxTable::new(plan))
    }

    /// A record in `partition` of a topic of several.
    fn rec_in<'a>(partition: i32, offset: i64, key: &'a str, value: Option<&'a str>) -> Record<'a> {
        Record {
            partition,
            ..rec(offset, Some(key), value)
        }
    }

    #[test]
    fn murmur2_is_kafkas() {
        // The vectors of Kafka's own UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (data, want) in cases {
            assert_eq!(murmur2(data), want, "{:?}", String::from_utf8_lossy(data));
        }
        // Positive, and within the count.
        for k in 0..1000 {
            let p = home_partition(format!("key-{k}").as_bytes(), 7);
            assert!((0..7).contains(&p));
        }
        assert_eq!(home_partition(b"anything", 1), 0);
    }

    #[test]
    fn a_record_outside_its_home_partition_is_applied_by_no_node() {
        let plan = Arc::new(Plan::default_plan());
        let mut r = Replica::new(plan.clone(), 1 << 20, 4);
        let t = BoxTable::new(plan);
        let mut key = Vec::new();
        let home = home_partition(b"k", 4);
        let away = (home + 1) % 4;
        let out = r.apply(
            &t,
            &rec_in(away, 0, "k", Some(r#"{"value":1}"#)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::WrongPartition { home });
        assert_eq!(
            out.report(),
            Report::Failed,
            "its ingest is not answered 2xx"
        );
        assert!(!out.changed_box());
        assert_eq!(key, b"k", "the key is still named, for the log line");
        assert!(t.is_empty());
        // In its home it applies; a tombstone elsewhere deletes nothing.
        let out = r.apply(
            &t,
            &rec_in(home, 7, "k", Some(r#"{"value":2}"#)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: 8 });
        let out = r.apply(&t, &rec_in(away, 9, "k", None), &mut key, &mut ());
        assert_eq!(out, Outcome::WrongPartition { home });
        assert_eq!(t.version(b"k"), Some(8));
        // A record without a key is placed by its body's key.
        let keyless = Record {
            partition: away,
            ..rec(10, None, Some(r#"{"key":"k","value":3}"#))
        };
        assert_eq!(
            r.apply(&t, &keyless, &mut key, &mut ()),
            Outcome::WrongPartition { home }
        );
        assert_eq!(payload(&t, "k"), r#"{"k":"k","ver":8,"v":2,"sum":2,"n":1}"#);
    }

    #[test]
    fn nodes_agree_whatever_order_the_partitions_interleave_in() {
        // Two partitions, each holding records of the same keys (a producer
        // on murmur2 and one on another partitioner). A node reads them in
        // some interleaving; a replay from nothing in another: both end with
        // the same bytes, because only each key's home partition counts.
        let plan = Arc::new(Plan::default_plan());
        let keys = ["a", "b", "c", "d", "e", "f"];
        let parts: Vec<Vec<Record<'_>>> = (0..2)
            .map(|p| {
                keys.iter()
                    .cycle()
                    .take(24)
                    .enumerate()
                    .map(|(o, k)| rec_in(p, o as i64, k, Some(r#"{"value":1}"#)))
                    .collect()
            })
            .collect();
        let mut seen = Vec::new();
        for pattern in [0b0101_0101u32, 0b0000_1111, 0b1111_0000, 0b0110_1001] {
            let mut r = Replica::new(plan.clone(), 1 << 20, 2);
            let t = BoxTable::new(plan.clone());
            let (mut i, mut j, mut step) = (0, 0, 0);
            let mut key = Vec::new();
            while i < parts[0].len() || j < parts[1].len() {
                let first = (pattern >> (step % 8)) & 1 == 0;
                if (first && i < parts[0].len()) || j >= parts[1].len() {
                    r.apply(&t, &parts[0][i], &mut key, &mut ());
                    i += 1;
                } else {
                    r.apply(&t, &parts[1][j], &mut key, &mut ());
                    j += 1;
                }
                step += 1;
            }
            let all: Vec<String> = keys.iter().map(|k| payload(&t, k)).collect();
            seen.push(all);
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:#?}");
    }

    #[test]
    fn a_projected_record_applies_as_its_bytes_do() {
        let plan = Arc::new(Plan::default_plan());
        let (mut by_bytes, t1) = replica();
        let (mut projected, t2) = replica();
        let mut projector = Projector::new(plan);
        let arena = Arena::new(1 << 16, 1 << 20);
        let mut key = Vec::new();
        let messages = [
            r#"{"value":1}"#,
            r#"{"value":5,"other":"x"}"#,
            r#"{"value":-3}"#,
        ];
        for (o, m) in messages.into_iter().enumerate() {
            let r = rec(o as i64, Some("k"), Some(m));
            let batch = projector
                .project(
                    arena.bump(),
                    m.as_bytes(),
                    BodyFormat::Json,
                    KeySource::Path,
                )
                .expect("projects");
            let Some(Ok(values)) = batch.items.first() else {
                panic!("{m} is a message");
            };
            let a = by_bytes.apply(&t1, &r, &mut key, &mut ());
            let b = projected.apply_projected(&t2, &r, values.values, &mut key, &mut ());
            assert_eq!(a, b, "{m}");
            assert_eq!(key, b"k");
            assert_eq!(payload(&t1, "k"), payload(&t2, "k"), "{m}");
        }
        // A tombstone has nothing projected: it takes the record's path.
        let r = rec(9, Some("k"), None);
        assert_eq!(
            projected.apply_projected(&t2, &r, &[], &mut key, &mut ()),
            Outcome::Deleted { version: 10 }
        );
    }

    #[test]
    fn only_what_was_applied_here_is_reported_taken() {
        assert_eq!(Outcome::Applied { version: 1 }.report(), Report::Applied);
        assert_eq!(Outcome::Deleted { version: 1 }.report(), Report::Applied);
        assert_eq!(Outcome::NoBox.report(), Report::NoBox);
        assert_eq!(Outcome::Replayed.report(), Report::Failed);
        assert_eq!(
            Outcome::Invalid(Invalid::NotOneMessage).report(),
            Report::Failed
        );
    }

    fn rec<'a>(offset: i64, key: Option<&'a str>, value: Option<&'a str>) -> Record<'a> {
        Record {
            partition: 0,
            offset,
            timestamp_ms: 1_764_000_000_000,
            key: key.map(str::as_bytes),
            value: value.map(str::as_bytes),
            headers: Headers::default(),
        }
    }

    fn payload(t: &BoxTable, key: &str) -> String {
        let mut out = Vec::new();
        t.poll(key.as_bytes(), &mut out).expect("box exists");
        String::from_utf8(out).unwrap()
    }

    /// The keys whose waiters were woken, in order.
    #[derive(Default)]
    struct Woken(Vec<Vec<u8>>);

    impl Watchers for Woken {
        fn box_updated(&mut self, key: &[u8]) {
            self.0.push(key.to_vec());
        }
    }

    #[test]
    fn a_record_that_changes_its_box_wakes_its_waiters_once_as_an_ingest_does() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let mut woken = Woken::default();
        let a = rec(3, Some("a"), Some(r#"{"value":1}"#));
        assert_eq!(
            r.apply(&t, &a, &mut key, &mut woken),
            Outcome::Applied { version: 4 }
        );
        assert_eq!(r.apply(&t, &a, &mut key, &mut woken), Outcome::Replayed);
        assert_eq!(
            r.apply(&t, &rec(4, Some("b"), None), &mut key, &mut woken),
            Outcome::NoBox
        );
        assert_eq!(
            r.apply(&t, &rec(5, Some("a"), None), &mut key, &mut woken),
            Outcome::Deleted { version: 6 }
        );
        assert_eq!(woken.0, [b"a".to_vec(), b"a".to_vec()], "applied, deleted");
    }

    #[test]
    fn a_record_is_a_message_and_its_offset_the_version() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let body = r#"{"value":5,"player":"p-7","cargo":[1,2]}"#;
        let out = r.apply(&t, &rec(41, Some("box-42"), Some(body)), &mut key, &mut ());
        assert_eq!(out, Outcome::Applied { version: 42 });
        assert_eq!(key, b"box-42");
        assert_eq!(
            payload(&t, "box-42"),
            r#"{"k":"box-42","ver":42,"v":5,"sum":5,"n":1,"by":"p-7"}"#
        );
    }

    #[test]
    fn without_a_record_key_the_key_field_names_the_box() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let out = r.apply(
            &t,
            &rec(0, None, Some(r#"{"key":"a","value":2}"#)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: 1 });
        assert_eq!(key, b"a");
        // A record key wins over the body's key field.
        let out = r.apply(
            &t,
            &rec(1, Some("b"), Some(r#"{"key":"a","value":3}"#)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: 2 });
        assert_eq!(key, b"b");
        assert_eq!(t.version(b"a"), Some(1));
    }

    #[test]
    fn invalid_records_are_reported_and_change_nothing() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let plan = Plan::default_plan();
        let cases = [
            (rec(0, Some("k"), Some("{\"value\":")), "invalid json"),
            (
                rec(1, Some("k"), Some("[{\"value\":1}]")),
                "one JSON object",
            ),
            (rec(2, Some("k"), Some("{\"value\":\"x\"}")), "integer"),
            (rec(3, None, Some("{\"value\":1}")), "key"),
            (rec(4, None, None), "tombstone"),
            (rec(-1, Some("k"), Some("{}")), "negative"),
        ];
        for (record, why) in cases {
            match r.apply(&t, &record, &mut key, &mut ()) {
                Outcome::Invalid(e) => {
                    let said = e.describe(&plan);
                    assert!(said.contains(why), "{said:?} should say {why:?}");
                }
                other => panic!("{record:?}: {other:?}"),
            }
        }
        assert!(t.is_empty());
        // The next valid record applies.
        let out = r.apply(
            &t,
            &rec(5, Some("k"), Some("{\"value\":1}")),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: 6 });
    }

    #[test]
    fn a_record_key_that_is_not_utf8_is_invalid() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let bad = Record {
            key: Some(&[0xff, 0xfe]),
            ..rec(0, None, Some("{}"))
        };
        assert_eq!(
            r.apply(&t, &bad, &mut key, &mut ()),
            Outcome::Invalid(Invalid::KeyNotUtf8)
        );
    }

    #[test]
    fn tombstones_delete_and_replays_are_harmless() {
        let (mut r, t) = replica();
        let mut key = Vec::new();
        let log = [
            rec(0, Some("x"), Some(r#"{"value":1}"#)),
            rec(1, Some("x"), Some(r#"{"value":2}"#)),
            rec(2, Some("x"), None),
            rec(3, Some("x"), Some(r#"{"value":7}"#)),
        ];
        let outcomes: Vec<_> = log
            .iter()
            .map(|x| r.apply(&t, x, &mut key, &mut ()))
            .collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Applied { version: 1 },
                Outcome::Applied { version: 2 },
                Outcome::Deleted { version: 3 },
                Outcome::Applied { version: 4 },
            ]
        );
        assert_eq!(payload(&t, "x"), r#"{"k":"x","ver":4,"v":7,"sum":7,"n":1}"#);
        // The whole log again (a node restarted from a snapshot taken after
        // the last record, with offsets from before the first): no change.
        let outcomes: Vec<_> = log
            .iter()
            .map(|x| r.apply(&t, x, &mut key, &mut ()))
            .collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Replayed,
                Outcome::Replayed,
                Outcome::NoBox,
                Outcome::Replayed
            ]
        );
        assert_eq!(payload(&t, "x"), r#"{"k":"x","ver":4,"v":7,"sum":7,"n":1}"#);
    }

    #[test]
    fn a_position_reads_as_partitions_at_offsets() {
        let p = Position {
            topic: "t".into(),
            next: [(0, 5), (1, 0)].into_iter().collect(),
            base: [(0, 9)].into_iter().collect(),
        };
        assert_eq!(p.to_string(), "t 0@5+9, 1@0");
    }
}
