//! Scopes: which keys a token may read and which it may write (the claim
//! `pollbox: {"read": [...], "write": [...]}`, or an `[[auth.token]]`'s
//! lists). A pattern is an exact key, a prefix ending in `*`
//! (`"room-17/*"`), or `"*"`; `read` and `write` are apart, neither implies
//! the other.

/// One key pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `"*"`: every key.
    Any,
    /// `"room-17/*"`: every key starting with `room-17/`.
    Prefix(Box<[u8]>),
    /// Exactly this key.
    Exact(Box<[u8]>),
}

impl Pattern {
    /// A pattern as written; `*` may only end it.
    pub fn parse(p: &str) -> Result<Pattern, &'static str> {
        match p.as_bytes() {
            [] => Err("a pattern must not be empty"),
            b"*" => Ok(Pattern::Any),
            [head @ .., b'*'] if !head.contains(&b'*') => Ok(Pattern::Prefix(head.into())),
            b if b.contains(&b'*') => {
                Err("`*` may only end a pattern (`room-17/*`) or be it (`*`)")
            }
            b => Ok(Pattern::Exact(b.into())),
        }
    }

    #[inline]
    pub fn matches(&self, key: &[u8]) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Prefix(p) => key.starts_with(p),
            Pattern::Exact(k) => **k == *key,
        }
    }
}

/// What a token may read and write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scopes {
    pub read: Vec<Pattern>,
    pub write: Vec<Pattern>,
}

/// Which of a token's scopes a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Read,
    Write,
}

impl Scopes {
    /// From pattern lists; a pattern that does not parse grants nothing (the
    /// config refuses such patterns; a signed token's are taken as they come).
    pub fn new<'a>(
        read: impl IntoIterator<Item = &'a str>,
        write: impl IntoIterator<Item = &'a str>,
    ) -> Scopes {
        let parse = |it: &mut dyn Iterator<Item = &'a str>| {
            it.filter_map(|p| Pattern::parse(p).ok()).collect()
        };
        Scopes {
            read: parse(&mut read.into_iter()),
            write: parse(&mut write.into_iter()),
        }
    }

    /// Every key, both ways (an `auth.ingest_tokens` token writes every key).
    pub fn everything() -> Scopes {
        Scopes {
            read: vec![Pattern::Any],
            write: vec![Pattern::Any],
        }
    }

    #[inline]
    pub fn allows(&self, need: Need, key: &[u8]) -> bool {
        let list = match need {
            Need::Read => &self.read,
            Need::Write => &self.write,
        };
        list.iter().any(|p| p.matches(key))
    }

    /// Whether one pattern allows every key under `prefix`
    /// (docs/boxes.md#rooms): `*`, or `q*` with `prefix` starting with `q`
    /// (`room-17/*` covers `room-17/` and `room-17/a/`, not the empty prefix).
    pub fn covers(&self, need: Need, prefix: &[u8]) -> bool {
        let list = match need {
            Need::Read => &self.read,
            Need::Write => &self.write,
        };
        list.iter().any(|p| match p {
            Pattern::Any => true,
            Pattern::Prefix(q) => prefix.starts_with(q),
            Pattern::Exact(_) => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        assert_eq!(Pattern::parse("*"), Ok(Pattern::Any));
        assert_eq!(
            Pattern::parse("room-17/*"),
            Ok(Pattern::Prefix(b"room-17/"[..].into()))
        );
        assert_eq!(Pattern::parse("a"), Ok(Pattern::Exact(b"a"[..].into())));
        assert!(Pattern::parse("").is_err());
        assert!(Pattern::parse("a*b").is_err());
        assert!(Pattern::parse("**").is_err());
        assert!(Pattern::parse("*a").is_err());
        let p = Pattern::parse("room-17/*").unwrap();
        assert!(p.matches(b"room-17/"));
        assert!(p.matches(b"room-17/alice"));
        assert!(!p.matches(b"room-17"));
        assert!(!p.matches(b"room-1/x"));
        let e = Pattern::parse("player-alice").unwrap();
        assert!(e.matches(b"player-alice"));
        assert!(!e.matches(b"player-alice-score"));
        assert!(Pattern::Any.matches(b""));
    }

    #[test]
    fn a_prefix_is_covered_only_by_a_pattern_for_all_of_it() {
        let s = Scopes::new(["room-17/*", "room-18/alice"], ["*"]);
        assert!(s.covers(Need::Read, b"room-17/"));
        assert!(s.covers(Need::Read, b"room-17/a/"));
        assert!(!s.covers(Need::Read, b"room-1/"));
        assert!(!s.covers(Need::Read, b""), "the empty prefix needs `*`");
        assert!(
            !s.covers(Need::Read, b"room-18/"),
            "an exact key covers no prefix"
        );
        assert!(s.covers(Need::Write, b""));
        let half = Scopes::new(["room-17/a*"], []);
        assert!(!half.covers(Need::Read, b"room-17/"), "only part of it");
    }

    #[test]
    fn read_and_write_are_apart() {
        let s = Scopes::new(["room-17/*"], ["room-17/alice"]);
        assert!(s.allows(Need::Read, b"room-17/bob"));
        assert!(!s.allows(Need::Write, b"room-17/bob"));
        assert!(s.allows(Need::Write, b"room-17/alice"));
        assert!(!s.allows(Need::Read, b"room-18/x"));
        let w = Scopes::new([], ["*"]);
        assert!(!w.allows(Need::Read, b"a"), "write does not imply read");
        assert!(Scopes::default().read.is_empty());
        assert!(Scopes::everything().allows(Need::Write, b"anything"));
        // A bad pattern in a signed token grants nothing.
        assert!(!Scopes::new(["a*b"], []).allows(Need::Read, b"a*b"));
    }
}
