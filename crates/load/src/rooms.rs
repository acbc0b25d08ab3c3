//! Prefixes of the `prefix_streams` operation (`--prefix-streams N --prefix TEMPLATE`):
//! stream `i` watches the prefix the template gives for `i` (docs/http.md#rooms).
//!
//! A template is text with `{i}` (the stream's index) or `{i%M}` (the index modulo
//! `M`) in it: `room-{i%100}/` spreads the streams over 100 rooms, `room-0/` puts them
//! all on one, `watch-{i}/` gives each its own. What it renders must be a prefix the
//! server takes: empty (every box) or ending with `/`, `:` or `.`. Without `--prefix`,
//! stream `i` watches room `i % --rooms` (`room-{i%R}/`, the rooms keys are named in),
//! or every box when there are no rooms.

use std::fmt;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// The stream's index modulo this (`u64::MAX`: the index itself).
    Index(u64),
}

/// A parsed `--prefix` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixTemplate {
    text: String,
    pieces: Vec<Piece>,
}

impl PrefixTemplate {
    /// Parses a template: text, `{i}` and `{i%M}` with `M` ≥ 1; what it renders must
    /// be empty or end with `/`, `:` or `.`.
    pub fn parse(text: &str) -> Result<PrefixTemplate, String> {
        let bad = |why: &str| Err(format!("invalid prefix template {text:?}: {why}"));
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    pieces.push(Piece::Text(rest.to_string()));
                    break;
                }
                Some(at) if rest.as_bytes()[at] == b'}' => return bad("a } without its {"),
                Some(at) => {
                    if at > 0 {
                        pieces.push(Piece::Text(rest[..at].to_string()));
                    }
                    let Some(close) = rest[at..].find('}') else {
                        return bad("a { without its }");
                    };
                    let inner = &rest[at + 1..at + close];
                    let piece = match inner.split_once('%') {
                        None if inner.trim() == "i" => Piece::Index(u64::MAX),
                        Some((i, m)) if i.trim() == "i" => match m.trim().parse::<u64>() {
                            Ok(m) if (1..u64::MAX).contains(&m) => Piece::Index(m),
                            _ => return bad("{i%M} needs a whole number M of at least 1"),
                        },
                        _ => return bad("use {i} or {i%M}"),
                    };
                    pieces.push(piece);
                    rest = &rest[at + close + 1..];
                }
            }
        }
        let template = PrefixTemplate {
            text: text.to_string(),
            pieces,
        };
        let first = template.render(0);
        if !first.is_empty() && !first.ends_with(['/', ':', '.']) {
            return bad(
                "a prefix is empty or ends with a separator (/, : or .), e.g. room-{i%100}/",
            );
        }
        if first.len() > 128 {
            return bad("longer than a key may be (128 bytes by default)");
        }
        Ok(template)
    }

    /// The template stream `i` watches when none is given: its room
    /// (`room-{i%rooms}/`), or every box without rooms.
    pub fn default_for(rooms: u32) -> PrefixTemplate {
        if rooms == 0 {
            PrefixTemplate::parse("").expect("the empty prefix")
        } else if rooms == 1 {
            PrefixTemplate::parse("room-0/").expect("a room's prefix")
        } else {
            PrefixTemplate::parse(&format!("room-{{i%{rooms}}}/")).expect("a room's prefix")
        }
    }

    /// The prefix of stream `i`.
    pub fn render(&self, i: usize) -> String {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Index(u64::MAX) => out.push_str(itoa::Buffer::new().format(i)),
                Piece::Index(m) => out.push_str(itoa::Buffer::new().format(i as u64 % m)),
            }
        }
        out
    }

    /// How many distinct prefixes `n` streams watch.
    pub fn distinct(&self, n: usize) -> usize {
        let mut seen: Vec<String> = (0..n).map(|i| self.render(i)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

impl fmt::Display for PrefixTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Appends `prefix` percent-encoded for a query value (bytes other than letters,
/// digits and `-._~/:` as `%XX`).
pub fn encode_query_value(prefix: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in prefix.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/:".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_each_streams_prefix() {
        let t = PrefixTemplate::parse("room-{i%3}/").unwrap();
        let got: Vec<String> = (0..5).map(|i| t.render(i)).collect();
        assert_eq!(got, ["room-0/", "room-1/", "room-2/", "room-0/", "room-1/"]);
        assert_eq!(t.distinct(5), 3);
        assert_eq!(t.distinct(2), 2);
        assert_eq!(t.to_string(), "room-{i%3}/");
        let t = PrefixTemplate::parse("t:{i}:{ i % 2 }.").unwrap();
        assert_eq!(t.render(7), "t:7:1.");
        assert_eq!(t.distinct(10), 10);
        let t = PrefixTemplate::parse("room-0/").unwrap();
        assert_eq!((t.render(9), t.distinct(100)), ("room-0/".to_string(), 1));
        assert_eq!(PrefixTemplate::parse("").unwrap().render(3), "");
        assert_eq!(PrefixTemplate::default_for(0).render(5), "");
        assert_eq!(PrefixTemplate::default_for(4).render(5), "room-1/");
        assert_eq!(PrefixTemplate::default_for(1).to_string(), "room-0/");
    }

    #[test]
    fn bad_templates_are_refused_with_a_reason() {
        for bad in [
            "room-{i}",
            "room",
            "room-{j}/",
            "room-{i%0}/",
            "room-{i%x}/",
            "room-{i/",
            "room-i}/",
            "{}/",
            &format!("{}/", "x".repeat(200)),
        ] {
            let err = PrefixTemplate::parse(bad).expect_err(bad);
            assert!(err.starts_with("invalid prefix template"), "{bad}: {err}");
        }
    }

    #[test]
    fn prefixes_are_percent_encoded_in_queries() {
        let mut out = Vec::new();
        encode_query_value("room 1&x/é:a.", &mut out);
        assert_eq!(out, b"room%201%26x/%C3%A9:a.");
    }
}
