//! Request bytes. Everything that does not change per request (request lines' fixed
//! parts, headers, `Content-Length`, the cargo padding) is rendered once in
//! [`Requests::new`]; per request only the key, a value and a player are copied into the
//! connection's reused output buffer, so sending allocates nothing.
//!
//! Every message has exactly `--body-bytes` bytes (or the smallest message, if that is
//! less): `{"key":"lg-7","value":1234567,"player":"p-123","cargo":{...}}`. Values
//! (7 digits) and players (3 digits) have a fixed width, and keys shorter than the
//! longest are followed by JSON whitespace, so the body length — and the
//! `Content-Length` header — is the same for every message.
//!
//! With `--rooms R` each key lives in a room (a prefix, docs/http.md#rooms): key `n` is
//! `room-<n % R>/lg-<n>` ([`KeyNames`]).

use crate::keys::{KeySampler, Rng};

/// Longest possible key name: `room-`, ten digits, `/`, `lg-` and ten digits.
pub const MAX_KEY_NAME: usize = 5 + 10 + 1 + 3 + 10;

/// How key indices are named: `lg-<n>`, or with rooms `room-<n % rooms>/lg-<n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyNames {
    /// 0: no rooms.
    pub rooms: u32,
}

impl KeyNames {
    /// Writes the name of key `index` into `buf`, returning its length.
    #[inline]
    pub fn write(self, index: u32, buf: &mut [u8; MAX_KEY_NAME]) -> usize {
        let mut at = 0;
        let mut digits = itoa::Buffer::new();
        if self.rooms > 0 {
            buf[..5].copy_from_slice(b"room-");
            let d = digits.format(index % self.rooms).as_bytes();
            buf[5..5 + d.len()].copy_from_slice(d);
            buf[5 + d.len()] = b'/';
            at = 6 + d.len();
        }
        buf[at..at + 3].copy_from_slice(b"lg-");
        let d = digits.format(index).as_bytes();
        buf[at + 3..at + 3 + d.len()].copy_from_slice(d);
        at + 3 + d.len()
    }

    /// The index of the key named `name` when it is one of the `keys` this naming gives.
    pub fn index_of(self, name: &[u8], keys: u32) -> Option<u32> {
        let at = name.windows(3).rposition(|w| w == b"lg-")? + 3;
        let digits = &name[at..];
        if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let index: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        let mut again = [0u8; MAX_KEY_NAME];
        let n = self.write(index, &mut again);
        (index < keys && &again[..n] == name).then_some(index)
    }

    /// Length of the longest name of `keys` keys.
    fn widest(self, keys: u32) -> usize {
        let last = keys.saturating_sub(1);
        let digits = |n: u32| itoa::Buffer::new().format(n).len();
        let room = if self.rooms > 0 {
            6 + digits(self.rooms.min(keys.max(1)) - 1)
        } else {
            0
        };
        room + 3 + digits(last)
    }
}

/// Pre-rendered pieces of every request the generator sends.
#[derive(Debug, Clone)]
pub struct Requests {
    /// ` HTTP/1.1\r\nHost: ...\r\n\r\n`, after a poll's path.
    poll_tail: Vec<u8>,
    /// ` HTTP/1.1\r\n` and headers of a single ingest, `Content-Length` included.
    ingest_tail: Vec<u8>,
    /// `&wait_ms=N HTTP/1.1\r\n...`, after a long-poll's `after=` value.
    longpoll_tail: Vec<u8>,
    /// `&wait_ms=N`, after a many-box long-poll's keys.
    wait_query: Vec<u8>,
    /// ` HTTP/1.1\r\nHost: ...\r\n`: a request line's end and the headers every
    /// many-box request has; `If-None-Match` and the blank line follow.
    many_tail: Vec<u8>,
    /// The whole head of a batch request.
    batch_head: Vec<u8>,
    /// Head of a batch request up to its `Content-Length` value (for other sizes).
    batch_head_open: Vec<u8>,
    /// `","cargo":{...}` or just `"` when the body is too small for cargo.
    message_tail: Vec<u8>,
    /// Width of the longest key name, for the whitespace that evens bodies out.
    key_width: usize,
    names: KeyNames,
    /// Length of every message.
    message_len: usize,
    batch_size: usize,
}

const MESSAGE_KEY: &[u8] = b"{\"key\":\"";
const MESSAGE_VALUE: &[u8] = b"\",\"value\":";
const MESSAGE_PLAYER: &[u8] = b",\"player\":\"p-";
const MESSAGE_CARGO: &[u8] = b"\",\"cargo\":";
const VALUE_DIGITS: usize = 7;
const PLAYER_DIGITS: usize = 3;
const SPACES: &[u8; MAX_KEY_NAME] = &[b' '; MAX_KEY_NAME];

impl Requests {
    /// Renders the fixed parts for a server at `host` (the `Host` header value), for
    /// keys named by `names`.
    pub fn new(
        host: &str,
        keys: u32,
        names: KeyNames,
        body_bytes: usize,
        batch_size: usize,
        longpoll_wait_ms: u64,
        token: Option<&str>,
    ) -> Requests {
        let key_width = names.widest(keys);

        // Everything of a message but the cargo: key, value, player, braces.
        let bare = MESSAGE_KEY.len()
            + key_width
            + MESSAGE_VALUE.len()
            + VALUE_DIGITS
            + MESSAGE_PLAYER.len()
            + PLAYER_DIGITS
            + 1 // closing quote of the player
            + 1; // closing brace
        let with_cargo_field = bare - 1 + MESSAGE_CARGO.len();
        let message_tail = if body_bytes >= with_cargo_field + 2 {
            let mut tail = MESSAGE_CARGO.to_vec();
            tail.extend_from_slice(&cargo_json(body_bytes - with_cargo_field));
            tail
        } else {
            b"\"".to_vec()
        };
        let message_len = bare - 1 + message_tail.len();

        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let poll_tail = format!(" HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
        let ingest_tail = format!(
            " HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: {message_len}\r\n\r\n"
        )
        .into_bytes();
        let longpoll_tail =
            format!("&wait_ms={longpoll_wait_ms} HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
        let wait_query = format!("&wait_ms={longpoll_wait_ms}").into_bytes();
        let many_tail = format!(" HTTP/1.1\r\nHost: {host}\r\n").into_bytes();
        let batch_head_open = format!(
            "POST /v1/ingest HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}Content-Length: "
        )
        .into_bytes();
        let batch_size = batch_size.max(1);
        let mut batch_head = batch_head_open.clone();
        batch_head.extend_from_slice(
            format!("{}\r\n\r\n", batch_body_len(batch_size, message_len)).as_bytes(),
        );
        Requests {
            poll_tail,
            ingest_tail,
            longpoll_tail,
            wait_query,
            many_tail,
            batch_head,
            batch_head_open,
            message_tail,
            key_width,
            names,
            message_len,
            batch_size,
        }
    }

    /// Length of every message body.
    pub fn message_len(&self) -> usize {
        self.message_len
    }

    /// Messages per batch request.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// How keys are named.
    pub fn names(&self) -> KeyNames {
        self.names
    }

    /// Writes the name of key `index` into `buf`, returning its length.
    #[inline]
    pub fn key_name(&self, index: u32, buf: &mut [u8; MAX_KEY_NAME]) -> usize {
        self.names.write(index, buf)
    }

    /// `GET /v1/boxes/{key}`.
    #[inline]
    pub fn write_poll(&self, out: &mut Vec<u8>, key: u32) {
        let mut name = [0u8; MAX_KEY_NAME];
        let n = self.key_name(key, &mut name);
        out.extend_from_slice(b"GET /v1/boxes/");
        out.extend_from_slice(&name[..n]);
        out.extend_from_slice(&self.poll_tail);
    }

    /// `GET /v1/boxes/{key}?after={after}&wait_ms=N`.
    #[inline]
    pub fn write_longpoll(&self, out: &mut Vec<u8>, key: u32, after: u64) {
        let mut name = [0u8; MAX_KEY_NAME];
        let n = self.key_name(key, &mut name);
        out.extend_from_slice(b"GET /v1/boxes/");
        out.extend_from_slice(&name[..n]);
        out.extend_from_slice(b"?after=");
        out.extend_from_slice(itoa::Buffer::new().format(after).as_bytes());
        out.extend_from_slice(&self.longpoll_tail);
    }

    /// `GET /v1/boxes?keys={keys}` (the keys' names comma-separated, in order), with
    /// `If-None-Match: {etag}` when there is one. Key names (`lg-<n>`) are made of
    /// characters that percent-encoding leaves as they are, as in every other route.
    #[inline]
    pub fn write_poll_many(&self, out: &mut Vec<u8>, keys: &[u32], etag: Option<&[u8]>) {
        self.write_many(out, keys, false, etag);
    }

    /// `GET /v1/boxes?keys={keys}&wait_ms=N`, with `If-None-Match: {etag}` when there
    /// is one (without it the server answers at once).
    #[inline]
    pub fn write_longpoll_many(&self, out: &mut Vec<u8>, keys: &[u32], etag: Option<&[u8]>) {
        self.write_many(out, keys, true, etag);
    }

    #[inline]
    fn write_many(&self, out: &mut Vec<u8>, keys: &[u32], wait: bool, etag: Option<&[u8]>) {
        out.extend_from_slice(b"GET /v1/boxes?keys=");
        for (i, &key) in keys.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let mut name = [0u8; MAX_KEY_NAME];
            let n = self.key_name(key, &mut name);
            out.extend_from_slice(&name[..n]);
        }
        if wait {
            out.extend_from_slice(&self.wait_query);
        }
        out.extend_from_slice(&self.many_tail);
        if let Some(etag) = etag {
            out.extend_from_slice(b"If-None-Match: ");
            out.extend_from_slice(etag);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }

    /// `POST /v1/boxes/{key}` with one message for that key.
    #[inline]
    pub fn write_ingest(&self, out: &mut Vec<u8>, key: u32, rng: &mut Rng) {
        let mut name = [0u8; MAX_KEY_NAME];
        let n = self.key_name(key, &mut name);
        out.extend_from_slice(b"POST /v1/boxes/");
        out.extend_from_slice(&name[..n]);
        out.extend_from_slice(&self.ingest_tail);
        self.write_message(out, &name[..n], rng);
    }

    /// `POST /v1/ingest` with `--batch-size` messages, each for a key from `keys`.
    #[inline]
    pub fn write_batch(&self, out: &mut Vec<u8>, keys: &KeySampler, rng: &mut Rng) {
        out.extend_from_slice(&self.batch_head);
        out.push(b'[');
        for i in 0..self.batch_size {
            if i > 0 {
                out.push(b',');
            }
            let mut name = [0u8; MAX_KEY_NAME];
            let n = self.key_name(keys.sample(rng), &mut name);
            self.write_message(out, &name[..n], rng);
        }
        out.push(b']');
    }

    /// `POST /v1/ingest` with one message for each key in `first..first + count`
    /// (used to pre-seed boxes).
    pub fn write_batch_for_keys(&self, out: &mut Vec<u8>, first: u32, count: u32, rng: &mut Rng) {
        out.extend_from_slice(&self.batch_head_open);
        let len = batch_body_len(count as usize, self.message_len);
        out.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
        out.extend_from_slice(b"\r\n\r\n[");
        for i in 0..count {
            if i > 0 {
                out.push(b',');
            }
            let mut name = [0u8; MAX_KEY_NAME];
            let n = self.key_name(first + i, &mut name);
            self.write_message(out, &name[..n], rng);
        }
        out.push(b']');
    }

    #[inline]
    fn write_message(&self, out: &mut Vec<u8>, key: &[u8], rng: &mut Rng) {
        out.extend_from_slice(MESSAGE_KEY);
        out.extend_from_slice(key);
        out.extend_from_slice(MESSAGE_VALUE);
        // Fixed widths keep every body the same length.
        out.extend_from_slice(&fixed_digits::<VALUE_DIGITS>(
            1_000_000 + rng.below(9_000_000),
        ));
        out.extend_from_slice(MESSAGE_PLAYER);
        out.extend_from_slice(&fixed_digits::<PLAYER_DIGITS>(100 + rng.below(900)));
        out.extend_from_slice(&self.message_tail);
        out.extend_from_slice(&SPACES[..self.key_width.saturating_sub(key.len())]);
        out.push(b'}');
    }
}

fn batch_body_len(messages: usize, message_len: usize) -> usize {
    2 + messages * message_len + messages.saturating_sub(1)
}

/// The low `N` decimal digits of `value`, zero-padded.
#[inline]
fn fixed_digits<const N: usize>(mut value: u32) -> [u8; N] {
    let mut digits = [b'0'; N];
    for d in digits.iter_mut().rev() {
        *d = b'0' + (value % 10) as u8;
        value /= 10;
    }
    digits
}

/// A JSON value of exactly `len` bytes (`len` ≥ 2) made of nested objects, arrays,
/// numbers and strings, the kind of cargo a real producer sends along and the server's
/// projection must skip.
pub fn cargo_json(len: usize) -> Vec<u8> {
    const OPEN: &[u8] = b"{\"items\":[";
    const NOTE: &[u8] = b"],\"note\":\"";
    const CLOSE: &[u8] = b"\"}";
    let frame = OPEN.len() + NOTE.len() + CLOSE.len();
    if len < frame {
        // Too small for the nested form: a plain string.
        let mut s = vec![b'"'];
        s.resize(len.max(2) - 1, b'x');
        s.push(b'"');
        return s;
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(OPEN);
    let mut id = 0u32;
    loop {
        let item = format!(
            "{}{{\"id\":{id},\"tags\":[\"alpha\",\"beta\"],\"pos\":{{\"x\":1.5,\"y\":-2,\"ok\":true}}}}",
            if id > 0 { "," } else { "" }
        );
        // Leave the string at the end at least a few bytes so it can take up the rest.
        if out.len() + item.len() + NOTE.len() + CLOSE.len() + 8 > len {
            break;
        }
        out.extend_from_slice(item.as_bytes());
        id += 1;
    }
    out.extend_from_slice(NOTE);
    out.resize(len - CLOSE.len(), b'x');
    out.extend_from_slice(CLOSE);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::KeyDist;

    fn split_body(request: &[u8]) -> (&[u8], &[u8]) {
        let end = request
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("head end");
        (&request[..end + 4], &request[end + 4..])
    }

    fn content_length(head: &[u8]) -> usize {
        let head = std::str::from_utf8(head).unwrap();
        let line = head
            .lines()
            .find(|l| l.starts_with("Content-Length: "))
            .expect("content-length");
        line["Content-Length: ".len()..].parse().unwrap()
    }

    #[test]
    fn cargo_is_valid_json_of_the_exact_length() {
        for len in [2usize, 3, 10, 23, 24, 40, 80, 100, 512, 4096] {
            let cargo = cargo_json(len);
            assert_eq!(cargo.len(), len, "len {len}");
            let v: serde_json::Value = serde_json::from_slice(&cargo).expect("json");
            if len >= 200 {
                assert!(v["items"].as_array().unwrap().len() >= 2, "nested at {len}");
            }
        }
    }

    #[test]
    fn ingest_bodies_have_the_requested_size_for_every_key() {
        let requests = Requests::new("h:1", 1000, KeyNames::default(), 512, 10, 1000, None);
        assert_eq!(requests.message_len(), 512);
        let mut rng = Rng::new(1);
        for key in [0u32, 7, 99, 999] {
            let mut out = Vec::new();
            requests.write_ingest(&mut out, key, &mut rng);
            let (head, body) = split_body(&out);
            assert!(head.starts_with(format!("POST /v1/boxes/lg-{key} HTTP/1.1\r\n").as_bytes()));
            assert_eq!(content_length(head), body.len());
            assert_eq!(body.len(), 512);
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["key"], format!("lg-{key}"));
            let value = v["value"].as_i64().unwrap();
            assert!((1_000_000..10_000_000).contains(&value));
            assert!(v["player"].as_str().unwrap().starts_with("p-"));
            assert!(v["cargo"].is_object());
        }
    }

    #[test]
    fn keys_in_rooms_are_named_and_read_back() {
        let names = KeyNames { rooms: 10 };
        let mut buf = [0u8; MAX_KEY_NAME];
        let n = names.write(1234, &mut buf);
        assert_eq!(&buf[..n], b"room-4/lg-1234");
        assert_eq!(names.index_of(b"room-4/lg-1234", 2000), Some(1234));
        assert_eq!(
            names.index_of(b"room-4/lg-1234", 1000),
            None,
            "not a key of the run"
        );
        assert_eq!(
            names.index_of(b"room-5/lg-1234", 2000),
            None,
            "another room"
        );
        assert_eq!(names.index_of(b"lg-1234", 2000), None);
        let plain = KeyNames::default();
        let n = plain.write(u32::MAX, &mut buf);
        assert_eq!(&buf[..n], b"lg-4294967295");
        assert_eq!(plain.index_of(b"lg-7", 8), Some(7));
        assert_eq!(plain.index_of(b"lg-07", 8), None);
        assert_eq!(plain.index_of(b"lg-", 8), None);
        let n = KeyNames { rooms: u32::MAX }.write(u32::MAX - 1, &mut buf);
        assert_eq!(n, MAX_KEY_NAME);

        // Every body has the same length whatever its key's room.
        let requests = Requests::new("h:1", 1000, KeyNames { rooms: 7 }, 300, 1, 1000, None);
        let mut rng = Rng::new(2);
        for key in [0u32, 6, 7, 999] {
            let mut out = Vec::new();
            requests.write_ingest(&mut out, key, &mut rng);
            let (head, body) = split_body(&out);
            let name = format!("room-{}/lg-{key}", key % 7);
            assert!(head.starts_with(format!("POST /v1/boxes/{name} HTTP/1.1\r\n").as_bytes()));
            assert_eq!((content_length(head), body.len()), (300, 300));
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["key"], name);
        }
    }

    #[test]
    fn tiny_bodies_drop_the_cargo() {
        let requests = Requests::new("h:1", 10, KeyNames::default(), 1, 1, 1000, None);
        let mut out = Vec::new();
        requests.write_ingest(&mut out, 3, &mut Rng::new(1));
        let (head, body) = split_body(&out);
        assert_eq!(content_length(head), body.len());
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert!(v.get("cargo").is_none());
        assert_eq!(v["key"], "lg-3");
    }

    #[test]
    fn batches_are_arrays_of_messages() {
        let requests = Requests::new("h:1", 100, KeyNames::default(), 200, 5, 1000, Some("tok"));
        let keys = KeySampler::new(KeyDist::Uniform, 100, 0.0);
        let mut out = Vec::new();
        requests.write_batch(&mut out, &keys, &mut Rng::new(9));
        let (head, body) = split_body(&out);
        assert!(head.starts_with(b"POST /v1/ingest HTTP/1.1\r\n"));
        assert!(std::str::from_utf8(head)
            .unwrap()
            .contains("Authorization: Bearer tok\r\n"));
        assert_eq!(content_length(head), body.len());
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let items = v.as_array().unwrap();
        assert_eq!(items.len(), 5);
        for item in items {
            assert!(item["key"].as_str().unwrap().starts_with("lg-"));
        }

        let mut out = Vec::new();
        requests.write_batch_for_keys(&mut out, 10, 3, &mut Rng::new(9));
        let (head, body) = split_body(&out);
        assert_eq!(content_length(head), body.len());
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let keys: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["key"].as_str().unwrap())
            .collect();
        assert_eq!(keys, ["lg-10", "lg-11", "lg-12"]);
    }

    #[test]
    fn polls_and_longpolls() {
        let requests = Requests::new("127.0.0.1:8080", 10, KeyNames::default(), 512, 1, 250, None);
        let mut out = Vec::new();
        requests.write_poll(&mut out, 4);
        assert_eq!(
            out,
            b"GET /v1/boxes/lg-4 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n".to_vec()
        );
        out.clear();
        requests.write_longpoll(&mut out, 4, 17);
        assert_eq!(
            out,
            b"GET /v1/boxes/lg-4?after=17&wait_ms=250 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
                .to_vec()
        );
    }

    #[test]
    fn polls_and_longpolls_of_many_boxes() {
        let requests = Requests::new(
            "127.0.0.1:8080",
            1000,
            KeyNames::default(),
            512,
            1,
            250,
            Some("tok"),
        );
        let mut out = Vec::new();
        requests.write_poll_many(&mut out, &[4, 0, 999], None);
        assert_eq!(
            out,
            b"GET /v1/boxes?keys=lg-4,lg-0,lg-999 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
                .to_vec()
        );
        // Appends to what the buffer holds (pipelined requests).
        requests.write_poll_many(&mut out, &[7], Some(b"\"123\""));
        let second: &[u8] =
            b"GET /v1/boxes?keys=lg-7 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nIf-None-Match: \"123\"\r\n\r\n";
        assert!(out.starts_with(b"GET /v1/boxes?keys=lg-4,lg-0,lg-999 HTTP/1.1\r\n"));
        assert!(out.ends_with(second));
        assert_eq!(out.len(), 70 + second.len());
        out.clear();
        requests.write_longpoll_many(&mut out, &[1, 2], Some(b"\"9\""));
        assert_eq!(
            out,
            b"GET /v1/boxes?keys=lg-1,lg-2&wait_ms=250 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nIf-None-Match: \"9\"\r\n\r\n"
                .to_vec()
        );
        out.clear();
        requests.write_longpoll_many(&mut out, &[1, 2], None);
        assert_eq!(
            out,
            b"GET /v1/boxes?keys=lg-1,lg-2&wait_ms=250 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
                .to_vec()
        );
        // httparse reads it as one request with the query and header intact.
        let mut headers = [httparse::EMPTY_HEADER; 4];
        let mut req = httparse::Request::new(&mut headers);
        out.clear();
        requests.write_poll_many(&mut out, &[3, 5], Some(b"\"1\""));
        assert_eq!(req.parse(&out), Ok(httparse::Status::Complete(out.len())));
        assert_eq!(req.path, Some("/v1/boxes?keys=lg-3,lg-5"));
        assert_eq!(req.headers[1].name, "If-None-Match");
    }
}
