//! The field-state codec: the one byte form of a box's field states, kept in
//! every record and written for every box of a snapshot. Per field a tag,
//! then a zigzag varint (i64), a varint (count), 8 bytes (f64), or a varint
//! length and UTF-8 (str). Small numbers, the common case, take one or two
//! bytes.
//!
//! Two ways to read it: the [`Decoder`] iterator, lenient, for records this
//! process wrote itself, and [`Decoder::try_next`], strict, for bytes that
//! come from outside (a snapshot file), where damage must be refused.

use crate::render::FieldView;

const UNSET: u8 = 0;
const I64: u8 = 1;
const F64: u8 = 2;
const FALSE: u8 = 3;
const TRUE: u8 = 4;
const STR: u8 = 5;
const COUNT: u8 = 6;

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A tag and a varint: up to three bytes of varint (the common case) in one
/// append, longer ones a byte at a time.
#[inline(always)]
fn put_tagged(tag: u8, v: u64, out: &mut Vec<u8>) {
    if v < 0x80 {
        out.extend_from_slice(&[tag, v as u8]);
    } else if v < 0x4000 {
        out.extend_from_slice(&[tag, (v as u8) | 0x80, (v >> 7) as u8]);
    } else if v < 0x20_0000 {
        out.extend_from_slice(&[
            tag,
            (v as u8) | 0x80,
            ((v >> 7) as u8) | 0x80,
            (v >> 14) as u8,
        ]);
    } else {
        out.push(tag);
        put_varint(v, out);
    }
}

#[inline(always)]
fn zigzag(x: i64) -> u64 {
    ((x << 1) ^ (x >> 63)) as u64
}

#[inline(always)]
pub(crate) fn encode(v: FieldView<'_>, out: &mut Vec<u8>) {
    match v {
        FieldView::Unset => out.push(UNSET),
        FieldView::I64(int) => put_tagged(I64, zigzag(int), out),
        FieldView::F64(float) => {
            let b = float.to_bits().to_le_bytes();
            out.extend_from_slice(&[F64, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        }
        FieldView::Bool(b) => out.push(if b { TRUE } else { FALSE }),
        FieldView::Str(s) => {
            put_tagged(STR, s.len() as u64, out);
            out.extend_from_slice(s.as_bytes());
        }
        FieldView::Count(n) => put_tagged(COUNT, n, out),
    }
}

/// Yields one view per field, then `Unset` forever (a new box's state is
/// the empty slice). Records are written only by this module, so a
/// malformed one is a bug; it reads as unset fields rather than a panic.
pub(crate) struct Decoder<'a> {
    rest: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(state: &'a [u8]) -> Decoder<'a> {
        Decoder { rest: state }
    }

    /// Whether every byte has been read.
    pub(crate) fn is_at_end(&self) -> bool {
        self.rest.is_empty()
    }

    fn varint(&mut self) -> Option<u64> {
        let (v, n) = read_varint(self.rest)?;
        self.rest = self.rest.get(n..)?;
        Some(v)
    }

    /// The next view; `None` at the end of the bytes or where they are
    /// malformed (unknown tag, cut short, overlong varint, string not UTF-8).
    pub(crate) fn try_next(&mut self) -> Option<FieldView<'a>> {
        let (&tag, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(match tag {
            UNSET => FieldView::Unset,
            I64 => {
                let z = self.varint()?;
                FieldView::I64(unzigzag(z))
            }
            F64 => {
                let (bits, rest) = self.rest.split_first_chunk::<8>()?;
                self.rest = rest;
                FieldView::F64(f64::from_bits(u64::from_le_bytes(*bits)))
            }
            FALSE => FieldView::Bool(false),
            TRUE => FieldView::Bool(true),
            STR => {
                let len = usize::try_from(self.varint()?).ok()?;
                let bytes = self.rest.get(..len)?;
                self.rest = &self.rest[len..];
                FieldView::Str(std::str::from_utf8(bytes).ok()?)
            }
            COUNT => FieldView::Count(self.varint()?),
            _ => return None,
        })
    }
}

impl<'a> Decoder<'a> {
    /// The next view, read as [`Iterator::next`] reads it, but a varint with
    /// the tag `tag` (the kind the caller expects) without the general match.
    #[inline(always)]
    fn next_tagged(&mut self, tag: u8) -> Result<u64, FieldView<'a>> {
        if let [t, rest @ ..] = self.rest {
            if *t == tag {
                if let Some((v, n)) = read_varint(rest) {
                    self.rest = rest.get(n..).unwrap_or_default();
                    return Ok(v);
                }
            }
        }
        Err(self.next().unwrap_or_default())
    }

    /// The next view, as [`Iterator::next`] reads it; quicker for an `I64`.
    #[inline(always)]
    pub(crate) fn next_i64(&mut self) -> FieldView<'a> {
        match self.next_tagged(I64) {
            Ok(z) => FieldView::I64(unzigzag(z)),
            Err(v) => v,
        }
    }

    /// The next view, as [`Iterator::next`] reads it; quicker for a `Count`.
    #[inline(always)]
    pub(crate) fn next_count(&mut self) -> FieldView<'a> {
        match self.next_tagged(COUNT) {
            Ok(n) => FieldView::Count(n),
            Err(v) => v,
        }
    }
}

/// A varint at the start of `b`: its value and length in bytes, `None` when
/// cut short or longer than 10 bytes (as [`Decoder`] reads one). One byte
/// is read as it is; up to eight, when eight bytes are there, as one word
/// (the 7-bit groups packed together in three steps).
#[inline(always)]
fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    if let Some(&b0) = b.first() {
        if b0 < 0x80 {
            return Some((u64::from(b0), 1));
        }
    }
    if let Some(w) = b.first_chunk::<8>() {
        let w = u64::from_le_bytes(*w);
        // The top bit of each byte that ends a varint.
        let ends = !w & 0x8080_8080_8080_8080;
        if ends != 0 {
            let n = (ends.trailing_zeros() / 8 + 1) as usize;
            // The bytes up to the first end, less their continuation bits.
            let x = w & (ends ^ (ends - 1)) & 0x7f7f_7f7f_7f7f_7f7f;
            let x = (x & 0x007f_007f_007f_007f) | ((x & 0x7f00_7f00_7f00_7f00) >> 1);
            let x = (x & 0x0000_3fff_0000_3fff) | ((x & 0x3fff_0000_3fff_0000) >> 2);
            let x = (x & 0x0000_0000_0fff_ffff) | ((x & 0x0fff_ffff_0000_0000) >> 4);
            return Some((x, n));
        }
    }
    read_varint_bytewise(b)
}

/// [`read_varint`] a byte at a time: near the end of the bytes, or past
/// eight bytes.
fn read_varint_bytewise(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().take(10).enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((v, i + 1));
        }
    }
    None
}

#[inline(always)]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

impl Decoder<'_> {
    /// Step over the next view without reading it (no UTF-8 check of a
    /// string): for a field whose old value the next state does not need.
    /// Lenient like [`Iterator::next`]: malformed bytes end the state.
    #[inline(always)]
    pub(crate) fn skip_one(&mut self) {
        // Malformed bytes end the state.
        self.rest = after_one(self.rest).unwrap_or_default();
    }
}

/// The bytes after the first view of `b`, `None` where it is malformed.
#[inline(always)]
fn after_one(b: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = b.split_first()?;
    match tag {
        UNSET | FALSE | TRUE => Some(rest),
        I64 | COUNT => rest.get(read_varint(rest)?.1..),
        F64 => rest.get(8..),
        STR => {
            let (len, n) = read_varint(rest)?;
            let len = usize::try_from(len).ok()?;
            rest.get(n..)?.get(len..)
        }
        _ => None,
    }
}

impl<'a> Iterator for Decoder<'a> {
    type Item = FieldView<'a>;

    fn next(&mut self) -> Option<FieldView<'a>> {
        Some(self.try_next().unwrap_or_else(|| {
            self.rest = &[];
            FieldView::Unset
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_view_round_trips() {
        let views = [
            FieldView::Unset,
            FieldView::I64(0),
            FieldView::I64(-1),
            FieldView::I64(63),
            FieldView::I64(-64),
            FieldView::I64(i64::MIN),
            FieldView::I64(i64::MAX),
            FieldView::F64(-0.0),
            FieldView::F64(1.5e300),
            FieldView::Bool(true),
            FieldView::Bool(false),
            FieldView::Str(""),
            FieldView::Str("日本\"x"),
            FieldView::Count(0),
            FieldView::Count(u64::MAX),
        ];
        let mut buf = Vec::new();
        for v in views {
            encode(v, &mut buf);
        }
        let back: Vec<_> = Decoder::new(&buf).take(views.len() + 2).collect();
        assert_eq!(back[..views.len()], views);
        assert_eq!(back[views.len()..], [FieldView::Unset, FieldView::Unset]);
    }

    #[test]
    fn skipping_lands_where_reading_does() {
        let views = [
            FieldView::Str("日本\"x"),
            FieldView::I64(-70_000),
            FieldView::F64(2.5),
            FieldView::Bool(true),
            FieldView::Count(300),
            FieldView::Unset,
            FieldView::Str(""),
        ];
        let mut buf = Vec::new();
        for v in views {
            encode(v, &mut buf);
        }
        for (skipped, &want) in views.iter().enumerate() {
            let mut d = Decoder::new(&buf);
            for _ in 0..skipped {
                d.skip_one();
            }
            assert_eq!(d.next(), Some(want), "after skipping {skipped}");
        }
        for bad in MALFORMED {
            let mut d = Decoder::new(bad);
            d.skip_one();
            // Malformed bytes end the state (a string that is not UTF-8 is
            // stepped over whole: a skip does not read it).
            assert!(d.is_at_end(), "{bad:?}");
        }
    }

    #[test]
    fn small_numbers_take_two_bytes() {
        let mut buf = Vec::new();
        encode(FieldView::I64(-60), &mut buf);
        encode(FieldView::Count(100), &mut buf);
        assert_eq!(buf.len(), 4);
    }

    /// The byte form as first written (a byte at a time): the snapshot file
    /// format, which the faster `encode` must keep byte for byte.
    fn reference_encode(v: FieldView<'_>, out: &mut Vec<u8>) {
        match v {
            FieldView::Unset => out.push(UNSET),
            FieldView::I64(int) => {
                out.push(I64);
                put_varint(((int << 1) ^ (int >> 63)) as u64, out);
            }
            FieldView::F64(float) => {
                out.push(F64);
                out.extend_from_slice(&float.to_bits().to_le_bytes());
            }
            FieldView::Bool(b) => out.push(if b { TRUE } else { FALSE }),
            FieldView::Str(s) => {
                out.push(STR);
                put_varint(s.len() as u64, out);
                out.extend_from_slice(s.as_bytes());
            }
            FieldView::Count(n) => {
                out.push(COUNT);
                put_varint(n, out);
            }
        }
    }

    fn check_bytes(v: FieldView<'_>) {
        let (mut got, mut want) = (vec![0xaa], vec![0xaa]);
        encode(v, &mut got);
        reference_encode(v, &mut want);
        assert_eq!(got, want, "{v:?}");
        let mut d = Decoder::new(&got[1..]);
        assert_eq!(d.try_next(), Some(v));
        assert!(d.is_at_end());
    }

    #[test]
    fn bytes_are_the_reference_bytes_at_every_varint_length() {
        let long = "x".repeat(20_000);
        for shift in 0..64 {
            for n in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                check_bytes(FieldView::Count(n));
                check_bytes(FieldView::I64(n as i64));
                check_bytes(FieldView::I64((n as i64).wrapping_neg()));
                check_bytes(FieldView::I64(!(n as i64)));
            }
        }
        for len in [0, 1, 127, 128, 129, 16_383, 16_384, 20_000] {
            check_bytes(FieldView::Str(&long[..len]));
        }
        for v in [
            FieldView::Unset,
            FieldView::Count(u64::MAX),
            FieldView::I64(i64::MIN),
            FieldView::I64(i64::MAX),
            FieldView::F64(-0.0),
            FieldView::F64(1.5e300),
            FieldView::Bool(true),
            FieldView::Bool(false),
        ] {
            check_bytes(v);
        }
    }

    #[test]
    fn word_varints_read_as_bytewise_ones() {
        // Every length of varint, at every place of the word, with and
        // without bytes after it.
        for len in 1..=11 {
            for pad in 0..10 {
                for fill in [0x80u8, 0xff, 0x81] {
                    let mut b = vec![fill; len - 1];
                    b.push(0x7f & fill);
                    b.extend(std::iter::repeat_n(0xaa, pad));
                    assert_eq!(read_varint(&b), read_varint_bytewise(&b), "{b:?}");
                    let cut = &b[..len - 1];
                    assert_eq!(read_varint(cut), read_varint_bytewise(cut), "{cut:?}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn bytes_are_the_reference_bytes(
            i in proptest::prelude::any::<i64>(),
            n in proptest::prelude::any::<u64>(),
            f in proptest::prelude::any::<f64>(),
            s in proptest::prelude::any::<String>(),
        ) {
            check_bytes(FieldView::I64(i));
            check_bytes(FieldView::Count(n));
            if !f.is_nan() {
                check_bytes(FieldView::F64(f));
            }
            check_bytes(FieldView::Str(&s));
        }

        #[test]
        fn varints_read_as_bytewise_ones(
            b in proptest::collection::vec(
                proptest::prop_oneof![0x80u8..=0xff, proptest::prelude::any::<u8>()],
                0..14,
            ),
        ) {
            proptest::prop_assert_eq!(read_varint(&b), read_varint_bytewise(&b));
        }
    }

    /// Cut short, unknown tag, string not UTF-8.
    const MALFORMED: [&[u8]; 5] = [
        &[I64, 0x80],
        &[STR, 5, b'a'],
        &[F64, 1, 2],
        &[99],
        &[STR, 1, 0xff],
    ];

    #[test]
    fn malformed_reads_as_unset() {
        for bad in MALFORMED {
            let v: Vec<_> = Decoder::new(bad).take(2).collect();
            assert_eq!(v, [FieldView::Unset, FieldView::Unset], "{bad:?}");
        }
    }

    #[test]
    fn strict_reads_refuse_what_lenient_reads_as_unset() {
        for bad in MALFORMED {
            assert_eq!(Decoder::new(bad).try_next(), None, "{bad:?}");
        }
        let mut buf = Vec::new();
        encode(FieldView::Count(300), &mut buf);
        let mut d = Decoder::new(&buf);
        assert_eq!(d.try_next(), Some(FieldView::Count(300)));
        assert!(d.is_at_end());
        assert_eq!(d.try_next(), None);
    }
}
