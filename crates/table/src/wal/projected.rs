//! A message as the projection gave it, in bytes, handed from the worker
//! that accepted it to the thread that applies it once it is synced: so the
//! apply does not parse the message's JSON again (the file itself holds the
//! message's bytes, which recovery projects as a log replay does). Never on
//! disk; both ends are this process, so the decoder checks bounds (it never
//! panics) but nothing else.
//!
//! Per field: a tag byte, then its value: 0 none; 1 i64 (8 bytes); 2 f64
//! (8 bytes); 3 false; 4 true; 5 a string (len u32, bytes).

use crate::plan::Value;

/// Append `values` to `out`.
pub fn encode_values(values: &[Option<Value<'_>>], out: &mut Vec<u8>) {
    for v in values {
        match v {
            None => out.push(0),
            Some(Value::I64(i)) => {
                out.push(1);
                out.extend_from_slice(&i.to_le_bytes());
            }
            Some(Value::F64(f)) => {
                out.push(2);
                out.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            Some(Value::Bool(b)) => out.push(3 + u8::from(*b)),
            Some(Value::Str(s)) => {
                out.push(5);
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }
}

/// Decode `fields` values from the start of `bytes` into `out` (cleared
/// first); the bytes they took, or `None` if `bytes` is not such an encoding.
pub fn decode_values<'a>(
    bytes: &'a [u8],
    fields: usize,
    out: &mut Vec<Option<Value<'a>>>,
) -> Option<usize> {
    out.clear();
    let mut at = 0;
    let word = |at: usize| -> Option<[u8; 8]> { bytes.get(at..at + 8)?.try_into().ok() };
    for _ in 0..fields {
        let tag = *bytes.get(at)?;
        at += 1;
        out.push(match tag {
            0 => None,
            1 => {
                let w = word(at)?;
                at += 8;
                Some(Value::I64(i64::from_le_bytes(w)))
            }
            2 => {
                let w = word(at)?;
                at += 8;
                Some(Value::F64(f64::from_bits(u64::from_le_bytes(w))))
            }
            3 | 4 => Some(Value::Bool(tag == 4)),
            5 => {
                let len = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
                at += 4;
                let s = std::str::from_utf8(bytes.get(at..at + len)?).ok()?;
                at += len;
                Some(Value::Str(s))
            }
            _ => return None,
        });
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_as_they_went_and_bad_bytes_are_refused() {
        let values = [
            Some(Value::I64(-7)),
            None,
            Some(Value::F64(2.5)),
            Some(Value::Bool(true)),
            Some(Value::Bool(false)),
            Some(Value::Str("héllo")),
        ];
        let mut bytes = Vec::new();
        encode_values(&values, &mut bytes);
        encode_values(&values[..1], &mut bytes);
        let mut out = Vec::new();
        let n = decode_values(&bytes, values.len(), &mut out).expect("decodes");
        assert_eq!(out, values);
        assert_eq!(decode_values(&bytes[n..], 1, &mut out), Some(9));
        assert_eq!(out, [Some(Value::I64(-7))]);
        // Every cut short, and an unknown tag, is refused.
        for cut in 0..n {
            assert_eq!(
                decode_values(&bytes[..cut], values.len(), &mut out),
                None,
                "{cut}"
            );
        }
        assert_eq!(decode_values(&[9], 1, &mut out), None);
    }
}
