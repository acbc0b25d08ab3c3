//! The second cursor's tests (`ahead.rs`): the split skip answers as one
//! cursor does, and as `Scanner::skip`'s own loop does, valid or broken
//! anywhere.

use super::ahead::*;
use super::*;

/// The skip with one cursor: the reference.
fn one_cursor(buf: &[u8]) -> Result<usize, Fail> {
    let mut kinds = [false; 256];
    let mut a = Cursor {
        i: 0,
        level: 0,
        object: false,
    };
    while !step(buf, &mut a, &mut kinds, MAX_DEPTH, 0)? {}
    Ok(a.i)
}

/// `Scanner::skip` itself: the one-cursor loop that splits once past
/// [`WARM`] bytes, at a container's opening, where the hint says.
fn scanner_skip(doc: &[u8], hint: usize) -> (Result<usize, Fail>, usize) {
    let mut sc = Scanner::new(doc);
    sc.hint = hint;
    let got = sc.skip().map(|()| sc.pos);
    (got, sc.hint)
}

#[test]
fn the_skip_splits_large_containers_as_one_cursor() {
    let item = |k: usize| {
        format!(r#"{{"id":{k},"tags":["a,b",{{"c":[1,2]}}],"pos":{{"x":-1.5e3,"ok":null}}}}"#)
    };
    let items: Vec<String> = (0..80).map(item).collect();
    let big = [
        format!(r#"{{"items":[{}],"note":"x,\"y\":1"}}"#, items.join(",")),
        format!("[{}]", items.join(", ")),
    ];
    for doc in big.map(String::into_bytes) {
        let n = doc.len();
        assert!(n > WARM + 2 * MIN_SPLIT, "{n}");
        for hint in [0, n / 4, n / 2, n, 3 * n] {
            // Valid: the whole document, and the hint learns its size.
            assert_eq!(scanner_skip(&doc, hint), (Ok(n), n), "hint {hint}");
            // Broken anywhere: the same error as one cursor's.
            for at in (WARM..n).step_by(61) {
                for byte in [b'}', b',', b'"', b'x'] {
                    let mut bad = doc.clone();
                    bad[at] = byte;
                    assert_eq!(scanner_skip(&bad, hint).0, one_cursor(&bad), "{at} {byte}");
                }
                assert_eq!(scanner_skip(&doc[..at], hint).0, one_cursor(&doc[..at]));
            }
        }
    }
}

fn same_at(doc: &[u8], ws: &[usize], targets: impl Iterator<Item = usize> + Clone) {
    if !matches!(doc.first(), Some(b'{' | b'[')) {
        // `Scanner::skip` sends anything else to `value`.
        return;
    }
    let want = one_cursor(doc);
    // `Scanner::skip`'s own loop (`walk`) and `step` expand the same
    // grammar with different control flow: they answer alike.
    assert_eq!(
        scanner_skip(doc, 0).0,
        want,
        "{}",
        String::from_utf8_lossy(doc)
    );
    for &w in ws {
        for t in targets.clone() {
            assert_eq!(
                skip_split(doc, 0, w, t),
                want,
                "w {w}, target {t}: {}",
                String::from_utf8_lossy(doc)
            );
        }
    }
}

/// Documents where a speculating cursor can go wrong: commas and names
/// in strings, arrays of strings, every kind of container under every
/// other, whitespace around every token, escapes, non-ASCII.
fn docs() -> Vec<Vec<u8>> {
    let item = |k: usize| {
        format!(r#"{{"id":{k},"tags":["alpha","be,ta"],"pos":{{"x":1.5,"y":-2,"ok":true}}}}"#)
    };
    let items: Vec<String> = (0..8).map(item).collect();
    let mut docs = vec![
        format!(r#"{{"items":[{}],"note":"x,\"y\":1,{{"}}"#, items.join(",")),
        format!("[{}]", items.join(" , ")),
        r#"{"a":[[1,2],[3,{"b":[4,{"c":"d,e"}]}]],"f":{"g":{"h":{}}},"i":[],"j":[[],[[]],{}],"k":"\",\"l\":[","m":null}"#.to_string(),
        r#"[ "a" , "b" , {"c" : [ "d" , "e:" , { "f" : "g" } ] } , [ 1 , -2.5e3 , true , false , null ] ]"#.to_string(),
        "{\"\\u00e9t\\u00e9\":[\"\u{e9}t\u{e9},\",{\"\u{1F600}\":\"\\ud83d\\ude00,\"}],\"z\":[0,1,2,3,4,5,6,7,8,9]}".to_string(),
        format!("{{\n  \"a\": [\n    {}\n  ],\n  \"b\": {{ \"c\": \"d\" }}\n}}", items.join(",\n    ")),
    ];
    // Deep: near serde_json's limit, and past it.
    for depth in [60, 70, 126, 127, 128, 140] {
        let mut d = String::new();
        for k in 0..depth {
            d.push_str(if k % 2 == 0 { "[1," } else { "{\"a\":1,\"b\":" });
        }
        d.push('0');
        for k in (0..depth).rev() {
            d.push(if k % 2 == 0 { ']' } else { '}' });
        }
        docs.push(d);
    }
    docs.into_iter().map(String::into_bytes).collect()
}

#[test]
fn a_split_anywhere_validates_as_one_cursor() {
    for doc in docs() {
        same_at(&doc, &[1, 4], 0..doc.len() + 2);
    }
}

#[test]
fn a_split_anywhere_refuses_as_one_cursor() {
    for doc in docs() {
        // Each byte replaced by one that breaks the grammar or fools a
        // guess, or cut short.
        for at in (0..doc.len()).step_by(11) {
            for byte in [b'}', b']', b',', b'"', b':', b'x', b'['] {
                let mut bad = doc.clone();
                bad[at] = byte;
                same_at(&bad, &[1], (0..bad.len()).step_by(7));
            }
            same_at(&doc[..at], &[1], (0..at).step_by(5));
        }
    }
}

#[test]
fn the_second_cursor_is_used() {
    // Not a test of the result but of the path: on a long document the
    // speculation holds and `a` takes `b`'s cursor (so the tests above
    // exercise the join, not only the fallback).
    let doc = &docs()[0];
    let mut kinds = [false; 256];
    let mut a = Cursor {
        i: 0,
        level: 0,
        object: false,
    };
    for _ in 0..5 {
        assert!(!step(doc, &mut a, &mut kinds, MAX_DEPTH, 0).unwrap());
    }
    // `b` starts past the middle and runs to the end (it closes the
    // skipped value before `a` is half-way): the skip ends where `b`
    // closed it.
    let whole = a;
    assert_eq!(
        split(doc, &mut a, &mut kinds, MAX_DEPTH, doc.len() / 2),
        Ok(Some(doc.len()))
    );
    // Split early, `b` is overtaken while it is still going: `a` takes
    // its cursor, far past where `a` stopped.
    a = whole;
    let target = a.i + 60;
    assert_eq!(split(doc, &mut a, &mut kinds, MAX_DEPTH, target), Ok(None));
    assert!(a.i > target + 40, "{whole:?} -> {a:?}");
    while !step(doc, &mut a, &mut kinds, MAX_DEPTH, 0).unwrap() {}
    assert_eq!(a.i, doc.len());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn soups_split_anywhere_as_one_cursor(
            parts in proptest::collection::vec(
                prop::sample::select(vec![
                    "{", "}", "[", "]", ",", ":", " ", "\"k\"", "\"a,b\"", "\",\\\"k\\\":\"",
                    "1", "-0.5", "true", "null", "{\"k\":", ",\"k\":", "[1,2]", "\"x\"",
                ]),
                1..120,
            ),
            w in 0usize..6,
            t in 0usize..400,
        ) {
            // The skip starts at a bracket (`Scanner::skip` sends
            // anything else to `value`).
            let doc = ["[", &parts.concat()].concat().into_bytes();
            let t = t % (doc.len() + 1);
            prop_assert_eq!(skip_split(&doc, 0, w, t), one_cursor(&doc));
        }
    }
}
