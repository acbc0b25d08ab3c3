//! What a node of a log checks before it reads it (docs/operations.md#the-kafka-log),
//! through the real binary: a broker name that does not resolve, a port
//! nothing listens on and a missing topic each get their own message within
//! seconds and make `check-config` exit non-zero; a topic that can lose
//! acknowledged records (one broker: replication factor 1) is refused by
//! `serve` (exit 78) and `check-config`, unless `log.allow_unsafe_topic`,
//! which the node says at start and exports.
//!
//! The first test needs no broker; the others are ignored without one
//! (`.ci/run` runs them).

mod common;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn write(dir: &Path, name: &str, brokers: &str, topic: &str, allow: bool) -> PathBuf {
    let f = dir.join(format!("{name}.toml"));
    std::fs::write(
        &f,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n[log]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\nallow_unsafe_topic = {allow}\n"
        ),
    )
    .unwrap();
    f
}

/// `check-config FILE`: whether it passed, what it said, how long it took.
fn check_config(file: &Path) -> (bool, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["check-config".as_ref(), file.as_os_str()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text, t.elapsed())
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn check_config_tells_a_name_that_does_not_resolve_from_a_closed_port() {
    let dir = common::tmpdir("topic-reach");
    let f = write(&dir, "dns", "kafka-1.invalid:9092", "t", false);
    let (ok, text, took) = check_config(&f);
    assert!(!ok, "{text}");
    assert!(
        text.contains("kafka-1.invalid:9092 does not resolve"),
        "{text}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");

    let f = write(
        &dir,
        "port",
        &format!("127.0.0.1:{}", closed_port()),
        "t",
        false,
    );
    let (ok, text, took) = check_config(&f);
    assert!(!ok, "{text}");
    assert!(text.contains("no broker accepts a connection"), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_topic_that_can_lose_acknowledged_records_is_refused_unless_allowed() {
    let broker = kafka::Broker::start();
    let dir = common::tmpdir("topic-unsafe");
    // Missing: its own message, non-zero.
    let f = write(&dir, "missing", &broker.bootstrap, "nope", false);
    let (ok, text, took) = check_config(&f);
    assert!(!ok, "{text}");
    assert!(text.contains("topic nope does not exist"), "{text}");
    assert!(took < Duration::from_secs(15), "{took:?}");

    // One broker: replication factor 1, min.insync.replicas 1; compacted too.
    broker.create_topic_with("weak", 2, 1, &[("cleanup.policy", "compact")]);
    let f = write(&dir, "weak", &broker.bootstrap, "weak", false);
    let (ok, text, _) = check_config(&f);
    assert!(!ok, "{text}");
    for said in [
        "topic weak can lose acknowledged records",
        "replication factor 1",
        "min.insync.replicas=1",
        "cleanup.policy=compact",
        "log.allow_unsafe_topic",
    ] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    // serve refuses it: exit 78 (a setting to fix), with the same reasons.
    let out = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["serve".as_ref(), "--config".as_ref(), f.as_os_str()])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("replication factor 1"), "{err}");

    // Allowed: check-config passes with a warning; serve says so and
    // exports it.
    let f = write(&dir, "allowed", &broker.bootstrap, "weak", true);
    let (ok, text, _) = check_config(&f);
    assert!(ok, "{text}");
    assert!(text.contains("WARNING"), "{text}");
    let (mut server, addr, said) =
        common::serve(["serve".as_ref(), "--config".as_ref(), f.as_os_str()], &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let m = common::request(&mut s, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
        if m.is_some_and(|(_, body)| body.contains("pollbox_log_unsafe_topic 1\n")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pollbox_log_unsafe_topic never 1"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(&mut server);
    let lines = said.join().unwrap().join("\n");
    assert!(lines.contains("WARNING"), "{lines}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn stop(server: &mut common::Server) {
    let _ = server.kill();
    let _ = server.wait();
}
