//! The allocator size-class model: what an allocation really costs, so the
//! table can account its memory as jemalloc sees it.

use hashbrown::HashTable;

/// The size an allocation of `n` bytes really takes, following jemalloc's size
/// classes (16-byte steps up to 128, then four classes per power of two), so
/// accounted bytes track what the allocator reports.
pub fn size_class(n: usize) -> usize {
    match n {
        0 => 0,
        1..=8 => 8,
        9..=128 => (n + 15) & !15,
        _ => {
            let lg = usize::BITS - 1 - (n - 1).leading_zeros();
            let step = 1usize << (lg - 2);
            (n + step - 1) & !(step - 1)
        }
    }
}

/// Bytes of a hashbrown index's single allocation: one 8-byte entry and one
/// control byte per bucket, plus a group of trailing control bytes.
pub(super) fn index_bytes(index: &HashTable<u64>) -> usize {
    const GROUP_WIDTH: usize = 16;
    let cap = index.capacity();
    if cap == 0 {
        return 0;
    }
    // hashbrown keeps 1/8 of the buckets free (all but one for tables under 8).
    let buckets = if cap < 8 { cap + 1 } else { cap / 7 * 8 };
    let data = (buckets * std::mem::size_of::<u64>() + GROUP_WIDTH - 1) & !(GROUP_WIDTH - 1);
    size_class(data + buckets + GROUP_WIDTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_follow_jemalloc() {
        let cases = [
            (1, 8),
            (8, 8),
            (9, 16),
            (17, 32),
            (100, 112),
            (128, 128),
            (129, 160),
            (200, 224),
            (257, 320),
            (4097, 5120),
            (1 << 20, 1 << 20),
        ];
        for (n, class) in cases {
            assert_eq!(size_class(n), class, "{n}");
        }
    }

    #[test]
    fn index_bytes_matches_hashbrown_capacity() {
        let mut index: HashTable<u64> = HashTable::new();
        assert_eq!(index_bytes(&index), 0);
        for n in 0..100u64 {
            index.insert_unique(n.wrapping_mul(0x9e37_79b9_7f4a_7c15), n, |&e| {
                e.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            });
        }
        // 100 entries need 128 buckets: 128 * 8 + 128 + 16 bytes.
        assert_eq!(index.capacity(), 112);
        assert_eq!(index_bytes(&index), size_class(128 * 8 + 128 + 16));
    }
}
