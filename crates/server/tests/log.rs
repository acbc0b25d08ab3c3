//! Nodes built from a Kafka log (docs/operations.md#the-kafka-log), against a
//! real broker (`scripts/kafka/start.sh`): records produced by any Kafka client
//! reach polls, long-polls and event streams of every node, with the same
//! versions and ETags everywhere; invalid records are counted and skipped; a
//! restart from a snapshot replays the log to the same boxes.
//!
//! Ignored in plain `cargo test` (they need Java and the broker's jars);
//! `.ci/run` runs them: `cargo test -p pollbox-server --test log -- --ignored`.

mod common;
use common::kafka::Broker;
use common::*;
use pollbox_core::config::Config;
use pollbox_server::Server;
use std::time::{Duration, Instant};

fn node(broker: &Broker, topic: &str, snapshot: Option<&std::path::Path>) -> Server {
    start(log_config(broker, topic, snapshot))
}

fn log_config(broker: &Broker, topic: &str, snapshot: Option<&std::path::Path>) -> Config {
    let mut c = config();
    c.log.brokers = broker.bootstrap.clone();
    c.log.topic = topic.into();
    // One broker: replication factor 1, refused without this.
    c.log.allow_unsafe_topic = true;
    // HAProxy in front (`Front`, deploy/'s config) sends a PROXY v2 header.
    c.server.trusted_proxies = vec!["127.0.0.1".into()];
    if let Some(p) = snapshot {
        c.snapshot.path = p.display().to_string();
        c.snapshot.interval_s = 3600;
    }
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

fn ready(s: &Server) -> bool {
    get(s.addr(), "/readyz").status == 200
}

fn metric(s: &Server, line_start: &str) -> u64 {
    let m = get(s.addr(), "/metrics").text();
    m.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in the metrics"))
}

/// The nice values of this process's threads with these names.
fn thread_nices(names: &[&str]) -> Vec<i64> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !names.contains(&comm.trim()) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // After the command's closing parenthesis: state is field 3, nice 19.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            if let Some(n) = rest.split_whitespace().nth(16).and_then(|v| v.parse().ok()) {
                out.push(n);
            }
        }
    }
    out
}

/// A producer that partitions as Kafka's Java client does (murmur2), as a
/// team producing to pollbox's topic is asked to.
fn murmur2_producer(broker: &Broker) -> common::kafka::Plain {
    broker.producer_with(&[("partitioner", "murmur2_random")])
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pollbox-log-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn records_from_any_producer_reach_every_node_with_the_same_versions() {
    let broker = Broker::start();
    broker.create_topic("scores", 3);
    let (a, b) = (node(&broker, "scores", None), node(&broker, "scores", None));
    until("both nodes ready", || ready(&a) && ready(&b));
    let plain = murmur2_producer(&broker);
    // Parked before the record exists: a long-poll and an event stream on B.
    let mut parked = Reader::new(connect(b.addr()));
    parked.send(b"GET /v1/boxes/r1?after=0&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut stream = Reader::new(connect(b.addr()));
    stream.send(b"GET /v1/boxes/r1 HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n");
    let head = stream.read_until_contains("retry: ");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let (_, offset) = plain.send("scores", Some("r1"), Some(r#"{"value":5,"player":"p-7"}"#));
    let want = format!(
        r#"{{"k":"r1","ver":{},"v":5,"sum":5,"n":1,"by":"p-7"}}"#,
        offset + 1
    );
    let woken = parked.read(false);
    assert_eq!(woken.status, 200);
    assert_eq!(woken.text(), want);
    let event = stream.read_until_contains(&format!("data: {want}\n\n"));
    assert!(event.contains(&format!("id: {}\n", offset + 1)), "{event}");
    until("A applies it", || {
        get(a.addr(), "/v1/boxes/r1").status == 200
    });
    let (ra, rb) = (get(a.addr(), "/v1/boxes/r1"), get(b.addr(), "/v1/boxes/r1"));
    assert_eq!(ra.text(), want);
    assert_eq!(rb.text(), want);
    let etag = ra.header("etag").unwrap().to_string();
    assert_eq!(
        rb.header("etag"),
        Some(etag.as_str()),
        "one ETag everywhere"
    );
    let again = raw(
        b.addr(),
        format!("GET /v1/boxes/r1 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes(),
    )
    .0;
    assert_eq!(again.status, 304, "B answers A's ETag with 304");

    // Invalid JSON is counted and skipped; the next valid record applies.
    plain.send("scores", Some("r1"), Some("{\"value\":"));
    plain.send("scores", Some("r1"), Some(r#"{"value":"text"}"#));
    let (_, offset) = plain.send("scores", Some("r1"), Some(r#"{"value":2}"#));
    for s in [&a, &b] {
        until("the valid record", || {
            get(s.addr(), "/v1/boxes/r1")
                .text()
                .contains(&format!("\"ver\":{}", offset + 1))
        });
        assert!(get(s.addr(), "/v1/boxes/r1").text().contains("\"sum\":7"));
        assert_eq!(
            metric(s, "pollbox_log_records_total{result=\"invalid\"}"),
            2
        );
    }
    // Without a record key, the message's key field names the box; the
    // record must still be in that key's home partition.
    let home = pollbox_core::log::home_partition(b"r2", 3);
    plain.send_to(
        "scores",
        Some(home),
        None,
        Some(r#"{"key":"r2","value":1}"#),
    );
    // A tombstone deletes the box everywhere; the key created again gets a
    // larger version than any it served.
    let (_, deleted_at) = plain.send("scores", Some("r1"), None);
    for s in [&a, &b] {
        until("the delete", || get(s.addr(), "/v1/boxes/r1").status == 404);
        until("r2", || get(s.addr(), "/v1/boxes/r2").status == 200);
    }
    let (_, offset) = plain.send("scores", Some("r1"), Some(r#"{"value":1}"#));
    assert!(offset > deleted_at);
    until("r1 again", || get(b.addr(), "/v1/boxes/r1").status == 200);
    let v = get(b.addr(), "/v1/boxes/r1").json()["ver"]
        .as_u64()
        .unwrap();
    assert_eq!(v, offset as u64 + 1);
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_restart_from_a_snapshot_replays_to_the_boxes_of_a_node_that_read_everything() {
    let broker = Broker::start();
    broker.create_topic("t", 2);
    let plain = murmur2_producer(&broker);
    let dir = scratch("restart");
    let snap = dir.join("boxes.snap");
    let send = |from: usize, to: usize| {
        for i in from..to {
            let key = format!("k{}", i % 7);
            if i % 11 == 10 {
                plain.send("t", Some(&key), None);
            } else {
                plain.send("t", Some(&key), Some(&format!(r#"{{"value":{i}}}"#)));
            }
        }
    };
    send(0, 40);
    let first = node(&broker, "t", Some(&snap));
    until("caught up", || ready(&first));
    first.shutdown().unwrap(); // writes the snapshot with its offsets
    send(40, 80);
    let restarted = node(&broker, "t", Some(&snap));
    let fresh = node(&broker, "t", None);
    until("both caught up", || ready(&restarted) && ready(&fresh));
    for i in 0..7 {
        let path = format!("/v1/boxes/k{i}");
        let (r, f) = (get(restarted.addr(), &path), get(fresh.addr(), &path));
        assert_eq!(r.status, f.status, "{path}");
        assert_eq!(r.text(), f.text(), "{path}: payload and version");
    }
    assert!(
        metric(&restarted, "pollbox_log_records_total{result=\"applied\"}")
            < metric(&fresh, "pollbox_log_records_total{result=\"applied\"}"),
        "the restarted node replayed only what came after its snapshot"
    );
    restarted.shutdown().unwrap();
    fresh.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreachable_log_leaves_the_node_serving_but_not_ready() {
    // No broker at all: the node starts, serves /healthz and polls, and is not
    // ready; it retries in the background. (Needs no broker: runs always.)
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut c = config();
    c.log.brokers = format!("127.0.0.1:{port}");
    let dir = scratch("unreachable");
    c.snapshot.path = dir.join("boxes.snap").display().to_string();
    let s = start(c.clone());
    assert_eq!(get(s.addr(), "/healthz").status, 200);
    let r = get(s.addr(), "/readyz");
    assert_eq!(r.status, 503);
    assert_eq!(r.text(), "not ready");
    assert_eq!(get(s.addr(), "/v1/boxes/nothing").status, 404);
    assert_eq!(metric(&s, "pollbox_log_caught_up"), 0);
    // The log's threads give way to the workers.
    until("the log's threads at nice 19", || {
        let nices = thread_nices(&["pollbox-log", "pollbox-log-end"]);
        nices.len() == 2 && nices.iter().all(|&n| n == 19)
    });
    s.shutdown().unwrap();
    // Its snapshot (written at shutdown, the log never reached) says "the
    // log's start", so the next start takes it.
    let s = Server::start(c).expect("starts again from that snapshot");
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn an_ingest_while_the_node_first_reads_the_topic_waits_for_it_not_503() {
    // A node restarted behind a load balancer takes requests as soon as it
    // listens (HAProxy never saw it down), before it has read the topic. The
    // broker is hung (SIGSTOP) while the node starts, so its first reading of
    // the topic waits; an ingest sent then is produced all the same and
    // answered once the log has it. (It was 503 `log unavailable` at once:
    // the 503s of benches/log/rolling.sh's node restarts.)
    let broker = Broker::start();
    broker.create_topic("t", 2);
    broker.signal("STOP");
    let mut c = log_config(&broker, "t", None);
    c.log.ack_timeout_ms = 20_000;
    let a = start(c);
    assert_eq!(
        get(a.addr(), "/readyz").status,
        503,
        "not ready: the topic is not read"
    );
    let addr = a.addr();
    let ingest = std::thread::spawn(move || post(addr, "/v1/boxes/early", r#"{"value":7}"#));
    // Give the ingest time to reach the node while the broker is hung (the
    // outcome does not depend on it: sent later, it is answered 200 too).
    std::thread::sleep(Duration::from_millis(500));
    broker.signal("CONT");
    let r = ingest.join().expect("the ingest thread");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["v"], 7);
    until("ready", || ready(&a));
    assert_eq!(get(a.addr(), "/v1/boxes/early").json()["v"], 7);
    assert_eq!(
        metric(
            &a,
            "pollbox_ingest_messages_total{result=\"log_unavailable\"}"
        ),
        0
    );
    a.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn an_ingest_on_one_node_is_answered_after_the_log_has_it_and_seen_on_the_other() {
    let broker = Broker::start();
    broker.create_topic("games", 4);
    let (a, b) = (node(&broker, "games", None), node(&broker, "games", None));
    until("both nodes ready", || ready(&a) && ready(&b));
    // Parked on B before the ingest on A: a long-poll and an event stream.
    let mut parked = Reader::new(connect(b.addr()));
    parked.send(b"GET /v1/boxes/g1?after=0&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\r\n");
    let mut stream = Reader::new(connect(b.addr()));
    stream.send(b"GET /v1/boxes/g1 HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n");
    stream.read_until_contains("retry: ");

    let r = post(
        a.addr(),
        "/v1/boxes/g1",
        r#"{"value":5,"player":"p-7","cargo":"x"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let ver = body["ver"].as_u64().unwrap();
    assert_eq!(body["v"], 5);
    assert_eq!(body["n"], 1);
    // A poll of A after the answer sees it, at once.
    assert_eq!(get(a.addr(), "/v1/boxes/g1").json()["ver"], ver);
    // B: the parked long-poll and the stream are woken; its ETag is A's.
    let woken = parked.read(false);
    assert_eq!(woken.status, 200);
    assert_eq!(woken.json()["ver"], ver);
    stream.read_until_contains(&format!("id: {ver}\n"));
    let etag = get(a.addr(), "/v1/boxes/g1")
        .header("etag")
        .unwrap()
        .to_string();
    let again = raw(
        b.addr(),
        format!("GET /v1/boxes/g1 HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n").as_bytes(),
    )
    .0;
    assert_eq!(again.status, 304, "B answers A's ETag with 304");

    // A batch: checked as standalone, the bad ones never reach the log.
    let r = post(
        a.addr(),
        "/v1/ingest",
        r#"[{"key":"g2","value":1},{"value":2},{"key":"g3","value":"x"},{"key":"g2","value":4}]"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.text(),
        r#"{"accepted":2,"rejected":2,"errors":[{"i":1,"error":"missing key: no member named key"},{"i":2,"error":"field v: expected an integer (i64)"}]}"#
    );
    assert_eq!(get(a.addr(), "/v1/boxes/g2").json()["sum"], 5);
    until("B has both of g2's messages", || {
        get(b.addr(), "/v1/boxes/g2").text().contains("\"sum\":5")
    });

    // DELETE on B removes the box on A; created again, a larger version.
    assert_eq!(delete(b.addr(), "/v1/boxes/g1").status, 204);
    assert_eq!(get(b.addr(), "/v1/boxes/g1").status, 404);
    until("A deletes g1", || {
        get(a.addr(), "/v1/boxes/g1").status == 404
    });
    assert_eq!(delete(b.addr(), "/v1/boxes/g1").status, 404);
    let r = post(b.addr(), "/v1/boxes/g1", r#"{"value":1}"#);
    assert_eq!(r.status, 200);
    assert!(r.json()["ver"].as_u64().unwrap() > ver);
    // A's own records were timed from produce to apply.
    let m = get(a.addr(), "/metrics").text();
    let acks = m
        .lines()
        .find_map(|l| l.strip_prefix("pollbox_log_ack_seconds_count "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("the ack histogram");
    assert_eq!(acks, 3, "g1 and the batch's two messages");
    // Both nodes applied the same records (once each).
    let applied = |s: &Server| metric(s, "pollbox_log_records_total{result=\"applied\"}");
    // g1, g2 twice, g1 again (the delete is counted apart). A node counts
    // a pass's records when its queue runs empty, so wait for both.
    until("both nodes counted the four records applied", || {
        applied(&a) == 4 && applied(&b) == 4
    });
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn with_the_log_gone_ingest_is_503_polls_go_on_and_it_comes_back() {
    let broker = Broker::start();
    broker.create_topic("t", 2);
    let mut c = log_config(&broker, "t", None);
    c.log.ack_timeout_ms = 2000;
    let a = start(c);
    until("ready", || ready(&a));
    let mut acked = Vec::new();
    for i in 0..5 {
        let key = format!("/v1/boxes/before-{i}");
        assert_eq!(post(a.addr(), &key, r#"{"value":1}"#).status, 200);
        acked.push(key);
    }
    let mut stream = Reader::new(connect(a.addr()));
    stream.send(b"GET /v1/boxes/before-0 HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n");
    stream.read_until_contains("\"k\":\"before-0\"");

    broker.stop_keeping_data();
    let r = post(a.addr(), "/v1/boxes/during", r#"{"value":1}"#);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.text(), r#"{"error":"log unavailable"}"#);
    let r = post(
        a.addr(),
        "/v1/ingest",
        r#"[{"key":"d1","value":1},{"key":"d2"}]"#,
    );
    assert_eq!(r.status, 503);
    // Polls and the stream's connection go on.
    for key in &acked {
        assert_eq!(get(a.addr(), key).status, 200);
    }
    assert!(
        metric(
            &a,
            "pollbox_ingest_messages_total{result=\"log_unavailable\"}"
        ) >= 3
    );

    broker.restart();
    // Ingest works again once the clients reconnect: the producer's and
    // each consuming thread's (they back off on their own, so on a loaded
    // machine one partition may come back seconds after the other: 503s
    // meanwhile).
    until("ingest through the log again", || {
        post(a.addr(), "/v1/boxes/after", r#"{"value":2}"#).status == 200
            && post(a.addr(), "/v1/boxes/before-0", r#"{"value":7}"#).status == 200
    });
    acked.push("/v1/boxes/after".into());
    stream.read_until_contains("\"v\":7");
    // Nothing acknowledged was lost, on this node or on one that reads the
    // log from its start.
    let b = node(&broker, "t", None);
    until("B ready", || ready(&b));
    for key in &acked {
        assert_eq!(get(a.addr(), key).status, 200, "{key} on A");
        assert_eq!(get(b.addr(), key).status, 200, "{key} on B");
    }
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

/// HAProxy with `deploy/haproxy/haproxy-replicas.cfg.tmpl` in front of `nodes`,
/// stopped when dropped.
struct Front {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Front {
    fn start(nodes: [std::net::SocketAddr; 2]) -> Front {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = std::process::Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(common::kafka::repo_root().join("deploy/haproxy/haproxy-replicas.cfg.tmpl"))
            .env("FRONT_PORT", port.to_string())
            .env("NODE1", nodes[0].to_string())
            .env("NODE2", nodes[1].to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("haproxy on PATH (apt-get install haproxy)");
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        until("haproxy listens", || {
            std::net::TcpStream::connect(addr).is_ok()
        });
        Front { child, addr }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka) and haproxy"]
fn behind_haproxy_any_node_serves_any_box_and_one_going_away_loses_nothing() {
    let broker = Broker::start();
    broker.create_topic("front", 4);
    let (a, b) = (node(&broker, "front", None), node(&broker, "front", None));
    until("both nodes ready", || ready(&a) && ready(&b));
    let front = Front::start([a.addr(), b.addr()]);
    // Ingest through the front: a batch of many keys, routed to no node in
    // particular (any node takes any key).
    let body: String = (0..20)
        .map(|i| format!(r#"{{"key":"f{i}","value":{i}}}"#))
        .collect::<Vec<_>>()
        .join("\n");
    let r = raw(
        front.addr,
        format!(
            "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .0;
    assert_eq!(r.text(), r#"{"accepted":20,"rejected":0,"errors":[]}"#);
    for s in [&a, &b] {
        until("every key on both nodes", || {
            (0..20).all(|i| get(s.addr(), &format!("/v1/boxes/f{i}")).status == 200)
        });
    }
    // Polls through the front, on fresh connections (least connections sends
    // them to both nodes): one payload and one ETag for each box.
    for i in 0..20 {
        let path = format!("/v1/boxes/f{i}");
        let (p, direct_a, direct_b) = (
            get(front.addr, &path),
            get(a.addr(), &path),
            get(b.addr(), &path),
        );
        assert_eq!(p.text(), direct_a.text());
        assert_eq!(p.text(), direct_b.text());
        assert_eq!(direct_a.header("etag"), direct_b.header("etag"));
    }
    // One node goes away: the front goes on with the other, every box there.
    a.shutdown().unwrap();
    for i in 0..20 {
        let r = get(front.addr, &format!("/v1/boxes/f{i}"));
        assert_eq!(r.status, 200, "f{i} after node A left");
        assert_eq!(r.json()["v"], i);
    }
    let r = post(front.addr, "/v1/boxes/f0", r#"{"value":100}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["sum"], 100);
    drop(front);
    b.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn records_in_every_compression_codec_are_read() {
    let broker = Broker::start();
    broker.create_topic("codecs", 1);
    let a = node(&broker, "codecs", None);
    until("ready", || ready(&a));
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let p = broker.producer_with(&[("compression.type", codec)]);
        p.send(
            "codecs",
            Some(codec),
            Some(r#"{"value":1,"cargo":"xxxxxxxxxxxxxxxx"}"#),
        );
    }
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let path = format!("/v1/boxes/{codec}");
        until(codec, || get(a.addr(), &path).status == 200);
    }
    assert_eq!(
        metric(&a, "pollbox_log_records_total{result=\"invalid\"}"),
        0
    );
    a.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_keys_records_land_in_one_partition_whoever_produces_them() {
    let broker = Broker::start();
    broker.create_topic("keys", 4);
    let a = node(&broker, "keys", None);
    until("ready", || ready(&a));
    // Kafka's Java client (and most others) partition keyed records by murmur2.
    let java_like = broker.producer_with(&[("partitioner", "murmur2_random")]);
    for i in 0..40 {
        let path = format!("/v1/boxes/k{i}");
        assert_eq!(post(a.addr(), &path, r#"{"value":1}"#).status, 200);
        java_like.send("keys", Some(&format!("k{i}")), Some(r#"{"value":2}"#));
    }
    for i in 0..40 {
        let path = format!("/v1/boxes/k{i}");
        until("both records of the key", || {
            get(a.addr(), &path).text().contains("\"sum\":3")
        });
    }
    assert_eq!(
        metric(&a, "pollbox_log_records_total{result=\"out_of_order\"}"),
        0
    );
    assert_eq!(
        metric(&a, "pollbox_log_records_total{result=\"replayed\"}"),
        0
    );
    a.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_producer_on_another_partitioner_changes_nothing_acknowledged_and_replays_agree() {
    use pollbox_core::log::home_partition;
    use std::collections::BTreeMap;
    const PARTS: i32 = 4;
    let broker = Broker::start();
    broker.create_topic("mixed", PARTS);
    let a = node(&broker, "mixed", None);
    until("ready", || ready(&a));
    // librdkafka's own default partitioner (CRC32): what a plain
    // confluent-kafka, Go or Node producer does.
    let foreign = broker.producer_with(&[("partitioner", "consistent_random")]);
    let keys: Vec<String> = (0..10).map(|k| format!("mx-{k}")).collect();
    // Per key: HTTP ingests acknowledged, foreign records in the home
    // partition (valid records where they belong: applied), and elsewhere.
    let mut applied: BTreeMap<&str, u64> = BTreeMap::new();
    let mut misplaced = 0;
    for round in 0..8 {
        for key in &keys {
            let r = post(
                a.addr(),
                &format!("/v1/boxes/{key}"),
                r#"{"value":1,"player":"http"}"#,
            );
            assert_eq!(r.status, 200, "round {round} {key}: {}", r.text());
            let n = applied.entry(key).or_default();
            *n += 1;
            assert_eq!(
                r.json()["n"].as_u64(),
                Some(*n),
                "the answer is the box with this message applied: {}",
                r.text()
            );
            let (p, _) = foreign.send("mixed", Some(key), Some(r#"{"value":1000,"player":"py"}"#));
            if p == home_partition(key.as_bytes(), PARTS as u32) {
                *n += 1;
            } else {
                misplaced += 1;
            }
        }
    }
    assert!(misplaced > 0, "CRC32 put some keys elsewhere than murmur2");
    // The last foreign records are applied (or skipped) before the marker.
    for key in &keys {
        let r = post(
            a.addr(),
            &format!("/v1/boxes/{key}"),
            r#"{"value":1,"player":"end"}"#,
        );
        assert_eq!(r.status, 200);
        *applied.get_mut(key.as_str()).unwrap() += 1;
    }
    let fresh = node(&broker, "mixed", None);
    until("a node replaying from nothing", || ready(&fresh));
    for key in &keys {
        let path = format!("/v1/boxes/{key}");
        let (x, y) = (get(a.addr(), &path), get(fresh.addr(), &path));
        assert_eq!(
            x.json()["n"].as_u64(),
            Some(applied[key.as_str()]),
            "{key}: {}",
            x.text()
        );
        assert_eq!(x.text(), y.text(), "{key}: same bytes");
        assert_eq!(x.header("etag"), y.header("etag"), "{key}: same ETag");
    }
    for s in [&a, &fresh] {
        assert_eq!(
            metric(s, "pollbox_log_records_total{result=\"wrong_partition\"}"),
            misplaced
        );
        assert_eq!(
            metric(s, "pollbox_log_records_total{result=\"out_of_order\"}"),
            0
        );
    }
    a.shutdown().unwrap();
    fresh.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn partitions_added_to_the_topic_halt_the_node_unready_with_ingest_refused() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    let broker = Broker::start();
    broker.create_topic("grow", 2);
    let a = node(&broker, "grow", None);
    until("ready", || ready(&a));
    assert_eq!(post(a.addr(), "/v1/boxes/g", r#"{"value":1}"#).status, 200);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &broker.bootstrap)
        .create()
        .unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
    let grown = futures_executor::block_on(
        admin.create_partitions([&NewPartitions::new("grow", 3)], &opts),
    )
    .unwrap();
    for r in grown {
        r.unwrap();
    }
    until("halted", || metric(&a, "pollbox_log_halted") == 1);
    assert_eq!(get(a.addr(), "/readyz").status, 503);
    let r = post(a.addr(), "/v1/boxes/g", r#"{"value":1}"#);
    assert_eq!(r.status, 503, "{}", r.text());
    // Polls go on with what the node holds.
    assert_eq!(get(a.addr(), "/v1/boxes/g").status, 200);
    a.shutdown().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn an_ingest_in_flight_at_shutdown_is_answered_with_its_records_fate() {
    // A rolling restart SIGTERMs a node while ingests wait for the log: the
    // consumer goes on until the workers have drained, so each is answered
    // with what became of its record, not 503 at its deadline.
    let broker = Broker::start();
    broker.create_topic("drain", 1);
    let mut c = log_config(&broker, "drain", None);
    c.log.ack_timeout_ms = 60_000;
    let a = start(c);
    until("ready", || ready(&a));
    broker.signal("STOP");
    let mut waiting = Reader::new(connect(a.addr()));
    let body = r#"{"value":7}"#;
    waiting.send(
        format!(
            "POST /v1/boxes/d HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    // The record is produced (the broker, stopped, cannot take it yet).
    std::thread::sleep(Duration::from_millis(500));
    let stopping = std::thread::spawn(move || a.shutdown());
    std::thread::sleep(Duration::from_millis(500));
    broker.signal("CONT");
    let r = waiting.read(false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains(r#""v":7"#), "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    stopping.join().unwrap().unwrap();
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn the_producers_queue_is_emptied_as_records_are_delivered() {
    // The client's queue counts a record until its delivery report is
    // served: unserved, it fills after this many and every ingest is 503.
    let broker = Broker::start();
    broker.create_topic("queue", 2);
    let mut c = log_config(&broker, "queue", None);
    c.log
        .client
        .insert("queue.buffering.max.messages".into(), "500".into());
    let a = start(c);
    until("ready", || ready(&a));
    let batch: String = (0..100)
        .map(|i| format!(r#"{{"key":"q{i}","value":1}}"#))
        .collect::<Vec<_>>()
        .join(",");
    for round in 0..40 {
        let r = post(a.addr(), "/v1/ingest", &format!("[{batch}]"));
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        assert_eq!(r.json()["accepted"], 100, "round {round}: {}", r.text());
    }
    assert!(get(a.addr(), "/v1/boxes/q7").text().contains(r#""n":40"#));
    a.shutdown().unwrap();
}
