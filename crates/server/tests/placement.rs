//! New connections are served where the load is least, not where the
//! listeners' hash puts them (crate::placement): on idle workers, by count.

mod common;
use common::*;

fn per_worker(a: std::net::SocketAddr, workers: usize) -> Vec<u64> {
    let text = get(a, "/metrics").text();
    (0..workers)
        .map(|w| {
            let name = format!("pollbox_worker_connections{{worker=\"{w}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(name.as_str()))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} missing"))
        })
        .collect()
}

#[test]
fn connections_are_spread_evenly_over_idle_workers() {
    let mut c = config();
    c.server.workers = 4;
    let s = start(c);
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/k", r#"{"x":1}"#).status, 200);
    // Twelve connections, one after another, each answered (so each was served
    // by the worker it was placed on, handed over or not), and kept open.
    let mut open = Vec::new();
    for i in 0..12 {
        let mut r = Reader::new(connect(a));
        r.send(b"GET /v1/boxes/k HTTP/1.1\r\nHost: t\r\n\r\n");
        let resp = r.read(false);
        assert_eq!(resp.status, 200, "connection {i}");
        assert!(
            resp.text().contains("\"k\":\"k\""),
            "connection {i}: {}",
            resp.text()
        );
        open.push(r);
    }
    // The scrape's own connection is the thirteenth: it lands on one of them.
    let counts = per_worker(a, 4);
    assert_eq!(counts.iter().sum::<u64>(), 13, "{counts:?}");
    assert!(
        counts.iter().all(|&n| n == 3 || n == 4),
        "12 connections (and the scrape's) over 4 idle workers: {counts:?}"
    );
    // Closed connections leave their worker's count, and the next ones fill it.
    open.truncate(8);
    for r in open.iter_mut() {
        r.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.read(false).status, 200);
    }
    let mut more = Vec::new();
    for _ in 0..4 {
        let mut r = Reader::new(connect(a));
        r.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
        assert_eq!(r.read(false).status, 200);
        more.push(r);
    }
    let counts = per_worker(a, 4);
    assert!(
        counts.iter().all(|&n| n == 3 || n == 4),
        "after 4 closed and 4 opened: {counts:?}"
    );
    s.shutdown().unwrap();
}
