//! The write-ahead file (docs/operations.md#the-write-ahead-file) on a real
//! server, real files: ingest answered once synced, every acknowledged
//! message back at its acknowledged version after a restart (the file
//! replayed, the snapshot gone), a torn tail cut off, damage in the middle
//! refused with the file and the offset, segments a snapshot covers deleted,
//! a full disk answered 503 while polls go on.

mod common;

use common::*;
use pollbox_core::config::Config;
use pollbox_server::Server;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollbox-wal-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Two workers, the snapshot and the segments in `dir`.
fn wal_config(dir: &Path, segment_bytes: u64, interval_s: u64) -> Config {
    let mut c = config();
    c.snapshot.path = dir.join("boxes.snap").display().to_string();
    c.snapshot.interval_s = interval_s;
    c.wal.path = dir.join("wal").display().to_string();
    c.wal.segment_bytes = segment_bytes;
    c
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("wal"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "log"));
    v.sort();
    v
}

/// Remove the snapshot files, so a start rebuilds every box from the file.
fn remove_snapshots(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()) {
        let name = e.file_name().into_string().unwrap();
        if name.starts_with("boxes.snap") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

/// Every box's payload (its version in it), by key.
fn boxes(a: SocketAddr, keys: &[String]) -> BTreeMap<String, Option<String>> {
    keys.iter()
        .map(|k| {
            let r = get(a, &format!("/v1/boxes/{k}"));
            (k.clone(), (r.status == 200).then(|| r.text()))
        })
        .collect()
}

fn metric(a: SocketAddr, name: &str) -> f64 {
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

/// `POST path` of an NDJSON body.
fn post_ndjson(a: SocketAddr, path: &str, body: &str) -> Resp {
    raw(
        a,
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-ndjson\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .0
}

/// Single messages, an array, NDJSON and a delete, acknowledged.
fn write_some(a: SocketAddr) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..20 {
        let k = format!("single-{i}");
        let r = post(a, &format!("/v1/boxes/{k}"), &format!(r#"{{"value":{i}}}"#));
        assert_eq!(r.status, 200, "{}", r.text());
        keys.push(k);
    }
    let batch: Vec<String> = (0..30)
        .map(|i| format!(r#"{{"key":"batch-{}","value":{i}}}"#, i % 10))
        .collect();
    let r = post(a, "/v1/ingest", &format!("[{}]", batch.join(",")));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["accepted"], 30);
    let r = post_ndjson(a, "/v1/ingest", &batch.join("\n"));
    assert_eq!(r.status, 200, "{}", r.text());
    keys.extend((0..10).map(|i| format!("batch-{i}")));
    assert_eq!(delete(a, "/v1/boxes/single-3").status, 204);
    keys
}

#[test]
fn acknowledged_messages_come_back_at_their_versions_from_the_file_alone() {
    let dir = scratch("restart");
    let c = wal_config(&dir, 64 << 20, 3600);
    let s = Server::start(c.clone()).expect("starts");
    let a = s.addr();
    let keys = write_some(a);
    // One version, one payload: what a poll saw after the answers.
    let before = boxes(a, &keys);
    assert_eq!(before["single-3"], None, "deleted");
    let single = post(a, "/v1/boxes/single-0", r#"{"value":100}"#);
    assert_eq!(single.status, 200);
    let acked = single.version();
    assert!(metric(a, "pollbox_wal_syncs_total") >= 1.0);
    assert!(metric(a, "pollbox_wal_records_total") >= 82.0);
    s.shutdown().unwrap();

    // Graceful: the final snapshot holds it all.
    let s = Server::start(c.clone()).expect("starts again");
    let after = boxes(s.addr(), &keys);
    assert_eq!(get(s.addr(), "/v1/boxes/single-0").version(), acked);
    s.shutdown().unwrap();

    // Without the snapshot: every box from the file, same bytes, same versions.
    remove_snapshots(&dir);
    let s = Server::start(c).expect("starts from the file");
    let replayed = boxes(s.addr(), &keys);
    assert_eq!(replayed, after);
    let single0 = get(s.addr(), "/v1/boxes/single-0");
    assert_eq!(single0.version(), acked);
    assert!(
        single0.text().contains(r#""v":100,"sum":100,"n":2"#),
        "{}",
        single0.text()
    );
    for (k, v) in &before {
        if k != "single-0" {
            assert_eq!(&replayed[k], v, "{k}");
        }
    }
    // New versions go on past every one served.
    let next = post(s.addr(), "/v1/boxes/single-0", r#"{"value":1}"#);
    assert!(next.version() > acked);
    s.shutdown().unwrap();
}

#[test]
fn a_torn_tail_is_cut_off_and_the_start_goes_on() {
    let dir = scratch("torn");
    let c = wal_config(&dir, 64 << 20, 3600);
    let s = Server::start(c.clone()).unwrap();
    for i in 0..5 {
        let r = post(s.addr(), &format!("/v1/boxes/k{i}"), r#"{"value":1}"#);
        assert_eq!(r.status, 200);
    }
    s.shutdown().unwrap();
    remove_snapshots(&dir);
    let seg = segments(&dir).pop().expect("a segment");
    let len = std::fs::metadata(&seg).unwrap().len();
    // The last record loses its last 3 bytes (a crash in the middle of it).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&seg)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let s = Server::start(c).unwrap_or_else(|e| panic!("a torn tail does not stop the start: {e}"));
    for i in 0..4 {
        assert_eq!(
            get(s.addr(), &format!("/v1/boxes/k{i}")).status,
            200,
            "k{i}"
        );
    }
    assert_eq!(get(s.addr(), "/v1/boxes/k4").status, 404, "the torn record");
    let cut = std::fs::metadata(&seg).unwrap().len();
    assert!(cut < len - 3, "cut back to the last whole record: {cut}");
    // And the file goes on from there.
    assert_eq!(post(s.addr(), "/v1/boxes/k4", r#"{"value":2}"#).status, 200);
    s.shutdown().unwrap();
}

#[test]
fn damage_before_the_end_refuses_the_start_with_the_file_and_the_offset() {
    let dir = scratch("corrupt");
    let c = wal_config(&dir, 64 << 20, 3600);
    let s = Server::start(c.clone()).unwrap();
    for i in 0..5 {
        assert_eq!(
            post(s.addr(), &format!("/v1/boxes/k{i}"), r#"{"value":1}"#).status,
            200
        );
    }
    s.shutdown().unwrap();
    let seg = segments(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    // A byte of the second record's key (the segment's magic is 8 bytes).
    let first_len = 4 + u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let second = 8 + first_len;
    bytes[second + 30] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    for (what, err) in [
        (
            "start",
            Server::start(c.clone()).err().map(|e| e.to_string()),
        ),
        (
            "check",
            Server::check(c.clone()).err().map(|e| e.to_string()),
        ),
    ] {
        let err = err.unwrap_or_else(|| panic!("{what} must refuse"));
        assert!(err.contains(&seg.display().to_string()), "{what}: {err}");
        assert!(err.contains(&format!("offset {second}")), "{what}: {err}");
        assert!(
            err.contains("truncate -s"),
            "{what} says how to repair: {err}"
        );
    }
}

#[test]
fn segments_a_snapshot_covers_are_deleted() {
    let dir = scratch("segments");
    let c = wal_config(&dir, 4096, 1);
    let s = Server::start(c.clone()).unwrap();
    let body: Vec<String> = (0..40)
        .map(|i| format!(r#"{{"key":"k{i}","value":{i},"player":"pppppppppppppppp"}}"#))
        .collect();
    for _ in 0..5 {
        let r = post_ndjson(s.addr(), "/v1/ingest", &body.join("\n"));
        assert_eq!(r.status, 200);
    }
    assert!(segments(&dir).len() >= 3, "rolled: {:?}", segments(&dir));
    eventually("covered segments deleted", || segments(&dir).len() == 1);
    assert_eq!(metric(s.addr(), "pollbox_wal_segments"), 1.0);
    let v = get(s.addr(), "/v1/boxes/k7").version();
    s.shutdown().unwrap();
    let s = Server::start(c).unwrap();
    assert_eq!(get(s.addr(), "/v1/boxes/k7").version(), v);
    s.shutdown().unwrap();
}

/// A tmpfs of `kib` KiB at `at` (root only), unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, kib: u64) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount runs");
        assert!(st.success(), "mount a tmpfs (needs root)");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs root: mounts a small tmpfs"]
fn a_full_disk_answers_ingest_503_polls_go_on_and_ingest_resumes() {
    let dir = scratch("full");
    let mut c = wal_config(&dir, 64 << 20, 3600);
    let fs = Tmpfs::mount(&dir.join("wal"), 256);
    c.wal.path = fs.0.display().to_string();
    let s = Server::start(c).unwrap();
    let a = s.addr();
    assert_eq!(post(a, "/v1/boxes/before", r#"{"value":1}"#).status, 200);
    // Fill the disk to the last few bytes.
    let filler = fs.0.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    drop(f);
    let big = format!(r#"{{"value":2,"player":"{}"}}"#, "p".repeat(10));
    // The segment's last page still takes a few records; then none fits.
    let mut refused = false;
    for i in 0..1000 {
        let r = post(a, &format!("/v1/boxes/full-{i}"), &big);
        if r.status == 503 {
            assert_eq!(r.text(), r#"{"error":"disk full"}"#);
            // Nothing half-acknowledged: the box is not there.
            assert_eq!(get(a, &format!("/v1/boxes/full-{i}")).status, 404);
            refused = true;
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(refused, "the disk is full");
    let batch = (0..50)
        .map(|i| format!(r#"{{"key":"b{i}","value":1}}"#))
        .collect::<Vec<_>>()
        .join("\n");
    let r = post_ndjson(a, "/v1/ingest", &batch);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        get(a, "/v1/boxes/b0").status,
        404,
        "none of the batch applied"
    );
    // Polls go on.
    assert_eq!(get(a, "/v1/boxes/before").status, 200);
    assert_eq!(get(a, "/readyz").status, 200);
    assert!(get(a, "/metrics")
        .text()
        .contains("pollbox_wal_errors_total{kind=\"disk_full\"} "),);
    assert!(metric(a, "pollbox_wal_errors_total{kind=\"disk_full\"}") >= 1.0);
    // Space returns: ingest resumes.
    std::fs::remove_file(&filler).unwrap();
    let r = post_ndjson(a, "/v1/ingest", &batch);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(post(a, "/v1/boxes/after", r#"{"value":3}"#).status, 200);
    s.shutdown().unwrap();
    drop(fs);
}

#[test]
#[ignore = "needs promtool (Debian package prometheus); .ci/run installs it"]
fn promtool_accepts_the_write_ahead_files_metrics() {
    let dir = scratch("promtool");
    let s = Server::start(wal_config(&dir, 64 << 20, 3600)).unwrap();
    let a = s.addr();
    write_some(a);
    let text = get(a, "/metrics").text();
    for name in [
        "pollbox_wal_syncs_total ",
        "pollbox_wal_sync_seconds_bucket{le=\"+Inf\"} ",
        "pollbox_wal_bytes_total ",
        "pollbox_wal_records_total ",
        "pollbox_wal_errors_total{kind=\"disk_full\"} 0",
        "pollbox_wal_errors_total{kind=\"sync\"} 0",
        "pollbox_wal_errors_total{kind=\"write\"} 0",
        "pollbox_wal_segments 1",
        "pollbox_wal_disk_bytes ",
        "pollbox_wal_failed 0",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    promtool_check(&text);
    s.shutdown().unwrap();
}

#[test]
fn a_long_poll_is_woken_once_the_update_is_synced_and_applied() {
    let dir = scratch("longpoll");
    let s = Server::start(wal_config(&dir, 64 << 20, 3600)).unwrap();
    let a = s.addr();
    let first = post(a, "/v1/boxes/lp", r#"{"value":1}"#);
    assert_eq!(first.status, 200);
    let v = first.version();
    let waiter =
        std::thread::spawn(move || get(a, &format!("/v1/boxes/lp?after={v}&wait_ms=10000")));
    wait_parked(a, 1);
    let second = post(a, "/v1/boxes/lp", r#"{"value":2}"#);
    assert_eq!(second.status, 200);
    let woken = waiter.join().unwrap();
    assert_eq!(woken.status, 200);
    assert_eq!(woken.version(), second.version());
    assert!(second.version() > v);
    s.shutdown().unwrap();
}
