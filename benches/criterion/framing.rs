//! Request framing throughput: a pipelined batch of 16 requests framed from one
//! buffer, the way a worker frames what one read brought in. Throughput is in
//! requests (elements).
//!
//! - `get_polls`: 16 `GET /v1/boxes/{key}` polls with typical client headers.
//! - `post_cl_512`: 16 `POST /v1/boxes/{key}` with 512 B bodies by
//!   Content-Length.
//! - `post_chunked_512`: the same bodies chunked (4 × 128 B), decoded in place;
//!   each iteration frames a fresh copy (the copy is not timed).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use pollbox_core::http::{Framer, Limits, Progress};

const BATCH: usize = 16;

fn get_polls() -> Vec<u8> {
    let mut s = Vec::new();
    for i in 0..BATCH {
        s.extend_from_slice(
            format!(
                "GET /v1/boxes/box-{i}?after=41 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                 User-Agent: pollbox-load/0.1\r\nAccept: */*\r\nIf-None-Match: \"41\"\r\n\r\n"
            )
            .as_bytes(),
        );
    }
    s
}

fn body(i: usize) -> Vec<u8> {
    let mut b =
        format!("{{\"key\":\"box-{i}\",\"value\":{i},\"player\":\"p-7\",\"cargo\":\"").into_bytes();
    b.resize(510, b'x');
    b.extend_from_slice(b"\"}");
    b
}

fn posts_cl() -> Vec<u8> {
    let mut s = Vec::new();
    for i in 0..BATCH {
        let b = body(i);
        s.extend_from_slice(
            format!(
                "POST /v1/boxes/box-{i} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                b.len()
            )
            .as_bytes(),
        );
        s.extend_from_slice(&b);
    }
    s
}

fn posts_chunked() -> Vec<u8> {
    let mut s = Vec::new();
    for i in 0..BATCH {
        s.extend_from_slice(
            format!(
                "POST /v1/boxes/box-{i} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                 Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            .as_bytes(),
        );
        for chunk in body(i).chunks(128) {
            s.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            s.extend_from_slice(chunk);
            s.extend_from_slice(b"\r\n");
        }
        s.extend_from_slice(b"0\r\n\r\n");
    }
    s
}

/// Frame every request in `buf`; returns the total body bytes so nothing is
/// optimised away.
fn frame_batch(framer: &mut Framer, buf: &mut [u8]) -> usize {
    let mut at = 0;
    let mut bodies = 0;
    while let Ok(Progress::Complete(frame)) = framer.advance(&mut buf[at..]) {
        bodies += frame.body.len();
        at += frame.consumed;
    }
    assert_eq!(at, buf.len(), "batch not fully framed");
    bodies
}

fn framing(c: &mut Criterion) {
    let mut group = c.benchmark_group("framing");
    group.throughput(Throughput::Elements(BATCH as u64));
    let mut framer = Framer::new(Limits::default());

    let mut polls = get_polls();
    group.bench_function("get_polls", |b| {
        b.iter(|| frame_batch(&mut framer, black_box(&mut polls)))
    });

    let mut posts = posts_cl();
    group.bench_function("post_cl_512", |b| {
        b.iter(|| frame_batch(&mut framer, black_box(&mut posts)))
    });

    let chunked = posts_chunked();
    group.bench_function("post_chunked_512", |b| {
        b.iter_batched_ref(
            || chunked.clone(),
            |buf| frame_batch(&mut framer, black_box(buf)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, framing);
criterion_main!(benches);
