//! Presence from real browsers on a cluster (docs/presence.md#on-a-log-cluster):
//! two `pollbox` binaries are nodes of one Kafka log (a real broker,
//! `scripts/kafka`; `presence.lease_ms = 3000`, `leave_grace_ms = 500`), each
//! behind HAProxy as deploy/ ships it (deploy/haproxy/haproxy.cfg.tmpl: TLS
//! and HTTP/2 to the browser, HTTP/1.1 and PROXY v2 to the node). The
//! template hashes a box's path to pick its node, and a room's presence is one
//! path, so to pin each page to a node of its own every node has an HAProxy
//! of its own (both of the template's servers that node): node-a behind
//! `https://127.0.0.1:TLS_A`, node-b behind `https://127.0.0.1:TLS_B`.
//!
//! Headless Chromium processes load a page each from its own loopback
//! origin; the page follows the room's presence with `EventSource` (the same
//! page as tests/browser_presence.rs: it watches the room without a member,
//! then, when the test says so, follows it as its member, comparing each
//! state's `members` with the one before and reporting joins and leaves).
//!
//! - ann's page uses node-a, ben's node-b: each sees the other join, so the
//!   presence went through the log both ways; both nodes list both.
//! - ben closes his tab (his Chromium exits): ann's page, on the other node,
//!   sees him leave, and node-a drops him only after the grace (counted from
//!   when node-b last had his connection open).
//! - cat's page comes in on node-b, and ann's page sees her join. Then node-a
//!   (ann's) is killed with `kill -9`: no leave of ann's ever reaches the log.
//!   cat's page sees ann leave once node-a's lease lapses (asserted loosely:
//!   not before a third of the lease, within 30 s), and ann's own stream fails
//!   (HAProxy has no node left for it). Both HAProxy logs show the pages'
//!   presence streams came over HTTP/2.
//!
//! Needs Debian's `chromium`, `haproxy` and `openssl`, and the broker's jars
//! (`.ci/run` installs them all); run with
//! `cargo test -p pollbox --test browser_presence_cluster -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;

use chromium::{chromium_dump_dom, page_origin, results};
use kafka::Broker;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The room's presence key (the room is `cluster-room/`).
const PRESENCE: &str = "cluster-room/~presence";
/// The log's topic (the nodes' presence is `TOPIC-presence`).
const TOPIC: &str = "browser-cluster";
/// `presence.leave_grace_ms` of the nodes.
const GRACE_MS: u64 = 500;
/// `presence.lease_ms` of the nodes.
const LEASE_MS: u64 = 3000;
/// The server's clock for presence moves once an epoch (`server.epoch_ms`,
/// 16 by default): a grace starts at the clock of the worker's last tick.
const EPOCH_MS: u64 = 16;

/// The page: `POLLBOX` (the HAProxy in front of the page's node),
/// `PRESENCE`, `MEMBER` and `INFO` (a JSON object) are filled in. It watches
/// the room's presence with no member until `/present` answers, then follows
/// it as `MEMBER`; every state it gets is compared with the one before (the
/// first state is the baseline). It reports each step to the test (its own
/// origin: `/report?...`) and writes what it saw into `#results`; `/hold`
/// holds its load event (and so Chromium's exit) until the test lets it end.
/// Anything unexpected goes into `errors`, and is reported as `fail=STREAM`.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox presence on a cluster</title></head>
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
    reports: Sender<(Instant, String)>,
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
                    let _ = reports.send((Instant::now(), format!("{who}:{what}")));
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

/// What the pages have reported so far, each with when its page server
/// got it.
#[derive(Default)]
struct Reports {
    got: HashSet<String>,
    all: Vec<(Instant, String)>,
}

impl Reports {
    /// Take the reports that have come, without waiting.
    fn drain(&mut self, reports: &Receiver<(Instant, String)>) {
        while let Ok((at, r)) = reports.try_recv() {
            self.got.insert(r.clone());
            self.all.push((at, r));
        }
    }

    /// Wait up to `within` until the pages have reported each of `wanted`;
    /// else panic with `what`, which are missing and the last reports.
    fn wait_for(
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
    fn recent(&self) -> Vec<&str> {
        self.all[self.all.len().saturating_sub(30)..]
            .iter()
            .map(|(_, r)| r.as_str())
            .collect()
    }

    /// When `report` first came, if it has.
    fn when(&self, report: &str) -> Option<Instant> {
        self.all.iter().find(|(_, r)| r == report).map(|(t, _)| *t)
    }
}

/// The room's presence on `node` by a plain poll: its body as JSON.
fn presence(node: SocketAddr) -> Value {
    let (code, body) = common::get(node, "/v1/boxes/cluster-room%2F~presence");
    assert_eq!(code, 200, "GET the room's presence from {node}: {body}");
    serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("the room's presence on {node}: {e}: {body:?}"))
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

/// A value of `node`'s `/metrics` (a family with no labels).
fn metric(node: SocketAddr, name: &str) -> u64 {
    let (code, text) = common::get(node, "/metrics");
    assert_eq!(code, 200, "/metrics: {text}");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics of {node}"))
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

/// Wait up to 30 s until `f` holds, polling every 20 ms; else panic with
/// `what` and the last thing `f` said.
fn until(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: not within 30 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// HAProxy as deploy/ ships it, both of its servers `node`, its TLS frontend
/// on `tls` with `pem`: the running process (killed when dropped) and its log.
fn haproxy(node: SocketAddr, tls: u16, pem: &Path) -> (common::Server, Arc<Mutex<Vec<String>>>) {
    let mut proxy = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/haproxy/haproxy.cfg.tmpl"))
        .env("FRONT_PORT", free_port().to_string())
        .env("TLS_PORT", tls.to_string())
        .env("TLS_CRT", pem)
        .env("NODE1", node.to_string())
        .env("NODE2", node.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("haproxy on PATH (Debian package haproxy)");
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    for out in [
        Box::new(proxy.stdout.take().expect("haproxy's stdout")) as Box<dyn std::io::Read + Send>,
        Box::new(proxy.stderr.take().expect("haproxy's stderr")),
    ] {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                log.lock().unwrap().push(line);
            }
        });
    }
    let proxy = common::Server::from(proxy);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", tls)).is_err() {
        assert!(
            Instant::now() < deadline,
            "haproxy listens on {tls}: {:?}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (proxy, log)
}

/// A self-signed certificate for 127.0.0.1 and its key in one PEM file in
/// `dir`, and the base64 SHA-256 of its public key (Chromium takes the
/// certificate by it).
fn certificate(dir: &Path) -> (std::path::PathBuf, String) {
    let st = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stderr(Stdio::null())
        .status()
        .expect("openssl on PATH");
    assert!(st.success(), "openssl made a certificate");
    let pem = [
        std::fs::read(dir.join("cert.pem")).expect("cert.pem"),
        std::fs::read(dir.join("key.pem")).expect("key.pem"),
    ]
    .concat();
    let both = dir.join("both.pem");
    std::fs::write(&both, pem).expect("write both.pem");
    let spki = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -in '{}' -pubkey -noout | openssl pkey -pubin -outform der \
             | openssl dgst -sha256 -binary | base64",
            dir.join("cert.pem").display()
        ))
        .output()
        .expect("openssl");
    let spki = String::from_utf8_lossy(&spki.stdout).trim().to_string();
    assert!(!spki.is_empty(), "the certificate's key hash");
    (both, spki)
}

/// Start Chromium on `origin`'s page in a thread: it lives until the test
/// answers the page's `/hold`, then gives the DOM it dumped.
fn browse(origin: SocketAddr, spki: &str) -> JoinHandle<String> {
    let flag = format!("--ignore-certificate-errors-spki-list={spki}");
    std::thread::spawn(move || chromium_dump_dom(&format!("http://{origin}/"), &[&flag]))
}

#[test]
#[ignore = "needs Debian's chromium, haproxy and a Kafka broker; .ci/run installs them"]
fn pages_on_two_nodes_of_a_log_see_joins_a_closed_tab_and_a_killed_node_leave() {
    let started = Instant::now();
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis();
    let dir = common::tmpdir("browser-presence-cluster");
    let (pem, spki) = certificate(&dir);
    let (ann_listener, ann_origin) = page_origin();
    let (ben_listener, ben_origin) = page_origin();
    let (cat_listener, cat_origin) = page_origin();

    // The log, and its two nodes.
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    broker.create_topic(&format!("{TOPIC}-presence"), 1);
    let node = |name: &str| {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
                 trusted_proxies = [\"127.0.0.1\"]\n\
                 [http]\ncors_origins = [\"http://{ann_origin}\", \"http://{ben_origin}\", \"http://{cat_origin}\"]\n\
                 [log]\nbrokers = \"{}\"\ntopic = \"{TOPIC}\"\nallow_unsafe_topic = true\n\
                 [presence]\nnode = \"{name}\"\nlease_ms = {LEASE_MS}\nleave_grace_ms = {GRACE_MS}\n",
                broker.bootstrap
            ),
        )
        .expect("write a node's config");
        let (child, addr, _) = common::serve(
            ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
            &[],
        );
        (child, addr)
    };
    let (mut a_proc, a) = node("node-a");
    let (b_proc, b) = node("node-b");
    until("both nodes ready", || {
        let ready = [a, b].map(|n| common::get(n, "/readyz"));
        match ready.iter().all(|r| r.0 == 200) {
            true => Ok(()),
            false => Err(format!("{ready:?}")),
        }
    });
    for n in [a, b] {
        assert_eq!(presence(n)["count"], 0, "the room is empty at first");
    }

    // An HAProxy in front of each node.
    let (tls_a, tls_b) = (free_port(), free_port());
    let (proxy_a, log_a) = haproxy(a, tls_a, &pem);
    let (proxy_b, log_b) = haproxy(b, tls_b, &pem);

    let page = |tls: u16, member: &str, name: &str| {
        PAGE.replace("POLLBOX", &format!("https://127.0.0.1:{tls}"))
            .replace("PRESENCE", PRESENCE)
            .replace("MEMBER", member)
            .replace("INFO", &json!({ "name": name }).to_string())
    };
    let (report_tx, reports) = std::sync::mpsc::channel();
    let ann = serve_page(
        ann_listener,
        "ann",
        page(tls_a, "ann", "Ann"),
        report_tx.clone(),
    );
    let ben = serve_page(
        ben_listener,
        "ben",
        page(tls_b, "ben", "Ben"),
        report_tx.clone(),
    );
    let cat = serve_page(cat_listener, "cat", page(tls_b, "cat", "Cat"), report_tx);
    let _release = ReleaseOnDrop(
        [&ann, &ben, &cat]
            .iter()
            .flat_map(|h| [h.hold.clone(), h.present.clone()])
            .collect(),
    );
    let mut r = Reports::default();
    let within = Duration::from_secs(60);

    // ann (node-a) and ben (node-b) watch the empty room.
    let ann_browser = browse(ann_origin, &spki);
    let ben_browser = browse(ben_origin, &spki);
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
    // ann comes in on node-a: ben's page, on node-b, sees her join.
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
        "ann joins on node-a",
    );
    // ben comes in on node-b: ann's page, on node-a, sees him join.
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
        "ben joins on node-b",
    );
    let both =
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "ben", "info": {"name": "Ben"}}]);
    for n in [a, b] {
        until("both nodes list both, with their info", || {
            let p = presence(n);
            match p["members"] == both {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }
    assert_eq!(metric(a, "pollbox_presence_connections"), 1, "ann's");
    assert_eq!(metric(b, "pollbox_presence_connections"), 1, "ben's");

    // ben closes his tab: his page's load ends, Chromium dumps the DOM and
    // exits. Meanwhile the test polls node-b's `/metrics` (when his
    // connection there ends) and node-a's presence box (when he is gone from
    // the other node).
    let let_go = Instant::now();
    ben.hold.release();
    let mut last_open = let_go; // the start of the last look that counted his connection open on node-b
    let mut closed = None; // when it was first seen ended
    let gone = loop {
        let look = Instant::now();
        assert!(
            look.duration_since(let_go) < Duration::from_secs(30),
            "ben was not gone from node-a 30 s after his page ended: {}",
            presence(a)
        );
        let open = metric(b, "pollbox_presence_connections");
        if open == 1 {
            last_open = look;
        } else if closed.is_none() {
            closed = Some(look);
        }
        let p = presence(a);
        if !ids(&p).contains(&"ben") {
            break Instant::now();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    eprintln!(
        "ben's page let go at 0 ms; his connection to node-b last seen open at {} ms, seen \
         closed at {:?} ms; gone from node-a's presence box at {} ms",
        ms(let_go, last_open),
        closed.map(|c| ms(let_go, c)),
        ms(let_go, gone),
    );
    // His connection cannot end before his page was let go, nor before the
    // last `/metrics` of node-b that counted it open: the grace runs from
    // then (from the worker's clock, which is at most an epoch behind), and
    // his leave reaches node-a through the log after it.
    assert!(
        gone.duration_since(let_go) >= Duration::from_millis(GRACE_MS),
        "ben was gone from node-a {} ms after his page was let go, before the grace ({GRACE_MS} ms)",
        ms(let_go, gone)
    );
    assert!(
        gone.duration_since(last_open) >= Duration::from_millis(GRACE_MS - EPOCH_MS),
        "ben was gone from node-a {} ms after his connection was last seen open, before the \
         grace ({GRACE_MS} ms)",
        ms(last_open, gone)
    );
    r.wait_for(
        &reports,
        &["ann:leave=ben"],
        within,
        "ann's page (node-a) sees ben leave",
    );
    let ben_dom = ben_browser.join().expect("ben's Chromium");
    let ann_only = json!([{"id": "ann", "info": {"name": "Ann"}}]);
    for n in [a, b] {
        until("both nodes list ann alone", || {
            let p = presence(n);
            match p["members"] == ann_only {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }

    // cat's page comes in on node-b; ann's page sees her join.
    let cat_browser = browse(cat_origin, &spki);
    r.wait_for(
        &reports,
        &["cat:open=watch", "cat:state=watch:ann"],
        within,
        "cat's page (node-b) watches the room with ann in it",
    );
    cat.present.release();
    r.wait_for(
        &reports,
        &[
            "cat:open=member",
            "cat:state=member:ann_cat",
            "cat:join=cat",
            "ann:join=cat",
        ],
        within,
        "cat joins on node-b",
    );
    let ann_cat =
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "cat", "info": {"name": "Cat"}}]);
    for n in [a, b] {
        until("both nodes list ann and cat", || {
            let p = presence(n);
            match p["members"] == ann_cat {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }
    r.drain(&reports);
    let failed_before_kill: Vec<&str> = r
        .all
        .iter()
        .map(|(_, w)| w.as_str())
        .filter(|w| w.contains(":fail="))
        .collect();
    assert_eq!(
        failed_before_kill,
        Vec::<&str>::new(),
        "no page failed before the kill: {:?}",
        r.recent()
    );

    // kill -9 of node-a, ann's node, with her page open on it: no leave of
    // hers reaches the log. node-b drops her once node-a's lease lapses.
    a_proc.kill().expect("kill -9 node-a");
    let killed = Instant::now();
    let _ = a_proc.wait();
    let cat_only = json!([{"id": "cat", "info": {"name": "Cat"}}]);
    let gone = loop {
        let p = presence(b);
        if !ids(&p).contains(&"ann") {
            assert_eq!(p["members"], cat_only, "node-b after node-a's lease");
            break Instant::now();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "ann was not gone from node-b 30 s after node-a was killed: {p}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    r.wait_for(
        &reports,
        &["cat:leave=ann", "ann:fail=member"],
        within,
        "cat's page (node-b) sees ann leave; ann's stream fails with her node",
    );
    let seen = r.when("cat:leave=ann").expect("cat:leave=ann");
    eprintln!(
        "node-a killed at 0 ms; ann gone from node-b's presence box at {} ms, cat's page saw her \
         leave at {} ms (lease {LEASE_MS} ms); ann's page saw its stream fail at {:?} ms",
        ms(killed, gone),
        ms(killed, seen),
        r.when("ann:fail=member").map(|t| ms(killed, t)),
    );
    // Her leave waits for the lease: node-a's last record was at most a
    // lease renewal (a third of the lease) before the kill. Loosely: not
    // before a third of the lease.
    assert!(
        gone.duration_since(killed) >= Duration::from_millis(LEASE_MS / 3),
        "ann was gone from node-b {} ms after the kill, before a third of the lease ({LEASE_MS} ms)",
        ms(killed, gone)
    );
    assert!(
        seen.duration_since(killed) >= Duration::from_millis(LEASE_MS / 3),
        "cat's page saw ann leave {} ms after the kill, before a third of the lease ({LEASE_MS} ms)",
        ms(killed, seen)
    );

    // cat's and ann's pages end.
    cat.hold.release();
    ann.hold.release();
    let cat_dom = cat_browser.join().expect("cat's Chromium");
    let ann_dom = ann_browser.join().expect("ann's Chromium");
    let (ann_res, ben_res, cat_res) = (results(&ann_dom), results(&ben_dom), results(&cat_dom));
    eprintln!("ann's page: {ann_res}\nben's page: {ben_res}\ncat's page: {cat_res}");
    for (who, res, member) in [
        ("ann", &ann_res, "Ann"),
        ("ben", &ben_res, "Ben"),
        ("cat", &cat_res, "Cat"),
    ] {
        assert_eq!(
            strings(res, "opens"),
            ["watch", "member"],
            "{who}'s page: {res}"
        );
        assert_eq!(
            res["infos"][who],
            json!({ "name": member }),
            "{who}'s page: {res}"
        );
    }
    assert_eq!(
        strings(&ann_res, "joins"),
        ["ann", "ben", "cat"],
        "{ann_res}"
    );
    assert_eq!(strings(&ann_res, "leaves"), ["ben"], "{ann_res}");
    assert!(
        strings(&ann_res, "errors")
            .iter()
            .all(|e| e.starts_with("member: EventSource error")),
        "ann's page failed only as her node died: {ann_res}"
    );
    assert_eq!(strings(&ben_res, "joins"), ["ann", "ben"], "{ben_res}");
    assert_eq!(strings(&ben_res, "leaves"), Vec::<&str>::new(), "{ben_res}");
    assert_eq!(strings(&ben_res, "errors"), Vec::<&str>::new(), "{ben_res}");
    assert_eq!(strings(&cat_res, "joins"), ["cat"], "{cat_res}");
    assert_eq!(strings(&cat_res, "leaves"), ["ann"], "{cat_res}");
    assert_eq!(strings(&cat_res, "errors"), Vec::<&str>::new(), "{cat_res}");

    // cat's tab closed: after her grace the room is empty on node-b.
    until("the room empty on node-b", || {
        let p = presence(b);
        match p["count"] == 0 {
            true => Ok(()),
            false => Err(p.to_string()),
        }
    });
    assert_eq!(metric(b, "pollbox_presence_connections"), 0);

    // The pages' presence streams came over HTTP/2: each stream a page
    // closed (its watching stream; ann's that failed) is a line of its
    // HAProxy's log, naming the protocol the browser spoke.
    drop((proxy_a, proxy_b));
    for (name, log, streams) in [("node-a's", log_a, 1), ("node-b's", log_b, 2)] {
        let said = log.lock().unwrap().join("\n");
        let lines: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("/v1/boxes/cluster-room%2F~presence"))
            .collect();
        assert!(
            lines.len() >= streams,
            "{name} HAProxy logged the pages' streams: {said}"
        );
        assert!(
            lines.iter().all(|l| l.ends_with(" HTTP/2.0\"")),
            "the browsers spoke HTTP/2 to {name} HAProxy: {said}"
        );
    }

    let mut b_proc = b_proc;
    let st = Command::new("kill")
        .args(["-TERM", &b_proc.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    assert!(b_proc.wait().expect("wait").success(), "a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("the test took {} ms", started.elapsed().as_millis());
}
