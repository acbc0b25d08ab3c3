//! The engine's parts on their own: key sets, the checks of many-box answers and
//! their ETags, the versions' table.

use super::answer_check::check;
use super::connection::InFlight;
use super::key_sets::{etag_id, KeySets, MAX_ETAG};
use super::versions::Versions;
use super::{Plan, KEY_SETS};
use crate::args::KeyDist;
use crate::keys::{KeySampler, Rng};
use crate::mix::{Mix, Op};
use crate::request::{KeyNames, Requests};
use crate::stats::ErrorKind;

#[test]
fn key_sets_are_distinct_keys_drawn_once() {
    for (dist, keys, per_set) in [
        (KeyDist::Uniform, 1000, 20),
        (KeyDist::Zipf, 1000, 64),
        // As many keys per set as there are keys: every key, once.
        (KeyDist::Zipf, 30, 30),
        (KeyDist::Uniform, 1, 1),
    ] {
        let sampler = KeySampler::new(dist, keys, 0.99);
        let sets = KeySets::draw(&sampler, keys, per_set, &mut Rng::new(5));
        for set in 0..KEY_SETS as u32 {
            let mut k = sets.keys(set).to_vec();
            assert_eq!(k.len(), per_set);
            assert!(k.iter().all(|&key| key < keys));
            k.sort_unstable();
            k.dedup();
            assert_eq!(k.len(), per_set, "{dist:?} {keys} {per_set}: repeated key");
            assert_eq!(sets.etag(set), None);
        }
    }
    // Zipf sets hold the hot keys.
    let sampler = KeySampler::new(KeyDist::Zipf, 1000, 0.99);
    let sets = KeySets::draw(&sampler, 1000, 20, &mut Rng::new(5));
    assert!((0..KEY_SETS as u32).all(|s| sets.keys(s).contains(&0)));
}

fn plan(per_set: usize) -> Plan {
    Plan {
        addr: "127.0.0.1:1".parse().unwrap(),
        requests: Requests::new("h", 10, KeyNames::default(), 64, 1, 100, None),
        mix: Mix::parse("poll_many:1,longpoll_many:1").unwrap(),
        keys: KeySampler::new(KeyDist::Uniform, 10, 0.0),
        key_count: 10,
        keys_per_request: per_set,
        pipeline: 1,
        interval_ns: None,
        connections: 1,
        warmup_ns: 0,
        end_ns: 0,
        drain_ns: 0,
        seed: 0,
        published: None,
    }
}

#[test]
fn many_box_answers_are_checked_and_their_etags_kept() {
    let plan = plan(3);
    let mut versions = Versions::new(10);
    let mut sets = KeySets {
        per_set: 3,
        keys: vec![4, 0, 7, 1, 2, 3, 5, 6, 8, 9, 4, 1],
        etags: vec![None; KEY_SETS],
    };
    let payload = |k: u32, v: u64| format!(r#"{{"k":"lg-{k}","ver":{v},"v":1}}"#);
    let body = format!("[{},null,{}]", payload(4, 3), payload(7, 5));
    let ask = |op, sent: Option<&[u8]>| InFlight {
        op,
        key: 0,
        intended: 0,
        after: sent.map_or(0, etag_id),
    };
    let mut check = |request: &InFlight, status, body: &str, etag: Option<&[u8]>| {
        check(
            &plan,
            &mut versions,
            &mut sets,
            request,
            status,
            body.as_bytes(),
            etag,
        )
    };

    // The first answer: no If-None-Match sent; one null box; its ETag is kept.
    let v = check(&ask(Op::PollMany, None), 200, &body, Some(b"\"11\""));
    assert_eq!((v.error, v.missing), (None, 1));
    // 304 to the ETag sent, for either operation.
    for op in [Op::PollMany, Op::LongPollMany] {
        let v = check(&ask(op, Some(b"\"11\"")), 304, "", Some(b"\"11\""));
        assert_eq!((v.error, v.missing), (None, 0));
    }
    // A box moved: 200 with a new ETag.
    let moved = format!("[{},null,{}]", payload(4, 4), payload(7, 5));
    let v = check(
        &ask(Op::LongPollMany, Some(b"\"11\"")),
        200,
        &moved,
        Some(b"\"12\""),
    );
    assert_eq!(v.error, None);

    let errors = [
        // 304 without an If-None-Match, or naming another ETag.
        (
            ask(Op::PollMany, None),
            304,
            String::new(),
            Some(&b"\"12\""[..]),
            ErrorKind::Status,
        ),
        (
            ask(Op::PollMany, Some(b"\"12\"")),
            304,
            String::new(),
            Some(b"\"13\""),
            ErrorKind::Payload,
        ),
        // No ETag.
        (
            ask(Op::PollMany, None),
            200,
            moved.clone(),
            None,
            ErrorKind::Payload,
        ),
        // 200 to a current If-None-Match.
        (
            ask(Op::PollMany, Some(b"\"12\"")),
            200,
            moved.clone(),
            Some(b"\"12\""),
            ErrorKind::Version,
        ),
        // A version going backwards.
        (
            ask(Op::PollMany, None),
            200,
            body.clone(),
            Some(b"\"14\""),
            ErrorKind::Version,
        ),
        // Too few, too many, out of order, another key, not an array.
        (
            ask(Op::PollMany, None),
            200,
            format!("[{},null]", payload(4, 4)),
            Some(b"\"1\""),
            ErrorKind::Payload,
        ),
        (
            ask(Op::PollMany, None),
            200,
            format!("[{},null,null,null]", payload(4, 4)),
            Some(b"\"1\""),
            ErrorKind::Payload,
        ),
        (
            ask(Op::PollMany, None),
            200,
            format!("[null,{},null]", payload(4, 4)),
            Some(b"\"1\""),
            ErrorKind::Payload,
        ),
        (
            ask(Op::PollMany, None),
            200,
            format!("[{},null,null]", payload(5, 4)),
            Some(b"\"1\""),
            ErrorKind::Payload,
        ),
        (
            ask(Op::PollMany, None),
            200,
            payload(4, 4),
            Some(b"\"1\""),
            ErrorKind::Payload,
        ),
        // A status the operation does not expect.
        (
            ask(Op::PollMany, None),
            400,
            r#"{"error":"x"}"#.to_string(),
            None,
            ErrorKind::Status,
        ),
        (
            ask(Op::LongPollMany, None),
            404,
            r#"{"error":"x"}"#.to_string(),
            None,
            ErrorKind::Status,
        ),
    ];
    for (request, status, body, etag, want) in errors {
        let v = check(&request, status, &body, etag);
        assert_eq!(v.error, Some(want), "{status} {body} {etag:?}");
    }
    assert_eq!(versions.get(4), 4);
    // The last good ETag (a failed check keeps none of its own).
    assert_eq!(sets.etag(0), Some(&b"\"12\""[..]));
    assert_eq!(sets.etag(1), None);
}

#[test]
fn etags_are_kept_up_to_their_limit() {
    let mut sets = KeySets::draw(
        &KeySampler::new(KeyDist::Uniform, 10, 0.0),
        10,
        2,
        &mut Rng::new(1),
    );
    sets.set_etag(2, &[b'x'; MAX_ETAG]);
    assert_eq!(sets.etag(2), Some(&[b'x'; MAX_ETAG][..]));
    sets.set_etag(2, &[b'x'; MAX_ETAG + 1]);
    assert_eq!(sets.etag(2), None, "too long to send back");
    assert_ne!(etag_id(b""), 0);
    assert_ne!(etag_id(b"\"1\""), etag_id(b"\"2\""));
}

#[test]
fn versions_are_exact_for_small_key_sets_and_bounded_for_large() {
    let mut v = Versions::new(1000);
    assert!(v.exact);
    assert_eq!(v.get(5), 0);
    v.set(5, 9);
    assert_eq!(v.get(5), 9);
    assert_eq!(v.get(6), 0);
    let mut big = Versions::new(1_000_000);
    assert!(!big.exact);
    assert_eq!(big.slots.len(), 4096);
    big.set(999_999, 3);
    assert_eq!(big.get(999_999), 3);
    // A colliding key does not read another key's version.
    let other = (0..1_000_000u32)
        .find(|&k| k != 999_999 && big.slot(k) == big.slot(999_999))
        .unwrap();
    assert_eq!(big.get(other), 0);
}
