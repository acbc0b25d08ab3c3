//! Where a keyed record lands, under the two partitioners the suite meets:
//! Kafka's default (murmur2, the Java client's and librdkafka's
//! `murmur2_random`: the key's **home** partition, the only one a node
//! applies it from) and librdkafka's own default (`consistent_random`: CRC32
//! of the key), the foreign producer's.
//!
//! Written here from Kafka's `Utils.murmur2`, not taken from pollbox, so that
//! the checker does not share a bug with what it checks.

/// Kafka's murmur2: seed `0x9747b28c`, four bytes at a time little endian.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = SEED ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The key's home partition: `toPositive(murmur2(key)) % partitions`.
pub fn home(key: &str, partitions: i32) -> i32 {
    ((murmur2(key.as_bytes()) as u32 & 0x7fff_ffff) % partitions.max(1) as u32) as i32
}

/// Where librdkafka's default partitioner puts a keyed record:
/// `crc32(key) % partitions`.
pub fn consistent(key: &str, partitions: i32) -> i32 {
    (crc32fast::hash(key.as_bytes()) % partitions.max(1) as u32) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_is_kafkas() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (data, want) in cases {
            assert_eq!(murmur2(data), want, "{:?}", String::from_utf8_lossy(data));
        }
    }

    #[test]
    fn the_two_partitioners_disagree_for_most_keys() {
        let differ = (0..100)
            .filter(|i| {
                let k = format!("k{i}");
                home(&k, 4) != consistent(&k, 4)
            })
            .count();
        assert!((50..=90).contains(&differ), "{differ}");
    }
}
