//! The HTTP surface (docs/http.md#routes) over real sockets: happy paths with a
//! real HTTP client (ureq), framing details with a raw `TcpStream`.

mod common;
use common::*;

fn ureq_status(r: Result<ureq::Response, ureq::Error>) -> (u16, String, Option<String>) {
    match r {
        Ok(resp) => {
            let etag = resp.header("ETag").map(str::to_string);
            (resp.status(), resp.into_string().unwrap(), etag)
        }
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap(), None),
        Err(e) => panic!("transport error: {e}"),
    }
}

#[test]
fn poll_ingest_etag_and_404_with_a_real_client() {
    let s = start(config());
    let (code, body, _) = ureq_status(ureq::get(&url(&s, "/v1/boxes/box-42")).call());
    assert_eq!(code, 404);
    assert!(body.contains("error"), "{body}");

    let (code, body, _) = ureq_status(
        ureq::post(&url(&s, "/v1/boxes/box-42"))
            .set("Content-Type", "application/json")
            .send_string(
                r#"{"value":5,"player":"p-7","key":"ignored","cargo":{"a":[1,2,{"b":null}]}}"#,
            ),
    );
    assert_eq!(code, 200);
    let (first, body) = split_ver(&body);
    assert_eq!(
        body,
        r#"{"k":"box-42","ver":V,"v":5,"sum":5,"n":1,"by":"p-7"}"#
    );

    let (code, body, _) =
        ureq_status(ureq::post(&url(&s, "/v1/boxes/box-42")).send_string(r#"{"value":7}"#));
    assert_eq!(code, 200);
    assert_eq!(
        split_ver(&body),
        (
            first + 1,
            r#"{"k":"box-42","ver":V,"v":7,"sum":12,"n":2,"by":"p-7"}"#.into()
        )
    );

    let (code, body, etag) = ureq_status(ureq::get(&url(&s, "/v1/boxes/box-42")).call());
    assert_eq!(code, 200);
    assert_eq!(
        split_ver(&body),
        (
            first + 1,
            r#"{"k":"box-42","ver":V,"v":7,"sum":12,"n":2,"by":"p-7"}"#.into()
        )
    );
    let etag = etag.expect("an ETag");
    assert_eq!(etag, format!("\"{}\"", first + 1));

    let r = ureq::get(&url(&s, "/v1/boxes/box-42"))
        .set("If-None-Match", &etag)
        .call()
        .unwrap();
    assert_eq!(r.status(), 304);
    let r = ureq::get(&url(&s, "/v1/boxes/box-42"))
        .set("If-None-Match", &format!("\"{first}\""))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    s.shutdown().unwrap();
}

#[test]
fn ingest_object_array_and_ndjson() {
    let s = start(config());
    let (code, body, _) = ureq_status(
        ureq::post(&url(&s, "/v1/ingest")).send_string(r#"{"key":"a","value":1,"player":"x"}"#),
    );
    assert_eq!(code, 200);
    let (first, body) = split_ver(&body);
    assert_eq!(body, r#"{"k":"a","ver":V,"v":1,"sum":1,"n":1,"by":"x"}"#);

    let (code, body, _) = ureq_status(ureq::post(&url(&s, "/v1/ingest")).send_string(
        r#"[{"key":"a","value":2},{"value":3},5,{"key":"b","value":"x"},{"key":"b","value":4}]"#,
    ));
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["accepted"], 2, "{body}");
    assert_eq!(v["rejected"], 3, "{body}");
    let errs = v["errors"].as_array().unwrap();
    assert_eq!(errs[0]["i"], 1);
    assert_eq!(errs[0]["error"], "missing key: no member named key");
    assert_eq!(errs[1]["i"], 2);
    assert_eq!(errs[2]["i"], 3);

    let (code, body, _) = ureq_status(
        ureq::post(&url(&s, "/v1/ingest"))
            .set("Content-Type", "application/x-ndjson")
            .send_string("{\"key\":\"a\",\"value\":10}\n\n   \n{\"key\":\"c\",\"value\":1}\n"),
    );
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["accepted"].as_u64(), v["rejected"].as_u64()),
        (Some(2), Some(0)),
        "{body}"
    );

    let (_, body, _) = ureq_status(ureq::get(&url(&s, "/v1/boxes/a")).call());
    assert_eq!(
        split_ver(&body),
        (
            first + 2,
            r#"{"k":"a","ver":V,"v":10,"sum":13,"n":3,"by":"x"}"#.into()
        )
    );

    // An empty array is accepted with N = 0.
    let (code, body, _) = ureq_status(ureq::post(&url(&s, "/v1/ingest")).send_string("[]"));
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"accepted":0,"rejected":0,"errors":[]}"#)
    );

    // One invalid NDJSON line refuses the whole body: nothing applied.
    let (code, body, _) = ureq_status(
        ureq::post(&url(&s, "/v1/ingest"))
            .set("Content-Type", "application/x-ndjson")
            .send_string("{\"key\":\"a\",\"value\":1}\n{\"key\":\n"),
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("invalid json"), "{body}");
    let (_, body, _) = ureq_status(ureq::get(&url(&s, "/v1/boxes/a")).call());
    assert_eq!(split_ver(&body).0, first + 2, "{body}");
    s.shutdown().unwrap();
}

/// docs/http.md#keys: everything after `/v1/boxes/` is the key. A real
/// client's request for `room-17/alice` and one for `room-17%2Falice` reach the
/// same box with the same ETag; a path a hop would rewrite is 400 (sent raw,
/// as a client that does not normalize paths sends it).
#[test]
fn keys_with_slashes_in_paths_over_a_socket() {
    let s = start(config());
    let (code, body, _) =
        ureq_status(ureq::post(&url(&s, "/v1/boxes/room-17/alice")).send_string(r#"{"value":3}"#));
    assert_eq!(code, 200, "{body}");
    let (ver, text) = split_ver(&body);
    assert_eq!(text, r#"{"k":"room-17/alice","ver":V,"v":3,"sum":3,"n":1}"#);
    let (code, _, slashed) = ureq_status(ureq::get(&url(&s, "/v1/boxes/room-17/alice")).call());
    assert_eq!(code, 200);
    let (code, _, encoded) = ureq_status(ureq::get(&url(&s, "/v1/boxes/room-17%2Falice")).call());
    assert_eq!(code, 200);
    assert_eq!(slashed, Some(format!("\"{ver}\"")));
    assert_eq!(slashed, encoded);
    let a = s.addr();
    for path in [
        "/v1/boxes/room-17//alice",
        "/v1/boxes/room-17/../alice",
        "/v1/boxes/room-17/",
    ] {
        let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        let r = raw(a, req.as_bytes()).0;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        assert!(r.text().contains("%2F"), "{}", r.text());
    }
    assert_eq!(get(a, "/v1/boxes/room-17/alice/x").status, 404);
}

#[test]
fn methods_head_and_percent_encoded_keys() {
    let s = start(config());
    let a = s.addr();
    let r = raw(a, b"PUT /v1/boxes/x HTTP/1.1\r\nHost: t\r\n\r\n").0;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("GET, HEAD, POST, DELETE"));
    let r = get(a, "/v1/ingest");
    assert_eq!(r.status, 405);
    assert_eq!(r.header("Allow"), Some("POST"));
    assert_eq!(get(a, "/nope").status, 404);

    let r = post(a, "/v1/boxes/caf%C3%A9%20au%2Flait", r#"{"value":1}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let (ver, text) = split_ver(&r.text());
    assert_eq!(text, r#"{"k":"café au/lait","ver":V,"v":1,"sum":1,"n":1}"#);
    let r = get(a, "/v1/boxes/caf%C3%A9%20au%2Flait");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("café au/lait"));
    assert_eq!(get(a, "/v1/boxes/caf%C3%A9").status, 404);
    assert_eq!(get(a, "/v1/boxes/bad%zz").status, 400);

    let (r, _) = raw(
        a,
        b"HEAD /v1/boxes/caf%C3%A9%20au%2Flait HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    let len: usize = r.header("Content-Length").unwrap().parse().unwrap();
    assert_eq!(
        len,
        format!(r#"{{"k":"café au/lait","ver":{ver},"v":1,"sum":1,"n":1}}"#).len()
    );

    for (path, want) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let r = get(a, path);
        assert_eq!((r.status, r.text().as_str()), (200, want));
    }
    let r = get(a, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.text().contains("pollbox_http_requests_total"));
    for r in [
        get(a, "/healthz"),
        get(a, "/nope"),
        post(a, "/v1/ingest", "{"),
    ] {
        assert!(r.header("Date").is_some());
        assert!(r.header("Content-Type").is_some());
        assert!(r.header("Content-Length").is_some());
    }
    s.shutdown().unwrap();
}

#[test]
fn thousand_pipelined_requests_in_one_write_answer_in_order() {
    let s = start(config());
    let a = s.addr();
    let mut req = Vec::new();
    for i in 0..1000 {
        if i % 2 == 0 {
            let body = format!(r#"{{"value":{i}}}"#);
            req.extend_from_slice(
                format!(
                    "POST /v1/boxes/p HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        } else {
            req.extend_from_slice(b"GET /v1/boxes/p HTTP/1.1\r\nHost: t\r\n\r\n");
        }
    }
    let mut r = Reader::new(connect(a));
    r.send(&req);
    let mut first = None;
    for i in 0..1000 {
        let resp = r.read(false);
        assert_eq!(resp.status, 200);
        let ver = split_ver(&resp.text()).0;
        let first = *first.get_or_insert(ver);
        assert_eq!(ver, first + i / 2, "response {i}: {}", resp.text());
    }
    s.shutdown().unwrap();
}

#[test]
fn chunked_post_and_expect_continue() {
    let s = start(config());
    let a = s.addr();
    let (r, _) = raw(
        a,
        b"POST /v1/boxes/c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\n{\"val\r\n7\r\nue\":42}\r\n0\r\nX-Trailer: y\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("\"v\":42"));

    let mut rd = Reader::new(connect(a));
    let body = r#"{"value":9}"#;
    rd.send(
        format!(
            "POST /v1/boxes/e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let cont = rd.read(false);
    assert_eq!(cont.status, 100);
    rd.send(body.as_bytes());
    let r = rd.read(false);
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"v\":9"));
    s.shutdown().unwrap();
}

#[test]
fn http10_and_connection_close() {
    let s = start(config());
    let a = s.addr();
    let (r, mut rd) = raw(a, b"GET /healthz HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    assert!(rd.closed(), "1.0 without keep-alive closes");

    let (r, mut rd) = raw(
        a,
        b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Connection")
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("keep-alive")
    );
    rd.send(b"GET /healthz HTTP/1.0\r\n\r\n");
    assert_eq!(rd.read(false).status, 200);
    assert!(rd.closed());

    let (r, mut rd) = raw(
        a,
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Connection"), Some("close"));
    assert!(rd.closed());
    s.shutdown().unwrap();
}
