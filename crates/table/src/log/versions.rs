//! Versions past a topic's offsets: how a topic begun from a standalone
//! node's write-ahead file (`pollbox migrate`, docs/operations.md#from-one-node-to-a-log)
//! keeps every version that node served.
//!
//! A box's version on a node of a log is its record's `offset + 1`
//! ([`version_of`]) plus its partition's **base**, which is 0 on every topic
//! but a migrated one. A standalone node's versions are sequence numbers past
//! the wall clock in microseconds, far above any offset, so a migration
//! produces each record of the file with the version it was served at
//! (the header [`VERSION_HEADER`]), and a record that names a version above
//! what its offset gives raises its partition's base to give it exactly that.
//! Every later record of the partition then goes on from there: versions
//! never go back, and every node, live or replaying, computes the same ones
//! (a base only moves at a record, in partition order; a snapshot stores it
//! with the partition's next offset).
//!
//! A record with no key and no value that names a version is a **marker**:
//! it only moves the base (the migration's last record in each partition,
//! past every version the standalone node served or removed). A record with
//! the header [`BEGIN_HEADER`] is where a migrated topic begins: the boxes
//! before it are in the snapshot the migration wrote, so a node that reads it
//! (one that started without that snapshot) stops applying and says so.

use super::version_of;
use std::collections::BTreeMap;

/// The header naming the version a record was served at before it came to
/// the log (a big-endian u64 in 8 bytes, or its decimal digits).
pub const VERSION_HEADER: &str = "pollbox-version";
/// The header of the record a migrated topic begins with, in each partition;
/// its value says which snapshot holds the boxes before it.
pub const BEGIN_HEADER: &str = "pollbox-begin";

/// What a record's pollbox headers say: nothing, for every record but a
/// migration's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Headers {
    /// The version the record names for itself ([`VERSION_HEADER`]).
    pub version: Option<u64>,
    /// The record a migrated topic begins with ([`BEGIN_HEADER`]).
    pub begin: bool,
}

impl Headers {
    /// Read one header: `name` and its value. Unknown names and values that
    /// are not a version are left alone (a record stays what any producer
    /// may write).
    pub fn read(&mut self, name: &str, value: Option<&[u8]>) {
        match name {
            VERSION_HEADER => self.version = value.and_then(parse_version),
            BEGIN_HEADER => self.begin = true,
            _ => {}
        }
    }
}

/// A version header's value: 8 bytes big endian (what `pollbox migrate`
/// writes), or decimal digits (what a person writes with kcat).
pub fn parse_version(v: &[u8]) -> Option<u64> {
    if let Ok(b) = <[u8; 8]>::try_from(v) {
        if !b.iter().all(u8::is_ascii_digit) {
            return Some(u64::from_be_bytes(b));
        }
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Each partition's base: what its versions are past its offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bases(Vec<u64>);

impl Bases {
    /// The bases a snapshot holds (partitions not named are at 0).
    pub fn from_map(bases: &BTreeMap<i32, u64>) -> Bases {
        let mut b = Bases::default();
        for (&p, &base) in bases {
            if let Some(s) = usize::try_from(p).ok().and_then(|i| b.slot(i)) {
                *s = base;
            }
        }
        b
    }

    /// Partition `p`'s base.
    #[inline]
    pub fn get(&self, p: i32) -> u64 {
        usize::try_from(p)
            .ok()
            .and_then(|i| self.0.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// The version of the record at `offset` of partition `p` that names
    /// `named`: its offset's version plus the base, the base first raised so
    /// that a named version above that is given exactly (never lowered: a
    /// named version at or below it changes nothing).
    #[inline]
    pub fn version(&mut self, p: i32, offset: i64, named: Option<u64>) -> u64 {
        let at = version_of(offset);
        let Some(named) = named else {
            return self.get(p).saturating_add(at);
        };
        let Some(slot) = usize::try_from(p).ok().and_then(|i| self.slot(i)) else {
            return at;
        };
        *slot = (*slot).max(named.saturating_sub(at));
        slot.saturating_add(at)
    }

    /// The slot of partition `i`, grown to hold it (a topic has at most a
    /// few thousand partitions; an index past a million is refused).
    fn slot(&mut self, i: usize) -> Option<&mut u64> {
        if i >= 1 << 20 {
            return None;
        }
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0.get_mut(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_version_raises_the_base_and_later_records_go_on_from_it() {
        let mut b = Bases::default();
        assert_eq!(b.version(0, 0, None), 1, "no base: the offset's version");
        // A migrated record at offset 1 served at version 1,000.
        assert_eq!(b.version(0, 1, Some(1_000)), 1_000);
        assert_eq!(b.get(0), 998);
        // The next record without a name goes on past it.
        assert_eq!(b.version(0, 2, None), 1_001);
        // A named version below what the offset gives changes nothing.
        assert_eq!(b.version(0, 3, Some(5)), 1_002);
        // Other partitions keep their own base.
        assert_eq!(b.version(1, 3, None), 4);
        assert_eq!(b.version(3, 0, Some(50)), 50);
        assert_eq!(b.get(2), 0);
        // A snapshot's bases give the same versions.
        let kept: BTreeMap<i32, u64> = [(0, 998), (3, 49)].into();
        let mut again = Bases::from_map(&kept);
        assert_eq!(again.version(0, 4, None), 1_003);
        assert_eq!(again.version(3, 1, None), 51);
    }

    #[test]
    fn version_headers_read_as_big_endian_bytes_or_digits() {
        assert_eq!(parse_version(&7u64.to_be_bytes()), Some(7));
        assert_eq!(
            parse_version(b"1764000000000123"),
            Some(1_764_000_000_000_123)
        );
        assert_eq!(parse_version(b"12345678"), Some(12_345_678), "8 digits");
        assert_eq!(parse_version(b"x"), None);
        let mut h = Headers::default();
        h.read("other", Some(b"1"));
        assert_eq!(h, Headers::default());
        h.read(VERSION_HEADER, Some(b"42"));
        h.read(BEGIN_HEADER, None);
        assert_eq!(
            h,
            Headers {
                version: Some(42),
                begin: true
            }
        );
    }

    #[test]
    fn a_migrated_partition_applies_at_the_versions_served_and_goes_on_past_its_marker() {
        use crate::boxes::BoxTable;
        use crate::log::{Outcome, Record, Replica};
        use crate::plan::Plan;
        use std::sync::Arc;
        let plan = Arc::new(Plan::default_plan());
        let t = BoxTable::new(plan.clone());
        let mut r = Replica::new(plan, 1 << 20, 1);
        let mut key = Vec::new();
        let rec = |offset, key: Option<&'static str>, value: Option<&'static str>, h| Record {
            partition: 0,
            offset,
            timestamp_ms: 1_764_000_000_000,
            key: key.map(str::as_bytes),
            value: value.map(str::as_bytes),
            headers: h,
        };
        let named = |v| Headers {
            version: Some(v),
            begin: false,
        };
        let begin = Headers {
            version: None,
            begin: true,
        };
        // A node that reads where the topic begins did not start from the
        // migration's snapshot.
        assert_eq!(
            r.apply(&t, &rec(0, None, None, begin), &mut key, &mut ()),
            Outcome::Begin
        );
        let v = 1_764_000_000_000_100;
        let out = r.apply(
            &t,
            &rec(1, Some("a"), Some(r#"{"value":1}"#), named(v)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: v });
        let out = r.apply(
            &t,
            &rec(2, Some("a"), None, named(v + 7)),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Deleted { version: v + 7 });
        // The marker: past every version served, no box touched.
        let out = r.apply(&t, &rec(3, None, None, named(v + 100)), &mut key, &mut ());
        assert_eq!(out, Outcome::Marker { version: v + 100 });
        assert!(t.is_empty());
        assert_eq!(r.base(0), v + 100 - 4);
        // What any producer writes next goes on from there.
        let out = r.apply(
            &t,
            &rec(4, Some("a"), Some(r#"{"value":2}"#), Headers::default()),
            &mut key,
            &mut (),
        );
        assert_eq!(out, Outcome::Applied { version: v + 101 });
        assert_eq!(t.version(b"a"), Some(v + 101));
    }

    #[test]
    fn a_partition_index_out_of_range_is_never_grown() {
        let mut b = Bases::default();
        assert_eq!(b.version(-1, 4, Some(100)), 5);
        assert_eq!(b.version(1 << 21, 4, Some(100)), 5);
        assert_eq!(b.0.len(), 0);
    }
}
