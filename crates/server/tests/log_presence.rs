//! Presence on the nodes of a Kafka log (docs/presence.md#on-a-log-cluster),
//! against a real broker: a member present on one node is served by every
//! node, with the same members and version; a leave goes everywhere; a node
//! that starts late serves the same; a node that restarts under its name
//! clears what its earlier incarnation held at once (long before its lease
//! would). A node's crash (kill -9, its lease lapsing) is
//! `crates/pollbox/tests/log_presence_crash.rs`.
//!
//! Ignored in plain `cargo test` (a real broker: `scripts/kafka`):
//! `cargo test -p pollbox-server --test log_presence -- --ignored`.

mod common;
use common::kafka::Broker;
use common::*;
use pollbox_core::config::Config;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const TOPIC: &str = "presence";

fn log_config(broker: &Broker, name: &str) -> Config {
    let mut c = config();
    c.log.brokers = broker.bootstrap.clone();
    c.log.topic = TOPIC.into();
    // One broker: replication factor 1, refused without this.
    c.log.allow_unsafe_topic = true;
    c.presence.node = name.into();
    c.presence.leave_grace_ms = 300;
    // Longer than the test: nothing here lapses; what goes, goes by a leave
    // or a new incarnation.
    c.presence.lease_ms = 120_000;
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

fn presence(a: SocketAddr, room: &str) -> Value {
    let r = get(a, &format!("/v1/boxes/{room}~presence"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn ids(v: &Value) -> Vec<String> {
    v["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["id"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A member's presence connection: an event stream of the room's presence.
fn member(a: SocketAddr, room: &str, id: &str) -> Reader {
    let mut r = Reader::new(connect(a));
    r.send(
        format!(
            "GET /v1/boxes/{room}~presence?member={id} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    let head = r.read_through("\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    r
}

/// Every node serves `room` alike (members and version), and with `want`.
fn agreed(nodes: &[SocketAddr], room: &str, want: &[&str]) -> bool {
    let seen: Vec<Value> = nodes.iter().map(|&a| presence(a, room)).collect();
    seen.iter().all(|v| v == &seen[0]) && ids(&seen[0]) == want
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn every_node_serves_the_same_members_and_a_restart_clears_its_earlier_incarnation() {
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    // The presence topic is made by the first node that finds it missing.
    let na = start(log_config(&broker, "node-a"));
    let nb = start(log_config(&broker, "node-b"));
    let (a, b) = (na.addr(), nb.addr());
    until("both nodes ready", || {
        [a, b].iter().all(|&n| get(n, "/readyz").status == 200)
    });

    let alice = member(a, "room-1/", "alice");
    let _bob = member(b, "room-1/", "bob");
    until("both see alice and bob", || {
        agreed(&[a, b], "room-1/", &["alice", "bob"])
    });
    let before = presence(a, "room-1/")["ver"].as_u64().unwrap_or(0);
    assert!(before > 1, "a version from the presence topic");

    drop(alice);
    until("alice's leave on both", || {
        agreed(&[a, b], "room-1/", &["bob"])
    });
    assert!(presence(b, "room-1/")["ver"].as_u64().unwrap_or(0) > before);

    // A node that starts now serves what the others do.
    let nc = start(log_config(&broker, "node-c"));
    let c = nc.addr();
    until("the late node agrees", || {
        agreed(&[a, b, c], "room-1/", &["bob"])
    });

    // carol on node-a; node-a goes (no leave reaches the log: its presence
    // thread stops with its workers) and comes back under its name.
    let _carol = member(a, "room-2/", "carol");
    until("carol everywhere", || {
        agreed(&[b, c], "room-2/", &["carol"])
    });
    na.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        ids(&presence(b, "room-2/")),
        ["carol"],
        "kept until the lease (120 s) or a restart"
    );
    let na2 = start(log_config(&broker, "node-a"));
    let a2 = na2.addr();
    until("the restart cleared carol at once, everywhere", || {
        agreed(&[a2, b, c], "room-2/", &[])
    });
    until("room-1 as it was", || {
        agreed(&[a2, b, c], "room-1/", &["bob"])
    });
    for n in [na2, nb, nc] {
        n.shutdown().unwrap();
    }
}
