//! The key set and static token files are read again while serving
//! (docs/private-boxes.md#key-rotation), without dropping a connection: a
//! new key's tokens are taken, a removed key's refused from then on (also on
//! a connection that used it, and a held request with it ends), and a file
//! that does not parse keeps the keys in use and is counted. A change of the
//! file is seen by the server's watcher; [`pollbox_server::Server::reload_auth`]
//! is what SIGHUP calls (crates/pollbox/tests/sighup.rs sends the signal).

mod common;
use common::jwt::{claims, keys, mint, now, tempdir, token_access};
use common::*;
use pollbox_core::config::{ReadAccess, StaticTokenConfig};
use serde_json::{json, Value};
use std::path::Path;

const ALICE: &str = "/v1/boxes/room-17%2Falice";

/// The ES256 key of the set in `dir`, named `kid`.
fn es_key(dir: &Path, kid: &str) -> Value {
    let set: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("jwks.json")).unwrap()).unwrap();
    let mut key = set["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == "es")
        .unwrap()
        .clone();
    key["kid"] = json!(kid);
    key
}

fn write_set(path: &Path, keys: &[Value]) {
    replace_file(path, &json!({ "keys": keys }).to_string());
}

fn ingest(a: std::net::SocketAddr, token: &str) -> u64 {
    let body = r#"{"value":1}"#;
    let req = format!(
        "POST {ALICE} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = raw(a, req.as_bytes()).0;
    assert_eq!(r.status, 200, "{}", r.text());
    r.version()
}

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn signed_keys_rotate_without_a_restart() {
    let dir = tempdir("rotate");
    let (old_dir, new_dir) = (dir.join("old"), dir.join("new"));
    keys(&old_dir);
    keys(&new_dir);
    let served = dir.join("jwks.json");
    write_set(&served, &[es_key(&old_dir, "old")]);
    let c = claims(now() + 600, &["room-17/*"], &[]);
    let old = mint(
        &old_dir,
        &[json!({"kid": "old", "alg": "ES256", "key": "es", "claims": c})],
    )
    .remove(0);
    let new = mint(
        &new_dir,
        &[json!({"kid": "new", "alg": "ES256", "key": "es", "claims": c})],
    )
    .remove(0);
    let mut cfg = config();
    token_access(&mut cfg, &served, "ingest-secret");
    let s = start(cfg);
    let a = s.addr();
    ingest(a, "ingest-secret");

    let mut conn = Reader::new(connect(a));
    assert_eq!(get_with(&mut conn, ALICE, &old).status, 200);
    let r = get_with(&mut conn, ALICE, &new);
    assert_eq!(r.status, 401, "not in the set yet");
    assert!(r
        .header("WWW-Authenticate")
        .unwrap()
        .contains("unknown key"));
    // A stream held with the old key's token across the rotation.
    let mut stream = Reader::new(connect(a));
    stream.send(
        format!(
            "GET {ALICE} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\
             Authorization: Bearer {old}\r\n\r\n"
        )
        .as_bytes(),
    );
    stream.read_through("\n\nid: ");

    // The new key joins the set.
    write_set(&served, &[es_key(&old_dir, "old"), es_key(&new_dir, "new")]);
    eventually("the new key's token is taken", || {
        get_with(&mut conn, ALICE, &new).status == 200
    });
    assert_eq!(get_with(&mut conn, ALICE, &old).status, 200, "both now");

    // The old key is taken out: refused on the connection that used it.
    write_set(&served, &[es_key(&new_dir, "new")]);
    eventually("the old key's token is refused", || {
        get_with(&mut conn, ALICE, &old).status == 401
    });
    let r = get_with(&mut conn, ALICE, &old);
    assert_eq!(
        r.header("WWW-Authenticate"),
        Some("Bearer error=\"invalid_token\", error_description=\"unknown key\"")
    );
    assert_eq!(
        get_with(&mut conn, ALICE, &new).status,
        200,
        "same connection"
    );
    // The held stream ended with it.
    let ended = stream.read_until_contains("event: expired\n");
    assert!(
        ended.contains(
            "event: expired\ndata: {\"error\":\"invalid_token\",\"error_description\":\"unknown key\"}\n\n"
        ),
        "{ended}"
    );
    assert!(stream.closed());

    // A file that does not parse, or holds no key: the keys in use stay.
    let ok_before = reloads(a, "ok");
    for broken in ["{\"keys\": [", "{\"keys\": []}"] {
        let errors = reloads(a, "error");
        replace_file(&served, broken);
        eventually("the broken file is counted", || {
            reloads(a, "error") > errors
        });
        assert_eq!(get_with(&mut conn, ALICE, &new).status, 200, "{broken}");
        assert_eq!(get_with(&mut conn, ALICE, &old).status, 401, "{broken}");
    }
    assert_eq!(reloads(a, "ok"), ok_before);

    // What SIGHUP does: the file read again now.
    std::fs::write(
        &served,
        json!({"keys": [es_key(&old_dir, "old"), es_key(&new_dir, "new")]}).to_string(),
    )
    .unwrap();
    s.reload_auth("test").expect("read again");
    eventually("the old key is back", || {
        get_with(&mut conn, ALICE, &old).status == 200
    });
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A static token read from a file (`[[auth.token]] token_file`) is read
/// again as the key set is. No signed token: runs without Python.
#[test]
fn a_static_token_file_is_read_again_when_it_changes() {
    let dir = tempdir("static-file");
    let file = dir.join("dashboard-token");
    std::fs::write(&file, "# the dashboard's\none\n").unwrap();
    let mut cfg = config();
    cfg.auth.read = ReadAccess::Token;
    cfg.auth.token = vec![StaticTokenConfig {
        token_file: file.display().to_string(),
        read: vec!["*".into()],
        write: vec!["*".into()],
        ..Default::default()
    }];
    let s = start(cfg);
    let a = s.addr();
    let version = ingest(a, "one");
    let mut conn = Reader::new(connect(a));
    assert_eq!(get_with(&mut conn, ALICE, "one").status, 200);
    // A long-poll held with it across the rotation.
    let mut held = Reader::new(connect(a));
    held.send(
        format!(
            "GET {ALICE}?after={version}&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\
             Authorization: Bearer one\r\n\r\n"
        )
        .as_bytes(),
    );
    wait_parked(a, 1);

    replace_file(&file, "two\n");
    eventually("the old token is refused", || {
        get_with(&mut conn, ALICE, "one").status == 401
    });
    let r = get_with(&mut conn, ALICE, "one");
    assert!(r
        .header("WWW-Authenticate")
        .unwrap()
        .contains("\"unknown token\""));
    assert_eq!(
        get_with(&mut conn, ALICE, "two").status,
        200,
        "same connection"
    );
    let r = held.read(false);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error": "invalid_token", "error_description": "unknown token"})
    );

    // A file with no token keeps the one in use; so does a read on demand.
    let errors = reloads(a, "error");
    replace_file(&file, "# emptied\n");
    eventually("the empty file is counted", || reloads(a, "error") > errors);
    assert!(s
        .reload_auth("test")
        .unwrap_err()
        .contains("holds no token"));
    assert_eq!(get_with(&mut conn, ALICE, "two").status, 200);
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
