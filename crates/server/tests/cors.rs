//! CORS over real sockets (docs/http.md#cors): a preflight from an allowed origin, one
//! from another origin, answers to an allowed origin and to others. (A real
//! browser: `crates/pollbox/tests/browser.rs`.)

mod common;
use common::*;

const GAME: &str = "https://game.example";

fn cors_config() -> pollbox_core::config::Config {
    let mut c = config();
    c.http.cors_origins = vec![GAME.into(), "http://localhost:5173".into()];
    c.auth.ingest_tokens = vec!["t0k".into()];
    c
}

fn ask(a: std::net::SocketAddr, req: String) -> Resp {
    let head = req.starts_with("HEAD ");
    let mut r = Reader::new(connect(a));
    r.send(req.as_bytes());
    r.read(head)
}

fn assert_cors(r: &Resp, origin: &str) {
    assert_eq!(r.header("Access-Control-Allow-Origin"), Some(origin));
    assert_eq!(r.header("Vary"), Some("Origin"));
    assert_eq!(r.header("Access-Control-Expose-Headers"), Some("ETag"));
}

fn assert_no_cors(r: &Resp) {
    for (name, _) in &r.headers {
        assert!(
            !name.to_ascii_lowercase().starts_with("access-control-")
                && !name.eq_ignore_ascii_case("vary"),
            "{name} in {:?}",
            r.headers
        );
    }
}

#[test]
fn a_preflight_from_an_allowed_origin_gets_204_with_what_may_be_sent() {
    let s = start(cors_config());
    let a = s.addr();
    for (path, method) in [
        ("/v1/boxes/a", "GET"),
        ("/v1/boxes/a", "DELETE"),
        ("/v1/ingest", "POST"),
    ] {
        let r = ask(
            a,
            format!(
                "OPTIONS {path} HTTP/1.1\r\nHost: t\r\nOrigin: {GAME}\r\n\
                 Access-Control-Request-Method: {method}\r\n\
                 Access-Control-Request-Headers: authorization, content-type, if-none-match\r\n\r\n"
            ),
        );
        assert_eq!(r.status, 204, "{path} {method}");
        assert_eq!(r.header("Content-Length"), None);
        assert!(r.body.is_empty());
        assert_cors(&r, GAME);
        assert_eq!(
            r.header("Access-Control-Allow-Methods"),
            Some("GET, HEAD, POST, DELETE")
        );
        assert_eq!(
            r.header("Access-Control-Allow-Headers"),
            Some("Authorization, Content-Type, If-None-Match, Last-Event-ID")
        );
        let max_age: u64 = r
            .header("Access-Control-Max-Age")
            .and_then(|v| v.parse().ok())
            .expect("a max age");
        assert!(max_age > 0);
    }
    s.shutdown().unwrap();
}

#[test]
fn a_preflight_from_another_origin_gets_403_without_cors_headers() {
    let s = start(cors_config());
    let a = s.addr();
    for origin in [
        "Origin: https://evil.example\r\n",
        "Origin: https://game.example.evil.example\r\n",
        "Origin: null\r\n",
        "",
    ] {
        let r = ask(
            a,
            format!(
                "OPTIONS /v1/boxes/a HTTP/1.1\r\nHost: t\r\n{origin}\
                 Access-Control-Request-Method: GET\r\n\r\n"
            ),
        );
        assert_eq!(r.status, 403, "{origin}");
        assert_no_cors(&r);
    }
    s.shutdown().unwrap();
}

#[test]
fn answers_to_an_allowed_origin_carry_cors_headers_and_others_do_not() {
    let s = start(cors_config());
    let a = s.addr();
    let from = |o: &str| format!("Origin: {o}\r\n");
    let ingest = |origin: &str| {
        ask(
            a,
            format!(
                "POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\n{origin}Authorization: Bearer t0k\r\n\
                 Content-Length: 11\r\n\r\n{{\"value\":1}}"
            ),
        )
    };
    let r = ingest(&from(GAME));
    assert_eq!(r.status, 200);
    assert_cors(&r, GAME);
    let ver = r.version();
    let poll = |origin: &str, extra: &str| {
        ask(
            a,
            format!("GET /v1/boxes/a HTTP/1.1\r\nHost: t\r\n{origin}{extra}\r\n"),
        )
    };
    let r = poll(&from(GAME), "");
    assert_eq!(r.status, 200);
    assert_cors(&r, GAME);
    let etag = r.header("ETag").expect("ETag").to_string();
    let r = poll(&from(GAME), &format!("If-None-Match: {etag}\r\n"));
    assert_eq!(r.status, 304);
    assert_cors(&r, GAME);
    let r = poll("Origin: http://localhost:5173\r\n", "");
    assert_cors(&r, "http://localhost:5173");
    let r = ask(
        a,
        format!(
            "GET /v1/boxes/a?after={ver}&wait_ms=0 HTTP/1.1\r\nHost: t\r\n{}\r\n",
            from(GAME)
        ),
    );
    // wait_ms=0 and nothing past `after`: 304 at once.
    assert_eq!(r.status, 304, "a long-poll with nothing to wait for");
    assert_cors(&r, GAME);
    // Errors too, so a page can read its 401 or 404.
    let r = ask(
        a,
        format!(
            "POST /v1/boxes/a HTTP/1.1\r\nHost: t\r\n{}Content-Length: 2\r\n\r\n{{}}",
            from(GAME)
        ),
    );
    assert_eq!(r.status, 401);
    assert_cors(&r, GAME);
    let r = ask(
        a,
        format!(
            "GET /v1/boxes/none HTTP/1.1\r\nHost: t\r\n{}\r\n",
            from(GAME)
        ),
    );
    assert_eq!(r.status, 404);
    assert_cors(&r, GAME);
    // Another origin, or none at all: the same answers, without CORS headers.
    for origin in ["Origin: https://evil.example\r\n", ""] {
        let r = ingest(origin);
        assert_eq!(r.status, 200);
        assert_no_cors(&r);
        let r = poll(origin, "");
        assert_eq!(r.status, 200);
        assert_no_cors(&r);
    }
    let r = ask(
        a,
        format!(
            "DELETE /v1/boxes/a HTTP/1.1\r\nHost: t\r\n{}Authorization: Bearer t0k\r\n\r\n",
            from(GAME)
        ),
    );
    assert_eq!(r.status, 204);
    assert_cors(&r, GAME);
    s.shutdown().unwrap();
}

#[test]
fn a_long_poll_answered_later_still_carries_cors_headers() {
    let s = start(cors_config());
    let a = s.addr();
    let body = r#"{"value":1}"#;
    let post = |a| {
        raw(
            a,
            format!(
                "POST /v1/boxes/w HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer t0k\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .0
    };
    let first = post(a);
    assert_eq!(first.status, 200);
    let ver = first.version();
    let mut r = Reader::new(connect(a));
    r.send(
        format!(
            "GET /v1/boxes/w?after={ver}&wait_ms=60000 HTTP/1.1\r\nHost: t\r\nOrigin: {GAME}\r\n\r\n"
        )
        .as_bytes(),
    );
    // Requests on other connections in between (another origin, none).
    while s.wakeups().parked_keys() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_no_cors(&get(a, "/healthz"));
    assert_eq!(post(a).status, 200);
    let got = r.read(false);
    assert_eq!(got.status, 200);
    assert_eq!(got.version(), ver + 1, "woken by the second ingest");
    assert_cors(&got, GAME);
    s.shutdown().unwrap();
}

#[test]
fn without_cors_origins_options_is_405_and_no_cors_header_is_sent() {
    let s = start(config());
    let a = s.addr();
    let r = ask(
        a,
        format!(
            "OPTIONS /v1/boxes/a HTTP/1.1\r\nHost: t\r\nOrigin: {GAME}\r\n\
             Access-Control-Request-Method: GET\r\n\r\n"
        ),
    );
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET, HEAD, POST, DELETE"));
    assert_no_cors(&r);
    let r = ask(
        a,
        format!("GET /healthz HTTP/1.1\r\nHost: t\r\nOrigin: {GAME}\r\n\r\n"),
    );
    assert_eq!(r.status, 200);
    assert_no_cors(&r);
    s.shutdown().unwrap();
}
