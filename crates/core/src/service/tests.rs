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
    let r = s.answer(listener, &frame, &buf, frame.keep_alive, &mut out, host);
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
        Reply::Park(Park {
            after: 0,
            wait_ms: 1000
        })
    );
    assert_eq!(out, "");
    assert_eq!(s.key(), b"a");
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
        out.ends_with(r#"{"accepted":1,"rejected":2,"errors":[{"i":1,"error":"missing key"},{"i":2,"error":"field v: expected an integer (i64)"}]}"#),
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
    assert!(out.contains("Allow: GET, HEAD, POST\r\n"), "{out}");
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
        s.answer(Listener::Main, &frame, &buf, true, out, &mut h)
    });
    let bytes: Vec<u8> = q.chunks().flatten().copied().collect();
    assert_eq!(q.pending(), bytes.len());
    assert!(bytes.ends_with(b"ok"));
}
