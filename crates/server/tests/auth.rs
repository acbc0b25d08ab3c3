//! Private boxes over real sockets (docs/private-boxes.md): tokens minted by
//! an independent implementation, Python's PyJWT with `cryptography`
//! (mint_jwt.py beside this file), checked by the server on every route.
//! `.ci/run` installs them: `pip install pyjwt cryptography`.

mod common;
use common::jwt::{claims, keys, mint, now, tempdir, token_access};
use common::*;
use pollbox_core::config::Config;
use serde_json::json;
use std::net::SocketAddr;
use std::path::Path;

fn send(a: SocketAddr, method: &str, path: &str, fields: &str, body: &str) -> Resp {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: t\r\n{fields}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw(a, req.as_bytes()).0
}

fn bearer(t: &str) -> String {
    format!("Authorization: Bearer {t}\r\n")
}

fn private_config(dir: &Path) -> Config {
    let mut c = config();
    token_access(&mut c, &dir.join("jwks.json"), "ingest-secret");
    c.auth.jwt.query_param = true;
    c.http.cors_origins = vec!["https://game.example".into()];
    c
}

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn signed_tokens_over_sockets() {
    let dir = tempdir("signed");
    keys(&dir);
    let t = now();
    let scoped = claims(t + 600, &["room-17/*"], &["room-17/alice"]);
    let specs = [
        json!({"kid": "hs", "claims": scoped}),
        json!({"kid": "es", "claims": scoped}),
        json!({"kid": "ed", "claims": scoped}),
        json!({"kid": "rs", "claims": scoped}),
        // 4..: refusals, each with its description.
        json!({"kid": "es", "alg": "HS256", "key": "es", "claims": scoped}),
        json!({"kid": "es", "alg": "RS256", "key": "rs", "claims": scoped}),
        json!({"alg": "none", "kid": "hs", "claims": scoped}),
        json!({"kid": "zz", "alg": "HS256", "key": "hs", "claims": scoped}),
        json!({"kid": "es", "claims": scoped, "tamper": true}),
        json!({"kid": "ed", "claims": claims(t - 120, &["*"], &[])}),
        json!({"kid": "ed", "claims": {"iss": "game", "aud": "pollbox", "exp": t + 900, "nbf": t + 600}}),
        json!({"kid": "ed", "claims": {"iss": "other", "aud": "pollbox", "exp": t + 600}}),
        json!({"kid": "ed", "claims": {"iss": "game", "aud": "elsewhere", "exp": t + 600}}),
        json!({"kid": "ed", "no_kid": true, "claims": scoped}),
    ];
    let tokens = mint(&dir, &specs);
    assert_eq!(tokens.len(), specs.len());
    let s = start(private_config(&dir));
    let a = s.addr();

    // An ingest token writes every key, as it always did.
    let r = send(
        a,
        "POST",
        "/v1/boxes/room-17%2Falice",
        &bearer("ingest-secret"),
        r#"{"value":1}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        a,
        "POST",
        "/v1/boxes/room-18%2Fbob",
        &bearer("ingest-secret"),
        r#"{"value":2}"#,
    );
    assert_eq!(r.status, 200);

    // Each algorithm with its key.
    for (i, alg) in ["HS256", "ES256", "EdDSA", "RS256"].iter().enumerate() {
        let r = send(
            a,
            "GET",
            "/v1/boxes/room-17%2Falice",
            &bearer(&tokens[i]),
            "",
        );
        assert_eq!(r.status, 200, "{alg}: {}", r.text());
    }
    // No token: Bearer alone.
    let r = send(a, "GET", "/v1/boxes/room-17%2Falice", "", "");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("WWW-Authenticate"), Some("Bearer"));
    let refusals = [
        (4, "bad signature"),
        (5, "bad signature"),
        (6, "bad signature"),
        (7, "unknown key"),
        (8, "bad signature"),
        (9, "expired"),
        (10, "not yet valid"),
        (11, "wrong issuer"),
        (12, "wrong audience"),
        (13, "unknown key"),
    ];
    for (i, why) in refusals {
        let r = send(
            a,
            "GET",
            "/v1/boxes/room-17%2Falice",
            &bearer(&tokens[i]),
            "",
        );
        assert_eq!(r.status, 401, "token {i}: {}", r.text());
        assert_eq!(
            r.header("WWW-Authenticate"),
            Some(format!("Bearer error=\"invalid_token\", error_description=\"{why}\"").as_str()),
            "token {i}"
        );
    }
    let r = send(
        a,
        "GET",
        "/v1/boxes/room-17%2Falice",
        &bearer("not-a-jwt"),
        "",
    );
    assert!(r
        .header("WWW-Authenticate")
        .unwrap()
        .contains("\"malformed\""));

    // Scopes, route by route.
    let es = &tokens[1];
    let r = send(a, "GET", "/v1/boxes/room-18%2Fbob", &bearer(es), "");
    assert_eq!(r.status, 403);
    assert_eq!(
        r.header("WWW-Authenticate"),
        Some("Bearer error=\"insufficient_scope\"")
    );
    assert_eq!(
        r.json(),
        json!({"error": "forbidden", "key": "room-18/bob"})
    );
    let r = send(
        a,
        "GET",
        "/v1/boxes?keys=room-17/alice,room-18/bob",
        &bearer(es),
        "",
    );
    assert_eq!(
        r.json(),
        json!({"error": "forbidden", "key": "room-18/bob", "i": 1})
    );
    let r = send(
        a,
        "GET",
        "/v1/boxes?keys=room-17/alice,room-17/x",
        &bearer(es),
        "",
    );
    assert_eq!(r.status, 200);
    let r = send(
        a,
        "GET",
        "/v1/boxes/room-17%2Falice?after=0&wait_ms=10",
        &bearer(es),
        "",
    );
    assert_eq!(r.status, 200, "a long-poll");
    let r = send(
        a,
        "GET",
        "/v1/boxes/room-18%2Fbob?after=0&wait_ms=10",
        &bearer(es),
        "",
    );
    assert_eq!(r.status, 403, "a long-poll outside the scope");
    let sse = format!("{}Accept: text/event-stream\r\n", bearer(es));
    let r = send(a, "GET", "/v1/boxes/room-18%2Fbob", &sse, "");
    assert_eq!(r.status, 403, "an event stream outside the scope");
    let r = send(
        a,
        "POST",
        "/v1/boxes/room-17%2Falice",
        &bearer(es),
        r#"{"value":3}"#,
    );
    assert_eq!(r.status, 200);
    let r = send(
        a,
        "POST",
        "/v1/boxes/room-17%2Fbob",
        &bearer(es),
        r#"{"value":3}"#,
    );
    assert_eq!(r.status, 403);
    let batch = r#"[{"key":"room-17/alice","value":4},{"key":"room-18/bob","value":5}]"#;
    let r = send(a, "POST", "/v1/ingest", &bearer(es), batch);
    assert_eq!(
        r.json(),
        json!({"accepted": 1, "rejected": 1,
               "errors": [{"i": 1, "error": "forbidden: key outside the token's write scope"}]})
    );
    let r = send(a, "DELETE", "/v1/boxes/room-18%2Fbob", &bearer(es), "");
    assert_eq!(r.status, 403);

    // The cookie, with CORS credentials for a listed origin; the query.
    let cookie = format!("Cookie: a=1; pollbox_token={es}\r\nOrigin: https://game.example\r\n");
    let r = send(a, "GET", "/v1/boxes/room-17%2Falice", &cookie, "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("Access-Control-Allow-Credentials"), Some("true"));
    let r = send(
        a,
        "GET",
        &format!("/v1/boxes/room-17%2Falice?access_token={es}"),
        "",
        "",
    );
    assert_eq!(r.status, 200);

    // Counted.
    let m = get(a, "/metrics").text();
    for reason in ["no_token", "expired", "bad_signature", "forbidden"] {
        let line = format!("pollbox_auth_refused_total{{reason=\"{reason}\"}} ");
        let n: u64 = m
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        assert!(n > 0, "{reason}");
    }
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without scoped tokens, `auth.ingest_tokens` decide writes exactly as
/// before, and reads stay open.
#[test]
fn ingest_tokens_alone_are_unchanged() {
    let mut c = config();
    c.auth.ingest_tokens = vec!["server-secret".into()];
    let s = start(c);
    let a = s.addr();
    let r = send(a, "POST", "/v1/boxes/k", "", r#"{"value":1}"#);
    assert_eq!(r.status, 401);
    assert_eq!(r.header("WWW-Authenticate"), Some("Bearer"));
    assert_eq!(
        r.json(),
        json!({"error": "missing or invalid bearer token"})
    );
    let r = send(
        a,
        "POST",
        "/v1/boxes/k",
        &bearer("server-secret"),
        r#"{"value":1}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(get(a, "/v1/boxes/k").status, 200);
    let r = send(a, "DELETE", "/v1/boxes/k", &bearer("nope"), "");
    assert_eq!(r.status, 401);
    s.shutdown().unwrap();
}
