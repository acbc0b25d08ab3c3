//! Fuzz target `framing`: any byte stream, cut into reads at any points, fed
//! to a [`Framer`] the way the server drives one (append each read to the
//! connection buffer, call `advance`, drain the bytes of each complete request).
//!
//! Input layout (everything derived from the fuzzer's bytes):
//! - byte 0: `max_header_bytes` (low 2 bits) and `max_body_bytes` (bits 2-3);
//! - byte 1: `max_headers` (1 to 70);
//! - byte 2: number of read sizes `n` (0 to 8; 0 = one read);
//! - the next `n` bytes: read sizes (byte + 1), cycled;
//! - the rest: the stream.
//!
//! Properties:
//! - nothing panics;
//! - the reads give exactly the frames (and the same final error or "need
//!   more") as the whole stream in one buffer;
//! - every frame's ranges lie inside the bytes it consumed, its head holds
//!   CRLF line ends only, and `100-continue` is signalled at most once per
//!   request, and only for a request that asked for it;
//! - a refused framer keeps refusing with the same error;
//! - each byte is examined at most once (`bytes_examined` never exceeds the
//!   stream length), so a trickled request costs linear time;
//! - the head grammar (`http/head.rs`, written by hand) accepts the first head
//!   exactly when `httparse` 1.10 (which it replaced) does, wherever the
//!   framer's own line rules hold, and reads the same method and target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pollbox_core::http::{Frame, Framer, FramerState, HttpError, Limits, Progress};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Request { frame: Frame, body: Vec<u8> },
    Refused(HttpError),
    NeedMore,
}

fuzz_target!(|data: &[u8]| {
    let Some((limits, reads, stream)) = split_input(data) else {
        return;
    };
    let whole = frame_whole(stream, limits);
    let split = frame_in_reads(stream, &reads, limits);
    assert_eq!(whole, split, "reads {reads:?} changed the outcome");
    agrees_with_httparse(stream, limits);
});

/// Errors of the head's line rules and grammar (not of what its fields mean).
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

/// Compare the framer's verdict on the first head with httparse's, where the
/// framer's line rules (CRLF only, no obs-fold, no leading blank lines, the
/// head and header-count limits) hold and the head is complete. The framer is
/// given the head alone, so that no refusal of a body's framing (a bare CR in
/// a chunk line) is taken for the head's.
fn agrees_with_httparse(stream: &[u8], limits: Limits) {
    let Some(end) = stream.windows(4).position(|w| w == b"\r\n\r\n") else {
        return;
    };
    let head = &stream[..end + 4];
    let crlf_only = head.iter().enumerate().all(|(i, &b)| match b {
        b'\n' => i > 0 && head[i - 1] == b'\r',
        b'\r' => head.get(i + 1) == Some(&b'\n'),
        _ => true,
    });
    let lines = head[..end].split(|&b| b == b'\n').count();
    let folded = head
        .windows(3)
        .any(|w| w[0] == b'\n' && matches!(w[1], b' ' | b'\t'));
    if !crlf_only
        || folded
        || head.starts_with(b"\r\n")
        || head.len() > limits.max_header_bytes
        || lines - 1 > limits.max_headers
    {
        return;
    }
    let mut slots = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut req = httparse::Request::new(&mut slots);
    let theirs = matches!(req.parse(head), Ok(httparse::Status::Complete(_)));
    let ours = frame_whole(head, limits);
    match &ours[0] {
        Outcome::Request { frame, .. } => {
            assert!(theirs, "httparse refused a head the framer accepted");
            let method = req.method.unwrap_or("").as_bytes();
            assert_eq!(frame.method, pollbox_core::http::Method::from_bytes(method));
            let target = req.path.unwrap_or("").as_bytes();
            // The path is the target's, from its start (origin-form) or
            // after the authority (absolute-form).
            let path = &stream[frame.path.clone()];
            assert!(
                path.is_empty() || target.windows(path.len()).any(|w| w == path),
                "path {path:?} not in target {target:?}"
            );
        }
        Outcome::Refused(e) => assert_eq!(
            is_grammar_error(*e),
            !theirs,
            "framer refused with {e:?}, httparse said {theirs}"
        ),
        // Waiting for a body: the head was accepted.
        Outcome::NeedMore => assert!(theirs, "httparse refused a head the framer accepted"),
    }
}

fn split_input(data: &[u8]) -> Option<(Limits, Vec<usize>, &[u8])> {
    let (&[b0, b1, b2], rest) = data.split_first_chunk::<3>()?;
    let n = usize::from(b2 % 9);
    if rest.len() < n {
        return None;
    }
    let (sizes, stream) = rest.split_at(n);
    let limits = Limits {
        max_header_bytes: [64, 200, 1024, 8192][usize::from(b0 & 3)],
        max_body_bytes: [1, 16, 300, 1 << 20][usize::from((b0 >> 2) & 3)],
        max_headers: 1 + usize::from(b1 % 70),
    };
    let reads = sizes.iter().map(|&s| usize::from(s) + 1).collect();
    Some((limits, reads, stream))
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
                check_frame(&frame, rest);
                let body = rest[frame.body.clone()].to_vec();
                at += frame.consumed;
                out.push(Outcome::Request { frame, body });
            }
            Ok(Progress::Partial { .. }) => {
                out.push(Outcome::NeedMore);
                break;
            }
            Err(e) => {
                check_refusal(&mut framer, rest, e);
                out.push(Outcome::Refused(e));
                break;
            }
        }
    }
    assert!(
        framer.bytes_examined() <= stream.len() as u64,
        "examined {} of {} bytes",
        framer.bytes_examined(),
        stream.len()
    );
    out
}

/// The stream cut into reads of the given sizes (cycled), appended to a `Vec`
/// that is drained of each request's bytes once it is handled.
fn frame_in_reads(stream: &[u8], reads: &[usize], limits: Limits) -> Vec<Outcome> {
    let mut framer = Framer::new(limits);
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut continues = 0u32;
    let mut fed = 0;
    let mut sizes = reads.iter().cycle();
    while fed < stream.len() {
        let n = sizes
            .next()
            .copied()
            .unwrap_or(stream.len())
            .clamp(1, stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        loop {
            match framer.advance(&mut buf) {
                Ok(Progress::Complete(frame)) => {
                    check_frame(&frame, &buf);
                    assert!(
                        continues == 0 || frame.expect_continue,
                        "100-continue signalled for {frame:?}"
                    );
                    continues = 0;
                    let body = buf[frame.body.clone()].to_vec();
                    buf.drain(..frame.consumed);
                    out.push(Outcome::Request { frame, body });
                }
                Ok(Progress::Partial { send_continue }) => {
                    continues += u32::from(send_continue);
                    assert!(continues <= 1, "100-continue signalled twice");
                    if send_continue {
                        assert_eq!(framer.state(), FramerState::Body);
                    }
                    break;
                }
                Err(e) => {
                    check_refusal(&mut framer, &mut buf, e);
                    out.push(Outcome::Refused(e));
                    return out;
                }
            }
        }
    }
    assert!(framer.bytes_examined() <= stream.len() as u64);
    out.push(Outcome::NeedMore);
    out
}

/// A frame's ranges lie within what it consumed; the head is CRLF-only; the
/// head fields lie before the body.
fn check_frame(frame: &Frame, buf: &[u8]) {
    assert!(frame.consumed > 0, "empty frame {frame:?}");
    assert!(frame.consumed <= buf.len(), "{frame:?} past {}", buf.len());
    assert!(frame.body.start <= frame.body.end && frame.body.end <= frame.consumed);
    let head_end = frame.body.start;
    let mut ranges = vec![frame.path.clone(), frame.query.clone()];
    for field in [
        &frame.if_none_match,
        &frame.authorization,
        &frame.content_type,
        &frame.origin,
        &frame.accept,
        &frame.last_event_id,
    ] {
        ranges.extend(field.clone().map(|r| r.start as usize..r.end as usize));
    }
    for r in ranges {
        assert!(
            r.start <= r.end && r.end <= head_end,
            "{r:?} outside head in {frame:?}"
        );
    }
    let head = &buf[..head_end];
    for (i, &b) in head.iter().enumerate() {
        match b {
            b'\r' => assert_eq!(head.get(i + 1), Some(&b'\n'), "bare CR at {i}"),
            b'\n' => assert!(i > 0 && head[i - 1] == b'\r', "bare LF at {i}"),
            _ => {}
        }
    }
    assert!(
        head.ends_with(b"\r\n\r\n"),
        "head does not end in a blank line"
    );
}

/// After an error the framer keeps saying the same thing until `reset`, and
/// every error maps to a status the server can send.
fn check_refusal(framer: &mut Framer, buf: &mut [u8], e: HttpError) {
    assert!(matches!(e.status(), 400 | 413 | 431 | 501 | 505), "{e:?}");
    assert!(!e.reason().is_empty() && !e.metric_label().is_empty());
    assert_eq!(
        framer.advance(buf),
        Err(e),
        "a refused framer changed its mind"
    );
    assert_eq!(framer.state(), FramerState::Head);
}
