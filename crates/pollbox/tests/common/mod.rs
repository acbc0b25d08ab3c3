//! Starting the real binary for the tests of this crate.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

/// A started server: the child process, killed and reaped when this is
/// dropped unless it has already exited, so a test that fails (panics) part
/// way does not leave a server running behind it.
pub struct Server(Child);

impl Deref for Server {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// A child started some other way than [`serve`], killed when dropped.
impl From<Child> for Server {
    fn from(child: Child) -> Server {
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Start `pollbox` with `args` (e.g. `serve --config FILE`) and `envs`, and read
/// the address from its start-up line. Stderr keeps being read (the server must
/// never block on it); the handle gives its remaining lines once it closes.
#[allow(dead_code)] // each test binary uses what it needs
pub fn serve<I, S>(args: I, envs: &[(&str, &str)]) -> (Server, SocketAddr, JoinHandle<Vec<String>>)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(args)
        .envs(envs.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // Lines before the start-up line (a log's client may say its brokers
    // cannot be reached before the server listens) are kept with the rest.
    let mut before = Vec::new();
    let addr = loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("no start-up line in {before:?}"))
            .unwrap();
        if let Some(addr) = listening_on(&line) {
            break addr;
        }
        before.push(line);
    };
    let said = std::thread::spawn(move || {
        before.extend(lines.map_while(Result::ok));
        before
    });
    (Server(child), addr, said)
}

/// The address in the server's start-up line (`pollbox: listening on
/// http://ADDR ...`), or `None` for any other line.
#[allow(dead_code)] // each test binary uses what it needs
pub fn listening_on(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("pollbox: listening on http://")?;
    Some(
        rest.split_whitespace()
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}")),
    )
}

/// `GET path` on a connection of its own: the status and the body.
#[allow(dead_code)] // each test binary uses what it needs
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    request(
        &mut s,
        format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes(),
    )
    .expect("an answer")
}

/// Send `req` on `s` and read one response: its status and body. `None` if
/// the connection failed (the server died or closed it).
#[allow(dead_code)] // each test binary uses what it needs
pub fn request(s: &mut TcpStream, req: &[u8]) -> Option<(u16, String)> {
    s.write_all(req).ok()?;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    loop {
        let n = match s.read(&mut tmp) {
            // EINTR after a stop and continue of this process: read again.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => r.ok()?,
        };
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
        let mut h = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut h);
        if let Ok(httparse::Status::Complete(head)) = r.parse(&buf) {
            let len: usize = r
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .map_or(0, |h| {
                    std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0)
                });
            if buf.len() >= head + len {
                let body = String::from_utf8_lossy(&buf[head..head + len]).into_owned();
                return Some((r.code.unwrap_or(0), body));
            }
        }
    }
}

/// A fresh folder of this test process: `$TMPDIR/pollbox-NAME-PID`.
#[allow(dead_code)] // each test binary uses what it needs
pub fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pollbox-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A config in `dir` for two workers on a free port, snapshotting to
/// `dir/boxes.snap` every `interval_s`.
#[allow(dead_code)] // each test binary uses what it needs
pub fn snapshot_config(dir: &std::path::Path, interval_s: u64) -> std::path::PathBuf {
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n[snapshot]\npath = \"{}\"\ninterval_s = {interval_s}\n",
            dir.join("boxes.snap").display()
        ),
    )
    .unwrap();
    cfg
}
