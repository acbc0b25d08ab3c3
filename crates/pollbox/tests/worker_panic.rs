//! A worker thread that panics ends the process with a non-zero exit (a
//! supervisor restarts it); it never goes on serving with a missing worker
//! (docs/operations.md#worker-panics).
//! The panic is injected with `POLLBOX_TEST_PANIC_AFTER`, which exists in debug
//! builds only (the ones `cargo test` makes).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn a_worker_that_panics_ends_the_process_with_an_error() {
    let (mut child, addr, said) = common::serve(
        ["serve", "--listen", "127.0.0.1:0", "--workers", "2"],
        &[("POLLBOX_TEST_PANIC_AFTER", "3")],
    );

    // Requests until a worker has answered three (then panics), on fresh
    // connections so both workers get some.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the process kept running");
        if let Ok(mut s) = TcpStream::connect(addr) {
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
