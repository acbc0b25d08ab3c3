//! The configuration through the real binary: `check-config` checks what
//! `serve` checks before it binds, secrets come from files, names resolve.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

fn check_config(file: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["check-config".as_ref(), file.as_os_str()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn check_config_refuses_a_snapshot_directory_serve_would_refuse() {
    let dir = common::tmpdir("config-snapdir");
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        "[snapshot]\npath = \"/proc/no-such-dir/boxes.snap\"\n",
    )
    .unwrap();
    let (ok, text) = check_config(&cfg);
    assert!(!ok, "{text}");
    assert!(text.contains("is not writable"), "{text}");
    // A config meant for another machine: the file alone.
    let out = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args([
            "check-config".as_ref(),
            "--file-only".as_ref(),
            cfg.as_os_str(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
}

#[test]
fn tokens_come_from_files_and_check_config_redacts_every_secret() {
    let dir = common::tmpdir("config-tokens");
    let tokens = dir.join("ingest-tokens");
    std::fs::write(&tokens, "# from a Secret\nfile-token\n").unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"localhost:0\"\n[auth]\ningest_tokens = [\"inline-token\"]\ningest_tokens_file = \"{}\"\n",
            tokens.display()
        ),
    )
    .unwrap();
    let (ok, text) = check_config(&cfg);
    assert!(ok, "{text}");
    assert!(
        !text.contains("file-token") && !text.contains("inline-token"),
        "{text}"
    );
    assert!(text.contains("<redacted>"), "{text}");

    // serve: a name to listen on is resolved; both tokens open ingest.
    let (_server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    assert!(addr.ip().is_loopback(), "{addr}");
    let post = |auth: &str| {
        let mut s = TcpStream::connect(addr).unwrap();
        let body = r#"{"value":1}"#;
        write!(
            s,
            "POST /v1/boxes/t HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{auth}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(post("").starts_with("HTTP/1.1 401"));
    assert!(post("Authorization: Bearer file-token\r\n").starts_with("HTTP/1.1 200"));
    assert!(post("Authorization: Bearer inline-token\r\n").starts_with("HTTP/1.1 200"));

    // A tokens file that cannot be read is refused, by check-config and serve.
    std::fs::remove_file(&tokens).unwrap();
    let (ok, text) = check_config(&cfg);
    assert!(!ok);
    assert!(text.contains("auth.ingest_tokens_file"), "{text}");
}
