//! Presence from real browsers (docs/presence.md): two headless Chromium
//! processes at once, each loading a page from its own loopback origin, are
//! two people in one room of the `pollbox` binary (standalone, with
//! `presence.leave_grace_ms = 500` and CORS for both origins).
//!
//! Each page follows the room's presence (`/v1/boxes/browser-room%2F~presence`)
//! with `EventSource`, as the JavaScript client does with a member: it
//! compares each state's `members` with the one before (by id) and records
//! joins and leaves in the DOM. It first watches the room without being in
//! it (a stream with no `member=`: the empty room); when the test says so it
//! closes that stream and opens one with `member=ann` (or `ben`) and
//! `info={"name":...}`, going on from the last state it had. The test lets
//! ann in first, then ben: so ben's page sees ann join while it watches, and
//! ann's page sees ben join on her own stream as a member. A plain poll of the
//! room's presence box lists both, with their info.
//!
//! Then ben closes his tab: his page's load ends, Chromium dumps the DOM and
//! exits, and its connection ends. ann's page, still open, sees ben leave;
//! the test polls the presence box (and `/metrics`) meanwhile, and ben is
//! gone only after the grace: at least `leave_grace_ms` after the test let
//! his page end, and after the last `/metrics` that still counted his
//! connection open. Last, ann's page ends too, and the room is empty again
//! (two joins, two leaves in `/metrics`).
//!
//! Needs Debian's `chromium` (`.ci/run` installs it); run with
//! `cargo test -p pollbox --test browser_presence -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;

use chromium::{chromium_dump_dom, page_origin, results};

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The room's presence key (the room is `browser-room/`).
const PRESENCE: &str = "browser-room/~presence";
/// `presence.leave_grace_ms` of the server under test.
const GRACE_MS: u64 = 500;
/// The server's clock for presence moves once an epoch (`server.epoch_ms`,
/// 16 by default): a grace starts at the clock of the worker's last tick.
const EPOCH_MS: u64 = 16;

/// The page: `POLLBOX`, `PRESENCE`, `MEMBER` and `INFO` (a JSON object) are
/// filled in. It watches the room's presence with no member until `/present`
/// answers, then follows it as `MEMBER`; every state it gets is compared
/// with the one before (the first state is the baseline). It reports each
/// step to the test (its own origin: `/report?...`) and writes what it saw
/// into `#results`; `/hold` holds its load event (and so Chromium's exit)
/// until the test lets it end. Anything unexpected goes into `errors`.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox presence</title></head>
<body><pre id="results">pending</pre>
<img src="/hold" alt="">
<script>
const me = "MEMBER";
const key = "PRESENCE";
const url = "POLLBOX/v1/boxes/" + encodeURIComponent(key);
const results = { member: me, states: [], joins: [], leaves: [], infos: {}, opens: [], errors: [] };
let last = null; // the ids of the last state: what the next is compared with
let lastVer = 0;
function record() {
  document.getElementById("results").textContent = JSON.stringify(results);
}
function report(what) {
  fetch("/report?" + what, { cache: "no-store" }).catch(() => {});
}
function fail(what) {
  results.errors.push(what);
  record();
  report("error=" + encodeURIComponent(what));
}
function follow(src, stream) {
  const es = new EventSource(src);
  es.onopen = () => { results.opens.push(stream); record(); report("open=" + stream); };
  es.onerror = () => fail(stream + ": EventSource error, readyState " + es.readyState);
  es.onmessage = (e) => {
    let p;
    try { p = JSON.parse(e.data); } catch (err) { return fail(stream + ": not JSON: " + e.data); }
    if (p.k !== key || !Array.isArray(p.members) || p.count !== p.members.length) {
      return fail(stream + ": not the room's listed presence: " + e.data);
    }
    if (p.ver < lastVer) fail(stream + ": version " + p.ver + " after " + lastVer);
    lastVer = p.ver;
    const ids = p.members.map((m) => m.id);
    for (const m of p.members) if (m.info) results.infos[m.id] = m.info;
    if (last !== null) {
      for (const id of last) {
        if (!ids.includes(id)) { results.leaves.push(id); report("leave=" + encodeURIComponent(id)); }
      }
      for (const id of ids) {
        if (!last.includes(id)) { results.joins.push(id); report("join=" + encodeURIComponent(id)); }
      }
    }
    last = ids;
    results.states.push({ stream: stream, ver: p.ver, members: ids });
    record();
    report("state=" + stream + ":" + ids.map(encodeURIComponent).join("_"));
  };
  return es;
}
const watch = follow(url, "watch");
fetch("/present", { cache: "no-store" }).then(() => {
  // Into the room: the watching stream closes, the member's stream goes on
  // from the last state the page had (whole states: nothing is missed).
  watch.close();
  follow(url + "?member=" + encodeURIComponent(me) + "&info=" + encodeURIComponent(JSON.stringify(INFO)), "member");
});
record();
</script></body></html>
"#;

/// Answers a page's request only once released (or after two minutes).
#[derive(Default)]
struct Hold {
    released: Mutex<bool>,
    cv: Condvar,
}

impl Hold {
    fn wait(&self) {
        let released = self.released.lock().unwrap();
        let _ = self
            .cv
            .wait_timeout_while(released, Duration::from_secs(120), |r| !*r)
            .unwrap();
    }

    fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// Releases its holds when dropped, so a test that fails part way lets the
/// pages end (and Chromium exit) without waiting for the holds' timeout.
struct ReleaseOnDrop(Vec<Arc<Hold>>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.release();
        }
    }
}

/// One page's origin: its `/hold` (the load event) and `/present` (into the
/// room).
struct Holds {
    hold: Arc<Hold>,
    present: Arc<Hold>,
}

/// Read a request head from `stream`; its target (`/` if unreadable).
fn request_target(stream: &TcpStream) -> String {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut target = None;
    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
        if line == "\r\n" {
            break;
        }
        target.get_or_insert_with(|| line.split(' ').nth(1).unwrap_or("/").to_owned());
        line.clear();
    }
    target.unwrap_or_else(|| "/".into())
}

/// Serve `page` on `listener` for `who`: `/report?WHAT` sends `who:WHAT` to
/// the test, `/hold` and `/present` wait for their holds, anything else gets
/// the page.
fn serve_page(
    listener: TcpListener,
    who: &'static str,
    page: String,
    reports: Sender<String>,
) -> Holds {
    let holds = Holds {
        hold: Arc::new(Hold::default()),
        present: Arc::new(Hold::default()),
    };
    let (hold, present) = (holds.hold.clone(), holds.present.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (page, reports) = (page.clone(), reports.clone());
            let (hold, present) = (hold.clone(), present.clone());
            std::thread::spawn(move || {
                let target = request_target(&stream);
                let (kind, body) = if let Some(what) = target.strip_prefix("/report?") {
                    let _ = reports.send(format!("{who}:{what}"));
                    ("text/plain", String::new())
                } else if target == "/hold" {
                    hold.wait();
                    ("text/plain", String::new())
                } else if target == "/present" {
                    present.wait();
                    ("text/plain", String::new())
                } else {
                    ("text/html; charset=utf-8", page)
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nCache-Control: no-store\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    holds
}

/// What the pages have reported so far.
#[derive(Default)]
struct Reports {
    got: HashSet<String>,
    all: Vec<String>,
}

impl Reports {
    /// Wait up to `within` until the pages have reported each of `wanted`;
    /// else panic with `what`, which are missing and the last reports.
    fn wait_for(
        &mut self,
        reports: &Receiver<String>,
        wanted: &[&str],
        within: Duration,
        what: &str,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let missing: Vec<&&str> = wanted.iter().filter(|w| !self.got.contains(**w)).collect();
            if missing.is_empty() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok(r) => {
                    self.got.insert(r.clone());
                    self.all.push(r);
                }
                Err(_) => {
                    let recent = &self.all[self.all.len().saturating_sub(30)..];
                    panic!("{what}: missing {missing:?}; the last reports: {recent:?}");
                }
            }
        }
    }
}

/// The room's presence by a plain poll: its body as JSON.
fn presence(addr: SocketAddr) -> Value {
    let (code, body) = common::get(addr, "/v1/boxes/browser-room%2F~presence");
    assert_eq!(code, 200, "GET the room's presence: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("the room's presence: {e}: {body:?}"))
}

/// The member ids a presence payload lists.
fn ids(p: &Value) -> Vec<&str> {
    p["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members listed: {p}"))
        .iter()
        .map(|m| {
            m["id"]
                .as_str()
                .unwrap_or_else(|| panic!("a member with no id: {p}"))
        })
        .collect()
}

/// A value of `/metrics` (a family with no labels).
fn metric(addr: SocketAddr, name: &str) -> u64 {
    let (code, text) = common::get(addr, "/metrics");
    assert_eq!(code, 200, "/metrics: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// The strings a page's results hold at `field` (an array of strings).
fn strings<'a>(r: &'a Value, field: &str) -> Vec<&'a str> {
    r[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in the page's results: {r}"))
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap_or_else(|| panic!("{field}: not a string in {r}"))
        })
        .collect()
}

#[test]
#[ignore = "needs chromium (Debian package chromium); .ci/run installs it"]
fn two_pages_see_each_other_join_and_a_closed_tab_leaves_after_the_grace() {
    let (ann_listener, ann_origin) = page_origin();
    let (ben_listener, ben_origin) = page_origin();
    let dir = common::tmpdir("browser-presence");
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
             [http]\ncors_origins = [\"http://{ann_origin}\", \"http://{ben_origin}\"]\n\
             [presence]\nleave_grace_ms = {GRACE_MS}\n"
        ),
    )
    .expect("write the config");
    let (server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    assert_eq!(presence(addr)["count"], 0, "the room is empty at first");

    let page = |member: &str, name: &str| {
        PAGE.replace("POLLBOX", &format!("http://{addr}"))
            .replace("PRESENCE", PRESENCE)
            .replace("MEMBER", member)
            .replace("INFO", &json!({ "name": name }).to_string())
    };
    let (report_tx, reports) = std::sync::mpsc::channel();
    let ann = serve_page(ann_listener, "ann", page("ann", "Ann"), report_tx.clone());
    let ben = serve_page(ben_listener, "ben", page("ben", "Ben"), report_tx);
    let _release = ReleaseOnDrop(vec![
        ann.hold.clone(),
        ann.present.clone(),
        ben.hold.clone(),
        ben.present.clone(),
    ]);
    // Two Chromium processes at once: each lives until the test answers its
    // page's `/hold`.
    let ann_browser =
        std::thread::spawn(move || chromium_dump_dom(&format!("http://{ann_origin}/"), &[]));
    let ben_browser =
        std::thread::spawn(move || chromium_dump_dom(&format!("http://{ben_origin}/"), &[]));
    let mut r = Reports::default();
    let within = Duration::from_secs(60);

    // Both pages watch the empty room.
    r.wait_for(
        &reports,
        &[
            "ann:open=watch",
            "ann:state=watch:",
            "ben:open=watch",
            "ben:state=watch:",
        ],
        within,
        "the pages watch the room",
    );
    // ann comes in: her own stream lists her; ben's page sees her join.
    ann.present.release();
    r.wait_for(
        &reports,
        &[
            "ann:open=member",
            "ann:state=member:ann",
            "ann:join=ann",
            "ben:join=ann",
        ],
        within,
        "ann joins",
    );
    // ben comes in: ann's page sees him join on her stream as a member.
    ben.present.release();
    r.wait_for(
        &reports,
        &[
            "ben:open=member",
            "ben:state=member:ann_ben",
            "ben:join=ben",
            "ann:join=ben",
        ],
        within,
        "ben joins",
    );
    let both = presence(addr);
    assert_eq!(both["count"], 2, "{both}");
    assert_eq!(
        both["members"],
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "ben", "info": {"name": "Ben"}}]),
        "the plain poll lists both, with their info"
    );
    assert_eq!(
        metric(addr, "pollbox_presence_connections"),
        2,
        "one stream each"
    );

    // ben closes his tab: his page's load ends, Chromium dumps the DOM and
    // exits. Meanwhile the test polls `/metrics` (when his connection ends)
    // and the presence box (when he is gone).
    let let_go = Instant::now();
    ben.hold.release();
    let mut ben_browser = Some(ben_browser);
    let mut ben_dom = None;
    let mut exited = None; // when ben's Chromium was seen to have exited
    let mut last_open = let_go; // the start of the last look that counted his connection open
    let mut closed = None; // when his connection was first seen ended
    let mut listed_after_close = 0; // polls that listed him after that (his grace)
    let gone = loop {
        let look = Instant::now();
        assert!(
            look.duration_since(let_go) < Duration::from_secs(30),
            "ben was not gone 30 s after his page ended: {}",
            presence(addr)
        );
        if ben_browser.as_ref().is_some_and(|b| b.is_finished()) {
            let b = ben_browser.take().expect("ben's Chromium");
            ben_dom = Some(b.join().expect("ben's Chromium"));
            exited = Some(look);
        }
        let open = metric(addr, "pollbox_presence_connections");
        let p = presence(addr);
        let listed = ids(&p).contains(&"ben");
        if open == 2 {
            assert!(listed, "his connection is open, yet he is not listed: {p}");
            last_open = look;
        } else if closed.is_none() {
            closed = Some(look);
        }
        if !listed {
            break Instant::now();
        }
        if closed.is_some() {
            listed_after_close += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis();
    eprintln!(
        "ben's page let go at 0 ms; Chromium seen exited at {:?} ms; his connection last seen open \
         at {} ms, seen closed at {:?} ms; gone from the presence box at {} ms ({listed_after_close} \
         polls listed him in his grace)",
        exited.map(|e| ms(let_go, e)),
        ms(let_go, last_open),
        closed.map(|c| ms(let_go, c)),
        ms(let_go, gone),
    );
    // His connection cannot end before his page was let go, nor before the
    // last `/metrics` that counted it open: the grace runs from then (from
    // the worker's clock, which is at most an epoch behind).
    assert!(
        gone.duration_since(let_go) >= Duration::from_millis(GRACE_MS),
        "ben was gone {} ms after his page was let go, before the grace ({GRACE_MS} ms)",
        ms(let_go, gone)
    );
    assert!(
        gone.duration_since(last_open) >= Duration::from_millis(GRACE_MS - EPOCH_MS),
        "ben was gone {} ms after his connection was last seen open, before the grace ({GRACE_MS} ms)",
        ms(last_open, gone)
    );
    let p = presence(addr);
    assert_eq!(p["count"], 1, "{p}");
    assert_eq!(
        p["members"],
        json!([{"id": "ann", "info": {"name": "Ann"}}]),
        "{p}"
    );
    r.wait_for(
        &reports,
        &["ann:leave=ben"],
        within,
        "ann's page sees ben leave",
    );
    let ben_dom = match ben_browser {
        Some(b) => b.join().expect("ben's Chromium"),
        None => ben_dom.expect("ben's DOM"),
    };

    // ann's page ends too.
    ann.hold.release();
    let ann_dom = ann_browser.join().expect("ann's Chromium");
    let ann_res = results(&ann_dom);
    let ben_res = results(&ben_dom);
    eprintln!("ann's page: {ann_res}\nben's page: {ben_res}");
    for (who, res, other, name) in [
        ("ann", &ann_res, "ben", "Ben"),
        ("ben", &ben_res, "ann", "Ann"),
    ] {
        assert_eq!(
            strings(res, "errors"),
            Vec::<&str>::new(),
            "{who}'s page: {res}"
        );
        assert_eq!(
            strings(res, "opens"),
            ["watch", "member"],
            "{who}'s page: {res}"
        );
        assert!(
            strings(res, "joins").contains(&other),
            "{who}'s page saw {other} join: {res}"
        );
        assert_eq!(
            res["infos"][other],
            json!({ "name": name }),
            "{who}'s page: {res}"
        );
    }
    assert_eq!(strings(&ann_res, "joins"), ["ann", "ben"], "{ann_res}");
    assert_eq!(strings(&ann_res, "leaves"), ["ben"], "{ann_res}");
    assert_eq!(strings(&ben_res, "joins"), ["ann", "ben"], "{ben_res}");
    assert_eq!(strings(&ben_res, "leaves"), Vec::<&str>::new(), "{ben_res}");
    // Where each page saw the other join: ben's while he watched, ann's on
    // her stream as a member.
    let states = |res: &Value| -> Vec<(String, Vec<String>)> {
        res["states"]
            .as_array()
            .unwrap_or_else(|| panic!("no states: {res}"))
            .iter()
            .map(|s| {
                let stream = s["stream"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a state with no stream: {s}"));
                let members = s["members"]
                    .as_array()
                    .unwrap_or_else(|| panic!("a state with no members: {s}"))
                    .iter()
                    .map(|m| {
                        m.as_str()
                            .unwrap_or_else(|| panic!("a member not a string: {s}"))
                            .to_owned()
                    })
                    .collect();
                (stream.to_owned(), members)
            })
            .collect()
    };
    let st = |stream: &str, members: &[&str]| {
        (
            stream.to_owned(),
            members.iter().map(|m| m.to_string()).collect(),
        )
    };
    assert_eq!(
        states(&ann_res),
        [
            st("watch", &[]),
            st("member", &["ann"]),
            st("member", &["ann", "ben"]),
            st("member", &["ann"])
        ],
        "{ann_res}"
    );
    assert_eq!(
        states(&ben_res),
        [
            st("watch", &[]),
            st("watch", &["ann"]),
            st("member", &["ann", "ben"])
        ],
        "{ben_res}"
    );

    // ann's tab closed: after her grace the room is empty.
    let deadline = Instant::now() + Duration::from_secs(30);
    while presence(addr)["count"] != 0 {
        assert!(
            Instant::now() < deadline,
            "ann was not gone 30 s after her page ended: {}",
            presence(addr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = presence(addr);
    assert_eq!(
        (&p["k"], &p["members"]),
        (&json!(PRESENCE), &json!([])),
        "{p}"
    );
    assert_eq!(metric(addr, "pollbox_presence_joins_total"), 2);
    assert_eq!(metric(addr, "pollbox_presence_leaves_total"), 2);
    assert_eq!(metric(addr, "pollbox_presence_connections"), 0);

    let st = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let mut server = server;
    assert!(server.wait().expect("wait").success(), "a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}
