//! A poll on any worker sees an ingest made on any worker as soon as the
//! ingest's response has been sent (docs/boxes.md#visibility).

mod common;
use common::*;

fn version_of(body: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["ver"].as_u64().unwrap()
}

#[test]
fn every_poll_after_an_ingest_sees_its_version() {
    let mut c = config();
    c.server.workers = 4;
    let s = start(c);
    let a = s.addr();
    let mut conns: Vec<Reader> = (0..16).map(|_| Reader::new(connect(a))).collect();
    for i in 0..2000usize {
        let key = format!("x{}", i % 10);
        let body = format!(r#"{{"value":{i}}}"#);
        let w = i % 16;
        conns[w].send(
            format!(
                "POST /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        let r = conns[w].read(false);
        assert_eq!(r.status, 200);
        let acked = version_of(&r.text());
        let p = (i * 7 + 3) % 16;
        conns[p].send(format!("GET /v1/boxes/{key} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        let r = conns[p].read(false);
        assert_eq!(r.status, 200);
        let seen = version_of(&r.text());
        assert!(
            seen >= acked,
            "poll on conn {p} saw {seen} after ack of {acked}"
        );
        assert!(r.text().contains(&format!("\"v\":{i},")), "{}", r.text());
    }
    s.shutdown().unwrap();
}
