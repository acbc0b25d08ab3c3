//! `/metrics`: exact counters per route and status, and a clean bill from
//! `promtool check metrics`.

mod common;
use common::*;
use std::collections::BTreeMap;

/// `name{labels}` → value for every sample of the exposition.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn scrape(a: std::net::SocketAddr) -> String {
    let r = get(a, "/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    r.text()
}

#[test]
fn counters_are_exact() {
    let s = start(config());
    let a = s.addr();
    let mut want: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut expect = |route, code, n: u64| *want.entry((route, code)).or_default() += n;
    for _ in 0..3 {
        assert_eq!(get(a, "/v1/boxes/none").status, 404);
    }
    expect("poll", "404", 3);
    for i in 0..5 {
        assert_eq!(
            post(a, "/v1/boxes/m", &format!(r#"{{"value":{i}}}"#)).status,
            200
        );
    }
    expect("ingest_key", "200", 5);
    for _ in 0..7 {
        assert_eq!(get(a, "/v1/boxes/m").status, 200);
    }
    expect("poll", "200", 7);
    assert_eq!(post(a, "/v1/ingest", "{").status, 400);
    expect("ingest", "400", 1);
    assert_eq!(post(a, "/v1/ingest", r#"{"value":1}"#).status, 422);
    expect("ingest", "422", 1);
    let r = post(a, "/v1/ingest", r#"[{"key":"m","value":1},{"key":"n"},3]"#);
    assert_eq!(r.status, 200);
    expect("ingest", "200", 1);
    for _ in 0..2 {
        assert_eq!(get(a, "/healthz").status, 200);
    }
    expect("healthz", "200", 2);
    assert_eq!(get(a, "/readyz").status, 200);
    expect("readyz", "200", 1);
    assert_eq!(get(a, "/elsewhere").status, 404);
    expect("other", "404", 1);
    assert_eq!(
        raw(a, b"PUT /v1/boxes/m HTTP/1.1\r\nHost: t\r\n\r\n")
            .0
            .status,
        405
    );
    expect("other", "405", 1);
    assert_eq!(raw(a, b"BOGUS\r\n\r\n").0.status, 400);
    expect("other", "400", 1);
    assert_eq!(post(a, "/v1/boxes/gone", "{}").status, 200);
    expect("ingest_key", "200", 1);
    assert_eq!(delete(a, "/v1/boxes/gone").status, 204);
    assert_eq!(delete(a, "/v1/boxes/gone").status, 404);
    expect("delete", "204", 1);
    expect("delete", "404", 1);

    let m = samples(&scrape(a));
    let mut got: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (k, v) in &m {
        if let Some(labels) = k.strip_prefix("pollbox_http_requests_total{") {
            let route = labels
                .split("route=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let code = labels
                .split("code=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            got.insert((route.to_string(), code.to_string()), *v as u64);
        }
    }
    let want: BTreeMap<(String, String), u64> = want
        .into_iter()
        .map(|((r, c), n)| ((r.to_string(), c.to_string()), n))
        .collect();
    assert_eq!(got, want);

    // Messages: 5 by path + 2 accepted in the batch (m, n) + 1 for the box
    // deleted = 8 accepted; a missing key (single) and a non-object (batch)
    // rejected; one invalid body.
    let n = |k: &str| m.get(k).copied().unwrap_or(-1.0);
    assert_eq!(n("pollbox_ingest_messages_total{result=\"accepted\"}"), 8.0);
    assert_eq!(n("pollbox_ingest_messages_total{result=\"bad_key\"}"), 1.0);
    assert_eq!(
        n("pollbox_ingest_messages_total{result=\"not_object\"}"),
        1.0
    );
    assert_eq!(
        n("pollbox_ingest_messages_total{result=\"invalid_body\"}"),
        1.0
    );
    assert_eq!(n("pollbox_boxes"), 2.0);
    assert_eq!(n("pollbox_boxes_deleted_total"), 1.0);
    assert_eq!(n("pollbox_boxes_expired_total"), 0.0, "no ttl_s, no expiry");
    // Both workers run the io_uring loop when the suite runs with it.
    let uring = if std::env::var("POLLBOX_TEST_IO_URING").is_ok_and(|v| v == "1") {
        2.0
    } else {
        0.0
    };
    assert_eq!(n("pollbox_io_uring_workers"), uring);
    // Every request above opened its own connection (plus this scrape's).
    assert_eq!(n("pollbox_connections_total"), 28.0);
    let count = n("pollbox_http_request_duration_seconds_count");
    assert_eq!(count, 27.0, "one observation per answered request");
    // Every tick of both workers is observed (how many there were depends
    // on how long the test ran).
    assert_eq!(
        n("pollbox_tick_duration_seconds_count"),
        n("pollbox_tick_duration_seconds_bucket{le=\"+Inf\"}")
    );
    for name in [
        "pollbox_arena_resets_total",
        "pollbox_arena_bytes",
        "pollbox_epoch_overruns_total",
        "pollbox_jemalloc_allocated_bytes",
        "pollbox_jemalloc_dirty_bytes",
        "pollbox_jemalloc_fragmentation_bytes",
        "pollbox_accounted_bytes{part=\"arena\"}",
        "pollbox_accounted_bytes{part=\"boxes\"}",
        "pollbox_accounted_bytes{part=\"buffers\"}",
        "pollbox_accounted_bytes{part=\"send_queue\"}",
        "pollbox_worker_allocated_bytes_total{worker=\"0\"}",
        "pollbox_arena_capacity_bytes{worker=\"1\"}",
        "pollbox_arena_used_bytes{worker=\"0\"}",
        "pollbox_connections_rejected_total{reason=\"max_connections\"}",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
    ] {
        assert!(m.contains_key(name), "{name} missing");
    }
    assert!(n("process_resident_memory_bytes") > 0.0);
    // The binary's own pages are resident and file-backed: part of RSS, not all.
    let file = n("pollbox_process_resident_file_bytes");
    assert!(
        file > 0.0 && file < n("process_resident_memory_bytes"),
        "{file}"
    );
    assert!(n("pollbox_bytes_received_total") >= 0.0);
    s.shutdown().unwrap();
}

#[test]
fn metrics_on_their_own_listener() {
    let mut c = config();
    c.server.metrics_listen = "127.0.0.1:0".into();
    let s = start(c);
    let ma = s.metrics_addr().expect("metrics listener");
    assert_eq!(get(s.addr(), "/v1/boxes/x").status, 404);
    let text = scrape(ma);
    assert!(
        text.contains("pollbox_http_requests_total{route=\"poll\",code=\"404\"} 1"),
        "{text}"
    );
    // docs/http.md#routes: with metrics_listen set, /metrics is served there only,
    // and the metrics listener serves nothing else.
    assert_eq!(get(s.addr(), "/metrics").status, 404);
    assert_eq!(get(ma, "/healthz").status, 404);
    assert_eq!(get(ma, "/v1/boxes/x").status, 404);
    assert_eq!(get(ma, "/metrics").status, 200);
    s.shutdown().unwrap();
}

#[test]
#[ignore = "needs promtool (Debian package prometheus); .ci/run installs it"]
fn promtool_accepts_the_exposition() {
    let mut c = config();
    c.boxes.ttl_s = 1;
    c.http.cors_origins = vec!["https://game.example".into()];
    let s = start(c);
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/m", r#"{"value":1}"#).status, 200);
    assert_eq!(get(a, "/v1/boxes/m").status, 200);
    assert_eq!(post(a, "/v1/boxes/d", r#"{"value":1}"#).status, 200);
    assert_eq!(delete(a, "/v1/boxes/d").status, 204);
    let preflight =
        b"OPTIONS /v1/boxes/m HTTP/1.1\r\nHost: t\r\nOrigin: https://game.example\r\n\r\n";
    assert_eq!(raw(a, preflight).0.status, 204);
    // Let the boxes expire, so every lifecycle counter has a sample above 0.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !s.node().boxes.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(s.node().boxes.len(), 0);
    let text = scrape(a);
    promtool_check(&text);
    for name in [
        "pollbox_boxes_expired_total 1",
        "pollbox_boxes_deleted_total 1",
        "pollbox_tick_duration_seconds_bucket{le=\"0.000002\"}",
        "pollbox_http_requests_total{route=\"delete\",code=\"204\"} 1",
        "pollbox_http_requests_total{route=\"preflight\",code=\"204\"} 1",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    s.shutdown().unwrap();
}

#[test]
fn metrics_can_need_a_bearer_token() {
    let mut c = config();
    c.auth.metrics_tokens = vec!["scrape-me".into()];
    let s = start(c);
    let a = s.addr();
    let r = get(a, "/metrics");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let (r, _) = raw(
        a,
        b"GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer scrape-me\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    let text = r.text();
    assert!(text.contains("pollbox_arena_replacements_total "), "{text}");
    assert!(
        text.contains("pollbox_http_requests_total{route=\"metrics\",code=\"401\"} 1"),
        "{text}"
    );
    assert_eq!(get(a, "/healthz").status, 200, "only /metrics needs it");
    s.shutdown().unwrap();
}

#[test]
fn connections_during_shutdown_are_refused_while_the_request_in_flight_is_answered() {
    let mut c = config();
    c.server.workers = 2;
    let s = start(c);
    let a = s.addr();
    let lifecycle = s.lifecycle().clone();
    // A request in flight keeps the drain going (it may finish).
    let mut busy = Reader::new(connect(a));
    busy.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(busy.read(false).status, 200, "accepted and served");
    busy.send(b"GET /healthz HTTP/1.1\r\n");
    let stopping = std::thread::spawn(move || s.shutdown());
    while !lifecycle.is_draining() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The port stops accepting (a balancer retries a refused connection on
    // another node, whatever its method). A connection that raced the close
    // is answered 503 `shutting down` or reset, never served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match std::net::TcpStream::connect(a) {
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                break;
            }
            Ok(mut raced) => {
                use std::io::{Read, Write};
                let _ = raced.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
                let _ = raced.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut got = Vec::new();
                let _ = raced.read_to_end(&mut got); // a reset is fine too
                let text = String::from_utf8_lossy(&got);
                assert!(got.is_empty() || text.starts_with("HTTP/1.1 503"), "{text}");
            }
        }
        assert!(std::time::Instant::now() < deadline, "still accepting");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // The request in flight is answered (with Connection: close), then the
    // server stops.
    busy.send(b"Host: t\r\n\r\n");
    let r = busy.read(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    stopping.join().unwrap().unwrap();
}

#[test]
fn pipelined_requests_are_each_observed_once() {
    // The worker reads the clock once per read (README, "Metrics"), but every
    // request answered is still one observation of the duration histogram.
    let s = start(config());
    let a = s.addr();
    let ingested = post(a, "/v1/boxes/p", r#"{"value":1}"#);
    assert_eq!(ingested.status, 200);
    let etag = format!("\"{}\"", ingested.version());
    let mut r = Reader::new(connect(a));
    r.send(&b"GET /v1/boxes/p HTTP/1.1\r\nHost: t\r\n\r\n".repeat(16));
    for _ in 0..16 {
        let resp = r.read(false);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.header("ETag"), Some(etag.as_str()));
    }
    let m = samples(&scrape(a));
    let n = |k: &str| m.get(k).copied().unwrap_or(-1.0);
    assert_eq!(
        n("pollbox_http_requests_total{route=\"poll\",code=\"200\"}"),
        16.0
    );
    assert_eq!(n("pollbox_http_request_duration_seconds_count"), 17.0);
    assert_eq!(
        n("pollbox_http_request_duration_seconds_bucket{le=\"+Inf\"}"),
        17.0
    );
    assert!(n("pollbox_http_request_duration_seconds_sum") > 0.0);
    s.shutdown().unwrap();
}
