//! Box lifecycle over real sockets (docs/boxes.md#lifecycle): `DELETE`, expiry after
//! `ttl_s`, parked long-polls answered 404 when their box goes, and a key
//! created again never serving an ETag or version it served before.
//! (Across a restart: `crates/pollbox/tests/durability.rs`; memory given back:
//! `memory.rs`; a box kept alive by messages: the box table's unit tests.)

mod common;
use common::*;
use std::time::{Duration, Instant};

/// Wait until `f` holds, polling; panics after 20 s (a hang, not a timing bound).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < give_up, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metric(s: &pollbox_server::Server, name: &str) -> f64 {
    let text = get(s.addr(), "/metrics").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing"))
}

/// Park 8 long-polls of `key`, each on its own connection (SO_REUSEPORT
/// spreads them over the workers, so the wake-up crosses workers), each
/// followed by a pipelined `/healthz`.
fn park(a: std::net::SocketAddr, s: &pollbox_server::Server, key: &str, after: u64) -> Vec<Reader> {
    let before = s.wakeups().parked_keys();
    let readers: Vec<Reader> = (0..8)
        .map(|_| {
            let mut r = Reader::new(connect(a));
            r.send(
                format!(
                    "GET /v1/boxes/{key}?after={after}&wait_ms=60000 HTTP/1.1\r\nHost: t\r\n\r\n\
                     GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
                )
                .as_bytes(),
            );
            r
        })
        .collect();
    let parked = || {
        s.stats()
            .iter()
            .map(|w| w.parked_polls.get() as i64)
            .sum::<i64>()
    };
    eventually("8 polls parked", || parked() >= 8);
    assert!(s.wakeups().parked_keys() > before);
    readers
}

#[test]
fn delete_answers_204_then_the_box_is_gone() {
    let s = start(config());
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/a", r#"{"value":1}"#).status, 200);
    let r = delete(a, "/v1/boxes/a");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("Content-Length"), None, "RFC 9110 §8.6");
    assert!(r.body.is_empty());
    assert_eq!(get(a, "/v1/boxes/a").status, 404);
    let r = delete(a, "/v1/boxes/a");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "no such box");
    // Keep-alive after a 204: the next request on the connection is answered.
    assert_eq!(post(a, "/v1/boxes/b", "{}").status, 200);
    let mut rd = Reader::new(connect(a));
    rd.send(b"DELETE /v1/boxes/b HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/boxes/b HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(rd.read(false).status, 204);
    assert_eq!(rd.read(false).status, 404);
    assert_eq!(s.node().boxes.len(), 0);
    assert_eq!(metric(&s, "pollbox_boxes_deleted_total"), 2.0);
    s.shutdown().unwrap();
}

#[test]
fn delete_needs_an_ingest_token_when_tokens_are_set() {
    let mut c = config();
    c.auth.ingest_tokens = vec!["t0k".into()];
    let s = start(c);
    let a = s.addr();
    let (r, _) = raw(
        a,
        b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t0k\r\nContent-Length: 2\r\n\r\n{}",
    );
    assert_eq!(r.status, 200);
    assert_eq!(delete(a, "/v1/boxes/a").status, 401);
    let (r, _) = raw(
        a,
        b"DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer wrong\r\n\r\n",
    );
    assert_eq!(r.status, 401);
    assert_eq!(get(a, "/v1/boxes/a").status, 200, "still there");
    let (r, _) = raw(
        a,
        b"DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t0k\r\n\r\n",
    );
    assert_eq!(r.status, 204);
    s.shutdown().unwrap();
}

#[test]
fn parked_long_polls_of_a_deleted_box_are_answered_404() {
    let s = start(config());
    let a = s.addr();
    let r = post(a, "/v1/boxes/hot", r#"{"value":1}"#);
    assert_eq!(r.status, 200);
    // Parked at the box's version: nothing newer to answer with.
    let mut polls = park(a, &s, "hot", r.version());
    assert_eq!(delete(a, "/v1/boxes/hot").status, 204);
    for r in &mut polls {
        let first = r.read(false);
        assert_eq!(first.status, 404, "{}", first.text());
        assert_eq!(first.json()["error"], "no such box");
        assert_eq!(r.read(false).text(), "ok", "the pipelined request follows");
    }
    eventually("no poll parked", || s.wakeups().parked_keys() == 0);
    s.shutdown().unwrap();
}

#[test]
fn a_box_with_ttl_expires_and_its_parked_polls_get_404() {
    let mut c = config();
    c.boxes.ttl_s = 1;
    let s = start(c);
    let a = s.addr();
    let r = post(a, "/v1/boxes/short", r#"{"value":1}"#);
    assert_eq!(r.status, 200);
    let mut polls = park(a, &s, "short", r.version());
    eventually("the box expires", || {
        get(a, "/v1/boxes/short").status == 404
    });
    for r in &mut polls {
        assert_eq!(r.read(false).status, 404);
        assert_eq!(r.read(false).text(), "ok");
    }
    assert_eq!(metric(&s, "pollbox_boxes_expired_total"), 1.0);
    assert_eq!(metric(&s, "pollbox_boxes"), 0.0);
    s.shutdown().unwrap();
}

#[test]
fn a_key_created_again_never_reuses_an_etag_or_a_version() {
    let s = start(config());
    let a = s.addr();
    for v in 1..=3 {
        let r = post(a, "/v1/boxes/round", &format!(r#"{{"value":{v}}}"#));
        assert_eq!(r.status, 200);
    }
    let r = get(a, "/v1/boxes/round");
    let old = r.header("ETag").expect("ETag").to_string();
    let old_version = r.json()["ver"].as_u64().expect("ver");
    assert_eq!(delete(a, "/v1/boxes/round").status, 204);
    for v in 1..=3 {
        let r = post(a, "/v1/boxes/round", &format!(r#"{{"value":{v}}}"#));
        assert_eq!(r.status, 200);
    }
    let r = get(a, "/v1/boxes/round");
    let new = r.header("ETag").expect("ETag").to_string();
    assert_ne!(new, old);
    assert!(r.json()["ver"].as_u64().expect("ver") > old_version);
    assert_eq!(r.json()["n"], 3, "a new box: its state starts over");
    let (r, _) = raw(
        a,
        format!("GET /v1/boxes/round HTTP/1.1\r\nHost: t\r\nIf-None-Match: {old}\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(r.status, 200, "the old ETag does not match the new box");
    // A long-poll from before the delete is answered at once with the new box
    // (were it parked, it would be answered 304 after max_wait_ms instead).
    let r = get(
        a,
        &format!("/v1/boxes/round?after={old_version}&wait_ms=60000"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ETag"), Some(new.as_str()));
    s.shutdown().unwrap();
}
