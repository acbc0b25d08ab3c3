//! `pollbox memcheck` against the real binary after a minute of mixed load: the
//! verdict is clean (jemalloc allocated within 10% of what pollbox accounts).
//! The opposite case (64 MiB outside the accounting) is
//! `crates/server/tests/memory.rs`.

mod common;

use std::process::Command;

#[test]
fn verdict_is_clean_after_a_minute_of_mixed_load() {
    let exe = env!("CARGO_BIN_EXE_pollbox");
    let (mut server, addr, _) =
        common::serve(["serve", "--listen", "127.0.0.1:0", "--workers", "2"], &[]);
    let url = format!("http://{addr}");
    let load = Command::new(exe)
        .args([
            "load",
            "--url",
            &url,
            "--connections",
            "16",
            "--duration",
            "60s",
        ])
        .args([
            "--mix",
            "poll:70,ingest:20,batch:5,longpoll:5",
            "--keys",
            "5000",
        ])
        .args(["--preseed", "--quiet"])
        .output()
        .unwrap();
    assert!(
        load.status.success(),
        "{}",
        String::from_utf8_lossy(&load.stdout)
    );
    let mc = Command::new(exe)
        .args(["memcheck", "--url", &url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&mc.stdout).into_owned();
    let _ = Command::new("kill").arg(server.id().to_string()).status();
    let _ = server.wait();
    eprintln!("{out}");
    assert!(mc.status.success());
    assert!(
        out.contains("accounted") && out.contains("je.alloc"),
        "{out}"
    );
    assert!(out.contains("verdict: ok"), "{out}");
}

/// Start `pollbox serve` with `config` (TOML) and return it with its URL.
fn serve_with(config: &str) -> (common::Server, String) {
    let dir = std::env::temp_dir().join(format!("pollbox-memcheck-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("ttl.toml");
    std::fs::write(&cfg, config).unwrap();
    let (server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    let url = format!("http://{addr}");
    (server, url)
}

fn memcheck_table(url: &str) -> String {
    let mc = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["memcheck", "--url", url])
        .output()
        .unwrap();
    assert!(mc.status.success());
    String::from_utf8_lossy(&mc.stdout).into_owned()
}

fn boxes(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("pollbox_boxes ")?.parse().ok())
        .expect("pollbox_boxes")
}

/// docs/boxes.md#lifecycle against the binary: 20,000 boxes with `ttl_s = 3` (time
/// enough for a debug build to create them all) expire, and the box count, the
/// accounted `boxes` bytes and jemalloc's allocated bytes (less its thread caches)
/// fall back; `pollbox memcheck` shows it.
#[test]
fn expired_boxes_give_their_memory_back_as_memcheck_shows() {
    use std::io::{Read, Write};
    let (mut server, url) =
        serve_with("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n[boxes]\nttl_s = 1\n");
    let scrape = || pollbox_memcheck::scrape(&url).unwrap();
    let memory = |text: &str| pollbox_memcheck::Memory::from_metrics(text).unwrap();
    let before = memory(&scrape());
    let table_before = memcheck_table(&url);
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    for batch in 0..200 {
        let body: Vec<String> = (0..100)
            .map(|i| format!(r#"{{"key":"round-{batch}-{i}","value":{i},"player":"p-{i}"}}"#))
            .collect();
        let body = format!("[{}]", body.join(","));
        let req = format!(
            "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        // Answers are small: read until this one's body is complete.
        let mut got = Vec::new();
        while !got.ends_with(b"]}") {
            let mut tmp = [0u8; 4096];
            let n = s.read(&mut tmp).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&tmp[..n]);
        }
        assert!(String::from_utf8_lossy(&got).contains("\"accepted\":100"));
    }
    // jemalloc's figures are refreshed at most every 200 ms
    // (`alloc_stats::MIN_EPOCH_INTERVAL`): a scrape sooner after the last one
    // reads the previous figures.
    let fresh = std::time::Duration::from_millis(300);
    std::thread::sleep(fresh);
    let text = scrape();
    let full = memory(&text);
    let full_boxes = boxes(&text);
    let table_full = memcheck_table(&url);
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while boxes(&scrape()) > 0.0 {
        assert!(std::time::Instant::now() < give_up, "boxes never expired");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(fresh);
    let text = scrape();
    let after = memory(&text);
    let table_after = memcheck_table(&url);
    let _ = Command::new("kill").arg(server.id().to_string()).status();
    let _ = server.wait();
    eprintln!(
        "before:\n{table_before}\n{full_boxes} boxes:\n{table_full}\nexpired:\n{table_after}"
    );
    assert!(full_boxes > 10_000.0, "{full_boxes}");
    assert_eq!(after.boxes, before.boxes, "accounted box bytes all back");
    let (rise, fall) = (
        full.in_use() - before.in_use(),
        full.in_use() - after.in_use(),
    );
    assert!(rise > 1048576.0, "rise {rise}");
    assert!(fall > 0.8 * rise, "jemalloc: rose {rise}, fell {fall}");
    assert!(text.contains("pollbox_boxes_expired_total 20000"));
    assert!(table_after.contains("verdict: ok"), "{table_after}");
}
