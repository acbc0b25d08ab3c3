//! A second `pollbox serve` on an address where one already listens refuses to
//! start with "address in use", as any server does, instead of sharing the
//! port with the first through `SO_REUSEPORT` (two processes, two box tables,
//! each connection landing in either); the first goes on serving. The same for
//! `metrics_listen`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

/// A `pollbox serve` process and the first line it wrote (the start-up line,
/// or why it did not start). Killed and reaped when dropped, so a failing test
/// leaves no server behind.
struct Serve {
    child: Child,
    first_line: String,
    /// The rest of its stderr, read on so that it never blocks on it.
    rest: Option<JoinHandle<String>>,
}

fn serve(args: &[&str]) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .arg("serve")
        .args(args)
        .env_remove("POLLBOX_CONFIG")
        .env_remove("POLLBOX_LISTEN")
        .env_remove("POLLBOX_WORKERS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first_line = String::new();
    stderr.read_line(&mut first_line).unwrap();
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        rest
    });
    Serve {
        child,
        first_line,
        rest: Some(rest),
    }
}

impl Serve {
    /// The address its start-up line gives after `what` ("listening on",
    /// "metrics on").
    fn addr(&self, what: &str) -> String {
        self.first_line
            .split(&format!("{what} http://"))
            .nth(1)
            .and_then(|r| r.split([' ', '/', ';']).next())
            .unwrap_or_else(|| panic!("no address after {what:?} in {:?}", self.first_line))
            .to_string()
    }

    /// It refused to start: its exit status and everything it said.
    fn refused(mut self) -> (ExitStatus, String) {
        assert!(
            !self.first_line.contains("listening on"),
            "it started: {}",
            self.first_line
        );
        let status = self.child.wait().unwrap();
        let rest = self.rest.take().unwrap().join().unwrap();
        (status, format!("{}{rest}", self.first_line))
    }

    /// It still runs and answers `GET /healthz` on `addr`.
    fn assert_serves(&mut self, addr: &str) {
        assert!(self.child.try_wait().unwrap().is_none(), "it exited");
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn assert_address_in_use(second: Serve) {
    let (status, said) = second.refused();
    assert!(!status.success(), "{status:?}: {said}");
    let said_lower = said.to_ascii_lowercase();
    assert!(
        said_lower.contains("address already in use") || said_lower.contains("address in use"),
        "{said}"
    );
}

#[test]
fn a_second_server_on_the_same_address_refuses_to_start() {
    let mut first = serve(&["--listen", "127.0.0.1:0", "--workers", "2"]);
    let addr = first.addr("listening on");
    let port = addr.rsplit(':').next().unwrap();
    // The same address, and the wildcard one that covers it.
    for listen in [addr.clone(), format!("0.0.0.0:{port}")] {
        let second = serve(&["--listen", &listen, "--workers", "2"]);
        assert_address_in_use(second);
        first.assert_serves(&addr);
    }
}

/// A port nobody listens on (bound then released: free for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Two started at the same moment could both find the port free; the name a
/// server claims before it binds (`pollbox <addr>`, an abstract Unix socket)
/// keeps the later one out. Held here as a server about to listen holds it.
#[test]
fn a_server_refuses_an_address_another_one_has_claimed() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let addr = format!("127.0.0.1:{}", free_port());
    let name = SocketAddr::from_abstract_name(format!("pollbox {addr}")).unwrap();
    let claimed = UnixListener::bind_addr(&name).unwrap();
    assert_address_in_use(serve(&["--listen", &addr, "--workers", "2"]));
    drop(claimed);
    let mut server = serve(&["--listen", &addr, "--workers", "2"]);
    server.assert_serves(&addr);
}

/// What the checks hold is released when a server goes, crash included, and
/// the connections it closed (in `TIME_WAIT`) do not keep the next one out.
#[test]
fn a_server_starts_again_on_its_address_once_the_first_has_gone() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut first = serve(&["--listen", &addr, "--workers", "2"]);
    // The server closes this connection first: its side is left in TIME_WAIT.
    first.assert_serves(&addr);
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let mut again = serve(&["--listen", &addr, "--workers", "2"]);
    again.assert_serves(&addr);
}

#[test]
fn a_second_server_on_the_same_metrics_address_refuses_to_start() {
    let dir = std::env::temp_dir().join(format!("pollbox-listen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = |name: &str, metrics: &str| -> PathBuf {
        let path = dir.join(name);
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\nmetrics_listen = \"{metrics}\"\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let first_config = config("first.toml", "127.0.0.1:0");
    let mut first = serve(&["--config", first_config.to_str().unwrap()]);
    let addr = first.addr("listening on");
    let metrics = first.addr("metrics on");
    let second_config = config("second.toml", &metrics);
    let second = serve(&["--config", second_config.to_str().unwrap()]);
    assert_address_in_use(second);
    first.assert_serves(&addr);
    let _ = std::fs::remove_dir_all(&dir);
}
