//! The generator against in-process test servers (tests/common): counts that match the
//! server's, open-loop rate, coordinated omission, validation, output files.

mod common;

use std::time::Duration;

use common::{Behaviour, TestServer};
use pollbox_load::{parse_duration, run, LoadArgs, Mix, PrefixTemplate};

fn args(server: &TestServer) -> LoadArgs {
    let mut a = LoadArgs::new(server.url());
    a.quiet = true;
    a.connections = 4;
    a.duration = Duration::from_millis(500);
    a.keys = 50;
    a.body_bytes = 256;
    a
}

#[test]
fn request_counts_per_kind_equal_the_servers() {
    let server = TestServer::start(Behaviour::default());
    let mut a = args(&server);
    a.mix = Mix::parse("poll:50,ingest:20,batch:10,longpoll:20").unwrap();
    a.batch_size = 5;
    a.longpoll_wait = Duration::from_millis(20);
    a.pipeline = 2;
    a.threads = 2;
    a.warmup = Some(Duration::from_millis(200));
    a.key_dist = pollbox_load::KeyDist::Zipf;
    let report = run(&a).unwrap();

    for (op, route) in [
        ("poll", "poll"),
        ("ingest", "ingest"),
        ("batch", "batch"),
        ("longpoll", "longpoll"),
    ] {
        let o = report.op(op).unwrap();
        assert_eq!(o.unanswered, 0, "{op}");
        assert_eq!(
            o.requests + o.warmup_requests,
            server.counts.get(route),
            "{op}: generator vs server"
        );
        assert!(o.requests > 0, "{op} was exercised");
    }
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);
    assert!(report.passed());
    let batch = report.op("batch").unwrap();
    assert_eq!(batch.messages_accepted, 5 * batch.requests);
    let ingest = report.op("ingest").unwrap();
    assert_eq!(ingest.messages_accepted, ingest.requests);
    // Versions the server holds account for every message sent.
    let total_versions: u64 = (0..50).map(|k| server.version(&format!("lg-{k}"))).sum();
    assert_eq!(
        total_versions,
        server.counts.get("ingest") + server.counts.get("batch_messages")
    );
    let statuses: u64 = report.status.values().sum();
    assert_eq!(statuses, report.total_requests());
    assert_eq!(server.counts.get("connections"), 4);
}

/// `poll_many` and `longpoll_many`: every request has `--keys-per-request` distinct keys
/// (the server answers 400 otherwise), sends back the ETag it last saw for its key set
/// and so gets 304s when nothing moved; counts match the server's.
#[test]
fn many_box_polls_send_back_their_etags_and_count_304s() {
    let server = TestServer::start(Behaviour::default());
    let mut a = args(&server);
    a.mix = Mix::parse("poll_many:60,longpoll_many:20,ingest:20").unwrap();
    a.keys_per_request = 10;
    a.longpoll_wait = Duration::from_millis(20);
    a.pipeline = 2;
    a.key_dist = pollbox_load::KeyDist::Zipf;
    let report = run(&a).unwrap();
    assert_eq!(
        report.errors_total, 0,
        "{:?} {:?}",
        report.errors, report.ops
    );
    for (op, route) in [
        ("poll_many", "poll_many"),
        ("longpoll_many", "longpoll_many"),
    ] {
        let o = report.op(op).unwrap();
        assert!(o.requests > 0, "{op}");
        assert_eq!(o.unanswered, 0, "{op}");
        assert_eq!(
            o.requests,
            server.counts.get(route),
            "{op}: generator vs server"
        );
        assert_eq!(
            o.status.get("200").copied().unwrap_or(0) + o.not_modified,
            o.requests,
            "{op}"
        );
    }
    let poll_many = report.op("poll_many").unwrap();
    assert!(poll_many.not_modified > 0, "{poll_many:?}");
    assert_eq!(
        poll_many.not_modified + report.op("longpoll_many").unwrap().not_modified,
        server.counts.get("not_modified")
    );
    // All but the first requests of each set send an If-None-Match: 4 connections, 4
    // sets each, and a second request of a set can go before the first is answered.
    let many = server.counts.get("poll_many") + server.counts.get("longpoll_many");
    assert!(
        server.counts.get("if_none_match") + 4 * 4 * 2 >= many,
        "{} of {many}",
        server.counts.get("if_none_match")
    );
    let mut table = Vec::new();
    pollbox_load::print_report(&report, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    println!("{table}");
    assert!(table.contains("poll_many 304 (nothing newer)"), "{table}");
    assert!(
        table.contains("10 keys per poll_many/longpoll_many request"),
        "{table}"
    );
}

/// Messages per second: every batch message the server took, counted over the same
/// window as requests per second, in the report, its JSON and its table.
#[test]
fn messages_per_second_count_what_the_server_accepted() {
    let server = TestServer::start(Behaviour::default());
    let dir = std::env::temp_dir().join(format!("pollbox-load-msgs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut a = args(&server);
    a.mix = Mix::parse("batch:3,ingest:1").unwrap();
    a.batch_size = 7;
    a.pipeline = 2;
    a.json = Some(dir.join("report.json"));
    let report = run(&a).unwrap();
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);

    let batch = report.op("batch").unwrap();
    let ingest = report.op("ingest").unwrap();
    assert!(batch.requests > 0 && ingest.requests > 0);
    // No warm-up and nothing lost: the server saw exactly the messages counted.
    assert_eq!(batch.unanswered + ingest.unanswered, 0);
    assert_eq!(batch.messages_accepted, server.counts.get("batch_messages"));
    assert_eq!(batch.messages_accepted, 7 * batch.requests);
    assert_eq!(ingest.messages_accepted, server.counts.get("ingest"));
    // Per second of the window, like the request rate: 7 messages per batch answered.
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * y.max(1.0);
    assert!(batch.messages_per_s > 0.0);
    assert!(
        close(batch.messages_per_s, 7.0 * batch.rate),
        "{} vs 7 × {}",
        batch.messages_per_s,
        batch.rate
    );
    assert!(close(ingest.messages_per_s, ingest.rate));
    assert!(close(
        report.messages_per_s,
        batch.messages_per_s + ingest.messages_per_s
    ));
    let in_window = report.messages_per_s * report.duration_s;
    let at_server = (server.counts.get("batch_messages") + server.counts.get("ingest")) as f64;
    assert!(in_window <= at_server + 1e-6, "{in_window} > {at_server}");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["messages_per_s"].as_f64(), Some(report.messages_per_s));
    assert_eq!(json["ops"][0]["op"], "batch");
    assert_eq!(
        json["ops"][0]["messages_per_s"].as_f64(),
        Some(batch.messages_per_s)
    );
    let mut table = Vec::new();
    pollbox_load::print_report(&report, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    assert!(
        table.contains(&format!("achieved {:.1} messages/s", report.messages_per_s)),
        "{table}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--rooms` and `--prefix-streams`: keys live in rooms, each prefix stream lists its
/// room (every pre-seeded box of it), syncs, then counts the events of the boxes that
/// move there, with their latency; the server sent at least what it counted.
#[test]
fn prefix_streams_list_their_rooms_and_count_the_events_after() {
    let server = TestServer::start(Behaviour::default());
    let mut a = args(&server);
    a.keys = 50;
    a.rooms = 5;
    a.preseed = true;
    a.prefix_streams = 10;
    a.rate = Some(500.0);
    a.duration = Duration::from_secs(1);
    a.mix = Mix::parse("ingest:3,poll:1").unwrap();
    let report = run(&a).unwrap();
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);
    assert!(report.sse.is_none());
    let p = report
        .prefix_streams
        .as_ref()
        .expect("a prefix_streams report");
    assert_eq!((p.streams, p.prefixes, p.errors), (10, 5, 0), "{p:?}");
    assert_eq!(p.prefix, "room-{i%5}/");
    assert_eq!(server.counts.get("prefix_streams"), 10);
    // Each room holds 10 of the 50 keys, each stream lists its room once.
    assert_eq!(p.listed, 10 * 10);
    assert_eq!(p.listed, server.counts.get("prefix_listed"));
    assert_eq!((p.synced, p.resets, p.deleted), (10, 0, 0));
    assert!(
        server.version("room-3/lg-13") >= 1,
        "keys are named in rooms"
    );
    let ingests = report.op("ingest").unwrap().requests;
    assert!(p.events > 0 && ingests > 0, "{p:?}");
    // Each ingest moves a box of one room, watched by 2 streams.
    assert!(
        p.events <= 2 * ingests + 20,
        "{} events, {ingests} ingests",
        p.events
    );
    assert!(p.events <= server.counts.get("prefix_events"));
    assert!(p.latency_ms.max > 0.0, "{p:?}");
    assert!(p.unmatched < p.events, "{p:?}");
    let mut table = Vec::new();
    pollbox_load::print_report(&report, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    println!("{table}");
    assert!(table.lines().any(|l| l.starts_with("prefix ")), "{table}");
    assert!(
        table.contains("prefix streams: 10 streams on 5 prefixes (\"room-{i%5}/\"), 100 boxes listed, 10 synced"),
        "{table}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["prefix_streams"]["listed"], 100);
    assert_eq!(json["prefix_streams"]["events"], p.events);

    // Prefixes nothing is under: empty listings, synced, and no events.
    let server = TestServer::start(Behaviour::default());
    let mut a = args(&server);
    a.prefix_streams = 6;
    a.prefix = Some(PrefixTemplate::parse("nobody-{i}/").unwrap());
    a.mix = Mix::parse("ingest").unwrap();
    a.rate = Some(200.0);
    let report = run(&a).unwrap();
    let p = report.prefix_streams.as_ref().unwrap();
    assert_eq!((p.streams, p.prefixes, p.listed, p.synced), (6, 6, 0, 6));
    assert_eq!((p.events, p.errors), (0, 0));
    assert!(report.op("ingest").unwrap().requests > 0);
}

#[test]
fn open_loop_delivers_the_offered_rate() {
    let server = TestServer::start(Behaviour::default());
    let mut a = args(&server);
    a.rate = Some(2000.0);
    a.duration = Duration::from_secs(2);
    a.mix = Mix::parse("poll:90,ingest:10").unwrap();
    let report = run(&a).unwrap();
    println!(
        "offered {:?} achieved {}",
        report.offered_rate, report.achieved_rate
    );
    assert_eq!(report.offered_rate, Some(2000.0));
    assert_eq!(report.scheduled_requests, Some(4000));
    let achieved = report.achieved_rate;
    assert!(
        (achieved - 2000.0).abs() <= 0.02 * 2000.0,
        "achieved {achieved} req/s for 2000 offered"
    );
    assert_eq!(report.errors_total, 0, "{:?}", report.errors);
    // Everything sent was answered and seen by the server.
    assert_eq!(
        report.total_requests(),
        server.counts.get("poll") + server.counts.get("ingest")
    );
}

/// Each connection of the server stops reading for 200 ms once, mid-run. Measured from
/// intended send times (open-loop), the stall reaches the 99th percentile; measured
/// from actual send times (closed-loop) it is one request per connection among many.
#[test]
fn open_loop_latency_shows_a_stall_that_closed_loop_hides() {
    let stall = Some((Duration::from_millis(300), Duration::from_millis(200)));
    let behaviour = Behaviour {
        stall,
        ..Behaviour::default()
    };

    let server = TestServer::start(behaviour.clone());
    let mut a = args(&server);
    a.connections = 16;
    a.rate = Some(1000.0);
    a.duration = Duration::from_secs(1);
    a.mix = Mix::parse("poll").unwrap();
    let open = run(&a).unwrap();

    let server = TestServer::start(behaviour);
    let mut a = args(&server);
    a.connections = 16;
    a.duration = Duration::from_secs(1);
    a.mix = Mix::parse("poll").unwrap();
    let closed = run(&a).unwrap();

    println!(
        "stall of 200 ms: open-loop p99 {:.3} ms max {:.3} ms ({} requests); closed-loop p99 {:.3} ms max {:.3} ms ({} requests)",
        open.latency_ms.p99,
        open.latency_ms.max,
        open.total_requests(),
        closed.latency_ms.p99,
        closed.latency_ms.max,
        closed.total_requests()
    );
    assert!(
        open.latency_ms.p99 >= 200.0,
        "open-loop p99 {} ms",
        open.latency_ms.p99
    );
    assert!(
        closed.latency_ms.max >= 200.0,
        "closed-loop max {} ms",
        closed.latency_ms.max
    );
    assert_eq!(open.errors_total + closed.errors_total, 0);
}

#[test]
fn wrong_statuses_count_as_errors_and_fail_the_run() {
    let server = TestServer::start(Behaviour {
        ingest_status: Some(500),
        ..Behaviour::default()
    });
    let mut a = args(&server);
    a.mix = Mix::parse("poll:1,ingest:1").unwrap();
    let report = run(&a).unwrap();
    let ingest = report.op("ingest").unwrap();
    assert!(ingest.requests > 0);
    assert_eq!(ingest.errors, ingest.requests);
    assert_eq!(report.errors.get("status"), Some(&ingest.requests));
    assert_eq!(ingest.status.get("500"), Some(&ingest.requests));
    // Polls of boxes that were never created are 404s, expected and not errors.
    let poll = report.op("poll").unwrap();
    assert_eq!(poll.not_found, poll.requests);
    assert_eq!(poll.errors, 0);
    assert!(report.error_rate() > 0.3);
    assert!(!report.passed());
}

#[test]
fn versions_going_backwards_are_caught() {
    let server = TestServer::start(Behaviour {
        versions_go_backwards: true,
        ..Behaviour::default()
    });
    let mut a = args(&server);
    a.keys = 3;
    a.preseed = true;
    a.mix = Mix::parse("poll").unwrap();
    let report = run(&a).unwrap();
    assert_eq!(report.preseed_requests, 1);
    assert_eq!(server.boxes(), 3);
    let poll = report.op("poll").unwrap();
    assert_eq!(poll.not_found, 0, "pre-seeded boxes exist");
    let version_errors = *report.errors.get("version").unwrap_or(&0);
    assert!(
        version_errors + 4 * 3 >= poll.requests,
        "only each connection's first poll of a key can look in order: {version_errors} of {}",
        poll.requests
    );
}

#[test]
fn closed_connections_are_reopened_and_lost_requests_counted() {
    let server = TestServer::start(Behaviour {
        close_every: Some(10),
        ..Behaviour::default()
    });
    let mut a = args(&server);
    a.pipeline = 4;
    a.mix = Mix::parse("poll:3,ingest:1").unwrap();
    let report = run(&a).unwrap();
    let answered_by_server = server.counts.get("poll") + server.counts.get("ingest");
    assert_eq!(report.total_requests(), answered_by_server);
    assert!(server.counts.get("connections") > 4, "reconnected");
    let closed = *report.errors.get("closed").unwrap_or(&0);
    assert!(closed > 0, "pipelined requests behind a close are lost");
    let unanswered: u64 = report.ops.iter().map(|o| o.unanswered).sum();
    assert_eq!(unanswered, closed);
}

#[test]
fn writes_json_hgrm_and_plot() {
    let server = TestServer::start(Behaviour::default());
    let dir = std::env::temp_dir().join(format!("pollbox-load-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut a = args(&server);
    a.duration = parse_duration("300ms").unwrap();
    a.json = Some(dir.join("report.json"));
    a.hgrm = Some(dir.join("latency.hgrm"));
    a.plot = Some(dir.join("latency.svg"));
    let report = run(&a).unwrap();

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["requests"], report.total_requests());
    assert_eq!(json["mode"], "closed-loop");
    assert_eq!(json["ops"][0]["op"], "poll");
    let hgrm = std::fs::read_to_string(dir.join("latency.hgrm")).unwrap();
    assert!(hgrm.starts_with("       Value   Percentile   TotalCount 1/(1-Percentile)\n\n"));
    assert!(hgrm.contains(&format!(
        "Total count    = {:>12}]",
        report.total_requests()
    )));
    for op in ["poll", "ingest"] {
        assert!(dir.join(format!("latency.{op}.hgrm")).exists(), "{op}");
    }
    let svg = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
    assert!(svg.contains("closed-loop: achieved"));
    let mut table = Vec::new();
    pollbox_load::print_report(&report, &mut table).unwrap();
    let table = String::from_utf8(table).unwrap();
    println!("{table}");
    assert!(table.contains("p99.9 ms"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refuses_to_start_without_a_server() {
    // A port nobody listens on: bind, note it, close.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut a = LoadArgs::new(format!("http://{addr}"));
    a.quiet = true;
    assert!(matches!(
        run(&a),
        Err(pollbox_load::LoadError::Connect { .. })
    ));
}
