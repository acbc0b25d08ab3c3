//! `pollbox demo --seconds 1`: the real binary shows the three ways of reading a
//! box (a poll, a long-poll answered by a post, an event stream with an event
//! per post), each with its curl command, then the load and memory tables, and
//! exits 0.

use std::process::Command;

/// The lines of `out` from the one starting with `start` to the next section
/// header (a line starting with `--` or `==`), the header excluded.
fn section<'a>(out: &'a str, start: &str) -> Vec<&'a str> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(start));
    assert!(lines.next().is_some(), "no section {start:?} in:\n{out}");
    lines
        .take_while(|l| !l.starts_with("--") && !l.starts_with("=="))
        .collect()
}

#[test]
fn demo_shows_a_poll_a_long_poll_and_an_event_stream() {
    let run = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["demo", "--seconds", "1"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "demo exited {:?}\nstdout:\n{out}\nstderr:\n{err}",
        run.status
    );

    // The poll: 200 with an ETag, then 304 for If-None-Match with it.
    let poll = section(&out, "-- poll");
    assert!(poll.contains(&"$ curl -si $B"), "{out}");
    assert!(poll.contains(&"HTTP/1.1 200 OK"), "{out}");
    let etag = poll
        .iter()
        .find_map(|l| l.strip_prefix("ETag: \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no ETag in the poll:\n{out}"));
    let version: u64 = etag.parse().unwrap();
    assert!(poll.contains(&"HTTP/1.1 304 Not Modified"), "{out}");

    // The long-poll: parked after the poll's version, answered 200 once a
    // post lands, with a newer version, after about the 300 ms the post waits.
    let long = section(&out, "-- long-poll");
    let curl = format!("$ curl -si \"$B?after={version}&wait_ms=");
    assert!(long.iter().any(|l| l.starts_with(&curl)), "{out}");
    let post = long
        .iter()
        .position(|l| l.contains("another client posts: curl -s -X POST $B -d"))
        .unwrap_or_else(|| panic!("no post in the long-poll:\n{out}"));
    let ok = long
        .iter()
        .position(|l| *l == "HTTP/1.1 200 OK")
        .unwrap_or_else(|| panic!("the long-poll is not answered 200:\n{out}"));
    assert!(post < ok, "{out}");
    let newer: u64 = long[ok + 1]
        .strip_prefix("ETag: \"")
        .and_then(|v| v.strip_suffix('"'))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ETag after the long-poll's 200:\n{out}"));
    assert!(newer > version, "{out}");
    let waited: u64 = long
        .iter()
        .find_map(|l| l.trim().strip_prefix("(answered after "))
        .and_then(|v| v.strip_suffix(" ms)"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no wait time in the long-poll:\n{out}"));
    assert!(
        (250..4000).contains(&waited),
        "answered after {waited} ms: it did not wait for the post:\n{out}"
    );

    // The event stream: its curl, `retry:`, then events whose ids increase,
    // each with its data line; at least two after a post.
    let stream = section(&out, "-- event stream");
    assert!(
        stream.contains(&"$ curl -N -H 'Accept: text/event-stream' $B"),
        "{out}"
    );
    assert!(stream.contains(&"retry: 1000"), "{out}");
    let ids: Vec<u64> = stream
        .iter()
        .filter_map(|l| l.strip_prefix("id: "))
        .map(|v| v.parse().unwrap())
        .collect();
    assert!(ids.len() >= 3, "ids {ids:?}:\n{out}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids {ids:?}:\n{out}");
    assert_eq!(ids[0], newer, "the stream starts with the box as it is");
    let data = stream.iter().filter(|l| l.starts_with("data: {")).count();
    assert_eq!(data, ids.len(), "{out}");
    let first_post = stream
        .iter()
        .position(|l| l.contains("another client posts"))
        .unwrap_or_else(|| panic!("no post in the event stream:\n{out}"));
    let after_posts = stream[first_post..]
        .iter()
        .filter(|l| l.starts_with("id: "))
        .count();
    assert!(after_posts >= 2, "{out}");

    // Then the load and memory tables, and the clean stop.
    assert!(out.contains("== latency (pollbox load)"), "{out}");
    assert!(out.contains("== memory (pollbox memcheck)"), "{out}");
    assert!(
        out.contains("pollbox demo: server stopped cleanly"),
        "{out}"
    );
}
