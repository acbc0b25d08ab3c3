//! `pollbox migrate` (docs/operations.md#from-one-node-to-a-log): a
//! standalone node with a write-ahead file, killed with `kill -9` after
//! acknowledging updates, deletes and batches past its last snapshot, moved
//! into a real broker's topic. The cluster's nodes, started from copies of
//! the snapshot the migration wrote, serve every box byte for byte as the
//! standalone node served it (the same versions, so the same ETags), go on
//! past those versions, and agree; a node started without that snapshot
//! stops applying and says why; a second migration into the topic is
//! refused. Ignored without a broker; `.ci/run` runs it.

mod common;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use common::{get, request, serve, tmpdir};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const KEYS: usize = 40;

fn write(path: &Path, text: String) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

fn standalone(dir: &Path) -> PathBuf {
    write(
        &dir.join("standalone.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\
             [snapshot]\npath = \"{}\"\ninterval_s = 1\n\
             [wal]\npath = \"{}\"\n",
            dir.join("standalone.snap").display(),
            dir.join("wal").display()
        ),
    )
}

fn node(dir: &Path, name: &str, brokers: &str, topic: &str) -> PathBuf {
    write(
        &dir.join(format!("{name}.toml")),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n\
             [snapshot]\npath = \"{}\"\ninterval_s = 1\n\
             [log]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\nallow_unsafe_topic = true\n",
            dir.join(format!("{name}.snap")).display()
        ),
    )
}

fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-ndjson\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    request(&mut s, req.as_bytes()).expect("an answer")
}

/// Every box as `addr` serves it: (status, body), by key.
fn boxes(addr: SocketAddr) -> Vec<(u16, String)> {
    (0..KEYS)
        .map(|k| get(addr, &format!("/v1/boxes/k{k}")))
        .collect()
}

fn ver(body: &str) -> u64 {
    let at = body.find("\"ver\":").expect("a version") + 6;
    body[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a number")
}

/// Wait until `f` holds (at most 60 s).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn migrate(from: &Path, to: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["migrate".as_ref(), "--from".as_ref(), from.as_os_str()])
        .args(["--to".as_ref(), to.as_os_str()])
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka/install-deps.sh); .ci/run runs it"]
fn a_standalone_node_moves_to_a_log_with_every_box_at_the_version_it_served() {
    let dir = tmpdir("migrate");
    // The standalone node: boxes in its snapshot, then updates, deletes
    // and a batch in its write-ahead file only, then kill -9.
    let cfg = standalone(&dir);
    let (mut one, addr, _) = serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    for k in 0..KEYS {
        let (status, _) = send(addr, "POST", &format!("/v1/boxes/k{k}"), r#"{"value":1}"#);
        assert_eq!(status, 200);
    }
    until("a snapshot", || dir.join("standalone.snap").exists());
    std::thread::sleep(Duration::from_millis(200));
    for k in (0..KEYS).step_by(3) {
        assert_eq!(
            send(addr, "POST", &format!("/v1/boxes/k{k}"), r#"{"value":5}"#).0,
            200
        );
    }
    for k in [1, 7, 22] {
        assert_eq!(send(addr, "DELETE", &format!("/v1/boxes/k{k}"), "").0, 204);
    }
    let batch: String = (30..KEYS)
        .map(|k| format!("{{\"key\":\"k{k}\",\"value\":{k}}}\n"))
        .collect();
    assert_eq!(send(addr, "POST", "/v1/ingest", &batch).0, 200);
    let served = boxes(addr);
    one.kill().unwrap();
    one.wait().unwrap();
    assert!(served.iter().filter(|(s, _)| *s == 404).count() == 3);

    let broker = kafka::Broker::start();
    let topic = "migrated";
    broker.create_topic(topic, 3);
    let to = node(&dir, "a", &broker.bootstrap, topic);
    let out = migrate(&cfg, &to);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "migrate failed: {said}");
    assert!(said.contains("3 partitions"), "{said}");
    // A second node starts from a copy of the snapshot it wrote.
    std::fs::copy(dir.join("a.snap"), dir.join("b.snap")).unwrap();
    let b_cfg = node(&dir, "b", &broker.bootstrap, topic);

    let (_a, a, _) = serve(["serve".as_ref(), "--config".as_ref(), to.as_os_str()], &[]);
    until("node a ready", || get(a, "/readyz").0 == 200);
    assert_eq!(
        boxes(a),
        served,
        "every box at the version it was served at"
    );
    // Ingest through the log goes on past every version served, for a box
    // updated and for a deleted one created again.
    let highest = served
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| ver(b))
        .max()
        .unwrap();
    for k in ["k0", "k1"] {
        let (status, body) = send(a, "POST", &format!("/v1/boxes/{k}"), r#"{"value":9}"#);
        assert_eq!(status, 200, "{body}");
        assert!(ver(&body) > highest, "{body} after version {highest}");
    }

    let (_b, b, _) = serve(
        ["serve".as_ref(), "--config".as_ref(), b_cfg.as_os_str()],
        &[],
    );
    until("node b ready", || get(b, "/readyz").0 == 200);
    until("node b at node a's state", || boxes(b) == boxes(a));

    // A node without the snapshot reads the begin records: it stops
    // applying, is never ready, and says why.
    let c_cfg = node(&dir, "c", &broker.bootstrap, topic);
    let (mut c, c_addr, c_said) = serve(
        ["serve".as_ref(), "--config".as_ref(), c_cfg.as_os_str()],
        &[],
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(get(c_addr, "/readyz").0, 503);
    assert_eq!(get(c_addr, "/v1/boxes/k0").0, 404, "nothing applied");
    c.kill().unwrap();
    c.wait().unwrap();
    let lines = c_said.join().unwrap().join("\n");
    assert!(
        lines.contains("pollbox migrate") && lines.contains("stopped applying"),
        "{lines}"
    );

    // The topic holds records now: a migration into it is refused.
    let again = node(&dir, "d", &broker.bootstrap, topic);
    let out = migrate(&cfg, &again);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("holds records"), "{said}");
}
