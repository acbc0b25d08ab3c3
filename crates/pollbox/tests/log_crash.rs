//! A node of a Kafka log killed with `kill -9` while clients ingest through it
//! loses nothing it acknowledged (docs/operations.md#the-kafka-log): restarted
//! from its snapshot, it replays the log, says ready only once it caught up,
//! and then holds every acknowledged message exactly once, as does a node that
//! read the log from its start; with single messages, and with batches
//! applied by several consuming threads (`log.consumers`). Through the real
//! binary and a real broker (`scripts/kafka`); ignored without one, run by
//! `.ci/run`.

mod common;
use common::get;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use kafka::Broker;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 4;

/// How the clients ingest, and how many consuming threads apply.
#[derive(Clone, Copy)]
struct Ingest {
    topic: &'static str,
    partitions: i32,
    /// 0: one `POST /v1/boxes/c{c}` a request; else `POST /v1/ingest` of
    /// this many messages, boxes `c{c}-{j}`.
    batch: usize,
    /// `log.consumers` (0: the default).
    consumers: usize,
}

fn write_config(dir: &Path, name: &str, bootstrap: &str, snapshot: bool, how: Ingest) -> PathBuf {
    let cfg = dir.join(format!("{name}.toml"));
    let snap = if snapshot {
        format!(
            "[snapshot]\npath = \"{}\"\ninterval_s = 1\n",
            dir.join(format!("{name}.snap")).display()
        )
    } else {
        String::new()
    };
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n{snap}[log]\nbrokers = \"{bootstrap}\"\ntopic = \"{}\"\nallow_unsafe_topic = true\nconsumers = {}\n",
            how.topic, how.consumers
        ),
    )
    .unwrap();
    cfg
}

fn spawn(cfg: &Path) -> (common::Server, SocketAddr) {
    let (child, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    (child, addr)
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn field(body: &str, name: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in {body}"))
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn kill_9_under_ingest_loses_nothing_acknowledged_and_applies_nothing_twice() {
    kill_9_under_ingest(Ingest {
        topic: "crash",
        partitions: 2,
        batch: 0,
        consumers: 0,
    });
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn kill_9_under_batch_ingest_applied_by_four_threads_loses_nothing_acknowledged() {
    kill_9_under_ingest(Ingest {
        topic: "crash-batches",
        partitions: 4,
        batch: 16,
        consumers: 4,
    });
}

/// The boxes client `c` ingests into.
fn boxes_of(c: usize, how: Ingest) -> Vec<String> {
    if how.batch == 0 {
        vec![format!("c{c}")]
    } else {
        (0..how.batch).map(|j| format!("c{c}-{j}")).collect()
    }
}

fn kill_9_under_ingest(how: Ingest) {
    let broker = Broker::start();
    broker.create_topic(how.topic, how.partitions);
    // A folder of its own: the tests of this file run at once in one process.
    let dir = common::tmpdir(&format!("log-crash-{}", how.topic));
    let cfg_a = write_config(&dir, "a", &broker.bootstrap, true, how);
    let (mut a, addr_a) = spawn(&cfg_a);
    until("A ready", || get(addr_a, "/readyz").0 == 200);

    // Clients ingest `{"value":1}` into a box each, counting what A answered 200.
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let stop = stop.clone();
            let counts = counts.clone();
            std::thread::spawn(move || {
                let mut acked = 0u64;
                let mut s = TcpStream::connect(addr_a).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let (path, body) = if how.batch == 0 {
                    (format!("/v1/boxes/c{c}"), r#"{"value":1}"#.to_string())
                } else {
                    let items: Vec<String> = boxes_of(c, how)
                        .iter()
                        .map(|k| format!(r#"{{"key":"{k}","value":1}}"#))
                        .collect();
                    ("/v1/ingest".to_string(), format!("[{}]", items.join(",")))
                };
                let req = format!(
                    "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                while !stop.load(Ordering::Relaxed) {
                    match common::request(&mut s, req.as_bytes()) {
                        Some((200, b)) => {
                            if how.batch > 0 {
                                // Every message of the batch applied.
                                assert_eq!(field(&b, "accepted"), how.batch as u64, "{b}");
                            }
                            acked += 1;
                            counts[c].store(acked, Ordering::Relaxed);
                        }
                        Some((code, b)) => panic!("{code} {b}"),
                        None => break, // A was killed
                    }
                }
                acked
            })
        })
        .collect();
    // Until every client had answers and a snapshot (every second) was
    // written, then records after it: the kill lands past both, however
    // slow the machine.
    until(
        "every client answered more than 10 times, and a snapshot",
        || counts.iter().all(|n| n.load(Ordering::Relaxed) > 10) && dir.join("a.snap").exists(),
    );
    std::thread::sleep(Duration::from_millis(500));
    a.kill().unwrap(); // SIGKILL
    a.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<u64> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(acked.iter().all(|&n| n > 10), "clients ingested: {acked:?}");
    assert!(
        dir.join("a.snap").exists(),
        "a snapshot was written before the kill"
    );

    // Restarted: ready only once caught up, so the first ready answer already
    // holds everything acknowledged.
    let (_a2, addr_a) = spawn(&cfg_a);
    until("A ready again", || get(addr_a, "/readyz").0 == 200);
    let mut payloads = Vec::new();
    for (c, &n) in acked.iter().enumerate() {
        for k in boxes_of(c, how) {
            let (code, body) = get(addr_a, &format!("/v1/boxes/{k}"));
            assert_eq!(code, 200, "{k}: {n} acknowledged: {body}");
            let (sum, count) = (field(&body, "sum"), field(&body, "n"));
            // Each client had at most one request unanswered when A died: its
            // message may or may not be in the log (at least once).
            assert!(
                sum == n || sum == n + 1,
                "{k}: {n} acknowledged, the box holds {sum}"
            );
            assert_eq!(count, sum, "{k}: no message applied twice");
            payloads.push((k, body));
        }
    }
    // A node that read the log from its start holds the same boxes, byte for byte.
    let cfg_b = write_config(&dir, "b", &broker.bootstrap, false, how);
    let (_b, addr_b) = spawn(&cfg_b);
    until("B ready", || get(addr_b, "/readyz").0 == 200);
    for (k, want) in &payloads {
        assert_eq!(&get(addr_b, &format!("/v1/boxes/{k}")).1, want);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
