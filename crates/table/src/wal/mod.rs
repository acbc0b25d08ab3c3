//! The write-ahead file's format (docs/operations.md#the-write-ahead-file):
//! segments of records, each record one message or one delete, as a record
//! of a log topic holds it (the box key as the record key, the message's JSON
//! bytes as the value, no value a delete, a timestamp), with its sequence
//! number (the version the box gets: the record's position, as a log's
//! offset + 1) and a checksum.
//!
//! A segment is [`SEGMENT_MAGIC`] followed by records; its file is named by
//! the sequence number of its first record ([`segment_name`]). A record:
//!
//! ```text
//! len u32 | crc u32 | seq u64 | timestamp_ms i64 | key_len u32 | key | value_len i32 | value
//! ```
//!
//! little endian; `len` counts the bytes after it, `crc` is the CRC-32
//! (IEEE, as the snapshot's) of the bytes after it, `value_len` -1 is a
//! tombstone.
//!
//! What it is not: the file's I/O (the server's `wal` module writes, syncs,
//! reads and cuts the files); this module encodes and decodes bytes, and
//! says where a segment is damaged and whether the damage is a torn tail.

mod projected;

pub use projected::{decode_values, encode_values};

/// The first bytes of every segment (format 1).
pub const SEGMENT_MAGIC: &[u8; 8] = b"PBWAL1\n\0";

/// Bytes of a record's fixed fields: len, crc, seq, timestamp, key_len,
/// value_len.
pub const RECORD_OVERHEAD: usize = 4 + 4 + 8 + 8 + 4 + 4;

/// A record's `len` is never more than this (a key and a body past the
/// largest `max_body_bytes` pollbox takes): a larger one is damage, not a
/// record to wait for.
pub const MAX_RECORD_BYTES: usize = 1 << 30;

/// One record of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalRecord<'a> {
    /// Its position: the version the box gets. Strictly increasing through
    /// the file (gaps allowed: records a failed write did not keep).
    pub seq: u64,
    /// Milliseconds since the Unix epoch when it was accepted (expiry counts
    /// from it, as from a log record's timestamp).
    pub timestamp_ms: i64,
    pub key: &'a [u8],
    /// `None`: a delete (a tombstone).
    pub value: Option<&'a [u8]>,
}

impl WalRecord<'_> {
    /// Bytes the record takes in the file.
    pub fn encoded_len(&self) -> usize {
        RECORD_OVERHEAD + self.key.len() + self.value.map_or(0, <[u8]>::len)
    }
}

/// Append `rec` to `out`.
pub fn encode(rec: &WalRecord<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    let len = (rec.encoded_len() - 4) as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&rec.seq.to_le_bytes());
    out.extend_from_slice(&rec.timestamp_ms.to_le_bytes());
    out.extend_from_slice(&(rec.key.len() as u32).to_le_bytes());
    out.extend_from_slice(rec.key);
    match rec.value {
        Some(v) => {
            out.extend_from_slice(&(v.len() as i32).to_le_bytes());
            out.extend_from_slice(v);
        }
        None => out.extend_from_slice(&(-1i32).to_le_bytes()),
    }
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Why the bytes at an offset are not a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The bytes end inside the record (its length runs past them).
    Short,
    /// A length no record has.
    BadLength,
    /// The checksum does not match.
    BadChecksum,
    /// The key and value lengths do not add up to the record's length.
    BadFields,
    /// Its sequence number is not past the record before it.
    OutOfOrder,
    /// The segment does not start with [`SEGMENT_MAGIC`].
    BadMagic,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Damage::Short => "the file ends inside a record",
            Damage::BadLength => "a record length no record has",
            Damage::BadChecksum => "a checksum that does not match",
            Damage::BadFields => "key and value lengths that do not add up",
            Damage::OutOfOrder => "a sequence number not past the one before",
            Damage::BadMagic => "not a pollbox write-ahead segment",
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decode the record at the start of `buf`: `Ok(None)` when `buf` is empty,
/// else the record and the bytes it took, or why it is not one.
pub fn decode(buf: &[u8]) -> Result<Option<(WalRecord<'_>, usize)>, Damage> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf.len() < 4 {
        return Err(Damage::Short);
    }
    let len = u32_at(buf, 0) as usize;
    if !(RECORD_OVERHEAD - 4..=MAX_RECORD_BYTES).contains(&len) {
        return Err(Damage::BadLength);
    }
    let total = 4 + len;
    let Some(rec) = buf.get(..total) else {
        return Err(Damage::Short);
    };
    if crc32fast::hash(&rec[8..]) != u32_at(rec, 4) {
        return Err(Damage::BadChecksum);
    }
    let seq = u64_at(rec, 8);
    let timestamp_ms = u64_at(rec, 16) as i64;
    let key_len = u32_at(rec, 24) as usize;
    let key_end = 28usize.checked_add(key_len).ok_or(Damage::BadFields)?;
    if key_end + 4 > total {
        return Err(Damage::BadFields);
    }
    let key = &rec[28..key_end];
    let value_len = u32_at(rec, key_end) as i32;
    let value_at = key_end + 4;
    let value = match value_len {
        -1 if value_at == total => None,
        n if n >= 0 && value_at + n as usize == total => Some(&rec[value_at..]),
        _ => return Err(Damage::BadFields),
    };
    Ok(Some((
        WalRecord {
            seq,
            timestamp_ms,
            key,
            value,
        },
        total,
    )))
}

/// Where a segment is damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damaged {
    /// The offset in the segment of the first byte that is not a record.
    pub offset: u64,
    pub damage: Damage,
    /// Whether it is a torn tail: no whole record can be read after it (the
    /// segment ends inside it, or only what a crash in the middle of a write
    /// leaves follows: zeros, part of the write). Damage with a whole record
    /// after it is damage before the end.
    pub torn: bool,
}

/// Read every record of a segment's bytes, in order, handing each to `f`;
/// `after` is the sequence number the first record must be past (0: any).
/// Returns the sequence number of the last record (`after` if none), and
/// where the records stop if they stop before the end.
pub fn read_segment(
    bytes: &[u8],
    after: u64,
    mut f: impl FnMut(&WalRecord<'_>),
) -> (u64, Option<Damaged>) {
    let mut last = after;
    let magic = SEGMENT_MAGIC.len();
    if bytes.len() < magic || &bytes[..magic] != SEGMENT_MAGIC {
        let torn = bytes.len() < magic && SEGMENT_MAGIC.starts_with(bytes)
            || bytes.iter().all(|&b| b == 0);
        let damage = Damaged {
            offset: 0,
            damage: if bytes.len() < magic {
                Damage::Short
            } else {
                Damage::BadMagic
            },
            torn,
        };
        return (last, Some(damage));
    }
    let mut at = magic;
    loop {
        let damage = match decode(&bytes[at..]) {
            Ok(None) => return (last, None),
            Ok(Some((rec, n))) if rec.seq > last => {
                last = rec.seq;
                f(&rec);
                at += n;
                continue;
            }
            Ok(Some(_)) => Damage::OutOfOrder,
            Err(d) => d,
        };
        // Torn: nothing readable follows (the file ends inside the record,
        // or only bytes a crash left: zeros, a part of a write). A whole
        // record after the damage means the damage is in the middle.
        let torn = damage != Damage::OutOfOrder && !resyncs(&bytes[at + 1..], last);
        return (
            last,
            Some(Damaged {
                offset: at as u64,
                damage,
                torn,
            }),
        );
    }
}

/// Timestamps a record found after damage may have (2001 to 2286, in ms):
/// only there is a checksum tried ([`resyncs`]).
pub const PLAUSIBLE_MS: std::ops::Range<u64> = 1_000_000_000_000..10_000_000_000_000;

/// Whether a whole record past `last` starts anywhere in `buf`. A place is
/// checksummed only when its length fits and its timestamp is a plausible
/// wall clock (2001 to 2286), so garbage costs a few compares a byte, not a
/// checksum of the rest at each.
pub fn resyncs(buf: &[u8], last: u64) -> bool {
    (0..buf.len().saturating_sub(RECORD_OVERHEAD - 1)).any(|at| {
        let b = &buf[at..];
        let len = u32_at(b, 0) as usize;
        let plausible = (RECORD_OVERHEAD - 4..=b.len() - 4).contains(&len)
            && PLAUSIBLE_MS.contains(&u64_at(b, 16))
            && u64_at(b, 8) > last;
        plausible && matches!(decode(b), Ok(Some((r, _))) if r.seq > last)
    })
}

/// The file name of the segment whose first record is `seq`.
pub fn segment_name(seq: u64) -> String {
    format!("{seq:020}.log")
}

/// The first sequence number a segment's file name says, `None` for a
/// name that is not a segment's.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests;
