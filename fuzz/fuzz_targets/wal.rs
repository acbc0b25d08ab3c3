//! Fuzz target `wal`: any bytes read as a segment of the write-ahead file.
//!
//! Properties:
//! - nothing panics, whatever the bytes;
//! - the records read are exactly what the decoder gives record by record,
//!   with growing sequence numbers, and each encodes back to the bytes it was
//!   read from (the codec is its own model: what it reads it would write);
//! - where reading stops is a record boundary inside the input, and a tail
//!   called torn has no whole record after it (with a plausible timestamp:
//!   what a crash can leave);
//! - the input cut at any record boundary reads as the same records up to
//!   there, without damage.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollbox_core::wal::{decode, encode, read_segment, PLAUSIBLE_MS, SEGMENT_MAGIC};

fuzz_target!(|data: &[u8]| {
    // Half the inputs get the magic, so the records behind it are reached.
    let mut bytes = Vec::with_capacity(data.len() + 8);
    if data.first().is_some_and(|b| b & 1 == 0) {
        bytes.extend_from_slice(SEGMENT_MAGIC);
        bytes.extend_from_slice(&data[1..]);
    } else {
        bytes.extend_from_slice(data);
    }
    let mut records = Vec::new();
    let (last, damage) = read_segment(&bytes, 0, |r| {
        let mut again = Vec::new();
        encode(r, &mut again);
        records.push((r.seq, again));
    });
    let mut at = SEGMENT_MAGIC.len();
    let mut prev = 0;
    let mut ends = vec![at];
    for (seq, again) in &records {
        assert!(*seq > prev, "sequence numbers grow");
        prev = *seq;
        assert_eq!(&bytes[at..at + again.len()], &again[..], "re-encodes to its bytes");
        let (back, n) = decode(&bytes[at..]).unwrap().unwrap();
        assert_eq!(back.seq, *seq);
        assert_eq!(n, again.len());
        at += n;
        ends.push(at);
    }
    assert_eq!(last, prev);
    match damage {
        None => assert_eq!(at, bytes.len(), "clean: every byte is a record"),
        Some(d) => {
            if d.offset > 0 {
                assert_eq!(d.offset as usize, at, "stops at a record boundary");
            }
            if d.torn && d.offset > 0 {
                for from in at + 1..bytes.len() {
                    assert!(
                        !matches!(decode(&bytes[from..]), Ok(Some((r, _)))
                            if r.seq > last && PLAUSIBLE_MS.contains(&(r.timestamp_ms as u64))),
                        "a torn tail has no whole record after it (one at {from})"
                    );
                }
            }
        }
    }
    if !bytes.starts_with(SEGMENT_MAGIC) {
        // Not a segment: refused at offset 0, and nothing was read.
        assert!(records.is_empty() && damage.is_some_and(|d| d.offset == 0));
        return;
    }
    for &end in &ends {
        let mut n = 0;
        let (_, d) = read_segment(&bytes[..end], 0, |_| n += 1);
        assert!(d.is_none(), "a cut at a boundary reads clean");
        assert_eq!(n, ends.iter().filter(|&&e| e <= end).count() - 1);
    }
});
