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
#[path = "common/wal_history.rs"]
mod wal_history;

use std::net::TcpStream;
use wal_history::{check, post, run, spawn, write_config, History, Op, Outcome};

const ROUNDS: usize = 20;

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
