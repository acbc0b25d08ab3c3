//! A typed-serde yardstick for `benches/side-by-side/run.sh`: the ordinary fast way
//! to build what pollbox does in Rust. `may_minihttp` (coroutines on `may`, pipelining,
//! one write per read) answers HTTP; every ingested message is deserialized with
//! `serde_json::from_slice` into a typed struct whose strings borrow from the request
//! buffer (`key`, `player`), the number as an `i64`, and every other member (the cargo)
//! skipped by serde's `IgnoredAny` without being materialized. Payloads are rendered
//! on update (like pollbox), so a poll copies a pre-rendered payload out of a shared
//! `RwLock<HashMap>`.
//!
//! It speaks the HTTP surface `benches/axum-baseline` speaks, so `pollbox load` can
//! drive it and validate its answers: `GET /v1/boxes/{key}` (200 with `ETag`, 304 on a
//! matching `If-None-Match`, 404), `POST /v1/boxes/{key}` (one message), `POST
//! /v1/ingest` (one object or an array of them) and `GET /count` (number of boxes). The
//! reducers are the default config's: `v` = last `/value`, `sum` = sum of `/value`, `n`
//! = count, `by` = last `/player` (at most 16 bytes). A message that is not an object,
//! or whose `value` is not an i64 or `player` not a string of at most 16 bytes, is
//! refused on its own (422; in a batch it counts as rejected); a body that is not JSON
//! is refused whole (400).
//!
//! `may_minihttp` takes response headers as `&'static str` only. The `ETag` header of
//! version N is therefore made once per version number and kept for the life of the
//! process (`Table::etags`): memory grows with the highest version of any box (about
//! 40 bytes per version), not with the number of requests.
//!
//! Not part of the pollbox workspace on purpose: it has its own `Cargo.lock`, and
//! nothing in pollbox depends on it.
//!
//! Usage: `minihttp-baseline --listen 127.0.0.1:8091 --threads 1` (or
//! `MINIHTTP_BASELINE_THREADS`); `--threads` is may's worker count, default 1.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead, Read, Write};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use may_minihttp::{HttpService, HttpServiceFactory, Request, Response};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The longest `by` string the default config accepts.
const MAX_PLAYER_BYTES: usize = 16;
const MAX_KEY_BYTES: usize = 128;
/// Refused messages listed in a batch answer, at most.
const MAX_LISTED_ERRORS: usize = 16;
/// Coroutine stack, in words: serde_json recurses up to 128 levels into a message.
const STACK_WORDS: usize = 0x8000;

const JSON: &str = "Content-Type: application/json";

// ------------------------------------------------------------------ the typed message

/// A member of the message as the reducers want it, or a note that it had another type
/// (then the message is refused, not the whole body).
#[derive(Debug, Default, PartialEq)]
enum Field<T> {
    #[default]
    Absent,
    Ok(T),
    Wrong,
}

/// `/value`: an i64.
#[derive(Debug, Default, PartialEq)]
struct IntField(Field<i64>);

/// `/key`, `/player`: a string, borrowed from the body unless it has escapes.
#[derive(Debug, Default, PartialEq)]
struct StrField<'a>(Field<Cow<'a, str>>);

/// One ingested message. Members other than these three are skipped by serde's
/// `IgnoredAny` (unknown fields are ignored, not denied), so the cargo is never built.
#[derive(Debug, Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    key: StrField<'a>,
    #[serde(default)]
    value: IntField,
    #[serde(borrow, default)]
    player: StrField<'a>,
}

/// One element of a batch: a message, or something else (refused on its own).
#[derive(Debug)]
enum Item<'a> {
    Message(Message<'a>),
    NotObject,
}

/// A `POST /v1/ingest` body: one object or an array of them.
#[derive(Debug)]
enum Batch<'a> {
    One(Item<'a>),
    Many(Vec<Item<'a>>),
    /// Neither an object nor an array.
    Other,
}

/// Skips whatever a visitor was handed, so that a wrong type costs one message, not the
/// body.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

impl<'de> Deserialize<'de> for IntField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IntField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntField, E> {
                Ok(IntField(Field::Ok(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntField, E> {
                Ok(IntField(i64::try_from(v).map_or(Field::Wrong, Field::Ok)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<IntField, E> {
                Ok(IntField(Field::Wrong))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<IntField, E> {
                Ok(IntField(Field::Wrong))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<IntField, E> {
                Ok(IntField(Field::Wrong))
            }
            fn visit_unit<E: de::Error>(self) -> Result<IntField, E> {
                Ok(IntField(Field::Wrong))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<IntField, A::Error> {
                skip_seq(seq).map(|()| IntField(Field::Wrong))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<IntField, A::Error> {
                skip_map(map).map(|()| IntField(Field::Wrong))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for StrField<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = StrField<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Ok(Cow::Borrowed(v))))
            }
            // A string with escapes cannot be borrowed: serde_json hands over its copy.
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Ok(Cow::Owned(v.to_owned()))))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Wrong))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Wrong))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Wrong))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Wrong))
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrField<'a>, E> {
                Ok(StrField(Field::Wrong))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<StrField<'a>, A::Error> {
                skip_seq(seq).map(|()| StrField(Field::Wrong))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StrField<'a>, A::Error> {
                skip_map(map).map(|()| StrField(Field::Wrong))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// Visits one JSON value as a batch element: an object becomes a typed [`Message`]
/// (straight from the map, nothing buffered), anything else is skipped.
struct ItemVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ItemVisitor<'a> {
    type Value = Item<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item<'a>, A::Error> {
        Message::deserialize(de::value::MapAccessDeserializer::new(map)).map(Item::Message)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Item<'a>, A::Error> {
        skip_seq(seq).map(|()| Item::NotObject)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Item<'a>, E> {
        Ok(Item::NotObject)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor(PhantomData))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Batch<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Batch<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object or an array of objects")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Batch<'a>, A::Error> {
                ItemVisitor(PhantomData).visit_map(map).map(Batch::One)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Batch<'a>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(16).min(1024));
                while let Some(item) = seq.next_element::<Item<'a>>()? {
                    items.push(item);
                }
                Ok(Batch::Many(items))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Batch<'a>, E> {
                Ok(Batch::Other)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The fields one accepted message contributes.
struct Checked<'m> {
    value: Option<i64>,
    player: Option<&'m str>,
}

/// Why a message was refused; nothing of it was applied.
fn check<'m>(message: &'m Message<'_>) -> Result<Checked<'m>, &'static str> {
    let value = match message.value.0 {
        Field::Absent => None,
        Field::Ok(v) => Some(v),
        Field::Wrong => return Err("value: not an i64"),
    };
    let player = match &message.player.0 {
        Field::Absent => None,
        Field::Ok(p) if p.len() <= MAX_PLAYER_BYTES => Some(p.as_ref()),
        Field::Ok(_) => return Err("player: longer than 16 bytes"),
        Field::Wrong => return Err("player: not a string"),
    };
    Ok(Checked { value, player })
}

/// The `key` member of a batch message.
fn batch_key<'m>(message: &'m Message<'_>) -> Result<&'m str, &'static str> {
    match &message.key.0 {
        Field::Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_BYTES => Ok(k.as_ref()),
        _ => Err("missing key"),
    }
}

// ------------------------------------------------------------------ the box table

/// One box: the reducers' state and its payload, rendered when it changed.
#[derive(Debug)]
struct BoxState {
    ver: u64,
    v: Option<i64>,
    sum: Option<i64>,
    n: u64,
    by: Option<String>,
    payload: Vec<u8>,
    /// `ETag: "<ver>"`, from [`Table::etags`].
    etag: &'static str,
}

/// The JSON a poll answers, in pollbox's field order.
#[derive(Serialize)]
struct Payload<'a> {
    k: &'a str,
    ver: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sum: Option<i64>,
    n: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    by: Option<&'a str>,
}

#[derive(Debug, Default)]
struct Table {
    boxes: HashMap<String, BoxState>,
    /// `ETag: "<n>"` for every version n made so far (may_minihttp wants `&'static str`
    /// headers): one small leak per version number, shared by all boxes.
    etags: Vec<&'static str>,
}

impl Table {
    fn etag(&mut self, ver: u64) -> &'static str {
        let ver = usize::try_from(ver).unwrap_or(usize::MAX);
        while self.etags.len() <= ver {
            let header = format!("ETag: \"{}\"", self.etags.len());
            self.etags.push(Box::leak(header.into_boxed_str()));
        }
        self.etags[ver]
    }

    /// Applies one checked message to box `key` and renders its payload.
    fn apply(&mut self, key: &str, fields: &Checked<'_>) -> Result<&BoxState, &'static str> {
        let old_sum = self.boxes.get(key).and_then(|s| s.sum);
        let sum = match (fields.value, old_sum) {
            (Some(v), Some(s)) => Some(s.checked_add(v).ok_or("sum: overflow")?),
            (Some(v), None) => Some(v),
            (None, s) => s,
        };
        let ver = self.boxes.get(key).map_or(1, |s| s.ver + 1);
        let etag = self.etag(ver);
        if !self.boxes.contains_key(key) {
            self.boxes.insert(
                key.to_owned(),
                BoxState {
                    ver: 0,
                    v: None,
                    sum: None,
                    n: 0,
                    by: None,
                    payload: Vec::new(),
                    etag,
                },
            );
        }
        let state = self.boxes.get_mut(key).ok_or("box vanished")?;
        state.ver = ver;
        state.etag = etag;
        state.n += 1;
        if fields.value.is_some() {
            state.v = fields.value;
        }
        state.sum = sum;
        if let Some(p) = fields.player {
            match &mut state.by {
                Some(by) => {
                    by.clear();
                    by.push_str(p);
                }
                None => state.by = Some(p.to_owned()),
            }
        }
        state.payload.clear();
        let payload = Payload {
            k: key,
            ver: state.ver,
            v: state.v,
            sum: state.sum,
            n: state.n,
            by: state.by.as_deref(),
        };
        // Serializing numbers and strings into a Vec cannot fail.
        serde_json::to_writer(&mut state.payload, &payload).map_err(|_| "render failed")?;
        Ok(state)
    }
}

type Shared = Arc<RwLock<Table>>;

fn read(table: &Shared) -> RwLockReadGuard<'_, Table> {
    table
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn write(table: &Shared) -> RwLockWriteGuard<'_, Table> {
    table
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ------------------------------------------------------------------ HTTP

/// A JSON body that is not a box payload.
fn error(rsp: &mut Response, code: usize, reason: &'static str, message: &str) {
    rsp.status_code(code, reason);
    rsp.header(JSON);
    let mut body = Vec::with_capacity(message.len() + 16);
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut body, &ErrorBody { error: message });
    rsp.body_vec(body);
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

/// Whether a body failed as JSON (400) or only as a message (422).
fn json_error(rsp: &mut Response, e: &serde_json::Error) {
    match e.classify() {
        serde_json::error::Category::Data => {
            error(rsp, 422, "Unprocessable Entity", &e.to_string())
        }
        _ => error(rsp, 400, "Bad Request", &format!("invalid json: {e}")),
    }
}

fn header<'r>(req: &'r Request, name: &str) -> Option<&'r [u8]> {
    req.headers()
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

fn content_length(req: &Request) -> Option<usize> {
    match header(req, "content-length") {
        None => Some(0),
        Some(v) => std::str::from_utf8(v).ok()?.trim().parse().ok(),
    }
}

/// Decodes a path segment's `%XX` escapes into `out` (docs/http.md#keys: keys are
/// percent-decoded); false for a bad escape, invalid UTF-8, or a key that is empty or
/// longer than 128 bytes once decoded.
fn percent_decode(segment: &str, out: &mut String) -> bool {
    out.clear();
    if !segment.contains('%') {
        out.push_str(segment);
    } else {
        let bytes = segment.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(byte) = hex else {
                    return false;
                };
                decoded.push(byte);
                i += 3;
            } else {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
        match std::str::from_utf8(&decoded) {
            Ok(text) => out.push_str(text),
            Err(_) => return false,
        }
    }
    !out.is_empty() && out.len() <= MAX_KEY_BYTES
}

/// One service per connection: the shared table and this connection's buffers.
struct Service {
    table: Shared,
    /// The key of the request being answered (copied out of the path before the body
    /// is read).
    key: String,
    /// A body that did not arrive in one piece.
    body: Vec<u8>,
    /// A batch answer.
    answer: Vec<u8>,
}

enum Route {
    Poll,
    IngestOne,
    Batch,
    Count,
    NotFound,
    BadMethod,
}

impl HttpService for Service {
    fn call(&mut self, req: Request, rsp: &mut Response) -> io::Result<()> {
        let route = {
            let path = req.path();
            let path = path.split_once('?').map_or(path, |(p, _)| p);
            let get = req.method() == "GET";
            let post = req.method() == "POST";
            if let Some(key) = path.strip_prefix("/v1/boxes/") {
                if key.is_empty() || key.contains('/') || !percent_decode(key, &mut self.key) {
                    Route::NotFound
                } else {
                    match (get, post) {
                        (true, _) => Route::Poll,
                        (_, true) => Route::IngestOne,
                        _ => Route::BadMethod,
                    }
                }
            } else if path == "/v1/ingest" {
                if post {
                    Route::Batch
                } else {
                    Route::BadMethod
                }
            } else if path == "/count" {
                if get {
                    Route::Count
                } else {
                    Route::BadMethod
                }
            } else {
                Route::NotFound
            }
        };
        match route {
            Route::Poll => self.poll(&req, rsp),
            Route::Count => {
                let n = read(&self.table).boxes.len();
                rsp.body_vec(format!("{n}\n").into_bytes());
            }
            Route::NotFound => error(rsp, 404, "Not Found", "not found"),
            Route::BadMethod => error(rsp, 405, "Method Not Allowed", "method not allowed"),
            Route::IngestOne | Route::Batch => {
                let Some(len) = content_length(&req) else {
                    error(rsp, 400, "Bad Request", "bad Content-Length");
                    return Ok(());
                };
                let batch = matches!(route, Route::Batch);
                let mut reader = req.body();
                // Most bodies are in the read buffer already: parse them there.
                let chunk = reader.fill_buf()?;
                if chunk.len() >= len {
                    let body = &chunk[..len];
                    if batch {
                        ingest_batch(&self.table, &mut self.answer, body, rsp);
                    } else {
                        ingest_one(&self.table, &self.key, body, rsp);
                    }
                    reader.consume(len);
                } else {
                    self.body.clear();
                    reader.read_to_end(&mut self.body)?;
                    if self.body.len() != len {
                        error(rsp, 400, "Bad Request", "body shorter than Content-Length");
                    } else if batch {
                        ingest_batch(&self.table, &mut self.answer, &self.body, rsp);
                    } else {
                        ingest_one(&self.table, &self.key, &self.body, rsp);
                    }
                }
            }
        }
        Ok(())
    }
}

impl Service {
    fn poll(&mut self, req: &Request, rsp: &mut Response) {
        let table = read(&self.table);
        let Some(state) = table.boxes.get(self.key.as_str()) else {
            drop(table);
            return error(rsp, 404, "Not Found", "no such box");
        };
        let etag = state.etag;
        let value = &etag["ETag: ".len()..];
        if header(req, "if-none-match").is_some_and(|v| v == value.as_bytes()) {
            rsp.status_code(304, "Not Modified");
            rsp.header(etag);
            return;
        }
        rsp.header(JSON);
        rsp.header(etag);
        rsp.body_mut().extend_from_slice(&state.payload);
    }
}

fn ingest_one(table: &Shared, key: &str, body: &[u8], rsp: &mut Response) {
    let message = match serde_json::from_slice::<Item<'_>>(body) {
        Ok(Item::Message(m)) => m,
        Ok(Item::NotObject) => {
            return error(rsp, 422, "Unprocessable Entity", "message is not an object")
        }
        Err(e) => return json_error(rsp, &e),
    };
    let fields = match check(&message) {
        Ok(f) => f,
        Err(reason) => return error(rsp, 422, "Unprocessable Entity", reason),
    };
    let mut table = write(table);
    match table.apply(key, &fields) {
        Ok(state) => {
            rsp.header(JSON);
            rsp.body_mut().extend_from_slice(&state.payload);
        }
        Err(reason) => error(rsp, 422, "Unprocessable Entity", reason),
    }
}

fn ingest_batch(table: &Shared, answer: &mut Vec<u8>, body: &[u8], rsp: &mut Response) {
    let items = match serde_json::from_slice::<Batch<'_>>(body) {
        Ok(Batch::Many(items)) => items,
        Ok(Batch::One(item)) => vec![item],
        Ok(Batch::Other) => {
            return error(rsp, 400, "Bad Request", "not an object or array of objects")
        }
        Err(e) => return json_error(rsp, &e),
    };
    let (mut accepted, mut rejected) = (0u64, 0u64);
    answer.clear();
    let mut listed = 0;
    {
        let mut table = write(table);
        for (i, item) in items.iter().enumerate() {
            let outcome = match item {
                Item::NotObject => Err("message is not an object"),
                Item::Message(m) => check(m)
                    .and_then(|fields| Ok((batch_key(m)?, fields)))
                    .and_then(|(key, fields)| table.apply(key, &fields).map(|_| ())),
            };
            match outcome {
                Ok(()) => accepted += 1,
                Err(reason) => {
                    rejected += 1;
                    if listed < MAX_LISTED_ERRORS {
                        // Writing into a Vec cannot fail; reasons need no escaping.
                        let sep = if listed == 0 { "" } else { "," };
                        let _ = write!(answer, "{sep}{{\"i\":{i},\"error\":\"{reason}\"}}");
                        listed += 1;
                    }
                }
            }
        }
    }
    rsp.header(JSON);
    let out = rsp.body_mut();
    out.extend_from_slice(b"{\"accepted\":");
    out.extend_from_slice(accepted.to_string().as_bytes());
    out.extend_from_slice(b",\"rejected\":");
    out.extend_from_slice(rejected.to_string().as_bytes());
    out.extend_from_slice(b",\"errors\":[");
    out.extend_from_slice(answer);
    out.extend_from_slice(b"]}");
}

// ------------------------------------------------------------------ server

struct Factory {
    table: Shared,
}

impl HttpServiceFactory for Factory {
    type Service = Service;

    fn new_service(&self, id: usize) -> Service {
        // may_minihttp names each connection by its socket's file descriptor and leaves
        // Nagle on; pollbox, nginx and axum-baseline set TCP_NODELAY, without which
        // pipelined answers wait for the peer's delayed ACK (the comparison would then be
        // about a socket option). The accept loop calls this while it owns the stream.
        if let Err(e) = set_nodelay(id) {
            eprintln!("minihttp-baseline: TCP_NODELAY: {e}");
        }
        Service {
            table: Arc::clone(&self.table),
            key: String::with_capacity(MAX_KEY_BYTES),
            body: Vec::new(),
            answer: Vec::new(),
        }
    }
}

/// Sets TCP_NODELAY on the socket with file descriptor `fd`.
fn set_nodelay(fd: usize) -> io::Result<()> {
    use std::os::fd::{BorrowedFd, RawFd};
    let raw = RawFd::try_from(fd).map_err(|_| io::Error::other("not a file descriptor"))?;
    // SAFETY: `fd` is the descriptor of the accepted connection, which the caller's
    // accept loop owns (open) for the whole of this call; the borrow ends with it, and
    // setsockopt neither closes nor transfers the descriptor. Covered by the test
    // `nodelay_is_set_on_a_socket`.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    socket2::SockRef::from(&borrowed).set_tcp_nodelay(true)
}

struct Args {
    listen: SocketAddr,
    threads: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut listen: SocketAddr = "127.0.0.1:8091".parse().map_err(|_| "default address")?;
    let mut threads: usize = match std::env::var("MINIHTTP_BASELINE_THREADS") {
        Ok(t) => t
            .parse()
            .map_err(|_| format!("MINIHTTP_BASELINE_THREADS: bad number {t:?}"))?,
        Err(_) => 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--listen" => {
                listen = value
                    .parse()
                    .map_err(|_| format!("bad address {value:?}"))?
            }
            "--threads" => threads = value.parse().map_err(|_| format!("bad number {value:?}"))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(Args { listen, threads })
}

/// Configures may (before its first coroutine) and starts serving on `listen`.
fn start(listen: SocketAddr, threads: usize) -> io::Result<may::coroutine::JoinHandle<()>> {
    may::config()
        .set_workers(threads)
        .set_stack_size(STACK_WORDS);
    Factory {
        table: Shared::default(),
    }
    .start(listen)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "minihttp-baseline: {e}\nusage: minihttp-baseline [--listen ADDR] [--threads N]"
            );
            std::process::exit(2);
        }
    };
    match start(args.listen, args.threads) {
        Ok(server) => {
            eprintln!(
                "minihttp-baseline: listening on http://{} with {} may worker thread(s)",
                args.listen, args.threads
            );
            if server.join().is_err() {
                eprintln!("minihttp-baseline: the accept loop panicked");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("minihttp-baseline: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    //! Over real sockets: one server for the whole test binary (may's configuration is
    //! global), each test on its own keys.
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::OnceLock;
    use std::time::Duration;

    fn server() -> SocketAddr {
        static ADDR: OnceLock<SocketAddr> = OnceLock::new();
        *ADDR.get_or_init(|| {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = probe.local_addr().unwrap();
            drop(probe);
            let handle = start(addr, 1).unwrap();
            std::mem::forget(handle);
            for _ in 0..100 {
                if TcpStream::connect(addr).is_ok() {
                    return addr;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("server did not come up on {addr}");
        })
    }

    struct Answer {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    impl Answer {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        }
        fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap()
        }
    }

    /// Sends `raw` on one connection and reads `count` answers.
    fn exchange(raw: &[u8], count: usize) -> Vec<Answer> {
        let mut s = TcpStream::connect(server()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(raw).unwrap();
        let mut buf = Vec::new();
        let mut answers = Vec::new();
        let mut chunk = [0u8; 65536];
        while answers.len() < count {
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut r = httparse::Response::new(&mut headers);
            if let Ok(httparse::Status::Complete(head)) = r.parse(&buf) {
                let hs: Vec<(String, String)> = r
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_string(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect();
                let status = r.code.unwrap();
                let len: usize = hs
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, v)| v.parse().unwrap());
                let len = if status == 304 { 0 } else { len };
                if buf.len() >= head + len {
                    answers.push(Answer {
                        status,
                        headers: hs,
                        body: buf[head..head + len].to_vec(),
                    });
                    buf.drain(..head + len);
                    continue;
                }
            }
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "closed after {} answers", answers.len());
            buf.extend_from_slice(&chunk[..n]);
        }
        answers
    }

    fn post(path: &str, body: &str) -> Vec<u8> {
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    fn get(path: &str, extra: &str) -> Vec<u8> {
        format!("GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n").into_bytes()
    }

    #[test]
    fn ingest_then_poll_with_etag_and_304() {
        let cargo = format!(
            "{{\"deep\":[[{{\"x\":\"{}\"}}]],\"n\":1.5e3}}",
            "a".repeat(400)
        );
        let msg =
            format!("{{\"key\":\"ignored\",\"value\":5,\"player\":\"ann\",\"cargo\":{cargo}}}");
        let mut raw = post("/v1/boxes/t-one", &msg);
        raw.extend(post("/v1/boxes/t-one", "{\"value\":-2}"));
        raw.extend(get("/v1/boxes/t-one", ""));
        raw.extend(get("/v1/boxes/t-one", "If-None-Match: \"2\"\r\n"));
        raw.extend(get("/v1/boxes/t-one", "If-None-Match: \"1\"\r\n"));
        raw.extend(get("/v1/boxes/t-none", ""));
        let a = exchange(&raw, 6);
        assert_eq!(a[0].status, 200);
        assert_eq!(
            a[0].body,
            b"{\"k\":\"t-one\",\"ver\":1,\"v\":5,\"sum\":5,\"n\":1,\"by\":\"ann\"}"
        );
        assert_eq!(
            a[1].body,
            b"{\"k\":\"t-one\",\"ver\":2,\"v\":-2,\"sum\":3,\"n\":2,\"by\":\"ann\"}"
        );
        assert_eq!(a[2].status, 200);
        assert_eq!(a[2].body, a[1].body);
        assert_eq!(a[2].header("etag"), Some("\"2\""));
        assert_eq!(a[2].header("content-type"), Some("application/json"));
        assert_eq!(a[3].status, 304);
        assert_eq!(a[3].header("etag"), Some("\"2\""));
        assert_eq!(a[4].status, 200);
        assert_eq!(a[5].status, 404);
    }

    #[test]
    fn bad_messages_are_refused_and_nothing_is_applied() {
        let cases = [
            ("{\"value\":1.5}", 422),
            ("{\"value\":\"1\"}", 422),
            ("{\"player\":\"seventeen-bytes-xx\"}", 422),
            ("{\"player\":7}", 422),
            ("[1,2]", 422),
            ("{\"value\":1", 400),
            ("{\"value\":1} x", 400),
            ("not json", 400),
        ];
        let mut raw = Vec::new();
        for (body, _) in &cases {
            raw.extend(post("/v1/boxes/t-bad", body));
        }
        raw.extend(get("/v1/boxes/t-bad", ""));
        let a = exchange(&raw, cases.len() + 1);
        for ((body, want), got) in cases.iter().zip(&a) {
            assert_eq!(got.status, *want, "{body}");
            assert!(got.json()["error"].is_string(), "{body}");
        }
        assert_eq!(a[cases.len()].status, 404, "no box was made");
    }

    #[test]
    fn batches_count_accepted_and_rejected_and_one_object_is_a_batch() {
        let batch = "[{\"key\":\"t-b1\",\"value\":1,\"player\":\"p\\u0041\"},\
                     {\"key\":\"t-b2\",\"value\":2.5},\
                     7,\
                     {\"value\":3},\
                     {\"key\":\"t-b1\",\"value\":10,\"cargo\":{\"a\":[1,2,{\"b\":null}]}}]";
        let mut raw = post("/v1/ingest", batch);
        raw.extend(post("/v1/ingest", "{\"key\":\"t-b3\"}"));
        raw.extend(post("/v1/ingest", "\"str\""));
        raw.extend(post("/v1/ingest", "[{\"key\":\"t-b4\"}"));
        raw.extend(get("/v1/boxes/t-b1", ""));
        raw.extend(get("/v1/boxes/t-b2", ""));
        let a = exchange(&raw, 6);
        let j = a[0].json();
        assert_eq!(
            (j["accepted"].as_u64(), j["rejected"].as_u64()),
            (Some(2), Some(3))
        );
        let listed: Vec<u64> = j["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["i"].as_u64().unwrap())
            .collect();
        assert_eq!(listed, [1, 2, 3]);
        assert_eq!(a[1].json()["accepted"], 1);
        assert_eq!(a[2].status, 400);
        assert_eq!(a[3].status, 400);
        // The escaped player was copied, not refused.
        assert_eq!(
            a[4].body,
            b"{\"k\":\"t-b1\",\"ver\":2,\"v\":10,\"sum\":11,\"n\":2,\"by\":\"pA\"}"
        );
        assert_eq!(a[5].status, 404);
    }

    #[test]
    fn a_body_in_many_pieces_and_count() {
        let items: Vec<String> = (0..300)
            .map(|i| {
                format!(
                    "{{\"key\":\"t-many-{i}\",\"value\":{i},\"pad\":\"{}\"}}",
                    "x".repeat(400)
                )
            })
            .collect();
        let body = format!("[{}]", items.join(","));
        assert!(body.len() > 100_000);
        let a = exchange(&post("/v1/ingest", &body), 1);
        assert_eq!(a[0].json()["accepted"], 300);
        let a = exchange(&get("/count", ""), 1);
        let n: usize = String::from_utf8_lossy(&a[0].body).trim().parse().unwrap();
        assert!(n >= 300, "{n}");
    }

    #[test]
    fn nodelay_is_set_on_a_socket() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(!accepted.nodelay().unwrap());
        set_nodelay(accepted.as_raw_fd() as usize).unwrap();
        assert!(accepted.nodelay().unwrap());
        assert!(!client.nodelay().unwrap());
        assert!(set_nodelay(usize::MAX).is_err());
    }

    #[test]
    fn keys_are_percent_decoded() {
        let mut out = String::new();
        assert!(percent_decode("lg-1", &mut out) && out == "lg-1");
        assert!(percent_decode("a%20b%C3%A9", &mut out) && out == "a bé");
        for bad in ["%", "%2", "%zz", "%FF", "%C3"] {
            assert!(!percent_decode(bad, &mut out), "{bad}");
        }
        assert!(!percent_decode(&"k".repeat(129), &mut out));
        let a = exchange(&post("/v1/boxes/t%2Dpct", "{\"value\":1}"), 1);
        assert_eq!(
            a[0].body,
            b"{\"k\":\"t-pct\",\"ver\":1,\"v\":1,\"sum\":1,\"n\":1}"
        );
    }

    #[test]
    fn etags_are_made_once_per_version() {
        let mut t = Table::default();
        let a = t.etag(3);
        assert_eq!(a, "ETag: \"3\"");
        assert_eq!(t.etags.len(), 4);
        assert!(std::ptr::eq(a, t.etag(3)));
        assert_eq!(t.etag(0), "ETag: \"0\"");
    }
}
