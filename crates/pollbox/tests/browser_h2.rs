//! Ten event streams from one page, through HAProxy's TLS frontend
//! (deploy/haproxy/haproxy.cfg.tmpl: HTTP/2 to browsers, HTTP/1.1 to pollbox;
//! docs/operations.md#http2-at-the-edge). Over HTTP/1.1 a browser holds at most
//! six connections to a host, so the seventh `EventSource` of a page would
//! wait for one of them to close; over HTTP/2 they share one connection.
//!
//! Headless Chromium loads a page from another loopback origin; the page
//! opens ten room streams (`/v1/boxes?prefix=room-N/`) on
//! `https://127.0.0.1:TLS_PORT` (a self-signed certificate, which this
//! Chromium is told to take), waits until every one is listed (`event:
//! synced`), posts an update into each room through the same frontend, and
//! checks that every stream brings its room's update. HAProxy's log (a line
//! for each stream the page closes) shows all ten came over HTTP/2 on one
//! connection.
//!
//! Needs Debian's `chromium`, `haproxy` and `openssl` (`.ci/run` installs
//! them); run with `cargo test -p pollbox --test browser_h2 -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;

use chromium::{
    certificate, chromium_dump_dom, free_port, haproxy, page_origin, results, serve_page,
};
use pollbox_core::config::Config;
use pollbox_server::Server;

const STREAMS: usize = 10;

/// The page: `__BASE__` and `__STREAMS__` are filled in.
const PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>ten streams</title></head>
<body><pre id="results">pending</pre>
<script>
const BASE = "__BASE__", N = __STREAMS__;
const results = { listed: 0, updated: 0, errors: 0 };
const streams = [], updated = new Set();
let written = false;
function finish(why) {
  if (written) return;
  written = true;
  results.why = why;
  for (const s of streams) s.close();
  document.getElementById("results").textContent = JSON.stringify(results);
}
async function post() {
  for (let i = 0; i < N; i++) {
    const r = await fetch(`${BASE}/v1/boxes/room-${i}/a`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: '{"value":2}' });
    results["post_" + i] = r.status;
  }
}
for (let i = 0; i < N; i++) {
  const s = new EventSource(`${BASE}/v1/boxes?prefix=room-${i}/`);
  streams.push(s);
  s.addEventListener("synced", () => {
    results.listed++;
    if (results.listed === N) post();
  });
  s.onmessage = (e) => {
    const b = JSON.parse(e.data);
    if (b.v === 2 && !updated.has(i)) {
      updated.add(i);
      results.updated = updated.size;
      if (updated.size === N) finish("every stream flowed");
    }
  };
  s.onerror = () => { results.errors++; };
}
setTimeout(() => finish("timed out"), 30000);
</script></body></html>
"#;

#[test]
#[ignore = "needs chromium, haproxy and openssl (Debian packages); .ci/run installs them"]
fn ten_event_streams_of_one_page_flow_over_http2_through_haproxy() {
    let dir = common::tmpdir("browser-h2");
    // A self-signed certificate for 127.0.0.1, and its key, in one PEM file;
    // Chromium takes it by its key's hash.
    let (pem, spki) = certificate(&dir);

    let (page_listener, page_addr) = page_origin();
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    c.http.cors_origins = vec![format!("http://{page_addr}")];
    // HAProxy sends a PROXY v2 header first (deploy's `send-proxy-v2`).
    c.server.trusted_proxies = vec!["127.0.0.1/32".into()];
    let server = Server::start(c).expect("server starts");
    for i in 0..STREAMS {
        let r = common::request(
            &mut std::net::TcpStream::connect(server.addr()).unwrap(),
            format!(
                "POST /v1/boxes/room-{i}/a HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n{{\"value\":1}}"
            )
            .as_bytes(),
        );
        assert_eq!(r.map(|r| r.0), Some(200));
    }

    // HAProxy as deploy/ ships it, both nodes this one server.
    let tls = free_port();
    let (proxy, log) = haproxy(server.addr(), tls, &pem);

    let page = PAGE
        .replace("__BASE__", &format!("https://127.0.0.1:{tls}"))
        .replace("__STREAMS__", &STREAMS.to_string());
    serve_page(page_listener, page);
    let dom = chromium_dump_dom(
        &format!("http://{page_addr}/"),
        &[
            "--virtual-time-budget=60000",
            &format!("--ignore-certificate-errors-spki-list={spki}"),
        ],
    );
    let r = results(&dom);
    eprintln!("the page: {r:#}");
    assert_eq!(r["why"], "every stream flowed", "{r}");
    assert_eq!(r["listed"], STREAMS, "{r}");
    assert_eq!(r["updated"], STREAMS, "{r}");
    for i in 0..STREAMS {
        assert_eq!(r[format!("post_{i}")], 200, "{r}");
    }
    // Each stream the page closed is a line of HAProxy's log (an abnormal
    // end: closed by the client); each names the protocol the browser spoke.
    drop(proxy);
    let said = log.lock().unwrap().join("\n");
    eprintln!("haproxy: {said}");
    let streams: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("/v1/boxes?prefix=room-"))
        .collect();
    assert_eq!(streams.len(), STREAMS, "a line a stream: {said}");
    assert!(
        streams.iter().all(|l| l.ends_with(" HTTP/2.0\"")),
        "the browser spoke HTTP/2 to HAProxy: {said}"
    );
    // The client's address and port lead each line: one connection for all.
    let clients: std::collections::BTreeSet<&str> = streams
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(clients.len(), 1, "one connection: {said}");
}
