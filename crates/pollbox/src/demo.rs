//! `pollbox demo`: a server on a free loopback port; the three ways of reading a
//! box (a poll, a long-poll, an event stream) as a transcript of real requests
//! with the curl command of each; then mixed load from `pollbox load`, the
//! memory table of `pollbox memcheck`, and a clean stop.

use pollbox_core::config::Config;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The box the transcript reads (the load generator's keys are `lg-N`).
const KEY: &str = "demo-box";
/// No request of the transcript may hang the demo.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the long-poll is parked before another client posts.
const POST_AFTER: Duration = Duration::from_millis(300);
/// The long-poll's `wait_ms`: well past `POST_AFTER`, so the post answers it.
const WAIT_MS: u64 = 5000;

pub fn run(seconds: u64) -> Result<ExitCode, String> {
    let mut cfg = Config::embedded();
    cfg.server.listen = "127.0.0.1:0".into();
    let server = pollbox_server::Server::start(cfg).map_err(|e| e.to_string())?;
    let url = format!("http://{}", server.addr());
    eprintln!(
        "pollbox demo: server on {url}; a poll, a long-poll and an event stream, then {seconds} s of mixed load (poll 80, ingest 15, batch 5)"
    );
    reading(server.addr())?;
    // The generator runs as a child process, so the memory table below shows
    // the server alone.
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    println!("\n== latency (pollbox load)");
    let status = std::process::Command::new(exe)
        .args(["load", "--url", &url, "--connections", "32", "--duration"])
        .arg(format!("{seconds}s"))
        .args(["--mix", "poll:80,ingest:15,batch:5", "--preseed"])
        .status()
        .map_err(|e| format!("cannot start the load generator: {e}"))?;
    println!("\n== memory (pollbox memcheck)");
    pollbox_memcheck::run(&url, None)?;
    server.shutdown()?;
    println!("\npollbox demo: server stopped cleanly");
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The transcript: one box created, then read by a poll, a long-poll that a
/// post from another thread answers, and an event stream that gets an event
/// per post. Versions and ETags are read from the answers, never assumed.
fn reading(addr: SocketAddr) -> Result<(), String> {
    let path = format!("/v1/boxes/{KEY}");
    println!("\n== reading a box: a poll, a long-poll, an event stream");
    println!(
        "   (to repeat the curl commands: `pollbox serve`, then B=http://127.0.0.1:8080{path})"
    );
    println!("$ B=http://{addr}{path}");

    let mut c = Conn::open(addr)?;
    let first = r#"{"value":5,"player":"p-7"}"#;
    println!("$ curl -s -X POST $B -d '{first}'");
    let a = c.post(&path, first)?;
    a.expect(200, "the first post")?;
    println!("{}", a.body);

    println!("\n-- poll: the box now, and its ETag");
    println!("$ curl -si $B");
    let a = c.get(&path, "")?;
    a.expect(200, "the poll")?;
    a.print_head();
    println!("{}", a.body);
    let etag = a.etag.clone().ok_or("the poll's answer has no ETag")?;
    println!("$ curl -si -H 'If-None-Match: {etag}' $B");
    let a = c.get(&path, &format!("If-None-Match: {etag}\r\n"))?;
    a.expect(304, "the poll with If-None-Match")?;
    a.print_head();
    println!("   (no body: unchanged since that ETag)");

    println!("\n-- long-poll: parked until the box passes `after` (its ETag), at most wait_ms");
    let version = etag.trim_matches('"');
    let query = format!("?after={version}&wait_ms={WAIT_MS}");
    println!("$ curl -si \"$B{query}\"");
    let second = r#"{"value":7,"player":"p-9"}"#;
    let started = Instant::now();
    c.send("GET", &format!("{path}{query}"), "", "")?;
    let poster = {
        let path = path.clone();
        std::thread::spawn(move || -> Result<Answer, String> {
            std::thread::sleep(POST_AFTER);
            Conn::open(addr)?.post(&path, second)
        })
    };
    println!(
        "   (parked; {} ms later another client posts: curl -s -X POST $B -d '{second}')",
        POST_AFTER.as_millis()
    );
    let a = c.answer()?;
    let waited = started.elapsed();
    let posted = poster
        .join()
        .map_err(|_| "the posting thread panicked".to_string())??;
    posted.expect(200, "the post that answers the long-poll")?;
    a.expect(200, "the long-poll")?;
    a.print_head();
    println!("{}", a.body);
    println!("   (answered after {} ms)", waited.as_millis());

    println!("\n-- event stream: the box at once, then an event per new version");
    println!("$ curl -N -H 'Accept: text/event-stream' $B");
    let mut s = Conn::open(addr)?;
    s.send("GET", &path, "Accept: text/event-stream\r\n", "")?;
    let head = s.take_until(b"\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") || !head.contains("text/event-stream") {
        let line = head.lines().next().unwrap_or_default();
        return Err(format!("the event stream was answered {line:?}"));
    }
    let mut last = 0u64;
    let mut take_event = |s: &mut Conn| -> Result<(), String> {
        loop {
            let block = s.take_until(b"\n\n")?;
            for line in block.lines() {
                println!("{line}");
            }
            println!();
            let id = block.lines().find_map(|l| l.strip_prefix("id: "));
            if let Some(id) = id {
                let id: u64 = id
                    .parse()
                    .map_err(|_| format!("an event with the id {id:?}"))?;
                if id <= last {
                    return Err(format!("event id {id} after {last}"));
                }
                last = id;
                return Ok(());
            }
            // `retry:`, or a heartbeat: the event is still to come.
        }
    };
    take_event(&mut s)?;
    for (i, value) in [1, 2].into_iter().enumerate() {
        let player = ["p-7", "p-9"][i];
        let body = format!(r#"{{"value":{value},"player":"{player}"}}"#);
        println!("   (another client posts: curl -s -X POST $B -d '{body}')");
        c.post(&path, &body)?
            .expect(200, "a post to the event stream's box")?;
        take_event(&mut s)?;
    }
    Ok(())
}

/// One keep-alive connection, its requests written by hand and its answers
/// framed by the load generator's parser.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
    host: String,
}

/// An answer of the transcript: the status line and ETag shown, and the body.
struct Answer {
    status: u16,
    status_line: String,
    etag: Option<String>,
    body: String,
}

impl Answer {
    fn expect(&self, status: u16, what: &str) -> Result<(), String> {
        if self.status == status {
            return Ok(());
        }
        Err(format!(
            "{what} was answered {:?} {}, not {status}",
            self.status_line, self.body
        ))
    }

    fn print_head(&self) {
        println!("{}", self.status_line);
        if let Some(etag) = &self.etag {
            println!("ETag: {etag}");
        }
    }
}

impl Conn {
    fn open(addr: SocketAddr) -> Result<Conn, String> {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| s.set_write_timeout(Some(IO_TIMEOUT)))
            .and_then(|()| s.set_nodelay(true))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            s,
            buf: Vec::new(),
            host: addr.to_string(),
        })
    }

    fn get(&mut self, path: &str, fields: &str) -> Result<Answer, String> {
        self.send("GET", path, fields, "")?;
        self.answer()
    }

    fn post(&mut self, path: &str, body: &str) -> Result<Answer, String> {
        self.send("POST", path, "Content-Type: application/json\r\n", body)?;
        self.answer()
    }

    /// Write a request; `fields` are header lines, each ending in CRLF.
    fn send(&mut self, method: &str, path: &str, fields: &str, body: &str) -> Result<(), String> {
        let length = if body.is_empty() {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{fields}{length}\r\n{body}",
            self.host
        );
        self.s
            .write_all(request.as_bytes())
            .map_err(|e| format!("cannot send {method} {path}: {e}"))
    }

    /// Read one answer.
    fn answer(&mut self) -> Result<Answer, String> {
        loop {
            let framed = pollbox_load::parse_response(&self.buf)
                .map_err(|e| format!("a malformed answer ({e:?})"))?;
            if let Some(r) = framed {
                let head = String::from_utf8_lossy(&self.buf[..r.len - r.body.len()]);
                let status_line = head.lines().next().unwrap_or_default().to_string();
                let etag = head.lines().find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("etag")
                        .then(|| value.trim().to_string())
                });
                let answer = Answer {
                    status: r.status,
                    status_line,
                    etag,
                    body: String::from_utf8_lossy(r.body).into_owned(),
                };
                let len = r.len;
                self.buf.drain(..len);
                return Ok(answer);
            }
            self.fill()?;
        }
    }

    /// The bytes up to `end` (taken, `end` with them, and not returned).
    fn take_until(&mut self, end: &[u8]) -> Result<String, String> {
        loop {
            if let Some(at) = self.buf.windows(end.len()).position(|w| w == end) {
                let text = String::from_utf8_lossy(&self.buf[..at]).into_owned();
                self.buf.drain(..at + end.len());
                return Ok(text);
            }
            self.fill()?;
        }
    }

    fn fill(&mut self) -> Result<(), String> {
        let mut tmp = [0u8; 4096];
        let n = self.s.read(&mut tmp).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                format!("no answer within {} s", IO_TIMEOUT.as_secs())
            }
            _ => format!("cannot read the answer: {e}"),
        })?;
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }
}
