//! System test (deploy/README.md, "Many nodes"): two real `pollbox serve` nodes
//! behind the real HAProxy running `deploy/haproxy/haproxy.cfg.tmpl`, scraped by a
//! real Prometheus.
//!
//! It checks what the scale-out design promises end to end, with the real binary
//! rather than the stub nodes of `deploy/haproxy/smoke_test.py`:
//! - 1,000 keys ingested (1-3 times each) and polled through HAProxy on keep-alive
//!   connections: every poll sees the latest acknowledged version of its key;
//! - each key lives on exactly one node, both nodes hold a fair share, and each
//!   node's own `pollbox_boxes` equals the keys it holds (the counts add to 1,000);
//! - Prometheus, scraping both nodes every second, reports those same counts;
//! - `/metrics` through HAProxy is refused (404 from HAProxy) although the nodes
//!   serve it on the port HAProxy uses: scraped directly only;
//! - a node stopped with SIGTERM exits cleanly; its keys then fail fast with 503 at
//!   HAProxy (not re-hashed onto the other node, no box created there), while the
//!   other node's keys keep answering with the right version;
//! - restarted fresh on its address, the node gets its keys back (404: it has no
//!   snapshot here), and Prometheus sees it again, at 0 boxes, next to the
//!   unchanged survivor;
//! - event streams pass through HAProxy with their box's node;
//! - HAProxy's TLS frontend (ALPN h2,http/1.1, a self-signed certificate the test
//!   makes) answers polls, ingests and an event stream over HTTP/2 (`curl --http2`)
//!   while talking HTTP/1.1 to the nodes.
//!
//! Needs `haproxy`, `prometheus`, `openssl` and `curl` on PATH (Debian packages),
//! hence `#[ignore]`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const KEYS: usize = 1000;
/// Client threads (each one keep-alive connection) for the ingest/poll phase.
const CLIENTS: usize = 4;
/// No request may hang: a read or write that stalls this long fails the test.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// How many of the stopped node's keys are polled while it is down. Each of those
/// polls costs HAProxy's connect retry (about 0.5 s), so a sample, in parallel.
const DEAD_SAMPLE: usize = 40;

// ---------------------------------------------------------------------------------
// Child processes and their logs

/// Every process the test started. Dropping it kills and reaps them all, so
/// nothing outlives the test, even when an assertion panics; on a panic it also
/// prints the tail of each process's log.
struct Children {
    dir: PathBuf,
    list: Vec<(String, Child)>,
}

impl Children {
    fn new() -> Children {
        let dir = std::env::temp_dir().join(format!("pollbox-system-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Children {
            dir,
            list: Vec::new(),
        }
    }

    fn log(&self, name: &str) -> File {
        File::create(self.dir.join(format!("{name}.log"))).unwrap()
    }

    fn add(&mut self, name: &str, child: Child) {
        self.list.push((name.to_string(), child));
    }

    fn get(&mut self, name: &str) -> &mut Child {
        self.list
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
            .unwrap_or_else(|| panic!("no process {name}"))
    }

    /// Panic if `name` has exited (it was meant to be serving).
    fn assert_running(&mut self, name: &str) {
        if let Some(status) = self.get(name).try_wait().unwrap() {
            panic!("{name} exited early: {status}");
        }
    }

    /// SIGTERM `name` and wait (bounded) for it to exit; it is reaped either way.
    fn terminate(&mut self, name: &str, within: Duration) -> ExitStatus {
        let pid = self.get(name).id();
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {pid} ({name})");
        let end = Instant::now() + within;
        loop {
            if let Some(status) = self.get(name).try_wait().unwrap() {
                self.list.retain(|(n, _)| n != name);
                return status;
            }
            assert!(
                Instant::now() < end,
                "{name} did not exit within {within:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.list {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let mut logs: Vec<_> = std::fs::read_dir(&self.dir)
                .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
                .unwrap_or_default();
            logs.sort();
            for path in logs {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: String = {
                    let lines: Vec<&str> = text.lines().collect();
                    lines[lines.len().saturating_sub(30)..].join("\n")
                };
                eprintln!("--- {} (tail) ---\n{tail}", path.display());
            }
            eprintln!("(logs kept in {})", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn free_port() -> u16 {
    // Bound then released: the port is free for the child to take right after.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn require_tool(tool: &str, arg: &str) {
    let ok = Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{tool}` not found on PATH: apt-get install -y haproxy prometheus"
    );
}

/// A self-signed certificate for `localhost` with its key, one PEM file (what
/// HAProxy's `crt` takes), made with the openssl CLI in `dir`.
fn self_signed_cert(dir: &Path) -> PathBuf {
    let (crt, key, pem) = (
        dir.join("crt.pem"),
        dir.join("key.pem"),
        dir.join("tls.pem"),
    );
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "openssl req -x509: {status}");
    let mut both = std::fs::read(&crt).unwrap();
    both.extend(std::fs::read(&key).unwrap());
    std::fs::write(&pem, both).unwrap();
    pem
}

/// Start a node on `listen` and return the address from its start-up line.
fn spawn_node(kids: &mut Children, name: &str, listen: &str) -> SocketAddr {
    // The embedded default config (no snapshot, so a restart starts empty),
    // trusting the local HAProxy, which sends a PROXY v2 header as deploy/'s
    // configs do.
    let config = kids.dir.join(format!("{name}.toml"));
    std::fs::write(&config, "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["serve", "--listen", listen, "--workers", "2", "--config"])
        .arg(&config)
        .env_remove("POLLBOX_CONFIG")
        .env_remove("POLLBOX_LISTEN")
        .env_remove("POLLBOX_WORKERS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    kids.add(name, child);
    let mut log = kids.log(name);
    let mut reader = BufReader::new(stderr);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("{name}: no address in its first line {line:?}"));
    // Keep draining stderr into the log so the node never blocks on it.
    std::thread::spawn(move || {
        let _ = log.write_all(line.as_bytes());
        let _ = io::copy(&mut reader, &mut log);
    });
    addr
}

fn spawn_logged(kids: &mut Children, name: &str, cmd: &mut Command) {
    let log = kids.log(name);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    kids.add(name, child);
}

/// Poll `path` on `addr` until it answers 200, failing if `name` exits first.
fn wait_until_ok(kids: &mut Children, name: &str, addr: SocketAddr, path: &str, within: Duration) {
    let end = Instant::now() + within;
    loop {
        kids.assert_running(name);
        if Conn::new(addr)
            .request("GET", path, None)
            .is_ok_and(|r| r.status == 200)
        {
            return;
        }
        assert!(
            Instant::now() < end,
            "{name} did not answer 200 on {path} within {within:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------
// A small HTTP/1.1 client with keep-alive

struct Response {
    status: u16,
    body: String,
}

/// One connection, kept alive across requests and reopened after the server
/// closes it (`Connection: close`, or a body delimited by the end of the stream).
struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            stream: None,
            buf: Vec::new(),
        }
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> io::Result<Response> {
        let result = self.exchange(method, path, body);
        if !matches!(result, Ok((_, true))) {
            self.stream = None;
            self.buf.clear();
        }
        result.map(|(r, _)| r)
    }

    /// Returns the response and whether the connection may be reused.
    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> io::Result<(Response, bool)> {
        if self.stream.is_none() {
            let s = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            s.set_nodelay(true)?;
            self.stream = Some(s);
            self.buf.clear();
        }
        let Some(stream) = self.stream.as_mut() else {
            unreachable!("connected above");
        };
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: pollbox\r\n");
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            req.push_str("\r\n");
        }
        stream.write_all(req.as_bytes())?;
        read_response(stream, &mut self.buf)
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut tmp = [0u8; 16 * 1024];
    let n = stream.read(&mut tmp)?;
    buf.extend_from_slice(&tmp[..n]);
    Ok(n)
}

/// Read one response from `stream`; `buf` holds bytes already read (and keeps any
/// read past this response).
fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> io::Result<(Response, bool)> {
    let (head, status, length, chunked, mut keep) = loop {
        let mut h = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut h);
        match r
            .parse(buf)
            .map_err(|e| bad(format!("bad response: {e}")))?
        {
            httparse::Status::Complete(head) => {
                let header = |name: &str| {
                    r.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
                };
                let length = header("content-length")
                    .map(|v| v.trim().parse::<usize>())
                    .transpose()
                    .map_err(|_| bad("bad content-length"))?;
                let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
                let keep = r.version == Some(1)
                    && !header("connection").is_some_and(|v| v.contains("close"));
                break (head, r.code.unwrap_or(0), length, chunked, keep);
            }
            httparse::Status::Partial => {
                if fill(stream, buf)? == 0 {
                    return Err(bad("connection closed before a response"));
                }
            }
        }
    };
    let body = if status == 204 || status == 304 || (100..200).contains(&status) {
        buf.drain(..head);
        Vec::new()
    } else if chunked {
        loop {
            if let Some((body, used)) = decode_chunked(&buf[head..])? {
                buf.drain(..head + used);
                break body;
            }
            if fill(stream, buf)? == 0 {
                return Err(bad("connection closed inside a chunked body"));
            }
        }
    } else if let Some(len) = length {
        while buf.len() < head + len {
            if fill(stream, buf)? == 0 {
                return Err(bad("connection closed inside a body"));
            }
        }
        let body = buf[head..head + len].to_vec();
        buf.drain(..head + len);
        body
    } else {
        // Delimited by the end of the stream.
        while fill(stream, buf)? > 0 {}
        keep = false;
        let body = buf[head..].to_vec();
        buf.clear();
        body
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    Ok((Response { status, body }, keep))
}

/// A complete chunked body at the start of `data`: (body, bytes used), or None if
/// more bytes are needed.
fn decode_chunked(data: &[u8]) -> io::Result<Option<(Vec<u8>, usize)>> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = data[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size_line = String::from_utf8_lossy(&data[at..at + eol]).into_owned();
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| bad("bad chunk size"))?;
        at += eol + 2;
        if size == 0 {
            // No trailers expected: the body ends with an empty line.
            return Ok((data.len() >= at + 2).then(|| (body, at + 2)));
        }
        if data.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&data[at..at + size]);
        at += size + 2;
    }
}

// ---------------------------------------------------------------------------------
// pollbox boxes, metrics, Prometheus

/// What the last acknowledged ingest of a key said about its box.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Acked {
    ver: u64,
    /// Messages the box took (its `n`): a new box's first version is the
    /// clock's, then each message adds 1.
    n: u64,
    v: f64,
    sum: f64,
}

fn key_name(i: usize) -> String {
    format!("sys-{i}")
}

fn parse_box(key: &str, what: &str, r: &Response) -> Acked {
    let j: serde_json::Value = serde_json::from_str(&r.body)
        .unwrap_or_else(|e| panic!("{key}: {what}: body is not JSON ({e}): {:?}", r.body));
    assert_eq!(j["k"], key, "{key}: {what}: wrong key in {}", r.body);
    let num = |f: &str| {
        j[f].as_f64()
            .unwrap_or_else(|| panic!("{key}: {what}: no number {f:?} in {}", r.body))
    };
    let ver = j["ver"]
        .as_u64()
        .unwrap_or_else(|| panic!("{key}: {what}: no ver in {}", r.body));
    // The default projection counts messages in `n`: one per ingest, like `ver`.
    let n = num("n") as u64;
    assert!(ver >= n, "{key}: {what}: ver < n in {}", r.body);
    Acked {
        ver,
        n,
        v: num("v"),
        sum: num("sum"),
    }
}

/// Ingest keys `t, t + CLIENTS, ...` 1-3 times each through `front` on one
/// keep-alive connection, polling after every ingest.
fn ingest_and_poll(front: SocketAddr, t: usize) -> Vec<(String, Acked)> {
    let mut conn = Conn::new(front);
    let mut out = Vec::new();
    for i in (t..KEYS).step_by(CLIENTS) {
        let key = key_name(i);
        let path = format!("/v1/boxes/{key}");
        let mut sum = 0.0;
        let mut first = 0;
        for j in 0..1 + i % 3 {
            let value = (i * 10 + j) as u64;
            sum += value as f64;
            let r = conn
                .request("POST", &path, Some(&format!(r#"{{"value":{value}}}"#)))
                .unwrap_or_else(|e| panic!("POST {path}: {e}"));
            assert_eq!(r.status, 200, "POST {path}: {}", r.body);
            let acked = parse_box(&key, "ingest", &r);
            if j == 0 {
                first = acked.ver;
            }
            let want = Acked {
                ver: first + j as u64,
                n: j as u64 + 1,
                v: value as f64,
                sum,
            };
            assert_eq!(acked, want, "{key}: ingest #{} acknowledged", j + 1);
            let r = conn
                .request("GET", &path, None)
                .unwrap_or_else(|e| panic!("GET {path}: {e}"));
            assert_eq!(r.status, 200, "GET {path} after its ingest: {}", r.body);
            assert_eq!(
                parse_box(&key, "poll", &r),
                acked,
                "{key}: poll after ingest #{} must see the acknowledged version",
                j + 1
            );
        }
        out.push((
            key,
            Acked {
                ver: first + (i % 3) as u64,
                n: (1 + i % 3) as u64,
                v: (i * 10 + i % 3) as f64,
                sum,
            },
        ));
    }
    out
}

/// `pollbox_boxes` from a node's own /metrics.
fn node_boxes(addr: SocketAddr) -> u64 {
    let r = Conn::new(addr)
        .request("GET", "/metrics", None)
        .unwrap_or_else(|e| panic!("GET {addr}/metrics: {e}"));
    assert_eq!(r.status, 200, "GET {addr}/metrics");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix("pollbox_boxes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .unwrap_or_else(|| panic!("{addr}/metrics has no pollbox_boxes sample"))
}

/// `pollbox_boxes` per `instance` label, as Prometheus's query API returns it now.
fn prometheus_boxes(prom: SocketAddr) -> io::Result<HashMap<String, u64>> {
    let r = Conn::new(prom).request("GET", "/api/v1/query?query=pollbox_boxes", None)?;
    if r.status != 200 {
        return Err(bad(format!("query: {} {}", r.status, r.body)));
    }
    let j: serde_json::Value = serde_json::from_str(&r.body).map_err(|e| bad(e.to_string()))?;
    if j["status"] != "success" {
        return Err(bad(format!("query: {}", r.body)));
    }
    let mut out = HashMap::new();
    for s in j["data"]["result"].as_array().into_iter().flatten() {
        let instance = s["metric"]["instance"].as_str().unwrap_or("?").to_string();
        let value = s["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| bad(format!("query: bad sample in {}", r.body)))?;
        out.insert(instance, value as u64);
    }
    Ok(out)
}

/// Poll Prometheus until it reports exactly `want` (instance → boxes).
fn wait_for_prometheus(
    kids: &mut Children,
    prom: SocketAddr,
    want: &HashMap<String, u64>,
    within: Duration,
) {
    let end = Instant::now() + within;
    loop {
        kids.assert_running("prometheus");
        let last = prometheus_boxes(prom);
        if matches!(&last, Ok(got) if got == want) {
            return;
        }
        assert!(
            Instant::now() < end,
            "Prometheus never reported pollbox_boxes = {want:?} within {within:?}; last: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

// ---------------------------------------------------------------------------------

#[test]
#[ignore = "needs haproxy, prometheus, openssl and curl (Debian packages); .ci/run installs them"]
fn two_nodes_behind_haproxy_scraped_by_prometheus() {
    let started = Instant::now();
    require_tool("haproxy", "-v");
    require_tool("prometheus", "--version");
    require_tool("openssl", "version");
    require_tool("curl", "--version");
    let mut kids = Children::new();
    let cert = self_signed_cert(&kids.dir);

    // 1. Two nodes, HAProxy in front of them, Prometheus scraping them.
    let node_names = ["node1", "node2"];
    let nodes = [
        spawn_node(&mut kids, node_names[0], "127.0.0.1:0"),
        spawn_node(&mut kids, node_names[1], "127.0.0.1:0"),
    ];
    let front: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let tls: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    spawn_logged(
        &mut kids,
        "haproxy",
        Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(repo_root().join("deploy/haproxy/haproxy.cfg.tmpl"))
            .env("FRONT_PORT", front.port().to_string())
            .env("TLS_PORT", tls.port().to_string())
            .env("TLS_CRT", &cert)
            .env("NODE1", nodes[0].to_string())
            .env("NODE2", nodes[1].to_string()),
    );
    let prom: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let prom_yml = kids.dir.join("prometheus.yml");
    std::fs::write(
        &prom_yml,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: pollbox\n    static_configs:\n      \
             - targets: [\"{}\", \"{}\"]\n",
            nodes[0], nodes[1]
        ),
    )
    .unwrap();
    let tsdb = kids.dir.join("tsdb");
    spawn_logged(
        &mut kids,
        "prometheus",
        Command::new("prometheus")
            .arg(format!("--config.file={}", prom_yml.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg(format!("--web.listen-address={prom}")),
    );
    wait_until_ok(
        &mut kids,
        "haproxy",
        front,
        "/lb-healthz",
        Duration::from_secs(10),
    );
    eprintln!("nodes {nodes:?}, haproxy {front} (TLS {tls}), prometheus {prom}");

    // 2. Ingest and poll 1,000 keys through HAProxy.
    let acked: HashMap<String, Acked> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|t| s.spawn(move || ingest_and_poll(front, t)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a client thread panicked"))
            .collect()
    });
    assert_eq!(acked.len(), KEYS);

    // Each key is on exactly one node, asked directly.
    let mut owner: HashMap<String, usize> = HashMap::new();
    let mut direct = [Conn::new(nodes[0]), Conn::new(nodes[1])];
    for (key, want) in &acked {
        let path = format!("/v1/boxes/{key}");
        let mut holders = Vec::new();
        for (n, conn) in direct.iter_mut().enumerate() {
            let r = conn
                .request("GET", &path, None)
                .unwrap_or_else(|e| panic!("GET {path} on {}: {e}", node_names[n]));
            match r.status {
                200 => {
                    assert_eq!(parse_box(key, "direct poll", &r), *want, "{key}");
                    holders.push(n);
                }
                404 => {}
                s => panic!("GET {path} on {}: {s} {}", node_names[n], r.body),
            }
        }
        assert_eq!(holders.len(), 1, "{key} is held by nodes {holders:?}");
        owner.insert(key.clone(), holders[0]);
    }
    let share = [0, 1].map(|n| owner.values().filter(|&&o| o == n).count() as u64);
    let boxes = [node_boxes(nodes[0]), node_boxes(nodes[1])];
    eprintln!("{KEYS} keys ingested and polled; share {share:?}, pollbox_boxes {boxes:?}");
    assert_eq!(boxes, share, "each node's pollbox_boxes counts its keys");
    assert_eq!(boxes[0] + boxes[1], KEYS as u64);
    for (n, &count) in share.iter().enumerate() {
        assert!(
            count >= (KEYS / 5) as u64,
            "{} holds only {count} of {KEYS} keys: hashing is lopsided",
            node_names[n]
        );
    }

    // Prometheus sees the same counts on both nodes.
    wait_until_ok(
        &mut kids,
        "prometheus",
        prom,
        "/-/ready",
        Duration::from_secs(20),
    );
    let want: HashMap<String, u64> = (0..2).map(|n| (nodes[n].to_string(), boxes[n])).collect();
    wait_for_prometheus(&mut kids, prom, &want, Duration::from_secs(20));
    eprintln!("prometheus reports pollbox_boxes {want:?}");

    // /metrics is not for clients: HAProxy refuses it even though these nodes
    // (the embedded config, no metrics_listen) serve it on the port it uses.
    let mut client = Conn::new(front);
    for path in ["/metrics", "/%6Detrics", "/metrics?x=1"] {
        let r = client
            .request("GET", path, None)
            .unwrap_or_else(|e| panic!("GET {path} through HAProxy: {e}"));
        assert_eq!(
            (r.status, r.body.as_str()),
            (404, r#"{"error":"not found"}"#),
            "GET {path} through HAProxy"
        );
    }
    let r = Conn::new(nodes[0])
        .request("GET", "/metrics", None)
        .unwrap();
    assert_eq!(r.status, 200, "GET /metrics on the node itself");
    eprintln!("/metrics through HAProxy: 404 (the node itself serves it)");

    // 3. Stop node2 gracefully: its keys fail fast, node1's keep working.
    let (dead, live) = (1, 0);
    let status = kids.terminate(node_names[dead], Duration::from_secs(15));
    assert!(
        status.success(),
        "{} after SIGTERM: {status}",
        node_names[dead]
    );
    let mut dead_keys: Vec<&String> = owner
        .iter()
        .filter(|(_, &o)| o == dead)
        .map(|(k, _)| k)
        .collect();
    dead_keys.sort();
    dead_keys.truncate(DEAD_SAMPLE);
    let t0 = Instant::now();
    let statuses: Vec<(String, u16)> = std::thread::scope(|s| {
        let handles: Vec<_> = dead_keys
            .chunks(DEAD_SAMPLE / 8)
            .map(|keys| {
                s.spawn(move || {
                    let mut conn = Conn::new(front);
                    keys.iter()
                        .map(|key| {
                            let path = format!("/v1/boxes/{key}");
                            let r = conn
                                .request("GET", &path, None)
                                .unwrap_or_else(|e| panic!("GET {path} (node down): {e}"));
                            (key.to_string(), r.status)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a client thread panicked"))
            .collect()
    });
    for (key, status) in &statuses {
        assert_eq!(*status, 503, "{key} (on the stopped node) through HAProxy");
    }
    // An ingest for a dead node's key must not create a box on the live node.
    let mut client = Conn::new(front);
    let r = client
        .request(
            "POST",
            &format!("/v1/boxes/{}", dead_keys[0]),
            Some(r#"{"value":1}"#),
        )
        .unwrap();
    assert_eq!(
        r.status, 503,
        "ingest of {} while its node is down",
        dead_keys[0]
    );
    eprintln!(
        "{} stopped: {} of its keys answered 503 in {:?}",
        node_names[dead],
        statuses.len(),
        t0.elapsed()
    );
    let mut live_checked = 0;
    for (key, want) in &acked {
        if owner[key] != live {
            continue;
        }
        let r = client
            .request("GET", &format!("/v1/boxes/{key}"), None)
            .unwrap_or_else(|e| panic!("GET {key} (its node is up): {e}"));
        assert_eq!(r.status, 200, "{key} on the live node: {}", r.body);
        assert_eq!(parse_box(key, "poll, other node down", &r), *want, "{key}");
        live_checked += 1;
    }
    assert_eq!(
        node_boxes(nodes[live]),
        boxes[live],
        "no box was created on the live node for the stopped node's keys"
    );
    eprintln!(
        "{live_checked} keys of {} still answer 200",
        node_names[live]
    );

    // 4. Restart node2, fresh, on its address: its keys come back to it (404, it has
    //    no snapshot here), and Prometheus sees it at 0 next to an unchanged node1.
    let again = spawn_node(&mut kids, node_names[dead], &nodes[dead].to_string());
    assert_eq!(again, nodes[dead]);
    for key in &dead_keys {
        let r = client
            .request("GET", &format!("/v1/boxes/{key}"), None)
            .unwrap_or_else(|e| panic!("GET {key} (node back): {e}"));
        assert_eq!(
            r.status, 404,
            "{key} once its node is back, fresh: {}",
            r.body
        );
    }
    let want: HashMap<String, u64> = [
        (nodes[live].to_string(), boxes[live]),
        (nodes[dead].to_string(), 0),
    ]
    .into();
    wait_for_prometheus(&mut kids, prom, &want, Duration::from_secs(20));
    eprintln!(
        "{} restarted: its keys route to it again; prometheus reports pollbox_boxes {want:?}",
        node_names[dead]
    );

    // 5. Event streams through HAProxy: the same path, so `balance uri` keeps a
    //    stream with its box's node; the box at once, each update, the end on DELETE.
    // A new box's first version is the clock's: each is read from its ingest.
    let ver_of = |body: &str| -> u64 {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["ver"]
            .as_u64()
            .unwrap_or_else(|| panic!("no ver in {body}"))
    };
    let mut subs: Vec<(String, TcpStream, Vec<u8>, u64)> = (0..4)
        .map(|i| {
            let key = format!("sys-sse-{i}");
            let r = client
                .request("POST", &format!("/v1/boxes/{key}"), Some(r#"{"value":1}"#))
                .unwrap();
            assert_eq!(r.status, 200, "{key}: {}", r.body);
            let first = ver_of(&r.body);
            let mut st = TcpStream::connect(front).unwrap();
            st.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            write!(
                st,
                "GET /v1/boxes/{key} HTTP/1.1\r\nHost: pollbox\r\nAccept: text/event-stream\r\n\r\n"
            )
            .unwrap();
            (key, st, Vec::new(), first)
        })
        .collect();
    let until = |st: &mut TcpStream, buf: &mut Vec<u8>, what: &str| {
        while !String::from_utf8_lossy(buf).contains(what) {
            let n = fill(st, buf).unwrap_or_else(|e| panic!("stream: {e} (want {what:?})"));
            assert!(
                n > 0,
                "stream ended before {what:?}: {:?}",
                String::from_utf8_lossy(buf)
            );
        }
    };
    for (key, st, buf, first) in &mut subs {
        until(st, buf, &format!("\"ver\":{first},"));
        let head = String::from_utf8_lossy(buf).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{key}: {head}");
        assert!(
            head.contains("content-type: text/event-stream"),
            "{key}: {head}"
        );
        assert!(
            head.contains(&format!("id: {first}\ndata: {{\"k\":\"{key}\",")),
            "{key}: {head}"
        );
        let r = client
            .request("POST", &format!("/v1/boxes/{key}"), Some(r#"{"value":2}"#))
            .unwrap();
        assert_eq!(r.status, 200);
        until(st, buf, &format!("id: {}\ndata: ", *first + 1));
        let r = client
            .request("DELETE", &format!("/v1/boxes/{key}"), None)
            .unwrap();
        assert_eq!(r.status, 204);
        until(st, buf, "event: deleted\ndata: \n\n");
        // Then the end of the stream, through HAProxy too.
        let mut rest = Vec::new();
        assert_eq!(fill(st, &mut rest).unwrap_or(0), 0, "{key}: {rest:?}");
    }
    eprintln!("event streams through haproxy: 4 keys, their updates and deletions delivered");

    // 6. HTTP/2 at the edge: HAProxy's TLS frontend (ALPN h2,http/1.1) multiplexes
    //    a browser's requests and streams over one connection and talks HTTP/1.1
    //    to the nodes. An ingest, a poll and an event stream over h2.
    let base = format!("https://localhost:{}", tls.port());
    let key = "sys-h2";
    let url = format!("{base}/v1/boxes/{key}");
    let connect_to = format!("localhost:{}:{tls}", tls.port());
    let curl = |args: &[&str]| -> String {
        let out = Command::new("curl")
            .args(["-sS", "-k", "--http2", "-i", "--max-time", "10"])
            .args(["--connect-to", &connect_to])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "curl {args:?}: {} {text}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let r = curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
        r#"{"value":7,"player":"h2"}"#,
        &url,
    ]);
    assert!(r.starts_with("HTTP/2 200"), "ingest over h2: {r}");
    let body = r.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert!(
        body.starts_with(&format!("{{\"k\":\"{key}\",\"ver\":")),
        "{r}"
    );
    let first = ver_of(body);
    let r = curl(&[&url]);
    assert!(r.starts_with("HTTP/2 200"), "poll over h2: {r}");
    assert!(
        r.to_ascii_lowercase()
            .contains(&format!("etag: \"{first}\"")),
        "{r}"
    );
    assert!(
        r.contains(&format!(
            "{{\"k\":\"{key}\",\"ver\":{first},\"v\":7,\"sum\":7,\"n\":1,\"by\":\"h2\"}}"
        )),
        "poll over h2: {r}"
    );
    // The stream: curl prints the head and each event as it comes (-N: no buffering).
    let mut sub = Command::new("curl")
        .args(["-sS", "-k", "--http2", "-i", "-N", "--max-time", "20"])
        .args(["--connect-to", &connect_to])
        .args(["-H", "Accept: text/event-stream", &url])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut out = sub.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = out.read(&mut chunk) {
            if n == 0 || tx.send(chunk[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut until = |what: &str| {
        let end = Instant::now() + Duration::from_secs(10);
        while !String::from_utf8_lossy(&seen).contains(what) {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(bytes) => seen.extend_from_slice(&bytes),
                Err(_) => panic!(
                    "h2 stream: no {what:?} within 10 s; got {:?}",
                    String::from_utf8_lossy(&seen)
                ),
            }
        }
        String::from_utf8_lossy(&seen).into_owned()
    };
    let head = until(&format!("id: {first}\ndata: "));
    assert!(head.starts_with("HTTP/2 200"), "stream over h2: {head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/event-stream"),
        "{head}"
    );
    let r = curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
        r#"{"value":5,"player":"h2"}"#,
        &url,
    ]);
    assert!(r.starts_with("HTTP/2 200"), "second ingest over h2: {r}");
    let events = until("\"sum\":12,");
    assert!(
        events.contains(&format!(
            "id: {}\ndata: {{\"k\":\"{key}\",\"ver\":{},",
            first + 1,
            first + 1
        )),
        "the update over the h2 stream: {events}"
    );
    let _ = sub.kill();
    let _ = sub.wait();
    eprintln!("TLS frontend: ingest, poll and an event stream over HTTP/2");

    kids.assert_running("haproxy");
    eprintln!("system test done in {:?}", started.elapsed());
}
