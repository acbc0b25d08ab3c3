//! Response heads: the status line and the headers every pollbox response carries
//! (`Date`, `Content-Type`, `Content-Length`: docs/http.md#protocol), written into
//! a reused buffer without allocating when it has the capacity.

use super::Version;

/// The interim response a server writes when [`super::Progress::Partial`]
/// says `send_continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Reason phrase for a status code (RFC 9110 §15); empty for codes pollbox
/// never sends (the status line stays valid: the phrase may be empty).
pub fn status_reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "",
    }
}

/// What a response head says: its status, the content's type and length, the
/// `Date`, and whether the connection stays open for a client of `version`.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    /// Written as given, so it must be a three-digit code.
    pub status: u16,
    /// Left out of the head when empty.
    pub content_type: &'a [u8],
    pub content_length: usize,
    pub date: &'a [u8],
    pub keep_alive: bool,
    pub version: Version,
}

/// Append a response head to `out`:
///
/// ```text
/// HTTP/1.1 <code> <reason>\r\n
/// Date: <date>\r\n
/// Content-Type: <content_type>\r\n      (left out when content_type is empty)
/// Content-Length: <content_length>\r\n  (left out for 204: RFC 9110 §8.6)
/// Connection: close\r\n                 (when !keep_alive)
/// Connection: keep-alive\r\n            (when keep_alive and the client is HTTP/1.0)
/// <name>: <value>\r\n ...               (extra_headers, in order)
/// \r\n
/// ```
///
/// The status line always says HTTP/1.1 (RFC 9110 §6.2: a server sends its own
/// version); `version` only decides whether keep-alive must be spelled out.
/// Allocates only if `out` lacks the capacity.
pub fn write_response_head(
    out: &mut Vec<u8>,
    head: &ResponseHead<'_>,
    extra_headers: &[(&[u8], &[u8])],
) {
    write_response_start(out, head);
    write_head_end(out, extra_headers);
}

/// A response head up to its extra fields: what [`write_response_head`]
/// writes before `extra_headers` and the blank line.
pub fn write_response_start(out: &mut Vec<u8>, head: &ResponseHead<'_>) {
    let &ResponseHead {
        status,
        content_type,
        content_length,
        date,
        keep_alive,
        version,
    } = head;
    let mut num = itoa::Buffer::new();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(num.format(status).as_bytes());
    out.push(b' ');
    out.extend_from_slice(status_reason(status).as_bytes());
    out.extend_from_slice(b"\r\nDate: ");
    out.extend_from_slice(date);
    if !content_type.is_empty() {
        out.extend_from_slice(b"\r\nContent-Type: ");
        out.extend_from_slice(content_type);
    }
    // A 204 has no content and must not say a length (RFC 9110 §8.6).
    if status != 204 {
        out.extend_from_slice(b"\r\nContent-Length: ");
        out.extend_from_slice(num.format(content_length).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if version == Version::Http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
}

/// The end of a response head: `extra_headers`, then the blank line. For
/// callers that wrote the start of the head themselves (a cached prefix).
pub fn write_head_end(out: &mut Vec<u8>, extra_headers: &[(&[u8], &[u8])]) {
    write_fields(out, extra_headers);
    out.extend_from_slice(b"\r\n");
}

/// `name: value\r\n` for each field, in order.
pub fn write_fields(out: &mut Vec<u8>, fields: &[(&[u8], &[u8])]) {
    for (name, value) in fields {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

    /// A keep-alive HTTP/1.1 head of `status` with no content.
    fn empty(status: u16) -> ResponseHead<'static> {
        ResponseHead {
            status,
            content_type: b"",
            content_length: 0,
            date: DATE,
            keep_alive: true,
            version: Version::Http11,
        }
    }

    fn head(status: u16, keep_alive: bool, version: Version, extra: &[(&[u8], &[u8])]) -> String {
        let mut out = Vec::new();
        let h = ResponseHead {
            status,
            content_type: b"application/json",
            content_length: 42,
            date: DATE,
            keep_alive,
            version,
        };
        write_response_head(&mut out, &h, extra);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn http11_keep_alive_has_no_connection_header() {
        assert_eq!(
            head(200, true, Version::Http11, &[]),
            "HTTP/1.1 200 OK\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\
             Content-Type: application/json\r\nContent-Length: 42\r\n\r\n"
        );
    }

    #[test]
    fn close_is_spelled_out_for_both_versions() {
        for v in [Version::Http10, Version::Http11] {
            let h = head(400, false, v, &[]);
            assert!(h.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{h}");
            assert!(
                h.ends_with("Content-Length: 42\r\nConnection: close\r\n\r\n"),
                "{h}"
            );
        }
    }

    #[test]
    fn http10_keep_alive_is_spelled_out() {
        let h = head(200, true, Version::Http10, &[]);
        assert!(
            h.ends_with("Content-Length: 42\r\nConnection: keep-alive\r\n\r\n"),
            "{h}"
        );
    }

    #[test]
    fn extra_headers_come_last_in_order() {
        let h = head(
            405,
            true,
            Version::Http11,
            &[(b"Allow", b"GET, HEAD"), (b"ETag", b"\"7\"")],
        );
        assert!(
            h.ends_with("Content-Length: 42\r\nAllow: GET, HEAD\r\nETag: \"7\"\r\n\r\n"),
            "{h}"
        );
        assert!(h.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"));
    }

    #[test]
    fn empty_content_type_is_left_out() {
        let mut out = Vec::new();
        write_response_head(&mut out, &empty(304), &[]);
        let h = String::from_utf8(out).unwrap();
        assert!(!h.contains("Content-Type"), "{h}");
        assert!(h.contains("Content-Length: 0\r\n"), "{h}");
    }

    #[test]
    fn no_content_has_no_length_and_no_type() {
        let mut out = Vec::new();
        write_response_head(&mut out, &empty(204), &[]);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 204 No Content\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n\r\n"
        );
    }

    #[test]
    fn appends_and_does_not_reallocate_with_capacity() {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(b"previous");
        let ptr = out.as_ptr();
        let h = ResponseHead {
            content_type: b"text/plain",
            content_length: 2,
            ..empty(200)
        };
        write_response_head(&mut out, &h, &[]);
        assert_eq!(out.as_ptr(), ptr);
        assert!(out.starts_with(b"previousHTTP/1.1 200 OK\r\n"));
    }

    #[test]
    fn every_status_pollbox_sends_has_a_reason() {
        for code in [
            100, 200, 204, 304, 400, 401, 403, 404, 405, 408, 413, 422, 431, 501, 503, 505, 507,
        ] {
            assert!(!status_reason(code).is_empty(), "{code}");
        }
        for e in crate::http::HttpError::ALL {
            assert!(!status_reason(e.status()).is_empty(), "{e:?}");
        }
        assert_eq!(status_reason(299), "");
        assert!(head(299, true, Version::Http11, &[]).starts_with("HTTP/1.1 299 \r\n"));
    }

    #[test]
    fn continue_is_a_complete_interim_response() {
        assert_eq!(CONTINUE, b"HTTP/1.1 100 Continue\r\n\r\n");
    }
}
