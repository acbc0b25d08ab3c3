//! Keys and tokens for the auth tests, made by an implementation independent
//! of the one pollbox verifies with: Python's PyJWT with `cryptography`
//! (crates/server/tests/mint_jwt.py). Tests that use them are ignored
//! "needs python3 with pyjwt and cryptography" (`.ci/run` installs them).
#![allow(dead_code)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mint_jwt.py");

/// `dir/jwks.json` (kids hs, es, ed, rs) and `dir/private.json`.
pub fn keys(dir: &Path) {
    let ok = Command::new("python3")
        .args([SCRIPT, "keys"])
        .arg(dir)
        .status()
        .expect("python3 runs");
    assert!(ok.success(), "mint_jwt.py keys");
}

/// One token per spec (see mint_jwt.py).
pub fn mint(dir: &Path, specs: &[Value]) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args([SCRIPT, "mint"])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let specs_json = serde_json::to_vec(specs).unwrap();
    child.stdin.take().unwrap().write_all(&specs_json).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "mint_jwt.py mint");
    let tokens: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(tokens.len(), specs.len(), "one token per spec");
    tokens
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A fresh directory for one test.
pub fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pollbox-auth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Claims issued by "game" for "pollbox" with these scopes.
pub fn claims(exp: u64, read: &[&str], write: &[&str]) -> Value {
    json!({"iss": "game", "aud": "pollbox", "exp": exp,
           "pollbox": {"read": read, "write": write}})
}

/// Write `text` to `path` as a rotation should: beside it, then renamed
/// over it (a reader never sees half a file).
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Wait (up to 10 s) until `done` says so: a rotation is taken within
/// about a second (the files are looked at once a second, the workers take
/// a new read at their next tick); a test asserts what happens, not when.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `pollbox_auth_reloads_total{result}` of the server at `a`.
pub fn reloads(a: std::net::SocketAddr, result: &str) -> u64 {
    let line = format!("pollbox_auth_reloads_total{{result=\"{result}\"}} ");
    super::get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `GET path` with `token` as a bearer token, on a kept-alive connection.
pub fn get_with(conn: &mut super::Reader, path: &str, token: &str) -> super::Resp {
    conn.send(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    );
    conn.read(false)
}
