use super::record::Payload;
use super::test_support::*;
use super::update::new_words;
use super::*;
use crate::config::FieldType;
use std::sync::Barrier;

#[test]
fn for_each_calls_back_with_no_lock_held() {
    // The callback creates boxes (shard write locks) in every shard: were it
    // called under a shard's read lock, the thread would deadlock on itself.
    let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
    for k in 0..3 * WALK_BATCH * SHARDS / 64 {
        apply(&t, &format!("seed-{k}"), &[i(1), i(1), None, None]).unwrap();
    }
    let (done, finished) = std::sync::mpsc::channel();
    let walker = t.clone();
    std::thread::spawn(move || {
        let mut seen = 0;
        let mut created = 0;
        walker.for_each(0, |key, version, _, _| {
            assert!(key.starts_with("seed-") || key.starts_with("new-"));
            assert!(version >= 1);
            seen += 1;
            if created < 1000 {
                let k = format!("new-{created}");
                created += 1;
                apply(&walker, &k, &[i(1), i(1), None, None]).unwrap();
            }
        });
        let _ = done.send(seen);
    });
    let seen = finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("for_each deadlocked: its callback ran under a shard lock");
    assert!(
        seen >= 3 * WALK_BATCH * SHARDS / 64,
        "every seeded box is seen"
    );
}

#[test]
fn spec_example() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    assert_eq!(
        apply(&t, "box-42", &[i(7), i(7), None, Some(Value::Str("p-1"))]),
        Ok(1)
    );
    let mut out = b"prefix:".to_vec();
    let v = t.apply(
        "box-42",
        &[i(5), i(5), None, Some(Value::Str("p-7"))],
        0,
        Some(&mut out),
    );
    assert_eq!(v, Ok(2));
    let expected = r#"{"k":"box-42","ver":2,"v":5,"sum":12,"n":2,"by":"p-7"}"#;
    assert_eq!(out, [b"prefix:".as_slice(), expected.as_bytes()].concat());
    assert_eq!(payload(&t, "box-42"), expected);
    assert_eq!(t.version(b"box-42"), Some(2));
    assert_eq!(t.len(), 1);
}

#[test]
fn new_box_starts_at_version_one_and_renders_on_create() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let mut out = Vec::new();
    assert_eq!(
        t.apply("a", &[None, None, None, None], 0, Some(&mut out)),
        Ok(1)
    );
    assert_eq!(out, br#"{"k":"a","ver":1,"n":1}"#);
    assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":1,"n":1}"#);
}

#[test]
fn keys_are_checked() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    assert_eq!(apply(&t, "", &[]), Err(MessageError::EmptyKey));
    let long = "x".repeat(129);
    assert_eq!(apply(&t, &long, &[]), Err(MessageError::KeyTooLong));
    apply(&t, &long[..128], &[]).expect("128 bytes is the limit");
    assert!(t.poll(b"nope", &mut Vec::new()).is_none());
    assert!(t.poll(b"\xff\xfe", &mut Vec::new()).is_none());
    assert_eq!(t.version(b"nope"), None);
    assert_eq!(t.len(), 1);
}

#[test]
fn payload_over_the_limit_is_rejected_and_creates_nothing() {
    let mut plan = Plan::default_plan();
    plan.max_payload_bytes = 40;
    let t = BoxTable::new(Arc::new(plan));
    // {"k":"a","ver":1,"n":1,"by":"0123456789abcdef"} is 47 bytes.
    let long = Some(Value::Str("0123456789abcdef"));
    assert_eq!(
        apply(&t, "a", &[None, None, None, long]),
        Err(MessageError::PayloadTooLarge)
    );
    assert!(t.is_empty());
    assert_eq!(
        t.accounted_bytes(),
        BoxTable::new(Arc::new(Plan::default_plan())).accounted_bytes()
    );
    apply(&t, "a", &[]).expect("ok");
    let before = payload(&t, "a");
    assert_eq!(
        apply(&t, "a", &[None, None, None, long]),
        Err(MessageError::PayloadTooLarge)
    );
    assert_unchanged(&t, "a", &before);
}

#[test]
fn max_boxes_refuses_new_keys_only() {
    let mut plan = Plan::default_plan();
    plan.max_boxes = 2;
    let t = BoxTable::new(Arc::new(plan));
    apply(&t, "a", &[i(1)]).expect("ok");
    apply(&t, "b", &[i(1)]).expect("ok");
    assert_eq!(apply(&t, "c", &[i(1)]), Err(MessageError::TooManyBoxes));
    assert_eq!(apply(&t, "a", &[i(2)]), Ok(2));
    assert_eq!(t.len(), 2);
    assert!(t.poll(b"c", &mut Vec::new()).is_none());
}

#[test]
fn max_boxes_is_exact_under_four_racing_threads() {
    const MAX: usize = 500;
    const KEYS: usize = 2000;
    let mut plan = Plan::default_plan();
    plan.max_boxes = MAX;
    let t = Arc::new(BoxTable::new(Arc::new(plan)));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|thread| {
            let (t, barrier) = (Arc::clone(&t), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut ok = 0usize;
                // Every thread sends one message to every key, in different
                // orders, so creations race both on the same and on
                // different keys.
                for n in 0..KEYS {
                    let k = if thread % 2 == 0 { n } else { KEYS - 1 - n };
                    match t.apply(&format!("key-{k}"), &[i(1)], 0, None) {
                        Ok(_) => ok += 1,
                        Err(e) => assert_eq!(e, MessageError::TooManyBoxes),
                    }
                }
                ok
            })
        })
        .collect();
    let ok: usize = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    assert_eq!(t.len(), MAX);
    let mut seen = 0;
    t.for_each(0, |_, version, _, _| {
        // Once a key exists it keeps accepting: no spurious TooManyBoxes.
        assert_eq!(version, 4);
        seen += 1;
    });
    assert_eq!(seen, MAX);
    assert_eq!(ok, MAX * 4);
}

#[test]
fn concurrent_polls_never_see_a_torn_payload() {
    let t = Arc::new(table_with(vec![
        field("v", FieldType::I64, Reduce::Last),
        field("sum", FieldType::I64, Reduce::Sum),
        field("n", FieldType::I64, Reduce::Count),
        field("s", FieldType::Str, Reduce::Last),
    ]));
    const PER_WRITER: i64 = 3000;
    t.apply("hot", &[i(0), i(0), None, Some(Value::Str(""))], 0, None)
        .expect("ok");
    let writers: Vec<_> = (0..2)
        .map(|_| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for n in 1..=PER_WRITER {
                    // The string's length varies so records get reallocated.
                    let s = "x".repeat((n % 17) as usize);
                    t.apply("hot", &[i(n), i(1), None, Some(Value::Str(&s))], 0, None)
                        .expect("ok");
                }
            })
        })
        .collect();
    let pollers: Vec<_> = (0..2)
        .map(|_| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let mut last = 0;
                let mut out = Vec::with_capacity(256);
                while last < 1 + 2 * PER_WRITER as u64 {
                    out.clear();
                    let version = t.poll(b"hot", &mut out).expect("exists");
                    let v: serde_json::Value = serde_json::from_slice(&out).expect("whole JSON");
                    assert_eq!(v["ver"], version);
                    // sum counts the messages after the first, n all of them.
                    assert_eq!(v["n"], version);
                    assert_eq!(v["sum"], version - 1);
                    // `v` and `s` come from one message.
                    let n = v["v"].as_u64().expect("v");
                    let s = v["s"].as_str().expect("s");
                    assert_eq!(s.len() as u64, n % 17, "{v}");
                    assert!(version >= last, "versions go forward");
                    last = version;
                }
            })
        })
        .collect();
    for h in writers.into_iter().chain(pollers) {
        h.join().expect("thread");
    }
    assert_eq!(t.version(b"hot"), Some(1 + 2 * PER_WRITER as u64));
}

/// Whether the record of `key` holds its payload rendered.
fn is_rendered(t: &BoxTable, key: &str) -> bool {
    let hash = t.hasher.hash_one(key.as_bytes());
    let guard = epoch::pin();
    t.find(t.shard(hash), hash, &guard, |p| {
        read_slot(p.slot, &guard, key.as_bytes(), None)?;
        let mut image = Vec::new();
        loop {
            let r = p.slot.begin(&guard);
            r.load(&mut image);
            if r.valid() {
                return Some(record::rendered(&image));
            }
        }
    })
    .expect("box exists")
}

#[test]
fn payloads_are_rendered_by_the_first_poll_and_kept() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let by = Some(Value::Str("p\"1"));
    apply(&t, "a", &[i(7), i(7), None, by]).expect("ok");
    assert!(
        !is_rendered(&t, "a"),
        "an apply without `out` renders nothing"
    );
    // The version needs no payload.
    assert_eq!(t.version(b"a"), Some(1));
    assert!(!is_rendered(&t, "a"));
    let first = r#"{"k":"a","ver":1,"v":7,"sum":7,"n":1,"by":"p\"1"}"#;
    let mut out = b"x".to_vec();
    assert_eq!(t.poll(b"a", &mut out), Some(1));
    assert_eq!(out, [b"x".as_slice(), first.as_bytes()].concat());
    assert!(
        is_rendered(&t, "a"),
        "the first poll keeps what it rendered"
    );
    assert_eq!(payload(&t, "a"), first);
    // Updates that no poll sees are never rendered; the next poll renders
    // the newest.
    for v in 0..50 {
        apply(&t, "a", &[i(v), i(1), None, None]).expect("ok");
        assert!(!is_rendered(&t, "a"));
    }
    let want = r#"{"k":"a","ver":51,"v":49,"sum":57,"n":51,"by":"p\"1"}"#;
    assert_eq!(payload(&t, "a"), want);
    assert!(is_rendered(&t, "a"));
    // An apply with `out` renders at once, and the record keeps it.
    let mut out = Vec::new();
    t.apply("a", &[i(1), i(1), None, None], 0, Some(&mut out))
        .expect("ok");
    let want = r#"{"k":"a","ver":52,"v":1,"sum":58,"n":52,"by":"p\"1"}"#;
    assert_eq!(out, want.as_bytes());
    assert!(is_rendered(&t, "a"));
    assert_eq!(payload(&t, "a"), want);
    // A new box, created without `out`, renders on its first poll too.
    apply(&t, "b", &[]).expect("ok");
    assert!(!is_rendered(&t, "b"));
    assert_eq!(payload(&t, "b"), r#"{"k":"b","ver":1,"n":1}"#);
    // Snapshots read the state, rendered or not.
    apply(&t, "b", &[i(3)]).expect("ok");
    let mut seen = Vec::new();
    t.for_each(0, |k, v, _, s| seen.push((k.to_string(), v, s.to_vec())));
    seen.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(seen[1].1, 2);
    assert_eq!(seen[1].2[0], FieldState::I64(3));
    assert_eq!(seen[0].1, 52);
}

/// A key is read from its payload (`{"k":"` key), and kept apart only when
/// JSON escapes it: both kinds go through every path a record takes.
#[test]
fn keys_read_from_their_payload_or_kept_apart_take_every_path() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let names = [
        "a",
        "abcdefgh",
        "quo\"te",
        "back\\slash",
        "tab\there",
        "ünï-cödé",
    ];
    for (n, key) in names.iter().enumerate() {
        let by = Some(Value::Str("p-1"));
        // Created without rendering, grown and shrunk past size classes
        // unrendered, then rendered by a poll, then updated rendered.
        apply(&t, key, &[i(7), i(7), None, by]).expect("ok");
        assert!(!is_rendered(&t, key));
        assert_eq!(t.version(key.as_bytes()), Some(1), "{key}");
        for v in [1i64 << 40, 3, 1 << 60, 9] {
            apply(&t, key, &[i(v), i(0), None, None]).expect("ok");
        }
        let mut quoted = Vec::new();
        crate::render::write_json_str(key, &mut quoted);
        let quoted = String::from_utf8(quoted).expect("UTF-8");
        let want = format!(r#"{{"k":{quoted},"ver":5,"v":9,"sum":7,"n":5,"by":"p-1"}}"#);
        assert_eq!(payload(&t, key), want);
        assert!(is_rendered(&t, key));
        let mut out = Vec::new();
        t.apply(key, &[i(1 << 50), i(1), None, None], 0, Some(&mut out))
            .expect("ok");
        let want = format!(
            r#"{{"k":{quoted},"ver":6,"v":{},"sum":8,"n":6,"by":"p-1"}}"#,
            1i64 << 50
        );
        assert_eq!(String::from_utf8(out).expect("UTF-8"), want);
        assert_eq!(payload(&t, key), want);
        assert_eq!(keys(&t).len(), n + 1);
    }
    let mut seen = Vec::new();
    t.for_each(0, |k, v, _, s| seen.push((k.to_string(), v, s.len())));
    seen.sort();
    let mut want: Vec<_> = names.iter().map(|k| (k.to_string(), 6, 4)).collect();
    want.sort();
    assert_eq!(seen, want);
    check_consistent(&t);
    for key in names {
        assert!(t.remove(key.as_bytes()).is_some(), "{key}");
        assert_eq!(t.version(key.as_bytes()), None);
    }
    assert!(keys(&t).is_empty());
}

#[test]
fn a_lazy_payload_over_the_limit_is_refused_like_a_rendered_one() {
    let mut plan = Plan::default_plan();
    // {"k":"a","ver":2,"n":2,"by":"0123456789"} is 41 bytes.
    plan.max_payload_bytes = 41;
    let t = BoxTable::new(Arc::new(plan));
    apply(&t, "a", &[]).expect("ok");
    let ten = Some(Value::Str("0123456789"));
    let eleven = Some(Value::Str("0123456789a"));
    assert_eq!(
        apply(&t, "a", &[None, None, None, eleven]),
        Err(MessageError::PayloadTooLarge)
    );
    assert_eq!(apply(&t, "a", &[None, None, None, ten]), Ok(2));
    assert_eq!(payload(&t, "a").len(), 41);
}

/// Writers update boxes (lazily and with `out`, growing and shrinking
/// records), pollers poll them and check every payload against the one
/// rendered from the version it came with: each writer's message `n` to a
/// box sets `v` to `n` and `s` to `n % 17` characters, so a payload is
/// whole exactly when its `s` fits its `v` and its `n` its version.
#[test]
fn polls_see_exactly_the_payload_of_the_version_they_report() {
    let t = Arc::new(table_with(vec![
        field("v", FieldType::I64, Reduce::Last),
        field("n", FieldType::I64, Reduce::Count),
        field("s", FieldType::Str, Reduce::Last),
    ]));
    const KEYS: [&str; 3] = ["a", "b", "c"];
    const PER_WRITER: i64 = 4000;
    for key in KEYS {
        apply(&t, key, &[i(0), None, Some(Value::Str(""))]).expect("ok");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for n in 1..=PER_WRITER {
                    let s = "y".repeat((n % 17) as usize);
                    let key = KEYS[(n as usize + w) % KEYS.len()];
                    let values = [i(n), None, Some(Value::Str(&s))];
                    out.clear();
                    let eager = (n + w as i64) % 5 == 0;
                    let version = t
                        .apply(key, &values, 0, eager.then_some(&mut out))
                        .expect("ok");
                    if eager {
                        let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
                        assert_eq!(v["ver"], version);
                        assert_eq!(v["v"], n);
                    }
                }
            })
        })
        .collect();
    let pollers: Vec<_> = (0..2)
        .map(|p| {
            let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut out = Vec::with_capacity(256);
                let mut last = [0u64; 3];
                let mut polls = 0u64;
                // Until the writers are done, and at least once (on a
                // busy machine they may finish before this thread runs).
                while !stop.load(Ordering::Relaxed) || polls == 0 {
                    for (k, key) in KEYS.iter().enumerate() {
                        out.clear();
                        let version = t.poll(key.as_bytes(), &mut out).expect("exists");
                        let v: serde_json::Value =
                            serde_json::from_slice(&out).expect("whole JSON");
                        assert_eq!(v["k"], *key);
                        assert_eq!(v["ver"], version);
                        assert_eq!(v["n"], version);
                        let n = v["v"].as_u64().expect("v");
                        assert_eq!(v["s"].as_str().expect("s").len() as u64, n % 17);
                        assert!(version >= last[k], "versions go forward");
                        last[k] = version;
                        if p == 0 {
                            let now = t.version(key.as_bytes()).expect("exists");
                            assert!(now >= version);
                        }
                        polls += 1;
                    }
                }
                polls
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    stop.store(true, Ordering::Relaxed);
    for p in pollers {
        assert!(p.join().expect("poller") > 0);
    }
    let total: u64 = KEYS
        .iter()
        .map(|k| t.version(k.as_bytes()).expect("k"))
        .sum();
    assert_eq!(total, 3 + 2 * PER_WRITER as u64, "no update was lost");
    check_consistent(&t);
}

#[test]
fn for_each_and_restore_round_trip() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    for k in 0..300 {
        let by = format!("p-{k}");
        for v in 0..(k % 4 + 1) {
            apply(
                &t,
                &format!("box-{k}"),
                &[i(v), i(v), None, Some(Value::Str(&by))],
            )
            .expect("ok");
        }
    }
    apply(&t, "sparse", &[]).expect("ok");
    let mut dump = Vec::new();
    t.for_each(0, |k, v, _, s| dump.push((k.to_string(), v, s.to_vec())));
    assert_eq!(dump.len(), 301);
    // The same hash seed, so the same shards fill to the same sizes and
    // the restored table accounts exactly the bytes of the original
    // (another seed would spread the keys differently, and the shards'
    // maps would grow at other points).
    let copy = BoxTable::with_hasher_of(Arc::new(Plan::default_plan()), &t);
    for (k, v, s) in &dump {
        copy.restore(k, *v, 0, s, 0).expect("restores");
    }
    assert_eq!(copy.len(), t.len());
    assert_eq!(copy.accounted_bytes(), t.accounted_bytes());
    for (k, v, _) in &dump {
        assert_eq!(payload(&copy, k), payload(&t, k));
        assert_eq!(copy.version(k.as_bytes()), Some(*v));
    }
    let sparse = dump.iter().find(|d| d.0 == "sparse").expect("present");
    assert_eq!(
        sparse.2,
        [
            FieldState::Unset,
            FieldState::Unset,
            FieldState::Count(1),
            FieldState::Unset
        ]
    );
    // And it keeps reducing from the restored state.
    assert_eq!(
        copy.apply("box-3", &[i(1), i(1), None, None], 0, None),
        Ok(5)
    );
    assert_eq!(
        payload(&copy, "box-3"),
        r#"{"k":"box-3","ver":5,"v":1,"sum":7,"n":5,"by":"p-3"}"#
    );
}

#[test]
fn restore_refuses_what_does_not_fit() {
    let mut plan = Plan::default_plan();
    plan.max_boxes = 1;
    let t = BoxTable::new(Arc::new(plan));
    let ok = [
        FieldState::I64(1),
        FieldState::I64(1),
        FieldState::Count(1),
        FieldState::Unset,
    ];
    assert_eq!(t.restore("", 1, 0, &ok, 0), Err(RestoreError::EmptyKey));
    assert_eq!(
        t.restore(&"x".repeat(129), 1, 0, &ok, 0),
        Err(RestoreError::KeyTooLong { max: 128 })
    );
    assert_eq!(t.restore("a", 0, 0, &ok, 0), Err(RestoreError::ZeroVersion));
    assert_eq!(
        t.restore("a", 1, 0, &ok[..3], 0),
        Err(RestoreError::FieldCount {
            expected: 4,
            found: 3
        })
    );
    let mut bad = ok.clone();
    bad[2] = FieldState::I64(1);
    assert_eq!(
        t.restore("a", 1, 0, &bad, 0),
        Err(RestoreError::WrongType { field: "n".into() })
    );
    bad[2] = FieldState::Count(1);
    bad[3] = FieldState::Str("x".repeat(300).into());
    assert_eq!(
        t.restore("a", 1, 0, &bad, 0),
        Err(RestoreError::PayloadTooLarge { max: 256 })
    );
    t.restore("a", 7, 0, &ok, 0).expect("ok");
    assert_eq!(t.restore("a", 7, 0, &ok, 0), Err(RestoreError::Duplicate));
    assert_eq!(
        t.restore("b", 7, 0, &ok, 0),
        Err(RestoreError::TooManyBoxes { max: 1 })
    );
    assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":7,"v":1,"sum":1,"n":1}"#);
}

#[test]
fn polls_stay_right_while_boxes_are_created_and_indexes_grow() {
    let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
    for k in 0..100 {
        apply(&t, &format!("old-{k}"), &[i(k)]).expect("ok");
    }
    let creator = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for k in 0..20_000 {
                apply(&t, &format!("new-{k}"), &[i(k)]).expect("ok");
            }
        })
    };
    let mut out = Vec::with_capacity(256);
    for round in 0..20_000usize {
        for key in [format!("old-{}", round % 100), format!("new-{round}")] {
            out.clear();
            if let Some(version) = t.poll(key.as_bytes(), &mut out) {
                let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
                assert_eq!(v["k"], key.as_str());
                assert_eq!(version, 1);
            } else {
                assert!(key.starts_with("new"), "{key} vanished");
            }
        }
    }
    creator.join().expect("creator");
    assert_eq!(t.len(), 20_100);
    for k in 0..20_000 {
        assert_eq!(t.version(format!("new-{k}").as_bytes()), Some(1));
    }
}

/// The lock-free lookup under churn: two threads poll boxes that always
/// exist while one thread updates them (their strings' lengths vary, so
/// records move between size classes) and another creates and removes
/// other boxes by the thousand (removals move boxes between slots, shift
/// index entries, retire chunks and shrink or drop maps; creations grow
/// them). A poll must never miss a box that exists, never see a torn or
/// foreign payload, never see a version go back; everything a reader
/// might hold is retired through the collector meanwhile (a use after
/// free reads garbage here, or crashes). Run in release too (`cargo test
/// --release`), where the races are tighter.
#[test]
fn polls_never_miss_a_box_while_others_are_created_and_removed() {
    const STABLE: usize = 100;
    const CHURN: usize = 3000;
    const ROUNDS: usize = 6;
    let mut t = table_with(vec![
        field("v", FieldType::I64, Reduce::Last),
        field("s", FieldType::Str, Reduce::Last),
    ]);
    Arc::get_mut(&mut t.plan).expect("plan").max_boxes = STABLE + CHURN;
    let t = Arc::new(t);
    let stable: Arc<Vec<String>> = Arc::new((0..STABLE).map(|k| format!("stable-{k}")).collect());
    for key in stable.iter() {
        t.apply(key, &[i(0), Some(Value::Str(""))], 0, None)
            .expect("ok");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churner = {
        let t = Arc::clone(&t);
        std::thread::spawn(move || {
            for round in 0..ROUNDS {
                for k in 0..CHURN {
                    apply(&t, &format!("churn-{k}"), &[i(k as i64)]).expect("ok");
                }
                // Remove in an order unlike the creation's, so holes open
                // everywhere and boxes move from the ends into them.
                for k in (0..CHURN).map(|k| (k * 7 + round) % CHURN) {
                    assert!(
                        t.remove(format!("churn-{k}").as_bytes()).is_some(),
                        "churn-{k}"
                    );
                }
            }
        })
    };
    let updater = {
        let (t, stable, stop) = (Arc::clone(&t), Arc::clone(&stable), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let key = &stable[n as usize % STABLE];
                let s = "x".repeat((n % 17) as usize);
                let rendered = n % 3 == 0;
                let mut out = Vec::new();
                t.apply(
                    key,
                    &[i(n), Some(Value::Str(&s))],
                    0,
                    rendered.then_some(&mut out),
                )
                .expect("ok");
            }
        })
    };
    let pollers: Vec<_> = (0..2)
        .map(|p| {
            let (t, stable, stop) = (Arc::clone(&t), Arc::clone(&stable), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut last = vec![0u64; STABLE];
                let mut out = Vec::with_capacity(256);
                let mut polls = 0u64;
                // Until the writers are done, and at least once (on a
                // busy machine they may finish before this thread runs).
                while !stop.load(Ordering::Relaxed) || polls == 0 {
                    for (k, key) in stable.iter().enumerate().skip(p) {
                        out.clear();
                        let version = t
                            .poll(key.as_bytes(), &mut out)
                            .unwrap_or_else(|| panic!("{key} missed"));
                        let v: serde_json::Value =
                            serde_json::from_slice(&out).expect("whole JSON");
                        assert_eq!(v["k"], key.as_str());
                        assert_eq!(v["ver"], version);
                        let n = v["v"].as_i64().expect("v");
                        assert_eq!(v["s"].as_str().expect("s").len() as i64, n % 17, "{v}");
                        assert!(version >= last[k], "{key} went back");
                        last[k] = version;
                        assert!(t.version(key.as_bytes()).is_some_and(|w| w >= version));
                        polls += 1;
                    }
                    // Keys that do not exist are never found.
                    assert!(t.poll(b"never", &mut out).is_none());
                }
                polls
            })
        })
        .collect();
    churner.join().expect("churner");
    stop.store(true, Ordering::Relaxed);
    updater.join().expect("updater");
    for p in pollers {
        assert!(p.join().expect("poller") > 0);
    }
    assert_eq!(t.len(), STABLE);
    check_consistent(&t);
}

#[test]
fn boxes_sharing_a_hash_are_told_apart_by_key() {
    // Force two keys onto one hash (so one fingerprint, one probe chain).
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let hash = 0x1234_5678_9abc_def0;
    let shard = t.shard(hash);
    let guard = epoch::pin();
    for (key, version) in [("first", 3), ("second", 5)] {
        let words = new_words(
            &mut Vec::new(),
            version,
            key,
            false,
            &[],
            Payload::Rendered(b"{}"),
        );
        let _writer = shard.lock();
        t.insert(shard, hash, words, (0, 0), NEVER, &guard);
    }
    let find = |key: &[u8], out: Option<&mut Vec<u8>>| {
        let mut out = out;
        t.find(shard, hash, &guard, |p| {
            read_slot(p.slot, &guard, key, out.as_deref_mut()).map(|s| (p.n, s))
        })
    };
    assert_eq!(find(b"first", None), Some((0, SlotRead::At(3))));
    assert_eq!(find(b"second", None), Some((1, SlotRead::At(5))));
    assert!(find(b"third", None).is_none());
    assert!(find(b"firs", None).is_none());
    let mut out = Vec::new();
    assert_eq!(find(b"second", Some(&mut out)), Some((1, SlotRead::At(5))));
    assert_eq!(out, b"{}");
    // Removing the first moves the second into its slot; still found.
    assert_eq!(
        t.remove_slot(shard, 0, None, None, &guard)
            .map(|r| record::version(&r)),
        Some(3)
    );
    assert_eq!(find(b"second", None), Some((0, SlotRead::At(5))));
    assert!(find(b"first", None).is_none());
}

#[test]
fn accounting_follows_inserts_and_reallocations() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let empty = t.accounted_bytes();
    assert_eq!(empty, size_class(SHARDS * std::mem::size_of::<Shard>()));
    apply(&t, "a", &[i(1), i(1), None, None]).expect("ok");
    let one = t.accounted_bytes();
    // A chunk of slots, a record of at least header + key + payload, an index.
    assert!(one - empty >= 2048 + 16 + 1 + 23 + 16, "{}", one - empty);
    apply(&t, "a", &[i(2), i(2), None, None]).expect("ok");
    assert_eq!(t.accounted_bytes(), one, "same size class: no change");
    let long = Some(Value::Str("0123456789abcdef"));
    apply(&t, "a", &[None, None, None, long]).expect("ok");
    assert!(t.accounted_bytes() > one, "a longer record is accounted");
}

fn ttl_table(ttl_s: u32) -> BoxTable {
    let mut plan = Plan::default_plan();
    plan.ttl_s = ttl_s;
    BoxTable::new(Arc::new(plan))
}

fn keys(t: &BoxTable) -> Vec<String> {
    let mut k = Vec::new();
    t.for_each(0, |key, _, _, _| k.push(key.to_string()));
    k.sort();
    k
}

/// Every index entry names a used slot holding a key that hashes to it
/// and sits where a probe for it finds it, every used slot is named
/// once, slots past the end are empty, and the count and bytes agree.
fn check_consistent(t: &BoxTable) {
    let mut total = 0;
    let guard = epoch::pin();
    for shard in t.shards.iter() {
        let _writer = shard.lock();
        let len = shard.write.len.load(Ordering::Relaxed);
        total += len;
        let Some(map) = shard.map(&guard) else {
            assert_eq!(len, 0, "a shard with boxes has a map");
            assert_eq!(shard.write.bytes.load(Ordering::Relaxed), 0);
            continue;
        };
        assert!(len * 4 <= map.entries.len() * 3, "index at most 3/4 full");
        let chunks = map.chunk_ptrs().count();
        assert_eq!(chunks, len.div_ceil(CHUNK), "chunks in use");
        for c in 0..chunks {
            assert!(
                !map.chunks[c].load(Ordering::Relaxed).is_null(),
                "chunks are dense"
            );
        }
        let mut seen = vec![false; len];
        let mut entries = 0;
        for e in map.entries.iter() {
            let e = e.load(Ordering::Relaxed);
            if e == 0 {
                continue;
            }
            entries += 1;
            let n = (e as u32 - 1) as usize;
            assert!(n < len, "entry names slot {n} of {len}");
            assert!(!std::mem::replace(&mut seen[n], true), "slot {n} twice");
            let place = map.place(n, &guard).expect("slot");
            let mut image = Vec::new();
            place.slot.begin(&guard).load(&mut image);
            let key = record::key(&image).to_vec();
            let hash = t.hasher.hash_one(&key);
            assert_eq!(t.shard(hash) as *const Shard, shard as *const Shard);
            assert_eq!((e >> 32) as u32, fingerprint(hash));
            let m = t
                .find(shard, hash, &guard, |p| {
                    read_slot(p.slot, &guard, &key, None).map(|_| p.n)
                })
                .expect("found by key");
            assert_eq!(m, n);
        }
        assert_eq!(entries, len);
        let mut records = 0;
        for n in 0..chunks * CHUNK {
            let r = map.place(n, &guard).expect("slot").slot.begin(&guard);
            assert_eq!(r.is_empty(), n >= len, "slot {n} of {len}");
            records += r.bytes();
        }
        assert_eq!(
            shard.write.bytes.load(Ordering::Relaxed),
            map.bytes() + chunks * chunk_bytes() + records,
            "accounted bytes of a shard"
        );
    }
    assert_eq!(total, t.len());
}

#[test]
fn remove_takes_the_box_out_and_keeps_the_others_findable() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    let empty = t.accounted_bytes();
    for k in 0..2000 {
        apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
    }
    check_consistent(&t);
    assert_eq!(t.remove(b"nope"), None);
    // Remove in an order unrelated to slot order: every removal moves some
    // shard's last box into the hole.
    for k in (0..2000).filter(|k| k % 3 != 0) {
        assert_eq!(t.remove(format!("k{k}").as_bytes()), Some(1), "k{k}");
        assert_eq!(t.remove(format!("k{k}").as_bytes()), None);
    }
    check_consistent(&t);
    assert_eq!(t.len(), 667);
    for k in 0..2000 {
        let key = format!("k{k}");
        let v = t.version(key.as_bytes());
        if k % 3 == 0 {
            assert_eq!(v, Some(1), "{key}");
            assert!(payload(&t, &key).contains(&format!(r#""v":{k}"#)));
        } else {
            assert_eq!(v, None, "{key}");
        }
    }
    for k in (0..2000).filter(|k| k % 3 == 0) {
        t.remove(format!("k{k}").as_bytes()).expect("present");
    }
    check_consistent(&t);
    assert!(t.is_empty());
    assert_eq!(t.accounted_bytes(), empty, "every byte goes back");
    assert_eq!(t.version_floor(), 1);
}

#[test]
fn a_key_created_again_starts_past_every_version_it_served() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    for _ in 0..3 {
        apply(&t, "a", &[i(1)]).expect("ok");
    }
    assert_eq!(t.remove(b"a"), Some(3));
    assert_eq!(apply(&t, "a", &[i(5)]), Ok(4));
    assert_eq!(apply(&t, "a", &[i(5)]), Ok(5));
    assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":5,"v":5,"n":2}"#);
    assert_eq!(t.remove(b"a"), Some(5));
    assert_eq!(apply(&t, "a", &[]), Ok(6));
    // Boxes never removed keep starting at 1 unless they share the shard.
    let other = (0..)
        .map(|k| format!("o{k}"))
        .find(|k| {
            !std::ptr::eq(
                t.shard(t.hasher.hash_one(k.as_bytes())),
                t.shard(t.hasher.hash_one(b"a")),
            )
        })
        .expect("a key in another shard");
    assert_eq!(apply(&t, &other, &[]), Ok(1));
    assert_eq!(t.version_floor(), 5);
}

static CLOCK: AtomicU64 = AtomicU64::new(0);

fn test_clock() -> u64 {
    CLOCK.load(Ordering::Relaxed)
}

#[test]
fn new_boxes_start_past_the_version_clock_and_updates_count_on_from_there() {
    CLOCK.store(1_000, Ordering::Relaxed);
    let t = BoxTable::with_version_clock(Arc::new(Plan::default_plan()), test_clock);
    assert_eq!(t.version_clock(), 1_000);
    assert_eq!(apply(&t, "a", &[i(1)]), Ok(1_001));
    assert_eq!(apply(&t, "a", &[i(2)]), Ok(1_002));
    assert_eq!(payload(&t, "a"), r#"{"k":"a","ver":1002,"v":2,"n":2}"#);
    // An existing box is not moved by the clock; a new incarnation is.
    CLOCK.store(5_000, Ordering::Relaxed);
    assert_eq!(apply(&t, "a", &[i(3)]), Ok(1_003));
    assert_eq!(t.remove(b"a"), Some(1_003));
    assert_eq!(apply(&t, "a", &[i(4)]), Ok(5_001));
    // The removed box's floor wins over a clock that went back.
    CLOCK.store(10, Ordering::Relaxed);
    for _ in 0..5 {
        apply(&t, "a", &[i(5)]).expect("ok");
    }
    assert_eq!(t.remove(b"a"), Some(5_006));
    assert_eq!(apply(&t, "a", &[]), Ok(5_007));
    // A logged message keeps its record's version whatever the clock.
    assert_eq!(
        t.apply_logged("b", &[], (7, 0), 0, None),
        Ok(Logged::Applied(7))
    );
}

#[test]
fn a_raised_floor_applies_to_every_shard() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    t.raise_version_floor(41);
    t.raise_version_floor(7);
    assert_eq!(t.version_floor(), 41);
    for k in 0..50 {
        assert_eq!(apply(&t, &format!("k{k}"), &[]), Ok(42));
    }
}

#[test]
fn boxes_expire_in_the_order_of_their_last_message() {
    let t = ttl_table(10);
    // Last messages at seconds 0, 1, 2, ... 9 (a message moves a box on).
    for k in 0..10u64 {
        t.apply(&format!("k{k}"), &[i(1)], 0, None).expect("ok");
    }
    for k in 0..10u64 {
        t.apply(&format!("k{k}"), &[i(2)], k * 1000 + 999, None)
            .expect("ok");
    }
    let mut gone = Vec::new();
    let mut out = Vec::new();
    for now_s in 0..25u64 {
        t.expire(now_s * 1000, SweepBudget::PER_TICK, &mut out);
        for r in out.drain(..) {
            assert_eq!(r.version(), 2);
            gone.push((String::from_utf8(r.key().to_vec()).unwrap(), now_s));
        }
    }
    // k at second k: due at k + 10 + 1, more than ttl_s after its message.
    let want: Vec<_> = (0..10u64).map(|k| (format!("k{k}"), k + 11)).collect();
    assert_eq!(gone, want);
    assert!(t.is_empty());
    check_consistent(&t);
}

#[test]
fn a_box_that_keeps_getting_messages_never_expires() {
    let t = ttl_table(2);
    let mut out = Vec::new();
    for now in (0..20_000u64).step_by(500) {
        t.apply("live", &[i(1)], now, None).expect("ok");
        if now == 0 {
            t.apply("idle", &[i(1)], now, None).expect("ok");
        }
        t.expire(now, SweepBudget::PER_TICK, &mut out);
    }
    let gone: Vec<_> = out.iter().map(|r| r.key().to_vec()).collect();
    assert_eq!(gone, [b"idle".to_vec()]);
    assert_eq!(keys(&t), ["live"]);
}

#[test]
fn each_expiry_step_is_bounded_and_the_memory_goes_back() {
    let t = ttl_table(1);
    let empty = t.accounted_bytes();
    let one_box = {
        apply(&t, "probe", &[]).expect("ok");
        t.accounted_bytes()
    };
    assert!(one_box > empty);
    for k in 0..20_000 {
        apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
    }
    let full = t.accounted_bytes();
    let budget = SweepBudget {
        scan: 1000,
        remove: 300,
    };
    let mut out = Vec::new();
    // Not due yet: steps read stamps and remove nothing.
    let s = t.expire(1_999, budget, &mut out);
    assert_eq!(s.removed, 0);
    assert!(s.scanned <= budget.scan && s.scanned > 0, "{s:?}");
    let mut steps = 0;
    while !t.is_empty() {
        let s = t.expire(2_000, budget, &mut out);
        assert!(s.scanned <= budget.scan, "{s:?}");
        assert!(s.removed <= budget.remove, "{s:?}");
        assert_eq!(out.len(), s.removed);
        out.clear();
        steps += 1;
        assert!(steps < 1000, "the sweep makes progress");
    }
    // At most `remove` per step: 20,001 boxes need at least 67 steps.
    assert!(steps >= 20_001 / 300, "{steps} steps");
    check_consistent(&t);
    assert_eq!(t.accounted_bytes(), empty, "from {full} back to {empty}");
    assert_eq!(t.version_floor(), 1);
}

#[test]
fn expiry_races_with_updates_polls_and_deletes() {
    let t = Arc::new(ttl_table(1));
    for k in 0..4000 {
        apply(&t, &format!("k{k}"), &[i(k)]).expect("ok");
    }
    let sweepers: Vec<_> = (0..2)
        .map(|_| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                let budget = SweepBudget {
                    scan: 500,
                    remove: 64,
                };
                let mut out = Vec::new();
                let mut removed = Vec::new();
                for _ in 0..2000 {
                    t.expire(5_000, budget, &mut out);
                    removed.extend(out.drain(..).map(|r| r.key().to_vec()));
                }
                removed
            })
        })
        .collect();
    // Meanwhile "live-*" boxes are created and updated at second 5: not due.
    let mut polled = Vec::with_capacity(256);
    for k in 0..2000 {
        let key = format!("live-{}", k % 100);
        t.apply(&key, &[i(k)], 5_000, None).expect("ok");
        polled.clear();
        assert!(t.poll(key.as_bytes(), &mut polled).is_some());
        if k % 7 == 0 {
            t.remove(format!("k{k}").as_bytes());
        }
    }
    let mut removed: Vec<Vec<u8>> = Vec::new();
    for h in sweepers {
        removed.extend(h.join().expect("sweeper"));
    }
    // A box moved into a slot the sweep had passed waits for the next
    // second's pass.
    let mut out = Vec::new();
    while t.expire(6_000, SweepBudget::PER_TICK, &mut out).removed > 0 {}
    removed.extend(out.drain(..).map(|r| r.key().to_vec()));
    removed.sort();
    let before = removed.len();
    removed.dedup();
    assert_eq!(removed.len(), before, "no box is removed twice");
    assert!(
        removed.iter().all(|k| k.starts_with(b"k")),
        "live boxes stay"
    );
    assert_eq!(t.len(), 100);
    check_consistent(&t);
}

#[test]
fn creation_after_a_concurrent_removal_starts_past_it() {
    // Many rounds of: one thread deletes and re-creates keys, another
    // creates them; every version a key serves is above all it served
    // before (a stale floor would hand out an old version again).
    let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deleter = {
        let (t, stop) = (Arc::clone(&t), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for k in 0..8 {
                    t.remove(format!("k{k}").as_bytes());
                }
            }
        })
    };
    let mut last = [0u64; 8];
    for round in 0..20_000 {
        let k = round % 8;
        let v = apply(&t, &format!("k{k}"), &[]).expect("ok");
        assert!(v > last[k], "k{k}: version {v} after {}", last[k]);
        last[k] = v;
    }
    stop.store(true, Ordering::Relaxed);
    deleter.join().expect("deleter");
}

#[test]
fn restored_boxes_keep_their_idle_time() {
    let t = ttl_table(10);
    t.apply("old", &[i(1)], 0, None).expect("ok");
    t.apply("new", &[i(1)], 8_000, None).expect("ok");
    let mut dump = Vec::new();
    t.for_each(9_500, |k, v, idle, s| {
        dump.push((k.to_string(), v, idle, s.to_vec()))
    });
    dump.sort_by(|a, b| a.0.cmp(&b.0));
    let idle: Vec<_> = dump.iter().map(|d| (d.0.as_str(), d.2)).collect();
    assert_eq!(idle, [("new", 1), ("old", 9)]);
    // A process that starts its clock at 0 again.
    let copy = ttl_table(10);
    for (k, v, idle, s) in &dump {
        copy.restore(k, *v, *idle, s, 0).expect("restores");
    }
    let mut out = Vec::new();
    copy.expire(1_999, SweepBudget::PER_TICK, &mut out);
    assert!(out.is_empty());
    copy.expire(2_000, SweepBudget::PER_TICK, &mut out);
    assert_eq!(out.iter().map(|r| r.key()).collect::<Vec<_>>(), [b"old"]);
    out.clear();
    copy.expire(10_000, SweepBudget::PER_TICK, &mut out);
    assert_eq!(out.iter().map(|r| r.key()).collect::<Vec<_>>(), [b"new"]);
    // Without a ttl the idle time is neither kept nor used.
    let never = BoxTable::new(Arc::new(Plan::default_plan()));
    never.restore("a", 1, 9, &dump[0].3, 0).expect("ok");
    never.for_each(1_000_000, |_, _, idle, _| assert_eq!(idle, 0));
}

#[test]
fn shard_sides_are_cache_lines_and_table_is_shareable() {
    fn shareable<T: Send + Sync>() {}
    shareable::<BoxTable>();
    assert_eq!(std::mem::size_of::<ReadSide>(), 64);
    assert_eq!(std::mem::size_of::<Shard>(), 128);
    // 102 slots of 16 bytes, 4 + 2 + 8 bytes beside each: 3,060 of 3 KiB.
    assert_eq!(std::mem::size_of::<Chunk>(), 3072);
    assert_eq!(chunk_bytes(), 3072);
    assert_eq!(std::mem::size_of::<Slot>(), 16);
}

fn default_table() -> BoxTable {
    BoxTable::new(Arc::new(Plan::default_plan()))
}

#[test]
fn logged_messages_take_the_version_of_their_record_and_replays_change_nothing() {
    let t = default_table();
    let msg = [i(5), i(5), None, None];
    assert_eq!(
        t.apply_logged("r", &msg, (11, 0), 0, None),
        Ok(Logged::Applied(11))
    );
    assert_eq!(
        t.apply_logged("r", &msg, (40, 0), 0, None),
        Ok(Logged::Applied(40))
    );
    // The same records again (a replay from older offsets): nothing moves.
    assert_eq!(
        t.apply_logged("r", &msg, (11, 0), 0, None),
        Ok(Logged::Replayed)
    );
    assert_eq!(
        t.apply_logged("r", &msg, (40, 0), 0, None),
        Ok(Logged::Replayed)
    );
    assert_eq!(
        payload(&t, "r"),
        r#"{"k":"r","ver":40,"v":5,"sum":10,"n":2}"#
    );
    let mut out = Vec::new();
    assert_eq!(
        t.apply_logged("r", &msg, (41, 0), 0, Some(&mut out)),
        Ok(Logged::Applied(41))
    );
    assert_eq!(out, br#"{"k":"r","ver":41,"v":5,"sum":15,"n":3}"#);
}

#[test]
fn a_tombstone_removes_only_an_older_box_and_the_key_comes_back_past_it() {
    let t = default_table();
    let msg = [i(1), i(1), None, None];
    t.apply_logged("d", &msg, (3, 0), 0, None).unwrap();
    // A tombstone from before the box's version (a replay): the box stays.
    assert_eq!(t.remove_logged(b"d", 2, 0), None);
    assert_eq!(t.remove_logged(b"d", 3, 0), None);
    assert_eq!(t.version(b"d"), Some(3));
    assert_eq!(t.remove_logged(b"d", 8, 0), Some(3));
    assert_eq!(t.version(b"d"), None);
    assert_eq!(t.remove_logged(b"d", 9, 0), None, "no such box");
    // Created again by a later record: a larger version than any before.
    assert_eq!(
        t.apply_logged("d", &msg, (12, 0), 0, None),
        Ok(Logged::Applied(12))
    );
    assert_eq!(
        payload(&t, "d"),
        r#"{"k":"d","ver":12,"v":1,"sum":1,"n":1}"#
    );
}

#[test]
fn a_rejected_logged_message_changes_nothing() {
    let t = default_table();
    t.apply_logged(
        "o",
        &[i(i64::MAX), i(i64::MAX), None, None],
        (1, 0),
        0,
        None,
    )
    .unwrap();
    assert_eq!(
        t.apply_logged("o", &[i(1), i(1), None, None], (2, 0), 0, None),
        Err(MessageError::SumOverflow { field: 1 })
    );
    assert_eq!(t.version(b"o"), Some(1));
}

#[test]
fn removed_keys_kept_for_the_next_delta_are_accounted_until_a_walk_takes_them() {
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    t.track_changes();
    for k in 0..500 {
        apply(&t, &format!("key-{k}"), &[i(k)]).expect("ok");
    }
    t.walk(0, Walk::All, |_| {}, |_, _, _, _| {});
    for k in 0..250 {
        t.remove(format!("key-{k}").as_bytes()).expect("present");
    }
    let with_lists = t.accounted_bytes();
    let mut seen = 0;
    t.walk(0, Walk::Changed, |_| seen += 1, |_, _, _, _| {});
    assert_eq!(seen, 250);
    // 250 keys of 5-7 bytes, each with its 2-byte length: over 1.7 KB, given
    // back when the walk takes the lists.
    let lists = with_lists - t.accounted_bytes();
    assert!(lists >= 250 * 7, "{lists} bytes for the removed keys");
    // Nothing removed since: a walk takes nothing, and nothing is given back.
    let now = t.accounted_bytes();
    t.walk(0, Walk::Changed, |_| seen += 1, |_, _, _, _| {});
    assert_eq!((seen, t.accounted_bytes()), (250, now));
}

#[test]
fn a_base_and_the_deltas_walked_beside_writers_add_up_to_the_table() {
    // Writers update, create and remove boxes (a removal moves the shard's
    // last slot into the hole) while deltas are walked; the base, then each
    // delta in order (removals, then boxes), must give the table as it ends,
    // after one last delta. A change a delta misses would show here.
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;
    let t = Arc::new(BoxTable::new(Arc::new(Plan::default_plan())));
    t.track_changes();
    for k in 0..2_000 {
        apply(&t, &format!("k-{k}"), &[i(k)]).expect("ok");
    }
    type Image = HashMap<String, (u64, Vec<FieldState>)>;
    let walk = |t: &BoxTable, kind: Walk, image: &mut Image| {
        let mut removed = Vec::new();
        let mut boxes = Vec::new();
        t.walk(
            0,
            kind,
            |key| removed.push(key.to_string()),
            |key, version, _, state| boxes.push((key.to_string(), version, state.to_vec())),
        );
        for k in removed {
            image.remove(&k);
        }
        for (k, v, s) in boxes {
            // A box read twice in one walk: the newer copy wins.
            let e = image.entry(k).or_insert((0, Vec::new()));
            if v >= e.0 {
                *e = (v, s);
            }
        }
    };
    let mut image = Image::new();
    walk(&t, Walk::All, &mut image);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = w + 1;
                while !stop.load(Ordering::Relaxed) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = (x >> 33) % 3_000;
                    let key = format!("k-{k}");
                    if (x >> 20) % 10 == 0 {
                        let _ = t.remove(key.as_bytes());
                    } else {
                        let _ = apply(&t, &key, &[i((x >> 40) as i64)]);
                    }
                }
            })
        })
        .collect();
    for _ in 0..200 {
        walk(&t, Walk::Changed, &mut image);
    }
    stop.store(true, Ordering::Relaxed);
    for h in writers {
        h.join().expect("writer");
    }
    walk(&t, Walk::Changed, &mut image);
    let mut now = Image::new();
    walk(&t, Walk::All, &mut now);
    assert_eq!(image.len(), now.len(), "boxes");
    for (k, v) in &now {
        assert_eq!(image.get(k), Some(v), "box {k}");
    }
}

#[test]
fn a_delta_takes_a_box_written_again_after_its_walk_began() {
    // Every box changes after the base (the next delta must hold that
    // state: its log position counts on it). While the delta's walk goes on
    // (its callback runs between batches, with no lock held), every box is
    // written again, so the boxes the walk reaches later carry the next
    // generation. They must be in this delta all the same: a delta that left
    // them out would leave their first change in no file.
    let t = BoxTable::new(Arc::new(Plan::default_plan()));
    t.track_changes();
    let keys: Vec<String> = (0..2_000).map(|k| format!("k-{k}")).collect();
    for k in &keys {
        apply(&t, k, &[i(1)]).expect("ok");
    }
    t.walk(0, Walk::All, |_| {}, |_, _, _, _| {});
    let first: Vec<u64> = keys
        .iter()
        .map(|k| apply(&t, k, &[i(2)]).expect("ok"))
        .collect();
    let mut seen = std::collections::HashMap::new();
    let mut again = true;
    t.walk(
        0,
        Walk::Changed,
        |_| {},
        |key, version, _, _| {
            if std::mem::take(&mut again) {
                for k in &keys {
                    apply(&t, k, &[i(3)]).expect("ok");
                }
            }
            seen.entry(key.to_string()).or_insert(version);
        },
    );
    for (k, v) in keys.iter().zip(&first) {
        let got = seen.get(k).copied();
        assert!(
            got.is_some_and(|g| g >= *v),
            "{k}: the delta holds {got:?}, its change was {v}"
        );
    }
}
