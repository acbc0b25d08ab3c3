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
//! Needs Debian's `chromium` (`.ci/run` installs it); run with
//! `cargo test -p pollbox --test browser -- --ignored`.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
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

/// Serve `page` to every request on `listener` (one origin of the test).
fn serve_page(listener: TcpListener, page: String) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let page = page.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(match stream.try_clone() {
                    Ok(s) => s,
                    Err(_) => return,
                });
                // Read the request head; answer every request with the page
                // (the favicon too: the browser ignores it).
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    line.clear();
                }
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                );
            });
        }
    });
}

/// Load `url` in headless Chromium and return the DOM once the page's script
/// is done (virtual time waits for pending fetches).
fn dump_dom(url: &str) -> String {
    let profile = std::env::temp_dir().join(format!(
        "pollbox-chromium-{}-{}",
        std::process::id(),
        url.rsplit(':').next().unwrap_or("0").trim_end_matches('/')
    ));
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=60000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium on PATH (Debian package chromium)");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish with {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("chromium output");
    let _ = std::fs::remove_dir_all(&profile);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The JSON the page wrote into `#results`.
fn results(dom: &str) -> serde_json::Value {
    let start = dom
        .find("<pre id=\"results\">")
        .unwrap_or_else(|| panic!("no results element in {dom}"))
        + "<pre id=\"results\">".len();
    let end = start + dom[start..].find("</pre>").expect("</pre>");
    let text = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: the page wrote {text:?}"))
}

fn page_origin() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    (l, a)
}

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
    assert_eq!(server.shared().node.boxes.len(), 0);

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
        server.shared().node.boxes.len(),
        0,
        "preflights refused: nothing was ingested"
    );
    server.shutdown().expect("clean stop");
}
