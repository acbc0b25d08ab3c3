//! The load generator against a live pollbox: its counts per kind equal the
//! server's `/metrics` counters exactly, and an open-loop rate the server can
//! hold is delivered within 2%.

use pollbox_core::config::Config;
use pollbox_load::{LoadArgs, Mix};
use pollbox_server::Server;
use std::collections::BTreeMap;
use std::time::Duration;

fn server() -> Server {
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    c.limits.max_wait_ms = 200;
    Server::start(c).unwrap()
}

/// Requests per route summed over codes, from `/metrics`.
fn requests_by_route(s: &Server) -> BTreeMap<String, u64> {
    let text = pollbox_memcheck::scrape(&format!("http://{}", s.addr())).unwrap();
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("pollbox_http_requests_total{route=\"") else {
            continue;
        };
        let route = rest.split('"').next().unwrap().to_string();
        let n: u64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
        *m.entry(route).or_default() += n;
    }
    m
}

#[test]
fn generator_counts_equal_server_counters() {
    let s = server();
    let mut a = LoadArgs::new(format!("http://{}", s.addr()));
    a.connections = 8;
    a.threads = 2;
    a.duration = Duration::from_secs(2);
    a.mix = Mix::parse("poll:60,ingest:20,batch:10,longpoll:10").unwrap();
    a.keys = 50;
    a.pipeline = 2;
    a.preseed = true;
    a.longpoll_wait = Duration::from_millis(50);
    a.warmup = Some(Duration::from_millis(300));
    a.quiet = true;
    let r = pollbox_load::run(&a).unwrap();
    assert_eq!(r.errors_total, 0, "{:?} {:?}", r.errors, r.ops);
    let op = |name: &str| r.op(name).unwrap();
    for name in ["poll", "ingest", "batch", "longpoll"] {
        assert_eq!(op(name).unanswered, 0, "{name}");
        assert!(op(name).requests > 0, "{name}");
    }
    let server = requests_by_route(&s);
    let got = |route: &str| server.get(route).copied().unwrap_or(0);
    let sent = |name: &str| op(name).requests + op(name).warmup_requests;
    assert_eq!(got("poll"), sent("poll"));
    assert_eq!(got("ingest_key"), sent("ingest"));
    assert_eq!(got("ingest"), sent("batch") + r.preseed_requests);
    assert_eq!(got("long_poll"), sent("longpoll"));
    s.shutdown().unwrap();
}

#[test]
fn open_loop_rate_is_delivered_within_two_percent() {
    let s = server();
    let mut a = LoadArgs::new(format!("http://{}", s.addr()));
    a.connections = 8;
    a.duration = Duration::from_secs(3);
    a.rate = Some(3000.0);
    a.mix = Mix::parse("poll:90,ingest:10").unwrap();
    a.preseed = true;
    a.quiet = true;
    let r = pollbox_load::run(&a).unwrap();
    assert_eq!(r.errors_total, 0);
    let ratio = r.achieved_rate / 3000.0;
    assert!(
        (0.98..=1.02).contains(&ratio),
        "achieved {} of 3000/s",
        r.achieved_rate
    );
    s.shutdown().unwrap();
}

/// `pollbox_sse_events_total`: the events the server sent on its streams.
fn sse_events_sent(s: &Server) -> u64 {
    let text = pollbox_memcheck::scrape(&format!("http://{}", s.addr())).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("pollbox_sse_events_total "))
        .unwrap()
        .parse()
        .unwrap()
}

/// Single ingests at 500/s over 2 connections for 2 s on `keys` keys,
/// quietly: the publishers of the streaming operations' tests.
fn ingest_at_500(s: &Server, keys: u32) -> LoadArgs {
    let mut a = LoadArgs::new(format!("http://{}", s.addr()));
    a.connections = 2;
    a.duration = Duration::from_secs(2);
    a.rate = Some(500.0);
    a.mix = Mix::parse("ingest:1").unwrap();
    a.keys = keys;
    a.quiet = true;
    a
}

/// The `sse` operation: its streams are the server's subscribers, every
/// event it counts the server sent, and it measures publish-to-receive latency.
#[test]
fn the_sse_operation_counts_events_the_server_sent() {
    let s = server();
    let mut a = ingest_at_500(&s, 5);
    a.sse = 20;
    let r = pollbox_load::run(&a).unwrap();
    assert_eq!(r.errors_total, 0);
    let sse = r.sse.as_ref().expect("an sse report");
    assert_eq!((sse.subscribers, sse.errors), (20, 0));
    let ingests = r.op("ingest").unwrap().requests;
    assert!(sse.events > 0 && ingests > 0);
    // Each of the 5 keys has 4 subscribers; coalescing may skip versions.
    assert!(
        sse.events <= 4 * ingests + 20,
        "{} events, {ingests} ingests",
        sse.events
    );
    assert!(sse.latency_ms.max > 0.0);
    let sent = sse_events_sent(&s);
    assert!(
        sent >= sse.events,
        "server sent {sent}, generator counted {}",
        sse.events
    );
    s.shutdown().unwrap();
}

/// The `prefix_streams` operation against the server's rooms: each stream lists
/// its room, syncs, then counts box events the server sent, with their latency.
#[test]
fn prefix_streams_list_their_rooms_and_count_events_the_server_sent() {
    let s = server();
    let mut a = ingest_at_500(&s, 20);
    a.rooms = 4;
    a.preseed = true;
    a.prefix_streams = 8;
    let r = pollbox_load::run(&a).unwrap();
    assert_eq!(r.errors_total, 0, "{:?} {:?}", r.errors, r.ops);
    let p = r.prefix_streams.as_ref().expect("a prefix_streams report");
    assert_eq!((p.streams, p.prefixes, p.errors), (8, 4, 0), "{p:?}");
    // Each room holds 5 of the 20 keys; every stream lists its room once.
    assert_eq!((p.listed, p.synced, p.resets), (8 * 5, 8, 0), "{p:?}");
    let ingests = r.op("ingest").unwrap().requests;
    assert!(p.events > 0 && ingests > 0, "{p:?}");
    // Each ingest moves a box watched by 2 streams; coalescing may skip versions.
    assert!(
        p.events <= 2 * ingests + 16,
        "{} events, {ingests} ingests",
        p.events
    );
    assert!(p.latency_ms.max > 0.0, "{p:?}");
    let sent = sse_events_sent(&s);
    assert!(
        sent >= p.events + p.listed,
        "server sent {sent}, generator counted {} + {} listed",
        p.events,
        p.listed
    );
    assert_eq!(requests_by_route(&s).get("prefix_stream"), Some(&8));
    s.shutdown().unwrap();
}

/// `poll_many` and `longpoll_many` (`GET /v1/boxes?keys=...`): every request's keys
/// are distinct (the server answers 400 otherwise), the ETag sent back gets 304s
/// while nothing moves, and the server's counters count each request.
#[test]
fn many_box_polls_get_200s_and_304s_and_no_errors() {
    let s = server();
    let mut a = LoadArgs::new(format!("http://{}", s.addr()));
    a.connections = 4;
    a.duration = Duration::from_secs(1);
    a.mix = Mix::parse("poll_many:100").unwrap();
    a.keys = 200;
    a.keys_per_request = 20;
    a.key_dist = pollbox_load::KeyDist::Zipf;
    a.preseed = true;
    a.quiet = true;
    let r = pollbox_load::run(&a).unwrap();
    let op = r.op("poll_many").unwrap();
    assert_eq!(r.errors_total, 0, "{:?} {:?}", r.errors, r.ops);
    let status = |code: &str| op.status.get(code).copied().unwrap_or(0);
    // Nothing moves: a set's first answer is a 200, the rest 304s.
    assert!(status("200") > 0 && status("304") > 0, "{:?}", op.status);
    assert_eq!(status("200") + status("304"), op.requests);
    assert!(status("200") <= 4 * 4 * 2, "{:?}", op.status);
    assert_eq!(op.not_modified, status("304"));
    assert_eq!(op.not_found, 0, "pre-seeded boxes exist");
    let server = requests_by_route(&s);
    assert_eq!(server.get("poll").copied().unwrap_or(0), op.requests);

    // With ingests, sets move now and then: 200s with new ETags; the long-polls park
    // until then or answer 304 after 50 ms (a rate low enough that most sets stay put).
    a.mix = Mix::parse("poll_many:60,longpoll_many:20,ingest:20").unwrap();
    a.longpoll_wait = Duration::from_millis(50);
    a.rate = Some(200.0);
    a.keys = 2000;
    a.keys_per_request = 5;
    a.key_dist = pollbox_load::KeyDist::Uniform;
    a.preseed = false;
    let before = requests_by_route(&s);
    let r = pollbox_load::run(&a).unwrap();
    assert_eq!(r.errors_total, 0, "{:?} {:?}", r.errors, r.ops);
    let after = requests_by_route(&s);
    let delta = |route: &str| after.get(route).unwrap_or(&0) - before.get(route).unwrap_or(&0);
    for name in ["poll_many", "longpoll_many"] {
        let o = r.op(name).unwrap();
        let status = |code: &str| o.status.get(code).copied().unwrap_or(0);
        assert!(
            status("200") > 0 && status("304") > 0,
            "{name}: {:?}",
            o.status
        );
        assert_eq!(status("200") + status("304"), o.requests, "{name}");
    }
    assert_eq!(delta("poll"), r.op("poll_many").unwrap().requests);
    assert_eq!(delta("long_poll"), r.op("longpoll_many").unwrap().requests);
    s.shutdown().unwrap();
}

/// A gauge or counter without labels from `/metrics`.
fn metric(s: &Server, name: &str) -> u64 {
    let text = pollbox_memcheck::scrape(&format!("http://{}", s.addr())).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .parse()
        .unwrap()
}

/// The presence mix against the server's presence (docs/presence.md): held members
/// join once each, the churn replaces members at its rate, a storm joins at the start
/// of the window, and the watchers count what they are sent and the last count, which
/// includes every member open (and those churned out, still in their grace).
#[test]
fn presence_members_churn_a_storm_and_watchers() {
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    c.presence.count_interval_ms = 200;
    let s = Server::start(c).unwrap();
    let mut a = LoadArgs::new(format!("http://{}", s.addr()));
    a.connections = 1;
    a.rate = Some(20.0);
    a.mix = Mix::parse("poll").unwrap();
    a.quiet = true;
    a.warmup = Some(Duration::from_millis(500));
    a.duration = Duration::from_secs(2);
    a.presence_members = 20;
    a.presence_churn = 10.0;
    a.presence_storm = 300;
    a.presence_watchers = 4;
    a.presence_room = Some(pollbox_load::PrefixTemplate::parse("room-0/").unwrap());
    let r = pollbox_load::run(&a).unwrap();
    let p = r.presence.as_ref().expect("a presence report");
    assert_eq!((p.member_errors, p.watcher_errors), (0, 0), "{p:?}");
    assert_eq!((p.rooms, p.watchers), (1, 4));
    assert_eq!(p.members_open, 20 + 300, "{p:?}");
    // 10 a second through a window of 2.2 s (the streams' 200 ms after it included).
    assert!((15..=30).contains(&p.leaves), "{p:?}");
    assert!(p.joins >= 300 + p.leaves - 2, "{p:?}");
    let storm = p.storm.as_ref().expect("a storm");
    assert_eq!((storm.members, storm.errors), (300, 0));
    let joined = storm.joined_ms.expect("every storm member joined");
    let seen = storm.seen_ms.expect("every watcher saw the storm");
    assert!(storm.opened_ms <= joined && joined <= seen, "{storm:?}");
    // Members churned out are still in their grace (5 s): counted too.
    assert!(
        p.last_count >= 320 && p.last_count <= 320 + p.leaves + 10,
        "{p:?}"
    );
    assert!(p.events > 0 && p.bytes_per_watcher > 0.0, "{p:?}");
    assert!(p.member_list_bytes > 320 * 14, "{p:?}");
    assert!(p.watcher_bytes_ratio.is_some_and(|r| r > 0.0), "{p:?}");
    // Every member the run opened joined once: the held, the storm, the churned in.
    let joins = metric(&s, "pollbox_presence_joins_total");
    assert!(
        joins >= 320 + p.leaves && joins <= 320 + p.leaves + 10,
        "server joins {joins}, {p:?}"
    );
    assert_eq!(r.errors_total, 0, "{:?}", r.errors);
    s.shutdown().unwrap();
}
