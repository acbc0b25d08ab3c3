//! A room's stream resumed over and over while writers change it
//! (docs/http.md#rooms, docs/boxes.md#watermarks): each reconnect sends its
//! last `Last-Event-ID` and must be sent exactly what moved since: never a
//! version the client holds or an older one, and at the end the client holds
//! exactly the room. Real sockets, real writers on every worker.

mod common;
use common::rooms::{read_then_hang_up, resume_a_quiet_room, room, writers, Held, Sse};
use common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn a_room_resumed_over_and_over_is_sent_exactly_what_moved() {
    let s = start(config());
    let a = s.addr();
    for i in 0..40 {
        let r = post(a, &format!("/v1/boxes/room/k{i:02}"), r#"{"value":1}"#);
        assert_eq!(r.status, 200);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let threads = writers(&[a, a, a], 40, 8, stop.clone());
    let mut held = Held::default();
    let mut id: Option<String> = None;
    let mut reconnects = 0;
    let mut events = 0usize;
    let mut x = 12345u64;
    while reconnects < 200 {
        held.log.push_back(format!("-- reconnect with {id:?}"));
        held.conn += 1;
        for v in held.by_key.values_mut() {
            v.push(format!("conn {} opens with {id:?}", held.conn));
        }
        let mut sse = Sse::open(a, "room/", id.as_deref());
        // Read a few events (at least through the listing's `synced` on the
        // first connect), then hang up at an event that carried an id.
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        events += read_then_hang_up(&mut sse, &mut held, &mut id, 1 + (x >> 33) % 12);
        reconnects += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let ops: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(ops > 500, "the writers wrote: {ops}");
    // Quiet now: one more resume, read until it has sent what moved since.
    let mut sse = Sse::open(a, "room/", id.as_deref());
    let want = room(a, "room/");
    held.conn += 1;
    loop {
        let e = sse.next().expect("the stream goes on");
        held.apply(&e);
        if e.event == "synced" {
            id = e.id.clone();
            break;
        }
    }
    let differ: Vec<&String> = held
        .boxes
        .keys()
        .filter(|k| !want.contains_key(*k))
        .chain(want.keys().filter(|k| !held.boxes.contains_key(*k)))
        .collect();
    for k in &differ {
        let hist = held.by_key.get(*k).cloned().unwrap_or_default();
        let tail = &hist[hist.len().saturating_sub(12)..];
        eprintln!(
            "{k}: server {:?}\n  {}",
            want.get(*k).map(|w| w.0),
            tail.join("\n  ")
        );
    }
    assert_eq!(
        held.boxes.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the client holds the room's boxes ({events} events, {reconnects} reconnects, {ops} writes, {} resets)",
        held.resets
    );
    for (k, (ver, payload)) in &want {
        let (got_ver, got) = held.boxes.get(k).expect("held");
        assert_eq!(got_ver, ver, "{k}");
        let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(parse(got), parse(payload), "{k}");
    }
    // Resets come only from removals no longer kept (256 a set of the key
    // order; this room's 40 keys are all in one): exact all the same.
    eprintln!(
        "{events} events, {reconnects} reconnects, {ops} writes, {} resets",
        held.resets
    );
    // A quiet resume from the last id sends nothing but `synced`, with an id
    // at or past it (the node may have published writes elsewhere since).
    let mut again = Sse::open(a, "room/", id.as_deref());
    let e = again.next().expect("an event");
    assert_eq!(e.event, "synced", "{e:?}");
    let cut = |w: &str| -> Vec<u64> {
        let (_, c) = w.split_once('.').expect("a watermark");
        c.split(',')
            .map(|p| u64::from_str_radix(p, 16).unwrap())
            .collect()
    };
    let (was, now) = (cut(id.as_deref().unwrap()), cut(e.id.as_deref().unwrap()));
    assert!(
        was.iter().zip(&now).all(|(w, n)| n >= w),
        "{was:?} -> {now:?}"
    );
    s.shutdown().unwrap();
}

/// A resumed stream of a large room where little or nothing moved is sent
/// what moved and `synced` without waiting: steps of its listing that find
/// nothing to send go on at once, never at the next heartbeat (which this
/// server sends only after a minute: the stream's reads give up after 10 s,
/// so a listing that waits for it fails here). The long-poll form answers
/// what moved at once too. (On a node of a log: `log_rooms.rs`.)
#[test]
fn a_resumed_room_where_little_moved_is_synced_without_waiting() {
    let mut c = config();
    c.http.sse_heartbeat_ms = 60_000;
    let s = start(c);
    resume_a_quiet_room(s.addr());
    s.shutdown().unwrap();
}
