//! Held requests end with their token (docs/private-boxes.md#when-a-token-ends):
//! a long-poll parked past its token's `exp` is answered 401 as any request
//! with that token would be; an event stream, one box or many, is sent
//! `event: expired` and closed. Tokens minted by PyJWT (mint_jwt.py), a few
//! seconds from their `exp`, with `leeway_s = 0`; the tests assert what
//! arrives, not when.

mod common;
use common::jwt::{claims, keys, mint, now, tempdir, token_access};
use common::*;
use pollbox_core::config::Config;
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;

fn private_config(dir: &Path) -> Config {
    let mut c = config();
    token_access(&mut c, &dir.join("jwks.json"), "ingest-secret");
    c.auth.jwt.leeway_s = 0;
    c
}

/// A token that expires in a few seconds.
fn short_token(dir: &Path) -> String {
    let c = claims(now() + 3, &["room-17/*"], &[]);
    mint(dir, &[json!({"kid": "ed", "claims": c})]).remove(0)
}

fn ingest(a: SocketAddr, key: &str, value: i64) {
    let body = format!("{{\"key\":\"{key}\",\"value\":{value}}}");
    let req = format!(
        "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ingest-secret\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = raw(a, req.as_bytes()).0;
    assert_eq!(r.status, 200, "{}", r.text());
}

const EXPIRED: &str = "Bearer error=\"invalid_token\", error_description=\"expired\"";

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn a_long_poll_held_past_its_tokens_exp_is_answered_401() {
    let dir = tempdir("expiry-poll");
    keys(&dir);
    let s = start(private_config(&dir));
    let a = s.addr();
    ingest(a, "room-17/alice", 1);
    let token = short_token(&dir);
    let mut conn = Reader::new(connect(a));
    let first = common::get_with(&mut conn, "/v1/boxes/room-17%2Falice", &token);
    assert_eq!(first.status, 200, "{}", first.text());
    let version = first.version();
    // Nothing moves the box: only the token's end answers it.
    conn.send(
        format!(
            "GET /v1/boxes/room-17%2Falice?after={version}&wait_ms=30000 HTTP/1.1\r\nHost: t\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        )
        .as_bytes(),
    );
    let r = conn.read(false);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("WWW-Authenticate"), Some(EXPIRED));
    assert_eq!(
        r.json(),
        json!({"error": "invalid_token", "error_description": "expired"})
    );
    // The connection stays; the token is refused on it from now on.
    let r = common::get_with(&mut conn, "/v1/boxes/room-17%2Falice", &token);
    assert_eq!(r.header("WWW-Authenticate"), Some(EXPIRED));
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn a_stream_whose_token_expires_is_sent_event_expired_and_closed() {
    let dir = tempdir("expiry-stream");
    keys(&dir);
    let s = start(private_config(&dir));
    let a = s.addr();
    ingest(a, "room-17/alice", 1);
    ingest(a, "room-17/bob", 1);
    let token = short_token(&dir);
    // All held at once, with the same token: one box, many, and a room.
    let targets = [
        "/v1/boxes/room-17%2Falice",
        "/v1/boxes?keys=room-17/alice,room-17/bob",
        "/v1/boxes?prefix=room-17%2F",
    ];
    let mut streams: Vec<Reader> = targets
        .iter()
        .map(|target| {
            let mut stream = Reader::new(connect(a));
            stream.send(
                format!(
                    "GET {target} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\
                     Authorization: Bearer {token}\r\n\r\n"
                )
                .as_bytes(),
            );
            stream
        })
        .collect();
    for (stream, target) in streams.iter_mut().zip(targets) {
        let head = stream.read_through("\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}");
        let events = stream.read_until_contains("event: expired\n");
        assert!(
            events.contains("\nid: "),
            "{target}: the boxes first: {events}"
        );
        assert!(
            events.ends_with(
                "event: expired\ndata: {\"error\":\"invalid_token\",\"error_description\":\"expired\"}\n\n"
            ),
            "{target}: {events}"
        );
        assert!(stream.closed(), "{target}");
    }
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
