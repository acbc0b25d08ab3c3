//! A small in-process pollbox stand-in for the load generator's tests: std threads,
//! one per connection, keep-alive and pipelining, the routes of docs/http.md#routes
//! (many boxes at once, `GET /v1/boxes?keys=...`, with an ETag and `If-None-Match`
//! too, and event streams of a prefix, `GET /v1/boxes?prefix=P` with `Accept:
//! text/event-stream`: the listing in key order, `event: synced`, then each box under P
//! that moves, looked at every millisecond) with a box table that counts versions, and
//! knobs to misbehave (stall once, wrong
//! status, versions going backwards, closing connections).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How the server misbehaves.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Each connection, on its first request at least this long after the server's
    /// first request, stops reading and answering for the given time.
    pub stall: Option<(Duration, Duration)>,
    /// Answer ingest requests with this status instead of 200.
    pub ingest_status: Option<u16>,
    /// Polls report a version that goes down each time.
    pub versions_go_backwards: bool,
    /// Every n-th answer on a connection says `Connection: close` and the connection
    /// is closed after it.
    pub close_every: Option<u64>,
}

/// Requests the server answered, by route.
#[derive(Debug, Default)]
pub struct Counts {
    pub poll: AtomicU64,
    pub longpoll: AtomicU64,
    pub ingest: AtomicU64,
    pub batch: AtomicU64,
    pub batch_messages: AtomicU64,
    pub connections: AtomicU64,
    /// `GET /v1/boxes?keys=...` without and with `wait_ms`.
    pub poll_many: AtomicU64,
    pub longpoll_many: AtomicU64,
    /// Many-box requests that sent an `If-None-Match`, and those answered 304.
    pub if_none_match: AtomicU64,
    pub not_modified: AtomicU64,
    /// Event streams of a prefix opened, the boxes their listings sent, and the box
    /// events sent after the listings.
    pub prefix_streams: AtomicU64,
    pub prefix_listed: AtomicU64,
    pub prefix_events: AtomicU64,
}

impl Counts {
    pub fn get(&self, route: &str) -> u64 {
        let c = match route {
            "poll" => &self.poll,
            "longpoll" => &self.longpoll,
            "ingest" => &self.ingest,
            "batch" => &self.batch,
            "batch_messages" => &self.batch_messages,
            "connections" => &self.connections,
            "poll_many" => &self.poll_many,
            "longpoll_many" => &self.longpoll_many,
            "if_none_match" => &self.if_none_match,
            "not_modified" => &self.not_modified,
            "prefix_streams" => &self.prefix_streams,
            "prefix_listed" => &self.prefix_listed,
            "prefix_events" => &self.prefix_events,
            other => panic!("no route {other}"),
        };
        c.load(Ordering::SeqCst)
    }
}

struct Shared {
    behaviour: Behaviour,
    counts: Arc<Counts>,
    boxes: Mutex<HashMap<String, u64>>,
    first_request: OnceLock<Instant>,
    backwards: AtomicU64,
    stop: AtomicBool,
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    shared: Arc<Shared>,
}

impl TestServer {
    pub fn start(behaviour: Behaviour) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let counts = Arc::new(Counts::default());
        let shared = Arc::new(Shared {
            behaviour,
            counts: counts.clone(),
            boxes: Mutex::new(HashMap::new()),
            first_request: OnceLock::new(),
            backwards: AtomicU64::new(1_000_000),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                s.counts.connections.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                thread::spawn(move || serve(stream, &s));
            }
        });
        TestServer {
            addr,
            counts,
            shared,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Current version of a box, 0 if it has none.
    pub fn version(&self, key: &str) -> u64 {
        *self.shared.boxes.lock().unwrap().get(key).unwrap_or(&0)
    }

    pub fn boxes(&self) -> usize {
        self.shared.boxes.lock().unwrap().len()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(mut stream: TcpStream, s: &Shared) {
    let _ = stream.set_nodelay(true);
    let mut input = vec![0u8; 64 * 1024];
    let mut filled = 0;
    let mut out = Vec::with_capacity(64 * 1024);
    let mut stalled = false;
    let mut answered = 0u64;
    loop {
        if filled == input.len() {
            input.resize(input.len() * 2, 0);
        }
        let n = match stream.read(&mut input[filled..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        filled += n;
        let mut start = 0;
        let mut close = false;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            let head = match req.parse(&input[start..filled]) {
                Ok(httparse::Status::Complete(h)) => h,
                Ok(httparse::Status::Partial) => break,
                Err(_) => return,
            };
            let len: usize = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map(|h| std::str::from_utf8(h.value).unwrap().parse().unwrap())
                .unwrap_or(0);
            if filled - start < head + len {
                break;
            }
            let method = req.method.unwrap().to_string();
            let path = req.path.unwrap().to_string();
            let body = &input[start + head..start + head + len];
            let if_none_match = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("if-none-match"))
                .map(|h| String::from_utf8_lossy(h.value).into_owned());

            let wants_stream = req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("accept")
                    && String::from_utf8_lossy(h.value).contains("text/event-stream")
            });
            if let (true, Some(prefix)) = (wants_stream, path.strip_prefix("/v1/boxes?prefix=")) {
                let prefix = percent_decode(prefix);
                if stream.write_all(&out).is_ok() {
                    stream_prefix(stream, s, &prefix);
                }
                return;
            }

            let first = *s.first_request.get_or_init(Instant::now);
            if let Some((after, pause)) = s.behaviour.stall {
                if !stalled && first.elapsed() >= after {
                    stalled = true;
                    thread::sleep(pause);
                }
            }
            let (status, payload, etag) = if path == "/v1/boxes" || path.starts_with("/v1/boxes?") {
                many(s, &method, &path, if_none_match.as_deref())
            } else {
                let (status, payload) = route(s, &method, &path, body);
                (status, payload, None)
            };
            answered += 1;
            close = s
                .behaviour
                .close_every
                .is_some_and(|n| answered.is_multiple_of(n));
            write!(
                out,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}{}\r\n",
                payload.len(),
                etag.map(|e| format!("ETag: {e}\r\n")).unwrap_or_default(),
                if close { "Connection: close\r\n" } else { "" }
            )
            .unwrap();
            out.extend_from_slice(payload.as_bytes());
            start += head + len;
            if close {
                break;
            }
        }
        input.copy_within(start..filled, 0);
        filled -= start;
        if !out.is_empty() {
            if stream.write_all(&out).is_err() {
                return;
            }
            out.clear();
        }
        if close {
            return;
        }
    }
}

/// An event stream of every box under `prefix`: the listing, `event: synced`, then
/// each box that moved since it was last sent, until the client goes or the server
/// stops.
fn stream_prefix(mut stream: TcpStream, s: &Shared, prefix: &str) {
    s.counts.prefix_streams.fetch_add(1, Ordering::SeqCst);
    let under = || -> std::collections::BTreeMap<String, u64> {
        let boxes = s.boxes.lock().unwrap();
        boxes
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, &v)| (k.clone(), v))
            .collect()
    };
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\nretry: 1000\n\n",
    );
    let mut sent = under();
    for (k, &v) in &sent {
        out.push_str(&format!("data: {}\n\n", payload(k, v)));
    }
    s.counts
        .prefix_listed
        .fetch_add(sent.len() as u64, Ordering::SeqCst);
    out.push_str("event: synced\ndata: {}\n\n");
    while !s.stop.load(Ordering::SeqCst) {
        if !out.is_empty() && stream.write_all(out.as_bytes()).is_err() {
            return;
        }
        out.clear();
        thread::sleep(Duration::from_millis(1));
        for (k, v) in under() {
            if sent.get(&k) != Some(&v) {
                out.push_str(&format!("data: {}\n\n", payload(&k, v)));
                s.counts.prefix_events.fetch_add(1, Ordering::SeqCst);
                sent.insert(k, v);
            }
        }
    }
}

fn percent_decode(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            out.push(u8::from_str_radix(&text[i + 1..i + 3], 16).expect("hex"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("UTF-8")
}

fn payload(key: &str, ver: u64) -> String {
    format!(r#"{{"k":"{key}","ver":{ver},"v":1,"n":{ver}}}"#)
}

/// `GET /v1/boxes?keys=a,b,c[&wait_ms=N]`: the payloads in order (`null` for no box)
/// with an ETag of the versions; 304 to a current `If-None-Match`; with `wait_ms` and a
/// current `If-None-Match`, waits for any of the boxes to move. 400 for a repeated key.
fn many(
    s: &Shared,
    method: &str,
    path: &str,
    if_none_match: Option<&str>,
) -> (u16, String, Option<String>) {
    if method != "GET" {
        return (405, String::new(), None);
    }
    let query = path.split_once('?').map_or("", |(_, q)| q);
    let mut keys: Vec<&str> = Vec::new();
    let mut wait_ms = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("keys", v)) => keys = v.split(',').collect(),
            Some(("wait_ms", v)) => wait_ms = Some(v.parse::<u64>().expect("wait_ms")),
            _ => panic!("unexpected query {query}"),
        }
    }
    let counter = if wait_ms.is_some() {
        &s.counts.longpoll_many
    } else {
        &s.counts.poll_many
    };
    counter.fetch_add(1, Ordering::SeqCst);
    if keys.is_empty()
        || keys
            .iter()
            .enumerate()
            .any(|(i, k)| k.is_empty() || keys[..i].contains(k))
    {
        return (400, r#"{"error":"empty or repeated key"}"#.into(), None);
    }
    if if_none_match.is_some() {
        s.counts.if_none_match.fetch_add(1, Ordering::SeqCst);
    }
    let state = || {
        let boxes = s.boxes.lock().unwrap();
        let versions: Vec<u64> = keys.iter().map(|k| *boxes.get(*k).unwrap_or(&0)).collect();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&versions, &mut h);
        (versions, format!("\"{}\"", std::hash::Hasher::finish(&h)))
    };
    let deadline = Instant::now() + Duration::from_millis(wait_ms.unwrap_or(0));
    loop {
        let (versions, etag) = state();
        let current = if_none_match == Some(etag.as_str());
        if current && wait_ms.is_some() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
            continue;
        }
        if current {
            s.counts.not_modified.fetch_add(1, Ordering::SeqCst);
            return (304, String::new(), Some(etag));
        }
        let items: Vec<String> = keys
            .iter()
            .zip(versions)
            .map(|(k, v)| if v == 0 { "null".into() } else { payload(k, v) })
            .collect();
        return (200, format!("[{}]", items.join(",")), Some(etag));
    }
}

fn route(s: &Shared, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    if method == "POST" && path == "/v1/ingest" {
        s.counts.batch.fetch_add(1, Ordering::SeqCst);
        let messages: serde_json::Value = serde_json::from_slice(body).expect("batch is JSON");
        let messages = messages.as_array().expect("batch is an array");
        let mut boxes = s.boxes.lock().unwrap();
        for m in messages {
            let key = m["key"].as_str().expect("key").to_string();
            *boxes.entry(key).or_insert(0) += 1;
        }
        s.counts
            .batch_messages
            .fetch_add(messages.len() as u64, Ordering::SeqCst);
        return (
            200,
            format!(
                r#"{{"accepted":{},"rejected":0,"errors":[]}}"#,
                messages.len()
            ),
        );
    }
    let Some(key) = path.strip_prefix("/v1/boxes/") else {
        return (404, r#"{"error":"no route"}"#.into());
    };
    match method {
        "POST" => {
            s.counts.ingest.fetch_add(1, Ordering::SeqCst);
            if let Some(status) = s.behaviour.ingest_status {
                return (status, r#"{"error":"configured"}"#.into());
            }
            let message: serde_json::Value = serde_json::from_slice(body).expect("message is JSON");
            assert_eq!(message["key"], key, "body key matches path");
            let mut boxes = s.boxes.lock().unwrap();
            let ver = boxes.entry(key.to_string()).or_insert(0);
            *ver += 1;
            (200, payload(key, *ver))
        }
        "GET" if query.is_empty() => {
            s.counts.poll.fetch_add(1, Ordering::SeqCst);
            let ver = s.boxes.lock().unwrap().get(key).copied();
            match ver {
                None => (404, r#"{"error":"no such box"}"#.into()),
                Some(_) if s.behaviour.versions_go_backwards => {
                    let v = s.backwards.fetch_sub(1, Ordering::SeqCst);
                    (200, payload(key, v))
                }
                Some(v) => (200, payload(key, v)),
            }
        }
        "GET" => {
            s.counts.longpoll.fetch_add(1, Ordering::SeqCst);
            let mut after = 0u64;
            let mut wait_ms = 0u64;
            for pair in query.split('&') {
                match pair.split_once('=') {
                    Some(("after", v)) => after = v.parse().expect("after"),
                    Some(("wait_ms", v)) => wait_ms = v.parse().expect("wait_ms"),
                    _ => panic!("unexpected query {query}"),
                }
            }
            let deadline = Instant::now() + Duration::from_millis(wait_ms);
            loop {
                let ver = s.boxes.lock().unwrap().get(key).copied();
                match ver {
                    None => return (404, r#"{"error":"no such box"}"#.into()),
                    Some(v) if v > after => return (200, payload(key, v)),
                    Some(_) if Instant::now() >= deadline => return (304, String::new()),
                    Some(_) => thread::sleep(Duration::from_millis(2)),
                }
            }
        }
        _ => (405, String::new()),
    }
}
