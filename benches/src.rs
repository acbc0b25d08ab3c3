//! criterion benchmarks for pollbox-core live in `benches/`; this library is empty.
