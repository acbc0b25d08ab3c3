//! The scanner's tests: the grammar accepted and refused (each verdict checked
//! against serde_json's), the offsets of errors, both paths of numbers and
//! member names, and the decoding of strings and numbers.
//!
//! What it is not: the projection's tests (`projection/tests.rs`), which
//! drive the scanner through messages and configured paths.

use super::number::{number_end, number_fast, BAD_NUMBER, OUT_OF_RANGE};
use super::string::{stops16, BAD_ESCAPE, BAD_UNICODE, BAD_UTF8};
use super::*;

fn ok(doc: &str) {
    assert_eq!(validate(doc.as_bytes()), Ok(()), "{doc:?}");
    assert!(
        serde_json::from_str::<serde_json::Value>(doc).is_ok(),
        "serde_json refuses {doc:?}"
    );
}

fn bad(doc: &[u8]) -> (usize, &'static str) {
    let got = validate(doc).expect_err(&String::from_utf8_lossy(doc));
    assert!(
        serde_json::from_slice::<serde_json::Value>(doc).is_err(),
        "serde_json accepts {:?}",
        String::from_utf8_lossy(doc)
    );
    got
}

#[test]
fn accepts_the_grammar() {
    for doc in [
        "0",
        "-0",
        "1.5e-3",
        "1E+2",
        "-0.0e0",
        " true ",
        "null",
        "\"\"",
        r#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00""#,
        "\"\u{e9}\u{20ac}\u{10348}\"",
        "[]",
        "{}",
        r#"{"a":[1,{"b":null}],"c":"d"}"#,
        "18446744073709551616",
        "1e-400",
        "0e99999999999999999999",
        "1.7976931348623157e308",
        "123456789012345678901234567890",
        "\t\r\n[ 1 , 2 ]\n",
    ] {
        ok(doc);
    }
}

#[test]
fn refuses_with_the_offset() {
    assert_eq!(bad(b"01"), (1, BAD_NUMBER));
    assert_eq!(bad(b"-"), (1, BAD_NUMBER));
    assert_eq!(bad(b"1."), (2, BAD_NUMBER));
    assert_eq!(bad(b"1e"), (2, BAD_NUMBER));
    assert_eq!(bad(b".5"), (0, UNEXPECTED));
    assert_eq!(bad(b"1e400"), (0, OUT_OF_RANGE));
    assert_eq!(bad(b"-1.8e308"), (0, OUT_OF_RANGE));
    assert_eq!(bad(&[b'1'; 400]), (0, OUT_OF_RANGE));
    assert_eq!(bad(b"[1,]"), (3, UNEXPECTED));
    assert_eq!(bad(b"[1 2]"), (3, "expected ',' or ']'"));
    assert_eq!(bad(b"{\"a\" 1}"), (5, "expected ':'"));
    assert_eq!(bad(b"{\"a\":1,}"), (7, "expected a string member name"));
    assert_eq!(bad(b"{1:1}"), (1, "expected a string member name"));
    assert_eq!(bad(b"\"a\\x\""), (2, BAD_ESCAPE));
    assert_eq!(bad(b"\"\\ud800\""), (1, BAD_UNICODE));
    assert_eq!(bad(b"\"\\ud800\\u0041\""), (1, BAD_UNICODE));
    assert_eq!(bad(b"\"\\udc00\""), (1, BAD_UNICODE));
    assert_eq!(bad(b"\"\\u12\""), (1, BAD_UNICODE));
    assert_eq!(bad(b"\"ab\x1f\""), (3, "control character in string"));
    assert_eq!(bad(b"\"abcdefghij\x7f\xff\""), (12, BAD_UTF8));
    assert_eq!(bad(b"\"\xed\xa0\x80\""), (1, BAD_UTF8)); // a surrogate
    assert_eq!(bad(b"\"\xc0\xaf\""), (1, BAD_UTF8)); // overlong
    assert_eq!(bad(b"\"\xf4\x90\x80\x80\""), (1, BAD_UTF8)); // past U+10FFFF
    assert_eq!(bad(b"\"abc"), (0, "unterminated string"));
    assert_eq!(bad(b"tru"), (0, UNEXPECTED));
    assert_eq!(bad(b"[] x"), (3, "trailing characters after the value"));
    assert_eq!(
        bad(b"{}\n{}"),
        (
            3,
            "trailing characters after the value (one JSON value a line? send Content-Type: application/x-ndjson)"
        )
    );
    assert_eq!(bad(b"{} {}").1, "trailing characters after the value");
    assert_eq!(bad(b"\xef\xbb\xbf{}"), (0, UNEXPECTED)); // no BOM
    assert_eq!(bad(b"\x0c1"), (0, UNEXPECTED)); // form feed is not whitespace
    assert_eq!(bad(b"[").1, EOF);
    assert_eq!(bad(b" ").1, "no JSON value");
}

#[test]
fn depth_limit_is_serde_jsons() {
    let nest = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    ok(&nest(MAX_DEPTH as usize));
    assert_eq!(
        bad(nest(MAX_DEPTH as usize + 1).as_bytes()),
        (MAX_DEPTH as usize, "nesting too deep")
    );
    let objects = |n: usize| format!("{}1{}", r#"{"a":"#.repeat(n), "}".repeat(n));
    ok(&objects(MAX_DEPTH as usize));
    bad(objects(MAX_DEPTH as usize + 1).as_bytes());
}

#[test]
fn plain_numbers_fast_and_the_rest_on_the_full_path() {
    // `number_fast` answers only where `number_end` accepts, and with the
    // same end; what it leaves is left to `number_end`.
    let plain = [
        "0",
        "7",
        "12",
        "-3",
        "-0",
        "1.5",
        "-2.25",
        "0.0",
        "10.01",
        "123456789012",
    ];
    let other = [
        "1e5", "1E5", "1.5e3", "-0.5E-2", "01", "-01", "00", "-", "1.", "-.5", ".5", "1.e3", "-a",
        "1.x",
    ];
    for (text, fast) in plain
        .iter()
        .map(|t| (t, true))
        .chain(other.iter().map(|t| (t, false)))
    {
        for tail in ["", ",", "]", " ", "x"] {
            let doc = format!("{text}{tail}");
            let buf = doc.as_bytes();
            let full = number_end(buf, 0).ok().map(|(end, _)| end);
            let got = number_fast(buf, 0);
            assert_eq!(got.is_some(), fast, "{doc:?}");
            if let Some(end) = got {
                assert_eq!(Some(end), full, "{doc:?}");
                assert_eq!(end, text.len(), "{doc:?}");
            }
        }
    }
    let long = "9".repeat(309);
    assert_eq!(number_fast(long.as_bytes(), 0), None);
    assert_eq!(number_fast(format!("{long}.5").as_bytes(), 0), None);
    let most = "9".repeat(308);
    assert_eq!(number_fast(most.as_bytes(), 0), Some(308));
    bad(format!("[{long}0{long}]").as_bytes());
    ok(&format!("[{most},{most}.5,-{most}]"));
}

#[test]
fn member_heads_on_both_paths() {
    // `{"name":` and `,"name":` read in one chunk, and every way of leaving that path:
    // a space, an escape, a non-ASCII byte, a name too long for the
    // chunk, the end of the input inside the chunk.
    for name in [
        "a",
        "tags",
        "a_name_of_13c",
        "a_name_of_14ch",
        "a_long_name_of_many_bytes",
    ] {
        for sep in [",", ", ", ",\n"] {
            for colon in [":", " :", ": "] {
                ok(&format!(r#"{{"x":1{sep}"{name}"{colon}2}}"#));
                ok(&format!(r#"[{{"x":[1]{sep}"{name}"{colon}{{}}}}]"#));
            }
        }
    }
    for name in [
        "a",
        "a_name_of_13c",
        "a_name_of_14ch",
        "a_long_name_of_many_bytes",
    ] {
        for open in ["{", "{ ", "[{"] {
            for colon in [":", " :", ": "] {
                let close = if open == "[{" { "}]" } else { "}" };
                ok(&format!(r#"{open}"{name}"{colon}[]{close}"#));
            }
        }
    }
    ok(r#"{"\u0041":{"\u0041":2}}"#);
    assert_eq!(bad(br#"{"ab"2}"#), (5, "expected ':'"));
    assert_eq!(bad(br#"[{"ab":}]"#), (7, UNEXPECTED));
    assert_eq!(bad(br#"[{"a\qb":2}]"#), (4, BAD_ESCAPE));
    ok(r#"{"x":1,"\u0041":2}"#);
    ok("{\"x\":1,\"\u{e9}t\u{e9}\":2}");
    assert_eq!(bad(br#"{"x":1,"ab"2}"#), (11, "expected ':'"));
    assert_eq!(bad(br#"{"x":1,"ab";2}"#), (11, "expected ':'"));
    assert_eq!(bad(br#"{"x":1,"a\qb":2}"#), (9, BAD_ESCAPE));
    assert_eq!(
        bad(b"{\"x\":1,\"a\x01\":2}"),
        (9, "control character in string")
    );
    assert_eq!(bad(br#"{"x":1,"ab":}"#), (12, UNEXPECTED));
    assert_eq!(bad(br#"{"x":1,"ab":"#), (12, EOF));
    assert_eq!(bad(br#"{"x":1,"ab""#), (11, EOF));
    assert_eq!(bad(br#"{"x":1,1:2}"#), (7, "expected a string member name"));
}

#[test]
fn stops16_marks_exactly_the_stops() {
    // Every byte value at every position, beside plain bytes and a later
    // quote: the masks are exactly the bytes a string scan must stop at.
    for at in 0..16 {
        for b in 0..=255u8 {
            let mut chunk = [b'a'; 16];
            chunk[at] = b;
            if at < 15 {
                chunk[15] = b'"';
            }
            let got = stops16(&chunk);
            let stop = matches!(b, b'"' | b'\\' | 0x00..=0x1F | 0x80..=0xFF);
            let mut want_stops = u32::from(stop) << at;
            let mut want_quotes = u32::from(b == b'"') << at;
            let want_colons = u32::from(b == b':') << at;
            if at < 15 {
                want_stops |= 1 << 15;
                want_quotes |= 1 << 15;
            }
            assert_eq!(got, (want_stops, want_quotes, want_colons), "{chunk:?}");
        }
    }
    for plain in [b' ', b'!', b'#', b'[', b']', b'~', 0x7F, b'a'] {
        assert_eq!(stops16(&[plain; 16]), (0, 0, 0));
    }
}

#[test]
fn unescapes_and_compares() {
    let raw = br#"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00z"#;
    let want = "a\"\\/\u{8}\u{c}\n\r\t\u{e9}\u{1f600}z";
    let mut out = [0u8; 64];
    let n = unescape_into(raw, &mut out);
    assert_eq!(&out[..n], want.as_bytes());
    assert!(unescaped_eq(raw, want.as_bytes()));
    assert!(!unescaped_eq(raw, &want.as_bytes()[..want.len() - 1]));
    assert!(!unescaped_eq(br"\u0041", b"AB"));
    assert!(unescaped_eq(br"\u0041B", b"AB"));
}

#[test]
fn integers_at_the_edges() {
    assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    assert_eq!(parse_i64(b"9223372036854775808"), None);
    assert_eq!(parse_i64(b"-9223372036854775809"), None);
    assert_eq!(parse_i64(b"-0"), Some(0));
    assert_eq!(parse_i64(b"18446744073709551616"), None);
}

#[test]
fn floats_are_correctly_rounded() {
    // Halfway and near-halfway cases that naive multiplication gets wrong.
    for text in [
        "9007199254740993",
        "2.2250738585072011e-308",
        "1.7976931348623158e308",
        "0.1",
        "4.9406564584124654e-324",
    ] {
        assert_eq!(
            parse_f64(text.as_bytes()).to_bits(),
            text.parse::<f64>().map(f64::to_bits).unwrap_or(0)
        );
    }
}
