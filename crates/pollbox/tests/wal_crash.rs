//! A standalone node with a write-ahead file (docs/operations.md#the-write-ahead-file)
//! killed with `kill -9` while clients ingest loses nothing it acknowledged:
//! 20 rounds of load (single messages and NDJSON batches on shared keys),
//! each ended by SIGKILL at a moment the load chooses, then a restart. A
//! history of every request's outcome (acknowledged, refused, unknown) and
//! every payload seen goes to a checker: each box holds at least every
//! acknowledged message (its `n` and `sum`), at most every one sent, at a
//! version no lower than one acknowledged, and one version is one payload
//! wherever it was seen (an ingest's answer, a read after a restart).
//!
//! The checker is shown to catch what it is for: on a doctored history, and
//! on a build that answers before it writes (`POLLBOX_TEST_WAL_ACK_EARLY`,
//! debug builds only). A failed sync (`POLLBOX_TEST_WAL_FAIL_SYNC_AFTER`)
//! stops acknowledging and turns `/readyz` 503 with the reason.

mod common;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEYS: usize = 8;
const ROUNDS: usize = 20;

fn write_config(dir: &Path) -> PathBuf {
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
             [snapshot]\npath = \"{}\"\ninterval_s = 1\n\
             [wal]\npath = \"{}\"\nsegment_bytes = 65536\n",
            dir.join("boxes.snap").display(),
            dir.join("wal").display()
        ),
    )
    .unwrap();
    cfg
}

fn spawn(cfg: &Path, envs: &[(&str, &str)]) -> (common::Server, SocketAddr) {
    let (child, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        envs,
    );
    (child, addr)
}

/// What one request did.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// 200: every message applied; a single message's answer is its box.
    Acked(Option<String>),
    /// Another status: maybe applied (a timeout), maybe not.
    Refused,
    /// The connection failed before an answer (the kill): maybe applied.
    Unknown,
}

/// One request: its messages (key, value) and what came back.
#[derive(Debug, Clone)]
struct Op {
    messages: Vec<(usize, u64)>,
    outcome: Outcome,
}

/// Everything the clients and the reads after each restart saw.
#[derive(Debug, Default, Clone)]
struct History {
    ops: Vec<Op>,
    /// After each restart: each key's payload (None: no box).
    reads: Vec<Vec<Option<String>>>,
}

/// A payload's `ver`, `n` and `sum`.
fn fields(payload: &str) -> (u64, u64, u64) {
    let v: serde_json::Value = serde_json::from_str(payload).unwrap();
    let f = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {payload}"));
    (f("ver"), f("n"), f("sum"))
}

/// The checker. Reads are checked against the requests made before them.
fn check(h: &History, ops_before_read: &[usize]) -> Result<(), String> {
    let mut seen: HashMap<(usize, u64), String> = HashMap::new();
    let mut note = |key: usize, payload: &str| -> Result<(), String> {
        let (ver, _, _) = fields(payload);
        match seen.insert((key, ver), payload.to_string()) {
            Some(other) if other != payload => Err(format!(
                "k{key} version {ver} was served as {other} and as {payload}"
            )),
            _ => Ok(()),
        }
    };
    for op in &h.ops {
        if let Outcome::Acked(Some(p)) = &op.outcome {
            note(op.messages[0].0, p)?;
        }
    }
    for (r, read) in h.reads.iter().enumerate() {
        let ops = &h.ops[..ops_before_read[r]];
        for (key, payload) in read.iter().enumerate() {
            let (mut acked_n, mut acked_sum, mut sent_n, mut sent_sum, mut acked_ver) =
                (0, 0, 0, 0, 0);
            for op in ops {
                let acked = matches!(op.outcome, Outcome::Acked(_));
                for &(k, v) in op.messages.iter().filter(|m| m.0 == key) {
                    sent_n += 1;
                    sent_sum += v;
                    if acked {
                        acked_n += 1;
                        acked_sum += v;
                    }
                    let _ = k;
                }
                if let Outcome::Acked(Some(p)) = &op.outcome {
                    if op.messages[0].0 == key {
                        acked_ver = acked_ver.max(fields(p).0);
                    }
                }
            }
            let (ver, n, sum) = match payload {
                Some(p) => {
                    note(key, p)?;
                    fields(p)
                }
                None if acked_n == 0 => continue,
                None => return Err(format!("read {r}: k{key} lost ({acked_n} acknowledged)")),
            };
            if n < acked_n || sum < acked_sum {
                return Err(format!(
                    "read {r}: k{key} has n={n} sum={sum}, {acked_n} messages (sum {acked_sum}) were acknowledged"
                ));
            }
            if n > sent_n || sum > sent_sum {
                return Err(format!(
                    "read {r}: k{key} has n={n} sum={sum}, only {sent_n} (sum {sent_sum}) were sent"
                ));
            }
            if ver < acked_ver {
                return Err(format!(
                    "read {r}: k{key} at version {ver}, {acked_ver} was acknowledged"
                ));
            }
        }
    }
    Ok(())
}

fn post(s: &mut TcpStream, path: &str, body: &str) -> Option<(u16, String)> {
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-ndjson\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    common::request(s, req.as_bytes())
}

/// One client's load until `stop`: client `c` sends single messages (even
/// `c`) or batches of 10 (odd), values from a small generator seeded by
/// round and client.
fn client(addr: SocketAddr, round: usize, c: usize, stop: &AtomicBool, ops: &Mutex<Vec<Op>>) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut x = (round * 7919 + c * 104_729 + 1) as u64;
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        x >> 33
    };
    while !stop.load(Ordering::Relaxed) {
        let batch = if c.is_multiple_of(2) { 1 } else { 10 };
        let messages: Vec<(usize, u64)> = (0..batch)
            .map(|_| ((next() as usize) % KEYS, 1 + next() % 9))
            .collect();
        let answer = if batch == 1 {
            let (k, v) = messages[0];
            post(
                &mut s,
                &format!("/v1/boxes/k{k}"),
                &format!(r#"{{"value":{v}}}"#),
            )
        } else {
            let body: Vec<String> = messages
                .iter()
                .map(|(k, v)| format!(r#"{{"key":"k{k}","value":{v}}}"#))
                .collect();
            post(&mut s, "/v1/ingest", &body.join("\n"))
        };
        let outcome = match answer {
            Some((200, body)) if batch == 1 => Outcome::Acked(Some(body)),
            Some((200, body)) if body.contains(r#""accepted":10,"#) => Outcome::Acked(None),
            Some(_) => Outcome::Refused,
            None => Outcome::Unknown,
        };
        let failed = outcome == Outcome::Unknown;
        ops.lock().unwrap().push(Op { messages, outcome });
        if failed {
            return;
        }
    }
}

fn read_all(addr: SocketAddr) -> Vec<Option<String>> {
    (0..KEYS)
        .map(|k| {
            let mut s = TcpStream::connect(addr).unwrap();
            let req = format!("GET /v1/boxes/k{k} HTTP/1.1\r\nHost: t\r\n\r\n");
            match common::request(&mut s, req.as_bytes()) {
                Some((200, body)) => Some(body),
                Some((404, _)) => None,
                other => panic!("k{k}: {other:?}"),
            }
        })
        .collect()
}

/// `rounds` of load ended by kill -9, each followed by a restart and a read:
/// the history, and how many requests came before each read.
fn run(name: &str, rounds: usize, envs: &[(&str, &str)]) -> (History, Vec<usize>) {
    let dir = common::tmpdir(name);
    let cfg = write_config(&dir);
    let mut h = History::default();
    let mut before = Vec::new();
    let (mut child, mut addr) = spawn(&cfg, envs);
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(Mutex::new(Vec::new()));
        let clients: Vec<_> = (0..4)
            .map(|c| {
                let (stop, ops) = (stop.clone(), ops.clone());
                std::thread::spawn(move || client(addr, round, c, &stop, &ops))
            })
            .collect();
        // Killed at a moment of the load's own choosing: after some answers,
        // and every fourth round past a snapshot (interval 1 s), so the
        // replay starts from a snapshot's position inside the file.
        let want = 20 + (round * 37) % 200;
        let began = std::time::Instant::now();
        let past_snapshot = round % 4 == 3;
        while (ops.lock().unwrap().len() < want
            || (past_snapshot && began.elapsed() < Duration::from_millis(1300)))
            && clients.iter().any(|c| !c.is_finished())
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap();
        let _ = child.wait();
        stop.store(true, Ordering::Relaxed);
        for c in clients {
            c.join().unwrap();
        }
        h.ops.extend(ops.lock().unwrap().drain(..));
        (child, addr) = spawn(&cfg, envs);
        before.push(h.ops.len());
        h.reads.push(read_all(addr));
    }
    child.kill().unwrap();
    (h, before)
}

#[test]
fn kill_9_under_single_and_batch_ingest_loses_nothing_acknowledged() {
    let (h, before) = run("wal-kill9", ROUNDS, &[]);
    let acked = h
        .ops
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Acked(_)))
        .count();
    assert!(acked >= ROUNDS * 20, "the load ran: {acked} acknowledged");
    assert!(
        h.ops
            .iter()
            .any(|o| o.messages.len() == 10 && matches!(o.outcome, Outcome::Acked(_))),
        "batches acknowledged"
    );
    if let Err(e) = check(&h, &before) {
        panic!("{e}");
    }
}

#[test]
fn the_checker_catches_a_doctored_history() {
    let single = |k: usize, v: u64, payload: &str| Op {
        messages: vec![(k, v)],
        outcome: Outcome::Acked(Some(payload.into())),
    };
    let good = History {
        ops: vec![
            single(0, 2, r#"{"k":"k0","ver":10,"v":2,"sum":2,"n":1}"#),
            single(0, 3, r#"{"k":"k0","ver":11,"v":3,"sum":5,"n":2}"#),
        ],
        reads: vec![vec![Some(
            r#"{"k":"k0","ver":11,"v":3,"sum":5,"n":2}"#.into(),
        )]],
    };
    assert_eq!(check(&good, &[2]), Ok(()));
    // An acknowledged message missing after the restart.
    let mut lost = good.clone();
    lost.reads[0][0] = Some(r#"{"k":"k0","ver":10,"v":2,"sum":2,"n":1}"#.into());
    assert!(check(&lost, &[2]).unwrap_err().contains("acknowledged"));
    // A version served again with other content.
    let mut lied = good.clone();
    lied.reads[0][0] = Some(r#"{"k":"k0","ver":11,"v":4,"sum":6,"n":2}"#.into());
    assert!(check(&lied, &[2]).unwrap_err().contains("served as"));
    // A box gone.
    let mut gone = good.clone();
    gone.reads[0][0] = None;
    assert!(check(&gone, &[2]).unwrap_err().contains("lost"));
    // More than was sent.
    let mut more = good;
    more.reads[0][0] = Some(r#"{"k":"k0","ver":12,"v":3,"sum":8,"n":3}"#.into());
    assert!(check(&more, &[2]).unwrap_err().contains("sent"));
}

#[test]
fn the_checker_catches_a_build_that_answers_before_it_writes() {
    let (h, before) = run("wal-early", 5, &[("POLLBOX_TEST_WAL_ACK_EARLY", "1")]);
    let verdict = check(&h, &before);
    assert!(verdict.is_err(), "answers lost to kill -9 must be caught");
    eprintln!("caught: {}", verdict.unwrap_err());
}

#[test]
fn a_failed_sync_stops_acknowledging_and_turns_unready_with_the_reason() {
    let dir = common::tmpdir("wal-sync-fail");
    let cfg = write_config(&dir);
    let (mut child, addr) = spawn(&cfg, &[("POLLBOX_TEST_WAL_FAIL_SYNC_AFTER", "3")]);
    let mut s = TcpStream::connect(addr).unwrap();
    let mut codes = Vec::new();
    for i in 0..6 {
        let (code, body) = post(&mut s, &format!("/v1/boxes/k{i}"), r#"{"value":1}"#).unwrap();
        codes.push(code);
        if code != 200 {
            assert_eq!(body, r#"{"error":"write-ahead file failed"}"#);
        }
    }
    assert_eq!(codes, [200, 200, 200, 503, 503, 503]);
    let mut r = TcpStream::connect(addr).unwrap();
    let (code, body) = common::request(&mut r, b"GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(code, 503);
    assert!(
        body.contains("fdatasync") && body.contains("failed"),
        "{body}"
    );
    let (code, _) =
        common::request(&mut r, b"GET /v1/boxes/k0 HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(code, 200, "polls go on");
    assert_eq!(
        common::request(&mut r, b"GET /v1/boxes/k3 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap()
            .0,
        404,
        "not applied"
    );
    let (_, metrics) =
        common::request(&mut r, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert!(
        metrics.contains("pollbox_wal_errors_total{kind=\"sync\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("pollbox_wal_failed 1"));
    child.kill().unwrap();
}

#[test]
fn damage_in_the_middle_refuses_serve_and_check_config_with_the_file_and_offset() {
    let dir = common::tmpdir("wal-damaged");
    let cfg = write_config(&dir);
    let (mut child, addr) = spawn(&cfg, &[]);
    let mut s = TcpStream::connect(addr).unwrap();
    for i in 0..5 {
        let (code, _) = post(&mut s, &format!("/v1/boxes/k{i}"), r#"{"value":1}"#).unwrap();
        assert_eq!(code, 200);
    }
    child.kill().unwrap();
    let _ = child.wait();
    let seg = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a segment");
    let mut bytes = std::fs::read(&seg).unwrap();
    // The first record's checksum (the segment's magic is 8 bytes).
    bytes[8 + 4] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    for args in [["check-config", ""], ["serve", "--config"]] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pollbox"));
        cmd.arg(args[0]);
        if !args[1].is_empty() {
            cmd.arg(args[1]);
        }
        let out = cmd.arg(&cfg).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must refuse: {said}");
        assert!(
            said.contains(&seg.display().to_string()),
            "{args:?}: {said}"
        );
        assert!(said.contains("offset 8 (a checksum"), "{args:?}: {said}");
    }
}
