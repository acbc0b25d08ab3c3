//! The allocator size-class model: what an allocation really costs, so the
//! table can account its memory as jemalloc sees it.

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
}
