//! The codec: round trips, a torn tail at every cut, damage in the middle.

use super::*;

fn rec(seq: u64, key: &str, value: Option<&str>) -> WalRecord<'static> {
    let key: &'static str = Box::leak(key.to_string().into_boxed_str());
    let value = value.map(|v| &*Box::leak(v.to_string().into_boxed_str()));
    WalRecord {
        seq,
        timestamp_ms: 1_764_000_000_000 + (seq % 1000) as i64,
        key: key.as_bytes(),
        value: value.map(str::as_bytes),
    }
}

fn segment(records: &[WalRecord<'_>]) -> Vec<u8> {
    let mut out = SEGMENT_MAGIC.to_vec();
    for r in records {
        encode(r, &mut out);
    }
    out
}

fn three() -> Vec<WalRecord<'static>> {
    vec![
        rec(7, "box-1", Some(r#"{"value":1}"#)),
        rec(8, "box-2", None),
        rec(12, "", Some("")),
    ]
}

/// A record read back: its sequence number, key and value.
type Read = (u64, Vec<u8>, Option<Vec<u8>>);

fn read_all(bytes: &[u8]) -> (Vec<Read>, Option<Damaged>) {
    let mut seen = Vec::new();
    let (_, damage) = read_segment(bytes, 0, |r| {
        seen.push((r.seq, r.key.to_vec(), r.value.map(<[u8]>::to_vec)))
    });
    (seen, damage)
}

#[test]
fn records_round_trip_with_their_fields() {
    let recs = three();
    let bytes = segment(&recs);
    let mut at = SEGMENT_MAGIC.len();
    for r in &recs {
        let (back, n) = decode(&bytes[at..]).unwrap().unwrap();
        assert_eq!(&back, r);
        assert_eq!(n, r.encoded_len());
        at += n;
    }
    assert_eq!(decode(&bytes[at..]), Ok(None));
    let (seen, damage) = read_all(&bytes);
    assert_eq!(seen.len(), 3);
    assert_eq!(damage, None);
    assert_eq!(read_segment(&bytes, 0, |_| {}).0, 12);
}

#[test]
fn every_truncation_point_is_a_torn_tail_after_the_whole_records() {
    let recs = three();
    let bytes = segment(&recs);
    let ends: Vec<usize> = recs
        .iter()
        .scan(SEGMENT_MAGIC.len(), |at, r| {
            *at += r.encoded_len();
            Some(*at)
        })
        .collect();
    for cut in 0..bytes.len() {
        let (seen, damage) = read_all(&bytes[..cut]);
        let whole = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(seen.len(), whole, "cut at {cut}");
        let at_boundary = cut == SEGMENT_MAGIC.len() || ends.contains(&cut);
        if at_boundary {
            assert_eq!(damage, None, "cut at {cut}");
        } else {
            let d = damage.unwrap_or_else(|| panic!("cut at {cut} must be seen"));
            assert!(d.torn, "cut at {cut}: {d:?}");
            let start = if cut < SEGMENT_MAGIC.len() {
                0
            } else {
                *ends.iter().rfind(|&&e| e <= cut).unwrap_or(&8) as u64
            };
            assert_eq!(d.offset, start, "cut at {cut}");
        }
    }
}

#[test]
fn a_damaged_last_record_or_a_zero_filled_tail_is_torn() {
    let recs = three();
    let mut bytes = segment(&recs);
    let last_at = bytes.len() - recs[2].encoded_len();
    let n = bytes.len();
    bytes[n - 1] ^= 0x40;
    let (seen, d) = read_all(&bytes);
    assert_eq!(seen.len(), 2);
    let d = d.unwrap();
    assert!(d.torn);
    assert_eq!(d.offset, last_at as u64);
    // Zeros where the last record was (a page the crash did not write).
    let mut zeroed = segment(&recs);
    for b in &mut zeroed[last_at..] {
        *b = 0;
    }
    zeroed.extend_from_slice(&[0; 100]);
    let (seen, d) = read_all(&zeroed);
    assert_eq!(seen.len(), 2);
    assert!(d.unwrap().torn);
}

#[test]
fn damage_before_the_end_is_not_torn_and_says_where() {
    let recs = three();
    let clean = segment(&recs);
    let second = SEGMENT_MAGIC.len() + recs[0].encoded_len();
    // Every byte of the first two records, flipped in turn.
    for i in SEGMENT_MAGIC.len()..second + recs[1].encoded_len() {
        let mut bytes = clean.clone();
        bytes[i] ^= 0x01;
        let (seen, d) = read_all(&bytes);
        let d = d.unwrap_or_else(|| panic!("flip at {i} must be seen"));
        assert!(!d.torn, "flip at {i}: {d:?}");
        let at = if i < second {
            SEGMENT_MAGIC.len()
        } else {
            second
        };
        assert_eq!(d.offset, at as u64, "flip at {i}");
        assert_eq!(seen.len(), usize::from(i >= second), "flip at {i}");
    }
    let mut bad = clean.clone();
    bad[0] = b'X';
    let (_, d) = read_all(&bad);
    assert_eq!(d.unwrap().damage, Damage::BadMagic);
}

#[test]
fn damage_is_told_from_a_tail_wherever_the_sequence_numbers_start() {
    // Sequence numbers past the wall clock in microseconds, as a node's
    // first records are: a damaged first record with records after it is
    // damage, not a torn tail.
    let base = 1_796_178_427_686_057;
    let recs = [
        rec(base, "a", Some("{}")),
        rec(base + 1, "b", None),
        rec(base + 2, "c", None),
    ];
    let mut bytes = segment(&recs);
    bytes[SEGMENT_MAGIC.len() + 4] ^= 0xff;
    let (seen, d) = read_all(&bytes);
    assert!(seen.is_empty());
    let d = d.unwrap();
    assert_eq!(
        (d.offset, d.damage, d.torn),
        (8, Damage::BadChecksum, false)
    );
    // Garbage after a damaged record is a tail still.
    let mut tail = segment(&recs[..1]);
    tail[SEGMENT_MAGIC.len() + 4] ^= 0xff;
    tail.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    assert!(read_all(&tail).1.unwrap().torn);
}

#[test]
fn sequence_numbers_must_grow() {
    let bytes = segment(&[rec(5, "a", None), rec(5, "b", None), rec(6, "c", None)]);
    let (seen, d) = read_all(&bytes);
    assert_eq!(seen.len(), 1);
    let d = d.unwrap();
    assert_eq!(d.damage, Damage::OutOfOrder);
    assert!(!d.torn);
    // A segment must start past the one before.
    let (last, d) = read_segment(&segment(&[rec(3, "a", None)]), 3, |_| {});
    assert_eq!((last, d.map(|d| d.damage)), (3, Some(Damage::OutOfOrder)));
}

#[test]
fn segment_names_sort_by_their_first_record() {
    assert_eq!(segment_name(12345), "00000000000000012345.log");
    assert_eq!(parse_segment_name("00000000000000012345.log"), Some(12345));
    assert_eq!(parse_segment_name(&segment_name(u64::MAX)), Some(u64::MAX));
    for bad in [
        "12345.log",
        "0000000000000001234x.log",
        "00000000000000012345.tmp",
    ] {
        assert_eq!(parse_segment_name(bad), None, "{bad}");
    }
}
