//! CORS (docs/http.md#cors): which origins' pages may call pollbox from a browser, and
//! the header lines their answers carry, rendered once at start so an answer
//! copies one slice (no allocation on the poll path).
//!
//! - An answer to a request whose `Origin` is allowed carries
//!   `Access-Control-Allow-Origin` (the origin, or `*` when `["*"]` is
//!   configured), `Vary: Origin` and `Access-Control-Expose-Headers: ETag` (so
//!   a page can read the ETag it polls with).
//! - A request from any other origin (or with no `Origin`) is answered as
//!   without CORS: no such header, so the browser refuses the answer to the
//!   page.
//! - A preflight (`OPTIONS`) from an allowed origin gets 204 with
//!   [`PREFLIGHT`]; from any other origin 403.

/// The fields a preflight from an allowed origin gets besides the lines of
/// [`Cors::lines`]: every method and request header pollbox serves. Browsers
/// cache the answer for `Access-Control-Max-Age` seconds (10 minutes; Chromium
/// caps it at 2 hours).
pub const PREFLIGHT: &[(&[u8], &[u8])] = &[
    (b"Access-Control-Allow-Methods", b"GET, HEAD, POST, DELETE"),
    (
        b"Access-Control-Allow-Headers",
        b"Authorization, Content-Type, If-None-Match, Last-Event-ID",
    ),
    (b"Access-Control-Max-Age", b"600"),
];

/// The allowed origins with their pre-rendered header lines.
#[derive(Debug, Default)]
pub struct Cors {
    /// `*` is one entry matching any origin.
    origins: Vec<Origin>,
}

/// One allowed origin, as configured, and the lines answers to it carry.
#[derive(Debug)]
struct Origin {
    name: Box<[u8]>,
    lines: Box<[u8]>,
}

/// Which origin's lines an answer carries (an index into [`Cors`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowed(usize);

impl Cors {
    /// From `http.cors_origins` (validated: `*` alone, or lower-case origins).
    pub fn new(origins: &[String]) -> Cors {
        Cors::with_credentials(origins, false)
    }

    /// With `credentials` (cookie tokens, docs/private-boxes.md): answers to
    /// a listed origin also say `Access-Control-Allow-Credentials: true`, so
    /// a page's `EventSource` with `withCredentials` sends its cookie; never
    /// to `*`, which browsers refuse with credentials anyway.
    pub fn with_credentials(origins: &[String], credentials: bool) -> Cors {
        let origins = origins
            .iter()
            .map(|o| {
                let mut lines = Vec::with_capacity(128);
                lines.extend_from_slice(b"Access-Control-Allow-Origin: ");
                lines.extend_from_slice(o.as_bytes());
                lines.extend_from_slice(
                    b"\r\nVary: Origin\r\nAccess-Control-Expose-Headers: ETag\r\n",
                );
                if credentials && o != "*" {
                    lines.extend_from_slice(b"Access-Control-Allow-Credentials: true\r\n");
                }
                Origin {
                    name: o.as_bytes().into(),
                    lines: lines.into_boxed_slice(),
                }
            })
            .collect();
        Cors { origins }
    }

    /// Whether any origin is allowed (`OPTIONS` is then a preflight).
    pub fn enabled(&self) -> bool {
        !self.origins.is_empty()
    }

    /// The allowed origin a request's `Origin` field names, if any. Browsers
    /// send origins in lower case; a client that does not is matched anyway.
    #[inline]
    pub fn allow(&self, origin: Option<&[u8]>) -> Option<Allowed> {
        let origin = origin?;
        self.origins
            .iter()
            .position(|o| &*o.name == b"*" || o.name.eq_ignore_ascii_case(origin))
            .map(Allowed)
    }

    /// The header lines (each ending in CRLF) of an answer to `allowed`.
    #[inline]
    pub fn lines(&self, allowed: Allowed) -> &[u8] {
        self.origins.get(allowed.0).map_or(&[], |o| &o.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(c: &Cors, origin: &[u8]) -> Option<String> {
        c.allow(Some(origin))
            .map(|a| String::from_utf8(c.lines(a).to_vec()).unwrap())
    }

    #[test]
    fn exact_origins_are_echoed_with_vary_and_expose() {
        let c = Cors::new(&[
            "https://game.example".into(),
            "http://localhost:5173".into(),
        ]);
        assert!(c.enabled());
        assert_eq!(
            lines(&c, b"https://game.example").as_deref(),
            Some(
                "Access-Control-Allow-Origin: https://game.example\r\nVary: Origin\r\n\
                 Access-Control-Expose-Headers: ETag\r\n"
            )
        );
        assert!(lines(&c, b"http://localhost:5173")
            .unwrap()
            .starts_with("Access-Control-Allow-Origin: http://localhost:5173\r\n"));
        assert!(lines(&c, b"HTTPS://GAME.EXAMPLE").is_some());
        for other in [
            &b"https://game.example.evil"[..],
            b"http://game.example",
            b"https://game.example:443",
            b"null",
            b"",
        ] {
            assert_eq!(lines(&c, other), None, "{}", String::from_utf8_lossy(other));
        }
        assert_eq!(c.allow(None), None);
    }

    #[test]
    fn star_allows_any_origin_and_answers_star() {
        let c = Cors::new(&["*".into()]);
        assert_eq!(
            lines(&c, b"https://anything.example").as_deref(),
            Some("Access-Control-Allow-Origin: *\r\nVary: Origin\r\nAccess-Control-Expose-Headers: ETag\r\n")
        );
        assert_eq!(c.allow(None), None, "no Origin: not a CORS request");
    }

    #[test]
    fn credentials_for_listed_origins_only() {
        let c = Cors::with_credentials(&["https://game.example".into()], true);
        assert!(lines(&c, b"https://game.example")
            .unwrap()
            .ends_with("Access-Control-Allow-Credentials: true\r\n"));
        let star = Cors::with_credentials(&["*".into()], true);
        assert!(!lines(&star, b"https://game.example")
            .unwrap()
            .contains("Credentials"));
        let off = Cors::with_credentials(&["https://game.example".into()], false);
        assert!(!lines(&off, b"https://game.example")
            .unwrap()
            .contains("Credentials"));
    }

    #[test]
    fn nothing_configured_is_off() {
        let c = Cors::new(&[]);
        assert!(!c.enabled());
        assert_eq!(c.allow(Some(b"https://game.example")), None);
    }
}
