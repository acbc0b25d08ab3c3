//! The snapshot format's constants and its field layout: the magic, the
//! format this build writes and the older ones it reads, the bounds that keep
//! a damaged count from asking for gigabytes, the record markers, and the
//! field layout as stored (type and reducer codes) and as named in a
//! mismatch. The layout of a whole file is in the module's doc
//! (`snapshot/mod.rs`).
//!
//! What it is not: the encoding of a file (`write`) or its checks on reading
//! (`read`).

use std::fmt::Write as _;

use crate::config::{FieldType, Reduce};
use crate::plan::Plan;

pub(super) const MAGIC: &[u8; 8] = b"PBOXSNAP";
/// The snapshot format this build writes and reads: a base or a delta of a chain.
pub const FORMAT_VERSION: u32 = 5;
/// The older formats this build still reads, as a base: 4 is one file with no
/// chain, 3 has no log position either, 2 no version floor and idle times
/// either.
pub(super) const FORMAT_WITHOUT_CHAIN: u32 = 4;
pub(super) const FORMAT_WITHOUT_POSITION: u32 = 3;
pub(super) const FORMAT_WITHOUT_LIFECYCLE: u32 = 2;
/// Set on a log position's partition number when the partition's version
/// base follows its next offset (a migrated topic's, `log::Bases`): older
/// builds refuse such a position as damaged rather than serve other versions.
pub(super) const BASE_FLAG: u32 = 1 << 31;
/// Bounds that keep a corrupted count from asking for gigabytes.
pub(super) const MAX_PARTITIONS: u32 = 1 << 20;
/// Bounds that keep a corrupted length from asking for gigabytes.
pub(super) const MAX_FIELDS: u32 = 4096;
/// A box's encoded state is at most its payload (at most 64 KiB) plus a few
/// bytes a field, so 1 MiB is far above any real one.
pub(super) const MAX_STATE: u32 = 1 << 20;

pub(super) const BOX_MARKER: u8 = 1;
pub(super) const REMOVED_MARKER: u8 = 2;
pub(super) const END_MARKER: u8 = 0;

/// The field layout as stored: name, type code, reducer code.
pub(super) fn layout(plan: &Plan) -> impl Iterator<Item = (&str, u8, u8)> {
    plan.fields.iter().map(|f| {
        let ty = match f.ty {
            FieldType::I64 => 0,
            FieldType::F64 => 1,
            FieldType::Bool => 2,
            FieldType::Str => 3,
        };
        let reduce = match f.reduce {
            Reduce::Last => 0,
            Reduce::Sum => 1,
            Reduce::Min => 2,
            Reduce::Max => 3,
            Reduce::Count => 4,
        };
        (f.name.as_str(), ty, reduce)
    })
}

/// `v:i64/last, n:count, ...`, for layout mismatch messages.
pub(super) fn describe(fields: &[(String, u8, u8)]) -> String {
    let mut s = String::new();
    for (i, (name, ty, reduce)) in fields.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let ty = ["i64", "f64", "bool", "str"]
            .get(*ty as usize)
            .unwrap_or(&"?");
        let reduce = ["last", "sum", "min", "max", "count"]
            .get(*reduce as usize)
            .unwrap_or(&"?");
        if *reduce == "count" {
            let _ = write!(s, "{name}:count");
        } else {
            let _ = write!(s, "{name}:{ty}/{reduce}");
        }
    }
    s
}
