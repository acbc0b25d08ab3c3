//! The errors of a node's Kafka clients (docs/operations.md#log-metrics),
//! through the real binary: counted by kind in
//! `pollbox_log_client_errors_total{kind}` and said in the node's log, with
//! its brokers unreachable from the start (no broker needed: runs always)
//! and with the broker killed (`kill -9`) under a running node (ignored
//! without a broker; `.ci/run` runs it).

mod common;
use common::get;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const KINDS: [&str; 5] = ["all_brokers_down", "transport", "auth", "fatal", "other"];

fn write(dir: &Path, brokers: &str, topic: &str) -> PathBuf {
    let f = dir.join("pollbox.toml");
    std::fs::write(
        &f,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n[log]\nbrokers = \"{brokers}\"\ntopic = \"{topic}\"\nallow_unsafe_topic = true\n"
        ),
    )
    .unwrap();
    f
}

/// Start `pollbox serve --config file`: the server, its address, and its
/// log lines as they come.
fn serve(file: &Path) -> (common::Server, SocketAddr, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["serve".as_ref(), "--config".as_ref(), file.as_os_str()])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, rx) = mpsc::channel();
    // The producer may say its first errors before the start-up line.
    let addr = loop {
        let line = lines.next().expect("a start-up line").unwrap();
        if let Some(addr) = common::listening_on(&line) {
            break addr;
        }
        let _ = tx.send(line);
    };
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (common::Server::from(child), addr, rx)
}

/// Read the node's log until a line holds `what` (at most 60 s).
fn said(lines: &Receiver<String>, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {what:?} in:\n{}", seen.join("\n")),
        }
    }
}

/// Each kind's count in `/metrics`.
fn client_errors(addr: SocketAddr) -> Vec<(String, u64)> {
    let (_, text) = get(addr, "/metrics");
    text.lines()
        .filter_map(|l| l.strip_prefix("pollbox_log_client_errors_total{kind=\""))
        .filter_map(|l| {
            let (kind, n) = l.split_once("\"} ")?;
            Some((kind.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

fn total(counts: &[(String, u64)]) -> u64 {
    counts.iter().map(|(_, n)| n).sum()
}

fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `promtool check metrics` on the node's exposition, where promtool is
/// installed (`.ci/run` installs it; the metrics test requires it).
fn promtool_accepts(addr: SocketAddr) {
    let (_, text) = get(addr, "/metrics");
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        eprintln!("promtool not installed: exposition not checked");
        return;
    };
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}

#[test]
fn a_node_whose_brokers_never_answer_counts_its_clients_errors_and_says_so() {
    let dir = common::tmpdir("log-client-unreachable");
    let f = write(&dir, &format!("127.0.0.1:{}", closed_port()), "t");
    let (_server, addr, lines) = serve(&f);
    // Every kind is exported from the start, at 0 or more.
    let kinds: Vec<String> = client_errors(addr).into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, KINDS);
    until("a client error counted", || total(&client_errors(addr)) > 0);
    let counts = client_errors(addr);
    let lost = |k: &str| counts.iter().any(|(kind, n)| kind == k && *n > 0);
    assert!(lost("transport") || lost("all_brokers_down"), "{counts:?}");
    assert_eq!(get(addr, "/readyz").0, 503);
    promtool_accepts(addr);
    // The producer's own errors (its client's queue, served by the delivery
    // thread), said in the log.
    said(&lines, "pollbox: log: producer: ");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_broker_killed_under_a_running_node_raises_its_clients_error_count() {
    let broker = kafka::Broker::start();
    broker.create_topic("killed", 2);
    let dir = common::tmpdir("log-client-killed");
    let f = write(&dir, &broker.bootstrap, "killed");
    let (_server, addr, lines) = serve(&f);
    until("ready", || get(addr, "/readyz").0 == 200);
    let before = total(&client_errors(addr));
    broker.signal("KILL");
    until("the client errors counted", || {
        total(&client_errors(addr)) > before
    });
    let counts = client_errors(addr);
    assert!(
        counts
            .iter()
            .any(|(k, n)| (k == "transport" || k == "all_brokers_down") && *n > 0),
        "{counts:?}"
    );
    // The node stays ready (the log lost while running), and the producer's
    // errors are said in the log, as the consumers' are.
    assert_eq!(get(addr, "/readyz").0, 200);
    said(&lines, "pollbox: log: producer: ");
    let _ = std::fs::remove_dir_all(&dir);
}
