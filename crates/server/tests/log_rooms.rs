//! Rooms on the nodes of a Kafka log (docs/http.md#rooms,
//! docs/boxes.md#watermarks): every node answers a prefix's pages the same,
//! and a client of a room's stream moved from one node to another resumes
//! with its `Last-Event-ID` and is sent exactly what moved since, while
//! writers on both nodes go on. An id is the topic's: one from a topic
//! deleted and created again under the same name is a reset.
//!
//! Ignored in plain `cargo test` (a real broker: `scripts/kafka`):
//! `cargo test -p pollbox-server --test log_rooms -- --ignored`.

mod common;
use common::kafka::Broker;
use common::rooms::{read_then_hang_up, resume_a_quiet_room, room, writers, Held, Sse};
use common::*;
use pollbox_core::config::Config;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOPIC: &str = "rooms";

fn log_config(broker: &Broker) -> Config {
    let mut c = config();
    c.log.brokers = broker.bootstrap.clone();
    c.log.topic = TOPIC.into();
    // One broker: replication factor 1, refused without this.
    c.log.allow_unsafe_topic = true;
    c
}

/// Wait (at most 60 s, then fail) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A page of the prefix from node `a`, as JSON.
fn page(a: SocketAddr, query: &str) -> serde_json::Value {
    let r = get(a, &format!("/v1/boxes?{query}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn every_node_pages_a_room_alike_and_a_stream_resumes_on_another_node() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4);
    let (na, nb) = (start(log_config(&broker)), start(log_config(&broker)));
    let nodes = [na.addr(), nb.addr()];
    until("both nodes ready", || {
        nodes.iter().all(|&a| get(a, "/readyz").status == 200)
    });
    for i in 0..30 {
        let r = post(
            nodes[i % 2],
            &format!("/v1/boxes/room/k{i:02}"),
            r#"{"value":1}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // Quiet: every node pages the room alike, in pages of 7, with the same
    // cursors and the same watermark (the same records applied).
    let walk = |a: SocketAddr| {
        let mut pages = Vec::new();
        let mut cursor = String::new();
        loop {
            let p = page(a, &format!("prefix=room%2F&limit=7{cursor}"));
            let next = p["next"].as_str().map(str::to_string);
            pages.push(p);
            match next {
                Some(n) => cursor = format!("&cursor={n}"),
                None => return pages,
            }
        }
    };
    until("both nodes applied the same records", || {
        walk(nodes[0]) == walk(nodes[1])
    });
    let pages = walk(nodes[0]);
    assert_eq!(pages.len(), 5, "30 boxes in pages of 7");
    assert_eq!(
        pages
            .iter()
            .map(|p| p["boxes"].as_array().unwrap().len())
            .sum::<usize>(),
        30
    );

    // A stream on node A, then moved to node B (and back) with its id, while
    // writers on both nodes go on.
    let stop = Arc::new(AtomicBool::new(false));
    let threads = writers(&nodes, 30, 6, stop.clone());
    let mut held = Held::default();
    let mut id: Option<String> = None;
    let mut x = 99u64;
    for hop in 0..40 {
        let a = nodes[hop % 2];
        let mut sse = Sse::open(a, "room/", id.as_deref());
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        read_then_hang_up(&mut sse, &mut held, &mut id, 1 + (x >> 33) % 6);
    }
    stop.store(true, Ordering::Relaxed);
    let ops: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(ops > 100, "the writers wrote: {ops}");

    // Quiet again: both nodes hold the same room; a resume on either node
    // from the last id brings the client to it exactly.
    until("both nodes applied the same records", || {
        room(nodes[0], "room/") == room(nodes[1], "room/")
    });
    let want = room(nodes[0], "room/");
    let mut sse = Sse::open(nodes[1], "room/", id.as_deref());
    loop {
        let e = sse.next().expect("the stream goes on");
        held.apply(&e);
        if e.event == "synced" {
            break;
        }
    }
    assert_eq!(
        held.boxes.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the client holds the room ({ops} writes, {} resets)",
        held.resets
    );
    for (k, (ver, _)) in &want {
        assert_eq!(held.boxes.get(k).map(|h| h.0), Some(*ver), "{k}");
    }
    // A reset is honest too (more removals than the key order keeps came
    // between two hops); it is counted, not required to be 0.
    eprintln!("{ops} writes, {} resets", held.resets);

    // The long-poll form agrees too: from the first page's watermark, both
    // nodes answer the same moves.
    let w = page(nodes[0], "prefix=room%2F")["after"]
        .as_str()
        .unwrap()
        .to_string();
    let r = post(nodes[1], "/v1/boxes/room/k07", r#"{"value":7}"#);
    assert_eq!(r.status, 200);
    let moved = |a: SocketAddr| {
        let r = get(
            a,
            &format!("/v1/boxes?prefix=room%2F&after={w}&wait_ms=10000"),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["boxes"].clone()
    };
    until("node A applied the update", || {
        moved(nodes[0]).as_array().is_some_and(|b| !b.is_empty())
    });
    assert_eq!(moved(nodes[0]), moved(nodes[1]));
    assert_eq!(moved(nodes[0])[0]["k"], "room/k07");
    na.shutdown().unwrap();
    nb.shutdown().unwrap();
}

/// On a node of a log, a resumed room where little moved is sent what moved
/// and `synced` without waiting for a heartbeat, as on a standalone node
/// (`rooms_resume.rs`).
#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_resumed_room_where_little_moved_is_synced_without_waiting_on_a_log_node() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 4);
    let mut c = log_config(&broker);
    c.http.sse_heartbeat_ms = 60_000;
    let node = start(c);
    let a = node.addr();
    until("the node ready", || get(a, "/readyz").status == 200);
    resume_a_quiet_room(a);
    node.shutdown().unwrap();
}

/// Read a prefix stream up to `synced`: its id.
fn synced_id(sse: &mut Sse) -> String {
    loop {
        let e = sse.next().expect("the stream goes on");
        if e.event == "synced" {
            return e.id.expect("synced carries an id");
        }
    }
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn an_id_from_a_topic_deleted_and_created_again_under_its_name_is_reset() {
    const AGAIN: &str = "again";
    let broker = Broker::start();
    broker.create_topic(AGAIN, 2);
    let config = || {
        let mut c = log_config(&broker);
        c.log.topic = AGAIN.into();
        c
    };
    let ready = |a: SocketAddr| until("ready", || get(a, "/readyz").status == 200);
    let first = start(config());
    ready(first.addr());
    for i in 0..6 {
        let r = post(
            first.addr(),
            &format!("/v1/boxes/room/k{i}"),
            r#"{"value":1}"#,
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let id = synced_id(&mut Sse::open(first.addr(), "room/", None));
    let after = page(first.addr(), "prefix=room%2F")["after"]
        .as_str()
        .unwrap()
        .to_string();
    first.shutdown().unwrap();

    // The same topic, read again by another node: the id is honored
    // (nothing moved since: straight to `synced`), and so is the watermark.
    let same = start(config());
    ready(same.addr());
    let mut sse = Sse::open(same.addr(), "room/", Some(&id));
    assert_eq!(sse.next().expect("an event").event, "synced");
    let r = get(
        same.addr(),
        &format!("/v1/boxes?prefix=room%2F&after={after}&wait_ms=200"),
    );
    assert_eq!(r.status, 304, "{}", r.text());
    same.shutdown().unwrap();

    // Deleted and created again under the same name: another topic, whose
    // offsets start again at 0. Its node resets the old topic's clients.
    broker.recreate_topic(AGAIN, 2);
    let again = start(config());
    ready(again.addr());
    let mut sse = Sse::open(again.addr(), "room/", Some(&id));
    assert_eq!(sse.next().expect("an event").event, "reset");
    assert_eq!(sse.next().expect("an event").event, "synced");
    let r = get(
        again.addr(),
        &format!("/v1/boxes?prefix=room%2F&after={after}&wait_ms=1000"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["reset"], true, "{}", r.text());
    again.shutdown().unwrap();
}
