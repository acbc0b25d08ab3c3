//! pollbox from a real browser (docs/http.md#cors): headless Chromium loads a page
//! served from one loopback origin; the page's script calls pollbox, which
//! listens on another port (so another origin), with `fetch`: it ingests with
//! a bearer token, polls with `If-None-Match` (200, then 304), long-polls
//! (the poll waits, as `/metrics` tells the page, until the page's next ingest
//! wakes it), subscribes with `EventSource` (the box at once, then the next
//! update, then `event: deleted`), deletes the box and polls it again (404). Every step needs CORS: the token, `Content-Type: application/json`
//! and `If-None-Match` make the browser send preflights, and the page reads
//! the `ETag` only because it is exposed. The page writes what it saw into
//! the DOM; Chromium's `--dump-dom` prints it and the test checks each step.
//! The same page from an origin that is not in `cors_origins` is refused by
//! the browser: every `fetch` rejects.
//!
//! A second page runs the README's `EventSource` client (its code, taken from
//! README.md) through a rolling restart of the `pollbox` binary: the server is
//! stopped under the open stream (SIGTERM, then kill -9), its port answers 503
//! for a while (a proxy's answer while the node restarts, after which
//! `EventSource` gives up for good), and the server comes back on the same
//! port; the page reopens with back-off and gets the next update.
//!
//! A third page opens one `EventSource` on 20 boxes (docs/http.md#many-boxes-at-once)
//! and polls the same boxes with `fetch` meanwhile, while the test posts
//! rounds of updates (bursts the stream coalesces) and deletes a box: the page
//! ends with every box's newest payload, the deletion, one open, and polls
//! answered 200 and 304 that agree with the stream.
//!
//! A fourth page is a player's private box (docs/private-boxes.md#the-browser):
//! reads need a signed token (minted by PyJWT), which the page's own origin
//! sets as the `pollbox_token` cookie; the page is refused another player's
//! box (403, to `fetch` and to `EventSource`), streams its own with
//! `withCredentials`, and when its token ends (`event: expired`) gets a fresh
//! cookie, opens the stream again and sees the next update.
//!
//! Needs Debian's `chromium` (`.ci/run` installs it; the fourth page also
//! python3 with pyjwt and cryptography); run with
//! `cargo test -p pollbox --test browser -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;
#[path = "../../server/tests/common/jwt.rs"]
mod jwt;

use chromium::{
    chromium_dump_dom, dump_dom, free_port, page_origin, request_target, results, serve_page,
    serve_page_routed, serve_page_with_holds, Hold, ReleaseOnDrop,
};

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollbox_core::config::Config;
use pollbox_server::Server;

const TOKEN: &str = "browser-t0k";

/// The page: `POLLBOX` and `TOKEN` are filled in. It records each step as
/// `name: value` in `results` and writes them as JSON into `#results`.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox from a browser</title></head>
<body><pre id="results">pending</pre>
<script>
const base = "POLLBOX";
const auth = { "Authorization": "Bearer TOKEN" };
const results = {};
const box = base + "/v1/boxes/browser-box";
async function step(name, f) {
  try { results[name] = await f(); }
  catch (e) { results[name] = "rejected: " + e.name; }
}
async function ingest(value) {
  const r = await fetch(box, {
    method: "POST",
    headers: { ...auth, "Content-Type": "application/json" },
    body: JSON.stringify({ value: value, player: "browser" }),
  });
  return { status: r.status, body: await r.json() };
}
(async () => {
  await step("ingest", () => ingest(1));
  let etag = null;
  await step("poll", async () => {
    const r = await fetch(box, { cache: "no-store" });
    etag = r.headers.get("ETag");
    return { status: r.status, etag: etag, body: await r.json() };
  });
  await step("poll_if_none_match", async () => {
    const r = await fetch(box, { headers: { "If-None-Match": etag } });
    return { status: r.status };
  });
  await step("long_poll", async () => {
    const ver = results.poll.body.ver;
    const waiting = fetch(box + "?after=" + ver + "&wait_ms=20000", { cache: "no-store" });
    // Ingest only once pollbox says the poll waits (no timers: headless
    // Chromium's virtual time stands still while a fetch is pending).
    let parked = false;
    for (let i = 0; i < 1000 && !parked; i++) {
      const m = await (await fetch(base + "/metrics", { cache: "no-store" })).text();
      parked = /^pollbox_parked_polls 1$/m.test(m);
    }
    const second = await ingest(2);
    const r = await waiting;
    return { status: r.status, etag: r.headers.get("ETag"), body: await r.json(),
             parked: parked, ingest: second.status };
  });
  // Server-sent events: the box at once, then each update; `event: deleted`
  // when the box goes (no timers here either: promises of events only).
  let es = null;
  let deleted = null;
  await step("event_source", async () => {
    es = new EventSource(box);
    const next = () => new Promise((ok, fail) => {
      es.onmessage = (e) => ok({ id: e.lastEventId, body: JSON.parse(e.data) });
      es.onerror = () => fail(new Error("EventSource error, readyState " + es.readyState));
    });
    const first = await next();
    const later = next();
    const third = await ingest(3);
    const second = await later;
    deleted = new Promise((ok) => es.addEventListener("deleted", (e) => {
      es.close();
      ok({ data: e.data });
    }));
    return { first: first, second: second, ingest: third.status };
  });
  await step("delete", async () => {
    const r = await fetch(box, { method: "DELETE", headers: auth });
    return { status: r.status };
  });
  await step("event_source_deleted", async () => deleted ? await deleted : "no stream");
  await step("after_delete", async () => {
    const r = await fetch(box, { cache: "no-store" });
    return { status: r.status, body: await r.json() };
  });
  await step("unauthorized", async () => {
    const r = await fetch(box, { method: "DELETE" });
    return { status: r.status };
  });
  document.getElementById("results").textContent = JSON.stringify(results);
  document.title = "done";
})();
</script></body></html>
"#;

#[test]
#[ignore = "needs chromium (Debian package chromium); .ci/run installs it"]
fn a_page_on_an_allowed_origin_polls_long_polls_ingests_and_deletes() {
    let (allowed, allowed_addr) = page_origin();
    let (other, other_addr) = page_origin();
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    c.http.cors_origins = vec![format!("http://{allowed_addr}")];
    c.auth.ingest_tokens = vec![TOKEN.into()];
    let server = Server::start(c).expect("server starts");
    let page = PAGE
        .replace("POLLBOX", &format!("http://{}", server.addr()))
        .replace("TOKEN", TOKEN);
    serve_page(allowed, page.clone());
    serve_page(other, page);

    let r = results(&dump_dom(&format!("http://{allowed_addr}/")));
    eprintln!("allowed origin: {r:#}");
    assert_eq!(r["ingest"]["status"], 200, "{r}");
    assert_eq!(r["ingest"]["body"]["v"], 1, "{r}");
    let ver = r["ingest"]["body"]["ver"].as_u64().expect("ver");
    assert_eq!(r["poll"]["status"], 200, "{r}");
    assert_eq!(
        r["poll"]["etag"],
        format!("\"{ver}\""),
        "the page reads the exposed ETag: {r}"
    );
    assert_eq!(r["poll"]["body"]["by"], "browser", "{r}");
    assert_eq!(r["poll_if_none_match"]["status"], 304, "{r}");
    assert_eq!(r["long_poll"]["parked"], true, "the poll waited: {r}");
    assert_eq!(r["long_poll"]["ingest"], 200, "{r}");
    assert_eq!(r["long_poll"]["status"], 200, "{r}");
    assert_eq!(r["long_poll"]["body"]["ver"], ver + 1, "{r}");
    assert_eq!(r["long_poll"]["body"]["v"], 2, "{r}");
    assert_eq!(r["long_poll"]["etag"], format!("\"{}\"", ver + 1), "{r}");
    let es = &r["event_source"];
    assert_eq!(
        es["first"]["id"],
        (ver + 1).to_string(),
        "the box at once: {r}"
    );
    assert_eq!(es["first"]["body"]["v"], 2, "{r}");
    assert_eq!(es["ingest"], 200, "{r}");
    assert_eq!(es["second"]["id"], (ver + 2).to_string(), "the update: {r}");
    assert_eq!(es["second"]["body"]["ver"], ver + 2, "{r}");
    assert_eq!(es["second"]["body"]["v"], 3, "{r}");
    assert_eq!(r["delete"]["status"], 204, "{r}");
    assert_eq!(r["event_source_deleted"]["data"], "", "event: deleted: {r}");
    assert_eq!(r["after_delete"]["status"], 404, "{r}");
    assert_eq!(r["after_delete"]["body"]["error"], "no such box", "{r}");
    assert_eq!(r["unauthorized"]["status"], 401, "{r}");
    assert_eq!(server.node().boxes.len(), 0);

    // The same page from an origin pollbox does not allow: the browser
    // refuses every answer (fetch rejects with a TypeError).
    let r = results(&dump_dom(&format!("http://{other_addr}/")));
    eprintln!("other origin: {r:#}");
    for step in [
        "ingest",
        "poll",
        "poll_if_none_match",
        "long_poll",
        "delete",
        "after_delete",
        "unauthorized",
    ] {
        assert_eq!(r[step], "rejected: TypeError", "{step}: {r}");
    }
    // EventSource fails the connection (an error event, no message).
    assert_eq!(r["event_source"], "rejected: Error", "{r}");
    assert_eq!(r["event_source_deleted"], "no stream", "{r}");
    assert_eq!(
        server.node().boxes.len(),
        0,
        "preflights refused: nothing was ingested"
    );
    server.shutdown().expect("clean stop");
}

/// The page of the rolling restart: `POLLBOX` is filled in, and `README_CLIENT`
/// with the README's `EventSource` client (from `let lastId` to `subscribe();`),
/// which calls the page's `box` and `show`. The image `/hold` holds the page's
/// load event, so `--dump-dom` waits until the test answers it (and the page's
/// timers run in real time, not in virtual time). The page writes what it saw
/// into `#results` at every change and reports it to the test (its own
/// origin), which restarts pollbox while the page runs.
const RESTART_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox through a rolling restart</title></head>
<body><pre id="results">pending</pre>
<img src="/hold" alt="">
<script>
const results = { shown: [], opened: [], errors: [] };
function record() {
  document.getElementById("results").textContent = JSON.stringify(results);
}
function report(what) {
  fetch("/report?" + what, { cache: "no-store" }).catch(() => {});
}
// Every EventSource the client opens, and the readyState of each of their
// errors (2, CLOSED: it gave up), recorded and reported; nothing else changes.
const NativeEventSource = EventSource;
window.EventSource = class extends NativeEventSource {
  constructor(url) {
    super(url);
    results.opened.push(url);
    record();
    this.addEventListener("error", () => {
      results.errors.push(this.readyState);
      record();
      report("error=" + this.readyState);
    });
  }
};
const box = "POLLBOX/v1/boxes/" + encodeURIComponent("rolling-box");
function show(p) {
  results.shown.push(p === null ? null : p.v);
  record();
  report("shown=" + (p === null ? "null" : p.v));
}
record();
README_CLIENT
</script></body></html>
"#;

/// The README's browser client that subscribes: from `let lastId = "";` to the
/// `subscribe();` that starts it, as the README shows it.
fn readme_event_source_client() -> &'static str {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("let lastId = \"\";")
        .expect("README.md: the EventSource client starts with `let lastId = \"\";`");
    let end = start
        + readme[start..]
            .find("\nsubscribe();\n")
            .expect("README.md: the EventSource client ends with `subscribe();`")
        + "\nsubscribe();\n".len();
    &readme[start..end]
}

/// Wait up to `within` until the page has reported `what` `times` times
/// (counting the reports not read yet); else what it reported meanwhile.
fn reports_until(
    reports: &Receiver<String>,
    what: &str,
    times: usize,
    within: Duration,
) -> Result<(), Vec<String>> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while seen.iter().filter(|r| *r == what).count() < times {
        let left = deadline.saturating_duration_since(Instant::now());
        match reports.recv_timeout(left) {
            Ok(r) => seen.push(r),
            Err(_) => return Err(seen),
        }
    }
    Ok(())
}

/// What a proxy in front of a restarting node answers: 503 to every request
/// on `port` (no CORS headers, as HAProxy's own 503), until ended.
struct Outage {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Outage {
    fn start(port: u16) -> Outage {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("outage: bind {port}: {e}; again");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("outage: bind {port}: {e}"),
            }
        };
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::spawn({
            let (stop, answered) = (stop.clone(), answered.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok((mut stream, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    let _ = stream.set_nonblocking(false);
                    request_target(&stream);
                    let body = "<html><body><h1>503 Service Unavailable</h1>\n\
                                No server is available to handle this request.\n</body></html>\n";
                    let _ = write!(
                        stream,
                        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\n\
                         Content-Length: {}\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Outage {
            stop,
            answered,
            thread,
        }
    }

    /// Stop answering and free the port; how many requests were answered 503.
    fn end(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.answered.load(Ordering::Relaxed)
    }
}

/// `pollbox serve --config cfg`, which must listen on `port`.
fn serve_on(cfg: &Path, port: u16) -> common::Server {
    let (server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    assert_eq!(addr.port(), port, "the server listens where the page looks");
    server
}

/// POST `{"value": value}` to the page's box on `port`; the status.
fn ingest_on(port: u16, value: u64) -> u16 {
    let body = format!(r#"{{"value":{value},"player":"test"}}"#);
    let req = format!(
        "POST /v1/boxes/rolling-box HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to pollbox");
    common::request(&mut s, req.as_bytes()).map_or(0, |(code, _)| code)
}

fn signal(child: &std::process::Child, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
#[ignore = "needs chromium (Debian package chromium); .ci/run installs it"]
fn the_readme_event_source_client_gets_the_next_update_after_a_rolling_restart() {
    let (page_listener, page_addr) = page_origin();
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("pollbox-browser-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("pollbox.toml");
    // No snapshot: the restarted server starts empty, its versions from the
    // clock (past every version the page saw), so the page's last id hides
    // nothing.
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nworkers = 2\n\
             [http]\ncors_origins = [\"http://{page_addr}\"]\n"
        ),
    )
    .unwrap();
    let mut server = serve_on(&cfg, port);
    assert_eq!(ingest_on(port, 1), 200);

    let page = RESTART_PAGE
        .replace("POLLBOX", &format!("http://127.0.0.1:{port}"))
        .replace("README_CLIENT", readme_event_source_client());
    let (report_tx, reports) = std::sync::mpsc::channel();
    let hold = Arc::new(Hold::default());
    serve_page_with_holds(
        page_listener,
        page,
        move |what| {
            let _ = report_tx.send(what.to_owned());
        },
        vec![("/hold", hold.clone())],
    );
    let url = format!("http://{page_addr}/");
    let browser = std::thread::spawn(move || chromium_dump_dom(&url, &[]));

    let first = reports_until(&reports, "shown=1", 1, Duration::from_secs(60));
    assert!(
        first.is_ok(),
        "the page did not get the box: it reported {first:?}"
    );
    let mut outages = Vec::new();
    for (sig, value) in [("-TERM", 2), ("-KILL", 3)] {
        signal(&server, sig);
        let status = server.wait().unwrap();
        if sig == "-TERM" {
            assert!(status.success(), "SIGTERM: exit status {status:?}");
        }
        // The port answers 503 until the page's EventSource has given up
        // (readyState CLOSED) twice: its own reconnect was answered 503, and
        // so was the client's first reopen (the next comes after 2 s).
        let outage = Outage::start(port);
        let gave_up = reports_until(&reports, "error=2", 2, Duration::from_secs(30));
        let answered = outage.end();
        server = serve_on(&cfg, port);
        assert_eq!(ingest_on(port, value), 200);
        let shown = reports_until(
            &reports,
            &format!("shown={value}"),
            1,
            Duration::from_secs(60),
        );
        assert!(
            shown.is_ok(),
            "{sig}: the page did not get {value} from the restarted server: it reported {shown:?} \
             (during the outage, {answered} requests answered 503: {gave_up:?})"
        );
        outages.push((sig, gave_up, answered));
    }
    hold.release();
    let dom = browser.join().expect("chromium");
    let r = results(&dom);
    eprintln!("rolling restart: {r:#}");
    assert_eq!(r["shown"], serde_json::json!([1, 2, 3]), "{r}");
    for (sig, gave_up, answered) in outages {
        assert!(
            gave_up.is_ok() && answered >= 2,
            "{sig}: the page gave up twice in the outage ({answered} answered 503): {gave_up:?}"
        );
    }
    let closed = r["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter(|e| **e == 2);
    assert!(
        closed.count() >= 4,
        "EventSource gave up (CLOSED) on each 503: {r}"
    );
    let opened = r["opened"].as_array().expect("opened");
    assert!(opened.len() >= 5, "the client reopened: {r}");
    assert!(
        opened[1..]
            .iter()
            .all(|u| u.as_str().is_some_and(|u| u.contains("?last_event_id="))),
        "reopened from the last id: {r}"
    );
    signal(&server, "-TERM");
    assert!(server.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page of many boxes: `POLLBOX` and `KEYS` (a JSON array) are filled in.
/// It opens one `EventSource` on all the keys and keeps, per box, the last
/// payload it was sent (and how many), the deletions, the stream's last id and
/// the opens; meanwhile it polls the same boxes every 50 ms with `fetch`
/// (`If-None-Match` from the last 200), counting the statuses. It reports
/// each step to the test (its own origin: `/report?...`, the box by its index
/// in `KEYS`) and writes what it saw into `#results`. Once `/go` answers it
/// stops polling, polls once more without `If-None-Match`, closes the stream
/// and reports `finished`; `/hold` holds its load event meanwhile, as on the
/// restart page. Anything unexpected goes into `errors`.
const MANY_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox: one EventSource on many boxes</title></head>
<body><pre id="results">pending</pre>
<img src="/hold" alt="">
<script>
const keys = KEYS;
const url = "POLLBOX/v1/boxes?keys=" + keys.map(encodeURIComponent).join(",");
const results = { opens: 0, last: {}, events: {}, deleted: [], last_id: null,
                  polls: {}, errors: [], final: null };
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
const es = new EventSource(url);
es.onopen = () => {
  results.opens++;
  record();
  report("open=" + results.opens);
};
es.onerror = () => fail("EventSource error, readyState " + es.readyState);
es.onmessage = (e) => {
  const p = JSON.parse(e.data);
  const i = keys.indexOf(p.k);
  if (i < 0) return fail("a payload of a box not asked for: " + e.data);
  if (results.deleted.includes(p.k)) fail("a payload after its deletion: " + e.data);
  const before = results.last[p.k];
  if (before && before.ver >= p.ver) fail("not newer than " + before.ver + ": " + e.data);
  results.last[p.k] = p;
  results.events[p.k] = (results.events[p.k] || 0) + 1;
  results.last_id = e.lastEventId;
  record();
  report("seen=" + i + ":" + p.v);
};
es.addEventListener("deleted", (e) => {
  const k = JSON.parse(e.data).k;
  if (keys.indexOf(k) < 0) return fail("a deletion of a box not asked for: " + e.data);
  results.deleted.push(k);
  results.last_id = e.lastEventId;
  record();
  report("deleted=" + keys.indexOf(k));
});
// The polls, one at a time, alongside the stream. Each 200 reports the
// values it got (`polled=v_v_..._null_...`), and the first 304 after it
// reports them as unchanged.
let etag = null;
let state = null;
let unchanged = false;
let polling = true;
async function poll() {
  const r = await fetch(url, { cache: "no-store", headers: etag ? { "If-None-Match": etag } : {} });
  results.polls[r.status] = (results.polls[r.status] || 0) + 1;
  const tag = r.headers.get("ETag");
  if (r.status === 200) {
    const body = await r.json();
    if (!Array.isArray(body) || body.length !== keys.length) {
      fail("poll: not an array of " + keys.length + ": " + JSON.stringify(body));
    } else {
      body.forEach((p, i) => {
        if (p !== null && p.k !== keys[i]) fail("poll: entry " + i + " is " + JSON.stringify(p));
      });
    }
    if (!tag || tag === etag) fail("poll: 200 with ETag " + tag + " after " + etag);
    etag = tag;
    state = Array.isArray(body) ? body.map((p) => (p === null ? "null" : p.v)).join("_") : null;
    unchanged = false;
    report("polled=" + state);
  } else if (r.status === 304) {
    if (tag !== etag) fail("poll: 304 with ETag " + tag + " for " + etag);
    if (!unchanged) report("unchanged=" + state);
    unchanged = true;
  } else {
    fail("poll: status " + r.status);
  }
  record();
}
const polls = (async () => {
  while (polling) {
    try { await poll(); } catch (e) { fail("poll rejected: " + e); }
    await new Promise((ok) => setTimeout(ok, 50));
  }
})();
fetch("/go", { cache: "no-store" }).then(async () => {
  polling = false;
  await polls;
  try {
    const r = await fetch(url, { cache: "no-store" });
    results.final = { status: r.status, body: await r.json() };
  } catch (e) {
    fail("last poll rejected: " + e);
  }
  es.close();
  record();
  report("finished");
});
record();
</script></body></html>
"#;

/// What the page has reported so far.
#[derive(Default)]
struct Reports {
    got: std::collections::HashSet<String>,
    all: Vec<String>,
}

impl Reports {
    /// Wait up to `within` until the page has reported each of `wanted`;
    /// else which are missing and the last reports.
    fn wait_for(
        &mut self,
        reports: &Receiver<String>,
        wanted: &[String],
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let missing: Vec<&String> = wanted.iter().filter(|w| !self.got.contains(*w)).collect();
            if missing.is_empty() {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match reports.recv_timeout(left) {
                Ok(r) => {
                    self.got.insert(r.clone());
                    self.all.push(r);
                }
                Err(_) => {
                    let recent = &self.all[self.all.len().saturating_sub(30)..];
                    return Err(format!(
                        "missing {missing:?}; the last reports: {recent:?}; errors: {:?}",
                        self.all
                            .iter()
                            .filter(|r| r.starts_with("error="))
                            .collect::<Vec<_>>()
                    ));
                }
            }
        }
    }
}

/// `s` escaped as JavaScript's `encodeURIComponent` does.
fn encode_component(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// POST each of `values` to the box `key` on one connection, all the requests
/// written at once (pipelined: a burst the streams may coalesce); each must
/// be answered 200.
fn post_burst(addr: SocketAddr, key: &str, values: &[i64]) {
    let mut reqs = String::new();
    for v in values {
        let body = format!(r#"{{"value":{v},"player":"test"}}"#);
        reqs.push_str(&format!(
            "POST /v1/boxes/{} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            encode_component(key),
            body.len()
        ));
    }
    let mut s = TcpStream::connect(addr).expect("connect to pollbox");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(reqs.as_bytes()).expect("write the burst");
    let (mut buf, mut tmp, mut answered) = (Vec::new(), [0u8; 4096], Vec::new());
    while answered.len() < values.len() {
        let mut h = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(head)) = r.parse(&buf) {
            let len: usize = r
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .unwrap_or(0);
            if buf.len() >= head + len {
                let body = String::from_utf8_lossy(&buf[head..head + len]).into_owned();
                answered.push((r.code.unwrap_or(0), body));
                buf.drain(..head + len);
                continue;
            }
        }
        let n = std::io::Read::read(&mut s, &mut tmp).expect("read the answers to the burst");
        assert!(n > 0, "pollbox closed the connection: {answered:?}");
        buf.extend_from_slice(&tmp[..n]);
    }
    assert!(
        answered.iter().all(|(code, _)| *code == 200),
        "{key}: {answered:?}"
    );
}

/// A request with no body on a new connection to `addr`; status and body.
fn plain_request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to pollbox");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n");
    common::request(&mut s, req.as_bytes()).expect("an answer")
}

/// What a box must hold after the test's posts: the newest value, the sum and
/// the count of the values.
#[derive(Clone, Copy, Debug, Default)]
struct Want {
    v: i64,
    sum: i64,
    n: i64,
}

#[test]
#[ignore = "needs chromium (Debian package chromium); .ci/run installs it"]
fn one_event_source_on_twenty_boxes_sees_every_update_and_a_deletion_while_the_page_polls() {
    let (page_listener, page_addr) = page_origin();
    let dir = std::env::temp_dir().join(format!("pollbox-browser-many-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
             [http]\ncors_origins = [\"http://{page_addr}\"]\n"
        ),
    )
    .unwrap();
    let (server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );

    // 20 boxes; the last key needs escaping (a comma, a slash, a space, ü).
    let mut keys: Vec<String> = (0..19).map(|i| format!("many-{i:02}")).collect();
    keys.push("room 19/a,b ü".into());
    let gone = 7; // the box the test deletes
    let mut want = vec![Want::default(); keys.len()];
    let mut posted = 0;
    let mut post = |i: usize, values: &[i64], want: &mut Vec<Want>| {
        post_burst(addr, &keys[i], values);
        for v in values {
            want[i] = Want {
                v: *v,
                sum: want[i].sum + v,
                n: want[i].n + 1,
            };
        }
        posted += values.len();
    };
    for i in 0..keys.len() {
        post(i, &[i as i64 + 1], &mut want);
    }
    // What the page must report once it has every box's newest value: from
    // its stream (but the deleted box), and from a poll (200) then confirmed
    // by a 304.
    let seen_all = |want: &[Want], deleted: Option<usize>| -> Vec<String> {
        let state: Vec<String> = (0..want.len())
            .map(|i| {
                if deleted == Some(i) {
                    "null".into()
                } else {
                    want[i].v.to_string()
                }
            })
            .collect();
        let state = state.join("_");
        (0..want.len())
            .filter(|i| Some(*i) != deleted)
            .map(|i| format!("seen={i}:{}", want[i].v))
            .chain([format!("polled={state}"), format!("unchanged={state}")])
            .collect()
    };

    let page = MANY_PAGE
        .replace("POLLBOX", &format!("http://{addr}"))
        .replace("KEYS", &serde_json::to_string(&keys).unwrap());
    let (report_tx, reports) = std::sync::mpsc::channel();
    let (hold, go) = (Arc::new(Hold::default()), Arc::new(Hold::default()));
    serve_page_with_holds(
        page_listener,
        page,
        move |what| {
            let _ = report_tx.send(what.to_owned());
        },
        vec![("/hold", hold.clone()), ("/go", go.clone())],
    );
    let _release = ReleaseOnDrop(vec![hold.clone(), go.clone()]);
    let url = format!("http://{page_addr}/");
    let browser = std::thread::spawn(move || chromium_dump_dom(&url, &[]));
    let mut r = Reports::default();

    // The page has every box from its stream and from a poll, and a 304.
    let mut wanted = seen_all(&want, None);
    wanted.push("open=1".into());
    if let Err(e) = r.wait_for(&reports, &wanted, Duration::from_secs(60)) {
        panic!("the page did not get the boxes: {e}");
    }

    // Rounds of updates of every box, some in bursts of up to 20 (written
    // at once, so the stream may coalesce them); after each round the page
    // must have seen each box's newest value, on the stream and by polling.
    for round in 1..=3i64 {
        for i in 0..keys.len() {
            let burst = match (i as i64 + round) % 4 {
                0 => 20,
                1 => 1,
                k => k + 1,
            };
            let values: Vec<i64> = (1..=burst)
                .map(|j| round * 10_000 + i as i64 * 100 + j)
                .collect();
            post(i, &values, &mut want);
        }
        if let Err(e) = r.wait_for(&reports, &seen_all(&want, None), Duration::from_secs(30)) {
            panic!("round {round}: the page did not see the newest values: {e}");
        }
    }

    // One box is deleted: `event: deleted`, and the stream goes on with an
    // update of every other box.
    let (code, body) = plain_request(
        addr,
        "DELETE",
        &format!("/v1/boxes/{}", encode_component(&keys[gone])),
    );
    assert_eq!(code, 204, "{body}");
    if let Err(e) = r.wait_for(
        &reports,
        &[format!("deleted={gone}")],
        Duration::from_secs(30),
    ) {
        panic!("the page did not see the deletion of {}: {e}", keys[gone]);
    }
    for i in (0..keys.len()).filter(|i| *i != gone) {
        post(
            i,
            &[90_000 + i as i64 * 100 + 1, 90_000 + i as i64 * 100 + 2],
            &mut want,
        );
    }
    if let Err(e) = r.wait_for(
        &reports,
        &seen_all(&want, Some(gone)),
        Duration::from_secs(30),
    ) {
        panic!("after the deletion, the page did not see the newest values: {e}");
    }

    // The page stops polling, polls once more, and writes what it saw.
    go.release();
    if let Err(e) = r.wait_for(&reports, &["finished".into()], Duration::from_secs(30)) {
        panic!("the page did not finish: {e}");
    }
    hold.release();
    let dom = browser.join().expect("chromium");
    let res = results(&dom);
    let (_, metrics) = plain_request(addr, "GET", "/metrics");
    let coalesced = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pollbox_sse_coalesced_total "))
        .unwrap_or("?");
    let events: u64 = res["events"]
        .as_object()
        .map_or(0, |m| m.values().filter_map(|v| v.as_u64()).sum());
    eprintln!(
        "many boxes: {posted} posts, {events} payloads on the stream \
         ({coalesced} versions coalesced), polls {}, deleted {}, errors {}",
        res["polls"], res["deleted"], res["errors"]
    );

    assert_eq!(res["errors"], serde_json::json!([]), "{res}");
    assert_eq!(res["opens"], 1, "one EventSource, opened once: {res}");
    assert_eq!(res["deleted"], serde_json::json!([keys[gone]]), "{res}");
    let ids: Vec<&str> = res["last_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id: {res}"))
        .split(',')
        .collect();
    assert_eq!(ids.len(), keys.len(), "an id of each box: {res}");
    let last_poll = &res["final"];
    assert_eq!(last_poll["status"], 200, "{res}");
    for (i, k) in keys.iter().enumerate() {
        let last = &res["last"][k];
        assert_eq!(last["k"], k.as_str(), "{res}");
        assert_eq!(
            (last["v"].as_i64(), last["sum"].as_i64(), last["n"].as_i64()),
            (Some(want[i].v), Some(want[i].sum), Some(want[i].n)),
            "{k}: the newest payload posted: {last}"
        );
        let ver = last["ver"].as_u64().expect("ver");
        if i == gone {
            assert_eq!(ids[i], "", "a deleted box has no version in the id: {res}");
            assert_eq!(last_poll["body"][i], serde_json::Value::Null, "{res}");
        } else {
            assert_eq!(
                ids[i],
                format!("{ver:x}"),
                "{k}: the id names its version (hex)"
            );
            assert_eq!(&last_poll["body"][i], last, "{k}: the poll agrees");
        }
    }
    let count = |status: &str| res["polls"][status].as_u64().unwrap_or(0);
    // A 200 and a 304 in each of the five phases (reported above).
    assert!(count("200") >= 5, "the polls got 200s: {res}");
    assert!(count("304") >= 5, "the polls got 304s: {res}");
    assert_eq!(
        count("200") + count("304"),
        res["polls"]
            .as_object()
            .map_or(0, |m| { m.values().filter_map(|v| v.as_u64()).sum() }),
        "only 200s and 304s: {res}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The page of a player's private box (docs/private-boxes.md#the-browser):
/// `POLLBOX` is filled in. Its own origin (the game's backend here) gives it
/// a token at `/token`, as a cookie (`Set-Cookie: pollbox_token=...;
/// HttpOnly`): the page never sees the token. Cookies are per host, not per
/// port, so a cookie of the page's host 127.0.0.1 goes to pollbox on
/// 127.0.0.1 at its own port, a cross-origin but same-site request (both on
/// `localhost`, or pollbox on `pollbox.game.example` with `Domain=game.example`,
/// would do the same; 127.0.0.1 and `localhost` are two sites, and the cookie
/// would not go). `fetch` with `credentials: "include"` and `EventSource`
/// with `withCredentials` send it, and pollbox answers the page's origin
/// with `Access-Control-Allow-Credentials: true`. The page reads another
/// player's box (refused), then streams its own; on `event: expired` it
/// closes the stream, asks `/token` for a fresh cookie and opens it again.
/// It reports each step to the test (`/report?...`) and writes what it saw
/// into `#results`; `/hold` holds its load event until the test is done.
const TOKEN_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>pollbox: a private box with a cookie token</title></head>
<body><pre id="results">pending</pre>
<img src="/hold" alt="">
<script>
const mine = "POLLBOX/v1/boxes/" + encodeURIComponent("room-17/alice");
const theirs = "POLLBOX/v1/boxes/" + encodeURIComponent("room-17/bob");
const results = { theirs_fetch: null, theirs_stream: null, shown: [], opens: 0,
                  expired: [], tokens: 0, errors: [] };
function record() {
  document.getElementById("results").textContent = JSON.stringify(results);
}
function report(what) {
  fetch("/report?" + what, { cache: "no-store" }).catch(() => {});
}
async function freshToken() {
  const r = await fetch("/token", { cache: "no-store" });
  results.tokens++;
  record();
  return r.status;
}
function subscribe() {
  const es = new EventSource(mine, { withCredentials: true });
  es.onopen = () => { results.opens++; record(); report("open=" + results.opens); };
  es.onmessage = (e) => {
    const p = JSON.parse(e.data);
    results.shown.push(p.v);
    record();
    report("shown=" + p.v);
  };
  es.onerror = () => { results.errors.push(es.readyState); record(); report("error=" + es.readyState); };
  es.addEventListener("expired", async (e) => {
    // The token ended: pollbox closes the stream. Do not let EventSource
    // reconnect with the old cookie; get a fresh one, then open again.
    es.close();
    results.expired.push(JSON.parse(e.data));
    record();
    report("expired");
    await freshToken();
    subscribe();
  });
}
(async () => {
  await freshToken();
  try {
    const r = await fetch(theirs, { credentials: "include", cache: "no-store" });
    results.theirs_fetch = { status: r.status, body: await r.json() };
  } catch (e) {
    results.theirs_fetch = "rejected: " + e.name;
  }
  results.theirs_stream = await new Promise((ok) => {
    const es = new EventSource(theirs, { withCredentials: true });
    es.onmessage = () => { es.close(); ok("a message"); };
    es.onerror = () => { const s = es.readyState; es.close(); ok("error, readyState " + s); };
  });
  record();
  report("refused");
  subscribe();
})();
</script></body></html>
"#;

/// Serve the private box's page on `listener`: `/token` answers with the
/// next of `tokens` as the cookie `pollbox_token` (the last one again once
/// they run out), `/report?WHAT` sends `WHAT` to the test, `/hold` waits for
/// `hold`, anything else gets the page.
fn serve_token_page(
    listener: TcpListener,
    page: String,
    tokens: Vec<String>,
    reports: Sender<String>,
    hold: Arc<Hold>,
) {
    let given = Arc::new(AtomicUsize::new(0));
    let token_reports = reports.clone();
    serve_page_routed(
        listener,
        page,
        move |what| {
            let _ = reports.send(what.to_owned());
        },
        vec![("/hold", hold)],
        move |target| {
            (target == "/token").then(|| {
                let i = given.fetch_add(1, Ordering::Relaxed).min(tokens.len() - 1);
                let _ = token_reports.send(format!("token={}", i + 1));
                format!(
                    "Set-Cookie: pollbox_token={}; Path=/; HttpOnly; SameSite=Lax\r\n",
                    tokens[i]
                )
            })
        },
    );
}

/// Tokens for `claims`, one each, signed with the EdDSA key of a key set
/// made in `dir` (its public half in `dir/jwks.json`) by PyJWT.
fn mint_tokens(dir: &Path, claims: &[serde_json::Value]) -> Vec<String> {
    jwt::keys(dir);
    let specs: Vec<serde_json::Value> = claims
        .iter()
        .map(|c| serde_json::json!({"kid": "ed", "claims": c}))
        .collect();
    jwt::mint(dir, &specs)
}

#[test]
#[ignore = "needs chromium (Debian package chromium) and python3 with pyjwt and cryptography; .ci/run installs them"]
fn a_page_with_a_cookie_token_streams_its_own_box_and_comes_back_after_event_expired() {
    let (page_listener, page_addr) = page_origin();
    let dir = jwt::tempdir("browser-token");
    let now = jwt::now();
    let alice = |exp: u64| jwt::claims(exp, &["room-17/alice"], &[]);
    // The first token ends while the page streams; the second does not.
    let tokens = mint_tokens(&dir, &[alice(now + 15), alice(now + 600)]);
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    c.http.cors_origins = vec![format!("http://{page_addr}")];
    jwt::token_access(&mut c, &dir.join("jwks.json"), TOKEN);
    c.auth.jwt.leeway_s = 0;
    let server = Server::start(c).expect("server starts");
    let ingest = |value: i64| {
        let body = format!(r#"{{"key":"room-17/alice","value":{value}}}"#);
        let req = format!(
            "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut s = TcpStream::connect(server.addr()).expect("connect to pollbox");
        common::request(&mut s, req.as_bytes()).map_or(0, |(code, _)| code)
    };
    assert_eq!(ingest(1), 200);

    let page = TOKEN_PAGE.replace("POLLBOX", &format!("http://{}", server.addr()));
    let (report_tx, reports) = std::sync::mpsc::channel();
    let hold = Arc::new(Hold::default());
    serve_token_page(page_listener, page, tokens, report_tx, hold.clone());
    let _release = ReleaseOnDrop(vec![hold.clone()]);
    let url = format!("http://{page_addr}/");
    let browser = std::thread::spawn(move || chromium_dump_dom(&url, &[]));
    let mut r = Reports::default();
    let wait = |r: &mut Reports, wanted: &[&str], what: &str| {
        let wanted: Vec<String> = wanted.iter().map(|w| w.to_string()).collect();
        if let Err(e) = r.wait_for(&reports, &wanted, Duration::from_secs(60)) {
            panic!("{what}: {e}");
        }
    };

    wait(
        &mut r,
        &["refused", "open=1", "shown=1"],
        "its own box at once",
    );
    assert_eq!(ingest(2), 200);
    wait(&mut r, &["shown=2"], "the update");
    // The first token ends: `event: expired`, a fresh token, the stream
    // again (the box as it is, then the next update).
    wait(
        &mut r,
        &["expired", "token=2", "open=2"],
        "back after expired",
    );
    assert_eq!(ingest(3), 200);
    wait(&mut r, &["shown=3"], "the update after the fresh token");
    hold.release();
    let res = results(&browser.join().expect("chromium"));
    eprintln!("private box: {res:#}");
    assert_eq!(res["theirs_fetch"]["status"], 403, "{res}");
    assert_eq!(
        res["theirs_fetch"]["body"],
        serde_json::json!({"error": "forbidden", "key": "room-17/bob"}),
        "{res}"
    );
    assert_eq!(
        res["theirs_stream"], "error, readyState 2",
        "EventSource fails on the 403: {res}"
    );
    assert_eq!(res["shown"], serde_json::json!([1, 2, 2, 3]), "{res}");
    assert_eq!(
        res["expired"],
        serde_json::json!([{"error": "invalid_token", "error_description": "expired"}]),
        "{res}"
    );
    assert_eq!(res["opens"], 2, "{res}");
    assert_eq!(res["tokens"], 2, "{res}");
    assert_eq!(res["errors"], serde_json::json!([]), "{res}");
    server.shutdown().expect("clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}
