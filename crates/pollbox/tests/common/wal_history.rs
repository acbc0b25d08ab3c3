//! The load, history and checker of the write-ahead file's crash tests
//! (wal_crash.rs: kill -9; power_loss.rs: a power cut simulated under the
//! server): clients ingesting single messages and batches on shared keys,
//! each request's outcome, reads after each restart, and the checker.
//! Included with `#[path]` by those two test binaries only.

#![allow(dead_code)] // each test binary uses what it needs

use super::common;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const KEYS: usize = 8;

pub fn write_config(dir: &Path) -> PathBuf {
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

pub fn spawn(cfg: &Path, envs: &[(&str, &str)]) -> (common::Server, SocketAddr) {
    let (child, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        envs,
    );
    (child, addr)
}

/// What one request did.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// 200: every message applied; a single message's answer is its box.
    Acked(Option<String>),
    /// Another status: maybe applied (a timeout), maybe not.
    Refused,
    /// The connection failed before an answer (the kill): maybe applied.
    Unknown,
}

/// One request: its messages (key, value) and what came back.
#[derive(Debug, Clone)]
pub struct Op {
    pub messages: Vec<(usize, u64)>,
    pub outcome: Outcome,
}

/// Everything the clients and the reads after each restart saw.
#[derive(Debug, Default, Clone)]
pub struct History {
    pub ops: Vec<Op>,
    /// After each restart: each key's payload (None: no box).
    pub reads: Vec<Vec<Option<String>>>,
}

/// A payload's `ver`, `n` and `sum`.
pub fn fields(payload: &str) -> (u64, u64, u64) {
    let v: serde_json::Value = serde_json::from_str(payload).unwrap();
    let f = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {payload}"));
    (f("ver"), f("n"), f("sum"))
}

/// The checker. Reads are checked against the requests made before them.
pub fn check(h: &History, ops_before_read: &[usize]) -> Result<(), String> {
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

pub fn post(s: &mut TcpStream, path: &str, body: &str) -> Option<(u16, String)> {
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

pub fn read_all(addr: SocketAddr) -> Vec<Option<String>> {
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
pub fn run(name: &str, rounds: usize, envs: &[(&str, &str)]) -> (History, Vec<usize>) {
    let dir = common::tmpdir(name);
    run_in(
        &dir,
        rounds,
        envs,
        |round| (20 + (round * 37) % 200, round % 4 == 3),
        |_| {},
    )
}

/// [`run`] in `dir`: before round `r`'s kill the load waits for
/// `kill_at(r).0` answers and, if `kill_at(r).1`, past a snapshot; after
/// the kill and before the restart `crash(dir)` runs (a power cut).
pub fn run_in(
    dir: &Path,
    rounds: usize,
    envs: &[(&str, &str)],
    mut kill_at: impl FnMut(usize) -> (usize, bool),
    mut crash: impl FnMut(&Path),
) -> (History, Vec<usize>) {
    let cfg = write_config(dir);
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
        let (want, past_snapshot) = kill_at(round);
        let began = std::time::Instant::now();
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
        crash(dir);
        (child, addr) = spawn(&cfg, envs);
        before.push(h.ops.len());
        h.reads.push(read_all(addr));
    }
    child.kill().unwrap();
    (h, before)
}
