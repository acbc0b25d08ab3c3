//! Keys and tokens for the auth tests, made by an implementation independent
//! of the one pollbox verifies with: Python's PyJWT with `cryptography`
//! (crates/server/tests/mint_jwt.py). Tests that use them are ignored
//! "needs python3 with pyjwt and cryptography" (`.ci/run` installs them).
//! Other crates' tests include this file with `#[path]`
//! (crates/pollbox/tests/browser.rs): it needs nothing of the module around it.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// The minting script, from whichever crate's tests include this file.
pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/tests/mint_jwt.py");

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

/// `c` reads by signed token only: keys from `keys_file` (what [`keys`]
/// wrote: `dir/jwks.json`), issuer "game" and audience "pollbox" (as
/// [`claims`] says), and ingest with `ingest_token`.
pub fn token_access(c: &mut pollbox_core::config::Config, keys_file: &Path, ingest_token: &str) {
    c.auth.read = pollbox_core::config::ReadAccess::Token;
    c.auth.ingest_tokens = vec![ingest_token.into()];
    c.auth.jwt.keys_file = keys_file.display().to_string();
    c.auth.jwt.issuer = "game".into();
    c.auth.jwt.audience = "pollbox".into();
}

/// Claims issued by "game" for "pollbox" with these scopes.
pub fn claims(exp: u64, read: &[&str], write: &[&str]) -> Value {
    json!({"iss": "game", "aud": "pollbox", "exp": exp,
           "pollbox": {"read": read, "write": write}})
}
