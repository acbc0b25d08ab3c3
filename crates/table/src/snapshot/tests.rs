//! The snapshot format's tests: round trips of every field type, of the
//! version floor, idle times and the log position, of a base and its deltas
//! (written while writers change the table); older formats still read; and
//! every truncation, flipped byte, other layout or box the configuration
//! refuses reported with its own error.
//!
//! What it is not: the tests of the files on disk (the server's
//! `snapshot_file`).

use std::sync::Arc;

use super::format::{layout, BOX_MARKER, END_MARKER, MAGIC};
use super::*;
use crate::boxes::{codec, BoxTable, RestoreError};
use crate::config::{FieldType, Reduce};
use crate::log::Position;
use crate::plan::{FieldPlan, Plan, Value};
use crate::render::FieldState;

fn field(name: &str, ty: FieldType, reduce: Reduce) -> FieldPlan {
    FieldPlan {
        name: name.into(),
        path: vec![name.into()],
        ty,
        reduce,
        max_len: if ty == FieldType::Str { 32 } else { 0 },
    }
}

fn every_type_plan() -> Plan {
    Plan {
        key_field: "key".into(),
        max_key_bytes: 128,
        max_payload_bytes: 256,
        max_boxes: 1000,
        ttl_s: 0,
        rooms: true,
        fields: vec![
            field("i", FieldType::I64, Reduce::Sum),
            field("f", FieldType::F64, Reduce::Max),
            field("b", FieldType::Bool, Reduce::Last),
            field("s", FieldType::Str, Reduce::Last),
            field("n", FieldType::I64, Reduce::Count),
        ],
    }
}

/// A table with `boxes` boxes plus one that never got a field, values
/// chosen per field type (some absent) so every tag is written.
fn sample(plan: Plan, boxes: usize) -> BoxTable {
    let t = BoxTable::new(Arc::new(plan));
    for k in 0..boxes {
        let key = format!("box-{k}-é");
        let s = format!("p\"{k}\n");
        for m in 0..(k % 3 + 1) {
            let values: Vec<_> = t
                .plan()
                .fields
                .iter()
                .enumerate()
                .map(|(i, f)| match f.ty {
                    FieldType::I64 => Some(Value::I64(k as i64 * 1000 - m as i64)),
                    FieldType::F64 => (m != 1).then_some(Value::F64(k as f64 / 7.0)),
                    FieldType::Bool => Some(Value::Bool((k + i) % 2 == 0)),
                    FieldType::Str => (k % 4 != 0).then_some(Value::Str(&s)),
                })
                .collect();
            t.apply(&key, &values, 0, None).expect("sample applies");
        }
    }
    t.apply("sparse", &[], 0, None).expect("ok");
    t
}

fn bytes_of(t: &BoxTable) -> Vec<u8> {
    let mut out = Vec::new();
    write_snapshot(t, 0, &mut out).expect("writes to a Vec");
    out
}

fn dump(t: &BoxTable) -> Vec<(String, u64, Vec<FieldState>, Vec<u8>)> {
    let mut all = Vec::new();
    t.for_each(0, |k, v, _, s| {
        all.push((k.to_string(), v, s.to_vec(), Vec::new()))
    });
    for entry in &mut all {
        t.poll(entry.0.as_bytes(), &mut entry.3).expect("present");
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

#[test]
fn round_trip_keeps_every_box_state_version_and_payload() {
    let t = sample(every_type_plan(), 50);
    let bytes = bytes_of(&t);
    let back = read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect("reads");
    assert_eq!(back.len(), 51);
    assert_eq!(dump(&back), dump(&t));
}

#[test]
fn the_version_floor_and_idle_times_survive_a_round_trip() {
    let mut plan = Plan::default_plan();
    plan.ttl_s = 100;
    let plan = Arc::new(plan);
    let t = BoxTable::new(plan.clone());
    for _ in 0..3 {
        t.apply("gone", &[], 0, None).expect("ok");
    }
    t.apply("kept", &[], 0, None).expect("ok");
    t.apply("fresh", &[], 40_000, None).expect("ok");
    assert_eq!(t.remove(b"gone"), Some(3));
    let mut bytes = Vec::new();
    write_snapshot(&t, 50_000, &mut bytes).expect("writes");
    // A restarted process: its clock starts again at 0.
    let back = read_snapshot(plan, 0, &mut bytes.as_slice()).expect("reads");
    assert_eq!(back.len(), 2, "only live boxes");
    assert_eq!(back.version_floor(), 3);
    assert_eq!(back.apply("gone", &[], 0, None), Ok(4));
    let mut idle = Vec::new();
    back.for_each(0, |k, _, i, _| idle.push((k.to_string(), i)));
    idle.sort();
    assert_eq!(
        idle,
        [
            ("fresh".into(), 10),
            ("gone".into(), 0),
            ("kept".into(), 50)
        ]
    );
}

/// The same table in format 2 (no version floor, no idle times).
fn format_2(t: &BoxTable) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&(t.plan().fields.len() as u32).to_le_bytes());
    for (name, ty, reduce) in layout(t.plan()) {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&[ty, reduce]);
    }
    let mut n = 0u64;
    t.for_each(0, |key, version, _, state| {
        out.push(BOX_MARKER);
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(&version.to_le_bytes());
        let mut st = Vec::new();
        for s in state {
            codec::encode(s.view(), &mut st);
        }
        out.extend_from_slice(&(st.len() as u32).to_le_bytes());
        out.extend_from_slice(&st);
        n += 1;
    });
    out.push(END_MARKER);
    out.extend_from_slice(&n.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn format_2_is_still_read() {
    let t = sample(every_type_plan(), 20);
    let back = read_snapshot(Arc::new(every_type_plan()), 0, &mut format_2(&t).as_slice())
        .expect("reads format 2");
    assert_eq!(dump(&back), dump(&t));
    assert_eq!(back.version_floor(), 0);
}

#[test]
fn the_log_position_survives_a_round_trip() {
    let t = sample(every_type_plan(), 20);
    let position = Position {
        topic: "scores".into(),
        next: [(0, 17), (1, 0), (7, 123_456_789_012)]
            .into_iter()
            .collect(),
        // A migrated topic's partitions run past their offsets.
        base: [(1, 1_764_000_000_000_000), (7, 3)].into_iter().collect(),
    };
    let mut bytes = Vec::new();
    write_snapshot_at(&t, 0, Some(&position), &mut bytes).expect("writes");
    let (back, read) =
        read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect("reads");
    assert_eq!(dump(&back), dump(&t));
    assert_eq!(read, Some(position));
    // A standalone node's snapshot holds none.
    let (_, read) = read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes_of(&t).as_slice())
        .expect("reads");
    assert_eq!(read, None);
}

#[test]
fn format_3_is_still_read() {
    // Format 3 is format 4 without the position (a standalone node's
    // format-4 file has an empty one: two zero bytes before the CRC).
    let t = sample(every_type_plan(), 20);
    let mut bytes = bytes_of(&t);
    bytes.truncate(bytes.len() - 4 - 2);
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    let (back, position) = read_snapshot_at(Arc::new(every_type_plan()), 0, &mut bytes.as_slice())
        .expect("reads format 3");
    assert_eq!(dump(&back), dump(&t));
    assert_eq!(position, None);
}

#[test]
fn a_damaged_log_position_is_refused() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let position = Position {
        topic: "t".into(),
        next: [(0, 1)].into_iter().collect(),
        base: Default::default(),
    };
    let mut bytes = Vec::new();
    write_snapshot_at(&t, 0, Some(&position), &mut bytes).expect("writes");
    // The offset of partition 0 made negative, the checksum made right.
    let at = bytes.len() - 4 - 1;
    bytes[at] = 0x80;
    let body = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
    let e = read_snapshot_at(Arc::new(Plan::default_plan()), 0, &mut bytes.as_slice())
        .expect_err("refused");
    assert!(e.to_string().contains("bad log position"), "{e}");
}

fn link(kind: Kind, seq: u32, wall_ms: u64) -> Link {
    Link {
        kind,
        chain: 42,
        seq,
        wall_ms,
    }
}

fn file(t: &BoxTable, l: Link) -> Vec<u8> {
    let mut out = Vec::new();
    write_link(t, 0, &l, None, &mut out).expect("writes to a Vec");
    out
}

/// Read a chain's files (oldest first in `files`) the way a restart does:
/// newest first into one table.
fn read_chain(plan: Plan, files: &[Vec<u8>]) -> BoxTable {
    let t = BoxTable::new(Arc::new(plan));
    let mut newer = Newer::default();
    let mut floor = 0;
    for f in files.iter().rev() {
        let read =
            read_link_into(&t, 0, Versions::Keep, &mut newer, &mut f.as_slice()).expect("reads");
        floor = floor.max(read.floor);
    }
    t.raise_version_floor(floor);
    t
}

#[test]
fn a_base_and_its_deltas_round_trip_with_removals_and_recreations() {
    let t = sample(every_type_plan(), 40);
    let base = file(&t, link(Kind::Base, 0, 0));
    let (_, l) = read_link(&mut base.as_slice()).expect("head");
    assert_eq!(l, link(Kind::Base, 0, 0));
    t.apply("box-1-é", &[None, None, None, None, None], 0, None)
        .expect("ok");
    t.remove("box-2-é".as_bytes()).expect("present");
    t.remove("box-3-é".as_bytes()).expect("present");
    t.apply("box-3-é", &[], 0, None).expect("created again");
    t.apply("new", &[], 0, None).expect("ok");
    let d1 = file(&t, link(Kind::Delta, 1, 0));
    assert!(d1.len() * 5 < base.len(), "{} of {}", d1.len(), base.len());
    t.remove(b"new").expect("present");
    t.remove("box-1-é".as_bytes()).expect("present");
    t.apply("box-1-é", &[], 0, None).expect("created again");
    let d2 = file(&t, link(Kind::Delta, 2, 0));
    // Nothing changed: an empty delta.
    let d3 = file(&t, link(Kind::Delta, 3, 0));
    let back = read_chain(every_type_plan(), &[base, d1, d2, d3]);
    assert_eq!(dump(&back), dump(&t));
    assert_eq!(back.version_floor(), t.version_floor());
}

#[test]
fn a_box_a_delta_does_not_hold_ages_by_the_time_since_its_file() {
    let mut plan = Plan::default_plan();
    plan.ttl_s = 1000;
    let t = BoxTable::new(Arc::new(plan.clone()));
    t.apply("old", &[], 0, None).expect("ok");
    let base = file(&t, link(Kind::Base, 0, 1_000));
    t.apply("new", &[], 0, None).expect("ok");
    let d1 = file(&t, link(Kind::Delta, 1, 61_000));
    let back = read_chain(plan, &[base, d1]);
    let mut idle = Vec::new();
    back.for_each(0, |k, _, i, _| idle.push((k.to_string(), i)));
    idle.sort();
    assert_eq!(idle, [("new".into(), 0), ("old".into(), 60)]);
}

/// Writers update, create and remove boxes while a base and deltas are
/// written: the chain read back is the table, once a last delta is
/// written with the writers stopped (a change made during a walk is in
/// that walk's file or in the next).
#[test]
fn no_change_made_during_a_walk_is_missed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = w + 1;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = format!("k{}", x % 3000);
                    if x % 11 == 0 {
                        t.remove(key.as_bytes());
                    } else {
                        let v = [Some(Value::I64((x % 1000) as i64)), None, None, None];
                        t.apply(&key, &v, 0, None).expect("ok");
                    }
                }
            })
        })
        .collect();
    while t.len() < 1000 {
        std::thread::yield_now();
    }
    let mut files = vec![file(&t, link(Kind::Base, 0, 0))];
    for seq in 1..30 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        files.push(file(&t, link(Kind::Delta, seq, 0)));
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    files.push(file(&t, link(Kind::Delta, 30, 0)));
    let back = read_chain(Plan::default_plan(), &files);
    assert!(back.len() > 1000);
    assert_eq!(dump(&back), dump(&t));
}

#[test]
fn every_truncation_or_flipped_byte_of_a_delta_is_refused() {
    let t = sample(every_type_plan(), 6);
    let base = file(&t, link(Kind::Base, 0, 0));
    t.remove("box-2-é".as_bytes()).expect("present");
    t.apply("box-1-é", &[], 0, None).expect("ok");
    let delta = file(&t, link(Kind::Delta, 1, 0));
    let read = |bytes: &[u8]| {
        let t = BoxTable::new(Arc::new(every_type_plan()));
        let mut newer = Newer::default();
        read_link_into(&t, 0, Versions::Keep, &mut newer, &mut &bytes[..])
            .and_then(|_| read_link_into(&t, 0, Versions::Keep, &mut newer, &mut base.as_slice()))
    };
    assert!(read(&delta).is_ok());
    for len in 0..delta.len() {
        assert!(read(&delta[..len]).is_err(), "length {len}");
    }
    for at in 0..delta.len() {
        let mut bad = delta.clone();
        bad[at] ^= 0x01;
        assert!(read(&bad).is_err(), "byte {at}");
    }
}

#[test]
fn empty_table_round_trips() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let bytes = bytes_of(&t);
    let back =
        read_snapshot(Arc::new(Plan::default_plan()), 0, &mut bytes.as_slice()).expect("reads");
    assert!(back.is_empty());
}

#[test]
fn every_truncation_is_refused_as_truncated() {
    let bytes = bytes_of(&sample(every_type_plan(), 6));
    for len in 0..bytes.len() {
        match read_snapshot(Arc::new(every_type_plan()), 0, &mut &bytes[..len]) {
            Err(e @ SnapshotError::Truncated { .. }) => {
                assert!(e.to_string().starts_with("snapshot is truncated"), "{e}")
            }
            Err(e) => panic!("length {len}: {e}"),
            Ok(_) => panic!("length {len} of {} was accepted", bytes.len()),
        }
    }
}

#[test]
fn every_flipped_byte_is_refused() {
    let bytes = bytes_of(&sample(every_type_plan(), 6));
    for at in 0..bytes.len() {
        for mask in [0x01u8, 0x80, 0xff] {
            let mut bad = bytes.clone();
            bad[at] ^= mask;
            if let Ok(t) = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()) {
                panic!("byte {at} ^ {mask:#x} was accepted ({} boxes)", t.len());
            }
        }
    }
}

#[test]
fn a_flipped_record_byte_says_checksum_mismatch() {
    let mut bytes = bytes_of(&sample(every_type_plan(), 6));
    // The last box ends with its count field (tag + one-byte varint: the
    // counts are small) just before the end marker, count, floor and CRC:
    // flipping a bit below its continuation bit is structurally fine, only
    // the CRC knows.
    let at = bytes.len() - 4 - 8 - 8 - 1 - 1;
    bytes[at] ^= 0x10;
    let e =
        read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect_err("refused");
    assert!(
        e.to_string().starts_with("snapshot checksum mismatch"),
        "{e}"
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = bytes_of(&sample(every_type_plan(), 2));
    bytes.push(0);
    let e =
        read_snapshot(Arc::new(every_type_plan()), 0, &mut bytes.as_slice()).expect_err("refused");
    assert!(
        matches!(
            e,
            SnapshotError::Corrupt {
                what: "bytes after the checksum",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn bad_magic_and_version_are_named() {
    let bytes = bytes_of(&sample(every_type_plan(), 1));
    let mut bad = bytes.clone();
    bad[0] = b'X';
    let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()).err();
    assert!(matches!(e, Some(SnapshotError::BadMagic)), "{e:?}");
    let mut bad = bytes.clone();
    bad[8] = 9;
    let e = read_snapshot(Arc::new(every_type_plan()), 0, &mut bad.as_slice()).err();
    assert!(
        matches!(e, Some(SnapshotError::UnsupportedVersion { found: 9 })),
        "{e:?}"
    );
}

#[test]
fn another_field_layout_is_refused_with_both_layouts_named() {
    let bytes = bytes_of(&sample(Plan::default_plan(), 3));
    let mut changes: Vec<Plan> = Vec::new();
    let mut p = Plan::default_plan();
    p.fields[1].reduce = Reduce::Max;
    changes.push(p);
    let mut p = Plan::default_plan();
    p.fields[3].name = "player".into();
    changes.push(p);
    let mut p = Plan::default_plan();
    p.fields.swap(0, 1);
    changes.push(p);
    let mut p = Plan::default_plan();
    p.fields.pop();
    changes.push(p);
    let mut p = Plan::default_plan();
    p.fields[0].ty = FieldType::F64;
    changes.push(p);
    for plan in changes {
        let e = read_snapshot(Arc::new(plan), 0, &mut bytes.as_slice()).expect_err("refused");
        let msg = e.to_string();
        assert!(matches!(e, SnapshotError::LayoutMismatch { .. }), "{msg}");
        assert!(
            msg.contains("snapshot has [v:i64/last, sum:i64/sum, n:count, by:str/last]"),
            "{msg}"
        );
    }
    // max_len, paths and limits are not part of the layout.
    let mut p = Plan::default_plan();
    p.fields[3].max_len = 64;
    p.fields[0].path = vec!["other".into()];
    assert_eq!(
        read_snapshot(Arc::new(p), 0, &mut bytes.as_slice())
            .expect("same layout")
            .len(),
        4
    );
}

#[test]
fn boxes_the_config_refuses_are_reported() {
    let bytes = bytes_of(&sample(Plan::default_plan(), 3));
    let mut p = Plan::default_plan();
    p.max_boxes = 2;
    let e = read_snapshot(Arc::new(p), 0, &mut bytes.as_slice()).expect_err("refused");
    assert!(
        matches!(
            e,
            SnapshotError::BoxRefused {
                reason: RestoreError::TooManyBoxes { max: 2 },
                ..
            }
        ),
        "{e}"
    );
    let mut p = Plan::default_plan();
    p.max_payload_bytes = 20;
    let e = read_snapshot(Arc::new(p), 0, &mut bytes.as_slice()).expect_err("refused");
    assert!(
        e.to_string()
            .contains("payload over max_payload_bytes (20)"),
        "{e}"
    );
}
