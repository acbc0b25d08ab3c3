//! The long-poll form of a room (docs/http.md#rooms):
//! `GET /v1/boxes?prefix=P&after=W&wait_ms=N` answers what moved under P past
//! the watermark W (boxes, removed keys, the new watermark), paged with
//! `next`, or 304 at its deadline; a watermark of another run is a reset.

mod common;
use common::*;
use serde_json::Value;
use std::net::SocketAddr;

fn put(a: SocketAddr, key: &str, v: i64) {
    let r = post(
        a,
        &format!("/v1/boxes/{key}"),
        &format!(r#"{{"value":{v}}}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn after_of(a: SocketAddr) -> String {
    let r = get(a, "/v1/boxes?prefix=room%2F");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["after"]
        .as_str()
        .expect("a page's after")
        .to_string()
}

fn keys(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| b["k"].as_str().or(b.as_str()).unwrap().to_string())
        .collect()
}

/// `%2C` for the watermark's commas, as a client encoding its query does.
fn encoded(w: &str) -> String {
    w.replace(',', "%2C")
}

#[test]
fn a_long_poll_of_a_room_answers_what_moved_past_its_watermark() {
    let s = start(config());
    let a = s.addr();
    for k in ["room/a", "room/b", "room/c", "hall/x"] {
        put(a, k, 1);
    }
    let w = after_of(a);

    // Nothing moved: 304 at the deadline, with no body.
    let r = get(a, &format!("/v1/boxes?prefix=room%2F&after={w}&wait_ms=50"));
    assert_eq!(r.status, 304, "{}", r.text());
    assert!(r.body.is_empty());

    // Something moved: answered at once, with the new watermark; a move
    // elsewhere is not in it.
    put(a, "room/b", 2);
    put(a, "hall/x", 2);
    assert_eq!(delete(a, "/v1/boxes/room/c").status, 204);
    put(a, "room/d", 1);
    for after in [w.clone(), encoded(&w)] {
        let r = get(
            a,
            &format!("/v1/boxes?prefix=room%2F&after={after}&wait_ms=5000"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let j = r.json();
        assert_eq!(keys(&j["boxes"]), ["room/b", "room/d"], "{j}");
        assert_eq!(j["boxes"][0]["v"], 2);
        assert_eq!(keys(&j["deleted"]), ["room/c"]);
        assert_eq!(j["next"], Value::Null);
        assert_ne!(j["after"].as_str(), Some(w.as_str()));
    }
    let w2 = get(a, &format!("/v1/boxes?prefix=room%2F&after={w}&wait_ms=0")).json()["after"]
        .as_str()
        .unwrap()
        .to_string();

    // Parked from the new watermark: woken by the next move under the
    // prefix, not by one elsewhere.
    let waiter = std::thread::spawn(move || {
        get(
            a,
            &format!("/v1/boxes?prefix=room%2F&after={w2}&wait_ms=20000"),
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    put(a, "hall/y", 1);
    put(a, "room/a", 5);
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r.json()["boxes"]), ["room/a"]);
    s.shutdown().unwrap();
}

#[test]
fn what_moved_is_paged_and_a_watermark_not_honored_is_a_reset() {
    let s = start(config());
    let a = s.addr();
    let w = after_of(a);
    for i in 0..7 {
        put(a, &format!("room/k{i}"), i);
    }
    // Seven moved, three a page: the same watermark with each page's cursor.
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = get(
            a,
            &format!("/v1/boxes?prefix=room%2F&after={w}&limit=3{cursor}"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let j = r.json();
        let page = keys(&j["boxes"]);
        assert!(page.len() <= 3, "{j}");
        seen.extend(page);
        match j["next"].as_str() {
            Some(n) => cursor = format!("&cursor={n}"),
            None => break,
        }
    }
    let want: Vec<String> = (0..7).map(|i| format!("room/k{i}")).collect();
    assert_eq!(seen, want);

    // A watermark of another run (or another table): a page of the whole
    // room, marked a reset.
    let other = format!("1234.{}", w.split_once('.').unwrap().1);
    let r = get(
        a,
        &format!("/v1/boxes?prefix=room%2F&after={other}&wait_ms=1000"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["reset"], true);
    assert_eq!(keys(&j["boxes"]), want);

    // Not a watermark: 400 with the reason.
    let r = get(a, "/v1/boxes?prefix=room%2F&after=17&wait_ms=10");
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "after is not a watermark pollbox gave");
    s.shutdown().unwrap();
}

#[test]
fn with_rooms_off_prefix_routes_are_404_and_boxes_work_as_ever() {
    let mut c = config();
    c.boxes.rooms = false;
    let s = start(c);
    let a = s.addr();
    put(a, "room/a", 1);
    assert_eq!(get(a, "/v1/boxes/room/a").status, 200);
    for q in ["prefix=room%2F", "prefix=room%2F&after=1.0&wait_ms=10"] {
        let r = get(a, &format!("/v1/boxes?{q}"));
        assert_eq!(r.status, 404, "{}", r.text());
        assert_eq!(r.json()["error"], "rooms are off (boxes.rooms = false)");
    }
    assert_eq!(delete(a, "/v1/boxes/room/a").status, 204);
    s.shutdown().unwrap();
}

#[test]
fn prefix_streams_and_long_polls_count_against_a_clients_streams() {
    let mut c = config();
    c.limits.max_streams_per_ip = 1;
    let s = start(c);
    let a = s.addr();
    put(a, "room/a", 1);
    let mut first = Reader::new(connect(a));
    first.send(
        b"GET /v1/boxes?prefix=room%2F HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    first.read_until_contains("event: synced");
    let w = after_of(a);
    for req in [
        "GET /v1/boxes?prefix=room%2F HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"
            .to_string(),
        format!("GET /v1/boxes?prefix=room%2F&after={w}&wait_ms=20000 HTTP/1.1\r\nHost: t\r\n\r\n"),
    ] {
        let mut rd = Reader::new(connect(a));
        rd.send(req.as_bytes());
        let r = rd.read(false);
        assert_eq!(r.status, 429, "{}", r.text());
        assert_eq!(r.json()["limit"], "max_streams_per_ip");
    }
    s.shutdown().unwrap();
}

#[test]
fn a_page_built_in_steps_is_answered_in_order_with_what_is_pipelined() {
    let s = start(config());
    let a = s.addr();
    for i in 0..300 {
        put(a, &format!("room/k{i:03}"), i);
    }
    // A page of 300 (several steps), then a poll, on one connection.
    let mut rd = Reader::new(connect(a));
    rd.send(
        b"GET /v1/boxes?prefix=room%2F&limit=300 HTTP/1.1\r\nHost: t\r\n\r\n\
          GET /v1/boxes/room/k007 HTTP/1.1\r\nHost: t\r\n\r\n\
          HEAD /v1/boxes?prefix=room%2F&limit=2 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    let page = rd.read(false);
    assert_eq!(page.status, 200, "{}", page.text());
    let want: Vec<String> = (0..300).map(|i| format!("room/k{i:03}")).collect();
    assert_eq!(keys(&page.json()["boxes"]), want);
    assert_eq!(page.json()["next"], Value::Null);
    let poll = rd.read(false);
    assert_eq!(poll.status, 200);
    assert_eq!(poll.json()["k"], "room/k007");
    let head = rd.read(true);
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    s.shutdown().unwrap();
}
