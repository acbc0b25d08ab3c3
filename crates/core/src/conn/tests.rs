//! Every connection rule, without sockets: bytes in, answers and actions out.

use super::*;
use crate::boxes::BoxTable;
use crate::config::Config;
use crate::plan::Plan;
use crate::service::testing::Recorder;
use crate::service::{IngestResult, Node};
use std::sync::Arc;
use std::time::SystemTime;

/// A worker's pieces around one connection under test (the per-client
/// limits' tests use it too: `limit_tests.rs`).
pub(super) struct Rig {
    pub(super) service: Service,
    pub(super) buffers: Buffers,
    pub(super) host: Recorder,
    pub(super) now_ms: u64,
}

pub(super) fn rig_with(edit: impl FnOnce(&mut Config)) -> Rig {
    let mut config = Config::embedded();
    edit(&mut config);
    let plan = Arc::new(Plan::compile(&config.boxes).unwrap());
    let boxes = BoxTable::new(plan.clone());
    let node = Arc::new(Node::new(config, plan, boxes));
    Rig {
        service: Service::new(node, SystemTime::UNIX_EPOCH),
        buffers: Buffers::default(),
        host: Recorder::default(),
        now_ms: 1_000,
    }
}

fn rig() -> Rig {
    rig_with(|_| {})
}

impl Rig {
    pub(super) fn cx(&mut self) -> Ctx<'_, Recorder> {
        Ctx {
            now_ms: self.now_ms,
            service: &mut self.service,
            buffers: &mut self.buffers,
            host: &mut self.host,
        }
    }

    pub(super) fn conn(&self) -> Connection {
        Connection::new(self.now_ms, Listener::Main, &self.service)
    }

    /// Feed `bytes` as one read.
    pub(super) fn feed(&mut self, c: &mut Connection, bytes: &[u8]) {
        let mut cx = self.cx();
        let buf = c.read_buffer(&mut cx).expect("the connection reads");
        buf[..bytes.len()].copy_from_slice(bytes);
        c.received(bytes.len(), &mut cx);
    }

    /// Everything queued so far, as the socket would take it.
    pub(super) fn sent(&mut self, c: &mut Connection) -> String {
        let q = c.send_queue();
        let mut out = Vec::new();
        for chunk in q.chunks() {
            out.extend_from_slice(chunk);
        }
        let n = out.len();
        q.advance(n, &mut self.buffers.send);
        String::from_utf8(out).unwrap()
    }

    pub(super) fn ingest(&mut self, key: &str, value: i64) {
        let mut c = self.conn();
        let body = format!("{{\"value\":{value}}}");
        let req = format!(
            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.feed(&mut c, req.as_bytes());
        let out = self.sent(&mut c);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
}

fn statuses(out: &str) -> Vec<&str> {
    out.match_indices("HTTP/1.1 ")
        .map(|(i, _)| &out[i + 9..i + 12])
        .collect()
}

#[test]
fn http11_keeps_alive_and_close_closes_after_the_answer() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.sent(&mut c).ends_with("\r\n\r\nok"));
    assert!(!c.finished() && c.wants_read() && c.closing().is_none());

    r.feed(
        &mut c,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(!c.finished(), "not before the answer is sent");
    assert!(!c.wants_read());
    let out = r.sent(&mut c);
    assert!(out.contains("Connection: close\r\n"), "{out}");
    assert!(c.finished() && !c.shuts_down_write());
}

#[test]
fn http10_closes_unless_keep_alive_is_asked() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.0\r\n\r\n");
    assert!(r.sent(&mut c).contains("Connection: close\r\n"));
    assert!(c.finished());

    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    );
    assert!(r.sent(&mut c).contains("Connection: keep-alive\r\n"));
    assert!(!c.finished() && c.wants_read());
}

#[test]
fn draining_answers_then_closes() {
    let mut r = rig();
    let mut c = r.conn();
    r.host.draining = true;
    r.feed(&mut c, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n");
    let out = r.sent(&mut c);
    assert!(
        out.starts_with("HTTP/1.1 503") && out.contains("Connection: close"),
        "{out}"
    );
    assert!(c.finished());
}

#[test]
fn pipelined_requests_are_answered_in_order_in_one_buffer() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\nGET /readyz HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(c.send_queue().chunks().count(), 1);
    assert_eq!(statuses(&r.sent(&mut c)), ["200", "404", "200"]);
}

#[test]
fn continue_is_sent_only_when_the_body_has_not_arrived() {
    let mut r = rig();
    let mut c = r.conn();
    let head = b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n";
    r.feed(&mut c, head);
    assert_eq!(r.sent(&mut c), "HTTP/1.1 100 Continue\r\n\r\n");
    r.feed(&mut c, b"{\"value\":1}");
    assert_eq!(statuses(&r.sent(&mut c)), ["200"]);

    // Head and body in one read: no 100.
    let mut whole = head.to_vec();
    whole.extend_from_slice(b"{\"value\":2}");
    r.feed(&mut c, &whole);
    assert_eq!(statuses(&r.sent(&mut c)), ["200"]);

    // HTTP/1.0 expectations are ignored.
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"POST /v1/boxes/a HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n",
    );
    assert_eq!(r.sent(&mut c), "");
    assert_eq!(r.host.answers.iter().filter(|a| a.1 == 100).count(), 1);
}

#[test]
fn deadlines_follow_the_state() {
    let mut r = rig();
    let (idle, header, body) = (60_000, 5_000, 10_000);
    let mut c = r.conn();
    assert_eq!(c.deadline(), 1_000 + idle);

    r.now_ms = 2_000;
    r.feed(&mut c, b"GET /healthz HT");
    assert_eq!(
        c.deadline(),
        2_000 + header,
        "header timeout from the head's first byte"
    );
    r.now_ms = 3_000;
    r.feed(&mut c, b"TP/1.1\r\nHost: t\r\n");
    assert_eq!(
        c.deadline(),
        2_000 + header,
        "more head bytes do not extend it"
    );

    r.now_ms = 4_000;
    r.feed(&mut c, b"\r\n");
    r.sent(&mut c);
    assert_eq!(c.deadline(), 4_000 + idle, "idle again after the answer");

    r.feed(
        &mut c,
        b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{",
    );
    assert_eq!(c.deadline(), 4_000 + body);
    r.now_ms = 5_000;
    r.feed(&mut c, b"\"va");
    assert_eq!(
        c.deadline(),
        5_000 + body,
        "body timeout from the last progress"
    );
}

#[test]
fn a_stalled_head_gets_408_and_the_write_side_shut() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\nHost: t\r\nHo");
    r.now_ms = c.deadline() - 1;
    c.on_timer(&mut r.cx());
    assert!(!c.finished(), "not before the deadline");
    r.now_ms = c.deadline();
    c.on_timer(&mut r.cx());
    assert!(!c.shuts_down_write(), "not before the 408 is sent");
    let out = r.sent(&mut c);
    assert!(
        out.starts_with("HTTP/1.1 408") && out.contains("Connection: close"),
        "{out}"
    );
    assert_lingers(&mut r, &mut c);
}

/// After an error answer has been sent: the write side is shut, what the client
/// still sends is read and dropped, and its EOF ends the connection.
fn assert_lingers(r: &mut Rig, c: &mut Connection) {
    assert!(c.shuts_down_write() && !c.finished(), "{:?}", c.closing());
    assert!(c.wants_read(), "input is drained");
    r.feed(c, b"more of the body the client was still sending");
    assert!(!c.finished());
    assert_eq!(r.sent(c), "", "dropped, not answered");
    c.eof(&mut r.cx());
    assert!(c.finished(), "the client read the answer and closed");
}

#[test]
fn a_stalled_body_gets_408_and_an_idle_connection_just_closes() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\n{",
    );
    r.now_ms = c.deadline();
    c.on_timer(&mut r.cx());
    assert_eq!(statuses(&r.sent(&mut c)), ["408"]);

    let mut c = r.conn();
    r.now_ms = c.deadline();
    c.on_timer(&mut r.cx());
    assert!(c.finished() && c.shuts_down_write());
    assert_eq!(r.sent(&mut c), "");
}

#[test]
fn framing_errors_are_answered_then_close() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert!(!c.wants_read());
    let out = r.sent(&mut c);
    assert_eq!(
        statuses(&out),
        ["400"],
        "nothing after the error is answered"
    );
    assert!(out.contains("two different Content-Length values"), "{out}");
    assert_lingers(&mut r, &mut c);
}

#[test]
fn a_request_larger_than_any_buffer_is_refused() {
    let mut r = rig_with(|c| {
        c.limits.max_body_bytes = 1024;
        c.limits.max_header_bytes = 1024;
    });
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\nHost: t\r\n");
    let junk = vec![b'a'; 1024];
    let mut refused = false;
    for _ in 0..200 {
        let mut cx = r.cx();
        match c.read_buffer(&mut cx) {
            Some(buf) => {
                let n = buf.len().min(junk.len());
                buf[..n].copy_from_slice(&junk[..n]);
                c.received(n, &mut cx);
            }
            None => {
                refused = true;
                break;
            }
        }
    }
    assert!(refused);
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["431"], "{out}");
    assert_lingers(&mut r, &mut c);
}

#[test]
fn back_pressure_stops_reading_until_the_answers_drain() {
    let mut r = rig();
    let mut c = r.conn();
    let req = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
    while c.wants_read() {
        let mut many = Vec::new();
        for _ in 0..100 {
            many.extend_from_slice(req);
        }
        r.feed(&mut c, &many);
    }
    assert!(c.send_queue().pending() >= SEND_BACKPRESSURE);
    assert!(c.read_buffer(&mut r.cx()).is_none());
    r.sent(&mut c);
    assert!(c.wants_read());
}

#[test]
fn a_parked_poll_holds_back_pipelined_requests_until_answered() {
    let mut r = rig();
    r.ingest("a", 1);
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(seen_c.apply(&mut c).watch(), Some(&b"a"[..]));
    assert_eq!(c.deadline(), r.now_ms + 5000);
    assert!(!c.wants_read());
    assert_eq!(r.sent(&mut c), "", "nothing is answered while parked");

    // A wake-up for a box that has not moved changes nothing.
    assert!(!c.on_box_updated(&mut r.cx()));
    r.ingest("a", 7);
    assert!(c.on_box_updated(&mut r.cx()));
    assert_eq!(seen_c.apply(&mut c).watch(), None);
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["200", "200"], "{out}");
    assert!(
        out.contains("ETag: \"2\"") && out.contains("\"ver\":2"),
        "{out}"
    );
    assert!(
        out.ends_with("ok"),
        "the pipelined request comes second: {out}"
    );
    assert!(c.wants_read());
}

#[test]
fn a_parked_poll_of_a_deleted_or_expired_box_is_answered_404() {
    let mut r = rig_with(|c| c.boxes.ttl_s = 1);
    r.ingest("a", 1);
    r.ingest("b", 1);
    let mut ca = r.conn();
    let mut cb = r.conn();
    for (c, key) in [(&mut ca, "a"), (&mut cb, "b")] {
        let req = format!(
            "GET /v1/boxes/{key}?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
        );
        r.feed(c, req.as_bytes());
        assert_eq!(Applied::default().apply(c).watch(), Some(key.as_bytes()));
    }
    // DELETE on another connection: the key is woken, the poll answered 404.
    let mut d = r.conn();
    r.feed(&mut d, b"DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(statuses(&r.sent(&mut d)), ["204"]);
    assert_eq!(r.host.updated.last().map(Vec::as_slice), Some(&b"a"[..]));
    assert!(ca.on_box_updated(&mut r.cx()));
    let out = r.sent(&mut ca);
    assert_eq!(statuses(&out), ["404", "200"], "{out}");
    assert!(out.contains(r#"{"error":"no such box"}"#), "{out}");
    // Expiry: a wake-up of `b` while it still exists changes nothing ...
    assert!(!cb.on_box_updated(&mut r.cx()));
    // ... once the sweep removed it, the poll is answered 404 at once.
    let now = r.now_ms;
    assert_eq!(r.service.expire(now + 3_000, &mut r.host).removed, 1);
    assert_eq!(r.host.updated.last().map(Vec::as_slice), Some(&b"b"[..]));
    assert!(cb.on_box_updated(&mut r.cx()));
    assert_eq!(statuses(&r.sent(&mut cb)), ["404", "200"]);
}

/// Box `a` at version 1, and a connection whose long-poll waits past it.
fn parked_on_a(r: &mut Rig) -> Connection {
    r.ingest("a", 1);
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    c
}

#[test]
fn a_parked_poll_of_a_box_deleted_and_created_again_gets_the_new_incarnation() {
    let mut r = rig();
    let mut c = parked_on_a(&mut r);
    let mut d = r.conn();
    r.feed(&mut d, b"DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\n\r\n");
    r.ingest("a", 9);
    assert!(c.on_box_updated(&mut r.cx()));
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["200"], "{out}");
    assert!(out.contains("ETag: \"2\""), "{out}");
}

#[test]
fn a_parked_poll_whose_box_went_before_its_deadline_fired_is_404() {
    let mut r = rig();
    r.ingest("a", 1);
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=1&wait_ms=50 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert!(r.service.node().boxes.remove(b"a").is_some());
    r.now_ms += 50;
    c.on_timer(&mut r.cx());
    assert_eq!(statuses(&r.sent(&mut c)), ["404"]);
}

#[test]
fn a_parked_poll_times_out_with_304_and_caps_its_wait() {
    let mut r = rig_with(|c| c.limits.max_wait_ms = 100);
    let mut c = parked_on_a(&mut r);
    assert_eq!(c.deadline(), r.now_ms + 100, "max_wait_ms caps the wait");
    r.now_ms += 100;
    c.on_timer(&mut r.cx());
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["304"]);
    assert!(out.contains("ETag: \"1\""), "{out}");
    assert_eq!(c.deadline(), r.now_ms + 60_000, "idle again");
    assert_eq!(r.host.answers.last(), Some(&(RouteLabel::LongPoll, 304)));
}

#[test]
fn a_long_poll_of_a_box_already_past_is_answered_at_once() {
    let mut r = rig();
    r.ingest("a", 1);
    r.ingest("a", 2);
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(seen_c.apply(&mut c).watch(), None);
    assert_eq!(statuses(&r.sent(&mut c)), ["200"]);
}

#[test]
fn an_unknown_box_is_waited_for_and_times_out_without_a_body() {
    let mut r = rig();
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(
        &mut c,
        b"GET /v1/boxes/new?after=0&wait_ms=50 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(seen_c.apply(&mut c).watch(), Some(&b"new"[..]));
    r.now_ms += 50;
    c.on_timer(&mut r.cx());
    let out = r.sent(&mut c);
    assert!(
        out.starts_with("HTTP/1.1 304") && out.contains("Content-Length: 0\r\n"),
        "{out}"
    );
}

#[test]
fn draining_answers_parked_polls_and_closes_idle_connections() {
    let mut r = rig();
    r.ingest("a", 1);
    let mut parked = r.conn();
    r.feed(
        &mut parked,
        b"GET /v1/boxes/a?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    let mut idle = r.conn();
    r.host.draining = true;
    parked.drain(false, &mut r.cx());
    idle.drain(false, &mut r.cx());
    assert!(idle.finished());
    let out = r.sent(&mut parked);
    assert!(
        out.starts_with("HTTP/1.1 304") && out.contains("Connection: close"),
        "{out}"
    );
    assert!(parked.finished());

    let mut busy = r.conn();
    r.feed(&mut busy, b"GET /healthz HTTP/1.1\r\nHost: t\r\n");
    busy.drain(false, &mut r.cx());
    assert!(!busy.finished(), "a request in flight may finish");
    busy.drain(true, &mut r.cx());
    assert!(
        busy.finished() && busy.shuts_down_write(),
        "unless the drain is overdue"
    );
}

#[test]
fn eof_answers_what_came_then_closes() {
    let mut r = rig();
    let mut c = r.conn();
    let mut cx = r.cx();
    let buf = c.read_buffer(&mut cx).unwrap();
    let req = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n";
    buf[..req.len()].copy_from_slice(req);
    c.received(req.len(), &mut cx);
    c.eof(&mut cx);
    assert!(!c.finished());
    assert_eq!(statuses(&r.sent(&mut c)), ["200"]);
    assert!(c.finished());
}

#[test]
fn idle_connections_hold_no_read_buffer_and_release_returns_everything() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(
        c.buffer_bytes().0,
        0,
        "the read buffer went back between requests"
    );
    assert!(c.buffer_bytes().1 > 0, "the answer is queued");
    r.feed(&mut c, b"GET /hea");
    assert!(c.buffer_bytes().0 > 0);
    c.release(&mut r.cx());
    assert_eq!(c.buffer_bytes(), (0, 0));
    assert!(r.buffers.pooled_bytes() > 0 && r.buffers.send.pooled_bytes() > 0);
    assert_eq!(r.buffers.read_held(), 0, "every read buffer came back");
}

#[test]
fn a_parked_poll_whose_client_hung_up_is_dropped_at_once() {
    let mut r = rig();
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=0&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert!(seen_c.apply(&mut c).watch().is_some());
    c.peer_hung_up();
    assert_eq!(seen_c.apply(&mut c).watch(), None);
    assert!(c.finished());
    assert_eq!(r.sent(&mut c), "", "nobody reads it: no answer");

    // Not parked: nothing changes (the read path sees the EOF).
    let mut c = r.conn();
    c.peer_hung_up();
    assert!(!c.finished());
}

#[test]
fn a_park_answered_at_once_still_answers_what_was_pipelined_behind_it() {
    // The worker registers the park, then looks again (an ingest may have landed
    // in between): the answer and everything behind it go out, in order.
    let mut r = rig();
    r.ingest("a", 1);
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=1&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/boxes/a HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert!(seen_c.apply(&mut c).watch().is_some());
    r.ingest("a", 2);
    assert!(c.on_box_updated(&mut r.cx()));
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["200", "200", "200"], "{out}");
    assert!(c.wants_read() && seen_c.apply(&mut c).watch().is_none());
}

#[test]
fn http11_needs_exactly_one_host() {
    let mut r = rig();
    for (req, want) in [
        (&b"GET /healthz HTTP/1.1\r\n\r\n"[..], "without a Host"),
        (
            b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "more than one Host",
        ),
        (
            b"GET /healthz HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n",
            "more than one Host",
        ),
    ] {
        let mut c = r.conn();
        r.feed(&mut c, req);
        let out = r.sent(&mut c);
        assert!(
            out.starts_with("HTTP/1.1 400") && out.contains(want),
            "{out}"
        );
        assert!(out.contains("Connection: close"), "{out}");
        assert_lingers(&mut r, &mut c);
    }
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.0\r\n\r\n");
    assert!(
        r.sent(&mut c).starts_with("HTTP/1.1 200"),
        "HTTP/1.0 may omit it"
    );
}

/// The Host rule needs only the head: a request that breaks it is refused as
/// soon as its head is in, not after its body (nor told 100 Continue first).
#[test]
fn the_host_rule_is_applied_before_the_body() {
    let mut r = rig();
    for (req, want) in [
        (
            &b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"[..],
            "without a Host",
        ),
        (
            b"POST /v1/boxes/a HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n",
            "without a Host",
        ),
        (
            b"POST /v1/boxes/a HTTP/1.1\r\nHost: a\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n",
            "more than one Host",
        ),
    ] {
        let mut c = r.conn();
        r.feed(&mut c, req);
        let out = r.sent(&mut c);
        assert!(
            out.starts_with("HTTP/1.1 400") && out.contains(want),
            "{out:?}"
        );
        assert!(!out.contains("100 Continue"), "{out:?}");
        assert_lingers(&mut r, &mut c);
    }
    // HTTP/1.0 may omit it: the body is waited for.
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"POST /v1/boxes/a HTTP/1.0\r\nContent-Length: 11\r\n\r\n",
    );
    assert_eq!(r.sent(&mut c), "");
    r.feed(&mut c, b"{\"value\":1}");
    assert_eq!(statuses(&r.sent(&mut c)), ["200"]);
}

#[test]
fn a_linger_is_bounded_in_bytes_and_in_time() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\n\r\n");
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 400"));
    assert_eq!(c.deadline(), r.now_ms + LINGER_MS);
    // A client that never stops sending is cut off after LINGER_BYTES.
    let mut fed = 0;
    while !c.finished() {
        let mut cx = r.cx();
        let buf = c.read_buffer(&mut cx).expect("draining");
        let n = buf.len();
        c.received(n, &mut cx);
        fed += n;
        assert!(fed <= LINGER_BYTES + crate::buffers::READ_BUF, "unbounded");
    }
    assert!(fed >= LINGER_BYTES);

    // One that sends slowly is cut off at the deadline.
    let mut c = r.conn();
    r.feed(&mut c, b"GET /healthz HTTP/1.1\r\n\r\n");
    r.sent(&mut c);
    r.feed(&mut c, b"x");
    r.now_ms = c.deadline();
    c.on_timer(&mut r.cx());
    assert!(c.finished());
}

#[test]
fn a_connection_past_the_budget_waits_unread_and_polls_go_on() {
    let mut r = rig();
    r.buffers = Buffers::new(8 * crate::buffers::READ_BUF);
    // A large body grows its buffer until the budget (less its reserve) stops it.
    let mut big = r.conn();
    r.feed(
        &mut big,
        b"POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\nContent-Length: 900000\r\n\r\n",
    );
    let mut fed = 0;
    loop {
        let mut cx = r.cx();
        let Some(buf) = big.read_buffer(&mut cx) else {
            break;
        };
        let n = buf.len();
        big.received(n, &mut cx);
        fed += n;
        assert!(fed < 900_000, "never stopped");
    }
    assert!(big.starved() && big.wants_read() && !big.finished());
    assert!(r.buffers.read_held() <= 7 * crate::buffers::READ_BUF);
    // Others still get a first buffer, and give it back between requests.
    let mut poll = r.conn();
    r.feed(&mut poll, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(r.sent(&mut poll).ends_with("ok"));
    // Once the big one is gone, its bytes are back.
    big.release(&mut r.cx());
    assert_eq!(r.buffers.read_held(), 0);
}

// Event streams (docs/http.md#event-streams).

const SUBSCRIBE: &str = "GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n";

/// The `id:` of every event in `out`.
fn event_ids(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn a_stream_starts_with_its_head_retry_and_the_box_as_it_is() {
    let mut r = rig_with(|c| c.http.sse_retry_ms = 2500);
    r.ingest("a", 5);
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    let out = r.sent(&mut c);
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        head.contains("\r\nContent-Type: text/event-stream\r\n"),
        "{out}"
    );
    assert!(head.contains("\r\nCache-Control: no-cache\r\n"), "{out}");
    assert!(!head.contains("Content-Length"), "{out}");
    assert_eq!(
        body,
        "retry: 2500\n\nid: 1\ndata: {\"k\":\"a\",\"ver\":1,\"v\":5,\"sum\":5,\"n\":1}\n\n"
    );
    assert!(c.streaming() && !c.wants_read() && !c.finished());
    assert_eq!(seen_c.apply(&mut c).watch(), Some(&b"a"[..]));
    assert_eq!(r.host.answers.last(), Some(&(RouteLabel::Sse, 200)));
    assert_eq!(r.host.sse_events, [0]);

    // Each update is one event.
    r.ingest("a", 6);
    assert!(c.on_box_updated(&mut r.cx()));
    let out = r.sent(&mut c);
    assert!(
        out.starts_with("id: 2\ndata: {\"k\":\"a\",\"ver\":2,"),
        "{out}"
    );
    assert!(out.ends_with("}\n\n"), "{out}");
    // A wake-up with nothing new sends nothing.
    assert!(!c.on_box_updated(&mut r.cx()));
    assert!(c.send_queue().is_empty());
}

#[test]
fn a_stream_resumes_after_last_event_id_and_waits_for_an_unknown_box() {
    let mut r = rig();
    r.ingest("a", 1);
    r.ingest("a", 2);
    // Up to date: nothing at once.
    for (req, next) in [
        ("GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\nLast-Event-ID: 2\r\n\r\n", 3),
        ("GET /v1/boxes/a?last_event_id=3 HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n", 4),
    ] {
        let mut c = r.conn();
        r.feed(&mut c, req.as_bytes());
        assert!(event_ids(&r.sent(&mut c)).is_empty());
        r.ingest("a", 3);
        assert!(c.on_box_updated(&mut r.cx()));
        assert_eq!(event_ids(&r.sent(&mut c)), [next]);
    }
    // Behind: the newest version at once (the header wins over the query).
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?last_event_id=99 HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\nLast-Event-ID: 1\r\n\r\n",
    );
    assert_eq!(event_ids(&r.sent(&mut c)), [4]);

    // An unknown box: waited for, sent when created.
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/new HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    let out = r.sent(&mut c);
    assert!(out.ends_with("retry: 1000\n\n"), "{out}");
    assert!(
        !c.on_box_updated(&mut r.cx()),
        "still unknown: no event, no end"
    );
    assert!(!c.finished());
    r.ingest("new", 7);
    assert!(c.on_box_updated(&mut r.cx()));
    assert_eq!(event_ids(&r.sent(&mut c)), [1]);
}

#[test]
fn a_slow_subscriber_is_queued_only_the_newest_version() {
    let mut r = rig();
    r.ingest("a", 1);
    let mut c = r.conn();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    // The client reads nothing: the head and the first event stay queued.
    let queued = c.send_queue().pending();
    for v in 2..=50 {
        r.ingest("a", v);
        assert!(!c.on_box_updated(&mut r.cx()), "nothing more is queued");
        assert_eq!(c.send_queue().pending(), queued);
    }
    assert!(c.stream_dirty());
    // Nothing drained yet: nothing to send.
    assert!(!c.on_send_drained(&mut r.cx()));
    // The socket takes the queue: the newest version goes next, once.
    let first = r.sent(&mut c);
    assert_eq!(event_ids(&first), [1]);
    assert!(c.on_send_drained(&mut r.cx()));
    assert!(!c.stream_dirty());
    let out = r.sent(&mut c);
    assert_eq!(event_ids(&out), [50]);
    assert!(out.contains("\"ver\":50,\"v\":50,"), "{out}");
    // 48 versions (2..=49) were skipped.
    assert_eq!(r.host.sse_events, [0, 48]);
    assert!(!c.on_send_drained(&mut r.cx()));
}

#[test]
fn an_idle_stream_sends_heartbeats_but_not_behind_unread_bytes() {
    let mut r = rig_with(|c| c.http.sse_heartbeat_ms = 5_000);
    r.ingest("a", 1);
    let mut c = r.conn();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    assert_eq!(c.deadline(), r.now_ms + 5_000);
    // Not due: nothing.
    r.now_ms += 4_999;
    c.on_timer(&mut r.cx());
    // Due, but the client has not read the head yet: no heartbeat, next one later.
    r.now_ms += 1;
    let queued = c.send_queue().pending();
    c.on_timer(&mut r.cx());
    assert_eq!(c.send_queue().pending(), queued);
    assert_eq!(c.deadline(), r.now_ms + 5_000);
    r.sent(&mut c);
    r.now_ms += 5_000;
    c.on_timer(&mut r.cx());
    assert_eq!(r.sent(&mut c), ":\n\n");
    assert!(!c.finished(), "no idle timeout for a stream");
    // An event moves the next heartbeat.
    r.now_ms += 1_000;
    r.ingest("a", 2);
    assert!(c.on_box_updated(&mut r.cx()));
    assert_eq!(event_ids(&r.sent(&mut c)), [2]);
    assert_eq!(c.deadline(), r.now_ms + 5_000);
    // Even far past the idle timeout, the stream stays.
    for _ in 0..20 {
        r.now_ms += 5_000;
        c.on_timer(&mut r.cx());
        assert_eq!(r.sent(&mut c), ":\n\n");
    }
    assert!(c.streaming() && !c.finished());
}

#[test]
fn a_deleted_or_expired_box_ends_its_stream_with_event_deleted() {
    let mut r = rig_with(|c| c.boxes.ttl_s = 1);
    r.ingest("a", 1);
    r.ingest("b", 1);
    let mut ca = r.conn();
    let mut seen_ca = Applied::default();
    r.feed(&mut ca, SUBSCRIBE.as_bytes());
    let mut cb = r.conn();
    r.feed(
        &mut cb,
        b"GET /v1/boxes/b HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    r.sent(&mut ca);
    r.sent(&mut cb);
    let mut d = r.conn();
    r.feed(&mut d, b"DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(statuses(&r.sent(&mut d)), ["204"]);
    assert!(ca.on_box_updated(&mut r.cx()));
    assert!(seen_ca.apply(&mut ca).watch().is_none() && !ca.streaming());
    assert!(!ca.finished(), "not before the event is sent");
    assert_eq!(r.sent(&mut ca), "event: deleted\ndata: \n\n");
    assert!(ca.finished() && !ca.shuts_down_write());

    // Expiry, even behind unread bytes.
    r.ingest("b", 2);
    assert!(cb.on_box_updated(&mut r.cx()));
    let now = r.now_ms;
    assert_eq!(r.service.expire(now + 3_000, &mut r.host).removed, 1);
    assert!(cb.on_box_updated(&mut r.cx()));
    let out = r.sent(&mut cb);
    assert!(
        out.starts_with("id: 2\n") && out.ends_with("event: deleted\ndata: \n\n"),
        "{out}"
    );
    assert!(cb.finished());
}

#[test]
fn shutdown_ends_streams_after_what_is_queued_and_a_hang_up_at_once() {
    let mut r = rig();
    r.ingest("a", 1);
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    r.host.draining = true;
    c.drain(false, &mut r.cx());
    assert!(seen_c.apply(&mut c).watch().is_none() && !c.finished());
    assert_eq!(event_ids(&r.sent(&mut c)), [1]);
    assert!(c.finished() && !c.shuts_down_write());
    r.ingest("a", 2);
    assert!(
        !c.on_box_updated(&mut r.cx()),
        "an ended stream sends nothing"
    );

    r.host.draining = false;
    let mut c = r.conn();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    c.peer_hung_up();
    assert!(c.finished() && seen_c.apply(&mut c).watch().is_none());
    let mut c = r.conn();
    r.feed(&mut c, SUBSCRIBE.as_bytes());
    c.drain(true, &mut r.cx());
    assert!(c.finished() && c.shuts_down_write());
}

#[test]
fn only_get_with_accept_event_stream_subscribes() {
    let mut r = rig();
    r.ingest("a", 1);
    for req in [
        "GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: application/json\r\n\r\n",
        "HEAD /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    ] {
        let mut c = r.conn();
        r.feed(&mut c, req.as_bytes());
        let out = r.sent(&mut c);
        assert!(out.contains("Content-Type: application/json"), "{out}");
        assert!(!c.streaming() && c.wants_read());
    }
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\nAccept: text/html, TEXT/Event-Stream;q=0.9\r\n\r\n",
    );
    assert!(c.streaming());
    // A bad key or query is still a 400, not a stream.
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?last_event_id=x HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    assert_eq!(statuses(&r.sent(&mut c)), ["400"]);
    assert!(!c.streaming());
}

// A node of a log: ingest and DELETE produce, then wait for their records.

fn log_rig() -> Rig {
    rig_with(|c| c.log.brokers = "kafka:9092".into())
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// What the consuming thread does with a produced record: apply it at a
/// version past everything so far, and say how it went.
fn consume(r: &mut Rig, i: usize, version: u64) -> Report {
    let (_, _, key, value) = r.host.produced[i].clone();
    let key = String::from_utf8(key).unwrap();
    let boxes = &r.service.node().boxes;
    let Some(value) = value else {
        return match boxes.remove_logged(key.as_bytes(), version, 0) {
            Some(_) => Report::Applied,
            None => Report::NoBox,
        };
    };
    let mut replica = crate::log::Replica::new(r.service.node().plan.clone(), 1 << 20, 1);
    let rec = crate::log::Record {
        partition: 0,
        offset: version as i64 - 1,
        timestamp_ms: 0,
        key: Some(key.as_bytes()),
        value: Some(&value),
        headers: Default::default(),
    };
    match replica.apply(boxes, &rec, &mut Vec::new(), &mut r.host) {
        crate::log::Outcome::Invalid(crate::log::Invalid::Message(e)) => Report::Refused(e),
        crate::log::Outcome::Invalid(other) => panic!("{other:?}"),
        _ => Report::Applied,
    }
}

#[test]
fn a_logged_ingest_is_answered_once_its_record_is_applied_here() {
    let mut r = log_rig();
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    // A poll pipelined behind it waits for it: answers keep request order.
    let req = post("/v1/boxes/r", r#"{"value":5,"key":"ignored","cargo":[1]}"#)
        + "GET /v1/boxes/r HTTP/1.1\r\nHost: x\r\n\r\n";
    r.feed(&mut c, req.as_bytes());
    assert_eq!(r.sent(&mut c), "", "nothing before the log has it");
    assert!(!c.wants_read());
    let request = seen_c.apply(&mut c).awaiting().expect("waits for the log");
    assert_eq!(r.host.produced.len(), 1);
    let (req_id, index, key, value) = r.host.produced[0].clone();
    assert_eq!((req_id, index), (request, 0));
    assert_eq!(key, b"r");
    assert_eq!(
        value.as_deref(),
        Some(br#"{"value":5,"key":"ignored","cargo":[1]}"#.as_slice()),
        "the record's value is the message as sent"
    );
    assert!(
        r.service.node().boxes.version(b"r").is_none(),
        "not applied by the ingest"
    );
    let report = consume(&mut r, 0, 8);
    let mut cx = r.cx();
    assert!(c.on_log_report(0, report, &mut cx));
    let out = r.sent(&mut c);
    let first = out.find("HTTP/1.1 200").unwrap();
    assert!(
        out.contains(r#"{"k":"r","ver":8,"v":5,"sum":5,"n":1}"#),
        "{out}"
    );
    assert_eq!(out.matches("HTTP/1.1 200").count(), 2, "{out}");
    assert_eq!(first, 0);
    assert_eq!(seen_c.apply(&mut c).awaiting(), None);
    assert!(r.host.ingested.contains(&(IngestResult::Accepted, 1)));
}

#[test]
fn a_logged_batch_is_checked_before_the_log_and_counted_after_it() {
    let mut r = log_rig();
    let mut c = r.conn();
    let body = r#"[{"key":"a","value":1},{"value":2},{"key":"b","value":"x"},{"key":"c","value":9223372036854775807},{"key":"c","value":1}]"#;
    r.feed(&mut c, post("/v1/ingest", body).as_bytes());
    assert_eq!(r.sent(&mut c), "");
    // Only the three valid messages reach the log, each with its own bytes.
    let keys: Vec<_> = r.host.produced.iter().map(|p| (p.1, p.2.clone())).collect();
    assert_eq!(
        keys,
        [(0, b"a".to_vec()), (3, b"c".to_vec()), (4, b"c".to_vec())]
    );
    assert_eq!(
        r.host.produced[1].3.as_deref(),
        Some(br#"{"key":"c","value":9223372036854775807}"#.as_slice())
    );
    let mut answered = false;
    for (i, version) in [(0, 1), (1, 2), (2, 3)] {
        let report = consume(&mut r, i, version);
        let index = r.host.produced[i].1;
        let mut cx = r.cx();
        answered = c.on_log_report(index, report, &mut cx);
    }
    assert!(answered);
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.ends_with(r#"{"accepted":2,"rejected":3,"errors":[{"i":1,"error":"missing key: no member named key"},{"i":2,"error":"field v: expected an integer (i64)"},{"i":4,"error":"field sum: sum overflows"}]}"#),
        "{out}"
    );
}

#[test]
fn a_logged_batchs_records_reported_together_answer_once_all_are_counted() {
    let mut r = log_rig();
    let mut c = r.conn();
    let body = r#"[{"key":"a","value":1},{"key":"b","value":2},{"key":"c","value":3},{"key":"d","value":4}]"#;
    r.feed(&mut c, post("/v1/ingest", body).as_bytes());
    assert_eq!(r.sent(&mut c), "");
    assert_eq!(r.host.produced.len(), 4);
    for i in 0..4 {
        assert_eq!(consume(&mut r, i, 1), Report::Applied);
    }
    // Three records in one report, then the last: answered once all four are.
    let mut cx = r.cx();
    assert!(!c.on_log_reports(0, Report::Applied, 3, &mut cx));
    assert_eq!(r.sent(&mut c), "");
    // A count past the records left counts only those.
    let mut cx = r.cx();
    assert!(c.on_log_reports(3, Report::Applied, 9, &mut cx));
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        out.ends_with(r#"{"accepted":4,"rejected":0,"errors":[]}"#),
        "{out}"
    );
    assert!(r.host.ingested.contains(&(IngestResult::Accepted, 4)));
}

#[test]
fn a_log_that_takes_nothing_or_answers_too_late_is_503() {
    let mut r = log_rig();
    r.host.log_down = true;
    let mut c = r.conn();
    r.feed(&mut c, post("/v1/boxes/k", r#"{"value":1}"#).as_bytes());
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert!(out.ends_with(r#"{"error":"log unavailable"}"#), "{out}");
    assert!(r.host.ingested.contains(&(IngestResult::LogUnavailable, 1)));

    // Taken, never acknowledged: 503 at log.ack_timeout_ms.
    r.host.log_down = false;
    let mut c = r.conn();
    r.feed(&mut c, post("/v1/boxes/k", r#"{"value":1}"#).as_bytes());
    assert_eq!(r.sent(&mut c), "");
    let timeout = r.service.node().config.log.ack_timeout_ms;
    assert_eq!(c.deadline(), r.now_ms + timeout);
    r.now_ms += timeout;
    let mut cx = r.cx();
    c.on_timer(&mut cx);
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    // A report after the answer changes nothing.
    let mut cx = r.cx();
    assert!(!c.on_log_report(0, Report::Applied, &mut cx));
    assert_eq!(r.sent(&mut c), "");
}

#[test]
fn a_logged_delete_produces_a_tombstone_for_a_box_that_exists() {
    let mut r = log_rig();
    let mut c = r.conn();
    r.feed(&mut c, b"DELETE /v1/boxes/gone HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        r.sent(&mut c).starts_with("HTTP/1.1 404"),
        "unknown: not produced"
    );
    assert!(r.host.produced.is_empty());
    r.service
        .node()
        .boxes
        .apply_logged("d", &[None, None, None, None], (3, 0), 0, None)
        .unwrap();
    r.feed(&mut c, b"DELETE /v1/boxes/d HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.sent(&mut c), "");
    assert_eq!(r.host.produced[0].2, b"d");
    assert_eq!(r.host.produced[0].3, None, "a tombstone");
    let report = consume(&mut r, 0, 4);
    let mut cx = r.cx();
    assert!(c.on_log_report(0, report, &mut cx));
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 204"));
    assert!(r.service.node().boxes.version(b"d").is_none());
}

#[test]
fn past_max_connections_a_connection_is_served_its_probe_and_nothing_else() {
    let mut r = rig();
    for probe in ["/healthz", "/readyz"] {
        let mut c = Connection::new(r.now_ms, Listener::Probes, &r.service);
        r.feed(
            &mut c,
            format!("GET {probe} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        );
        let out = r.sent(&mut c);
        assert!(out.starts_with("HTTP/1.1 200"), "{probe}: {out}");
        assert!(
            out.contains("Connection: close\r\n"),
            "one probe a connection: {out}"
        );
        assert!(c.finished());
    }
    // Anything else: 503 and the close, counted.
    let mut c = Connection::new(r.now_ms, Listener::Probes, &r.service);
    r.feed(&mut c, b"GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\n\r\n");
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert!(
        out.ends_with(r#"{"error":"too many connections"}"#),
        "{out}"
    );
    assert!(c.finished());
    assert_eq!(r.host.over_cap, 1);
    // Silent: refused as before, a moment later; bytes do not extend it.
    let mut c = Connection::new(r.now_ms, Listener::Probes, &r.service);
    r.feed(&mut c, b"GET /heal");
    assert_eq!(c.deadline(), r.now_ms + PROBE_WAIT_MS);
    r.now_ms += PROBE_WAIT_MS;
    c.on_timer(&mut r.cx());
    let out = r.sent(&mut c);
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    assert_eq!(r.host.over_cap, 2);
}

/// Reads need a token: the test key set (nbf 1000, exp 2000, leeway 30 in
/// its tokens), a static token `alice`, and the ingest token `ing`.
fn private_rig() -> Rig {
    let mut r = rig_with(|c| {
        c.auth.read = crate::config::ReadAccess::Token;
        c.auth.ingest_tokens = vec!["ing".into()];
        c.auth.token = vec![crate::config::StaticTokenConfig {
            token: "alice".into(),
            read: vec!["*".into()],
            ..Default::default()
        }];
        c.auth.jwt.keys_file = "jwks.json".into();
        c.add_jwks(crate::auth::jwks::tests::JWKS, "jwks.json")
            .unwrap();
    });
    r.set_wall_s(2020);
    r
}

/// A signed token of the test set (crates/core/src/auth/testdata).
fn signed(kid: &str) -> String {
    let tokens: std::collections::HashMap<String, String> =
        serde_json::from_str(include_str!("../auth/testdata/tokens.json")).unwrap();
    tokens[kid].clone()
}

impl Rig {
    fn set_wall_s(&mut self, s: u64) {
        self.service
            .set_time(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s));
    }

    fn ingest_with_token(&mut self, key: &str, value: i64) {
        let mut c = self.conn();
        let body = format!("{{\"value\":{value}}}");
        let req = format!(
            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ing\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.feed(&mut c, req.as_bytes());
        let out = self.sent(&mut c);
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }

    /// The key set read again without the key `kid`; the static token
    /// becomes `static_token`.
    fn reread(&mut self, without: &str, static_token: &str) {
        let node = self.service.node();
        let mut auth = node.config.auth.clone();
        let mut set: serde_json::Value =
            serde_json::from_str(crate::auth::jwks::tests::JWKS).unwrap();
        set["keys"]
            .as_array_mut()
            .unwrap()
            .retain(|k| k["kid"] != without);
        auth.jwt.keys = set.to_string();
        auth.token[0].token = static_token.into();
        node.access
            .replace(crate::auth::Access::new(&auth).unwrap());
        assert!(self.service.follow_access());
        assert!(!self.service.follow_access(), "taken once");
    }
}

#[test]
fn a_parked_poll_whose_token_expires_is_answered_401_then_what_follows() {
    let mut r = private_rig();
    r.ingest_with_token("room-17%2Fa", 1);
    let auth = format!("Authorization: Bearer {}\r\n", signed("es"));
    let mut c = r.conn();
    let mut seen_c = Applied::default();
    let poll = format!("GET /v1/boxes/room-17%2Fa?after=999999999999999999&wait_ms=30000 HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
    let next = format!("GET /v1/boxes/room-17%2Fa HTTP/1.1\r\nHost: x\r\n{auth}\r\n");
    r.feed(&mut c, format!("{poll}{next}").as_bytes());
    assert!(seen_c.apply(&mut c).watch().is_some(), "parked");
    assert!(c.holds_token());
    // exp 2000 plus 30 s of leeway: 10 s from 2020, before the wait's 30 s.
    assert_eq!(c.deadline(), r.now_ms + 10_000);
    r.now_ms += 10_000;
    r.set_wall_s(2030);
    c.on_timer(&mut r.cx());
    let out = r.sent(&mut c);
    assert_eq!(statuses(&out), ["401", "401"], "{out}");
    assert!(
        out.contains(
            "WWW-Authenticate: Bearer error=\"invalid_token\", error_description=\"expired\"\r\n"
        ),
        "{out}"
    );
    assert!(out.contains("{\"error\":\"invalid_token\",\"error_description\":\"expired\"}"));
    assert!(seen_c.apply(&mut c).watch().is_none() && !c.finished() && c.wants_read());
    assert_eq!(r.host.answers.last(), Some(&(RouteLabel::Poll, 401)));
    assert!(r.host.answers.contains(&(RouteLabel::LongPoll, 401)));
}

#[test]
fn a_token_end_that_comes_early_by_the_wall_clock_rearms_and_a_static_token_never_ends() {
    let mut r = private_rig();
    r.ingest_with_token("room-17%2Fa", 1);
    let mut c = r.conn();
    let auth = format!("Authorization: Bearer {}\r\n", signed("ed"));
    r.feed(
        &mut c,
        format!("GET /v1/boxes/room-17%2Fa HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{auth}\r\n")
            .as_bytes(),
    );
    r.sent(&mut c);
    assert_eq!(c.deadline(), r.now_ms + 10_000);
    // The wall clock went back 5 s meanwhile: the token holds 5 s more.
    r.now_ms += 10_000;
    r.set_wall_s(2025);
    c.on_timer(&mut r.cx());
    assert!(r.sent(&mut c).is_empty() && c.streaming());
    assert_eq!(c.deadline(), r.now_ms + 5_000);

    let mut s = r.conn();
    r.feed(
        &mut s,
        b"GET /v1/boxes/room-17%2Fa HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nAuthorization: Bearer alice\r\n\r\n",
    );
    r.sent(&mut s);
    assert!(s.holds_token());
    assert_eq!(s.deadline(), r.now_ms + 15_000, "its heartbeat");
}

#[test]
fn a_stream_whose_token_expires_is_sent_event_expired_and_ends() {
    let mut r = private_rig();
    r.ingest_with_token("room-17%2Fa", 1);
    r.ingest_with_token("room-17%2Fb", 1);
    for target in [
        "/v1/boxes/room-17%2Fa",
        "/v1/boxes?keys=room-17/a,room-17/b",
    ] {
        let mut c = r.conn();
        let mut seen_c = Applied::default();
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\
             Authorization: Bearer {}\r\n\r\n",
            signed("es")
        );
        r.feed(&mut c, req.as_bytes());
        assert!(r.sent(&mut c).contains("id: "), "{target}");
        let start = r.now_ms;
        r.now_ms = start + 10_000;
        r.set_wall_s(2030);
        c.on_timer(&mut r.cx());
        assert_eq!(
            r.sent(&mut c),
            "event: expired\ndata: {\"error\":\"invalid_token\",\"error_description\":\"expired\"}\n\n",
            "{target}"
        );
        assert!(!c.streaming() && seen_c.apply(&mut c).watch().is_none() && c.finished());
        r.now_ms = start;
        r.set_wall_s(2020);
    }
}

#[test]
fn a_reread_without_its_key_ends_a_held_request_and_spares_the_others() {
    let mut r = private_rig();
    r.ingest_with_token("room-17%2Fa", 1);
    let sse = |auth: &str| {
        format!("GET /v1/boxes/room-17%2Fa HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n{auth}\r\n")
    };
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
    let (mut es, mut ed, mut st) = (r.conn(), r.conn(), r.conn());
    let mut parked = r.conn();
    r.feed(&mut es, sse(&bearer(&signed("es"))).as_bytes());
    r.feed(&mut ed, sse(&bearer(&signed("ed"))).as_bytes());
    r.feed(&mut st, sse(&bearer("alice")).as_bytes());
    let poll = format!(
        "GET /v1/boxes/room-17%2Fa?after=999999999999999999&wait_ms=30000 HTTP/1.1\r\nHost: x\r\n{}\r\n",
        bearer(&signed("es"))
    );
    r.feed(&mut parked, poll.as_bytes());
    for c in [&mut es, &mut ed, &mut st, &mut parked] {
        r.sent(c);
    }
    // The key `es` taken out; the static token unchanged.
    r.reread("es", "alice");
    for c in [&mut es, &mut ed, &mut st, &mut parked] {
        c.on_access_changed(&mut r.cx());
    }
    assert_eq!(
        r.sent(&mut es),
        "event: expired\ndata: {\"error\":\"invalid_token\",\"error_description\":\"unknown key\"}\n\n"
    );
    assert!(es.finished());
    let out = r.sent(&mut parked);
    assert_eq!(statuses(&out), ["401"]);
    assert!(out.contains("error_description=\"unknown key\""), "{out}");
    assert!(parked.wants_read() && !parked.finished());
    assert!(ed.streaming() && st.streaming());
    assert!(r.sent(&mut ed).is_empty() && r.sent(&mut st).is_empty());
    // The static token rotated: its stream ends as any request with it
    // would be refused.
    r.reread("es", "alice-2");
    assert!(st.on_access_changed(&mut r.cx()));
    assert!(r.sent(&mut st).starts_with("event: expired\n"));
    assert!(!ed.on_access_changed(&mut r.cx()));
    // A stream of public reads holds no token.
    let mut public = rig();
    public.ingest("a", 1);
    let mut c = public.conn();
    public.feed(&mut c, SUBSCRIBE.as_bytes());
    assert!(c.streaming() && !c.holds_token());
}

/// An action as a test keeps it (a watch's keys copied).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    Watch {
        keys: Vec<u8>,
        many: bool,
        stream: bool,
    },
    Unwatch,
    Await(u64),
    Unawait(u64),
    Arm(u64),
    Bytes,
    Close,
}

/// What a worker holds for one connection, from the actions it applied (as
/// `server/src/waiting.rs` does): the protocol tests read a connection's
/// waits through it, not through the connection's own state.
#[derive(Default)]
pub(super) struct Applied {
    watch: Option<Vec<u8>>,
    awaiting: Option<u64>,
}

impl Applied {
    /// Apply what `c` asked since the last call.
    pub(super) fn apply(&mut self, c: &mut Connection) -> &Applied {
        for a in c.actions() {
            match a {
                Action::Watch(w) => self.watch = Some(w.keys.to_vec()),
                Action::Unwatch => self.watch = None,
                Action::Await(t) => self.awaiting = Some(t),
                Action::Unawait(_) => self.awaiting = None,
                Action::Arm(_) | Action::Bytes { .. } | Action::Close => {}
            }
        }
        self
    }

    /// The keys registered for the connection (a parked poll's, a stream's).
    pub(super) fn watch(&self) -> Option<&[u8]> {
        self.watch.as_deref()
    }

    /// The log request the connection's reports are routed to.
    pub(super) fn awaiting(&self) -> Option<u64> {
        self.awaiting
    }
}

/// Drain the connection's actions, as the worker does after each call.
fn drain(c: &mut Connection) -> Vec<Asked> {
    c.actions()
        .map(|a| match a {
            Action::Watch(w) => Asked::Watch {
                keys: w.keys.to_vec(),
                many: w.many,
                stream: w.stream,
            },
            Action::Unwatch => Asked::Unwatch,
            Action::Await(t) => Asked::Await(t),
            Action::Unawait(t) => Asked::Unawait(t),
            Action::Arm(at) => Asked::Arm(at),
            Action::Bytes { .. } => Asked::Bytes,
            Action::Close => Asked::Close,
        })
        .collect()
}

/// [`drain`] without the timer and the bytes.
fn asks(c: &mut Connection) -> Vec<Asked> {
    drain(c)
        .into_iter()
        .filter(|a| !matches!(a, Asked::Arm(_) | Asked::Bytes))
        .collect()
}

fn watch(key: &str, many: bool, stream: bool) -> Asked {
    Asked::Watch {
        keys: key.as_bytes().to_vec(),
        many,
        stream,
    }
}

#[test]
fn a_parked_poll_asks_for_its_watch_once_and_its_answer_undoes_it() {
    let mut r = rig();
    let mut c = parked_on_a(&mut r);
    assert_eq!(asks(&mut c), [watch("a", false, false)]);
    assert_eq!(asks(&mut c), [], "applied once");
    assert!(!c.on_box_updated(&mut r.cx()));
    assert_eq!(asks(&mut c), [], "still parked");
    r.ingest("a", 2);
    assert!(c.on_box_updated(&mut r.cx()));
    assert_eq!(asks(&mut c), [Asked::Unwatch]);
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 200"));
    assert_eq!(asks(&mut c), []);
}

#[test]
fn a_poll_parked_and_answered_before_the_server_looked_asks_nothing() {
    let mut r = rig();
    let mut c = parked_on_a(&mut r);
    r.ingest("a", 2);
    assert!(c.on_box_updated(&mut r.cx()));
    assert_eq!(asks(&mut c), []);
    // Parked again, behind an undo of a watch the server had applied.
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=2&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(asks(&mut c), [watch("a", false, false)]);
    r.ingest("a", 3);
    assert!(c.on_box_updated(&mut r.cx()));
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=3&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(asks(&mut c), [Asked::Unwatch, watch("a", false, false)]);
}

#[test]
fn an_event_stream_and_a_poll_of_many_boxes_ask_to_watch_their_keys() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/s HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    assert_eq!(asks(&mut c), [watch("s", false, true)]);
    c.peer_hung_up();
    assert_eq!(asks(&mut c), [Asked::Unwatch, Asked::Close]);

    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes?keys=a,b HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    let out = r.sent(&mut c);
    let etag = out
        .lines()
        .find_map(|l| l.strip_prefix("ETag: "))
        .expect("an ETag")
        .to_string();
    let poll = format!(
        "GET /v1/boxes?keys=a,b&wait_ms=5000 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
    );
    r.feed(&mut c, poll.as_bytes());
    let got = asks(&mut c);
    let keys = match got.as_slice() {
        [Asked::Watch {
            keys,
            many: true,
            stream: false,
        }] => keys.clone(),
        other => panic!("{other:?} {}", r.sent(&mut c)),
    };
    let keys: Vec<&[u8]> = crate::service::ManyKeys(&keys).collect();
    assert_eq!(keys, [b"a".as_slice(), b"b"]);
}

#[test]
fn a_logged_ingest_asks_for_its_reports_then_gives_them_up() {
    let mut r = log_rig();
    let mut c = r.conn();
    r.feed(&mut c, post("/v1/boxes/r", r#"{"value":5}"#).as_bytes());
    let request = r.host.produced[0].0;
    assert_eq!(asks(&mut c), [Asked::Await(request)]);
    let report = consume(&mut r, 0, 8);
    assert!(c.on_log_report(0, report, &mut r.cx()));
    assert_eq!(asks(&mut c), [Asked::Unawait(request)]);
    assert!(r.sent(&mut c).starts_with("HTTP/1.1 200"));
}

#[test]
fn the_close_is_asked_once_when_the_answer_is_sent() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(asks(&mut c), [], "not before its answer is sent");
    r.sent(&mut c);
    assert_eq!(asks(&mut c), [Asked::Close]);
    assert_eq!(asks(&mut c), [], "once");
}

#[test]
fn the_timer_is_asked_for_when_the_deadline_comes_sooner_or_none_is_armed() {
    let mut r = rig();
    let mut c = r.conn();
    let arms = |c: &mut Connection| {
        drain(c)
            .into_iter()
            .filter(|a| matches!(a, Asked::Arm(_)))
            .collect::<Vec<_>>()
    };
    assert_eq!(arms(&mut c), [Asked::Arm(61_000)], "idle");
    r.now_ms = 2_000;
    r.feed(&mut c, b"GET /healthz HT");
    assert_eq!(
        arms(&mut c),
        [Asked::Arm(7_000)],
        "the header timeout comes sooner"
    );
    r.now_ms = 3_000;
    r.feed(&mut c, b"TP/1.1\r\nHost: x\r\n\r\n");
    r.sent(&mut c);
    assert_eq!(
        arms(&mut c),
        [],
        "a later deadline keeps the timer armed (it fires early)"
    );
    r.now_ms = 7_000;
    c.on_timer(&mut r.cx());
    assert_eq!(arms(&mut c), [Asked::Arm(63_000)], "armed again");
}

#[test]
fn a_released_connection_asks_for_what_it_had_to_be_undone() {
    let mut r = rig();
    let mut c = r.conn();
    r.feed(
        &mut c,
        b"GET /v1/boxes/a?after=0&wait_ms=5000 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    let asked = drain(&mut c);
    assert!(asked.contains(&watch("a", false, false)), "{asked:?}");
    c.release(&mut r.cx());
    let undone: Vec<_> = c.actions().collect();
    assert_eq!(undone[0], Action::Unwatch);
    assert!(
        matches!(undone[1..], [Action::Bytes { send: 0, watch }] if watch < 0),
        "{undone:?}"
    );
}
