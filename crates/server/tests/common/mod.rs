//! Helpers shared by the server's integration tests: a real server on a free
//! loopback port, and a raw HTTP/1.1 client over `TcpStream`.
#![allow(dead_code)]

use pollbox_core::config::Config;
use pollbox_server::Server;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub mod jwt;
pub mod kafka;
pub mod rooms;

/// The embedded config on a free port with 2 workers. `POLLBOX_TEST_IO_URING=1`
/// runs the suite with `server.io_uring = true` (the io_uring loop), so both
/// loops are tested (CI runs the server's tests both ways).
pub fn config() -> Config {
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    if std::env::var("POLLBOX_TEST_IO_URING").is_ok_and(|v| v == "1") {
        c.server.io_uring = true;
    }
    c
}

pub fn start(c: Config) -> Server {
    Server::start(c).expect("server starts")
}

pub fn url(s: &Server, path: &str) -> String {
    format!("http://{}{}", s.addr(), path)
}

/// One `read`, tried again when a signal interrupts it: with a read timeout
/// set, Linux answers EINTR when the process is stopped and continued (a
/// loaded or checkpointed CI machine does that), with no handler installed.
pub fn read_some(stream: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
    /// The version of a box's answer (its ETag's value). A standalone
    /// server starts new boxes at the wall clock in microseconds, so tests
    /// compare versions with the first one they read, not with 1.
    /// (An ingest's answer has no ETag: its payload's `ver`.)
    pub fn version(&self) -> u64 {
        match self.header("ETag") {
            Some(etag) => etag
                .trim_matches('"')
                .parse()
                .unwrap_or_else(|e| panic!("ETag {etag}: {e}")),
            None => self.json()["ver"]
                .as_u64()
                .unwrap_or_else(|| panic!("no version: {}", self.text())),
        }
    }
}

/// A payload's version and the payload with it written as `V`
/// (`{"k":"a","ver":V,...}`), to compare payloads whose first version is the
/// clock's.
#[allow(dead_code)] // each test binary uses what it needs
pub fn split_ver(payload: &str) -> (u64, String) {
    let at = payload.find("\"ver\":").expect("a payload with a version") + 6;
    let digits = payload[at..].bytes().take_while(u8::is_ascii_digit).count();
    let ver = payload[at..at + digits].parse().expect("a version");
    (
        ver,
        format!("{}V{}", &payload[..at], &payload[at + digits..]),
    )
}

/// Reads responses from a stream, keeping leftover bytes between calls.
pub struct Reader {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Reader {
    pub fn new(stream: TcpStream) -> Reader {
        Reader {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Read one response; `head_only` for answers to HEAD (no body follows).
    pub fn read(&mut self, head_only: bool) -> Resp {
        self.try_read(head_only).expect("a response")
    }

    /// None on EOF before a response.
    pub fn try_read(&mut self, head_only: bool) -> Option<Resp> {
        loop {
            if let Some((resp, used)) = parse(&self.buf, head_only) {
                self.buf.drain(..used);
                return Some(resp);
            }
            let mut tmp = [0u8; 65536];
            match read_some(&mut self.stream, &mut tmp) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => panic!(
                    "read failed: {e} (have {:?})",
                    String::from_utf8_lossy(&self.buf)
                ),
            }
        }
    }

    /// Read raw bytes until what was read contains `needle`; returns it all
    /// (as text) and forgets it (for event streams).
    pub fn read_until_contains(&mut self, needle: &str) -> String {
        loop {
            let text = String::from_utf8_lossy(&self.buf).into_owned();
            if text.contains(needle) {
                self.buf.clear();
                return text;
            }
            let mut tmp = [0u8; 65536];
            match read_some(&mut self.stream, &mut tmp) {
                Ok(0) => panic!("EOF before {needle:?} (have {text:?})"),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => panic!("read failed: {e} (have {text:?})"),
            }
        }
    }

    /// Read until `needle` has come; returns what came up to and with it (as
    /// text) and keeps the rest for the next read (for event streams).
    pub fn read_through(&mut self, needle: &str) -> String {
        loop {
            if let Some(i) = self
                .buf
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
            {
                let through: Vec<u8> = self.buf.drain(..i + needle.len()).collect();
                return String::from_utf8_lossy(&through).into_owned();
            }
            let mut tmp = [0u8; 65536];
            match read_some(&mut self.stream, &mut tmp) {
                Ok(0) => panic!("EOF before {needle:?}"),
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// True when the server closed the connection (EOF or reset) with nothing more to read.
    pub fn closed(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut tmp = [0u8; 1024];
        matches!(read_some(&mut self.stream, &mut tmp), Ok(0) | Err(_))
    }
}

fn parse(buf: &[u8], head_only: bool) -> Option<(Resp, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(buf).expect("valid response") {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let status = r.code.unwrap_or(0);
    let hs: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let len: usize = hs
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().expect("numeric content-length"))
        .unwrap_or_else(|| {
            // RFC 9110 §8.6: a 204 (and a 1xx) must not carry a length.
            assert!(
                status == 100 || status == 204,
                "every final response with content has Content-Length ({status})"
            );
            0
        });
    let body_len = if head_only || status == 304 || status == 100 {
        0
    } else {
        len
    };
    if buf.len() < n + body_len {
        return None;
    }
    Some((
        Resp {
            status,
            headers: hs,
            body: buf[n..n + body_len].to_vec(),
        },
        n + body_len,
    ))
}

/// Send one request on a fresh connection and read one response.
pub fn raw(addr: SocketAddr, req: &[u8]) -> (Resp, Reader) {
    let mut r = Reader::new(connect(addr));
    r.send(req);
    let resp = r.read(req.starts_with(b"HEAD "));
    (resp, r)
}

pub fn get(addr: SocketAddr, path: &str) -> Resp {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )
    .0
}

/// `DELETE path` on a fresh connection.
pub fn delete(addr: SocketAddr, path: &str) -> Resp {
    raw(
        addr,
        format!("DELETE {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )
    .0
}

pub fn post(addr: SocketAddr, path: &str, body: &str) -> Resp {
    raw(
        addr,
        format!(
            "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .0
}

/// Wait (up to 3 s) until `/metrics` says `n` polls are parked.
#[allow(dead_code)] // each test binary uses what it needs
pub fn wait_parked(a: SocketAddr, n: u64) {
    let mut parked = 0;
    for _ in 0..300 {
        parked = get(a, "/metrics")
            .text()
            .lines()
            .find_map(|l| l.strip_prefix("pollbox_parked_polls "))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if parked == n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(parked, n, "polls parked");
}

/// Write `text` to `path` as a rotation should: beside it, then renamed
/// over it (a reader never sees half a file).
pub fn replace_file(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Wait (up to 10 s) until `done` says so: a rotation is taken within
/// about a second (the files are looked at once a second, the workers take
/// a new read at their next tick); a test asserts what happens, not when.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `pollbox_auth_reloads_total{result}` of the server at `a`.
pub fn reloads(a: SocketAddr, result: &str) -> u64 {
    let line = format!("pollbox_auth_reloads_total{{result=\"{result}\"}} ");
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `GET path` with `token` as a bearer token, on a kept-alive connection.
pub fn get_with(conn: &mut Reader, path: &str, token: &str) -> Resp {
    conn.send(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n")
            .as_bytes(),
    );
    conn.read(false)
}

/// `promtool check metrics` accepts `text` with nothing to say (it must be
/// on PATH: the tests that call this are ignored without it).
pub fn promtool_check(text: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool on PATH");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}"
    );
}
