//! A worker serves the polls of a loop turn before its ingesting connections
//! (docs/operations.md#workers), and the tick never waits behind ingest that
//! keeps coming: over real sockets, batch ingest that never pauses on
//! pipelined connections still sees its arena reset every tick (no 503
//! "arena limit"), and polls beside it are answered.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn metric(a: std::net::SocketAddr, name: &str) -> f64 {
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn ingest_that_never_pauses_leaves_the_tick_its_turn_and_polls_theirs() {
    let mut c = config();
    c.server.workers = 1;
    // Small enough that a few ticks' worth of batches without a reset fill it.
    c.limits.arena_limit_bytes = 2 << 20;
    let s = start(c);
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/p", r#"{"value":1}"#).status, 200);
    let batch: String = {
        let msgs: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    r#"{{"key":"k{i}","value":{i},"cargo":"{}"}}"#,
                    "x".repeat(400)
                )
            })
            .collect();
        format!("[{}]", msgs.join(","))
    };
    let req = format!(
        "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{batch}",
        batch.len()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let resets_before = metric(a, "pollbox_arena_resets_total");
    // Eight connections, each with four batches always in flight.
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let (req, stop) = (req.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut r = Reader::new(connect(a));
                let mut statuses = std::collections::BTreeMap::new();
                for _ in 0..4 {
                    r.send(req.as_bytes());
                }
                while !stop.load(Ordering::Relaxed) {
                    *statuses.entry(r.read(false).status).or_insert(0u64) += 1;
                    r.send(req.as_bytes());
                }
                for _ in 0..4 {
                    *statuses.entry(r.read(false).status).or_insert(0u64) += 1;
                }
                statuses
            })
        })
        .collect();
    // Polls beside it are answered all along.
    let mut polled = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        assert_eq!(get(a, "/v1/boxes/p").status, 200);
        polled += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = std::collections::BTreeMap::new();
    for w in writers {
        for (status, n) in w.join().unwrap() {
            *total.entry(status).or_insert(0) += n;
        }
    }
    assert!(polled > 0);
    assert!(total.get(&200).copied().unwrap_or(0) > 100, "{total:?}");
    assert_eq!(
        total.keys().copied().collect::<Vec<u16>>(),
        [200],
        "{total:?}"
    );
    assert!(
        metric(a, "pollbox_arena_resets_total") > resets_before,
        "the arena was reset while ingest went on"
    );
    s.shutdown().unwrap();
}
