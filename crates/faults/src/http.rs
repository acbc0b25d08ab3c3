//! A blocking HTTP/1.1 client just big enough for the workload: one request
//! at a time on a kept-alive connection, answers framed by `Content-Length`
//! (or the connection's end), and event streams read line by line. Written
//! here rather than taken from a crate because the workload must know *where*
//! a request failed: before anything was sent (the message was certainly not
//! taken) or after (it may have been).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Where an exchange failed.
#[derive(Debug)]
pub enum Failure {
    /// No connection: nothing was sent.
    Connect(io::Error),
    /// The request could not be written whole: the server cannot have it.
    Send(io::Error),
    /// Sent, and no whole answer came (a timeout, a reset, the end of the
    /// connection): the server may have acted on it.
    Receive(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connect: {e}"),
            Failure::Send(e) => write!(f, "send: {e}"),
            Failure::Receive(e) => write!(f, "receive: {e}"),
        }
    }
}

/// An answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One connection to one address, reopened when it breaks.
pub struct Client {
    pub addr: SocketAddr,
    conn: Option<TcpStream>,
    buf: Vec<u8>,
    /// Connections opened so far (a new one starts a new read session).
    pub opened: u64,
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client {
            addr,
            conn: None,
            buf: Vec::with_capacity(4096),
            opened: 0,
        }
    }

    /// Drop the connection (the next request opens another).
    pub fn close(&mut self) {
        self.conn = None;
        self.buf.clear();
    }

    /// Open the connection now if there is none (a poller starts a new
    /// session with each connection).
    pub fn connect_now(&mut self) -> Result<(), Failure> {
        self.connect().map(|_| ())
    }

    fn connect(&mut self) -> Result<&mut TcpStream, Failure> {
        if self.conn.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT)
                .map_err(Failure::Connect)?;
            let _ = s.set_nodelay(true);
            self.conn = Some(s);
            self.buf.clear();
            self.opened += 1;
        }
        Ok(self.conn.as_mut().expect("connected"))
    }

    /// One request, its answer within `timeout`. A failure closes the
    /// connection.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Response, Failure> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: pollbox\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        let r = self.exchange(&bytes, timeout);
        if r.is_err() {
            self.close();
        }
        r
    }

    fn exchange(&mut self, req: &[u8], timeout: Duration) -> Result<Response, Failure> {
        self.connect()?;
        let conn = self.conn.as_mut().expect("connected");
        conn.set_write_timeout(Some(timeout))
            .map_err(Failure::Send)?;
        conn.write_all(req).map_err(Failure::Send)?;
        let deadline = Instant::now() + timeout;
        let resp = read_response(conn, &mut self.buf, deadline)?;
        if resp
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            self.close();
        }
        Ok(resp)
    }
}

fn fill(conn: &mut TcpStream, buf: &mut Vec<u8>, deadline: Instant) -> Result<usize, Failure> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Failure::Receive("timed out".into()));
    }
    conn.set_read_timeout(Some(left))
        .map_err(|e| Failure::Receive(e.to_string()))?;
    let mut chunk = [0u8; 8192];
    match conn.read(&mut chunk) {
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(n)
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(Failure::Receive("timed out".into()))
        }
        Err(e) => Err(Failure::Receive(e.to_string())),
    }
}

/// A response head: the status, the headers and the head's length.
type Head = (u16, Vec<(String, String)>, usize);

/// Parse a response head at the front of `buf`.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, Failure> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => {
            let headers = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            Ok(Some((r.code.unwrap_or(0), headers, n)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(Failure::Receive(format!("malformed answer: {e}"))),
    }
}

fn read_response(
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
) -> Result<Response, Failure> {
    let (status, headers, head_len) = loop {
        if let Some(h) = parse_head(buf)? {
            break h;
        }
        if fill(conn, buf, deadline)? == 0 {
            return Err(Failure::Receive(if buf.is_empty() {
                "closed before an answer".into()
            } else {
                "closed within the answer's head".into()
            }));
        }
    };
    let resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    // A 304 (and a 204) has no body, whatever its Content-Length says (RFC
    // 9110 §8.6: a 304's is the length a 200 would have had).
    let bodiless = status == 304 || status == 204 || (100..200).contains(&status);
    let length = if bodiless {
        Some(0)
    } else {
        resp.header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    let mut resp = resp;
    match length {
        Some(len) => {
            while buf.len() < head_len + len {
                if fill(conn, buf, deadline)? == 0 {
                    return Err(Failure::Receive("closed within the body".into()));
                }
            }
            resp.body = buf[head_len..head_len + len].to_vec();
            buf.drain(..head_len + len);
        }
        None => {
            // Delimited by the connection's end.
            while fill(conn, buf, deadline)? > 0 {}
            resp.body = buf[head_len..].to_vec();
            buf.clear();
        }
    }
    Ok(resp)
}

/// An open event stream (`Accept: text/event-stream`).
pub struct EventStream {
    conn: TcpStream,
    buf: Vec<u8>,
}

/// One event: its `id` and `data`, or the stream's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Option<String>,
    pub name: Option<String>,
    pub data: String,
}

impl EventStream {
    /// Open a stream of `path`, resuming after `last_event_id`. Returns the
    /// status when it is not 200.
    pub fn open(
        addr: SocketAddr,
        path: &str,
        last_event_id: Option<u64>,
        timeout: Duration,
    ) -> Result<Result<EventStream, Response>, Failure> {
        let mut conn =
            TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(Failure::Connect)?;
        let _ = conn.set_nodelay(true);
        let mut req =
            format!("GET {path} HTTP/1.1\r\nHost: pollbox\r\nAccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        req.push_str("\r\n");
        conn.set_write_timeout(Some(timeout))
            .map_err(Failure::Send)?;
        conn.write_all(req.as_bytes()).map_err(Failure::Send)?;
        let deadline = Instant::now() + timeout;
        let mut buf = Vec::new();
        let (status, headers, head_len) = loop {
            if let Some(h) = parse_head(&buf)? {
                break h;
            }
            if fill(&mut conn, &mut buf, deadline)? == 0 {
                return Err(Failure::Receive("closed before an answer".into()));
            }
        };
        if status != 200 {
            let mut resp = Response {
                status,
                headers,
                body: Vec::new(),
            };
            if let Some(len) = resp
                .header("content-length")
                .and_then(|v| v.trim().parse::<usize>().ok())
            {
                while buf.len() < head_len + len {
                    if fill(&mut conn, &mut buf, deadline)? == 0 {
                        break;
                    }
                }
                resp.body = buf[head_len..(head_len + len).min(buf.len())].to_vec();
            }
            return Ok(Err(resp));
        }
        buf.drain(..head_len);
        Ok(Ok(EventStream { conn, buf }))
    }

    /// The next event within `timeout`; `Ok(None)` when none came by then
    /// (comments and `retry:` lines are skipped). The stream's end is an error.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Event>, Failure> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(end) = find_blank_line(&self.buf) {
                let block: Vec<u8> = self.buf.drain(..end.1).collect();
                let text = String::from_utf8_lossy(&block[..end.0]).into_owned();
                let mut ev = Event {
                    id: None,
                    name: None,
                    data: String::new(),
                };
                let mut any = false;
                for line in text.lines() {
                    if line.starts_with(':') {
                        continue;
                    }
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match field {
                        "id" => {
                            ev.id = Some(value.to_string());
                            any = true;
                        }
                        "event" => {
                            ev.name = Some(value.to_string());
                            any = true;
                        }
                        "data" => {
                            if !ev.data.is_empty() {
                                ev.data.push('\n');
                            }
                            ev.data.push_str(value);
                            any = true;
                        }
                        _ => {}
                    }
                }
                if any {
                    return Ok(Some(ev));
                }
                continue;
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            match fill(&mut self.conn, &mut self.buf, deadline) {
                Ok(0) => return Err(Failure::Receive("stream ended".into())),
                Ok(_) => {}
                Err(Failure::Receive(e)) if e == "timed out" => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }
}

/// The end of the first event block: (end of its text, end with the blank line).
fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, i + 2));
        }
        if i + 3 < buf.len() && &buf[i..i + 4] == b"\r\n\r\n" {
            return Some((i, i + 4));
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_blocks_are_split_at_blank_lines() {
        let b = b"retry: 1000\nid: 3\ndata: {\"ver\":3}\n\n: hb\n\nid: 4\n";
        let (end, next) = find_blank_line(b).unwrap();
        assert_eq!(&b[..end], b"retry: 1000\nid: 3\ndata: {\"ver\":3}");
        let rest = &b[next..];
        assert_eq!(find_blank_line(rest), Some((4, 6)));
    }
}
