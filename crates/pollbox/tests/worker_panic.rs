//! SPEC §5: a worker thread that panics ends the process with a non-zero exit
//! (a supervisor restarts it); it never goes on serving with a missing worker.
//! The panic is injected with `POLLBOX_TEST_PANIC_AFTER`, which exists in debug
//! builds only (the ones `cargo test` makes).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_worker_that_panics_ends_the_process_with_an_error() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pollbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2"])
        .env("POLLBOX_TEST_PANIC_AFTER", "3")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let line = lines.next().expect("a start-up line").unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let said = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());

    // Requests until a worker has answered three (then panics), on fresh
    // connections so both workers get some.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the process kept running");
        if let Ok(mut s) = TcpStream::connect(&addr) {
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let _ = s.read_to_end(&mut Vec::new());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(70), "{status:?}");
    let said = said.join().unwrap().join("\n");
    assert!(said.contains("injected worker panic"), "{said}");
    assert!(said.contains("panicked; exiting with 70"), "{said}");
}
