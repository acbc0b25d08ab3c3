//! A node of a Kafka log killed with `kill -9` while it holds a room's members
//! (docs/presence.md#on-a-log-cluster): every other node drops them once the
//! node's lease lapses in the log's time, and the list and count agree on
//! every node. Through the real binary and a real broker (`scripts/kafka`);
//! ignored without one, run by `.ci/run`. With `--nocapture` it says how long
//! after the kill the members were gone (BENCHMARKS.md, presence).
//!
//! PRESENCE_CRASH_MEMBERS (default 1,000) members, `presence.lease_ms` 2,000.

mod common;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use kafka::Broker;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TOPIC: &str = "crash";
const LEASE_MS: u64 = 2000;

fn write_config(dir: &Path, name: &str, bootstrap: &str) -> PathBuf {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
             [limits]\nmax_connections = 20000\nmax_prefix_streams = 20000\n\
             [log]\nbrokers = \"{bootstrap}\"\ntopic = \"{TOPIC}\"\nallow_unsafe_topic = true\n\
             [presence]\nnode = \"{name}\"\nlease_ms = {LEASE_MS}\nleave_grace_ms = 500\n"
        ),
    )
    .unwrap();
    cfg
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `(count, version, body)` of `room`'s presence on node `a`.
fn presence(a: SocketAddr, room: &str) -> (u64, u64, String) {
    let (status, body) = common::get(a, &format!("/v1/boxes/{room}~presence"));
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    (
        v["count"].as_u64().unwrap_or(u64::MAX),
        v["ver"].as_u64().unwrap_or(0),
        body,
    )
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_killed_nodes_members_go_on_every_node_once_its_lease_lapses() {
    let n: u64 = std::env::var("PRESENCE_CRASH_MEMBERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    broker.create_topic("crash-presence", 1);
    let dir = common::tmpdir("presence-crash");
    let spawn = |name: &str| {
        let cfg = write_config(&dir, name, &broker.bootstrap);
        let (child, addr, _) = common::serve(
            ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
            &[],
        );
        (child, addr)
    };
    let (mut a_proc, a) = spawn("node-a");
    let (_b_proc, b) = spawn("node-b");
    let (_c_proc, c) = spawn("node-c");
    until("nodes ready", || {
        [a, b, c]
            .iter()
            .all(|&x| common::get(x, "/readyz").0 == 200)
    });
    // n members on node-a, one on node-b.
    let mut held: Vec<TcpStream> = (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(a).unwrap();
            write!(
                s,
                "GET /v1/boxes/lobby/~presence?member=p-{i:05} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    let mut stay = TcpStream::connect(b).unwrap();
    write!(
        stay,
        "GET /v1/boxes/lobby/~presence?member=stays HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    until("every node counts them all, alike", || {
        let seen: Vec<_> = [a, b, c].iter().map(|&x| presence(x, "lobby/")).collect();
        seen[0].0 == n + 1 && seen.iter().all(|s| s.2 == seen[0].2)
    });
    a_proc.kill().unwrap(); // SIGKILL: no leave reaches the log.
    let killed = Instant::now();
    let _ = a_proc.wait();
    held.clear();
    let mut gone_ms = [0u128; 2];
    until("node-a's members gone from b and c", || {
        for (i, &x) in [b, c].iter().enumerate() {
            if gone_ms[i] == 0 && presence(x, "lobby/").0 == 1 {
                gone_ms[i] = killed.elapsed().as_millis();
            }
        }
        gone_ms.iter().all(|&g| g > 0)
    });
    until("b and c agree", || {
        presence(b, "lobby/").2 == presence(c, "lobby/").2
    });
    let (_, _, body) = presence(b, "lobby/");
    assert!(body.contains("\"stays\""), "{body}");
    eprintln!(
        "presence crash: {n} members of a killed node gone from node-b at {} ms, node-c at {} ms after the kill (lease {LEASE_MS} ms)",
        gone_ms[0], gone_ms[1]
    );
    drop(stay);
}
