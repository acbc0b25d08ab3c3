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

pub(crate) fn encode(v: FieldView<'_>, out: &mut Vec<u8>) {
    match v {
        FieldView::Unset => out.push(UNSET),
        FieldView::I64(x) => {
            out.push(I64);
            put_varint(((x << 1) ^ (x >> 63)) as u64, out);
        }
        FieldView::F64(x) => {
            out.push(F64);
            out.extend_from_slice(&x.to_bits().to_le_bytes());
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
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.rest.split_first()?;
            self.rest = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
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
                FieldView::I64(((z >> 1) as i64) ^ -((z & 1) as i64))
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

impl Decoder<'_> {
    /// Step over the next view without reading it (no UTF-8 check of a
    /// string): for a field whose old value the next state does not need.
    /// Lenient like [`Iterator::next`]: malformed bytes end the state.
    pub(crate) fn skip_one(&mut self) {
        let ok = (|| {
            let (&tag, rest) = self.rest.split_first()?;
            self.rest = rest;
            match tag {
                UNSET | FALSE | TRUE => {}
                I64 | COUNT => {
                    self.varint()?;
                }
                F64 => self.rest = self.rest.get(8..)?,
                STR => {
                    let len = usize::try_from(self.varint()?).ok()?;
                    self.rest = self.rest.get(len..)?;
                }
                _ => return None,
            }
            Some(())
        })();
        if ok.is_none() {
            self.rest = &[];
        }
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
