//! Answers, one request at a time, without a connection or a socket.

use super::testing::Recorder;
use super::*;
use crate::buffers::BufferPool;
use crate::http::{Framer, Limits, Progress};

fn service_with(edit: impl FnOnce(&mut Config)) -> Service {
    let mut config = Config::embedded();
    edit(&mut config);
    let plan = Arc::new(Plan::compile(&config.boxes).unwrap());
    let boxes = BoxTable::new(plan.clone());
    Service::new(
        Arc::new(Node::new(config, plan, boxes)),
        SystemTime::UNIX_EPOCH,
    )
}

/// Frame `req` (one complete request) and answer it.
fn ask(s: &mut Service, host: &mut Recorder, listener: Listener, req: &str) -> (Reply, String) {
    let mut buf = req.as_bytes().to_vec();
    let frame = match Framer::new(Limits::default()).advance(&mut buf).unwrap() {
        Progress::Complete(f) => f,
        p => panic!("incomplete request: {p:?}"),
    };
    let mut out = Vec::new();
    let creds = &mut crate::auth::Credentials::default();
    let request = Request {
        frame: &frame,
        buf: &buf,
        keep_alive: frame.keep_alive,
    };
    let r = s.answer(listener, request, &mut out, host, creds);
    (r, String::from_utf8(out).unwrap())
}

/// The answer to `req` on the main listener.
fn main(s: &mut Service, host: &mut Recorder, req: &str) -> String {
    ask(s, host, Listener::Main, req).1
}

fn post(key: &str, body: &str, extra: &str) -> String {
    format!(
        "POST /v1/boxes/{key} HTTP/1.1\r\nContent-Length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

#[test]
fn poll_answers_200_with_etag_then_304_for_it() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let out = main(&mut s, &mut h, "GET /v1/boxes/box-42 HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    let out = main(
        &mut s,
        &mut h,
        &post("box-42", r#"{"value":5,"player":"p-7","cargo":[1]}"#, ""),
    );
    assert!(
        out.ends_with(r#"{"k":"box-42","ver":1,"v":5,"sum":5,"n":1,"by":"p-7"}"#),
        "{out}"
    );
    assert_eq!(h.updated, vec![b"box-42".to_vec()]);
    assert_eq!(h.ingested, vec![(IngestResult::Accepted, 1)]);
    let (r, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /v1/boxes/box-42 HTTP/1.1\r\n\r\n",
    );
    assert_eq!(r, Reply::KeepAlive);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("ETag: \"1\"\r\n"),
        "{out}"
    );
    let out = main(
        &mut s,
        &mut h,
        "GET /v1/boxes/box-42 HTTP/1.1\r\nIf-None-Match: W/\"1\"\r\n\r\n",
    );
    assert!(
        out.starts_with("HTTP/1.1 304") && out.ends_with("\r\n\r\n"),
        "{out}"
    );
    let out = main(&mut s, &mut h, "HEAD /v1/boxes/box-42 HTTP/1.1\r\n\r\n");
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("\r\n\r\n"),
        "{out}"
    );
    use RouteLabel::{IngestKey, Poll};
    assert_eq!(
        h.answers,
        [
            (Poll, 404),
            (IngestKey, 200),
            (Poll, 200),
            (Poll, 304),
            (Poll, 200)
        ]
    );
}

#[test]
fn a_key_with_slashes_is_the_same_box_in_either_spelling() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let out = main(&mut s, &mut h, &post("room-17/alice", r#"{"value":5}"#, ""));
    assert!(
        out.ends_with(r#"{"k":"room-17/alice","ver":1,"v":5,"sum":5,"n":1}"#),
        "{out}"
    );
    let out = main(
        &mut s,
        &mut h,
        &post("room-17%2Falice", r#"{"value":2}"#, ""),
    );
    assert!(
        out.ends_with(r#"{"k":"room-17/alice","ver":2,"v":2,"sum":7,"n":2}"#),
        "{out}"
    );
    assert_eq!(h.updated, vec![b"room-17/alice".to_vec(); 2]);
    for path in ["room-17/alice", "room-17%2Falice", "room-17%2falice"] {
        let out = main(
            &mut s,
            &mut h,
            &format!("GET /v1/boxes/{path} HTTP/1.1\r\n\r\n"),
        );
        assert!(
            out.starts_with("HTTP/1.1 200") && out.contains("ETag: \"2\"\r\n"),
            "{path}: {out}"
        );
        let out = main(
            &mut s,
            &mut h,
            &format!("GET /v1/boxes/{path} HTTP/1.1\r\nIf-None-Match: \"2\"\r\n\r\n"),
        );
        assert!(out.starts_with("HTTP/1.1 304"), "{path}: {out}");
    }
    // A deeper key is another box.
    let out = main(
        &mut s,
        &mut h,
        "GET /v1/boxes/room-17/alice/x HTTP/1.1\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    // Segments a browser or a proxy would rewrite: 400 on every route, nothing
    // applied; percent-encoded they are one segment, and fine.
    for path in [
        "room-17//alice",
        "room-17/../alice",
        "room-17/./alice",
        "room-17/",
        "room-17/%2e%2E",
    ] {
        for req in [
            format!("GET /v1/boxes/{path} HTTP/1.1\r\n\r\n"),
            format!("DELETE /v1/boxes/{path} HTTP/1.1\r\n\r\n"),
            post(path, r#"{"value":1}"#, ""),
        ] {
            let out = main(&mut s, &mut h, &req);
            assert!(out.starts_with("HTTP/1.1 400"), "{req}: {out}");
            assert!(out.contains("%2F"), "the error says how: {out}");
        }
    }
    assert_eq!(h.updated.len(), 2, "nothing applied");
    let out = main(
        &mut s,
        &mut h,
        &post("room-17%2F..%2Falice", r#"{"value":1}"#, ""),
    );
    assert!(
        out.ends_with(r#"{"k":"room-17/../alice","ver":1,"v":1,"sum":1,"n":1}"#),
        "{out}"
    );
}

#[test]
fn long_poll_parks_only_when_the_box_has_not_moved() {
    let mut s = service_with(|c| c.limits.max_wait_ms = 1000);
    let mut h = Recorder::default();
    let (r, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /v1/boxes/a?after=0&wait_ms=99999 HTTP/1.1\r\n\r\n",
    );
    assert_eq!(
        r,
        Reply::Park {
            park: Park {
                after: 0,
                wait_ms: 1000,
                existed: false,
                many: false,
                room: false,
            },
            key: b"a".as_slice().into(),
        }
    );
    assert_eq!(out, "");
    ask(
        &mut s,
        &mut h,
        Listener::Main,
        &post("a", r#"{"value":1}"#, ""),
    );
    let (r, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /v1/boxes/a?after=0&wait_ms=10 HTTP/1.1\r\n\r\n",
    );
    assert_eq!(r, Reply::KeepAlive);
    assert!(out.starts_with("HTTP/1.1 200"));
    assert_eq!(h.answers.last(), Some(&(RouteLabel::LongPoll, 200)));
    let (r, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /v1/boxes/a?after=1&wait_ms=0 HTTP/1.1\r\n\r\n",
    );
    assert_eq!(r, Reply::KeepAlive, "wait_ms=0 answers at once");
    assert!(
        out.starts_with("HTTP/1.1 304") && out.contains("ETag: \"1\""),
        "nothing newer: {out}"
    );
    let out = main(
        &mut s,
        &mut h,
        "GET /v1/boxes/a?after=0&wait_ms=0 HTTP/1.1\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200"), "something newer: {out}");
    let out = main(
        &mut s,
        &mut h,
        "GET /v1/boxes/a?after=x&wait_ms=1 HTTP/1.1\r\n\r\n",
    );
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("after is not"),
        "{out}"
    );
    let out = main(&mut s, &mut h, "GET /v1/boxes/%ff HTTP/1.1\r\n\r\n");
    assert!(out.contains("not valid UTF-8"), "{out}");
}

#[test]
fn ingest_needs_a_token_when_tokens_are_set() {
    let mut s = service_with(|c| c.auth.ingest_tokens = vec!["t0k".into()]);
    let mut h = Recorder::default();
    let out = main(&mut s, &mut h, &post("a", r#"{"value":1}"#, ""));
    assert!(
        out.starts_with("HTTP/1.1 401") && out.contains("WWW-Authenticate: Bearer"),
        "{out}"
    );
    let out = main(
        &mut s,
        &mut h,
        &post("a", r#"{"value":1}"#, "Authorization: Bearer t0k\r\n"),
    );
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let out = main(&mut s, &mut h, "GET /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert!(
        out.starts_with("HTTP/1.1 200"),
        "polls need no token: {out}"
    );
}

#[test]
fn batch_answers_count_and_list_errors() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let body = r#"[{"key":"a","value":1},{"value":2},{"key":"b","value":"x"}]"#;
    let req = format!(
        "POST /v1/ingest HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (_, out) = ask(&mut s, &mut h, Listener::Main, &req);
    assert!(
        out.ends_with(r#"{"accepted":1,"rejected":2,"errors":[{"i":1,"error":"missing key: no member named key"},{"i":2,"error":"field v: expected an integer (i64)"}]}"#),
        "{out}"
    );
    assert_eq!(
        h.ingested,
        vec![
            (IngestResult::BadKey, 1),
            (IngestResult::WrongType, 1),
            (IngestResult::Accepted, 1)
        ]
    );
    let (_, out) = ask(&mut s, &mut h, Listener::Main, &post("a", "{", ""));
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("invalid json"),
        "{out}"
    );
    assert_eq!(h.ingested.last(), Some(&(IngestResult::InvalidBody, 1)));
}

#[test]
fn wrong_methods_get_405_with_allow() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let out = main(&mut s, &mut h, "DELETE /v1/ingest HTTP/1.1\r\n\r\n");
    assert!(
        out.starts_with("HTTP/1.1 405") && out.contains("Allow: POST\r\n"),
        "{out}"
    );
    let out = main(&mut s, &mut h, "PUT /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert!(out.contains("Allow: GET, HEAD, POST, DELETE\r\n"), "{out}");
}

#[test]
fn metrics_are_served_by_one_listener_only() {
    let mut h = Recorder::default();
    let mut together = service_with(|_| {});
    let out = main(&mut together, &mut h, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("pollbox_test 1\n"),
        "{out}"
    );

    let mut apart = service_with(|c| c.server.metrics_listen = "127.0.0.1:0".into());
    let out = main(&mut apart, &mut h, "GET /metrics HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    let out = ask(
        &mut apart,
        &mut h,
        Listener::Metrics,
        "GET /metrics HTTP/1.1\r\n\r\n",
    )
    .1;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    for path in ["/healthz", "/v1/boxes/a"] {
        let out = ask(
            &mut apart,
            &mut h,
            Listener::Metrics,
            &format!("GET {path} HTTP/1.1\r\n\r\n"),
        )
        .1;
        assert!(out.starts_with("HTTP/1.1 404"), "{path}: {out}");
    }
}

#[test]
fn answers_go_through_a_send_queue_unchanged() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let mut pool = BufferPool::new(4);
    let mut q = crate::buffers::SendQueue::default();
    let mut buf = b"GET /healthz HTTP/1.1\r\n\r\n".to_vec();
    let Progress::Complete(frame) = Framer::new(Limits::default()).advance(&mut buf).unwrap()
    else {
        panic!()
    };
    q.append(&mut pool, |out| {
        let request = Request {
            frame: &frame,
            buf: &buf,
            keep_alive: true,
        };
        s.answer(
            Listener::Main,
            request,
            out,
            &mut h,
            &mut Default::default(),
        )
    });
    let bytes: Vec<u8> = q.chunks().flatten().copied().collect();
    assert_eq!(q.pending(), bytes.len());
    assert!(bytes.ends_with(b"ok"));
}

fn header<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    let head = out.split("\r\n\r\n").next()?;
    head.split("\r\n").skip(1).find_map(|l| {
        let (n, v) = l.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then_some(v)
    })
}

#[test]
fn delete_answers_204_then_404_and_wakes_the_key() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let m = Listener::Main;
    ask(&mut s, &mut h, m, &post("a", r#"{"value":1}"#, ""));
    h.updated.clear();
    let (r, out) = ask(&mut s, &mut h, m, "DELETE /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert_eq!(r, Reply::KeepAlive);
    assert!(out.starts_with("HTTP/1.1 204 No Content\r\n"), "{out}");
    assert!(out.ends_with("\r\n\r\n"), "no body: {out}");
    assert_eq!(header(&out, "Content-Length"), None, "RFC 9110 §8.6: {out}");
    assert_eq!(h.updated, vec![b"a".to_vec()], "parked polls are woken");
    assert_eq!(h.removed, vec![(Removal::Deleted, 1)]);
    assert_eq!(s.node().boxes.len(), 0);
    let (_, out) = ask(&mut s, &mut h, m, "GET /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    let (_, out) = ask(&mut s, &mut h, m, "DELETE /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert!(
        out.starts_with("HTTP/1.1 404") && out.ends_with(r#"{"error":"no such box"}"#),
        "{out}"
    );
    let (_, out) = ask(&mut s, &mut h, m, "DELETE /v1/boxes/%zz HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert_eq!(h.removed.len(), 1, "only the real removal is counted");
    assert_eq!(
        h.answers
            .iter()
            .filter(|(r, _)| *r == RouteLabel::Delete)
            .map(|&(_, c)| c)
            .collect::<Vec<_>>(),
        [204, 404, 400]
    );
}

#[test]
fn delete_needs_an_ingest_token_when_tokens_are_set() {
    let mut s = service_with(|c| c.auth.ingest_tokens = vec!["t0k".into()]);
    let mut h = Recorder::default();
    let m = Listener::Main;
    ask(
        &mut s,
        &mut h,
        m,
        &post("a", "{}", "Authorization: Bearer t0k\r\n"),
    );
    for auth in ["", "Authorization: Bearer nope\r\n"] {
        let (_, out) = ask(
            &mut s,
            &mut h,
            m,
            &format!("DELETE /v1/boxes/a HTTP/1.1\r\n{auth}\r\n"),
        );
        assert!(out.starts_with("HTTP/1.1 401"), "{out}");
        assert_eq!(header(&out, "WWW-Authenticate"), Some("Bearer"));
    }
    assert_eq!(s.node().boxes.len(), 1);
    let (_, out) = ask(
        &mut s,
        &mut h,
        m,
        "DELETE /v1/boxes/a HTTP/1.1\r\nAuthorization: Bearer t0k\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 204"), "{out}");
}

#[test]
fn a_key_created_again_never_reuses_an_etag_or_version() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let m = Listener::Main;
    for v in 1..=3 {
        ask(
            &mut s,
            &mut h,
            m,
            &post("a", &format!(r#"{{"value":{v}}}"#), ""),
        );
    }
    let (_, out) = ask(&mut s, &mut h, m, "GET /v1/boxes/a HTTP/1.1\r\n\r\n");
    let old = header(&out, "ETag").unwrap().to_string();
    assert_eq!(old, "\"3\"");
    ask(&mut s, &mut h, m, "DELETE /v1/boxes/a HTTP/1.1\r\n\r\n");
    for v in 1..=3 {
        ask(
            &mut s,
            &mut h,
            m,
            &post("a", &format!(r#"{{"value":{v}}}"#), ""),
        );
    }
    let (_, out) = ask(&mut s, &mut h, m, "GET /v1/boxes/a HTTP/1.1\r\n\r\n");
    let new = header(&out, "ETag").unwrap();
    assert_ne!(new, old);
    assert_eq!(new, "\"6\"", "versions start past the deleted box's");
    assert!(
        out.ends_with(r#"{"k":"a","ver":6,"v":3,"sum":6,"n":3}"#),
        "a new box: its fields start over, its version does not: {out}"
    );
    let (_, out) = ask(
        &mut s,
        &mut h,
        m,
        &format!("GET /v1/boxes/a HTTP/1.1\r\nIf-None-Match: {old}\r\n\r\n"),
    );
    assert!(
        out.starts_with("HTTP/1.1 200"),
        "the old ETag is stale: {out}"
    );
    let (r, out) = ask(
        &mut s,
        &mut h,
        m,
        "GET /v1/boxes/a?after=3&wait_ms=1000 HTTP/1.1\r\n\r\n",
    );
    assert_eq!(r, Reply::KeepAlive, "answered at once, not parked");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[test]
fn boxes_expire_after_ttl_and_their_waiters_are_woken() {
    let mut s = service_with(|c| c.boxes.ttl_s = 2);
    let mut h = Recorder::default();
    let m = Listener::Main;
    s.set_now(10_500);
    ask(&mut s, &mut h, m, &post("a", "{}", ""));
    ask(&mut s, &mut h, m, &post("b", "{}", ""));
    s.set_now(12_000);
    ask(&mut s, &mut h, m, &post("b", "{}", ""));
    h.updated.clear();
    // Due from second 10 + 2 + 1: more than ttl_s after the last message.
    assert_eq!(s.expire(12_999, &mut h).removed, 0);
    assert_eq!(s.expire(13_000, &mut h).removed, 1);
    assert_eq!(h.updated, vec![b"a".to_vec()]);
    assert_eq!(h.removed, vec![(Removal::Expired, 1)]);
    let (_, out) = ask(&mut s, &mut h, m, "GET /v1/boxes/a HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    assert_eq!(s.expire(14_999, &mut h).removed, 0);
    assert_eq!(s.expire(15_000, &mut h).removed, 1);
    assert!(s.node().boxes.is_empty());
    assert_eq!(h.removed.len(), 2);
}

#[test]
fn without_ttl_nothing_expires() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    ask(&mut s, &mut h, Listener::Main, &post("a", "{}", ""));
    assert_eq!(s.expire(u64::MAX / 2, &mut h).scanned, 0);
    assert_eq!(s.node().boxes.len(), 1);
}

fn cors_service() -> Service {
    service_with(|c| {
        c.http.cors_origins = vec!["https://game.example".into()];
        c.auth.ingest_tokens = vec!["t0k".into()];
    })
}

const CORS_LINES: &str = "Access-Control-Allow-Origin: https://game.example\r\n\
                          Vary: Origin\r\nAccess-Control-Expose-Headers: ETag\r\n\r\n";

#[test]
fn answers_to_an_allowed_origin_carry_the_cors_headers() {
    let mut s = cors_service();
    let mut h = Recorder::default();
    let m = Listener::Main;
    let from = "Origin: https://game.example\r\n";
    let auth = "Authorization: Bearer t0k\r\n";
    let cases = [
        (format!("GET /v1/boxes/a HTTP/1.1\r\n{from}\r\n"), 404),
        (post("a", r#"{"value":1}"#, &format!("{from}{auth}")), 200),
        (post("a", r#"{"value":1}"#, from), 401),
        (format!("GET /v1/boxes/a HTTP/1.1\r\n{from}\r\n"), 200),
        (
            format!("GET /v1/boxes/a HTTP/1.1\r\n{from}If-None-Match: \"1\"\r\n\r\n"),
            304,
        ),
        (format!("HEAD /v1/boxes/a HTTP/1.0\r\n{from}\r\n"), 200),
        (format!("GET /nope HTTP/1.1\r\n{from}\r\n"), 404),
        (
            format!("DELETE /v1/boxes/a HTTP/1.1\r\n{from}{auth}\r\n"),
            204,
        ),
    ];
    for (req, code) in &cases {
        let (_, out) = ask(&mut s, &mut h, m, req);
        assert!(out.starts_with(&format!("HTTP/1.1 {code}")), "{req}: {out}");
        let head_end = out.find("\r\n\r\n").unwrap() + 4;
        assert!(out[..head_end].ends_with(CORS_LINES), "{req}: {out}");
    }
    // The same requests from another origin, or with none: no CORS header.
    ask(&mut s, &mut h, m, &post("a", "{}", auth));
    for other in ["Origin: https://evil.example\r\n", ""] {
        for (req, _) in &cases[..7] {
            let req = req.replace(from, other);
            let (_, out) = ask(&mut s, &mut h, m, &req);
            assert!(!out.contains("Access-Control-"), "{req}: {out}");
            assert!(!out.contains("Vary"), "{req}: {out}");
        }
    }
}

#[test]
fn a_preflight_from_an_allowed_origin_gets_204_and_others_403() {
    let mut s = cors_service();
    let mut h = Recorder::default();
    let m = Listener::Main;
    for path in ["/v1/boxes/a", "/v1/ingest", "/anything"] {
        let (r, out) = ask(
            &mut s,
            &mut h,
            m,
            &format!(
                "OPTIONS {path} HTTP/1.1\r\nOrigin: https://game.example\r\n\
                 Access-Control-Request-Method: DELETE\r\n\
                 Access-Control-Request-Headers: authorization\r\n\r\n"
            ),
        );
        assert_eq!(r, Reply::KeepAlive);
        assert!(out.starts_with("HTTP/1.1 204 No Content\r\n"), "{out}");
        assert_eq!(header(&out, "Content-Length"), None, "{out}");
        assert_eq!(
            header(&out, "Access-Control-Allow-Methods"),
            Some("GET, HEAD, POST, DELETE")
        );
        assert_eq!(
            header(&out, "Access-Control-Allow-Headers"),
            Some("Authorization, Content-Type, If-None-Match, Last-Event-ID")
        );
        assert_eq!(header(&out, "Access-Control-Max-Age"), Some("600"));
        assert_eq!(
            header(&out, "Access-Control-Allow-Origin"),
            Some("https://game.example")
        );
        assert_eq!(header(&out, "Vary"), Some("Origin"));
        assert!(out.ends_with("\r\n\r\n"), "{out}");
    }
    for origin in ["Origin: https://evil.example\r\n", ""] {
        let (_, out) = ask(
            &mut s,
            &mut h,
            m,
            &format!("OPTIONS /v1/boxes/a HTTP/1.1\r\n{origin}\r\n"),
        );
        assert!(out.starts_with("HTTP/1.1 403"), "{out}");
        assert!(!out.contains("Access-Control-"), "{out}");
    }
    let preflights: Vec<u16> = h
        .answers
        .iter()
        .filter(|(r, _)| *r == RouteLabel::Preflight)
        .map(|&(_, c)| c)
        .collect();
    assert_eq!(preflights, [204, 204, 204, 403, 403]);
}

#[test]
fn without_cors_origins_options_is_405_and_nothing_says_cors() {
    let mut s = service_with(|_| {});
    let mut h = Recorder::default();
    let (_, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "OPTIONS /v1/boxes/a HTTP/1.1\r\nOrigin: https://game.example\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    assert_eq!(header(&out, "Allow"), Some("GET, HEAD, POST, DELETE"));
    assert!(!out.contains("Access-Control-"), "{out}");
    let (_, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /healthz HTTP/1.1\r\nOrigin: https://game.example\r\n\r\n",
    );
    assert!(!out.contains("Access-Control-"), "{out}");
}

#[test]
fn star_answers_any_origin_with_star() {
    let mut s = service_with(|c| c.http.cors_origins = vec!["*".into()]);
    let mut h = Recorder::default();
    let (_, out) = ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /healthz HTTP/1.1\r\nOrigin: http://localhost:5173\r\n\r\n",
    );
    assert_eq!(header(&out, "Access-Control-Allow-Origin"), Some("*"));
    assert_eq!(header(&out, "Access-Control-Expose-Headers"), Some("ETag"));
}

#[test]
fn framing_errors_carry_no_cors_headers_from_an_earlier_request() {
    let mut s = cors_service();
    let mut h = Recorder::default();
    ask(
        &mut s,
        &mut h,
        Listener::Main,
        "GET /healthz HTTP/1.1\r\nOrigin: https://game.example\r\n\r\n",
    );
    let mut out = Vec::new();
    s.refuse(crate::http::HttpError::HeadTooLarge, &mut out, &mut h);
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("HTTP/1.1 431") && !out.contains("Access-Control-"));
}

mod access {
    use super::*;
    use crate::config::{ReadAccess, StaticTokenConfig};
    use std::time::Duration;

    fn private() -> Service {
        let mut s = service_with(|c| {
            c.auth.read = ReadAccess::Token;
            c.auth.ingest_tokens = vec!["ing".into()];
            c.auth.token = vec![StaticTokenConfig {
                token: "alice".into(),
                read: vec!["room-17/*".into()],
                write: vec!["room-17/alice".into()],
                ..Default::default()
            }];
            c.auth.jwt.keys_file = "jwks.json".into();
            c.add_jwks(include_str!("../auth/testdata/jwks.json"), "jwks.json")
                .unwrap();
        });
        s.set_time(SystemTime::UNIX_EPOCH + Duration::from_secs(1500));
        s
    }

    fn get(s: &mut Service, h: &mut Recorder, target: &str, auth: &str) -> String {
        main(
            s,
            h,
            &format!("GET {target} HTTP/1.1\r\nHost: x\r\n{auth}\r\n"),
        )
    }

    fn post(s: &mut Service, h: &mut Recorder, target: &str, auth: &str, body: &str) -> String {
        main(
            s,
            h,
            &format!(
                "POST {target} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
    }

    const ALICE: &str = "Authorization: Bearer alice\r\n";

    #[test]
    fn a_message_outside_the_scope_on_a_node_of_a_log_is_the_same_403() {
        let mut s = service_with(|c| {
            c.log.brokers = "kafka:9092".into();
            c.auth.token = vec![StaticTokenConfig {
                token: "alice".into(),
                write: vec!["room-17/alice".into()],
                ..Default::default()
            }];
        });
        let mut h = Recorder::default();
        let a = post(
            &mut s,
            &mut h,
            "/v1/boxes/room-18%2Fx",
            ALICE,
            r#"{"value":1}"#,
        );
        assert!(a.starts_with("HTTP/1.1 403 "), "{a}");
        assert!(
            a.contains("WWW-Authenticate: Bearer error=\"insufficient_scope\"\r\n"),
            "{a}"
        );
        assert!(
            a.ends_with("{\"error\":\"forbidden\",\"key\":\"room-18/x\"}"),
            "{a}"
        );
        assert!(h.produced.is_empty(), "never produced");
    }

    #[test]
    fn reads_need_a_token_with_the_scope() {
        let (mut s, mut h) = (private(), Recorder::default());
        let a = get(&mut s, &mut h, "/v1/boxes/room-17%2Fx", "");
        assert!(a.starts_with("HTTP/1.1 401 "), "{a}");
        assert!(a.contains("WWW-Authenticate: Bearer\r\n"), "{a}");
        let a = get(&mut s, &mut h, "/v1/boxes/room-17%2Fx", ALICE);
        assert!(a.starts_with("HTTP/1.1 404 "), "past the check: {a}");
        let a = get(&mut s, &mut h, "/v1/boxes/room-17/x", ALICE);
        assert!(
            a.starts_with("HTTP/1.1 404 "),
            "a slashed path is the same key: {a}"
        );
        let a = get(&mut s, &mut h, "/v1/boxes/room-18/x", ALICE);
        assert!(
            a.starts_with("HTTP/1.1 403 ") && a.ends_with("\"key\":\"room-18/x\"}"),
            "{a}"
        );
        let a = get(&mut s, &mut h, "/v1/boxes/room-18%2Fx", ALICE);
        assert!(a.starts_with("HTTP/1.1 403 "), "{a}");
        assert!(
            a.contains("WWW-Authenticate: Bearer error=\"insufficient_scope\"\r\n"),
            "{a}"
        );
        assert!(
            a.ends_with("{\"error\":\"forbidden\",\"key\":\"room-18/x\"}"),
            "{a}"
        );
        let a = get(&mut s, &mut h, "/v1/boxes?keys=room-17/a,room-18/b", ALICE);
        assert!(
            a.ends_with("{\"error\":\"forbidden\",\"key\":\"room-18/b\",\"i\":1}"),
            "{a}"
        );
        let a = get(&mut s, &mut h, "/v1/boxes?keys=room-17/a,room-17/b", ALICE);
        assert!(a.starts_with("HTTP/1.1 200 "), "{a}");
        // An ingest token writes; it does not read.
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            "Authorization: Bearer ing\r\n",
        );
        assert!(a.starts_with("HTTP/1.1 403 "), "{a}");
        // From the cookie.
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            "Cookie: a=b; pollbox_token=alice\r\n",
        );
        assert!(a.starts_with("HTTP/1.1 404 "), "{a}");
        // The query only when asked for.
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx?access_token=alice",
            "",
        );
        assert!(a.starts_with("HTTP/1.1 401 "), "{a}");
    }

    #[test]
    fn invalid_tokens_say_why() {
        let (mut s, mut h) = (private(), Recorder::default());
        let tokens: std::collections::HashMap<String, String> =
            serde_json::from_str(include_str!("../auth/testdata/tokens.json")).unwrap();
        let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            &bearer(&tokens["ed"]),
        );
        assert!(a.starts_with("HTTP/1.1 404 "), "{a}");
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            &bearer(&tokens["tampered"]),
        );
        assert!(a.starts_with("HTTP/1.1 401 "), "{a}");
        assert!(
            a.contains(
                "WWW-Authenticate: Bearer error=\"invalid_token\", \
                 error_description=\"bad signature\"\r\n"
            ),
            "{a}"
        );
        assert!(
            a.ends_with("{\"error\":\"invalid_token\",\"error_description\":\"bad signature\"}")
        );
        s.set_time(SystemTime::UNIX_EPOCH + Duration::from_secs(2100));
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            &bearer(&tokens["ed"]),
        );
        assert!(a.contains("error_description=\"expired\""), "{a}");
        let a = get(
            &mut s,
            &mut h,
            "/v1/boxes/room-17%2Fx",
            "Authorization: Bearer nope\r\n",
        );
        assert!(a.contains("error_description=\"malformed\""), "{a}");
    }

    #[test]
    fn writes_are_checked_key_by_key() {
        let (mut s, mut h) = (private(), Recorder::default());
        let one = "{\"value\":1}";
        let a = post(&mut s, &mut h, "/v1/boxes/room-17%2Falice", ALICE, one);
        assert!(a.starts_with("HTTP/1.1 200 "), "{a}");
        let a = post(&mut s, &mut h, "/v1/boxes/room-17%2Fbob", ALICE, one);
        assert!(a.starts_with("HTTP/1.1 403 "), "{a}");
        let a = post(&mut s, &mut h, "/v1/boxes/room-17%2Fbob", "", one);
        assert!(a.starts_with("HTTP/1.1 401 "), "{a}");
        let batch =
            "[{\"key\":\"room-17/alice\",\"value\":2},{\"key\":\"room-17/bob\",\"value\":3}]";
        let a = post(&mut s, &mut h, "/v1/ingest", ALICE, batch);
        assert!(
            a.ends_with(
                "{\"accepted\":1,\"rejected\":1,\"errors\":[{\"i\":1,\"error\":\"forbidden: \
                 key outside the token's write scope\"}]}"
            ),
            "{a}"
        );
        let a = post(
            &mut s,
            &mut h,
            "/v1/ingest",
            ALICE,
            "{\"key\":\"room-17/bob\",\"value\":3}",
        );
        assert!(
            a.starts_with("HTTP/1.1 403 ") && a.contains("\"key\":\"room-17/bob\""),
            "{a}"
        );
        let a = post(&mut s, &mut h, "/v1/ingest", "", batch);
        assert!(a.starts_with("HTTP/1.1 401 "), "{a}");
        let a = main(&mut s, &mut h, "DELETE /v1/boxes/room-17%2Fbob HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice\r\n\r\n");
        assert!(a.starts_with("HTTP/1.1 403 "), "{a}");
        // An ingest token writes every key, as it always did.
        let a = post(
            &mut s,
            &mut h,
            "/v1/boxes/anything",
            "Authorization: Bearer ing\r\n",
            one,
        );
        assert!(a.starts_with("HTTP/1.1 200 "), "{a}");
        let a = main(&mut s, &mut h, "DELETE /v1/boxes/room-17%2Falice HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ing\r\n\r\n");
        assert!(a.starts_with("HTTP/1.1 204 "), "{a}");
    }
}
