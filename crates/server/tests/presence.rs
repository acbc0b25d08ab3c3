//! Presence over real sockets (docs/presence.md): who is in a room, served
//! as the box `<room>~presence`. Members join with `member=` on an event
//! stream or a long-poll of the room or of its presence; a member on two
//! connections is there once; it leaves `leave_grace_ms` after its last
//! connection ends, however it ended (a close, a reset); each bound refuses
//! with its own answer; pages list members by id; a node whose reads need a
//! token takes the member from the token's `sub`. The table's every rule is
//! a unit test in `crates/core/src/presence/tests.rs`.

mod common;
use common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;

fn node(grace_ms: u64) -> pollbox_server::Server {
    let mut c = config();
    c.presence.leave_grace_ms = grace_ms;
    c.presence.max_members = 3;
    c.presence.max_connections_per_member = 2;
    c.presence.max_listed = 2;
    c.presence.count_interval_ms = 300;
    start(c)
}

/// An event stream opened with `path`: its head read.
fn stream(a: SocketAddr, path: &str, extra: &str) -> Reader {
    let mut r = Reader::new(connect(a));
    r.send(
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{extra}\r\n")
            .as_bytes(),
    );
    let head = r.read_through("\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    r
}

/// The next event's payload whose members are exactly `ids` (events
/// before it are skipped: a stream may coalesce, never reorder).
fn until_members(r: &mut Reader, ids: &[&str]) -> Value {
    loop {
        let ev = r.read_through("\n\n");
        let Some(data) = ev.lines().find_map(|l| l.strip_prefix("data: ")) else {
            continue;
        };
        let v: Value = serde_json::from_str(data).unwrap();
        if listed(&v) == ids {
            return v;
        }
    }
}

fn listed(v: &Value) -> Vec<String> {
    v["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn metric(a: SocketAddr, name: &str) -> u64 {
    get(a, "/metrics")
        .text()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_string))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn members_join_once_and_leave_after_the_grace_however_their_connection_ends() {
    let s = node(300);
    let a = s.addr();
    let mut watch = stream(a, "/v1/boxes/room-1/~presence", "");
    let first = until_members(&mut watch, &[]);
    assert_eq!(first["k"], "room-1/~presence");
    assert_eq!(first["count"], 0);

    // alice on the presence box's own stream, with info; bob on a stream of
    // the room's boxes.
    let alice = stream(
        a,
        "/v1/boxes/room-1/~presence?member=alice&info=%7B%22name%22%3A%22Alice%22%7D",
        "",
    );
    let bob = stream(a, "/v1/boxes?prefix=room-1/&member=bob", "");
    let both = until_members(&mut watch, &["alice", "bob"]);
    assert_eq!(both["count"], 2);
    assert_eq!(both["members"][0]["info"], json!({"name": "Alice"}));
    let polled = get(a, "/v1/boxes/room-1/~presence");
    assert_eq!(polled.status, 200);
    assert_eq!(polled.json()["count"], 2);
    let etag = polled.header("ETag").unwrap().to_string();
    assert_eq!(polled.version(), both["ver"].as_u64().unwrap());
    let same = raw(
        a,
        format!(
            "GET /v1/boxes/room-1/~presence HTTP/1.1\r\nHost: t\r\nIf-None-Match: {etag}\r\n\r\n"
        )
        .as_bytes(),
    )
    .0;
    assert_eq!(same.status, 304);

    // A second connection of alice is no join; closing it is no leave.
    let alice2 = stream(a, "/v1/boxes/room-1/~presence?member=alice", "");
    drop(alice2);
    assert_eq!(metric(a, "pollbox_presence_joins_total"), 2);
    // bob's connection is reset (no FIN: SO_LINGER 0), alice's closed.
    let sock = socket2::SockRef::from(&bob.stream);
    sock.set_linger(Some(std::time::Duration::ZERO)).unwrap();
    drop(bob);
    let left = until_members(&mut watch, &["alice"]);
    assert!(left["ver"].as_u64() > both["ver"].as_u64());
    drop(alice);
    until_members(&mut watch, &[]);
    assert_eq!(metric(a, "pollbox_presence_leaves_total"), 2);
    assert_eq!(metric(a, "pollbox_presence_members"), 0);
    assert_eq!(metric(a, "pollbox_presence_connections"), 1 - 1);
    s.shutdown().unwrap();
}

#[test]
fn a_long_poll_is_a_presence_connection_while_it_waits_and_a_quick_return_is_no_leave() {
    let s = node(1500);
    let a = s.addr();
    let v0 = get(a, "/v1/boxes/room-2/~presence").version();
    // carol's long-poll: her own join answers it at once (the room moved).
    let first = get(
        a,
        &format!("/v1/boxes/room-2/~presence?after={v0}&wait_ms=20000&member=carol"),
    );
    assert_eq!(listed(&first.json()), ["carol"]);
    let v1 = first.version();
    // Her next long-poll within the grace waits: she never left.
    let mut parked = Reader::new(connect(a));
    parked.send(
        format!(
            "GET /v1/boxes/room-2/~presence?after={v1}&wait_ms=20000&member=carol HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        .as_bytes(),
    );
    wait_parked(a, 1);
    assert_eq!(get(a, "/v1/boxes/room-2/~presence").version(), v1);
    // dave joins: carol's long-poll is answered with both.
    let mut dave = stream(a, "/v1/boxes/room-2/~presence?member=dave", "");
    let answered = parked.read(false);
    assert_eq!(listed(&answered.json()), ["carol", "dave"]);
    // carol does not come back: she leaves after the grace.
    until_members(&mut dave, &["dave"]);
    s.shutdown().unwrap();
}

#[test]
fn each_bound_and_each_bad_parameter_has_its_own_answer() {
    let s = node(60_000);
    let a = s.addr();
    let _m: Vec<Reader> = ["a", "b", "c"]
        .iter()
        .map(|m| stream(a, &format!("/v1/boxes/r/~presence?member={m}"), ""))
        .collect();
    let full = get_sse(a, "/v1/boxes/r/~presence?member=d");
    assert_eq!(full.status, 503);
    assert_eq!(
        full.json(),
        json!({"error": "room full", "limit": "presence.max_members"})
    );
    let _a2 = stream(a, "/v1/boxes/r/~presence?member=a", "");
    let many = get_sse(a, "/v1/boxes/r/~presence?member=a");
    assert_eq!(many.status, 429);
    assert_eq!(many.json()["limit"], "presence.max_connections_per_member");
    for (path, why) in [
        ("/v1/boxes/r/~presence?member=", "member is empty"),
        (
            "/v1/boxes/r/~presence?member=x&info=%5B1%5D",
            "info is not a JSON object",
        ),
        (
            "/v1/boxes/r/~presence?info=%7B%7D",
            "info goes with member=",
        ),
    ] {
        let r = get_sse(a, path);
        assert_eq!(
            (r.status, r.json()["error"].clone()),
            (400, json!(why)),
            "{path}"
        );
    }
    for path in [
        "/v1/boxes/r/scores?member=x",
        "/v1/boxes?keys=r/~presence&member=x",
    ] {
        let r = get_sse(a, path);
        assert_eq!(r.status, 400, "{path}");
        assert!(r
            .text()
            .contains("member= goes on a stream or long-poll of a room"));
    }
    let plain = get(a, "/v1/boxes/r/~presence?member=x");
    assert_eq!(plain.status, 400);
    assert!(plain
        .text()
        .contains("needs an event stream or a long-poll"));
    let ingest = post(a, "/v1/ingest", r#"{"key":"r/~presence","value":1}"#);
    assert_eq!(ingest.status, 422, "{}", ingest.text());
    assert!(ingest.text().contains("names a room's presence"));
    assert_eq!(delete(a, "/v1/boxes/r/~presence").status, 400);
    let m = get(a, "/metrics").text();
    assert!(m.contains("pollbox_presence_refused_total{limit=\"presence.max_members\"} 1"));
    assert!(m.contains(
        "pollbox_presence_refused_total{limit=\"presence.max_connections_per_member\"} 1"
    ));
    s.shutdown().unwrap();
}

/// `GET path` asking for an event stream, on a fresh connection: the
/// refusal (a stream's head would not end in a body).
fn get_sse(a: SocketAddr, path: &str) -> Resp {
    raw(
        a,
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n\r\n").as_bytes(),
    )
    .0
}

#[test]
fn pages_list_every_member_by_id_past_max_listed() {
    let s = node(60_000);
    let a = s.addr();
    let _m: Vec<Reader> = ["c", "a", "b"]
        .iter()
        .map(|m| stream(a, &format!("/v1/boxes?prefix=p/&member={m}"), ""))
        .collect();
    // Past max_listed (2): the count alone.
    let mut count = get(a, "/v1/boxes/p/~presence").json();
    for _ in 0..100 {
        if count["count"] == 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        count = get(a, "/v1/boxes/p/~presence").json();
    }
    assert_eq!(count["count"], 3);
    assert!(count.get("members").is_none(), "{count}");
    let p1 = get(a, "/v1/boxes/p/~presence?limit=2").json();
    assert_eq!(listed(&p1), ["a", "b"]);
    let next = p1["next"].as_str().unwrap();
    let p2 = get(a, &format!("/v1/boxes/p/~presence?limit=2&cursor={next}")).json();
    assert_eq!(listed(&p2), ["c"]);
    assert_eq!(p2["next"], Value::Null);
    assert_eq!(p2["count"], 3);
    // In a poll of many boxes, beside a box of the room, as any box.
    post(a, "/v1/boxes/p/scores", r#"{"value":7}"#);
    let many = get(a, "/v1/boxes?keys=p/~presence,p/scores").json();
    assert_eq!(many[0]["count"], 3);
    assert_eq!(many[1]["v"], 7);
    s.shutdown().unwrap();
}

#[test]
#[ignore = "needs python3 with pyjwt and cryptography"]
fn with_tokens_the_member_is_the_tokens_sub_and_needs_a_read_scope_over_the_room() {
    let dir = common::jwt::tempdir("presence");
    common::jwt::keys(&dir);
    let exp = common::jwt::now() + 3600;
    let mut with_sub = common::jwt::claims(exp, &["room-9/*"], &[]);
    with_sub["sub"] = json!("erin");
    with_sub["pollbox"]["info"] = json!({"team": "red"});
    let mut elsewhere = common::jwt::claims(exp, &["room-8/*"], &[]);
    elsewhere["sub"] = json!("erin");
    let tokens = common::jwt::mint(
        &dir,
        &[
            json!({"kid": "es", "claims": with_sub}),
            json!({"kid": "es", "claims": elsewhere}),
        ],
    );
    let mut c = config();
    common::jwt::token_access(&mut c, &dir.join("jwks.json"), "ingest-secret");
    let s = start(c);
    let a = s.addr();
    let auth = |t: &str| format!("Authorization: Bearer {t}\r\n");
    let mut erin = stream(
        a,
        "/v1/boxes/room-9/~presence?member=erin",
        &auth(&tokens[0]),
    );
    let v = until_members(&mut erin, &["erin"]);
    assert_eq!(v["members"][0]["info"], json!({"team": "red"}));
    let refuse = |path: &str, token: &str| {
        raw(
            a,
            format!(
                "GET {path} HTTP/1.1\r\nHost: t\r\nAccept: text/event-stream\r\n{}\r\n",
                auth(token)
            )
            .as_bytes(),
        )
        .0
    };
    let other = refuse("/v1/boxes/room-9/~presence?member=frank", &tokens[0]);
    assert_eq!(other.status, 403);
    assert_eq!(other.json()["error"], "member is not the token's sub");
    let outside = refuse("/v1/boxes/room-9/~presence?member=erin", &tokens[1]);
    assert_eq!(outside.status, 403);
    let info = refuse(
        "/v1/boxes/room-9/~presence?member=erin&info=%7B%7D",
        &tokens[0],
    );
    assert_eq!(info.status, 400);
    s.shutdown().unwrap();
}
