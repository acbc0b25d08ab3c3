//! SIGHUP reads the key set and static token files again
//! (docs/private-boxes.md#key-rotation), and the process goes on serving, on
//! the connections it had. The token file is rewritten in place with its
//! size and modification time kept, so the server's watcher of file changes
//! sees nothing: only the signal can make the new token valid.

mod common;
use common::{request, serve, tmpdir};
use std::fs::File;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

fn get(conn: &mut TcpStream, path: &str, token: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\n\r\n");
    request(conn, req.as_bytes())
        .expect("the connection stays")
        .0
}

fn signal(pid: u32, sig: &str) {
    let sent = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {sig} {pid}");
}

#[test]
fn sighup_reads_the_token_files_again_without_dropping_a_connection() {
    let dir = tmpdir("sighup");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "one\n").unwrap();
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n[auth]\nread = \"token\"\n\
             [[auth.token]]\ntoken_file = \"{}\"\nread = [\"*\"]\n",
            token_file.display()
        ),
    )
    .unwrap();
    let (mut server, addr, said) = serve(["serve", "--config", cfg.to_str().unwrap()], &[]);
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(get(&mut conn, "/v1/boxes/k", "one"), 404, "past the check");
    assert_eq!(get(&mut conn, "/v1/boxes/k", "two"), 401);

    // Rewritten in place, its size and modification time as they were.
    let was = std::fs::metadata(&token_file).unwrap().modified().unwrap();
    let mut f = File::options().write(true).open(&token_file).unwrap();
    f.write_all(b"two\n").unwrap();
    f.set_modified(was).unwrap();
    drop(f);
    signal(server.id(), "-HUP");
    let until = Instant::now() + Duration::from_secs(10);
    while get(&mut conn, "/v1/boxes/k", "one") != 401 {
        assert!(Instant::now() < until, "the old token is never refused");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get(&mut conn, "/v1/boxes/k", "two"), 404, "same connection");
    let metrics = {
        let mut m = TcpStream::connect(addr).unwrap();
        request(&mut m, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap()
            .1
    };
    assert!(
        metrics.contains("pollbox_auth_reloads_total{result=\"ok\"} 1\n"),
        "{metrics}"
    );

    signal(server.id(), "-TERM");
    assert!(server.wait().unwrap().success());
    let lines = said.join().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("SIGHUP: auth files read again: 0 keys, 1 static tokens")),
        "{lines:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
