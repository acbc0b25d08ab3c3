//! `pollbox memcheck` against the real binary after a minute of mixed load: the
//! verdict is clean (jemalloc allocated within 10% of what pollbox accounts).
//! The opposite case (64 MiB outside the accounting) is
//! `crates/server/tests/memory.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn verdict_is_clean_after_a_minute_of_mixed_load() {
    let exe = env!("CARGO_BIN_EXE_pollbox");
    let mut server = Command::new(exe)
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = format!(
        "http://{}",
        first
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap()
    );
    std::thread::spawn(move || for _ in lines {});
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
