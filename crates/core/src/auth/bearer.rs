//! Bearer tokens for ingest and `/metrics` (`auth.ingest_tokens`,
//! `auth.metrics_tokens`), compared in constant time.
//!
//! What it is not: tokens with scopes (signed: [`super::token`]; static:
//! `[[auth.token]]`, in [`super::Access`]).

/// The configured tokens; empty means ingest needs none.
pub struct Tokens(Vec<Vec<u8>>);

impl Tokens {
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a String>) -> Tokens {
        Tokens(tokens.into_iter().map(|t| t.as_bytes().to_vec()).collect())
    }

    /// Whether a request with this `Authorization` value may ingest.
    pub fn allow(&self, authorization: Option<&[u8]>) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let given = authorization.and_then(|h| {
            let h = h.trim_ascii();
            (h.len() > 7 && h[..7].eq_ignore_ascii_case(b"bearer ")).then(|| h[7..].trim_ascii())
        });
        // Compare against every token, always fully, so timing says nothing.
        given.is_some_and(|g| {
            self.0
                .iter()
                .fold(false, |acc, t| acc | constant_time_eq(g, t))
        })
    }
}

/// Equal-length inputs are compared in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn bearer_tokens() {
        let none = Tokens::new(&[]);
        assert!(none.allow(None));
        let toks = ["s3cret".to_string(), "other".to_string()];
        let t = Tokens::new(&toks);
        assert!(t.allow(Some(b"Bearer s3cret")));
        assert!(t.allow(Some(b" bearer   other ")));
        assert!(!t.allow(Some(b"Bearer nope")));
        assert!(!t.allow(Some(b"Basic s3cret")));
        assert!(!t.allow(Some(b"Bearer ")));
        assert!(!t.allow(None));
    }
}
