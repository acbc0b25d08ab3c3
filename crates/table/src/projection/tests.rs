use super::*;
use crate::arena::Arena;
use crate::config::{BoxesConfig, FieldConfig, Reduce};

fn default_projector() -> Projector {
    Projector::new(Arc::new(Plan::default_plan()))
}

fn field(
    name: &str,
    path: Option<&str>,
    ty: Option<FieldType>,
    max_len: Option<usize>,
    reduce: Reduce,
) -> FieldConfig {
    FieldConfig {
        name: name.into(),
        path: path.map(Into::into),
        ty,
        max_len,
        reduce,
    }
}

/// f64 / bool / min / max / nested / escaped-pointer fields beside a count.
fn custom_projector() -> Projector {
    let cfg = BoxesConfig {
        key_field: "id".into(),
        max_key_bytes: 8,
        fields: vec![
            field("t", Some("/temp"), Some(FieldType::F64), None, Reduce::Last),
            field("lo", Some("/temp"), Some(FieldType::F64), None, Reduce::Min),
            field(
                "hi",
                Some("/reading/max"),
                Some(FieldType::I64),
                None,
                Reduce::Max,
            ),
            field(
                "ok",
                Some("/flags/ok"),
                Some(FieldType::Bool),
                None,
                Reduce::Last,
            ),
            field("n", None, None, None, Reduce::Count),
            field(
                "name",
                Some("/meta/who/name"),
                Some(FieldType::Str),
                Some(8),
                Reduce::Last,
            ),
            field(
                "slash",
                Some("/a~1b"),
                Some(FieldType::I64),
                None,
                Reduce::Last,
            ),
            field(
                "tilde",
                Some("/m~0n"),
                Some(FieldType::I64),
                None,
                Reduce::Last,
            ),
        ],
        ..BoxesConfig::default()
    };
    Projector::new(Arc::new(Plan::compile(&cfg).unwrap()))
}

/// Project a single-object JSON body with keys from the body.
fn one<'a>(p: &mut Projector, arena: &'a Bump, body: &str) -> Result<Message<'a>, MessageError> {
    let batch = p
        .project(arena, body.as_bytes(), BodyFormat::Json, KeySource::Body)
        .unwrap_or_else(|e| panic!("{body}: {e}"));
    assert_eq!(batch.shape, Shape::Object);
    assert_eq!(batch.items.len(), 1);
    batch.items[0]
}

/// The `/value` field (`v`) of a default-plan message `{"key":"k","value":<json>}`.
fn value_of<'a>(
    p: &mut Projector,
    arena: &'a Bump,
    json: &str,
) -> Result<Option<Value<'a>>, MessageError> {
    one(p, arena, &format!(r#"{{"key":"k","value":{json}}}"#)).map(|m| m.values[0])
}

/// The `/player` field (`by`, str ≤ 16 bytes).
fn player_of<'a>(
    p: &mut Projector,
    arena: &'a Bump,
    json: &str,
) -> Result<Option<Value<'a>>, MessageError> {
    one(p, arena, &format!(r#"{{"key":"k","player":{json}}}"#)).map(|m| m.values[3])
}

fn invalid(p: &mut Projector, body: &[u8], format: BodyFormat) -> (usize, &'static str) {
    let arena = Bump::new();
    let result = p.project(&arena, body, format, KeySource::Body);
    match result {
        Err(BodyError::InvalidJson { at, what }) => (at, what),
        other => panic!(
            "{:?}: expected invalid json, got {other:?}",
            String::from_utf8_lossy(body)
        ),
    }
}

#[test]
fn projector_moves_to_its_worker_thread() {
    fn send<T: Send>() {}
    send::<Projector>();
    let p = default_projector();
    assert_eq!(p.plan(), &Plan::default_plan());
    let handle = std::thread::spawn(move || {
        let mut p = p;
        let arena = Bump::new();
        one(&mut p, &arena, r#"{"key":"k"}"#).map(|m| m.key.len())
    });
    assert_eq!(handle.join().unwrap(), Ok(1));
}

#[test]
fn object_with_default_plan() {
    let mut p = default_projector();
    let arena = Bump::new();
    let m = one(
        &mut p,
        &arena,
        r#"{"key":"box-42","value":5,"player":"p-7"}"#,
    )
    .unwrap();
    assert_eq!(m.key, "box-42");
    assert_eq!(
        m.values,
        &[
            Some(Value::I64(5)),
            Some(Value::I64(5)),
            None,
            Some(Value::Str("p-7"))
        ]
    );
}

#[test]
fn absent_fields_are_none_and_count_is_always_none() {
    let mut p = default_projector();
    let arena = Bump::new();
    let m = one(&mut p, &arena, r#"{"key":"k","n":3,"v":4,"by":"x"}"#).unwrap();
    assert_eq!(m.values, &[None, None, None, None]);
}

#[test]
fn i64_accepts_integers_in_range_only() {
    let mut p = default_projector();
    let arena = Bump::new();
    for (json, want) in [
        ("0", 0),
        ("-0", 0),
        ("-1", -1),
        ("42", 42),
        ("9223372036854775807", i64::MAX),
        ("-9223372036854775808", i64::MIN),
    ] {
        assert_eq!(
            value_of(&mut p, &arena, json),
            Ok(Some(Value::I64(want))),
            "{json}"
        );
    }
    for json in [
        "5.0",
        "1e3",
        "-1.5",
        "9223372036854775808",
        "18446744073709551615",
        "\"5\"",
        "true",
        "false",
        "[]",
        "[1]",
        "{}",
        "{\"value\":1}",
    ] {
        assert_eq!(
            value_of(&mut p, &arena, json),
            Err(MessageError::WrongType { field: 0 }),
            "{json}"
        );
    }
    assert_eq!(value_of(&mut p, &arena, "null"), Ok(None));
}

#[test]
fn str_limit_counts_unescaped_bytes() {
    let mut p = default_projector();
    let arena = Bump::new();
    let ok = [
        (r#""""#, ""),
        (r#""p-7""#, "p-7"),
        (r#""0123456789abcdef""#, "0123456789abcdef"),
        (r#""éééééééé""#, "éééééééé"), // 16 bytes
        (r#""\u00e9\u00e9""#, "éé"),
        (r#""a\"b\\c\/d\n\t""#, "a\"b\\c/d\n\t"),
        (r#""\ud83d\ude00 ok""#, "😀 ok"),
        (r#""日本語""#, "日本語"),
    ];
    for (json, want) in ok {
        assert_eq!(
            player_of(&mut p, &arena, json),
            Ok(Some(Value::Str(want))),
            "{json}"
        );
    }
    for json in [
        r#""0123456789abcdefg""#,
        r#""ééééééééa""#,
        r#""\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9""#,
    ] {
        assert_eq!(
            player_of(&mut p, &arena, json),
            Err(MessageError::StringTooLong { field: 3 }),
            "{json}"
        );
    }
    for json in ["7", "1.5", "true", "[\"x\"]", "{\"a\":\"x\"}"] {
        assert_eq!(
            player_of(&mut p, &arena, json),
            Err(MessageError::WrongType { field: 3 }),
            "{json}"
        );
    }
    assert_eq!(player_of(&mut p, &arena, "null"), Ok(None));
}

#[test]
fn f64_bool_min_max_and_nested_fields() {
    let mut p = custom_projector();
    let arena = Bump::new();
    let m = one(
        &mut p,
        &arena,
        r#"{"id":"s-1","temp":21.5,"reading":{"max":30,"min":2},"flags":{"ok":true},
            "meta":{"who":{"name":"ann"},"x":[1,2]},"a/b":7,"m~n":8}"#,
    )
    .unwrap();
    assert_eq!(m.key, "s-1");
    assert_eq!(
        m.values,
        &[
            Some(Value::F64(21.5)),
            Some(Value::F64(21.5)),
            Some(Value::I64(30)),
            Some(Value::Bool(true)),
            None,
            Some(Value::Str("ann")),
            Some(Value::I64(7)),
            Some(Value::I64(8)),
        ]
    );

    // f64 takes any number, integers converted.
    for (json, want) in [
        ("3", 3.0),
        ("-3", -3.0),
        ("1e3", 1000.0),
        ("-0.25", -0.25),
        ("18446744073709551615", u64::MAX as f64),
        ("-9223372036854775808", i64::MIN as f64),
    ] {
        let m = one(&mut p, &arena, &format!(r#"{{"id":"s","temp":{json}}}"#)).unwrap();
        assert_eq!(m.values[0], Some(Value::F64(want)), "{json}");
        assert_eq!(m.values[1], Some(Value::F64(want)), "{json}");
    }
    for json in ["\"3\"", "true", "[]", "{}"] {
        let r = one(&mut p, &arena, &format!(r#"{{"id":"s","temp":{json}}}"#));
        assert_eq!(r, Err(MessageError::WrongType { field: 0 }), "{json}");
    }
    // bool takes only booleans.
    for (json, want) in [
        ("true", Some(Value::Bool(true))),
        ("false", Some(Value::Bool(false))),
        ("null", None),
    ] {
        let m = one(
            &mut p,
            &arena,
            &format!(r#"{{"id":"s","flags":{{"ok":{json}}}}}"#),
        )
        .unwrap();
        assert_eq!(m.values[3], want, "{json}");
    }
    for json in ["1", "0", "\"true\"", "[true]"] {
        let r = one(
            &mut p,
            &arena,
            &format!(r#"{{"id":"s","flags":{{"ok":{json}}}}}"#),
        );
        assert_eq!(r, Err(MessageError::WrongType { field: 3 }), "{json}");
    }
    // Nested str limit and nested i64 type.
    let r = one(
        &mut p,
        &arena,
        r#"{"id":"s","meta":{"who":{"name":"123456789"}}}"#,
    );
    assert_eq!(r, Err(MessageError::StringTooLong { field: 5 }));
    let r = one(&mut p, &arena, r#"{"id":"s","reading":{"max":1.5}}"#);
    assert_eq!(r, Err(MessageError::WrongType { field: 2 }));
    // The custom key member and its limit (8 bytes).
    assert_eq!(
        one(&mut p, &arena, r#"{"key":"s"}"#),
        Err(MessageError::MissingKey)
    );
    assert_eq!(
        one(&mut p, &arena, r#"{"id":"123456789"}"#),
        Err(MessageError::KeyTooLong)
    );
    assert!(one(&mut p, &arena, r#"{"id":"12345678"}"#).is_ok());
}

#[test]
fn nested_paths_follow_objects_only() {
    let mut p = custom_projector();
    let arena = Bump::new();
    let name = |p: &mut Projector, body: &str| one(p, &arena, body).map(|m| m.values[5]);
    assert_eq!(
        name(&mut p, r#"{"id":"s","meta":{"who":{"name":"x"}}}"#),
        Ok(Some(Value::Str("x")))
    );
    // An intermediate that is not an object: absent, not an error.
    for body in [
        r#"{"id":"s","meta":5}"#,
        r#"{"id":"s","meta":null}"#,
        r#"{"id":"s","meta":"who"}"#,
        r#"{"id":"s","meta":{"who":[{"name":"x"}]}}"#,
        r#"{"id":"s","meta":[{"who":{"name":"x"}}]}"#,
        r#"{"id":"s","meta":{"who":{}}}"#,
        r#"{"id":"s","meta":{"name":"x","who":{"nam":"y"}}}"#,
        r#"{"id":"s","who":{"name":"x"}}"#,
    ] {
        assert_eq!(name(&mut p, body), Ok(None), "{body}");
    }
    // Duplicates: the last member wins, also for intermediates.
    assert_eq!(
        name(
            &mut p,
            r#"{"id":"s","meta":{"who":{"name":"x"}},"meta":{"other":1}}"#
        ),
        Ok(None)
    );
    assert_eq!(
        name(
            &mut p,
            r#"{"id":"s","meta":{"other":1},"meta":{"who":{"name":"y"}}}"#
        ),
        Ok(Some(Value::Str("y")))
    );
    assert_eq!(
        name(
            &mut p,
            r#"{"id":"s","meta":{"who":{"name":"x","name":"z"}}}"#
        ),
        Ok(Some(Value::Str("z")))
    );
}

#[test]
fn duplicate_members_last_wins() {
    let mut p = default_projector();
    let arena = Bump::new();
    let m = one(
        &mut p,
        &arena,
        r#"{"key":"a","value":1,"player":"x","value":2,"key":"b"}"#,
    )
    .unwrap();
    assert_eq!(m.key, "b");
    assert_eq!(m.values[0], Some(Value::I64(2)));
    // A later null makes the field absent; a later bad value rejects.
    let m = one(&mut p, &arena, r#"{"key":"a","value":1,"value":null}"#).unwrap();
    assert_eq!(m.values[0], None);
    assert_eq!(
        one(&mut p, &arena, r#"{"key":"a","value":1,"value":"x"}"#),
        Err(MessageError::WrongType { field: 0 })
    );
}

#[test]
fn escaped_member_names_match() {
    let mut p = default_projector();
    let arena = Bump::new();
    let m = one(
        &mut p,
        &arena,
        r#"{"k\u0065y":"b\u00f6x","val\u0075e":7,"pl\u0061yer":"\u0070-1"}"#,
    )
    .unwrap();
    assert_eq!(m.key, "böx");
    assert_eq!(m.values[0], Some(Value::I64(7)));
    assert_eq!(m.values[3], Some(Value::Str("p-1")));
    // Near misses are cargo.
    let m = one(
        &mut p,
        &arena,
        r#"{"key":"k","Value":1,"value ":2,"valu":3,"values":4,"val\u0075":5}"#,
    )
    .unwrap();
    assert_eq!(m.values[0], None);
}

#[test]
fn cargo_of_every_kind_is_skipped() {
    let mut p = default_projector();
    let arena = Bump::new();
    let body = r#"{
        "cargo": {"value": 99, "key": "inner", "player": 5, "deep": {"value": [1, {"value": 2}]}},
        "list": [{"value": 98, "key": 1}, [[], [{}], [[["value"]]]], "value", 1.5e10, -0.0, true, false, null],
        "text": "\"value\":97, \"key\":\"x\" }",
        "num": 123456789012345678, "neg": -12, "f": 3.25e-5, "t": true, "fa": false, "nu": null,
        "empty_obj": {}, "empty_arr": [],
        "key": "real",
        "more": {"a": {"b": {"c": {"d": [1, [2, [3, {"value": "no"}]]]}}}},
        "value": 1,
        "tail": [{"player": "nope"}]
    }"#;
    let m = one(&mut p, &arena, body).unwrap();
    assert_eq!(m.key, "real");
    assert_eq!(
        m.values,
        &[Some(Value::I64(1)), Some(Value::I64(1)), None, None]
    );

    // Configured names inside cargo are never picked up.
    let m = one(
        &mut p,
        &arena,
        r#"{"key":"k","c":{"value":9,"player":"x"},"d":[{"value":8}]}"#,
    )
    .unwrap();
    assert_eq!(m.values, &[None, None, None, None]);
    assert_eq!(
        one(&mut p, &arena, r#"{"c":{"key":"inner"},"d":[{"key":"x"}]}"#),
        Err(MessageError::MissingKey)
    );
}

#[test]
fn short_strings_take_the_ascii_path() {
    // Keys and strings of every short length, ASCII or with a non-ASCII
    // character at each place: the same text comes back either way.
    let mut p = default_projector();
    let arena = Bump::new();
    for n in 1..=20 {
        let plain = "abcdefghijklmnopqrstuvwxyz"[..n].to_string();
        let mut texts = vec![plain.clone()];
        for i in 0..n {
            let mut t = plain.clone();
            t.replace_range(i..i + 1, "é");
            texts.push(t);
        }
        for text in texts {
            if text.len() > 16 {
                continue;
            }
            let body = format!(r#"{{"key":"{text}","player":"{text}"}}"#);
            let m = one(&mut p, &arena, &body).unwrap();
            assert_eq!(m.key, text);
            assert_eq!(m.values[3], Some(Value::Str(&text)));
        }
    }
    for n in 0..=20 {
        for high in (0..n).map(Some).chain([None]) {
            let mut b = vec![b'a'; n];
            if let Some(i) = high {
                b[i] = 0x80 | (i as u8);
            }
            assert_eq!(ascii(&b), b.is_ascii(), "{n} {high:?}");
        }
    }
}

#[test]
fn integers_parse_as_the_checked_parser_does() {
    let mut texts: Vec<String> = ["0", "-0", "5", "-5", "1234567", "-1234567"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for digits in 1..=21 {
        texts.push("9".repeat(digits));
        texts.push(format!("-{}", "9".repeat(digits)));
        texts.push(format!("1{}", "0".repeat(digits - 1)));
    }
    for n in [i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1] {
        texts.push(n.to_string());
    }
    texts.push("9223372036854775808".into());
    texts.push("-9223372036854775809".into());
    for t in &texts {
        assert_eq!(
            parse_int(t.as_bytes()),
            scan::parse_i64(t.as_bytes()),
            "{t}"
        );
    }
}

/// Two fields on one pointer: decoded once when they are of one type, each
/// its own way otherwise; errors name the first field.
#[test]
fn fields_sharing_a_pointer() {
    let cfg = BoxesConfig {
        fields: vec![
            field(
                "a",
                Some("/value"),
                Some(FieldType::I64),
                None,
                Reduce::Last,
            ),
            field(
                "b",
                Some("/value"),
                Some(FieldType::F64),
                None,
                Reduce::Last,
            ),
            field("c", Some("/value"), Some(FieldType::I64), None, Reduce::Sum),
            field("d", Some("/value"), Some(FieldType::F64), None, Reduce::Max),
            field("e", Some("/s"), Some(FieldType::Str), Some(8), Reduce::Last),
            field("f", Some("/s"), Some(FieldType::Str), Some(8), Reduce::Last),
        ],
        ..BoxesConfig::default()
    };
    let mut p = Projector::new(Arc::new(Plan::compile(&cfg).unwrap()));
    assert_eq!(
        p.reads.iter().map(|r| r.same_as).collect::<Vec<_>>(),
        [None, None, Some(0), Some(1), None, None]
    );
    let arena = Bump::new();
    let m = one(&mut p, &arena, r#"{"key":"k","value":-42,"s":"xy"}"#).unwrap();
    assert_eq!(
        m.values,
        [
            Some(Value::I64(-42)),
            Some(Value::F64(-42.0)),
            Some(Value::I64(-42)),
            Some(Value::F64(-42.0)),
            Some(Value::Str("xy")),
            Some(Value::Str("xy")),
        ]
    );
    let m = one(&mut p, &arena, r#"{"key":"k","value":null}"#).unwrap();
    assert_eq!(m.values, [None; 6]);
    assert_eq!(
        one(&mut p, &arena, r#"{"key":"k","value":2.5}"#),
        Err(MessageError::WrongType { field: 0 })
    );
    assert_eq!(
        one(&mut p, &arena, r#"{"key":"k","value":"2"}"#),
        Err(MessageError::WrongType { field: 0 })
    );
}

#[test]
fn member_names_near_the_configured_ones_do_not_match() {
    let mut p = default_projector();
    let arena = Bump::new();
    for name in [
        "kez",
        "ke",
        "keys",
        "valuf",
        "Value",
        "playe",
        "player1",
        r"pl\u0061yer!",
    ] {
        let body = format!(r#"{{"key":"k","{name}":5}}"#);
        let m = one(&mut p, &arena, &body).unwrap();
        assert_eq!(m.values, [None, None, None, None], "{name}");
    }
    let m = one(
        &mut p,
        &arena,
        r#"{"kex":"x","key":"k","valud":1,"value":2,"player":"p"}"#,
    )
    .unwrap();
    assert_eq!(m.key, "k");
    assert_eq!(m.values[0], Some(Value::I64(2)));
    assert_eq!(m.values[3], Some(Value::Str("p")));
}

#[test]
fn key_rules() {
    let mut p = default_projector();
    let arena = Bump::new();
    assert_eq!(
        one(&mut p, &arena, r#"{"value":1}"#),
        Err(MessageError::MissingKey)
    );
    assert_eq!(one(&mut p, &arena, r#"{}"#), Err(MessageError::MissingKey));
    for key in ["5", "null", "true", "{}", "[\"a\"]", "1.5"] {
        assert_eq!(
            one(&mut p, &arena, &format!(r#"{{"key":{key},"value":1}}"#)),
            Err(MessageError::KeyNotString),
            "{key}"
        );
    }
    assert_eq!(
        one(&mut p, &arena, r#"{"key":""}"#),
        Err(MessageError::EmptyKey)
    );
    let max = "k".repeat(128);
    assert_eq!(
        one(&mut p, &arena, &format!(r#"{{"key":"{max}"}}"#))
            .unwrap()
            .key,
        max
    );
    assert_eq!(
        one(&mut p, &arena, &format!(r#"{{"key":"{max}x"}}"#)),
        Err(MessageError::KeyTooLong)
    );
    // Bytes, not characters: 64 × "é" is 128 bytes, 65 is too long.
    let e64 = "é".repeat(64);
    assert!(one(&mut p, &arena, &format!(r#"{{"key":"{e64}"}}"#)).is_ok());
    assert_eq!(
        one(&mut p, &arena, &format!(r#"{{"key":"{e64}é"}}"#)),
        Err(MessageError::KeyTooLong)
    );
    // Key errors come before field errors; field errors in plan order.
    assert_eq!(
        one(&mut p, &arena, r#"{"value":"x","player":1}"#),
        Err(MessageError::MissingKey)
    );
    assert_eq!(
        one(&mut p, &arena, r#"{"player":1,"key":"k","value":"x"}"#),
        Err(MessageError::WrongType { field: 0 })
    );
}

#[test]
fn path_keys_ignore_the_body_key() {
    let mut p = default_projector();
    let arena = Bump::new();
    for body in [
        r#"{"key":5,"value":3}"#,
        r#"{"value":3}"#,
        r#"{"key":"","value":3}"#,
    ] {
        let b = p
            .project(&arena, body.as_bytes(), BodyFormat::Json, KeySource::Path)
            .unwrap();
        assert_eq!(b.shape, Shape::Object);
        let m = b.items[0].unwrap();
        assert_eq!(m.key, "");
        assert_eq!(m.values[0], Some(Value::I64(3)));
    }
    // Field errors still reject.
    let b = p
        .project(
            &arena,
            br#"{"value":"x"}"#,
            BodyFormat::Json,
            KeySource::Path,
        )
        .unwrap();
    assert_eq!(b.items[0], Err(MessageError::WrongType { field: 0 }));
    // One object only: arrays and scalars are refused whole.
    for body in [&b"[{\"value\":1}]"[..], b"[]", b"5", b"\"x\"", b"null"] {
        assert_eq!(
            p.project(&arena, body, BodyFormat::Json, KeySource::Path)
                .unwrap_err(),
            BodyError::NotObjectOrArray
        );
    }
    // The NDJSON content type does not make a batch here: the body is one document.
    let b = p
        .project(
            &arena,
            b"{\"value\":4}\n",
            BodyFormat::Ndjson,
            KeySource::Path,
        )
        .unwrap();
    assert_eq!(b.shape, Shape::Object);
    assert_eq!(b.items[0].unwrap().values[0], Some(Value::I64(4)));
    let r = p.project(
        &arena,
        b"{\"value\":4}\n{\"value\":5}\n",
        BodyFormat::Ndjson,
        KeySource::Path,
    );
    assert!(
        matches!(r, Err(BodyError::InvalidJson { at: 10..=12, .. })),
        "{r:?}"
    );
}

#[test]
fn arrays_validate_each_element() {
    let mut p = default_projector();
    let arena = Bump::new();
    let body = br#"[{"key":"a","value":1}, 5, "x", null, [], {"value":2}, {"key":"b","player":"p"}, true, {}]"#;
    let b = p
        .project(&arena, body, BodyFormat::Json, KeySource::Body)
        .unwrap();
    assert_eq!(b.shape, Shape::Array);
    let items = b.items.as_slice();
    assert_eq!(items.len(), 9);
    assert_eq!(items[0].unwrap().key, "a");
    assert_eq!(items[0].unwrap().values[0], Some(Value::I64(1)));
    for i in [1, 2, 3, 4, 7] {
        assert_eq!(items[i], Err(MessageError::NotAnObject), "item {i}");
    }
    assert_eq!(items[5], Err(MessageError::MissingKey));
    assert_eq!(items[6].unwrap().values[3], Some(Value::Str("p")));
    assert_eq!(items[8], Err(MessageError::MissingKey));

    let b = p
        .project(&arena, b" [ ] ", BodyFormat::Json, KeySource::Body)
        .unwrap();
    assert_eq!(b.shape, Shape::Array);
    assert!(b.items.is_empty());

    // Nested arrays in an element are skipped whole.
    let b = p
        .project(
            &arena,
            br#"[{"key":"a","c":[[1],[2,[3]]]},[[{"key":"x"}]],{"key":"b"}]"#,
            BodyFormat::Json,
            KeySource::Body,
        )
        .unwrap();
    let keys: Vec<_> = b.items.iter().map(|m| m.map(|m| m.key)).collect();
    assert_eq!(keys, [Ok("a"), Err(MessageError::NotAnObject), Ok("b")]);
}

#[test]
fn top_level_scalars_are_refused() {
    let mut p = default_projector();
    let arena = Bump::new();
    for body in ["5", "-1.5", "\"obj\"", "null", "true", " false "] {
        assert_eq!(
            p.project(&arena, body.as_bytes(), BodyFormat::Json, KeySource::Body)
                .unwrap_err(),
            BodyError::NotObjectOrArray,
            "{body}"
        );
    }
}

#[test]
fn ndjson_lines_are_messages() {
    let mut p = default_projector();
    let arena = Bump::new();
    let body = b"{\"key\":\"a\",\"value\":1}\n\n   \r\n\t\n{\"key\":\"b\",\"value\":2}\r\n5\n[{\"key\":\"c\"}]\n{\"value\":3}\n\"s\"\n{\"key\":\"d\",\"player\":\"\\u00e9\"}";
    let b = p
        .project(&arena, body, BodyFormat::Ndjson, KeySource::Body)
        .unwrap();
    assert_eq!(b.shape, Shape::Ndjson);
    let items = b.items.as_slice();
    assert_eq!(items.len(), 7);
    assert_eq!(items[0].unwrap().key, "a");
    assert_eq!(items[1].unwrap().key, "b");
    assert_eq!(items[1].unwrap().values[1], Some(Value::I64(2)));
    assert_eq!(items[2], Err(MessageError::NotAnObject));
    assert_eq!(items[3], Err(MessageError::NotAnObject));
    assert_eq!(items[4], Err(MessageError::MissingKey));
    assert_eq!(items[5], Err(MessageError::NotAnObject));
    assert_eq!(items[6].unwrap().values[3], Some(Value::Str("é")));
    // Strings of earlier lines stay intact while later lines are parsed.
    assert_eq!(items[0].unwrap().key, "a");

    // A trailing newline, or none, is the same.
    for body in [
        &b"{\"key\":\"a\"}\n"[..],
        b"{\"key\":\"a\"}",
        b"\n\n{\"key\":\"a\"}\n\n",
    ] {
        let b = p
            .project(&arena, body, BodyFormat::Ndjson, KeySource::Body)
            .unwrap();
        assert_eq!(b.items.len(), 1);
        assert_eq!(b.items[0].unwrap().key, "a");
    }
    // A JSON array sent as NDJSON is one line that is not an object.
    let b = p
        .project(
            &arena,
            b"[{\"key\":\"a\"}]",
            BodyFormat::Ndjson,
            KeySource::Body,
        )
        .unwrap();
    assert_eq!(b.items.as_slice(), &[Err(MessageError::NotAnObject)]);
}

#[test]
fn ndjson_with_no_value_is_invalid() {
    let mut p = default_projector();
    assert_eq!(
        invalid(&mut p, b"", BodyFormat::Ndjson),
        (0, "no JSON value")
    );
    assert_eq!(
        invalid(&mut p, b"\n \r\n\t\n", BodyFormat::Ndjson),
        (6, "no JSON value")
    );
}

#[test]
fn ndjson_invalid_line_refuses_the_body_at_its_absolute_offset() {
    let mut p = default_projector();
    let line1 = "{\"key\":\"a\",\"value\":1}\n";
    let line2 = "\n";
    let line3 = "{\"key\":\"b\",\"value\":01}\n";
    let body = format!("{line1}{line2}{line3}{{\"key\":\"c\"}}\n");
    let (at, what) = invalid(&mut p, body.as_bytes(), BodyFormat::Ndjson);
    assert_eq!(
        at,
        line1.len() + line2.len() + line3.find("01").unwrap() + 1
    );
    assert_eq!(what, "invalid number");

    // A stage-1 error (invalid UTF-8) on a later line.
    let mut body = b"{\"key\":\"a\"}\n{\"key\":\"".to_vec();
    let bad = body.len();
    body.extend_from_slice(b"\xff\"}\n");
    assert_eq!(
        invalid(&mut p, &body, BodyFormat::Ndjson),
        (bad, "invalid UTF-8")
    );

    // Two values on one line.
    let (at, _) = invalid(
        &mut p,
        b"{\"key\":\"a\"}\n{\"key\":\"b\"} {}\n",
        BodyFormat::Ndjson,
    );
    assert!((12..=24).contains(&at), "{at}");
}

#[test]
fn invalid_json_offsets() {
    let mut p = default_projector();
    let j = BodyFormat::Json;
    assert_eq!(invalid(&mut p, b"", j), (0, "empty body"));
    assert_eq!(invalid(&mut p, b"  \n ", j), (4, "no JSON value"));
    // Number errors point at the offending digit.
    assert_eq!(
        invalid(&mut p, br#"{"key":"a","value":01}"#, j),
        (20, "invalid number")
    );
    assert_eq!(
        invalid(&mut p, br#"{"key":"a","value":1.}"#, j).1,
        "invalid number"
    );
    assert_eq!(invalid(&mut p, br#"{"key":"a" "value":1}"#, j).0, 11);
    assert_eq!(
        invalid(&mut p, br#"{"key":"a","value":tru}"#, j),
        (19, "unexpected character")
    );
    assert_eq!(
        invalid(&mut p, b"{\"key\":\"a\xffb\"}", j),
        (9, "invalid UTF-8")
    );
    assert_eq!(
        invalid(&mut p, b"{\"key\":\"\xc3\"}", j),
        (8, "invalid UTF-8")
    );
    assert_eq!(
        invalid(&mut p, b"{\"key\":\"a\x01\"}", j),
        (9, "control character in string")
    );
    assert_eq!(
        invalid(&mut p, b"{\"key\":\"a\nb\"}", j),
        (9, "control character in string")
    );
    assert_eq!(
        invalid(&mut p, br#"{"key":"abc"#, j),
        (7, "unterminated string")
    );
    assert_eq!(
        invalid(&mut p, br#"{"key":"a\qb"}"#, j),
        (9, "invalid escape in string")
    );
    assert_eq!(
        invalid(&mut p, br#"{"key":"a\u12"}"#, j),
        (9, "invalid unicode escape in string")
    );
    assert_eq!(
        invalid(&mut p, br#"{"key":"x","player":"\ud800"}"#, j),
        (21, "invalid unicode escape in string")
    );
    let (at, _) = invalid(&mut p, br#"{"key":"a"} x"#, j);
    assert!((10..=12).contains(&at), "{at}");
    assert_eq!(invalid(&mut p, br#"[1,]"#, j).0, 3);
    assert!(invalid(&mut p, br#"{"key":"a""#, j).0 <= 10);
    assert!(invalid(&mut p, br#"[{"key":"a"}"#, j).0 <= 12);
    assert_eq!(invalid(&mut p, br#"{,}"#, j).0, 1);
    // As in serde_json: integers past u64 are valid numbers (f64), numbers
    // whose nearest f64 is infinite are not.
    let arena = Bump::new();
    assert_eq!(
        one(
            &mut p,
            &arena,
            r#"{"key":"a","value":18446744073709551616}"#
        ),
        Err(MessageError::WrongType { field: 0 })
    );
    assert_eq!(
        invalid(&mut p, br#"{"value":1e400}"#, j),
        (9, "number out of range")
    );
    // Nesting past serde_json's recursion limit.
    let deep = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
    assert_eq!(invalid(&mut p, deep.as_bytes(), j).1, "nesting too deep");
}

#[test]
fn body_error_answers() {
    let e = BodyError::InvalidJson {
        at: 17,
        what: "invalid number",
    };
    assert_eq!(e.status(), 400);
    assert_eq!(e.metric_label(), "invalid_json");
    let mut out = Vec::new();
    e.write_message(&mut out);
    assert_eq!(out, b"invalid json: invalid number at byte 17");
    assert_eq!(e.to_string(), "invalid json: invalid number at byte 17");
    assert_eq!(BodyError::NotObjectOrArray.status(), 400);
    assert_eq!(BodyError::NotObjectOrArray.metric_label(), "not_object");
    assert_eq!(BodyError::ArenaFull.status(), 503);
    assert_eq!(BodyError::ArenaFull.metric_label(), "arena_full");
    for e in [BodyError::NotObjectOrArray, BodyError::ArenaFull] {
        let mut out = Vec::new();
        e.write_message(&mut out);
        assert_eq!(out, e.to_string().as_bytes());
        assert!(!out.contains(&b'"') && !out.contains(&b'\\'));
    }
}

/// `{"key":"box-<i>","value":<i>,"player":"p-7",...cargo to about `size` bytes}`.
fn message_of_size(i: usize, size: usize) -> String {
    let mut s = format!(r#"{{"key":"box-{i}","value":{i},"player":"p-7""#);
    let mut n = 0;
    while s.len() + 80 < size {
        s.push_str(&format!(
            r#","c{n}":{{"a":[1,2.5,"x\"y",null,true],"b":{{"value":{n}}}}},"s{n}":"{}""#,
            "z".repeat(10)
        ));
        n += 1;
    }
    s.push('}');
    s
}

#[test]
fn big_messages() {
    let mut p = default_projector();
    let arena = Bump::new();
    let body = message_of_size(42, 8192);
    assert!(body.len() > 8000 && body.len() <= 8192, "{}", body.len());
    let m = one(&mut p, &arena, &body).unwrap();
    assert_eq!(m.key, "box-42");
    assert_eq!(
        m.values,
        &[
            Some(Value::I64(42)),
            Some(Value::I64(42)),
            None,
            Some(Value::Str("p-7"))
        ]
    );

    // A batch of them, as an array and as NDJSON.
    let msgs: Vec<String> = (0..50).map(|i| message_of_size(i, 8192)).collect();
    let array = format!("[{}]", msgs.join(","));
    let ndjson = msgs.join("\n");
    for (body, format) in [(array, BodyFormat::Json), (ndjson, BodyFormat::Ndjson)] {
        let b = p
            .project(&arena, body.as_bytes(), format, KeySource::Body)
            .unwrap();
        assert_eq!(b.items.len(), 50);
        for (i, m) in b.items.iter().enumerate() {
            let m = m.unwrap();
            assert_eq!(m.key, format!("box-{i}"));
            assert_eq!(m.values[0], Some(Value::I64(i as i64)));
        }
    }
}

#[test]
fn arena_full_is_an_error_not_a_panic() {
    let mut arena = Arena::new(16 * 1024, 64 * 1024);
    let mut p = default_projector();
    // The body is scanned in place, not copied: one message bigger than the
    // arena limit takes only its key and fields from the arena.
    let big = message_of_size(1, 100 * 1024);
    for format in [BodyFormat::Json, BodyFormat::Ndjson] {
        let b = p
            .project(arena.bump(), big.as_bytes(), format, KeySource::Body)
            .unwrap();
        assert_eq!(b.items[0].unwrap().key, "box-1");
    }
    // A key that does not fit is refused with 503, not a panic.
    let long_key = format!(r#"{{"key":"{}"}}"#, "k".repeat(100 * 1024));
    let mut big_plan = Plan::default_plan();
    big_plan.max_key_bytes = 1 << 20;
    let mut big_keys = Projector::new(Arc::new(big_plan));
    let e = big_keys
        .project(
            arena.bump(),
            long_key.as_bytes(),
            BodyFormat::Json,
            KeySource::Body,
        )
        .unwrap_err();
    assert_eq!(e, BodyError::ArenaFull);
    assert_eq!(e.status(), 503);
    // Many small NDJSON lines fill the arena part way through.
    let lines: Vec<String> = (0..2000).map(|i| message_of_size(i, 200)).collect();
    let body = lines.join("\n");
    assert_eq!(
        p.project(
            arena.bump(),
            body.as_bytes(),
            BodyFormat::Ndjson,
            KeySource::Body
        )
        .unwrap_err(),
        BodyError::ArenaFull
    );
    // So does a big array of small objects.
    let body = format!("[{}]", lines.join(","));
    assert_eq!(
        p.project(
            arena.bump(),
            body.as_bytes(),
            BodyFormat::Json,
            KeySource::Body
        )
        .unwrap_err(),
        BodyError::ArenaFull
    );
    // After the epoch ends, the same projector works again.
    arena.reset();
    let b = p
        .project(
            arena.bump(),
            lines[7].as_bytes(),
            BodyFormat::Json,
            KeySource::Body,
        )
        .unwrap();
    assert_eq!(b.items[0].unwrap().key, "box-7");
}

#[test]
fn extracted_strings_live_in_the_arena() {
    let mut arena = Bump::new();
    let mut p = default_projector();
    let body = br#"{"key":"box-\u0031","player":"p-7"}"#.to_vec();
    let (key_at, player_at) = {
        let b = p
            .project(&arena, &body, BodyFormat::Json, KeySource::Body)
            .unwrap();
        let m = b.items[0].unwrap();
        assert_eq!(m.key, "box-1");
        let Some(Value::Str(player)) = m.values[3] else {
            panic!()
        };
        (m.key.as_ptr() as usize, player.as_ptr() as usize)
    };
    let mut in_arena = |addr: usize| {
        arena.iter_allocated_chunks().any(|c| {
            let r = c.as_ptr_range();
            (r.start as usize..r.end as usize).contains(&addr)
        })
    };
    assert!(in_arena(key_at));
    assert!(in_arena(player_at));
}

#[test]
fn projector_is_reusable_after_errors_and_gives_back_spikes() {
    let mut p = default_projector();
    let mut arena = Arena::new(1 << 20, 64 << 20);
    for round in 0..3 {
        assert!(p
            .project(arena.bump(), b"{", BodyFormat::Json, KeySource::Body)
            .is_err());
        let m = one(&mut p, arena.bump(), r#"{"key":"k","value":1}"#).unwrap();
        assert_eq!(m.values[0], Some(Value::I64(1)), "round {round}");
        arena.reset();
    }
    let small = p.working_bytes();
    let big = message_of_size(1, 64 * 1024);
    one(&mut p, arena.bump(), &big).unwrap();
    // Scanning works in place: a big document leaves nothing behind.
    assert_eq!(p.working_bytes(), small);
    assert_eq!(one(&mut p, arena.bump(), &big).unwrap().key, "box-1");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_bytes_give_an_answer_not_a_panic(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut p = default_projector();
            let arena = Bump::new();
            for format in [BodyFormat::Json, BodyFormat::Ndjson] {
                for keys in [KeySource::Body, KeySource::Path] {
                    if let Err(BodyError::InvalidJson { at, .. }) = p.project(&arena, &body, format, keys) {
                        prop_assert!(at <= body.len());
                    }
                }
            }
        }

        #[test]
        fn json_soup_gives_an_answer_not_a_panic(
            parts in proptest::collection::vec(
                prop::sample::select(vec![
                    "{", "}", "[", "]", ",", ":", "\"key\"", "\"value\"", "\"player\"", "\"k\"",
                    "1", "-5", "2.5", "null", "true", "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\n", " ",
                ]),
                0..60,
            )
        ) {
            let body = parts.concat();
            let mut p = default_projector();
            let arena = Bump::new();
            for format in [BodyFormat::Json, BodyFormat::Ndjson] {
                let r = p.project(&arena, body.as_bytes(), format, KeySource::Body);
                // What serde_json accepts, the projection accepts too (JSON only).
                if format == BodyFormat::Json {
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) {
                        if v.is_object() || v.is_array() {
                            prop_assert!(r.is_ok(), "{body:?}: {r:?}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn newlines_are_counted_exactly() {
    for body in [
        &b""[..],
        b"\n",
        b"abc",
        b"\n\n\n\n\n\n\n\n\n",
        b"\x0b\n\x09\x0a\x00\x01\n\xff\x8a\n\n",
        b"{\"a\":1}\n{\"b\":2}\r\n\n{}",
    ] {
        let want = body.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(crate::bytes::count_lf(body), want, "{body:?}");
    }
    let all: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    assert_eq!(crate::bytes::count_lf(&all), 16);
}

#[test]
fn each_message_knows_where_its_object_lies_in_the_body() {
    let mut arena = Arena::new(64 * 1024, 1 << 20);
    let mut p = Projector::new(Arc::new(Plan::default_plan()));
    let cases: [(&str, BodyFormat, KeySource, &[&str]); 4] = [
        (
            r#"  {"key":"a","value":1}  "#,
            BodyFormat::Json,
            KeySource::Body,
            &[r#"{"key":"a","value":1}"#],
        ),
        (
            r#"{"value":1,"cargo":{"x":[1,{"y":2}]}}"#,
            BodyFormat::Json,
            KeySource::Path,
            &[r#"{"value":1,"cargo":{"x":[1,{"y":2}]}}"#],
        ),
        (
            r#"[ {"key":"a"} , 7, {"key":"b","s":"}"}]"#,
            BodyFormat::Json,
            KeySource::Body,
            &[r#"{"key":"a"}"#, "", r#"{"key":"b","s":"}"}"#],
        ),
        (
            "{\"key\":\"a\"}\n\n  {\"key\":\"b\",\"value\":2}\r\n",
            BodyFormat::Ndjson,
            KeySource::Body,
            &[r#"{"key":"a"}"#, r#"{"key":"b","value":2}"#],
        ),
    ];
    for (body, format, keys, want) in cases {
        let batch = p
            .project(arena.bump(), body.as_bytes(), format, keys)
            .unwrap();
        let got: Vec<&str> = batch
            .items
            .iter()
            .map(|m| match m {
                Ok(m) => &body[m.span.0 as usize..m.span.1 as usize],
                Err(_) => "",
            })
            .collect();
        assert_eq!(got, want, "{body:?}");
        drop(batch);
        arena.reset();
    }
}
