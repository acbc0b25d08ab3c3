//! Server-sent events over real sockets (docs/http.md#event-streams): the head and
//! the first event, delivery across workers, `Last-Event-ID`, `event: deleted`, a
//! paused reader that is sent only the newest payload when it reads again (the
//! server keeps at most one event queued for it, and the kernel little more:
//! `TCP_NOTSENT_LOWAT`), the connection cap, and shutdown ending streams cleanly.
//! The stream state's every rule is a unit test in `crates/core/src/conn/tests.rs`.

mod common;
use common::*;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Wait until `f` holds, polling; panics after 30 s (a hang, not a timing bound).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < give_up, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn subscribers(s: &pollbox_server::Server) -> i64 {
    s.stats()
        .iter()
        .map(|w| w.sse_subscribers.get() as i64)
        .sum()
}

fn sum(s: &pollbox_server::Server, f: impl Fn(&pollbox_server::stats::WorkerStats) -> u64) -> u64 {
    s.stats().iter().map(f).sum()
}

/// One event of a stream: its fields, as sent.
#[derive(Debug, Default, Clone, PartialEq)]
struct Ev {
    id: Option<u64>,
    event: Option<String>,
    data: Option<String>,
    comment: bool,
    retry: Option<u64>,
}

/// A subscriber: the head read, then events one by one.
struct Sub {
    stream: TcpStream,
    head: String,
    buf: Vec<u8>,
}

impl Sub {
    fn open(addr: SocketAddr, path: &str, extra: &str) -> Sub {
        Sub::on(connect(addr), path, extra)
    }

    fn on(mut stream: TcpStream, path: &str, extra: &str) -> Sub {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{extra}\r\n"
        )
        .unwrap();
        let mut sub = Sub {
            stream,
            head: String::new(),
            buf: Vec::new(),
        };
        loop {
            if let Some(i) = sub.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                sub.head = String::from_utf8(sub.buf[..i + 4].to_vec()).unwrap();
                sub.buf.drain(..i + 4);
                break;
            }
            assert!(sub.fill(), "EOF before the head");
        }
        sub
    }

    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 65536];
        match read_some(&mut self.stream, &mut tmp) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(e) => panic!("read: {e}"),
        }
    }

    /// The next event (or comment, or `retry:`); None at the end of the stream.
    fn next(&mut self) -> Option<Ev> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + 2);
                let mut ev = Ev::default();
                for line in block.lines() {
                    if line.starts_with(':') {
                        ev.comment = true;
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = Some(v.into());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = Some(v.into());
                    } else if let Some(v) = line.strip_prefix("retry: ") {
                        ev.retry = Some(v.parse().unwrap());
                    } else {
                        panic!("unexpected line {line:?}");
                    }
                }
                return Some(ev);
            }
            if !self.fill() {
                assert!(self.buf.is_empty(), "a partial event at the end");
                return None;
            }
        }
    }

    /// The next event with an id (heartbeats skipped).
    fn event(&mut self) -> Ev {
        loop {
            let ev = self.next().expect("an event before the end");
            if ev.id.is_some() || ev.event.is_some() {
                return ev;
            }
        }
    }
}

fn ingest(a: SocketAddr, key: &str, value: i64) -> u64 {
    let r = post(
        a,
        &format!("/v1/boxes/{key}"),
        &format!("{{\"value\":{value}}}"),
    );
    assert_eq!(r.status, 200);
    r.json()["ver"].as_u64().unwrap()
}

#[test]
fn a_stream_has_its_head_retry_and_the_box_then_every_update() {
    let mut c = config();
    c.http.cors_origins = vec!["https://game.example".into()];
    c.http.sse_retry_ms = 1500;
    let s = start(c);
    let a = s.addr();
    let v1 = ingest(a, "a", 5);
    let mut sub = Sub::open(a, "/v1/boxes/a", "Origin: https://game.example\r\n");
    let h = sub.head.to_ascii_lowercase();
    assert!(h.starts_with("http/1.1 200 ok\r\n"), "{h}");
    assert!(h.contains("\r\ncontent-type: text/event-stream\r\n"), "{h}");
    assert!(h.contains("\r\ncache-control: no-cache\r\n"), "{h}");
    assert!(
        h.contains("\r\naccess-control-allow-origin: https://game.example\r\n"),
        "{h}"
    );
    assert!(h.contains("\r\ndate: "), "{h}");
    assert!(!h.contains("content-length"), "{h}");
    assert_eq!(sub.next().unwrap().retry, Some(1500));
    let ev = sub.event();
    assert_eq!(ev.id, Some(v1));
    let p: serde_json::Value = serde_json::from_str(ev.data.as_deref().unwrap()).unwrap();
    assert_eq!((p["k"].as_str(), p["v"].as_i64()), (Some("a"), Some(5)));
    // The ETag a poll gets is the event's id, quoted.
    assert_eq!(
        get(a, "/v1/boxes/a").header("ETag").map(str::to_string),
        Some(format!("\"{v1}\""))
    );
    let v2 = ingest(a, "a", 6);
    assert_eq!(sub.event().id, Some(v2));
    eventually("counted", || {
        let m = get(a, "/metrics").text();
        m.contains("pollbox_sse_subscribers 1\n")
            && m.contains("pollbox_sse_events_total 2\n")
            && m.contains("pollbox_http_requests_total{route=\"sse\",code=\"200\"} 1\n")
    });
    // The client goes away: the stream is dropped.
    drop(sub);
    eventually("unsubscribed", || subscribers(&s) == 0);
    s.shutdown().unwrap();
}

#[test]
fn updates_on_any_worker_reach_subscribers_on_every_worker() {
    let mut c = config();
    c.server.workers = 3;
    let s = start(c);
    let a = s.addr();
    // SO_REUSEPORT spreads the streams over the workers (ingests too).
    let mut subs: Vec<Sub> = (0..12).map(|_| Sub::open(a, "/v1/boxes/x", "")).collect();
    eventually("12 subscribers", || subscribers(&s) == 12);
    let on = s
        .stats()
        .iter()
        .filter(|w| w.sse_subscribers.get() > 0)
        .count();
    assert!(on >= 2, "streams on {on} worker(s) only");
    let mut last = 0;
    for v in 1..=20 {
        last = ingest(a, "x", v);
    }
    for sub in &mut subs {
        assert_eq!(sub.next().unwrap().retry, Some(1000));
        // Every subscriber sees increasing versions and ends at the newest
        // (intermediate ones may be coalesced).
        let mut seen = 0;
        while seen < last {
            let ev = sub.event();
            let id = ev.id.unwrap();
            assert!(id > seen, "{id} after {seen}");
            let p: serde_json::Value = serde_json::from_str(ev.data.as_deref().unwrap()).unwrap();
            assert_eq!(p["ver"].as_u64(), Some(id));
            seen = id;
        }
        assert_eq!(seen, last);
    }
    s.shutdown().unwrap();
}

#[test]
fn last_event_id_resumes_and_a_deleted_box_ends_the_stream() {
    let s = start(config());
    let a = s.addr();
    for v in 1..=3 {
        ingest(a, "k", v);
    }
    let ver = get(a, "/v1/boxes/k").json()["ver"].as_u64().unwrap();
    // Up to date: nothing until the next update.
    let mut cur = Sub::open(a, "/v1/boxes/k", &format!("Last-Event-ID: {ver}\r\n"));
    // Behind: the newest at once (the query form too).
    let mut behind = Sub::open(a, &format!("/v1/boxes/k?last_event_id={}", ver - 2), "");
    assert_eq!(behind.next().unwrap().retry, Some(1000));
    assert_eq!(behind.event().id, Some(ver));
    // A key nobody created yet is waited for.
    let mut unknown = Sub::open(a, "/v1/boxes/later", "");
    eventually("3 subscribers", || subscribers(&s) == 3);
    let next = ingest(a, "k", 4);
    assert_eq!(cur.next().unwrap().retry, Some(1000));
    assert_eq!(cur.event().id, Some(next), "nothing before the update");
    assert_eq!(behind.event().id, Some(next));
    let created = ingest(a, "later", 1);
    assert_eq!(unknown.event().id, Some(created));

    assert_eq!(delete(a, "/v1/boxes/k").status, 204);
    for sub in [&mut cur, &mut behind] {
        let ev = sub.event();
        assert_eq!(ev.event.as_deref(), Some("deleted"));
        assert_eq!(ev.data.as_deref(), Some(""));
        assert_eq!(sub.next(), None, "the stream ends after event: deleted");
    }
    eventually("one subscriber left", || subscribers(&s) == 1);
    // A client that resumes from before the deletion is not fooled by the new
    // incarnation: its versions are past the old ones.
    let mut again = Sub::open(a, "/v1/boxes/k", &format!("Last-Event-ID: {next}\r\n"));
    let v = ingest(a, "k", 9);
    assert!(v > next);
    assert_eq!(again.event().id, Some(v));
    s.shutdown().unwrap();
}

#[test]
fn a_paused_reader_is_sent_only_the_newest_payload_when_it_reads_again() {
    // Large payloads (16 KB each), so the socket's buffers fill after a few
    // hundred events.
    let mut c = config();
    c.boxes.max_payload_bytes = 32 * 1024;
    for f in &mut c.boxes.fields {
        if f.name == "by" {
            f.max_len = Some(16 * 1024);
        }
    }
    let s = start(c);
    let a = s.addr();
    let body = format!("{{\"value\":1,\"player\":\"{}\"}}", "p".repeat(16_000));
    let req = format!(
        "POST /v1/boxes/slow HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut w = Reader::new(connect(a));
    // One update at a time: each one is a wake-up of the stream.
    let mut update = |n: usize| {
        let mut ver = 0;
        for _ in 0..n {
            w.send(req.as_bytes());
            let r = w.read(false);
            assert_eq!(r.status, 200);
            ver = r.json()["ver"].as_u64().unwrap();
        }
        ver
    };
    update(1);
    // A small receive window, so the socket's buffers fill sooner.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&a.into()).unwrap();
    let mut sub = Sub::on(sock.into(), "/v1/boxes/slow", "");
    eventually("subscribed", || subscribers(&s) == 1);

    // Update until the stream stops taking events (its socket is full and one
    // event waits in its queue): events sent stop growing while updates go on,
    // and bytes wait in the server's send queue (the socket refused them), so
    // a wake-up that is merely late is not taken for a full socket.
    let events = || sum(&s, |w| w.sse_events.get());
    let queued = || sum(&s, |w| w.send_queue_bytes.get());
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut still = 0;
    while still < 3 {
        let before = events();
        update(10);
        // Wake-ups are asynchronous: let them land before comparing.
        std::thread::sleep(Duration::from_millis(30));
        still = if events() == before && queued() > 0 {
            still + 1
        } else {
            0
        };
        assert!(Instant::now() < give_up, "the stream never filled");
    }
    let stalled_at = events();
    let last = update(300);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(events(), stalled_at, "nothing more was queued for it");
    // What the server holds for the stream stays about one payload, whatever
    // the number of updates (the accounted send-queue bytes, all connections).
    let queued = queued();
    assert!(
        queued <= 64 * 1024,
        "{queued} bytes queued for a paused reader"
    );

    // It reads again: what the sockets held, then the newest version only.
    let mut ids = Vec::new();
    while ids.last() != Some(&last) {
        if let Some(id) = sub.event().id {
            ids.push(id);
        }
    }
    assert!(ids.windows(2).all(|p| p[0] < p[1]), "increasing");
    let before_last = ids[ids.len() - 2];
    assert!(
        last - before_last >= 300,
        "the 300 updates after the stall came as one event: {before_last} then {last}"
    );
    eventually("coalesced versions counted", || {
        sum(&s, |w| w.sse_coalesced.get()) >= 299
    });
    drop(sub);
    s.shutdown().unwrap();
}

#[test]
fn a_paused_reader_is_queued_little_in_the_kernel_too() {
    // Small events and many updates. A socket's send buffer grows to tcp_wmem's
    // maximum (4 MB by default): without a limit on its unsent bytes the kernel
    // would take hundreds of KB of stale versions for a reader that has stopped,
    // and the reader would get all of them before the newest. With
    // TCP_NOTSENT_LOWAT on streams the server stops after about that much and
    // coalesces the rest, so what the reader gets before the newest is bounded by
    // that, its own receive window and one event.
    let s = start(config());
    let a = s.addr();
    let first = ingest(a, "stale", 1);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&a.into()).unwrap();
    let mut sub = Sub::on(sock.into(), "/v1/boxes/stale", "");
    assert_eq!(sub.event().id, Some(first));
    eventually("subscribed", || subscribers(&s) == 1);

    // 5,000 updates (about 375 KB of events), pipelined 50 at a time.
    let updates = 5000u64;
    let body = r#"{"value":1}"#;
    let req = format!(
        "POST /v1/boxes/stale HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut w = Reader::new(connect(a));
    for _ in 0..updates / 50 {
        for _ in 0..50 {
            w.send(req.as_bytes());
        }
        for _ in 0..50 {
            assert_eq!(w.read(false).status, 200);
        }
    }
    let last = first + updates;
    // Let the last wake-ups land (were some still on their way, the reader would
    // only find fewer stale bytes; what it must find is bounded either way).
    std::thread::sleep(Duration::from_millis(100));

    // It reads again: the stale bytes before the newest version.
    let mut stale = 0;
    let mut stale_events = 0;
    loop {
        let ev = sub.event();
        let id = ev.id.unwrap();
        if id == last {
            break;
        }
        stale += format!("id: {id}\ndata: {}\n\n", ev.data.unwrap_or_default()).len();
        stale_events += 1;
    }
    eprintln!("{stale} bytes ({stale_events} events) before the newest");
    let bound = pollbox_server::STREAM_NOTSENT_LOWAT as usize + 48 * 1024;
    assert!(
        stale <= bound,
        "{stale} bytes ({stale_events} events) of stale versions before the newest; at most {bound}"
    );
    // The versions it never got were coalesced (counted as the newest went out).
    eventually("the rest counted as coalesced", || {
        sum(&s, |w| w.sse_coalesced.get()) >= updates - stale_events as u64 - 1
    });
    drop(sub);
    s.shutdown().unwrap();
}

#[test]
fn streams_count_against_max_connections() {
    let mut c = config();
    c.limits.max_connections = 2;
    let s = start(c);
    let a = s.addr();
    let _s1 = Sub::open(a, "/v1/boxes/m", "");
    let _s2 = Sub::open(a, "/v1/boxes/m", "");
    eventually("2 subscribers", || subscribers(&s) == 2);
    let mut r = Reader::new(connect(a));
    let resp = r.read(false);
    assert_eq!(resp.status, 503);
    s.shutdown().unwrap();
}

#[test]
fn shutdown_ends_streams_cleanly() {
    let s = start(config());
    let a = s.addr();
    let v = ingest(a, "z", 1);
    let mut subs: Vec<Sub> = (0..4).map(|_| Sub::open(a, "/v1/boxes/z", "")).collect();
    eventually("4 subscribers", || subscribers(&s) == 4);
    s.shutdown().unwrap();
    for sub in &mut subs {
        assert_eq!(sub.next().unwrap().retry, Some(1000));
        assert_eq!(sub.event().id, Some(v));
        // Then the end of the stream: EOF, not a reset.
        assert_eq!(sub.next(), None);
    }
}
