//! Headless Chromium for the browser tests: a page served from a loopback
//! origin, the DOM Chromium dumps once the page's script is done, and the
//! JSON the page wrote into `#results`.
#![allow(dead_code)] // each test binary uses what it needs

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
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
