//! Properties of a whole connection (the state machine with the service behind
//! it), driven the way the server drives it, without sockets:
//!
//! - any split of a pipelined stream of requests into reads gives exactly the
//!   bytes the whole stream in one read gives (answers, in request order), and
//!   leaves the box table in the same state;
//! - arbitrary bytes, read in arbitrary pieces with timers firing in between,
//!   never panic, and every read buffer the connection took comes back when it
//!   is released.

use std::sync::Arc;
use std::time::SystemTime;

use pollbox_core::boxes::BoxTable;
use pollbox_core::buffers::Buffers;
use pollbox_core::config::Config;
use pollbox_core::conn::{Connection, Ctx};
use pollbox_core::plan::Plan;
use pollbox_core::service::{
    Host, IngestResult, Listener, Node, Removal, RouteLabel, Service, Watchers,
};
use proptest::prelude::*;

struct Quiet;

impl Watchers for Quiet {
    fn box_updated(&mut self, _key: &[u8]) {}
}

impl Host for Quiet {
    fn draining(&self) -> bool {
        false
    }
    fn ready(&self) -> bool {
        true
    }
    fn render_metrics(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"m 1\n");
    }
    fn answered(&mut self, _route: RouteLabel, _code: u16) {}
    fn ingested(&mut self, _result: IngestResult, _n: u64) {}
    fn boxes_removed(&mut self, _why: Removal, _n: u64) {}
}

fn service() -> Service {
    let mut config = Config::embedded();
    config.limits.max_body_bytes = 4096;
    config.limits.max_header_bytes = 1024;
    let plan = Arc::new(Plan::compile(&config.boxes).unwrap());
    let boxes = BoxTable::new(plan.clone());
    // A fixed clock: the `Date` header is the same whatever the split.
    Service::new(
        Arc::new(Node::new(config, plan, boxes)),
        SystemTime::UNIX_EPOCH,
    )
}

/// Feed `stream` in reads of the given sizes (cycled); then the peer closes.
/// Returns every byte the connection queued, the payloads of keys k0..k3, and
/// whether every read buffer came back.
fn drive(stream: &[u8], reads: &[usize], tick_every: usize) -> (Vec<u8>, Vec<Vec<u8>>, bool) {
    let mut service = service();
    let mut buffers = Buffers::default();
    let mut host = Quiet;
    let mut now_ms = 1_000;
    let mut conn = Connection::new(now_ms, Listener::Main, &service);
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    let take = |conn: &mut Connection, buffers: &mut Buffers, out: &mut Vec<u8>| {
        let q = conn.send_queue();
        for chunk in q.chunks() {
            out.extend_from_slice(chunk);
        }
        let n = q.pending();
        q.advance(n, &mut buffers.send);
    };
    while at < stream.len() {
        let mut cx = Ctx {
            now_ms,
            service: &mut service,
            buffers: &mut buffers,
            host: &mut host,
        };
        let Some(buf) = conn.read_buffer(&mut cx) else {
            break;
        };
        let want = reads[i % reads.len()].max(1);
        let n = want.min(buf.len()).min(stream.len() - at);
        buf[..n].copy_from_slice(&stream[at..at + n]);
        conn.received(n, &mut cx);
        at += n;
        i += 1;
        take(&mut conn, &mut buffers, &mut out);
        if tick_every > 0 && i % tick_every == 0 {
            // Time passes, within every timeout: nothing may change.
            now_ms += 1;
            let mut cx = Ctx {
                now_ms,
                service: &mut service,
                buffers: &mut buffers,
                host: &mut host,
            };
            conn.on_timer(&mut cx);
        }
    }
    let mut cx = Ctx {
        now_ms,
        service: &mut service,
        buffers: &mut buffers,
        host: &mut host,
    };
    conn.eof(&mut cx);
    take(&mut conn, &mut buffers, &mut out);
    conn.release(&mut Ctx {
        now_ms,
        service: &mut service,
        buffers: &mut buffers,
        host: &mut host,
    });
    let payloads = (0..4)
        .map(|k| {
            let mut p = Vec::new();
            service
                .node()
                .boxes
                .poll(format!("k{k}").as_bytes(), &mut p);
            p
        })
        .collect();
    (out, payloads, buffers.read_held() == 0)
}

fn request() -> impl Strategy<Value = Vec<u8>> {
    let key = (0..4u8).prop_map(|k| format!("k{k}"));
    prop_oneof![
        key.clone().prop_map(|k| format!("GET /v1/boxes/{k} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()),
        (key.clone(), -1000i64..1000).prop_map(|(k, v)| {
            let body = format!("{{\"value\":{v},\"player\":\"p\",\"cargo\":[1,{{\"x\":\"y\"}}]}}");
            format!("POST /v1/boxes/{k} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
        }),
        (key.clone(), 0i64..100).prop_map(|(k, v)| {
            let body = format!("{{\"key\":\"{k}\",\"value\":{v}}}\n{{\"value\":1}}\n");
            format!(
                "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            )
            .into_bytes()
        }),
        key.clone().prop_map(|k| format!("HEAD /v1/boxes/{k} HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"1\"\r\n\r\n").into_bytes()),
        Just(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n".to_vec()),
        Just(b"GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n".to_vec()),
        Just(b"PUT /v1/ingest HTTP/1.1\r\nHost: t\r\n\r\n".to_vec()),
        // A long-poll answered at once (its box is past `after=0` or unknown → 304).
        key.prop_map(|k| format!("GET /v1/boxes/{k}?after=999999&wait_ms=0 HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_split_gives_the_same_answers_and_boxes(
        reqs in prop::collection::vec(request(), 1..12),
        reads in prop::collection::vec(1usize..200, 1..8),
        tick_every in 0usize..5,
    ) {
        let stream = reqs.concat();
        let (whole, boxes_whole, back_whole) = drive(&stream, &[stream.len()], 0);
        let (split, boxes_split, back_split) = drive(&stream, &reads, tick_every);
        prop_assert!(back_whole && back_split, "a read buffer was not given back");
        prop_assert_eq!(boxes_split, boxes_whole);
        prop_assert_eq!(String::from_utf8_lossy(&split), String::from_utf8_lossy(&whole));
        // One answer per request, in order, none after an error.
        let answers = String::from_utf8_lossy(&whole).matches("HTTP/1.1 ").count();
        prop_assert!(answers >= reqs.len(), "{answers} answers for {} requests", reqs.len());
    }

    #[test]
    fn byte_soup_never_panics_and_buffers_come_back(
        pieces in prop::collection::vec(
            prop_oneof![
                request(),
                prop::collection::vec(any::<u8>(), 0..64),
                Just(b"\r\n".to_vec()),
                Just(b"Content-Length: 99999999\r\n".to_vec()),
                Just(b"Transfer-Encoding: chunked\r\n\r\nffffffffff\r\n".to_vec()),
            ],
            0..16,
        ),
        reads in prop::collection::vec(1usize..300, 1..8),
        tick_every in 0usize..4,
    ) {
        let stream = pieces.concat();
        let (_, _, back) = drive(&stream, &reads, tick_every);
        prop_assert!(back, "a read buffer was not given back");
    }
}
