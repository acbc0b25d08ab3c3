//! Rooms over real sockets (docs/http.md#rooms): keys with separators, pages
//! of a prefix (`GET /v1/boxes?prefix=P&limit=N&cursor=C`) in key order and
//! exactly once while the table changes, their 400s and cap, the prefix event
//! stream (listing, `event: synced`, live updates, `event: deleted`, expiry),
//! `limits.max_prefix_streams`, access with `read = "token"`, and metrics.
//! (Ids, `after` and the long-poll form of a prefix are not tested here.)

mod common;
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Wait until `f` holds, polling; panics after 30 s (a hang, not a timing bound).
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < give_up, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One series of `/metrics` (`name{labels}`), 0 when absent.
fn metric(a: SocketAddr, series: &str) -> u64 {
    let head = format!("{series} ");
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{series}: {v}: {e}"))
        })
        .unwrap_or(0)
}

const GAUGE: &str = "pollbox_prefix_streams";

/// A kept-alive connection for many requests.
struct Client(Reader);

impl Client {
    fn new(a: SocketAddr) -> Client {
        Client(Reader::new(connect(a)))
    }

    fn req(&mut self, method: &str, path: &str, body: &str) -> Resp {
        self.0.send(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        self.0.read(false)
    }

    fn put(&mut self, key: &str, value: i64) {
        let r = self.req("POST", &format!("/v1/boxes/{key}"), &value_body(value));
        assert_eq!(r.status, 200, "POST {key}: {}", r.text());
    }

    fn page(&mut self, query: &str) -> Value {
        let r = self.req("GET", &format!("/v1/boxes?{query}"), "");
        assert_eq!(r.status, 200, "{query}: {}", r.text());
        r.json()
    }
}

fn value_body(value: i64) -> String {
    format!(r#"{{"value":{value}}}"#)
}

fn put(a: SocketAddr, key: &str, value: i64) {
    let r = post(a, &format!("/v1/boxes/{key}"), &value_body(value));
    assert_eq!(r.status, 200, "POST {key}: {}", r.text());
}

/// The keys of a page's boxes, in the order given.
fn keys(page: &Value) -> Vec<String> {
    page["boxes"]
        .as_array()
        .unwrap_or_else(|| panic!("no boxes: {page}"))
        .iter()
        .map(|b| {
            b["k"]
                .as_str()
                .unwrap_or_else(|| panic!("no k: {b}"))
                .into()
        })
        .collect()
}

/// Walk every page of `query` (`prefix=...&limit=...`): each page's keys.
fn walk(c: &mut Client, query: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut p = c.page(query);
    loop {
        pages.push(keys(&p));
        assert!(pages.len() < 10_000, "a walk that does not end");
        match &p["next"] {
            Value::Null => return pages,
            Value::String(next) => p = c.page(&format!("{query}&cursor={next}")),
            other => panic!("next is {other}"),
        }
    }
}

#[test]
fn keys_with_separators_page_in_key_order_under_their_prefix() {
    let s = start(config());
    let a = s.addr();
    let all = [
        "room-1/a",
        "room-1/b",
        "room-1/b/c",
        "room-1/c",
        "room-1/d",
        "room-1/e",
        "room-2/a",
        "room-2/b",
        "room-10/x",
        "room-1",
        "tenant:4:a",
        "tenant:4:b",
        "v1.x",
    ];
    // Created out of order: the order is the keys', not the creations'.
    for (i, k) in all.iter().rev().enumerate() {
        put(a, k, i as i64);
    }
    let r = get(a, "/v1/boxes/room-1/b/c");
    assert_eq!(r.json()["k"], "room-1/b/c", "the whole path is the key");

    let mut c = Client::new(a);
    let r = c.req("GET", "/v1/boxes?prefix=room-1/&limit=2", "");
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    let first = r.json();
    assert_eq!(
        first["boxes"][0],
        get(a, "/v1/boxes/room-1/a").json(),
        "a page holds each box's payload"
    );
    let pages = walk(&mut c, "prefix=room-1/&limit=2");
    assert_eq!(
        pages,
        vec![
            vec!["room-1/a", "room-1/b"],
            vec!["room-1/b/c", "room-1/c"],
            vec!["room-1/d", "room-1/e"],
        ],
        "room-1 and room-10/x are not under room-1/"
    );
    assert_eq!(
        walk(&mut c, "prefix=room-2/&limit=5"),
        [["room-2/a", "room-2/b"]]
    );
    assert_eq!(walk(&mut c, "prefix=room-10/"), [["room-10/x"]]);
    assert_eq!(walk(&mut c, "prefix=room-1/b/"), [["room-1/b/c"]]);
    assert_eq!(walk(&mut c, "prefix=room-3/"), [Vec::<String>::new()]);
    assert_eq!(
        walk(&mut c, "prefix=tenant:4:"),
        [["tenant:4:a", "tenant:4:b"]]
    );
    assert_eq!(walk(&mut c, "prefix=v1."), [["v1.x"]]);

    // Percent-encoded, the same prefix: the same pages and cursors.
    let encoded = c.page("prefix=room-1%2F&limit=2");
    assert_eq!(encoded, first);
    assert_eq!(walk(&mut c, "prefix=room-1%2F&limit=2"), pages);
    assert_eq!(
        walk(&mut c, "prefix=tenant%3A4%3A"),
        [["tenant:4:a", "tenant:4:b"]]
    );

    // The empty prefix: every box, in key order, on one page.
    let mut sorted = all.map(String::from).to_vec();
    sorted.sort();
    let every = c.page("prefix=");
    assert_eq!(keys(&every), sorted);
    assert_eq!(every["next"], Value::Null);
    assert_eq!(keys(&c.page("prefix=&limit=100")), sorted);
    s.shutdown().unwrap();
}

/// The empty prefix merges the key order's sets (one per first segment);
/// walked in small pages it must still give every box once, in order.
#[test]
fn the_empty_prefix_walked_in_small_pages_gives_every_box_once() {
    let s = start(config());
    let a = s.addr();
    let mut c = Client::new(a);
    // room-3/ is in a set merged before room-1/'s.
    for key in ["room-3/a", "room-3/b", "room-3/c", "room-1/a", "room-1/b"] {
        c.put(key, 1);
    }
    let p = c.page("prefix=&limit=2");
    assert_eq!(keys(&p), ["room-1/a", "room-1/b"], "{p}");
    let mut all = Vec::new();
    for room in 0..20 {
        for k in ["a", "b", "c"] {
            let key = format!("room-{room}/{k}");
            c.put(&key, room);
            all.push(key);
        }
    }
    all.sort();
    for limit in [1, 2, 3, 5, 10, 100] {
        let got: Vec<String> = walk(&mut c, &format!("prefix=&limit={limit}")).concat();
        assert_eq!(got, all, "prefix= with limit={limit}");
    }
    s.shutdown().unwrap();
}

/// A small xorshift: the churn is varied but needs no crate.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn rkey(i: u32) -> String {
    format!("r/{i:05}")
}

#[test]
fn a_walk_while_boxes_come_and_go_gives_every_lasting_box_exactly_once() {
    let s = start(config());
    let a = s.addr();
    let mut c = Client::new(a);
    // Even numbers are the boxes there from the start (3,000); those that
    // are multiples of 10 but not of 20 are deleted during the walk; odd
    // numbers come and go.
    let doomed = |i: u32| i % 20 == 10;
    for i in (0..6000).step_by(2) {
        c.put(&rkey(i), i as i64);
    }
    let lasting: BTreeSet<String> = (0..6000)
        .step_by(2)
        .filter(|&i| !doomed(i))
        .map(rkey)
        .collect();
    let mut to_delete: BTreeSet<u32> = (0..6000).step_by(2).filter(|&i| doomed(i)).collect();

    // Another connection changes the table all along: odd boxes created and
    // deleted, lasting ones updated.
    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicUsize::new(0));
    let churn = {
        let (stop, churned) = (stop.clone(), churned.clone());
        std::thread::spawn(move || {
            let mut c = Client::new(a);
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            while !stop.load(Ordering::Relaxed) {
                let r = rng(&mut x);
                let odd = (r % 3000) as u32 * 2 + 1;
                match r % 3 {
                    0 => c.put(&rkey(odd), 1),
                    1 => {
                        let st = c
                            .req("DELETE", &format!("/v1/boxes/{}", rkey(odd)), "")
                            .status;
                        assert!(st == 204 || st == 404, "DELETE: {st}");
                    }
                    _ => c.put(&rkey((r % 3000) as u32 * 40 % 6000), 2),
                }
                churned.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut seen: Vec<String> = Vec::new();
    let mut deleted_ahead: Vec<String> = Vec::new();
    let mut p = c.page("prefix=r/&limit=100");
    loop {
        let ks = keys(&p);
        assert!(ks.len() <= 100, "a page of {}", ks.len());
        seen.extend(ks);
        let next = match &p["next"] {
            Value::Null => break,
            Value::String(n) => n.clone(),
            other => panic!("next is {other}"),
        };
        // Between pages: a doomed box behind the cursor and one ahead of it
        // go, and boxes are created behind and ahead of it.
        let at: u32 = seen.last().expect("a key before a cursor")[2..]
            .parse()
            .unwrap();
        let behind = to_delete.range(..at).next_back().copied();
        let ahead = to_delete.range(at + 1..).next().copied();
        for i in [behind, ahead].into_iter().flatten() {
            to_delete.remove(&i);
            let r = c.req("DELETE", &format!("/v1/boxes/{}", rkey(i)), "");
            assert_eq!(r.status, 204, "DELETE {}", rkey(i));
            if Some(i) == ahead {
                deleted_ahead.push(rkey(i));
            }
        }
        c.put(&rkey(at.saturating_sub(2) | 1), 3);
        c.put(&rkey((at + 41) | 1), 3);
        p = c.page(&format!("prefix=r/&limit=100&cursor={next}"));
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert!(churned.load(Ordering::Relaxed) > 0, "the table changed");

    let mut once = HashSet::new();
    for k in &seen {
        assert!(once.insert(k), "{k} given twice");
        assert!(k.starts_with("r/"), "{k} is not under r/");
    }
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "the walk is in key order"
    );
    let missing: Vec<&String> = lasting.iter().filter(|k| !once.contains(k)).collect();
    assert!(
        missing.is_empty(),
        "boxes that lasted the walk, missing: {missing:?}"
    );
    for k in &deleted_ahead {
        assert!(
            !once.contains(k),
            "{k} was deleted before its page was read"
        );
    }
    assert!(!deleted_ahead.is_empty());
    s.shutdown().unwrap();
}

#[test]
fn bad_page_requests_are_400_with_the_reason_and_limit_is_capped() {
    let mut c = config();
    c.limits.max_page_boxes = 5;
    let s = start(c);
    let a = s.addr();
    let mut c = Client::new(a);
    for i in 0..12 {
        c.put(&format!("p/{i:02}"), i);
    }
    for (query, want) in [
        (
            "prefix=p",
            "a prefix is empty or ends with a separator (/, : or .): room-17/",
        ),
        (
            "prefix=room-1/x",
            "a prefix is empty or ends with a separator (/, : or .): room-17/",
        ),
        (
            "prefix=p/&keys=p/00",
            "keys and prefix given together: ask for one",
        ),
        (
            "keys=p/00&prefix=p/",
            "keys and prefix given together: ask for one",
        ),
        ("prefix=p/&limit=0", "limit must be at least 1"),
        ("prefix=p/&cursor=zz", "cursor is not one a page gave"),
        ("prefix=p/&cursor=abc", "cursor is not one a page gave"),
        (
            "limit=2",
            "limit and cursor page a prefix (GET /v1/boxes?prefix=P&limit=N)",
        ),
        (
            "cursor=702f3030",
            "limit and cursor page a prefix (GET /v1/boxes?prefix=P&limit=N)",
        ),
        (
            "keys=p/00&limit=2",
            "limit and cursor page a prefix (GET /v1/boxes?prefix=P&limit=N)",
        ),
    ] {
        let r = c.req("GET", &format!("/v1/boxes?{query}"), "");
        assert_eq!(r.status, 400, "{query}: {}", r.text());
        assert_eq!(r.json(), json!({ "error": want }), "{query}");
    }
    // A prefix stream checks its prefix the same way.
    let (r, _) = raw(
        a,
        b"GET /v1/boxes?prefix=p HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n",
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // Above max_page_boxes (5): 5 a page, and the walk still gives all 12.
    let p = c.page("prefix=p/&limit=1000");
    assert_eq!(keys(&p), ["p/00", "p/01", "p/02", "p/03", "p/04"]);
    assert!(p["next"].is_string(), "{p}");
    assert_eq!(keys(&c.page("prefix=p/")).len(), 5, "the default, capped");
    let pages = walk(&mut c, "prefix=p/&limit=1000");
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [5, 5, 2]);
    let want: Vec<String> = (0..12).map(|i| format!("p/{i:02}")).collect();
    assert_eq!(pages.concat(), want);
    // A cursor a page gave works with a smaller limit too.
    let next = p["next"].as_str().unwrap();
    let p = c.page(&format!("prefix=p/&limit=2&cursor={next}"));
    assert_eq!(keys(&p), ["p/05", "p/06"]);
    s.shutdown().unwrap();
}

/// One event of a stream, as sent.
#[derive(Debug, Default, Clone, PartialEq)]
struct Ev {
    event: Option<String>,
    data: Option<String>,
}

impl Ev {
    fn json(&self) -> Value {
        let d = self
            .data
            .as_deref()
            .unwrap_or_else(|| panic!("no data: {self:?}"));
        serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))
    }
    /// The key of a `data:` event's payload.
    fn key(&self) -> String {
        assert_eq!(self.event, None, "{self:?}");
        self.json()["k"].as_str().expect("a key").to_string()
    }
}

/// An event stream of a prefix: the head read, then events one by one.
struct Sub {
    stream: TcpStream,
    head: String,
    buf: Vec<u8>,
    retry: Option<u64>,
}

impl Sub {
    fn open(a: SocketAddr, prefix: &str, extra: &str) -> Sub {
        let mut stream = connect(a);
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(
            stream,
            "GET /v1/boxes?prefix={prefix} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{extra}\r\n"
        )
        .unwrap();
        let mut sub = Sub {
            stream,
            head: String::new(),
            buf: Vec::new(),
            retry: None,
        };
        loop {
            if let Some(i) = sub.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                sub.head = String::from_utf8(sub.buf[..i + 4].to_vec()).unwrap();
                sub.buf.drain(..i + 4);
                break;
            }
            assert!(sub.fill(), "EOF before the head");
        }
        let h = sub.head.to_ascii_lowercase();
        assert!(h.starts_with("http/1.1 200 "), "{}", sub.head);
        assert!(h.contains("\r\ncontent-type: text/event-stream\r\n"), "{h}");
        sub
    }

    fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 65536];
        match read_some(&mut self.stream, &mut tmp) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(e) => panic!("read: {e} (have {:?})", String::from_utf8_lossy(&self.buf)),
        }
    }

    /// The next event with an `event:` or `data:` (heartbeats, `retry:` and
    /// `id:` lines read and passed over).
    fn next(&mut self) -> Ev {
        loop {
            let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") else {
                assert!(self.fill(), "EOF before an event");
                continue;
            };
            let block = String::from_utf8(self.buf[..i].to_vec()).unwrap();
            self.buf.drain(..i + 2);
            let mut ev = Ev::default();
            for line in block.lines() {
                if line.starts_with(':') || line.starts_with("id: ") {
                } else if let Some(v) = line.strip_prefix("event: ") {
                    ev.event = Some(v.into());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    ev.data = Some(v.into());
                } else if let Some(v) = line.strip_prefix("retry: ") {
                    self.retry = Some(v.parse().unwrap());
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            if ev.event.is_some() || ev.data.is_some() {
                return ev;
            }
        }
    }

    /// The listing: the payloads up to `event: synced`.
    fn listing(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let ev = self.next();
            match ev.event.as_deref() {
                None => out.push(ev.json()),
                Some("synced") => {
                    assert_eq!(ev.json(), json!({}));
                    return out;
                }
                Some(other) => panic!("{other} during the listing: {ev:?}"),
            }
        }
    }
}

fn listed_keys(listing: &[Value]) -> Vec<String> {
    listing
        .iter()
        .map(|p| p["k"].as_str().expect("a key").to_string())
        .collect()
}

#[test]
fn a_prefix_stream_lists_the_room_then_sends_what_moves_under_it() {
    let s = start(config());
    let a = s.addr();
    for (k, v) in [
        ("room-5/c", 3),
        ("room-5/a", 1),
        ("room-5/b", 2),
        ("room-50/x", 9),
        ("room-5", 9),
        ("room-6/a", 9),
    ] {
        put(a, k, v);
    }
    let mut sub = Sub::open(a, "room-5%2F", "");
    let listing = sub.listing();
    assert_eq!(sub.retry, Some(1000), "the head's retry: comes first");
    assert_eq!(listed_keys(&listing), ["room-5/a", "room-5/b", "room-5/c"]);
    assert_eq!(listing[1], get(a, "/v1/boxes/room-5/b").json());

    // An update under the prefix.
    put(a, "room-5/b", 7);
    let ev = sub.next();
    assert_eq!(ev.key(), "room-5/b");
    assert_eq!(ev.json(), get(a, "/v1/boxes/room-5/b").json());
    assert_eq!(ev.json()["v"], 7);
    // Boxes under other prefixes, then one created under it: only that one
    // comes (were the others sent, they would come first).
    put(a, "room-6/b", 1);
    put(a, "room-50/y", 1);
    put(a, "room-5", 10);
    put(a, "room-5/d", 4);
    assert_eq!(sub.next().key(), "room-5/d");
    put(a, "room-5/d/deep", 5);
    assert_eq!(
        sub.next().key(),
        "room-5/d/deep",
        "a key under a deeper prefix"
    );
    // A deletion.
    assert_eq!(delete(a, "/v1/boxes/room-5/a").status, 204);
    let ev = sub.next();
    assert_eq!(ev.event.as_deref(), Some("deleted"), "{ev:?}");
    assert_eq!(ev.json(), json!({"k": "room-5/a"}));
    // Deleted under another prefix: nothing; the next event is this one.
    assert_eq!(delete(a, "/v1/boxes/room-6/a").status, 204);
    put(a, "room-5/c", 30);
    let ev = sub.next();
    assert_eq!(
        (ev.key(), ev.json()["v"].clone()),
        (String::from("room-5/c"), json!(30))
    );

    // A room larger than one step of the listing, listed whole, in order.
    let mut c = Client::new(a);
    let big: Vec<String> = (0..150).map(|i| format!("big/{i:03}")).collect();
    for (i, k) in big.iter().enumerate().rev() {
        c.put(k, i as i64);
    }
    let mut whole = Sub::open(a, "big/", "");
    assert_eq!(listed_keys(&whole.listing()), big);
    s.shutdown().unwrap();
}

#[test]
fn a_box_that_expires_under_the_prefix_arrives_as_deleted() {
    let mut c = config();
    c.boxes.ttl_s = 1;
    let s = start(c);
    let a = s.addr();
    let mut sub = Sub::open(a, "room-8/", "");
    assert!(sub.listing().is_empty());
    put(a, "room-8/short", 1);
    // It is sent when created (unless it expired first: then only its
    // deletion may come); it expires within a few seconds: wait for it.
    let ev = loop {
        let ev = sub.next();
        if ev.event.is_some() {
            break ev;
        }
        assert_eq!(ev.key(), "room-8/short");
    };
    assert_eq!(ev.event.as_deref(), Some("deleted"), "{ev:?}");
    assert_eq!(ev.json(), json!({"k": "room-8/short"}));
    assert_eq!(get(a, "/v1/boxes/room-8/short").status, 404);
    until("counted as expired", || {
        metric(a, "pollbox_boxes_expired_total") == 1
    });
    s.shutdown().unwrap();
}

#[test]
fn past_max_prefix_streams_a_stream_is_503_until_one_closes() {
    let mut c = config();
    c.limits.max_prefix_streams = 2;
    let s = start(c);
    let a = s.addr();
    put(a, "room-1/a", 1);
    let mut one = Sub::open(a, "room-1/", "");
    assert_eq!(listed_keys(&one.listing()), ["room-1/a"]);
    until("one prefix stream", || metric(a, GAUGE) == 1);
    let mut two = Sub::open(a, "", "");
    assert_eq!(listed_keys(&two.listing()), ["room-1/a"]);
    until("two prefix streams", || metric(a, GAUGE) == 2);

    let third =
        b"GET /v1/boxes?prefix=room-2/ HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n";
    let (r, _) = raw(a, third);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error": "too many prefix streams (limits.max_prefix_streams)"})
    );
    // Pages are not streams: still answered.
    let mut c = Client::new(a);
    assert_eq!(keys(&c.page("prefix=room-1/")), ["room-1/a"]);

    drop(one);
    until("the closed stream is gone", || metric(a, GAUGE) == 1);
    let mut three = Sub::open(a, "room-2/", "");
    assert!(three.listing().is_empty());
    until("two prefix streams again", || metric(a, GAUGE) == 2);
    // The streams still open go on.
    put(a, "room-2/b", 2);
    assert_eq!(three.next().key(), "room-2/b");
    assert_eq!(two.next().key(), "room-2/b");
    s.shutdown().unwrap();
}

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn a_prefix_read_needs_a_token_covering_the_whole_prefix() {
    use common::jwt::{claims, keys as jwt_keys, mint, now, tempdir, token_access};
    let dir = tempdir("rooms");
    jwt_keys(&dir);
    let t = now() + 600;
    let tokens = mint(
        &dir,
        &[
            json!({"kid": "es", "claims": claims(t, &["room-17/*"], &[])}),
            json!({"kid": "ed", "claims": claims(t, &["*"], &[])}),
            json!({"kid": "es", "claims": claims(t, &["room-17/a", "room-17/a/b"], &[])}),
        ],
    );
    let (room, every, exact) = (&tokens[0], &tokens[1], &tokens[2]);
    let mut c = config();
    token_access(&mut c, &dir.join("jwks.json"), "ingest-secret");
    let s = start(c);
    let a = s.addr();
    for key in ["room-17/a", "room-17/a/b", "room-1/x"] {
        let body = value_body(1);
        let req = format!(
            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ingest-secret\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        assert_eq!(raw(a, req.as_bytes()).0.status, 200, "{key}");
    }
    let ask = |token: &str, prefix: &str, stream: bool| {
        let accept = if stream {
            "Accept: text/event-stream\r\n"
        } else {
            ""
        };
        let req = format!(
            "GET /v1/boxes?prefix={prefix} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n{accept}\r\n"
        );
        raw(a, req.as_bytes()).0
    };
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");

    // room-17/* covers room-17/ and room-17/a/: pages and streams.
    let r = ask(room, "room-17/", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r.json()), ["room-17/a", "room-17/a/b"]);
    let r = ask(room, "room-17%2Fa%2F", false);
    assert_eq!(keys(&r.json()), ["room-17/a/b"]);
    let mut sub = Sub::open(a, "room-17/", &bearer(room));
    assert_eq!(listed_keys(&sub.listing()), ["room-17/a", "room-17/a/b"]);
    let mut sub = Sub::open(a, "room-17/a/", &bearer(room));
    assert_eq!(listed_keys(&sub.listing()), ["room-17/a/b"]);

    // Not room-1/, nor the empty prefix; nor does a list of exact keys cover
    // a prefix; pages and streams alike, the prefix named.
    for (token, prefix, shown) in [
        (room, "room-1/", "room-1/"),
        (room, "room-1%2F", "room-1/"),
        (room, "", ""),
        (exact, "room-17/a/", "room-17/a/"),
    ] {
        for stream in [false, true] {
            let r = ask(token, prefix, stream);
            assert_eq!(r.status, 403, "{prefix:?} stream={stream}: {}", r.text());
            assert_eq!(r.json(), json!({"error": "forbidden", "prefix": shown}));
            assert_eq!(
                r.header("WWW-Authenticate"),
                Some("Bearer error=\"insufficient_scope\"")
            );
        }
    }
    // No token at all: 401.
    let (r, _) = raw(
        a,
        b"GET /v1/boxes?prefix=room-17/ HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    assert_eq!(r.status, 401, "{}", r.text());

    // `*` reads the empty prefix: every box.
    let r = ask(every, "", false);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(keys(&r.json()), ["room-1/x", "room-17/a", "room-17/a/b"]);
    let mut sub = Sub::open(a, "", &bearer(every));
    assert_eq!(
        listed_keys(&sub.listing()),
        ["room-1/x", "room-17/a", "room-17/a/b"]
    );
    s.shutdown().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn prefix_streams_and_pages_are_counted() {
    let s = start(config());
    let a = s.addr();
    put(a, "m/a", 1);
    assert_eq!(metric(a, GAUGE), 0);
    let mut sub = Sub::open(a, "m/", "");
    assert_eq!(listed_keys(&sub.listing()), ["m/a"]);
    until("the gauge counts the stream", || metric(a, GAUGE) == 1);
    assert_eq!(
        metric(a, "pollbox_sse_subscribers"),
        1,
        "an event stream too"
    );
    until("counted once as a route", || {
        metric(
            a,
            r#"pollbox_http_requests_total{route="prefix_stream",code="200"}"#,
        ) == 1
    });
    drop(sub);
    until("the gauge drops when the client closes", || {
        metric(a, GAUGE) == 0
    });
    assert_eq!(metric(a, "pollbox_sse_subscribers"), 0);

    let mut c = Client::new(a);
    let page_200 = r#"pollbox_http_requests_total{route="page",code="200"}"#;
    assert_eq!(metric(a, page_200), 0);
    for _ in 0..3 {
        c.page("prefix=m/");
    }
    c.page("prefix=");
    assert_eq!(c.req("GET", "/v1/boxes?prefix=m/&limit=0", "").status, 400);
    until("pages counted", || metric(a, page_200) == 4);
    until("a refused page counted", || {
        metric(a, r#"pollbox_http_requests_total{route="page",code="400"}"#) == 1
    });
    s.shutdown().unwrap();
}
