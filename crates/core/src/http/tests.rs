//! Framer tests: one per row of docs/http.md#bad-input the framer decides, the
//! keep-alive matrix, Expect, HEAD, pipelining and resumption.

use super::*;

fn limits() -> Limits {
    Limits::default()
}

/// A frame with its byte views copied out, so tests can compare text.
#[derive(Debug)]
struct Got {
    frame: Frame,
    path: String,
    query: String,
    body: Vec<u8>,
}

fn view(buf: &[u8], frame: Frame) -> Got {
    Got {
        path: String::from_utf8_lossy(&buf[frame.path.clone()]).into_owned(),
        query: String::from_utf8_lossy(&buf[frame.query.clone()]).into_owned(),
        body: buf[frame.body.clone()].to_vec(),
        frame,
    }
}

/// Frame one request that is entirely in `req`, with `limits`.
fn frame_with(req: &[u8], limits: Limits) -> Result<Got, HttpError> {
    let mut buf = req.to_vec();
    let mut f = Framer::new(limits);
    match f.advance(&mut buf)? {
        Progress::Complete(frame) => Ok(view(&buf, frame)),
        Progress::Partial { .. } => panic!("incomplete: {:?}", String::from_utf8_lossy(req)),
    }
}

fn frame(req: &[u8]) -> Got {
    match frame_with(req, limits()) {
        Ok(g) => g,
        Err(e) => panic!("{e:?} for {:?}", String::from_utf8_lossy(req)),
    }
}

/// The error `req` gets, fed whole and fed byte by byte (they must agree).
fn error_with(req: &[u8], limits: Limits) -> HttpError {
    let mut buf = req.to_vec();
    let whole = Framer::new(limits).advance(&mut buf);
    let mut f = Framer::new(limits);
    let mut buf = Vec::new();
    let mut trickled = None;
    for &b in req {
        buf.push(b);
        match f.advance(&mut buf) {
            Ok(Progress::Partial { .. }) => {}
            Ok(Progress::Complete(fr)) => panic!("framed {fr:?}"),
            Err(e) => {
                trickled = Some(e);
                break;
            }
        }
    }
    match (whole, trickled) {
        (Err(a), Some(b)) => {
            assert_eq!(
                a,
                b,
                "whole vs trickled for {:?}",
                String::from_utf8_lossy(req)
            );
            a
        }
        other => panic!(
            "expected an error, got {other:?} for {:?}",
            String::from_utf8_lossy(req)
        ),
    }
}

fn error(req: &[u8]) -> HttpError {
    error_with(req, limits())
}

fn partial(f: &mut Framer, buf: &mut [u8]) -> bool {
    match f.advance(buf) {
        Ok(Progress::Partial { send_continue }) => send_continue,
        other => panic!("expected Partial, got {other:?}"),
    }
}

fn complete(f: &mut Framer, buf: &mut [u8]) -> Frame {
    match f.advance(buf) {
        Ok(Progress::Complete(frame)) => frame,
        other => panic!("expected Complete, got {other:?}"),
    }
}

// ---- heads ----

#[test]
fn simple_get() {
    let g = frame(b"GET /v1/boxes/box-42 HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(g.frame.method, Method::Get);
    assert_eq!(g.frame.version, Version::Http11);
    assert!(g.frame.keep_alive);
    assert!(!g.frame.expect_continue);
    assert_eq!(g.path, "/v1/boxes/box-42");
    assert_eq!(g.query, "");
    assert!(g.body.is_empty());
    assert_eq!(g.frame.consumed, 42);
    assert_eq!(g.frame.if_none_match, None);
    assert_eq!(g.frame.authorization, None);
    assert_eq!(g.frame.origin, None);
    assert_eq!(g.frame.content_type, None);
}

#[test]
fn methods() {
    for (m, want) in [
        ("GET", Method::Get),
        ("HEAD", Method::Head),
        ("POST", Method::Post),
        ("PUT", Method::Put),
        ("DELETE", Method::Delete),
        ("PATCH", Method::Patch),
        ("OPTIONS", Method::Options),
        ("BREW", Method::Other),
        ("get", Method::Other),
    ] {
        let g = frame(format!("{m} / HTTP/1.1\r\n\r\n").as_bytes());
        assert_eq!(g.frame.method, want, "{m}");
    }
}

#[test]
fn path_and_query() {
    for (target, path, query) in [
        (
            "/v1/boxes/a?after=3&wait_ms=10",
            "/v1/boxes/a",
            "after=3&wait_ms=10",
        ),
        ("/x?", "/x", ""),
        ("/x#frag", "/x", ""),
        ("/x?q=1#frag", "/x", "q=1"),
        ("/a%2Fb?c", "/a%2Fb", "c"),
        (
            "http://example.com/v1/boxes/k?after=1",
            "/v1/boxes/k",
            "after=1",
        ),
        ("http://example.com", "", ""),
        ("http://example.com?x", "", "x"),
        ("*", "*", ""),
    ] {
        let g = frame(format!("OPTIONS {target} HTTP/1.1\r\n\r\n").as_bytes());
        assert_eq!(
            (g.path.as_str(), g.query.as_str()),
            (path, query),
            "{target}"
        );
    }
}

#[test]
fn interesting_headers_are_ranges_of_trimmed_values() {
    let req = b"GET / HTTP/1.1\r\nif-none-match:  \"7\" \r\nAUTHORIZATION: Bearer t0k\r\n\
                Content-Type:\tapplication/x-ndjson\t\r\nIf-None-Match: \"8\"\r\n\
                ORIGIN: https://game.example \r\nOrigin: https://other.example\r\n\r\n";
    let g = frame(req);
    let text = |r: Option<std::ops::Range<u32>>| {
        r.map(|r| String::from_utf8_lossy(&req[r.start as usize..r.end as usize]).into_owned())
    };
    assert_eq!(text(g.frame.if_none_match).as_deref(), Some("\"7\""));
    assert_eq!(text(g.frame.authorization).as_deref(), Some("Bearer t0k"));
    assert_eq!(
        text(g.frame.content_type).as_deref(),
        Some("application/x-ndjson")
    );
    assert_eq!(
        text(g.frame.origin).as_deref(),
        Some("https://game.example")
    );
}

#[test]
fn empty_header_value_is_an_empty_range_inside_the_buffer() {
    let req = b"GET / HTTP/1.1\r\nIf-None-Match:\r\nAuthorization: \r\n\r\n";
    let g = frame(req);
    let inm = g.frame.if_none_match.unwrap();
    let auth = g.frame.authorization.unwrap();
    assert!(inm.is_empty() && inm.end as usize <= req.len());
    assert!(auth.is_empty() && auth.end as usize <= req.len());
}

#[test]
fn partial_head_then_complete() {
    let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut f = Framer::new(limits());
    assert_eq!(f.state(), FramerState::Idle);
    let mut buf = Vec::new();
    assert!(!partial(&mut f, &mut buf));
    assert_eq!(f.state(), FramerState::Idle);
    for (i, &b) in req.iter().enumerate() {
        buf.push(b);
        if i + 1 < req.len() {
            assert!(!partial(&mut f, &mut buf));
            assert_eq!(f.state(), FramerState::Head);
        }
    }
    let fr = complete(&mut f, &mut buf);
    assert_eq!(fr.consumed, req.len());
    assert_eq!(f.state(), FramerState::Idle);
}

#[test]
fn empty_lines_before_a_request_are_skipped_and_count_as_idle() {
    let mut f = Framer::new(limits());
    let mut buf = b"\r\n\r\n\r".to_vec();
    assert!(!partial(&mut f, &mut buf));
    assert_eq!(f.state(), FramerState::Idle);
    buf.extend_from_slice(b"\nGET /x HTTP/1.1\r\n\r\n");
    let fr = complete(&mut f, &mut buf);
    assert_eq!(&buf[fr.path.clone()], b"/x");
    assert_eq!(fr.consumed, buf.len());
}

#[test]
fn malformed_request_lines_are_400() {
    for req in [
        &b"GET\r\n\r\n"[..],
        b"GET /\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b" GET / HTTP/1.1\r\n\r\n",
        b"GET  / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1 \r\n\r\n",
        b"G(T / HTTP/1.1\r\n\r\n",
        b"GET /a b HTTP/1.1\r\n\r\n",
        b"GET / FTP/1.1\r\n\r\n",
        b"GET / HTTP/1\r\n\r\n",
        b"GET / http/1.1\r\n\r\n",
        b"\x00\r\n\r\n",
    ] {
        assert_eq!(
            error(req),
            HttpError::MalformedRequestLine,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
}

#[test]
fn unsupported_versions_are_505() {
    for v in ["HTTP/2.0", "HTTP/1.2", "HTTP/0.9", "HTTP/3.0"] {
        let req = format!("GET / {v}\r\nHost: x\r\n\r\n");
        assert_eq!(error(req.as_bytes()), HttpError::UnsupportedVersion, "{v}");
    }
}

#[test]
fn malformed_headers_are_400() {
    for req in [
        &b"GET / HTTP/1.1\r\nNoColon\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nName : x\r\n\r\n",
        b"GET / HTTP/1.1\r\n: empty-name\r\n\r\n",
        b"GET / HTTP/1.1\r\nA: \x01\r\n\r\n",
    ] {
        assert_eq!(
            error(req),
            HttpError::MalformedHeader,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
}

#[test]
fn obs_fold_is_400() {
    assert_eq!(
        error(b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n"),
        HttpError::ObsFold
    );
    assert_eq!(
        error(b"GET / HTTP/1.1\r\nA: b\r\n\tc\r\n\r\n"),
        HttpError::ObsFold
    );
    // Whitespace between the request line and the first header (RFC 9112 §2.2).
    assert_eq!(
        error(b"GET / HTTP/1.1\r\n A: b\r\n\r\n"),
        HttpError::ObsFold
    );
}

#[test]
fn obs_fold_is_refused_before_the_head_ends() {
    let mut f = Framer::new(limits());
    let mut buf = b"GET / HTTP/1.1\r\nA: b\r\n ".to_vec();
    assert_eq!(f.advance(&mut buf), Err(HttpError::ObsFold));
}

#[test]
fn bare_lf_and_bare_cr_are_400_everywhere_in_the_head() {
    for req in [
        &b"GET / HTTP/1.1\n\r\n"[..],
        b"GET / HTTP/1.1\r\nA: b\n\r\n",
        b"GET / HTTP/1.1\r\nA: b\r\n\n",
        b"\nGET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\n\n",
    ] {
        assert_eq!(
            error(req),
            HttpError::BareLf,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
    for req in [
        &b"GET / HTTP/1.1\rX\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",
        b"GET / HTTP/1.1\r\nA: b\r\n\r\r\n",
        b"\rGET / HTTP/1.1\r\n\r\n",
        b"GET /\r HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\r\n\r\n",
        b"G\rET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nA\r: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nA: b\r\r\n\r\n",
        b"GET / HTTP/1.1\r\nA:\r\r\n\r\n",
        b"GET / HTTP/1.1\r\n\rA: b\r\n\r\n",
    ] {
        assert_eq!(
            error(req),
            HttpError::BareCr,
            "{:?}",
            String::from_utf8_lossy(req)
        );
    }
}

// ---- head limits ----

fn head_of_len(len: usize) -> Vec<u8> {
    let mut req = b"GET / HTTP/1.1\r\nX: ".to_vec();
    let pad = len - req.len() - 4;
    req.extend(std::iter::repeat_n(b'a', pad));
    req.extend_from_slice(b"\r\n\r\n");
    assert_eq!(req.len(), len);
    req
}

#[test]
fn head_of_exactly_max_header_bytes_is_accepted() {
    let l = Limits {
        max_header_bytes: 200,
        ..limits()
    };
    assert!(frame_with(&head_of_len(200), l).is_ok());
    assert_eq!(error_with(&head_of_len(201), l), HttpError::HeadTooLarge);
}

#[test]
fn incomplete_head_over_the_limit_is_431_at_once() {
    let l = Limits {
        max_header_bytes: 100,
        ..limits()
    };
    let mut f = Framer::new(l);
    let mut buf = b"GET / HTTP/1.1\r\nX: ".to_vec();
    buf.resize(100, b'a');
    assert!(!partial(&mut f, &mut buf));
    buf.push(b'a');
    assert_eq!(f.advance(&mut buf), Err(HttpError::HeadTooLarge));
    // Sticky until reset.
    assert_eq!(f.advance(&mut buf), Err(HttpError::HeadTooLarge));
}

#[test]
fn empty_lines_before_the_request_count_towards_the_head_limit() {
    let l = Limits {
        max_header_bytes: 30,
        ..limits()
    };
    let ok = b"\r\n\r\nGET / HTTP/1.1\r\nA: b\r\n\r\n";
    assert_eq!(ok.len(), 28);
    assert!(frame_with(ok, l).is_ok());
    assert_eq!(
        error_with(b"\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\nA: b\r\n\r\n", l),
        HttpError::HeadTooLarge
    );
    let mut f = Framer::new(l);
    let mut buf = b"\r\n".repeat(16);
    assert_eq!(f.advance(&mut buf), Err(HttpError::HeadTooLarge));
}

fn with_headers(n: usize) -> Vec<u8> {
    let mut req = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..n {
        req.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req
}

#[test]
fn max_headers_is_accepted_one_more_is_431() {
    assert!(frame_with(&with_headers(64), limits()).is_ok());
    assert_eq!(error(&with_headers(65)), HttpError::TooManyHeaders);
    let l = Limits {
        max_headers: 0,
        ..limits()
    };
    assert!(frame_with(&with_headers(0), l).is_ok());
    assert_eq!(error_with(&with_headers(1), l), HttpError::TooManyHeaders);
}

#[test]
fn too_many_headers_is_431_before_the_head_ends() {
    let mut req = with_headers(65);
    req.truncate(req.len() - 2);
    let mut f = Framer::new(limits());
    assert_eq!(f.advance(&mut req), Err(HttpError::TooManyHeaders));
}

#[test]
fn max_headers_is_capped_at_max_headers_slots() {
    let l = Limits {
        max_headers: usize::MAX,
        max_header_bytes: 1 << 20,
        ..limits()
    };
    assert_eq!(Framer::new(l).limits().max_headers, MAX_HEADERS);
    assert!(frame_with(&with_headers(MAX_HEADERS), l).is_ok());
    assert_eq!(
        error_with(&with_headers(MAX_HEADERS + 1), l),
        HttpError::TooManyHeaders
    );
}

// ---- Content-Length ----

#[test]
fn content_length_body() {
    let g = frame(b"POST /v1/ingest HTTP/1.1\r\nContent-Length: 5\r\n\r\nhelloGET");
    assert_eq!(g.body, b"hello");
    assert_eq!(g.frame.consumed, 52);
}

#[test]
fn content_length_body_arriving_in_parts() {
    let mut f = Framer::new(limits());
    let mut buf = b"POST /v1/ingest HTTP/1.1\r\nContent-Length: 5\r\n\r\nhe".to_vec();
    assert!(!partial(&mut f, &mut buf));
    assert_eq!(f.state(), FramerState::Body);
    buf.extend_from_slice(b"ll");
    assert!(!partial(&mut f, &mut buf));
    buf.extend_from_slice(b"o");
    let fr = complete(&mut f, &mut buf);
    assert_eq!(&buf[fr.body], b"hello");
    assert_eq!(f.state(), FramerState::Idle);
}

#[test]
fn no_length_means_empty_body_for_every_method() {
    for m in ["GET", "POST", "PUT", "HEAD"] {
        let g = frame(format!("{m} / HTTP/1.1\r\n\r\nextra").as_bytes());
        assert!(g.body.is_empty());
        assert_eq!(g.frame.consumed, format!("{m} / HTTP/1.1\r\n\r\n").len());
    }
}

#[test]
fn content_length_zero() {
    let g = frame(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(g.body.is_empty());
}

#[test]
fn content_length_over_max_body_is_413_at_head_time() {
    let l = Limits {
        max_body_bytes: 10,
        ..limits()
    };
    assert_eq!(
        frame_with(
            b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789",
            l
        )
        .unwrap()
        .body
        .len(),
        10
    );
    let mut f = Framer::new(l);
    let mut buf = b"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n".to_vec();
    assert_eq!(f.advance(&mut buf), Err(HttpError::BodyTooLarge));
    assert_eq!(
        error(b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n"),
        HttpError::BodyTooLarge
    );
}

#[test]
fn identical_duplicate_content_lengths_are_accepted() {
    let g = frame(b"POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 003\r\n\r\nabc");
    assert_eq!(g.body, b"abc");
}

#[test]
fn different_content_lengths_are_400() {
    assert_eq!(
        error(b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"),
        HttpError::ConflictingContentLength
    );
}

#[test]
fn invalid_content_lengths_are_400() {
    for v in [
        "",
        "+5",
        "-5",
        "5 5",
        "0x5",
        "5,5",
        "5, 5",
        "five",
        "1e3",
        "99999999999999999999999",
    ] {
        let req = format!("POST / HTTP/1.1\r\nContent-Length: {v}\r\n\r\n");
        assert_eq!(
            error(req.as_bytes()),
            HttpError::InvalidContentLength,
            "{v:?}"
        );
    }
}

#[test]
fn get_and_head_with_a_body_are_framed() {
    for m in ["GET", "HEAD"] {
        let g =
            frame(format!("{m} /v1/boxes/k HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi").as_bytes());
        assert_eq!(g.body, b"hi", "{m}");
    }
}

#[test]
fn head_request() {
    let g = frame(b"HEAD /v1/boxes/k HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(g.frame.method, Method::Head);
    assert!(g.body.is_empty());
    assert!(g.frame.keep_alive);
    assert_eq!(
        route(g.frame.method, g.path.as_bytes()),
        Route::Poll { key: b"k" }
    );
}

// ---- Transfer-Encoding ----

#[test]
fn content_length_and_transfer_encoding_is_400() {
    for req in [
        &b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n",
    ] {
        assert_eq!(error(req), HttpError::ContentLengthAndTransferEncoding);
    }
}

#[test]
fn transfer_codings_other_than_chunked() {
    for (te, want) in [
        (&["gzip"][..], HttpError::TransferEncodingNotChunked),
        (&["chunked, gzip"], HttpError::TransferEncodingNotChunked),
        (&[""], HttpError::TransferEncodingNotChunked),
        (&[" , "], HttpError::TransferEncodingNotChunked),
        (&["chunked;q=1"], HttpError::TransferEncodingNotChunked),
        (&["identity"], HttpError::TransferEncodingNotChunked),
        (&["chunked", "gzip"], HttpError::TransferEncodingNotChunked),
        (&["gzip, chunked"], HttpError::UnsupportedTransferCoding),
        (&["gzip", "chunked"], HttpError::UnsupportedTransferCoding),
        (&["chunked, chunked"], HttpError::ChunkedTwice),
        (&["chunked", "chunked"], HttpError::ChunkedTwice),
    ] {
        let mut req = String::from("POST / HTTP/1.1\r\n");
        for v in te {
            req.push_str(&format!("Transfer-Encoding: {v}\r\n"));
        }
        req.push_str("\r\n0\r\n\r\n");
        let e = error(req.as_bytes());
        assert_eq!(e, want, "{te:?}");
    }
    assert_eq!(HttpError::UnsupportedTransferCoding.status(), 501);
}

#[test]
fn chunked_is_case_insensitive_and_trimmed() {
    let g = frame(b"POST / HTTP/1.1\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    assert_eq!(g.body, b"abc");
    let g = frame(b"POST / HTTP/1.1\r\nTransfer-Encoding: ,chunked,\r\n\r\n0\r\n\r\n");
    assert!(g.body.is_empty());
}

#[test]
fn transfer_encoding_in_http10_is_400() {
    assert_eq!(
        error(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        HttpError::TransferEncodingInHttp10
    );
}

// ---- chunked bodies ----

const CHUNKED_HEAD: &[u8] = b"POST /v1/ingest HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";

fn chunked(body: &[u8]) -> Vec<u8> {
    let mut req = CHUNKED_HEAD.to_vec();
    req.extend_from_slice(body);
    req
}

#[test]
fn chunked_body_is_decoded_in_place() {
    let req = chunked(b"5\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\n\r\nNEXT");
    let g = frame(&req);
    assert_eq!(g.body, b"hello 0123456789");
    assert_eq!(g.frame.body.start, CHUNKED_HEAD.len());
    assert_eq!(g.frame.consumed, req.len() - 4);
}

#[test]
fn empty_chunked_body() {
    let g = frame(&chunked(b"0\r\n\r\n"));
    assert!(g.body.is_empty());
    assert_eq!(g.frame.consumed, CHUNKED_HEAD.len() + 5);
}

#[test]
fn chunk_sizes_hex_any_case_with_leading_zeros() {
    let data = [b'x'; 0xab];
    let mut body = b"Ab\r\n".to_vec();
    body.extend_from_slice(&data);
    body.extend_from_slice(b"\r\n00000000000000aB\r\n");
    body.extend_from_slice(&data);
    body.extend_from_slice(b"\r\n0000000000000000\r\n\r\n");
    assert_eq!(frame(&chunked(&body)).body.len(), 2 * 0xab);
}

#[test]
fn chunk_extensions_are_skipped() {
    let g = frame(&chunked(
        b"3;name=value\r\nabc\r\n2 ; a=\"q;\\\"x\" ;b\r\nde\r\n1\t;x\r\nf\r\n0;last\r\n\r\n",
    ));
    assert_eq!(g.body, b"abcdef");
}

#[test]
fn trailers_are_skipped() {
    let req = chunked(b"3\r\nabc\r\n0\r\nX-Checksum: 123\r\nX-Other: y\r\n\r\nGET");
    let g = frame(&req);
    assert_eq!(g.body, b"abc");
    assert_eq!(g.frame.consumed, req.len() - 3);
}

#[test]
fn trailers_over_max_header_bytes_are_431() {
    let l = Limits {
        max_header_bytes: 100,
        ..limits()
    };
    let mut ok = b"0\r\n".to_vec();
    ok.extend_from_slice(b"X: ");
    ok.resize(3 + 98, b'a');
    ok.extend_from_slice(b"\r\n\r\n");
    // 98 + CRLF of the field, then 2 of the blank line: 102 > 100.
    assert_eq!(error_with(&chunked(&ok), l), HttpError::TrailersTooLarge);
    let mut fits = b"0\r\nX: ".to_vec();
    fits.resize(3 + 96, b'a');
    fits.extend_from_slice(b"\r\n\r\n");
    assert!(frame_with(&chunked(&fits), l).is_ok());
    // No end of line at all: refused once past the limit, not at the end.
    let mut endless = b"0\r\nX: ".to_vec();
    endless.resize(3 + 101, b'a');
    assert_eq!(
        error_with(&chunked(&endless), l),
        HttpError::TrailersTooLarge
    );
}

#[test]
fn chunk_size_not_hex_is_400() {
    for body in [
        &b"g\r\n"[..],
        b"\r\n",
        b"-1\r\n",
        b"+1\r\n",
        b"0x1\r\n",
        b" 1\r\n",
        b"1 x\r\n",
        b"1g\r\n",
        b";ext\r\n",
    ] {
        assert_eq!(
            error(&chunked(body)),
            HttpError::ChunkSizeNotHex,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn chunk_size_of_more_than_16_digits_is_400() {
    assert_eq!(
        error(&chunked(b"00000000000000001\r\n")),
        HttpError::ChunkSizeTooLong
    );
    assert_eq!(
        error_with(
            &chunked(b"FFFFFFFFFFFFFFFFF\r\n"),
            Limits {
                max_body_bytes: usize::MAX,
                ..limits()
            }
        ),
        HttpError::ChunkSizeTooLong
    );
}

#[test]
fn chunk_data_without_crlf_is_400() {
    assert_eq!(
        error(&chunked(b"3\r\nabcX\r\n0\r\n\r\n")),
        HttpError::MissingChunkCrlf
    );
    assert_eq!(
        error(&chunked(b"3\r\nabc\rX0\r\n\r\n")),
        HttpError::MissingChunkCrlf
    );
    assert_eq!(
        error(&chunked(b"3\r\nabcd\r\n0\r\n\r\n")),
        HttpError::MissingChunkCrlf
    );
}

#[test]
fn bare_lf_and_cr_in_chunked_framing_are_400() {
    for body in [
        &b"3\nabc\r\n0\r\n\r\n"[..],
        b"3\r\nabc\n0\r\n\r\n",
        b"3;x\nabc\r\n0\r\n\r\n",
        b"0\r\n\n",
        b"0\r\nX: y\n\r\n",
        b"0\n\r\n",
    ] {
        assert_eq!(
            error(&chunked(body)),
            HttpError::BareLf,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    for body in [
        &b"3\rabc\r\n0\r\n\r\n"[..],
        b"0\r\n\rX",
        b"0\r\nX: y\rz\r\n\r\n",
        b"3;x\rx",
    ] {
        assert_eq!(
            error(&chunked(body)),
            HttpError::BareCr,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn chunked_body_over_max_is_413_as_soon_as_a_size_says_so() {
    let l = Limits {
        max_body_bytes: 10,
        ..limits()
    };
    assert_eq!(
        frame_with(&chunked(b"A\r\n0123456789\r\n0\r\n\r\n"), l)
            .unwrap()
            .body
            .len(),
        10
    );
    // The size line alone, no data yet, no CRLF yet.
    let mut f = Framer::new(l);
    let mut buf = chunked(b"B");
    assert_eq!(f.advance(&mut buf), Err(HttpError::BodyTooLarge));
    // The running total across chunks.
    let mut f = Framer::new(l);
    let mut buf = chunked(b"6\r\n012345\r\n5");
    assert_eq!(f.advance(&mut buf), Err(HttpError::BodyTooLarge));
    assert_eq!(
        error_with(&chunked(b"6\r\n012345\r\n5\r\n01234\r\n0\r\n\r\n"), l),
        HttpError::BodyTooLarge
    );
}

#[test]
fn chunk_framing_overhead_is_bounded() {
    let l = Limits {
        max_body_bytes: 64,
        max_header_bytes: 64,
        ..limits()
    };
    // One chunk with 200 bytes of extensions: 128 bytes of framing is the most.
    let mut body = b"1;".to_vec();
    body.extend(std::iter::repeat_n(b'x', 200));
    body.extend_from_slice(b"\r\na\r\n0\r\n\r\n");
    assert_eq!(
        error_with(&chunked(&body), l),
        HttpError::ChunkFramingTooLarge
    );
    assert_eq!(HttpError::ChunkFramingTooLarge.status(), 413);
    // Many tiny chunks: 5 bytes of framing per body byte.
    let mut body = b"1\r\na\r\n".repeat(40);
    body.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(
        error_with(&chunked(&body), l),
        HttpError::ChunkFramingTooLarge
    );
    // Under the bound.
    let mut body = b"1\r\na\r\n".repeat(20);
    body.extend_from_slice(b"0\r\n\r\n");
    assert_eq!(frame_with(&chunked(&body), l).unwrap().body, vec![b'a'; 20]);
}

#[test]
fn chunked_body_trickled_in_small_reads_is_linear() {
    // 1 MiB in 4 KiB chunks, fed 3 bytes at a time.
    let mut req = CHUNKED_HEAD.to_vec();
    let mut expected = Vec::new();
    for i in 0..256u32 {
        req.extend_from_slice(b"1000;ext=1\r\n");
        let chunk: Vec<u8> = (0..4096u32).map(|j| (i * 7 + j) as u8).collect();
        req.extend_from_slice(&chunk);
        req.extend_from_slice(b"\r\n");
        expected.extend_from_slice(&chunk);
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let mut f = Framer::new(limits());
    let mut buf = Vec::with_capacity(req.len());
    let mut frame = None;
    for piece in req.chunks(3) {
        buf.extend_from_slice(piece);
        match f.advance(&mut buf).unwrap() {
            Progress::Complete(fr) => frame = Some(fr),
            Progress::Partial { send_continue } => assert!(!send_continue),
        }
    }
    let frame = frame.unwrap();
    assert_eq!(frame.consumed, req.len());
    assert_eq!(&buf[frame.body], &expected[..]);
    // Every byte examined once (the one parse of the head aside).
    assert!(
        f.bytes_examined() <= req.len() as u64,
        "{} > {}",
        f.bytes_examined(),
        req.len()
    );
}

#[test]
fn trickled_head_is_scanned_once() {
    let req = with_headers(60);
    let mut f = Framer::new(limits());
    let mut buf = Vec::new();
    for &b in &req[..req.len() - 1] {
        buf.push(b);
        assert!(!partial(&mut f, &mut buf));
    }
    buf.push(b'\n');
    complete(&mut f, &mut buf);
    assert_eq!(f.bytes_examined(), req.len() as u64);
}

// ---- keep-alive ----

#[test]
fn keep_alive_matrix() {
    for (version, connection, want) in [
        ("HTTP/1.1", None, true),
        ("HTTP/1.1", Some("close"), false),
        ("HTTP/1.1", Some("Close"), false),
        ("HTTP/1.1", Some("keep-alive"), true),
        ("HTTP/1.1", Some("Upgrade, close"), false),
        ("HTTP/1.1", Some("keep-alive, close"), false),
        ("HTTP/1.1", Some("closed"), true),
        ("HTTP/1.0", None, false),
        ("HTTP/1.0", Some("keep-alive"), true),
        ("HTTP/1.0", Some("Keep-Alive"), true),
        ("HTTP/1.0", Some(" foo , keep-alive "), true),
        ("HTTP/1.0", Some("close"), false),
        ("HTTP/1.0", Some("keep-alive, close"), false),
        ("HTTP/1.0", Some("keep-alive-ish"), false),
    ] {
        let mut req = format!("GET / {version}\r\n");
        if let Some(c) = connection {
            req.push_str(&format!("Connection: {c}\r\n"));
        }
        req.push_str("\r\n");
        assert_eq!(
            frame(req.as_bytes()).frame.keep_alive,
            want,
            "{version} {connection:?}"
        );
    }
}

#[test]
fn connection_tokens_from_several_fields_combine() {
    let g = frame(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n");
    assert!(!g.frame.keep_alive);
    let g = frame(b"GET / HTTP/1.0\r\nConnection: foo\r\nconnection: keep-alive\r\n\r\n");
    assert!(g.frame.keep_alive);
    assert_eq!(g.frame.version, Version::Http10);
}

// ---- Expect ----

#[test]
fn expect_continue_is_signalled_once_then_the_body_completes() {
    let mut f = Framer::new(limits());
    let mut buf =
        b"POST /v1/ingest HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n".to_vec();
    assert!(partial(&mut f, &mut buf));
    assert!(!partial(&mut f, &mut buf));
    buf.extend_from_slice(b"ab");
    assert!(!partial(&mut f, &mut buf));
    buf.extend_from_slice(b"cd");
    let fr = complete(&mut f, &mut buf);
    assert!(fr.expect_continue);
    assert_eq!(&buf[fr.body], b"abcd");
}

#[test]
fn expect_continue_with_chunked_body() {
    let mut f = Framer::new(limits());
    let mut buf =
        b"POST / HTTP/1.1\r\nExpect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n2\r"
            .to_vec();
    assert!(partial(&mut f, &mut buf));
    buf.extend_from_slice(b"\nab\r\n0\r\n");
    assert!(!partial(&mut f, &mut buf));
    buf.extend_from_slice(b"\r\n");
    let fr = complete(&mut f, &mut buf);
    assert!(fr.expect_continue);
    assert_eq!(&buf[fr.body], b"ab");
}

#[test]
fn expect_continue_is_not_signalled_when_the_body_is_already_there() {
    let g = frame(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab");
    assert!(g.frame.expect_continue);
    assert_eq!(g.body, b"ab");
    // No body at all.
    let g = frame(b"GET / HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
    assert!(g.frame.expect_continue);
}

#[test]
fn expect_continue_is_ignored_for_http10_and_other_expectations() {
    for req in [
        &b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n",
    ] {
        let mut f = Framer::new(limits());
        let mut buf = req.to_vec();
        assert!(!partial(&mut f, &mut buf));
        buf.extend_from_slice(b"ab");
        assert!(!complete(&mut f, &mut buf).expect_continue);
    }
}

#[test]
fn expect_continue_with_too_large_a_body_is_413_without_continue() {
    let l = Limits {
        max_body_bytes: 3,
        ..limits()
    };
    let mut f = Framer::new(l);
    let mut buf = b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n".to_vec();
    assert_eq!(f.advance(&mut buf), Err(HttpError::BodyTooLarge));
}

// ---- pipelining ----

const PIPELINE: &[&[u8]] = &[
    b"GET /v1/boxes/a HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"3\"\r\n\r\n",
    b"POST /v1/boxes/a HTTP/1.1\r\nContent-Length: 11\r\nContent-Type: application/json\r\n\r\n{\"value\":1}",
    b"POST /v1/ingest HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"ke\r\n8;x=y\r\ny\":\"b\"}\n\r\n0\r\nT: 1\r\n\r\n",
    b"\r\nHEAD /healthz HTTP/1.1\r\n\r\n",
    b"GET /v1/boxes/b?after=2&wait_ms=100 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
];

fn expected_pipeline() -> Vec<(Method, &'static str, &'static str, &'static [u8], bool)> {
    vec![
        (Method::Get, "/v1/boxes/a", "", b"", true),
        (Method::Post, "/v1/boxes/a", "", b"{\"value\":1}", true),
        (Method::Post, "/v1/ingest", "", b"{\"key\":\"b\"}\n", true),
        (Method::Head, "/healthz", "", b"", true),
        (Method::Get, "/v1/boxes/b", "after=2&wait_ms=100", b"", true),
        (Method::Get, "/metrics", "", b"", false),
    ]
}

#[test]
fn pipelined_requests_in_one_buffer() {
    let mut buf = PIPELINE.concat();
    let mut f = Framer::new(limits());
    let mut at = 0;
    let mut got = Vec::new();
    loop {
        let rest = &mut buf[at..];
        match f.advance(rest).unwrap() {
            Progress::Complete(fr) => {
                let g = view(rest, fr);
                at += g.frame.consumed;
                got.push(g);
            }
            Progress::Partial { .. } => break,
        }
    }
    assert_eq!(at, buf.len());
    let got: Vec<_> = got
        .iter()
        .map(|g| {
            (
                g.frame.method,
                g.path.as_str(),
                g.query.as_str(),
                &g.body[..],
                g.frame.keep_alive,
            )
        })
        .collect();
    let want: Vec<_> = expected_pipeline();
    assert_eq!(got, want);
    for (i, part) in PIPELINE.iter().enumerate() {
        let g = frame(part);
        assert_eq!(g.frame.consumed, part.len(), "request {i}");
    }
}

#[test]
fn pipelined_requests_fed_byte_by_byte_give_the_same_frames() {
    let stream = PIPELINE.concat();
    let mut whole = stream.clone();
    let mut f = Framer::new(limits());
    let mut want = Vec::new();
    let mut at = 0;
    while let Progress::Complete(fr) = f.advance(&mut whole[at..]).unwrap() {
        at += fr.consumed;
        want.push(fr);
    }
    let mut f = Framer::new(limits());
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for &b in &stream {
        buf.push(b);
        while let Progress::Complete(fr) = f.advance(&mut buf).unwrap() {
            buf.drain(..fr.consumed);
            got.push(fr);
        }
    }
    assert_eq!(got, want);
    assert!(buf.is_empty());
}

#[test]
fn state_follows_the_request() {
    let mut f = Framer::new(limits());
    let mut buf = b"POST / HTTP/1.1\r\nContent-Length: 1\r\n".to_vec();
    assert_eq!(f.state(), FramerState::Idle);
    partial(&mut f, &mut buf);
    assert_eq!(f.state(), FramerState::Head);
    buf.extend_from_slice(b"\r\n");
    partial(&mut f, &mut buf);
    assert_eq!(f.state(), FramerState::Body);
    buf.extend_from_slice(b"x");
    complete(&mut f, &mut buf);
    assert_eq!(f.state(), FramerState::Idle);
}

#[test]
fn errors_are_sticky_until_reset() {
    let mut f = Framer::new(limits());
    let mut bad = b"GET / HTTP/1.1\nHost: x\r\n\r\n".to_vec();
    assert_eq!(f.advance(&mut bad), Err(HttpError::BareLf));
    let mut good = b"GET / HTTP/1.1\r\n\r\n".to_vec();
    assert_eq!(f.advance(&mut good), Err(HttpError::BareLf));
    f.reset();
    assert_eq!(f.state(), FramerState::Idle);
    complete(&mut f, &mut good);
}

#[test]
fn reset_forgets_a_partial_request() {
    let mut f = Framer::new(limits());
    let mut buf = b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc".to_vec();
    partial(&mut f, &mut buf);
    f.reset();
    let mut next = b"GET /x HTTP/1.1\r\n\r\n".to_vec();
    let fr = complete(&mut f, &mut next);
    assert_eq!(&next[fr.path], b"/x");
}

#[test]
fn a_shrunken_buffer_does_not_panic() {
    // Outside the contract (bytes dropped from the front), but must not panic.
    let mut f = Framer::new(limits());
    let mut buf = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab".to_vec();
    partial(&mut f, &mut buf);
    let _ = f.advance(&mut buf[..3]);
    let mut f = Framer::new(limits());
    let mut buf = b"GET / HTTP/1.1\r\nA: b".to_vec();
    partial(&mut f, &mut buf);
    let _ = f.advance(&mut buf[..2]);
}

// ---- errors ----

#[test]
fn every_error_has_a_status_reason_and_unique_label() {
    let mut labels = std::collections::HashSet::new();
    for e in HttpError::ALL {
        assert!([400, 413, 431, 501, 505].contains(&e.status()), "{e:?}");
        assert!(!e.reason().is_empty());
        assert_eq!(e.to_string(), e.reason());
        let l = e.metric_label();
        assert!(
            l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
            "{l}"
        );
        assert!(labels.insert(l), "duplicate label {l}");
    }
    assert_eq!(
        HttpError::ContentLengthAndTransferEncoding.reason(),
        "both Content-Length and Transfer-Encoding"
    );
}

#[test]
fn spec_section_5_statuses() {
    assert_eq!(HttpError::BodyTooLarge.status(), 413);
    assert_eq!(HttpError::HeadTooLarge.status(), 431);
    assert_eq!(HttpError::TooManyHeaders.status(), 431);
    for e in [
        HttpError::MalformedRequestLine,
        HttpError::ChunkSizeNotHex,
        HttpError::MissingChunkCrlf,
        HttpError::ContentLengthAndTransferEncoding,
        HttpError::ConflictingContentLength,
    ] {
        assert_eq!(e.status(), 400, "{e:?}");
    }
    assert_eq!(HttpError::UnsupportedVersion.status(), 505);
}

/// Errors of the head's line rules and grammar (as opposed to what its fields
/// mean: lengths, codings, limits on the body).
fn is_grammar_error(e: HttpError) -> bool {
    matches!(
        e,
        HttpError::MalformedRequestLine
            | HttpError::MalformedHeader
            | HttpError::UnsupportedVersion
            | HttpError::BareCr
            | HttpError::BareLf
            | HttpError::ObsFold
            | HttpError::HeadTooLarge
            | HttpError::TooManyHeaders
    )
}

/// What `httparse` (the parser the framer's own head grammar replaced) says of
/// the first head in `stream`, judged only where the framer's line rules
/// (CRLF only, no obs-fold, the head and header-count limits) hold: `None`
/// where they do not, or where the head is incomplete.
fn httparse_verdict(stream: &[u8], limits: Limits) -> Option<Result<(String, String), ()>> {
    let end = stream.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = &stream[..end];
    let crlf_only = head.iter().enumerate().all(|(i, &b)| match b {
        b'\n' => i > 0 && head[i - 1] == b'\r',
        b'\r' => head.get(i + 1) == Some(&b'\n'),
        _ => true,
    });
    let lines: Vec<&[u8]> = head[..end - 4].split(|&b| b == b'\n').collect();
    let folded = lines
        .iter()
        .skip(1)
        .any(|l| matches!(l.first(), Some(b' ' | b'\t')));
    let leading_blank = head.starts_with(b"\r\n");
    if !crlf_only || folded || leading_blank || end > limits.max_header_bytes {
        return None;
    }
    if lines.len() - 1 > limits.max_headers {
        return None;
    }
    let mut slots = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut slots);
    Some(match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => Ok((
            req.method.unwrap_or("").to_string(),
            req.path.unwrap_or("").to_string(),
        )),
        _ => Err(()),
    })
}

/// Bytes that sit on the edges of the head grammar.
const EDGE_BYTES: &[u8] = b"aZ09-_.~!/?#%:; \t\"(),@[]\\{}\x7f\x80\xc3\xa9\xff\x01\x00\r";

const SEP1: &[&[u8]] = &[b" ", b" ", b" ", b"  ", b"\t", b""];
const SEP2: &[&[u8]] = &[b" ", b" ", b" ", b"  ", b"\t"];
const VERSIONS: &[&[u8]] = &[
    b"HTTP/1.1",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/2.0",
    b"HTTP/1.1 ",
    b"http/1.1",
    b"HTTP/1.",
];
const COLONS: &[&[u8]] = &[b":", b":", b": ", b" :", b""];

fn edge_bytes(max: usize) -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    proptest::collection::vec(proptest::sample::select(EDGE_BYTES), 0..max)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// The head grammar accepts exactly what httparse accepts (where the
    /// framer's own line rules hold), and reads the same method and target.
    #[test]
    fn head_grammar_agrees_with_httparse(
        method in proptest::prop_oneof![
            proptest::strategy::Just(b"GET".to_vec()),
            proptest::strategy::Just(b"POST".to_vec()),
            edge_bytes(5),
        ],
        sep1 in proptest::sample::select(SEP1),
        target in edge_bytes(12),
        sep2 in proptest::sample::select(SEP2),
        version in proptest::sample::select(VERSIONS),
        fields in proptest::collection::vec(
            (
                proptest::prop_oneof![
                    proptest::strategy::Just(b"Host".to_vec()),
                    proptest::strategy::Just(b"Content-Length".to_vec()),
                    edge_bytes(4),
                ],
                proptest::sample::select(COLONS),
                edge_bytes(20),
            ),
            0..4,
        ),
    ) {
        let mut stream = method.clone();
        stream.extend_from_slice(sep1);
        stream.push(b'/');
        stream.extend_from_slice(&target);
        stream.extend_from_slice(sep2);
        stream.extend_from_slice(version);
        stream.extend_from_slice(b"\r\n");
        for (name, colon, value) in &fields {
            stream.extend_from_slice(name);
            stream.extend_from_slice(colon);
            stream.extend_from_slice(value);
            stream.extend_from_slice(b"\r\n");
        }
        stream.extend_from_slice(b"\r\n");
        let limits = limits();
        let Some(verdict) = httparse_verdict(&stream, limits) else {
            return Ok(());
        };
        let mut buf = stream.clone();
        let mut framer = Framer::new(limits);
        let ours = framer.advance(&mut buf);
        match (&ours, &verdict) {
            (Ok(Progress::Complete(frame)), Ok((method, target))) => {
                proptest::prop_assert_eq!(frame.method, Method::from_bytes(method.as_bytes()));
                let path = &stream[frame.path.clone()];
                proptest::prop_assert!(target.as_bytes().starts_with(path));
            }
            (Ok(Progress::Partial { .. }), Ok(_)) => {
                proptest::prop_assert_eq!(framer.state(), FramerState::Body);
            }
            (Err(e), Ok(_)) => proptest::prop_assert!(!is_grammar_error(*e), "{e:?}"),
            (Err(e), Err(())) => proptest::prop_assert!(is_grammar_error(*e), "{e:?}"),
            (Ok(_), Err(())) => proptest::prop_assert!(false, "httparse refused, we accepted"),
        }
    }
}
