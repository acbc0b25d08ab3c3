//! Where a key's records belong: Kafka's default partitioner (the Java
//! client's, and librdkafka's `murmur2_random` for keyed records), so a
//! key's home partition is the same on every node and for every producer
//! that partitions the way Kafka does.

/// Kafka's murmur2 hash (the Java client's `Utils.murmur2`, librdkafka's
/// `murmur2` partitioners): seed `0x9747b28c`, four bytes at a time little
/// endian, the tail, then the final mix.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if let Some(&b) = tail.first() {
        h ^= u32::from(b);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a key's records belong in: murmur2 of the key, made
/// positive (the high bit cleared, as Kafka's `toPositive`), modulo the
/// partition count (which is at least 1).
pub fn home_partition(key: &[u8], partitions: u32) -> i32 {
    let positive = (murmur2(key) as u32) & 0x7fff_ffff;
    (positive % partitions.max(1)) as i32
}
