//! Properties of the request framer, driven the way the server drives it: a
//! caller appends each read to a `Vec`, calls `advance`, and drains the bytes
//! of every complete request.
//!
//! - Any split of a valid pipelined stream (CL, chunked with extensions and
//!   trailers, bodiless requests, 1.0 and 1.1) yields the same frames as the
//!   whole stream in one buffer, and those frames say what was sent.
//! - Near-requests, word soup and arbitrary bytes never panic, and any split of
//!   them gives the same outcome (frames, then an error or "need more") as the
//!   whole.
//! - The steady-state framing path allocates nothing.

use pollbox_core::http::{
    parse_poll_query, percent_decode_into, route, write_response_head, DateCache, Frame, Framer,
    HttpError, Limits, Method, Progress, ResponseHead, Route, Version,
};
use proptest::prelude::*;

// ---- a caller, simulated ----

/// What a stream turned into, in order.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Request {
        frame: Frame,
        body: Vec<u8>,
    },
    Refused(HttpError),
    /// The stream ended inside a request (or between requests).
    NeedMore,
}

/// The whole stream in one buffer, walked with `&mut buf[consumed..]`.
fn frame_whole(stream: &[u8], limits: Limits) -> Vec<Outcome> {
    let mut buf = stream.to_vec();
    let mut framer = Framer::new(limits);
    let mut at = 0;
    let mut out = Vec::new();
    loop {
        let rest = &mut buf[at..];
        match framer.advance(rest) {
            Ok(Progress::Complete(frame)) => {
                assert!(frame.consumed > 0 && frame.consumed <= rest.len());
                assert_crlf_only(&rest[..frame.body.start]);
                let body = rest[frame.body.clone()].to_vec();
                at += frame.consumed;
                out.push(Outcome::Request { frame, body });
            }
            Ok(Progress::Partial { .. }) => {
                out.push(Outcome::NeedMore);
                return out;
            }
            Err(e) => {
                out.push(Outcome::Refused(e));
                return out;
            }
        }
    }
}

/// A framed head never holds a bare CR or a bare LF.
fn assert_crlf_only(head: &[u8]) {
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\r' => assert_eq!(head.get(i + 1), Some(&b'\n'), "bare CR at {i} in {head:?}"),
            b'\n' => assert!(i > 0 && head[i - 1] == b'\r', "bare LF at {i} in {head:?}"),
            _ => {}
        }
    }
}

/// The stream cut into reads of the given sizes (cycled), appended to a `Vec`
/// that is drained of each request's bytes once it is handled. Also checks
/// that `send_continue` comes at most once per request, and only for one that
/// expects it.
fn frame_in_reads(stream: &[u8], reads: &[usize], limits: Limits) -> Vec<Outcome> {
    let mut framer = Framer::new(limits);
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut continues = 0;
    let mut fed = 0;
    let mut sizes = reads.iter().cycle();
    while fed < stream.len() {
        let n = (*sizes.next().unwrap_or(&1)).clamp(1, stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        loop {
            match framer.advance(&mut buf) {
                Ok(Progress::Complete(frame)) => {
                    assert!(
                        continues == 0 || frame.expect_continue,
                        "continue for {frame:?}"
                    );
                    continues = 0;
                    let body = buf[frame.body.clone()].to_vec();
                    buf.drain(..frame.consumed);
                    out.push(Outcome::Request { frame, body });
                }
                Ok(Progress::Partial { send_continue }) => {
                    continues += usize::from(send_continue);
                    assert!(continues <= 1, "send_continue twice");
                    break;
                }
                Err(e) => {
                    out.push(Outcome::Refused(e));
                    return out;
                }
            }
        }
    }
    out.push(Outcome::NeedMore);
    out
}

// ---- valid streams ----

#[derive(Debug, Clone)]
enum Framing {
    None,
    Length,
    Chunked {
        cuts: Vec<usize>,
        upper_hex: bool,
        zeros: usize,
        ext: bool,
        trailer: bool,
    },
}

#[derive(Debug, Clone)]
struct Req {
    method: &'static str,
    key: String,
    query: Option<String>,
    http10: bool,
    connection: Option<&'static str>,
    expect: bool,
    content_type: Option<&'static str>,
    leading_crlf: bool,
    body: Vec<u8>,
    framing: Framing,
}

/// What a frame should say about `Req`, compared as data.
#[derive(Debug, PartialEq, Eq)]
struct Said {
    method: Method,
    version: Version,
    keep_alive: bool,
    expect_continue: bool,
    path: Vec<u8>,
    query: Vec<u8>,
    content_type: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl Req {
    fn render(&self, out: &mut Vec<u8>) {
        if self.leading_crlf {
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("{} /v1/boxes/{}", self.method, self.key).as_bytes());
        if let Some(q) = &self.query {
            out.extend_from_slice(format!("?{q}").as_bytes());
        }
        let version = if self.http10 { "HTTP/1.0" } else { "HTTP/1.1" };
        out.extend_from_slice(format!(" {version}\r\nHost: pollbox\r\n").as_bytes());
        if let Some(c) = self.connection {
            out.extend_from_slice(format!("Connection: {c}\r\n").as_bytes());
        }
        if self.expect {
            out.extend_from_slice(b"Expect: 100-continue\r\n");
        }
        if let Some(ct) = self.content_type {
            out.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
        }
        match &self.framing {
            Framing::None => out.extend_from_slice(b"\r\n"),
            Framing::Length => {
                out.extend_from_slice(
                    format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes(),
                );
                out.extend_from_slice(&self.body);
            }
            Framing::Chunked {
                cuts,
                upper_hex,
                zeros,
                ext,
                trailer,
            } => {
                out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                let mut points: Vec<usize> = cuts
                    .iter()
                    .map(|c| c % (self.body.len() + 1))
                    .chain([0, self.body.len()])
                    .collect();
                points.sort_unstable();
                points.dedup();
                for w in points.windows(2) {
                    let chunk = &self.body[w[0]..w[1]];
                    let size = if *upper_hex {
                        format!("{:0>width$X}", chunk.len(), width = zeros + 1)
                    } else {
                        format!("{:0>width$x}", chunk.len(), width = zeros + 1)
                    };
                    out.extend_from_slice(size.as_bytes());
                    if *ext {
                        out.extend_from_slice(b" ;n=\"v;x\";flag");
                    }
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n");
                if *trailer {
                    out.extend_from_slice(b"X-Trailer: done\r\n");
                }
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn said(&self) -> Said {
        let version = if self.http10 {
            Version::Http10
        } else {
            Version::Http11
        };
        let close = self.connection == Some("close");
        Said {
            method: Method::from_bytes(self.method.as_bytes()),
            version,
            keep_alive: if self.http10 {
                self.connection == Some("keep-alive")
            } else {
                !close
            },
            expect_continue: self.expect && !self.http10,
            path: format!("/v1/boxes/{}", self.key).into_bytes(),
            query: self.query.clone().unwrap_or_default().into_bytes(),
            content_type: self.content_type.map(|c| c.as_bytes().to_vec()),
            body: self.body.clone(),
        }
    }
}

fn said_by(outcome: &Outcome, stream_req: &[u8]) -> Option<Said> {
    match outcome {
        Outcome::Request { frame, body } => Some(Said {
            method: frame.method,
            version: frame.version,
            keep_alive: frame.keep_alive,
            expect_continue: frame.expect_continue,
            path: stream_req[frame.path.clone()].to_vec(),
            query: stream_req[frame.query.clone()].to_vec(),
            content_type: frame
                .field(&frame.content_type, stream_req)
                .map(<[u8]>::to_vec),
            body: body.clone(),
        }),
        _ => None,
    }
}

fn framing() -> impl Strategy<Value = Framing> {
    prop_oneof![
        Just(Framing::Length),
        (
            prop::collection::vec(0usize..4096, 0..6),
            any::<bool>(),
            0usize..3,
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(cuts, upper_hex, zeros, ext, trailer)| Framing::Chunked {
                cuts,
                upper_hex,
                zeros,
                ext,
                trailer
            }),
    ]
}

fn req() -> impl Strategy<Value = Req> {
    (
        prop::sample::select(vec!["GET", "HEAD", "POST", "PUT"]),
        "[a-z0-9%-]{1,12}",
        prop::option::of("(after=[0-9]{1,5})?(&wait_ms=[0-9]{1,4})?"),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["close", "keep-alive"])),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec![
            "application/json",
            "application/x-ndjson",
        ])),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..600),
        framing(),
    )
        .prop_map(
            |(
                method,
                key,
                query,
                http10,
                connection,
                expect,
                content_type,
                leading_crlf,
                body,
                framing,
            )| {
                // An empty body is sent either way; 1.0 cannot be chunked.
                let framing = match framing {
                    Framing::Chunked { .. } if http10 => Framing::Length,
                    f if body.is_empty() && !matches!(f, Framing::Chunked { .. }) => Framing::None,
                    f => f,
                };
                Req {
                    method,
                    key,
                    query,
                    http10,
                    connection,
                    expect,
                    content_type,
                    leading_crlf,
                    body,
                    framing,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any split of a valid pipelined stream frames the same requests, and they
    /// are the requests that were sent.
    #[test]
    fn any_split_of_a_valid_stream_frames_the_same_requests(
        reqs in prop::collection::vec(req(), 1..8),
        reads in prop::collection::vec(1usize..300, 1..20),
    ) {
        let mut stream = Vec::new();
        let mut bounds = Vec::new();
        for r in &reqs {
            let start = stream.len();
            r.render(&mut stream);
            bounds.push(start..stream.len());
        }
        let whole = frame_whole(&stream, Limits::default());
        prop_assert_eq!(whole.len(), reqs.len() + 1);
        prop_assert_eq!(whole.last(), Some(&Outcome::NeedMore));
        for ((outcome, r), range) in whole.iter().zip(&reqs).zip(&bounds) {
            // Ranges index the slice starting at this request's boundary; the
            // rendered bytes are the untouched original (chunked bodies are
            // decoded in the framer's copy), so compare what can be.
            let Outcome::Request { frame, body } = outcome else {
                return Err(TestCaseError::fail(format!("not a request: {outcome:?}")));
            };
            prop_assert_eq!(frame.consumed, range.len());
            let said = said_by(outcome, &stream[range.clone()]).map(|mut s| {
                s.body = body.clone();
                s
            });
            prop_assert_eq!(said, Some(r.said()));
        }
        let split = frame_in_reads(&stream, &reads, Limits::default());
        prop_assert_eq!(split, whole);
    }

    /// Near-requests (plausible lines, some broken) and word soup never panic
    /// the framer, and any split of them yields the same outcome as the whole.
    #[test]
    fn near_requests_never_panic_and_splits_agree(
        stream in prop_oneof![
            3 => prop::collection::vec(near_request(), 1..6).prop_map(|r| r.concat()),
            1 => prop::collection::vec(soup_piece(), 0..80).prop_map(|p| p.concat()),
        ],
        reads in prop::collection::vec(1usize..64, 1..10),
        limits in small_limits(),
    ) {
        let whole = frame_whole(&stream, limits);
        let split = frame_in_reads(&stream, &reads, limits);
        prop_assert_eq!(split, whole);
    }

    /// Uniformly random bytes, same properties.
    #[test]
    fn random_bytes_never_panic_and_splits_agree(
        stream in prop::collection::vec(any::<u8>(), 0..1024),
        reads in prop::collection::vec(1usize..64, 1..10),
        limits in small_limits(),
    ) {
        let whole = frame_whole(&stream, limits);
        let split = frame_in_reads(&stream, &reads, limits);
        prop_assert_eq!(split, whole);
    }

    /// A valid request with random bytes spliced in at one place: whatever the
    /// framer decides, reads of any size decide the same.
    #[test]
    fn corrupted_valid_streams_splits_agree(
        reqs in prop::collection::vec(req(), 1..4),
        at in any::<prop::sample::Index>(),
        junk in prop::collection::vec(soup_piece(), 1..4),
        reads in prop::collection::vec(1usize..64, 1..10),
    ) {
        let mut stream = Vec::new();
        for r in &reqs {
            r.render(&mut stream);
        }
        let i = at.index(stream.len() + 1);
        let junk: Vec<u8> = junk.concat();
        stream.splice(i..i, junk);
        let whole = frame_whole(&stream, Limits::default());
        let split = frame_in_reads(&stream, &reads, Limits::default());
        prop_assert_eq!(split, whole);
    }
}

fn small_limits() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        (16usize..300, 0usize..6, 0usize..200).prop_map(|(h, n, b)| Limits {
            max_header_bytes: h,
            max_headers: n,
            max_body_bytes: b,
        }),
    ]
}

/// A request assembled from plausible and broken parts: request lines,
/// header lines, line endings and body pieces (chunk lines, trailers, data).
fn near_request() -> impl Strategy<Value = Vec<u8>> {
    let request_lines: Vec<&'static [u8]> = vec![
        b"GET /v1/boxes/k HTTP/1.1",
        b"POST /v1/ingest HTTP/1.1",
        b"HEAD /healthz HTTP/1.1",
        b"GET /v1/boxes/k?after=1&wait_ms=5 HTTP/1.0",
        b"POST /v1/boxes/k HTTP/1.0",
        b"GET / HTTP/2.0",
        b"GET  / HTTP/1.1",
        b"GET /",
        b" GET / HTTP/1.1",
    ];
    let request_line = prop_oneof![
        6 => prop::sample::select(request_lines[..5].to_vec()),
        1 => prop::sample::select(request_lines[5..].to_vec()),
    ];
    let header_lines: Vec<&'static [u8]> = vec![
        b"Content-Length: 5",
        b"Content-Length: 0",
        b"Content-Length: 3",
        b"content-length: 3",
        b"Content-Length: -1",
        b"Content-Length: 99999999999999999999999",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Transfer-Encoding: chunked, chunked",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Expect: 100-continue",
        b"If-None-Match: \"3\"",
        b"X: y",
        b" folded",
        b"Bad Header",
    ];
    let body_pieces: Vec<&'static [u8]> = vec![
        b"hello",
        b"abc",
        b"5\r\nhello\r\n",
        b"3\r\nabc\r\n",
        b"1;x=y\r\na\r\n",
        b"0\r\n",
        b"0\r\n\r\n",
        b"X-T: v\r\n",
        b"\r\n",
        b"g\r\n",
        b"FFFFFFFFFFFFFFFFF\r\n",
        b"3\r\nabcX",
        b"3\nabc\n",
    ];
    // Mostly well-formed, so the body paths get exercised too.
    let ending = prop_oneof![
        40 => Just(&b"\r\n"[..]),
        1 => Just(&b"\n"[..]),
        1 => Just(&b"\r"[..]),
    ];
    (
        any::<bool>(),
        request_line,
        ending.clone(),
        prop::collection::vec((prop::sample::select(header_lines), ending.clone()), 0..6),
        ending,
        prop::collection::vec(prop::sample::select(body_pieces), 0..6),
    )
        .prop_map(|(crlf_first, line, end, headers, blank, body)| {
            let mut r = Vec::new();
            if crlf_first {
                r.extend_from_slice(b"\r\n");
            }
            r.extend_from_slice(line);
            r.extend_from_slice(end);
            for (h, e) in headers {
                r.extend_from_slice(h);
                r.extend_from_slice(e);
            }
            r.extend_from_slice(blank);
            for piece in body {
                r.extend_from_slice(piece);
            }
            r
        })
}

fn soup_piece() -> impl Strategy<Value = Vec<u8>> {
    let words: Vec<&'static [u8]> = vec![
        b"GET ",
        b"POST ",
        b"HEAD ",
        b"/v1/boxes/k",
        b"?after=1",
        b" HTTP/1.1",
        b" HTTP/1.0",
        b" HTTP/2.0",
        b"\r\n",
        b"\r\n\r\n",
        b"\n",
        b"\r",
        b" ",
        b"\t",
        b":",
        b";",
        b",",
        b"Content-Length: ",
        b"Transfer-Encoding: chunked",
        b"Transfer-Encoding: gzip, chunked",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Expect: 100-continue",
        b"X: y",
        b"0",
        b"5",
        b"1f",
        b"FFFFFFFFFFFFFFFFF",
        b"hello",
    ];
    prop_oneof![
        4 => prop::sample::select(words).prop_map(|w| w.to_vec()),
        1 => prop::collection::vec(any::<u8>(), 1..8),
    ]
}

// ---- allocation ----

/// Counts per thread, so tests running beside these on other threads do not
/// disturb them.
#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting = pollbox_test_alloc::Counting::new();

fn allocations_in(f: impl FnOnce()) -> u64 {
    ALLOC.count_on_this_thread(f)
}

#[test]
fn the_counting_allocator_counts() {
    let n = allocations_in(|| {
        std::hint::black_box(vec![1u8; 10]);
    });
    assert_eq!(n, 1);
}

#[test]
fn steady_state_framing_and_response_heads_allocate_nothing() {
    let stream: Vec<u8> = [
        &b"GET /v1/boxes/box%2D1?after=3&wait_ms=50 HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"3\"\r\n\r\n"[..],
        b"POST /v1/boxes/box-1 HTTP/1.1\r\nContent-Length: 11\r\n\r\n{\"value\":5}",
        b"POST /v1/ingest HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\n{\"a\":\r\n2\r\n1}\r\n0\r\nT: v\r\n\r\n",
        b"HEAD /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    ]
    .concat();
    let mut buf = Vec::with_capacity(stream.len());
    let mut key = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(4096);
    let mut framer = Framer::new(Limits::default());
    let mut date = DateCache::new();
    let mut framed = 0;
    let n = allocations_in(|| {
        date.update(std::time::SystemTime::now());
        // Byte by byte, the hardest way for the framer to keep its progress.
        for &b in &stream {
            buf.push(b);
            while let Ok(Progress::Complete(frame)) = framer.advance(&mut buf) {
                let path = &buf[frame.path.clone()];
                if let Route::Poll { key: raw } = route(frame.method, path) {
                    let _ = percent_decode_into(raw, &mut key);
                    let _ = parse_poll_query(&buf[frame.query.clone()]);
                }
                let head = ResponseHead {
                    status: 200,
                    content_type: b"application/json",
                    content_length: frame.body.len(),
                    date: date.get(),
                    keep_alive: frame.keep_alive,
                    version: frame.version,
                };
                write_response_head(&mut out, &head, &[(b"ETag", b"\"4\"")]);
                buf.drain(..frame.consumed);
                framed += 1;
            }
        }
    });
    assert_eq!(framed, 4);
    assert_eq!(key, b"box-1");
    assert_eq!(n, 0, "allocations on the framing path");
}
