//! Reading responses, without I/O: framing one HTTP/1.1 response out of a connection's
//! buffer with httparse, and checking payloads by scanning their bytes (no JSON DOM).

/// Headers read per response; pollbox sends four or five.
const MAX_HEADERS: usize = 24;

/// One framed response, borrowing the connection's input buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Response<'a> {
    /// Bytes of head and body together, to consume from the buffer.
    pub len: usize,
    pub status: u16,
    pub body: &'a [u8],
    /// The server will close the connection after this response.
    pub close: bool,
    /// The `ETag` header's value, quotes included, if there is one.
    pub etag: Option<&'a [u8]>,
}

/// Why a response could not be framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramingError {
    /// httparse refused the head.
    Malformed,
    /// No usable `Content-Length` on a response that has a body (pollbox always sends
    /// one: docs/http.md#protocol).
    NoContentLength,
}

/// Frames the first response in `buf`: `Ok(None)` when more bytes are needed.
#[inline]
pub fn parse_response(buf: &[u8]) -> Result<Option<Response<'_>>, FramingError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(FramingError::Malformed),
    };
    let status = response.code.unwrap_or(0);
    let mut content_length: Option<usize> = None;
    let mut close = response.version == Some(0);
    let mut etag = None;
    for header in response.headers.iter() {
        if header.name.eq_ignore_ascii_case("etag") {
            etag = Some(header.value);
        } else if header.name.eq_ignore_ascii_case("content-length") {
            content_length =
                Some(parse_decimal(header.value).ok_or(FramingError::NoContentLength)?);
        } else if header.name.eq_ignore_ascii_case("connection") {
            if header.value.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if header.value.eq_ignore_ascii_case(b"keep-alive") {
                close = false;
            }
        }
    }
    let body_len = match content_length {
        // No body by definition (RFC 9112 §6.3), whatever Content-Length says:
        // a 304 carries the length the 200 would have had.
        _ if status < 200 || status == 204 || status == 304 => 0,
        Some(n) => n,
        None => return Err(FramingError::NoContentLength),
    };
    let len = head_len + body_len;
    if buf.len() < len {
        return Ok(None);
    }
    Ok(Some(Response {
        len,
        status,
        body: &buf[head_len..len],
        close,
        etag,
    }))
}

/// What is wrong with a body whose status was right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadError {
    /// Not a box payload of this key, or no `"ver":` number.
    Shape,
}

/// Checks that `body` is the payload of box `key` (`{"k":"<key>","ver":N,...}`) and
/// returns N. The fast path matches pollbox's rendering exactly; the slow path accepts
/// the two fields anywhere in the object.
#[inline]
pub fn payload_version(body: &[u8], key: &[u8]) -> Result<u64, PayloadError> {
    const K: &[u8] = b"{\"k\":\"";
    const VER: &[u8] = b"\",\"ver\":";
    if body.len() > K.len() + key.len() + VER.len()
        && body.starts_with(K)
        && &body[K.len()..K.len() + key.len()] == key
        && body[K.len() + key.len()..].starts_with(VER)
    {
        let digits = &body[K.len() + key.len() + VER.len()..];
        return leading_decimal(digits).ok_or(PayloadError::Shape);
    }
    if body.first() != Some(&b'{') {
        return Err(PayloadError::Shape);
    }
    let k = find(body, b"\"k\":\"").ok_or(PayloadError::Shape)? + 5;
    let key_matches =
        body.len() > k + key.len() && &body[k..k + key.len()] == key && body[k + key.len()] == b'"';
    if !key_matches {
        return Err(PayloadError::Shape);
    }
    let ver = find(body, b"\"ver\":").ok_or(PayloadError::Shape)? + 6;
    leading_decimal(&body[ver..]).ok_or(PayloadError::Shape)
}

/// The elements of a JSON array (`[a,b,...]`), each as its bytes without the
/// whitespace around it: the boxes of a many-box answer (`[{"k":...},null,...]`). Only
/// the array's own commas and brackets are found (nested values and strings are
/// skipped whole); nothing is parsed into values. An element that is not followed by
/// `,` or `]`, an empty element, or bytes after the closing `]` end the iteration with
/// one error.
#[derive(Debug, Clone)]
pub struct ArrayItems<'a> {
    body: &'a [u8],
    pos: usize,
    started: bool,
    done: bool,
}

/// The elements of the JSON array `body` ([`ArrayItems`]).
#[inline]
pub fn array_items(body: &[u8]) -> ArrayItems<'_> {
    ArrayItems {
        body,
        pos: 0,
        started: false,
        done: false,
    }
}

impl<'a> ArrayItems<'a> {
    fn fail(&mut self) -> Option<Result<&'a [u8], PayloadError>> {
        self.done = true;
        Some(Err(PayloadError::Shape))
    }

    /// The array closed at `after - 1`: only whitespace may follow.
    fn end(&mut self, after: usize) -> Option<Result<&'a [u8], PayloadError>> {
        if self.body[after..].iter().all(u8::is_ascii_whitespace) {
            self.done = true;
            None
        } else {
            self.fail()
        }
    }
}

impl<'a> Iterator for ArrayItems<'a> {
    type Item = Result<&'a [u8], PayloadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let b = self.body;
        let skip = |mut i: usize| {
            while b.get(i).is_some_and(u8::is_ascii_whitespace) {
                i += 1;
            }
            i
        };
        let mut i = skip(self.pos);
        if !self.started {
            self.started = true;
            if b.get(i) != Some(&b'[') {
                return self.fail();
            }
            i = skip(i + 1);
            if b.get(i) == Some(&b']') {
                return self.end(i + 1);
            }
        } else {
            // After an element: its separator.
            match b.get(i) {
                Some(b',') => i = skip(i + 1),
                Some(b']') => return self.end(i + 1),
                _ => return self.fail(),
            }
        }
        let start = i;
        let mut depth = 0usize;
        let mut in_string = false;
        while i < b.len() {
            let c = b[i];
            if in_string {
                match c {
                    b'\\' => i += 1,
                    b'"' => in_string = false,
                    _ => {}
                }
            } else {
                match c {
                    b'"' => in_string = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' if depth > 0 => depth -= 1,
                    b',' | b']' if depth == 0 => break,
                    b'}' => return self.fail(),
                    _ => {}
                }
            }
            i += 1;
        }
        if i >= b.len() {
            return self.fail();
        }
        let item = b[start..i].trim_ascii_end();
        if item.is_empty() {
            return self.fail();
        }
        self.pos = i;
        Some(Ok(item))
    }
}

/// Reads `accepted` and `rejected` from a batch answer
/// `{"accepted":N,"rejected":M,"errors":[...]}`.
pub fn batch_counts(body: &[u8]) -> Result<(u64, u64), PayloadError> {
    const ACCEPTED: &[u8] = b"\"accepted\":";
    const REJECTED: &[u8] = b"\"rejected\":";
    if body.first() != Some(&b'{') {
        return Err(PayloadError::Shape);
    }
    let a = find(body, ACCEPTED).ok_or(PayloadError::Shape)? + ACCEPTED.len();
    let r = find(body, REJECTED).ok_or(PayloadError::Shape)? + REJECTED.len();
    let accepted = leading_decimal(&body[a..]).ok_or(PayloadError::Shape)?;
    let rejected = leading_decimal(&body[r..]).ok_or(PayloadError::Shape)?;
    Ok((accepted, rejected))
}

/// The whole of `bytes` as a decimal number (surrounding spaces allowed).
fn parse_decimal(bytes: &[u8]) -> Option<usize> {
    let trimmed = bytes.trim_ascii();
    if trimmed.is_empty() || trimmed.len() > 18 || !trimmed.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        trimmed
            .iter()
            .fold(0usize, |n, &d| n * 10 + usize::from(d - b'0')),
    )
}

/// The decimal number at the start of `bytes`, which must end in a non-digit.
fn leading_decimal(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 || digits == bytes.len() {
        return None;
    }
    bytes[..digits].iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_a_response_and_stops_at_its_end() {
        let bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"3\"\r\n\r\nhelloHTTP/1.1 404";
        let r = parse_response(bytes).unwrap().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello");
        assert_eq!(r.etag, Some(&b"\"3\""[..]));
        assert!(!r.close);
        assert_eq!(&bytes[r.len..], b"HTTP/1.1 404");
        assert_eq!(parse_response(&bytes[r.len..]), Ok(None));
    }

    #[test]
    fn partial_heads_and_bodies_wait_for_more() {
        let bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
        for cut in 0..bytes.len() {
            assert_eq!(parse_response(&bytes[..cut]), Ok(None), "cut {cut}");
        }
        assert!(parse_response(bytes).unwrap().is_some());
    }

    #[test]
    fn close_and_bodiless_statuses() {
        let r = parse_response(
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 53\r\nConnection: close\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!((r.status, r.body, r.close), (304, &b""[..], true));
        let r = parse_response(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(r.close, "HTTP/1.0 closes by default");
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\n\r\n"),
            Err(FramingError::NoContentLength)
        );
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
            Err(FramingError::NoContentLength)
        );
        assert_eq!(
            parse_response(b"HTTX/1.1 200\r\n\r\n"),
            Err(FramingError::Malformed)
        );
    }

    #[test]
    fn payload_versions() {
        let body = br#"{"k":"lg-4","ver":12,"v":5,"sum":12,"n":2,"by":"p-7"}"#;
        assert_eq!(payload_version(body, b"lg-4"), Ok(12));
        assert_eq!(payload_version(body, b"lg-40"), Err(PayloadError::Shape));
        assert_eq!(payload_version(body, b"lg-"), Err(PayloadError::Shape));
        // Fields in another order, with spaces.
        let body = br#"{"v":5, "ver":7, "k":"lg-4"}"#;
        assert_eq!(payload_version(body, b"lg-4"), Ok(7));
        for bad in [
            &br#"{"k":"lg-4"}"#[..],
            br#"{"k":"lg-4","ver":}"#,
            br#"{"k":"lg-4","ver":12"#,
            br#"{"error":"nope"}"#,
            b"",
            b"ok",
        ] {
            assert_eq!(payload_version(bad, b"lg-4"), Err(PayloadError::Shape));
        }
    }

    #[test]
    fn many_box_answers_200_and_304() {
        let a = br#"{"k":"lg-1","ver":3,"v":1}"#;
        let c = br#"{"k":"lg-3","ver":12,"v":2,"s":"],{\"x"}"#;
        let body = format!(
            "[{},null,{}]",
            std::str::from_utf8(a).unwrap(),
            std::str::from_utf8(c).unwrap()
        );
        let bytes = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: \"1844674407370955161\"\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let r = parse_response(bytes.as_bytes()).unwrap().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.etag, Some(&b"\"1844674407370955161\""[..]));
        let items: Vec<&[u8]> = array_items(r.body).map(Result::unwrap).collect();
        assert_eq!(items, [&a[..], b"null", &c[..]]);
        assert_eq!(payload_version(items[0], b"lg-1"), Ok(3));
        assert_eq!(payload_version(items[2], b"lg-3"), Ok(12));

        // A 304 has the ETag and no body, whatever its Content-Length says.
        let bytes =
            b"HTTP/1.1 304 Not Modified\r\nETag: \"77\"\r\nContent-Length: 90\r\n\r\nHTTP/1.1 200";
        let r = parse_response(bytes).unwrap().unwrap();
        assert_eq!(
            (r.status, r.body, r.etag),
            (304, &b""[..], Some(&b"\"77\""[..]))
        );
        assert_eq!(&bytes[r.len..], b"HTTP/1.1 200");
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
                .unwrap()
                .unwrap()
                .etag,
            None
        );
    }

    #[test]
    fn array_items_split_only_at_the_top_level() {
        fn items(body: &[u8]) -> Vec<Result<&[u8], PayloadError>> {
            array_items(body).collect()
        }
        assert_eq!(items(b"[]"), vec![]);
        assert_eq!(items(b" [ ] \n"), vec![]);
        assert_eq!(items(b"[null]"), vec![Ok(&b"null"[..])]);
        assert_eq!(
            items(br#"[ {"a":[1,{"b":"]"}]} , null ,[2,3]]"#),
            vec![
                Ok(&br#"{"a":[1,{"b":"]"}]}"#[..]),
                Ok(b"null"),
                Ok(b"[2,3]")
            ]
        );
        assert_eq!(
            items(br#"["a\"],", 1]"#),
            vec![Ok(&br#""a\"],""#[..]), Ok(b"1")]
        );
        let err = Err(PayloadError::Shape);
        for (bad, good) in [
            (&b""[..], 0),
            (b"null", 0),
            (b"{}", 0),
            (b"[", 0),
            (b"[null", 0),
            (b"[null,", 1),
            (b"[null,]", 1),
            (b"[,null]", 0),
            (b"[null}]", 0),
            (b"[null] x", 1),
            (br#"["open]"#, 0),
            (b"[{]", 0),
        ] {
            let got = items(bad);
            assert_eq!(got.len(), good + 1, "{:?}", String::from_utf8_lossy(bad));
            assert_eq!(got[good], err, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn batch_answers() {
        assert_eq!(
            batch_counts(br#"{"accepted":9,"rejected":1,"errors":[{"i":3,"error":"x"}]}"#),
            Ok((9, 1))
        );
        assert_eq!(batch_counts(br#"{"accepted":9}"#), Err(PayloadError::Shape));
        assert_eq!(batch_counts(b"[]"), Err(PayloadError::Shape));
    }
}
