//! Durability through the real binary: SIGTERM under concurrent ingest loses no
//! acknowledged update; kill -9 after a snapshot interval restores the boxes; no
//! ETag, `after` or `Last-Event-ID` a client received is answered as current for
//! other content after a graceful restart, a restart without snapshots, a crash,
//! or on another node (docs/boxes.md#versions-and-etags); a corrupt snapshot or an
//! unwritable snapshot directory is refused at start.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Start `pollbox serve --config cfg`.
fn spawn(cfg: &Path) -> (common::Server, SocketAddr) {
    let (child, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    (child, addr)
}

fn ingest(s: &mut TcpStream, key: &str, value: u64) -> Option<u64> {
    let body = format!(r#"{{"value":{value}}}"#);
    let req = format!(
        "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (code, body) = common::request(s, req.as_bytes())?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["ver"].as_u64()
}

fn version(addr: SocketAddr, key: &str) -> Option<u64> {
    let mut s = TcpStream::connect(addr).unwrap();
    let (code, body) = common::request(
        &mut s,
        format!("GET /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )?;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["ver"].as_u64()
}

fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sigterm_under_concurrent_ingest_loses_no_acknowledged_update() {
    let dir = common::tmpdir("sigterm");
    let cfg = common::snapshot_config(&dir, 3600);
    let (mut child, addr) = spawn(&cfg);
    let acked: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (acked, stop) = (acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    return;
                };
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("t{t}-{}", i % 50);
                    match ingest(&mut s, &key, i) {
                        Some(v) => {
                            acked.lock().unwrap().insert(key, v);
                        }
                        None => return,
                    }
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    signal(&child, "-TERM");
    let status = child.wait().unwrap();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(status.success(), "exit status {status:?}");
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 50, "load ran ({} keys acked)", acked.len());

    let (mut child, addr) = spawn(&cfg);
    for (key, v) in &acked {
        let got = version(addr, key);
        assert!(
            got.is_some_and(|g| g >= *v),
            "{key}: acked {v}, restored {got:?}"
        );
    }
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

#[test]
fn kill_9_after_a_snapshot_interval_restores_the_boxes() {
    let dir = common::tmpdir("kill9");
    let cfg = common::snapshot_config(&dir, 1);
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let mut last = Vec::new();
    for k in 0..100 {
        let first = ingest(&mut s, &format!("k{k}"), 0).expect("ingested");
        for v in 1..3 {
            assert_eq!(ingest(&mut s, &format!("k{k}"), v), Some(first + v));
        }
        last.push(first + 2);
    }
    std::thread::sleep(Duration::from_millis(2500));
    signal(&child, "-KILL");
    let _ = child.wait();
    let (mut child, addr) = spawn(&cfg);
    for (k, last) in last.iter().enumerate() {
        let body = get_body(addr, &format!("k{k}")).expect("restored");
        assert!(body.contains(r#""v":2,"sum":3,"n":3"#), "k{k}: {body}");
        // Re-stamped: the crashed process may have served more versions.
        let got = version(addr, &format!("k{k}")).expect("restored");
        assert!(got > *last, "k{k}: {got} after {last}");
    }
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

fn get_body(addr: SocketAddr, key: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    let req = format!("GET /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\n\r\n");
    match common::request(&mut s, req.as_bytes())? {
        (200, body) => Some(body),
        _ => None,
    }
}

/// One request on a fresh connection: (status, ETag, body). Reads 204 and 304
/// answers, which carry no body.
fn exchange(addr: SocketAddr, req: &str) -> (u16, Option<String>, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = s.read(&mut tmp).unwrap();
        assert!(n > 0, "closed before an answer to {req:?}");
        buf.extend_from_slice(&tmp[..n]);
        let mut h = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(head)) = r.parse(&buf) {
            let code = r.code.unwrap();
            let field = |name: &str| {
                r.headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case(name))
                    .map(|h| String::from_utf8_lossy(h.value).into_owned())
            };
            let len: usize = match code {
                204 | 304 => 0,
                _ => field("content-length").unwrap().parse().unwrap(),
            };
            if buf.len() >= head + len {
                let body = String::from_utf8_lossy(&buf[head..head + len]).into_owned();
                return (code, field("etag"), body);
            }
        }
    }
}

#[test]
fn a_key_created_again_after_a_restart_never_reuses_an_etag_or_a_version() {
    let dir = common::tmpdir("incarnation");
    let cfg = common::snapshot_config(&dir, 3600);
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let first = ingest(&mut s, "round", 0).expect("ingested");
    for v in 1..3 {
        assert_eq!(ingest(&mut s, "round", v), Some(first + v));
    }
    let kept = ingest(&mut s, "kept", 1).expect("ingested");
    let (code, old_etag, _) = exchange(addr, "GET /v1/boxes/round HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(code, 200);
    let old_etag = old_etag.expect("an ETag");
    assert_eq!(old_etag, format!("\"{}\"", first + 2));
    let (code, ..) = exchange(addr, "DELETE /v1/boxes/round HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(code, 204);
    // A graceful stop writes the snapshot ("kept" and the version floor) and
    // seals it: nothing was served past it.
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
    assert!(dir.join("boxes.snap.sealed").exists(), "sealed at the stop");

    let (mut child, addr) = spawn(&cfg);
    assert!(!dir.join("boxes.snap.sealed").exists(), "unsealed at start");
    assert_eq!(version(addr, "round"), None, "a deleted box stays deleted");
    let (code, etag, _) = exchange(
        addr,
        &format!("GET /v1/boxes/kept HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"{kept}\"\r\n\r\n"),
    );
    let kept_etag = format!("\"{kept}\"");
    assert_eq!(
        (code, etag.as_deref()),
        (304, Some(kept_etag.as_str())),
        "kept keeps its ETag"
    );
    let mut s = TcpStream::connect(addr).unwrap();
    let versions: Vec<u64> = (0..3)
        .map(|v| ingest(&mut s, "round", v).expect("ingested"))
        .collect();
    assert!(
        versions[0] > first + 2,
        "the new incarnation starts past {}: {versions:?}",
        first + 2
    );
    let (code, new_etag, body) = exchange(addr, "GET /v1/boxes/round HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(code, 200);
    assert_ne!(new_etag.as_deref(), Some(old_etag.as_str()));
    assert!(body.contains("\"n\":3"), "a new box: {body}");
    let (code, ..) = exchange(
        addr,
        &format!("GET /v1/boxes/round HTTP/1.1\r\nHost: t\r\nIf-None-Match: {old_etag}\r\n\r\n"),
    );
    assert_eq!(code, 200, "the old ETag does not match the new box");
    // A long-poll from the old incarnation is answered at once (parked, it
    // would get 304 only after max_wait_ms, 30 s).
    let (code, etag, _) = exchange(
        addr,
        &format!(
            "GET /v1/boxes/round?after={}&wait_ms=60000 HTTP/1.1\r\nHost: t\r\n\r\n",
            first + 2
        ),
    );
    assert_eq!(code, 200);
    assert_eq!(etag, new_etag);
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

/// What a client of `key` that last saw `held` (its ETag's value, its `after`,
/// its event stream's last id) is answered, checked all three ways: it must be
/// told the box at once, with a version past `held`, never 304 or a wait.
fn answered_past(addr: SocketAddr, key: &str, held: u64) -> u64 {
    let (code, etag, _) = exchange(
        addr,
        &format!("GET /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nIf-None-Match: \"{held}\"\r\n\r\n"),
    );
    assert_eq!(code, 200, "If-None-Match: \"{held}\" on {key}");
    let now: u64 = etag.expect("an ETag").trim_matches('"').parse().unwrap();
    assert!(now > held, "{key}: {now} is not past {held}");
    let (code, etag, _) = exchange(
        addr,
        &format!("GET /v1/boxes/{key}?after={held}&wait_ms=60000 HTTP/1.1\r\nHost: t\r\n\r\n"),
    );
    assert_eq!(
        (code, etag),
        (200, Some(format!("\"{now}\""))),
        "after={held} on {key}"
    );
    assert_eq!(
        first_event(addr, key, held),
        now,
        "Last-Event-ID: {held} on {key}"
    );
    now
}

/// The id of the first event a stream resuming from `last_id` is sent.
fn first_event(addr: SocketAddr, key: &str, last_id: u64) -> u64 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "GET /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\nLast-Event-ID: {last_id}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = s.read(&mut tmp).unwrap();
        assert!(
            n > 0,
            "the stream closed before an event: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&tmp[..n]);
        let text = String::from_utf8_lossy(&seen);
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix("id: ")) {
            if text.contains("\ndata: ") {
                return line.trim().parse().unwrap();
            }
        }
    }
}

#[test]
fn no_version_a_client_holds_is_current_for_other_content_after_a_restart_or_a_crash() {
    // Without snapshots: a restart forgets the boxes; they start past the clock.
    let dir = common::tmpdir("nosnap");
    let cfg = dir.join("pollbox.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n").unwrap();
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    ingest(&mut s, "r", 5).expect("ingested");
    let held = ingest(&mut s, "r", 6).expect("ingested");
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let fresh = ingest(&mut s, "r", 99).expect("ingested");
    assert!(fresh > held, "{fresh} after {held}");
    assert_eq!(answered_past(addr, "r", held), fresh);
    signal(&child, "-KILL");
    let _ = child.wait();
    // The same after kill -9.
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let again = ingest(&mut s, "r", 7).expect("ingested");
    assert_eq!(answered_past(addr, "r", fresh), again);
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());

    // With snapshots, a crash: versions served after the last snapshot are
    // never served again for other content (the restored boxes are re-stamped).
    let dir = common::tmpdir("crash");
    let cfg = common::snapshot_config(&dir, 3600);
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    ingest(&mut s, "r", 1).expect("ingested");
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
    // Restarted from the sealed snapshot, then served past it, then killed:
    // the next start must not trust the seal again.
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let held = ingest(&mut s, "r", 2).expect("ingested");
    signal(&child, "-KILL");
    let _ = child.wait();
    let (mut child, addr) = spawn(&cfg);
    let body = get_body(addr, "r").expect("restored");
    assert!(body.contains(r#""v":1,"#), "the snapshot's state: {body}");
    answered_past(addr, "r", held);
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_key_that_moves_to_another_node_starts_past_the_versions_it_had() {
    // Node B started first (its start is no floor for A's versions), A after.
    let dir = common::tmpdir("moved");
    let cfg = dir.join("pollbox.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n").unwrap();
    let (mut b, b_addr) = spawn(&cfg);
    let (mut a, a_addr) = spawn(&cfg);
    let mut s = TcpStream::connect(a_addr).unwrap();
    let mut held = 0;
    for v in 0..50 {
        held = ingest(&mut s, "r", v).expect("ingested");
    }
    // A goes down; the balancer sends the key to B, which creates it.
    signal(&a, "-KILL");
    let _ = a.wait();
    let mut s = TcpStream::connect(b_addr).unwrap();
    let moved = ingest(&mut s, "r", 1).expect("ingested");
    assert_eq!(answered_past(b_addr, "r", held), moved);
    signal(&b, "-TERM");
    assert!(b.wait().unwrap().success());
}

fn start_fails(cfg: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["serve", "--config"])
        .arg(cfg)
        .output()
        .unwrap();
    assert!(!out.status.success(), "must refuse to start");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn corrupt_or_truncated_snapshot_is_refused_at_start() {
    let dir = common::tmpdir("corrupt");
    let cfg = common::snapshot_config(&dir, 3600);
    let (mut child, addr) = spawn(&cfg);
    let mut s = TcpStream::connect(addr).unwrap();
    let mut k7 = 0;
    for k in 0..20 {
        let v = ingest(&mut s, &format!("k{k}"), 1).expect("ingested");
        if k == 7 {
            k7 = v;
        }
    }
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
    let snap = dir.join("boxes.snap");
    let good = std::fs::read(&snap).unwrap();

    std::fs::write(&snap, &good[..good.len() / 2]).unwrap();
    let err = start_fails(&cfg);
    assert!(
        err.contains("snapshot") && err.contains("truncated"),
        "{err}"
    );

    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    std::fs::write(&snap, &flipped).unwrap();
    let err = start_fails(&cfg);
    assert!(err.contains("snapshot"), "{err}");

    std::fs::write(&snap, &good).unwrap();
    let (mut child, addr) = spawn(&cfg);
    // Refused starts serve nothing: the seal still holds, the versions stay.
    assert_eq!(version(addr, "k7"), Some(k7));
    signal(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

#[test]
fn unwritable_snapshot_directory_is_reported_at_start() {
    let dir = common::tmpdir("nodir");
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        "[server]\nlisten = \"127.0.0.1:0\"\n[snapshot]\npath = \"/proc/pollbox/boxes.snap\"\n",
    )
    .unwrap();
    let err = start_fails(&cfg);
    assert!(err.contains("not writable"), "{err}");
}
