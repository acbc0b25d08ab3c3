//! Headless Chromium for the browser tests: a page served from a loopback
//! origin (plainly, or with paths the test holds until it releases them and
//! `/report?WHAT` requests the test is told of), the DOM Chromium dumps once
//! the page's script is done, and the JSON the page wrote into `#results`;
//! for pages that call pollbox over HTTPS, a self-signed certificate Chromium
//! takes and HAProxy as deploy/ ships it.
//!
//! Included with `#[path]` by test binaries that also have `mod common;`.
#![allow(dead_code)] // each test binary uses what it needs

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Serve `page` to every request on `listener` (one origin of the test).
pub fn serve_page(listener: TcpListener, page: String) {
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
pub fn dump_dom(url: &str) -> String {
    chromium_dump_dom(url, &["--virtual-time-budget=60000"])
}

/// Load `url` in headless Chromium with `flags` and return the DOM it dumps
/// (without a virtual time budget: once the page's load event has fired).
pub fn chromium_dump_dom(url: &str, flags: &[&str]) -> String {
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
            "--dump-dom",
        ])
        .args(flags)
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
pub fn results(dom: &str) -> serde_json::Value {
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

pub fn page_origin() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr");
    (l, a)
}

/// A port no socket listens on now (the kernel's pick, given back).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Answers a page's request (its `/hold`, say) only once released (or after
/// two minutes).
#[derive(Default)]
pub struct Hold {
    released: Mutex<bool>,
    cv: Condvar,
}

impl Hold {
    pub fn wait(&self) {
        let released = self.released.lock().unwrap();
        let _ = self
            .cv
            .wait_timeout_while(released, Duration::from_secs(120), |r| !*r)
            .unwrap();
    }

    pub fn release(&self) {
        *self.released.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// Releases its holds when dropped, so a test that fails part way lets the
/// pages' loads end (and Chromium exit) without waiting for the holds'
/// timeout.
pub struct ReleaseOnDrop(pub Vec<Arc<Hold>>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.release();
        }
    }
}

/// Read a request head from `stream`; its target (`/` if unreadable).
pub fn request_target(stream: &TcpStream) -> String {
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

/// Serve a page on `listener`: `/report?WHAT` calls `report` with `WHAT`,
/// each path of `holds` is answered once its `Hold` is released, anything
/// else gets the page.
pub fn serve_page_with_holds(
    listener: TcpListener,
    page: String,
    report: impl Fn(&str) + Clone + Send + 'static,
    holds: Vec<(&'static str, Arc<Hold>)>,
) {
    serve_page_routed(listener, page, report, holds, |_| None);
}

/// [`serve_page_with_holds`], and first: a request whose target `headers`
/// gives header lines for (each ending in `\r\n`) is answered at once with
/// them and an empty body.
pub fn serve_page_routed(
    listener: TcpListener,
    page: String,
    report: impl Fn(&str) + Clone + Send + 'static,
    holds: Vec<(&'static str, Arc<Hold>)>,
    headers: impl Fn(&str) -> Option<String> + Clone + Send + 'static,
) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (page, report, holds) = (page.clone(), report.clone(), holds.clone());
            let headers = headers.clone();
            std::thread::spawn(move || {
                let target = request_target(&stream);
                let mut extra = String::new();
                let (kind, body) = if let Some(h) = headers(&target) {
                    extra = h;
                    ("text/plain", String::new())
                } else if let Some(what) = target.strip_prefix("/report?") {
                    report(what);
                    ("text/plain", String::new())
                } else if let Some((_, hold)) = holds.iter().find(|(p, _)| *p == target) {
                    hold.wait();
                    ("text/plain", String::new())
                } else {
                    ("text/html; charset=utf-8", page)
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nCache-Control: no-store\r\n\
                     {extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
}

/// A self-signed certificate for 127.0.0.1 and its key in one PEM file in
/// `dir`, and the base64 SHA-256 of its public key (Chromium takes the
/// certificate by it: `--ignore-certificate-errors-spki-list`).
pub fn certificate(dir: &Path) -> (PathBuf, String) {
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

/// HAProxy as deploy/ ships it (deploy/haproxy/haproxy.cfg.tmpl: TLS and
/// HTTP/2 to browsers, HTTP/1.1 and PROXY v2 to pollbox), both of its servers
/// `node`, its TLS frontend on `tls` with `pem`: the running process (killed
/// when dropped), once it listens, and its log (stdout and stderr, a line an
/// entry).
pub fn haproxy(
    node: SocketAddr,
    tls: u16,
    pem: &Path,
) -> (crate::common::Server, Arc<Mutex<Vec<String>>>) {
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
    let proxy = crate::common::Server::from(proxy);
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
