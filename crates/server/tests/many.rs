//! Many boxes on one connection (docs/http.md#many-boxes-at-once):
//! `GET /v1/boxes?keys=a,b,c`, its ETag, 304, the long-poll of many boxes,
//! its limits and CORS, over real sockets.

mod common;
use common::*;

fn ingest(a: std::net::SocketAddr, key: &str, value: i64) -> u64 {
    let r = post(
        a,
        &format!("/v1/boxes/{key}"),
        &format!(r#"{{"value":{value}}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.version()
}

fn payload(a: std::net::SocketAddr, key: &str) -> String {
    let r = get(a, &format!("/v1/boxes/{key}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
}

fn error_of(r: &Resp) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_string()
}

#[test]
fn the_payloads_in_the_order_asked_with_null_for_a_missing_box_and_one_etag() {
    let s = start(config());
    let a = s.addr();
    ingest(a, "a", 1);
    ingest(a, "c%2Fd", 3);
    let r = get(a, "/v1/boxes?keys=c%2Fd,nope,a");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert_eq!(
        r.text(),
        format!("[{},null,{}]", payload(a, "c%2Fd"), payload(a, "a"))
    );
    let etag = r.header("ETag").expect("an ETag").to_string();

    // The same boxes unchanged: 304 with the ETag, no body; HEAD: the head.
    let (same, _) = raw(
        a,
        format!(
            "GET /v1/boxes?keys=c%2Fd,nope,a HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(same.status, 304);
    assert_eq!(same.header("ETag"), Some(etag.as_str()));
    let (head, _) = raw(
        a,
        b"HEAD /v1/boxes?keys=c%2Fd,nope,a HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(head.status, 200);
    assert_eq!(head.header("ETag"), Some(etag.as_str()));
    assert_eq!(
        head.header("Content-Length"),
        Some(r.text().len().to_string().as_str())
    );

    // Any box that moves, appears or goes changes the ETag.
    let mut seen = vec![etag.clone()];
    let mut step = |what: &str| {
        let r = get(a, "/v1/boxes?keys=c%2Fd,nope,a");
        assert_eq!(r.status, 200);
        let e = r.header("ETag").expect("an ETag").to_string();
        assert!(!seen.contains(&e), "{what}: ETag {e} was served before");
        seen.push(e);
        r.text()
    };
    ingest(a, "a", 2);
    assert!(step("a moved").ends_with(&format!("{}]", payload(a, "a"))));
    ingest(a, "nope", 9);
    assert!(step("nope appeared").contains(r#""v":9"#));
    assert_eq!(delete(a, "/v1/boxes/c%2Fd").status, 204);
    assert!(step("c/d went").starts_with("[null,"));
    // The order asked is part of the answer (and of its ETag).
    let r = get(a, "/v1/boxes?keys=a,c%2Fd,nope");
    assert!(r.text().starts_with(&format!("[{},null,", payload(a, "a"))));
    assert!(!seen.contains(&r.header("ETag").unwrap().to_string()));
    s.shutdown().unwrap();
}

#[test]
fn bad_repeated_or_too_many_keys_are_400_with_the_reason() {
    let mut c = config();
    c.limits.max_keys_per_request = 3;
    let s = start(c);
    let a = s.addr();
    for (path, want) in [
        ("/v1/boxes", "keys is missing"),
        ("/v1/boxes?wait_ms=10", "keys is missing"),
        ("/v1/boxes?keys=", "keys is empty"),
        ("/v1/boxes?keys=a,,b", "key 2 of keys is empty"),
        ("/v1/boxes?keys=a,", "key 2 of keys is empty"),
        ("/v1/boxes?keys=a,b,a", "key 3 of keys is repeated"),
        ("/v1/boxes?keys=a,%61", "key 2 of keys is repeated"),
        (
            "/v1/boxes?keys=a,b%zz",
            "bad percent-encoding in key 2 of keys",
        ),
        ("/v1/boxes?keys=%ff", "key 1 of keys is not valid UTF-8"),
        ("/v1/boxes?keys=a,b,c,d", "too many keys: at most 3"),
        ("/v1/boxes?keys=a&keys=b", "keys given more than once"),
        (
            "/v1/boxes?keys=a&wait_ms=x",
            "wait_ms is not a non-negative",
        ),
    ] {
        let r = get(a, path);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(error_of(&r).contains(want), "{path}: {}", r.text());
    }
    assert_eq!(get(a, "/v1/boxes?keys=a,b,c").status, 200, "three is fine");
    let r = post(a, "/v1/boxes?keys=a", "{}");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET, HEAD"));
    // The counters name the route.
    let m = get(a, "/metrics").text();
    assert!(
        m.contains("pollbox_http_requests_total{route=\"poll\",code=\"400\"} 12"),
        "{m}"
    );
    s.shutdown().unwrap();
}

#[test]
fn a_long_poll_of_many_boxes_is_answered_when_any_of_them_moves_and_304_at_the_deadline() {
    let mut c = config();
    c.server.workers = 2;
    let s = start(c);
    let a = s.addr();
    ingest(a, "x", 1);
    let r = get(a, "/v1/boxes?keys=x,y,z");
    let etag = r.header("ETag").unwrap().to_string();
    let ask = format!(
        "GET /v1/boxes?keys=x,y,z&wait_ms=20000 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
    );
    // Parked (an ETag that is not current is answered at once).
    let (now, _) = raw(
        a,
        b"GET /v1/boxes?keys=x,y,z&wait_ms=20000 HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"1\"\r\n\r\n",
    );
    assert_eq!(now.status, 200);
    assert_eq!(now.header("ETag"), Some(etag.as_str()));
    // A box that did not exist appears: every parked poll is answered, on any
    // worker, and a request pipelined behind one is answered after it.
    let mut parked: Vec<Reader> = (0..8)
        .map(|_| {
            let mut r = Reader::new(connect(a));
            r.send(ask.as_bytes());
            r.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
            r
        })
        .collect();
    wait_parked(a, 8);
    let made = ingest(a, "z", 5);
    for r in &mut parked {
        let resp = r.read(false);
        assert_eq!(resp.status, 200, "{}", resp.text());
        assert_ne!(resp.header("ETag"), Some(etag.as_str()));
        assert!(
            resp.text()
                .ends_with(&format!(r#","ver":{made},"v":5,"sum":5,"n":1}}]"#)),
            "{}",
            resp.text()
        );
        assert_eq!(r.read(false).text(), "ok");
    }
    wait_parked(a, 0);

    // The wait runs out: 304 with the ETag; a deletion answers at once.
    let etag = get(a, "/v1/boxes?keys=x,y,z")
        .header("ETag")
        .unwrap()
        .to_string();
    let (r, _) = raw(
        a,
        format!(
            "GET /v1/boxes?keys=x,y,z&wait_ms=50 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!((r.status, r.header("ETag")), (304, Some(etag.as_str())));
    let mut waiting = Reader::new(connect(a));
    waiting.send(
        format!(
            "GET /v1/boxes?keys=x,y,z&wait_ms=20000 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
        )
        .as_bytes(),
    );
    wait_parked(a, 1);
    assert_eq!(delete(a, "/v1/boxes/x").status, 204);
    let r = waiting.read(false);
    assert_eq!(r.status, 200);
    assert!(r.text().starts_with("[null,null,"), "{}", r.text());
    wait_parked(a, 0);
    s.shutdown().unwrap();
}

#[test]
fn answers_to_an_allowed_origin_carry_cors_headers() {
    let mut c = config();
    c.http.cors_origins = vec!["https://game.example".into()];
    let s = start(c);
    let a = s.addr();
    ingest(a, "a", 1);
    let (r, _) = raw(
        a,
        b"GET /v1/boxes?keys=a,b HTTP/1.1\r\nHost: t\r\nOrigin: https://game.example\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("https://game.example")
    );
    assert_eq!(r.header("Access-Control-Expose-Headers"), Some("ETag"));
    let (r, _) = raw(
        a,
        b"GET /v1/boxes?keys=a,a HTTP/1.1\r\nHost: t\r\nOrigin: https://game.example\r\n\r\n",
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("https://game.example")
    );
    s.shutdown().unwrap();
}

/// One event of a stream, as sent (heartbeats and `retry:` skipped).
#[derive(Debug, Default, Clone, PartialEq)]
struct Ev {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

impl Ev {
    fn key(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.data).unwrap();
        v["k"].as_str().unwrap().to_string()
    }
    fn ver(&self) -> u64 {
        let v: serde_json::Value = serde_json::from_str(&self.data).unwrap();
        v["ver"].as_u64().unwrap()
    }
}

/// A subscriber of many boxes: the head, then events.
struct Sub {
    r: Reader,
    head: String,
}

impl Sub {
    fn open(a: std::net::SocketAddr, keys: &str, extra: &str) -> Sub {
        Sub::on(connect(a), keys, extra)
    }

    fn on(stream: std::net::TcpStream, keys: &str, extra: &str) -> Sub {
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let mut r = Reader::new(stream);
        r.send(
            format!(
                "GET /v1/boxes?keys={keys} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{extra}\r\n"
            )
            .as_bytes(),
        );
        let head = r.read_through("\r\n\r\n");
        Sub { r, head }
    }

    fn event(&mut self) -> Ev {
        loop {
            let block = self.r.read_through("\n\n");
            let block = block.strip_suffix("\n\n").unwrap_or(&block).to_string();
            let mut ev = Ev::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    ev.id = Some(v.into());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    ev.event = Some(v.into());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    ev.data = v.into();
                }
            }
            if !ev.data.is_empty() {
                return ev;
            }
        }
    }

    /// Events up to and with the next one that carries an id (one flush).
    fn flush(&mut self) -> Vec<Ev> {
        let mut evs = vec![self.event()];
        while evs.last().is_some_and(|e| e.id.is_none()) {
            evs.push(self.event());
        }
        evs
    }
}

#[test]
fn one_stream_sends_each_box_then_every_update_and_goes_on_past_a_deletion() {
    let s = start(config());
    let a = s.addr();
    let va = ingest(a, "a", 1);
    let vc = ingest(a, "c", 3);
    let mut sub = Sub::open(a, "a,b,c", "");
    assert!(sub.head.starts_with("HTTP/1.1 200"), "{}", sub.head);
    assert!(sub.head.contains("Content-Type: text/event-stream"));
    let first = sub.flush();
    let keys: Vec<String> = first.iter().map(Ev::key).collect();
    assert_eq!(keys, ["a", "c"], "the boxes that exist, in the order asked");
    assert_eq!(
        first[1].id.as_deref(),
        Some(format!("{va:x},,{vc:x}").as_str())
    );

    let vb = ingest(a, "b", 2);
    let ev = sub.flush();
    assert_eq!(ev.len(), 1);
    assert_eq!((ev[0].key(), ev[0].ver()), ("b".to_string(), vb));
    assert_eq!(
        ev[0].id.as_deref(),
        Some(format!("{va:x},{vb:x},{vc:x}").as_str())
    );

    assert_eq!(delete(a, "/v1/boxes/a").status, 204);
    let ev = sub.flush();
    assert_eq!(ev[0].event.as_deref(), Some("deleted"));
    assert_eq!(ev[0].data, r#"{"k":"a"}"#);
    assert_eq!(
        ev[0].id.as_deref(),
        Some(format!(",{vb:x},{vc:x}").as_str())
    );

    // The stream goes on: the key created again, and the others.
    let va2 = ingest(a, "a", 5);
    assert!(va2 > va);
    let ev = sub.flush();
    assert_eq!((ev[0].key(), ev[0].ver()), ("a".to_string(), va2));
    let vc2 = ingest(a, "c", 4);
    let ev = sub.flush();
    assert_eq!((ev[0].key(), ev[0].ver()), ("c".to_string(), vc2));
    assert_eq!(
        ev[0].id.as_deref(),
        Some(format!("{va2:x},{vb:x},{vc2:x}").as_str())
    );
    s.shutdown().unwrap();
}

#[test]
fn a_reconnecting_event_source_is_sent_only_the_boxes_that_moved_since_its_id() {
    let s = start(config());
    let a = s.addr();
    let (va, vb, vc) = (ingest(a, "a", 1), ingest(a, "b", 2), ingest(a, "c", 3));
    let mut sub = Sub::open(a, "a,b,c", "");
    let id = sub.flush().pop().unwrap().id.unwrap();
    assert_eq!(id, format!("{va:x},{vb:x},{vc:x}"));
    drop(sub);
    // While it is away: b moves, c goes.
    let vb2 = ingest(a, "b", 7);
    assert_eq!(delete(a, "/v1/boxes/c").status, 204);
    for extra in [
        format!("Last-Event-ID: {id}\r\n"),
        String::new(), // with ?last_event_id= below, commas escaped
    ] {
        let keys = if extra.is_empty() {
            format!("a,b,c&last_event_id={}", id.replace(',', "%2C"))
        } else {
            "a,b,c".to_string()
        };
        let mut sub = Sub::open(a, &keys, &extra);
        let evs = sub.flush();
        assert_eq!(evs.len(), 2, "{evs:?}");
        assert_eq!((evs[0].key(), evs[0].ver()), ("b".to_string(), vb2));
        assert_eq!(evs[1].event.as_deref(), Some("deleted"));
        assert_eq!(evs[1].data, r#"{"k":"c"}"#);
        assert_eq!(
            evs[1].id.as_deref(),
            Some(format!("{va:x},{vb2:x},").as_str())
        );
    }
    // An id that is not one of this stream's (another key count, garbage):
    // every box is sent.
    for bad in ["1,2", "x,y,z", "5"] {
        let mut sub = Sub::open(a, "a,b,c", &format!("Last-Event-ID: {bad}\r\n"));
        let keys: Vec<String> = sub.flush().iter().map(Ev::key).collect();
        assert_eq!(keys, ["a", "b"], "Last-Event-ID: {bad}");
    }
    s.shutdown().unwrap();
}

#[test]
fn a_paused_reader_gets_the_newest_payload_of_each_box_when_it_reads_again() {
    // Large payloads, so the socket's buffers fill after a few events.
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
    let mut update = |n: usize| {
        let mut ver = 0;
        for _ in 0..n {
            w.send(req.as_bytes());
            let r = w.read(false);
            assert_eq!(r.status, 200);
            ver = r.version();
        }
        ver
    };
    update(1);
    ingest(a, "other", 1);
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&a.into()).unwrap();
    let mut sub = Sub::on(sock.into(), "slow,other", "");
    // Fill the socket, then many more updates of `slow` and one of `other`.
    update(400);
    let last = update(300);
    let other = ingest(a, "other", 2);
    // It reads again: what the sockets held, then the newest of each box.
    let (mut slow_seen, mut other_seen) = (Vec::new(), Vec::new());
    while slow_seen.last() != Some(&last) || other_seen.last() != Some(&other) {
        let ev = sub.event();
        match ev.key().as_str() {
            "slow" => slow_seen.push(ev.ver()),
            _ => other_seen.push(ev.ver()),
        }
    }
    assert!(slow_seen.windows(2).all(|p| p[0] < p[1]), "increasing");
    assert!(
        slow_seen.len() < 100,
        "{} events for 701 versions: coalesced",
        slow_seen.len()
    );
    let before_last = slow_seen[slow_seen.len() - 2];
    assert!(last - before_last >= 300, "{before_last} then {last}");
    let m = get(a, "/metrics").text();
    let coalesced: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("pollbox_sse_coalesced_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(coalesced >= 300, "{coalesced} coalesced");
    drop(sub);
    s.shutdown().unwrap();
}
