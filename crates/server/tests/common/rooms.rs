//! A room's client for the tests (docs/http.md#rooms): a prefix stream read
//! event by event, what a client holds of the room (failing on a version it
//! holds or an older one), and the room as pages give it.
#![allow(dead_code)]

use super::*;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One server-sent event.
#[derive(Debug, Default)]
pub struct Event {
    pub event: String,
    pub data: String,
    pub id: Option<String>,
}

/// A prefix stream read event by event.
pub struct Sse {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

impl Sse {
    pub fn open(a: SocketAddr, prefix: &str, id: Option<&str>) -> Sse {
        let mut stream = connect(a);
        let last = id.map_or(String::new(), |i| format!("Last-Event-ID: {i}\r\n"));
        write!(
            stream,
            "GET /v1/boxes?prefix={prefix} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{last}\r\n"
        )
        .unwrap();
        let mut s = Sse {
            stream,
            buf: Vec::new(),
        };
        let head = s.block().expect("a head");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    }

    /// The next block up to a blank line (the head, then each event).
    fn block(&mut self) -> Option<String> {
        loop {
            let sep = if self.buf.starts_with(b"HTTP/") {
                &b"\r\n\r\n"[..]
            } else {
                &b"\n\n"[..]
            };
            if let Some(i) = self.buf.windows(sep.len()).position(|w| w == sep) {
                let block = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + sep.len());
                return Some(block);
            }
            let mut chunk = [0u8; 16384];
            match super::read_some(&mut self.stream, &mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn next(&mut self) -> Option<Event> {
        loop {
            let block = self.block()?;
            let mut e = Event::default();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    e.event = v.into();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    e.data = v.into();
                } else if let Some(v) = line.strip_prefix("id: ") {
                    e.id = Some(v.into());
                }
            }
            if !e.data.is_empty() || !e.event.is_empty() {
                return Some(e);
            }
        }
    }
}

/// What the client holds: each key's version and payload.
#[derive(Default)]
pub struct Held {
    pub boxes: BTreeMap<String, (u64, String)>,
    /// Keys held when a reset began: those not listed again by `synced` go.
    unconfirmed: Option<Vec<String>>,
    pub resets: usize,
    /// The last events, for a failure's message.
    pub log: std::collections::VecDeque<String>,
    /// Every event by key, for a failure's message.
    pub by_key: BTreeMap<String, Vec<String>>,
    pub conn: usize,
}

impl Held {
    /// Apply one event; panics on a version the client holds or an older
    /// one outside a reset's listing.
    pub fn apply(&mut self, e: &Event) {
        self.log
            .push_back(format!("{} {} {:?}", e.event, e.data, e.id));
        if self.log.len() > 40 {
            self.log.pop_front();
        }
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&e.data) {
            if let Some(k) = v["k"].as_str() {
                let (ver, _) = if e.event.is_empty() {
                    split_ver(&e.data)
                } else {
                    (0, String::new())
                };
                self.by_key
                    .entry(k.to_string())
                    .or_default()
                    .push(format!("conn {} {} {} {:?}", self.conn, e.event, ver, e.id));
            }
        }
        match e.event.as_str() {
            "" => {
                let (ver, _) = split_ver(&e.data);
                let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
                let key = v["k"].as_str().unwrap().to_string();
                if let Some(list) = self.unconfirmed.as_mut() {
                    list.retain(|k| k != &key);
                } else if let Some(&(held, _)) = self.boxes.get(&key) {
                    assert!(
                        ver > held,
                        "{key}: sent {ver}, the client holds {held}; last events:\n{}",
                        self.log.iter().cloned().collect::<Vec<_>>().join("\n")
                    );
                }
                self.boxes.insert(key, (ver, e.data.clone()));
            }
            "deleted" => {
                let v: serde_json::Value = serde_json::from_str(&e.data).unwrap();
                self.boxes.remove(v["k"].as_str().unwrap());
            }
            "reset" => {
                self.resets += 1;
                self.unconfirmed = Some(self.boxes.keys().cloned().collect());
            }
            "synced" => {
                for k in self.unconfirmed.take().unwrap_or_default() {
                    self.boxes.remove(&k);
                }
            }
            other => panic!("unexpected event {other}: {e:?}"),
        }
    }
}

/// Read `sse` into `held` until it has sent `synced` and `budget` more
/// events carried an id, then stop there (a client that hangs up at an
/// event with an id); `id` is left at the last id. Returns the events read.
pub fn read_then_hang_up(
    sse: &mut Sse,
    held: &mut Held,
    id: &mut Option<String>,
    mut budget: u64,
) -> usize {
    let (mut synced, mut events) = (false, 0);
    loop {
        let e = sse.next().expect("the stream goes on");
        held.apply(&e);
        events += 1;
        synced |= e.event == "synced";
        if let Some(i) = &e.id {
            *id = Some(i.clone());
            budget = budget.saturating_sub(1);
            if synced && budget == 0 {
                return events;
            }
        }
    }
}

/// The room as the server has it now, page by page.
pub fn room(a: SocketAddr, prefix: &str) -> BTreeMap<String, (u64, String)> {
    let mut all = BTreeMap::new();
    let mut cursor = String::new();
    loop {
        let r = get(a, &format!("/v1/boxes?prefix={prefix}&limit=50{cursor}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let page = r.json();
        for b in page["boxes"].as_array().unwrap() {
            let text = b.to_string();
            let (ver, _) = split_ver(&text);
            all.insert(b["k"].as_str().unwrap().to_string(), (ver, text));
        }
        match page["next"].as_str() {
            Some(n) => cursor = format!("&cursor={n}"),
            None => return all,
        }
    }
}

/// A writer on each of `nodes` (its own connection), until `stop`: updates,
/// creations and (one in `delete_one_in`) deletions of `keys` keys
/// `room/kNN`, and one in ten elsewhere (`lobby/kN`). Returns the writes.
pub fn writers(
    nodes: &[SocketAddr],
    keys: u64,
    delete_one_in: u64,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<usize>> {
    nodes
        .iter()
        .enumerate()
        .map(|(w, &a)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (w as u64 + 1);
                let mut ops = 0;
                let mut rd = Reader::new(connect(a));
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = if x.is_multiple_of(10) {
                        format!("lobby/k{}", x % 7)
                    } else {
                        format!("room/k{:02}", (x >> 8) % keys)
                    };
                    let req = if (x >> 20).is_multiple_of(delete_one_in) {
                        format!("DELETE /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\n\r\n")
                    } else {
                        let body = format!(r#"{{"value":{}}}"#, x % 1000);
                        format!(
                            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    rd.send(req.as_bytes());
                    let r = rd.read(false);
                    assert!(matches!(r.status, 200 | 204 | 404), "{}", r.text());
                    ops += 1;
                }
                ops
            })
        })
        .collect()
}

/// 1,000 boxes under `room-a/` on the node at `a` (its heartbeat far off):
/// a stream resumed from the room's watermark with nothing moved is sent
/// `synced` first; with four moved (one deleted), exactly those, then
/// `synced`; the long-poll form from the same watermark answers them at
/// once. Every read gives up after 10 s: a listing that waits for a
/// heartbeat fails.
pub fn resume_a_quiet_room(a: SocketAddr) {
    let batch: Vec<String> = (0..1000)
        .map(|i| format!(r#"{{"key":"room-a/k{i:03}","value":1}}"#))
        .collect();
    let r = post(a, "/v1/ingest", &format!("[{}]", batch.join(",")));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["accepted"], 1000);

    // The first listing: every box, then `synced` with the watermark.
    let listed = |id: Option<&str>| -> (Vec<Event>, String, std::time::Duration) {
        let t = std::time::Instant::now();
        let mut sse = Sse::open(a, "room-a/", id);
        let mut events = Vec::new();
        loop {
            let e = sse
                .next()
                .expect("the listing ends with synced, no heartbeat needed");
            if e.event == "synced" {
                return (
                    events,
                    e.id.expect("synced carries the watermark"),
                    t.elapsed(),
                );
            }
            events.push(e);
        }
    };
    let (first, mut id, _) = listed(None);
    assert_eq!(first.len(), 1000);

    // Nothing moved: `synced` is the first event.
    let (events, again, took) = listed(Some(&id));
    assert!(events.is_empty(), "{events:?}");
    eprintln!("nothing moved among 1,000: synced after {took:?}");
    id = again;

    // A handful moved (one deleted): exactly those, then `synced`.
    for k in ["k150", "k500", "k999"] {
        assert_eq!(
            post(a, &format!("/v1/boxes/room-a/{k}"), r#"{"value":9}"#).status,
            200
        );
    }
    assert_eq!(delete(a, "/v1/boxes/room-a/k700").status, 204);
    let (events, _, took) = listed(Some(&id));
    let mut got: Vec<String> = events
        .iter()
        .map(|e| {
            let k = serde_json::from_str::<serde_json::Value>(&e.data).unwrap()["k"]
                .as_str()
                .unwrap()
                .to_string();
            format!("{}{k}", if e.event == "deleted" { "-" } else { "" })
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        ["-room-a/k700", "room-a/k150", "room-a/k500", "room-a/k999"]
    );
    eprintln!("4 moved among 1,000: synced after {took:?}");

    // The long-poll form, from the same watermark: answered at once with
    // what moved (its deadline, a minute, is never reached).
    let t = std::time::Instant::now();
    let r = get(
        a,
        &format!("/v1/boxes?prefix=room-a%2F&after={id}&wait_ms=60000"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    let mut keys: Vec<&str> = j["boxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["k"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["room-a/k150", "room-a/k500", "room-a/k999"]);
    assert_eq!(j["deleted"], serde_json::json!(["room-a/k700"]));
    eprintln!("the long-poll form answered after {:?}", t.elapsed());
}
