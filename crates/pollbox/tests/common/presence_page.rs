//! The page of the Chromium presence tests (tests/browser_presence.rs on one
//! server, tests/browser_presence_cluster.rs on two nodes of a log): it
//! follows a room's presence with `EventSource` and reports each step to the
//! test; the server of its origin, whose holds let the page into the room
//! and end its load; the reports as the test waits for them; and what the
//! test reads of presence (a plain poll, `/metrics`, the page's results).
//!
//! Included with `#[path]` by test binaries that also have `mod common;` and
//! `mod chromium;` (common/chromium.rs).
#![allow(dead_code)] // each test binary uses what it needs

use crate::chromium::{serve_page_with_holds, Hold};

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The server's clock for presence moves once an epoch (`server.epoch_ms`,
/// 16 by default): a grace starts at the clock of the worker's last tick.
const EPOCH_MS: u64 = 16;

/// The page: `POLLBOX` (the server, or the HAProxy in front of the page's
/// node), `PRESENCE`, `MEMBER` and `INFO` (a JSON object) are filled in. It
/// watches the room's presence with no member until `/present` answers, then
/// follows it as `MEMBER`; every state it gets is compared with the one
/// before (the first state is the baseline). It reports each step to the
/// test (its own origin: `/report?...`) and writes what it saw into
/// `#results`; `/hold` holds its load event (and so Chromium's exit) until
/// the test lets it end. Anything unexpected goes into `errors`, and is
/// reported as `fail=STREAM`.
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
function fail(stream, what) {
  results.errors.push(stream + ": " + what);
  record();
  report("fail=" + stream);
}
function follow(src, stream) {
  const es = new EventSource(src);
  es.onopen = () => { results.opens.push(stream); record(); report("open=" + stream); };
  es.onerror = () => fail(stream, "EventSource error, readyState " + es.readyState);
  es.onmessage = (e) => {
    let p;
    try { p = JSON.parse(e.data); } catch (err) { return fail(stream, "not JSON: " + e.data); }
    if (p.k !== key || !Array.isArray(p.members) || p.count !== p.members.length) {
      return fail(stream, "not the room's listed presence: " + e.data);
    }
    if (p.ver < lastVer) fail(stream, "version " + p.ver + " after " + lastVer);
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

/// The page for `member` (info `{"name": name}`) in the room whose presence
/// key is `presence`, on the server at `pollbox` (`http://...` or
/// `https://...`).
pub fn page(pollbox: &str, presence: &str, member: &str, name: &str) -> String {
    PAGE.replace("POLLBOX", pollbox)
        .replace("PRESENCE", presence)
        .replace("MEMBER", member)
        .replace("INFO", &json!({ "name": name }).to_string())
}

/// One page's origin: its `/hold` (the load event) and `/present` (into the
/// room).
pub struct Holds {
    pub hold: Arc<Hold>,
    pub present: Arc<Hold>,
}

/// Serve `page` on `listener` for `who`: `/report?WHAT` sends `who:WHAT`
/// to the test, with when it came, `/hold` and `/present` wait for their
/// holds, anything else gets the page.
pub fn serve_page(
    listener: TcpListener,
    who: &'static str,
    page: String,
    reports: Sender<(Instant, String)>,
) -> Holds {
    let holds = Holds {
        hold: Arc::new(Hold::default()),
        present: Arc::new(Hold::default()),
    };
    serve_page_with_holds(
        listener,
        page,
        move |what| {
            let _ = reports.send((Instant::now(), format!("{who}:{what}")));
        },
        vec![
            ("/hold", holds.hold.clone()),
            ("/present", holds.present.clone()),
        ],
    );
    holds
}

/// What the pages have reported so far, each with when its page server
/// got it.
#[derive(Default)]
pub struct Reports {
    got: HashSet<String>,
    pub all: Vec<(Instant, String)>,
}

impl Reports {
    /// Take the reports that have come, without waiting.
    pub fn drain(&mut self, reports: &Receiver<(Instant, String)>) {
        while let Ok((at, r)) = reports.try_recv() {
            self.got.insert(r.clone());
            self.all.push((at, r));
        }
    }

    /// Wait up to `within` until the pages have reported each of `wanted`;
    /// else panic with `what`, which are missing and the last reports.
    pub fn wait_for(
        &mut self,
        reports: &Receiver<(Instant, String)>,
        wanted: &[&str],
        within: Duration,
        what: &str,
    ) {
        let deadline = Instant::now() + within;
        loop {
            self.drain(reports);
            let missing: Vec<&&str> = wanted.iter().filter(|w| !self.got.contains(**w)).collect();
            if missing.is_empty() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok((at, r)) => {
                    self.got.insert(r.clone());
                    self.all.push((at, r));
                }
                Err(_) => panic!(
                    "{what}: missing {missing:?}; the last reports: {:?}",
                    self.recent()
                ),
            }
        }
    }

    /// The last 30 reports, for a message.
    pub fn recent(&self) -> Vec<&str> {
        self.all[self.all.len().saturating_sub(30)..]
            .iter()
            .map(|(_, r)| r.as_str())
            .collect()
    }

    /// When `report` first came, if it has.
    pub fn when(&self, report: &str) -> Option<Instant> {
        self.all.iter().find(|(_, r)| r == report).map(|(t, _)| *t)
    }
}

/// ann's and ben's pages (their `holds`) watch the empty room; ann comes in
/// (her own stream lists her, ben's page sees her join while it watches),
/// then ben (his stream lists both, ann's page sees him join on her stream
/// as a member). Each step waits up to `within` for the pages' reports;
/// `on`, ann's and ben's, ends the message of their joins (" on node-a").
pub fn ann_then_ben_join(
    r: &mut Reports,
    reports: &Receiver<(Instant, String)>,
    [ann, ben]: [&Holds; 2],
    within: Duration,
    [ann_on, ben_on]: [&str; 2],
) {
    r.wait_for(
        reports,
        &[
            "ann:open=watch",
            "ann:state=watch:",
            "ben:open=watch",
            "ben:state=watch:",
        ],
        within,
        "the pages watch the room",
    );
    ann.present.release();
    r.wait_for(
        reports,
        &[
            "ann:open=member",
            "ann:state=member:ann",
            "ann:join=ann",
            "ben:join=ann",
        ],
        within,
        &format!("ann joins{ann_on}"),
    );
    ben.present.release();
    r.wait_for(
        reports,
        &[
            "ben:open=member",
            "ben:state=member:ann_ben",
            "ben:join=ben",
            "ann:join=ben",
        ],
        within,
        &format!("ben joins{ben_on}"),
    );
}

/// Look every 10 ms until `look` (given when the look started) says ben is
/// no longer listed: when it said so. Panics once a look starts 30 s after
/// `let_go` (when his page was let go), with the room's presence (its key
/// `key`) on `node`, where he was to be gone (`from`: " from node-a").
pub fn until_ben_gone(
    node: SocketAddr,
    key: &str,
    from: &str,
    let_go: Instant,
    mut look: impl FnMut(Instant) -> bool,
) -> Instant {
    loop {
        let start = Instant::now();
        assert!(
            start.duration_since(let_go) < Duration::from_secs(30),
            "ben was not gone{from} 30 s after his page ended: {}",
            presence(node, key)
        );
        if !look(start) {
            return Instant::now();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// ben, whose page was let go at `let_go`, was `gone` (`from`: " from
/// node-a") only after the grace (`grace_ms`). His connection cannot end
/// before his page was let go, nor before `last_open`, the last look that
/// counted it open: the grace runs from then (from the worker's clock, which
/// is at most an epoch behind).
pub fn assert_ben_gone_after_the_grace(
    from: &str,
    grace_ms: u64,
    let_go: Instant,
    last_open: Instant,
    gone: Instant,
) {
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis();
    assert!(
        gone.duration_since(let_go) >= Duration::from_millis(grace_ms),
        "ben was gone{from} {} ms after his page was let go, before the grace ({grace_ms} ms)",
        ms(let_go, gone)
    );
    assert!(
        gone.duration_since(last_open) >= Duration::from_millis(grace_ms - EPOCH_MS),
        "ben was gone{from} {} ms after his connection was last seen open, before the grace \
         ({grace_ms} ms)",
        ms(last_open, gone)
    );
}

/// The presence of a room (its presence key `key`) on `node` by a plain
/// poll: its body as JSON.
pub fn presence(node: SocketAddr, key: &str) -> Value {
    let path = format!("/v1/boxes/{}", key.replace('/', "%2F"));
    let (code, body) = crate::common::get(node, &path);
    assert_eq!(code, 200, "GET the room's presence from {node}: {body}");
    serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("the room's presence on {node}: {e}: {body:?}"))
}

/// The member ids a presence payload lists.
pub fn ids(p: &Value) -> Vec<&str> {
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

/// A value of `node`'s `/metrics` (a family with no labels).
pub fn metric(node: SocketAddr, name: &str) -> u64 {
    let (code, text) = crate::common::get(node, "/metrics");
    assert_eq!(code, 200, "/metrics: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics of {node}"))
}

/// The strings a page's results hold at `field` (an array of strings).
pub fn strings<'a>(r: &'a Value, field: &str) -> Vec<&'a str> {
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
