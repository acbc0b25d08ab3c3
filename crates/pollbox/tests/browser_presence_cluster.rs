//! Presence from real browsers on a cluster (docs/presence.md#on-a-log-cluster):
//! two `pollbox` binaries are nodes of one Kafka log (a real broker,
//! `scripts/kafka`; `presence.lease_ms = 3000`, `leave_grace_ms = 500`), each
//! behind HAProxy as deploy/ ships it (deploy/haproxy/haproxy.cfg.tmpl: TLS
//! and HTTP/2 to the browser, HTTP/1.1 and PROXY v2 to the node). The
//! template hashes a box's path to pick its node, and a room's presence is one
//! path, so to pin each page to a node of its own every node has an HAProxy
//! of its own (both of the template's servers that node): node-a behind
//! `https://127.0.0.1:TLS_A`, node-b behind `https://127.0.0.1:TLS_B`.
//!
//! Headless Chromium processes load a page each from its own loopback
//! origin; the page follows the room's presence with `EventSource`
//! (tests/common/presence_page.rs, the page of tests/browser_presence.rs
//! too: it watches the room without a member, then, when the test says so,
//! follows it as its member, comparing each state's `members` with the one
//! before and reporting joins and leaves).
//!
//! - ann's page uses node-a, ben's node-b: each sees the other join, so the
//!   presence went through the log both ways; both nodes list both.
//! - ben closes his tab (his Chromium exits): ann's page, on the other node,
//!   sees him leave, and node-a drops him only after the grace (counted from
//!   when node-b last had his connection open).
//! - cat's page comes in on node-b, and ann's page sees her join. Then node-a
//!   (ann's) is killed with `kill -9`: no leave of ann's ever reaches the log.
//!   cat's page sees ann leave once node-a's lease lapses (asserted loosely:
//!   not before a third of the lease, within 30 s), and ann's own stream fails
//!   (HAProxy has no node left for it). Both HAProxy logs show the pages'
//!   presence streams came over HTTP/2.
//!
//! Needs Debian's `chromium`, `haproxy` and `openssl`, and the broker's jars
//! (`.ci/run` installs them all); run with
//! `cargo test -p pollbox --test browser_presence_cluster -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;
#[path = "../../server/tests/common/kafka.rs"]
mod kafka;
#[path = "common/presence_page.rs"]
mod presence_page;

use chromium::{
    certificate, chromium_dump_dom, free_port, haproxy, page_origin, results, ReleaseOnDrop,
};
use kafka::Broker;
use presence_page::{
    ann_then_ben_join, assert_ben_gone_after_the_grace, ids, metric, presence, serve_page, strings,
    until_ben_gone, Reports,
};

use std::net::SocketAddr;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::json;

/// The room's presence key (the room is `cluster-room/`).
const PRESENCE: &str = "cluster-room/~presence";
/// The log's topic (the nodes' presence is `TOPIC-presence`).
const TOPIC: &str = "browser-cluster";
/// `presence.leave_grace_ms` of the nodes.
const GRACE_MS: u64 = 500;
/// `presence.lease_ms` of the nodes.
const LEASE_MS: u64 = 3000;

/// Wait up to 30 s until `f` holds, polling every 20 ms; else panic with
/// `what` and the last thing `f` said.
fn until(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what}: not within 30 s: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Start Chromium on `origin`'s page in a thread: it lives until the test
/// answers the page's `/hold`, then gives the DOM it dumped.
fn browse(origin: SocketAddr, spki: &str) -> JoinHandle<String> {
    let flag = format!("--ignore-certificate-errors-spki-list={spki}");
    std::thread::spawn(move || chromium_dump_dom(&format!("http://{origin}/"), &[&flag]))
}

#[test]
#[ignore = "needs Debian's chromium, haproxy and a Kafka broker; .ci/run installs them"]
fn pages_on_two_nodes_of_a_log_see_joins_a_closed_tab_and_a_killed_node_leave() {
    let started = Instant::now();
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis();
    let dir = common::tmpdir("browser-presence-cluster");
    let (pem, spki) = certificate(&dir);
    let (ann_listener, ann_origin) = page_origin();
    let (ben_listener, ben_origin) = page_origin();
    let (cat_listener, cat_origin) = page_origin();

    // The log, and its two nodes.
    let broker = Broker::start();
    broker.create_topic(TOPIC, 2);
    broker.create_topic(&format!("{TOPIC}-presence"), 1);
    let node = |name: &str| {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
                 trusted_proxies = [\"127.0.0.1\"]\n\
                 [http]\ncors_origins = [\"http://{ann_origin}\", \"http://{ben_origin}\", \"http://{cat_origin}\"]\n\
                 [log]\nbrokers = \"{}\"\ntopic = \"{TOPIC}\"\nallow_unsafe_topic = true\n\
                 [presence]\nnode = \"{name}\"\nlease_ms = {LEASE_MS}\nleave_grace_ms = {GRACE_MS}\n",
                broker.bootstrap
            ),
        )
        .expect("write a node's config");
        let (child, addr, _) = common::serve(
            ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
            &[],
        );
        (child, addr)
    };
    let (mut a_proc, a) = node("node-a");
    let (b_proc, b) = node("node-b");
    until("both nodes ready", || {
        let ready = [a, b].map(|n| common::get(n, "/readyz"));
        match ready.iter().all(|r| r.0 == 200) {
            true => Ok(()),
            false => Err(format!("{ready:?}")),
        }
    });
    for n in [a, b] {
        assert_eq!(
            presence(n, PRESENCE)["count"],
            0,
            "the room is empty at first"
        );
    }

    // An HAProxy in front of each node.
    let (tls_a, tls_b) = (free_port(), free_port());
    let (proxy_a, log_a) = haproxy(a, tls_a, &pem);
    let (proxy_b, log_b) = haproxy(b, tls_b, &pem);

    let page = |tls: u16, member: &str, name: &str| {
        presence_page::page(&format!("https://127.0.0.1:{tls}"), PRESENCE, member, name)
    };
    let (report_tx, reports) = std::sync::mpsc::channel();
    let ann = serve_page(
        ann_listener,
        "ann",
        page(tls_a, "ann", "Ann"),
        report_tx.clone(),
    );
    let ben = serve_page(
        ben_listener,
        "ben",
        page(tls_b, "ben", "Ben"),
        report_tx.clone(),
    );
    let cat = serve_page(cat_listener, "cat", page(tls_b, "cat", "Cat"), report_tx);
    let _release = ReleaseOnDrop(
        [&ann, &ben, &cat]
            .iter()
            .flat_map(|h| [h.hold.clone(), h.present.clone()])
            .collect(),
    );
    let mut r = Reports::default();
    let within = Duration::from_secs(60);

    // ann (node-a) and ben (node-b) watch the empty room.
    let ann_browser = browse(ann_origin, &spki);
    let ben_browser = browse(ben_origin, &spki);
    // ann comes in on node-a: ben's page, on node-b, sees her join; ben comes
    // in on node-b: ann's page, on node-a, sees him join.
    ann_then_ben_join(
        &mut r,
        &reports,
        [&ann, &ben],
        within,
        [" on node-a", " on node-b"],
    );
    let both =
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "ben", "info": {"name": "Ben"}}]);
    for n in [a, b] {
        until("both nodes list both, with their info", || {
            let p = presence(n, PRESENCE);
            match p["members"] == both {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }
    assert_eq!(metric(a, "pollbox_presence_connections"), 1, "ann's");
    assert_eq!(metric(b, "pollbox_presence_connections"), 1, "ben's");

    // ben closes his tab: his page's load ends, Chromium dumps the DOM and
    // exits. Meanwhile the test polls node-b's `/metrics` (when his
    // connection there ends) and node-a's presence box (when he is gone from
    // the other node).
    let let_go = Instant::now();
    ben.hold.release();
    let mut last_open = let_go; // the start of the last look that counted his connection open on node-b
    let mut closed = None; // when it was first seen ended
    let gone = until_ben_gone(a, PRESENCE, " from node-a", let_go, |look| {
        let open = metric(b, "pollbox_presence_connections");
        if open == 1 {
            last_open = look;
        } else if closed.is_none() {
            closed = Some(look);
        }
        ids(&presence(a, PRESENCE)).contains(&"ben")
    });
    eprintln!(
        "ben's page let go at 0 ms; his connection to node-b last seen open at {} ms, seen \
         closed at {:?} ms; gone from node-a's presence box at {} ms",
        ms(let_go, last_open),
        closed.map(|c| ms(let_go, c)),
        ms(let_go, gone),
    );
    // His connection cannot end before his page was let go, nor before the
    // last `/metrics` of node-b that counted it open: the grace runs from
    // then, and his leave reaches node-a through the log after it.
    assert_ben_gone_after_the_grace(" from node-a", GRACE_MS, let_go, last_open, gone);
    r.wait_for(
        &reports,
        &["ann:leave=ben"],
        within,
        "ann's page (node-a) sees ben leave",
    );
    let ben_dom = ben_browser.join().expect("ben's Chromium");
    let ann_only = json!([{"id": "ann", "info": {"name": "Ann"}}]);
    for n in [a, b] {
        until("both nodes list ann alone", || {
            let p = presence(n, PRESENCE);
            match p["members"] == ann_only {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }

    // cat's page comes in on node-b; ann's page sees her join.
    let cat_browser = browse(cat_origin, &spki);
    r.wait_for(
        &reports,
        &["cat:open=watch", "cat:state=watch:ann"],
        within,
        "cat's page (node-b) watches the room with ann in it",
    );
    cat.present.release();
    r.wait_for(
        &reports,
        &[
            "cat:open=member",
            "cat:state=member:ann_cat",
            "cat:join=cat",
            "ann:join=cat",
        ],
        within,
        "cat joins on node-b",
    );
    let ann_cat =
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "cat", "info": {"name": "Cat"}}]);
    for n in [a, b] {
        until("both nodes list ann and cat", || {
            let p = presence(n, PRESENCE);
            match p["members"] == ann_cat {
                true => Ok(()),
                false => Err(format!("{n}: {p}")),
            }
        });
    }
    r.drain(&reports);
    let failed_before_kill: Vec<&str> = r
        .all
        .iter()
        .map(|(_, w)| w.as_str())
        .filter(|w| w.contains(":fail="))
        .collect();
    assert_eq!(
        failed_before_kill,
        Vec::<&str>::new(),
        "no page failed before the kill: {:?}",
        r.recent()
    );

    // kill -9 of node-a, ann's node, with her page open on it: no leave of
    // hers reaches the log. node-b drops her once node-a's lease lapses.
    a_proc.kill().expect("kill -9 node-a");
    let killed = Instant::now();
    let _ = a_proc.wait();
    let cat_only = json!([{"id": "cat", "info": {"name": "Cat"}}]);
    let gone = loop {
        let p = presence(b, PRESENCE);
        if !ids(&p).contains(&"ann") {
            assert_eq!(p["members"], cat_only, "node-b after node-a's lease");
            break Instant::now();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "ann was not gone from node-b 30 s after node-a was killed: {p}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    r.wait_for(
        &reports,
        &["cat:leave=ann", "ann:fail=member"],
        within,
        "cat's page (node-b) sees ann leave; ann's stream fails with her node",
    );
    let seen = r.when("cat:leave=ann").expect("cat:leave=ann");
    eprintln!(
        "node-a killed at 0 ms; ann gone from node-b's presence box at {} ms, cat's page saw her \
         leave at {} ms (lease {LEASE_MS} ms); ann's page saw its stream fail at {:?} ms",
        ms(killed, gone),
        ms(killed, seen),
        r.when("ann:fail=member").map(|t| ms(killed, t)),
    );
    // Her leave waits for the lease: node-a's last record was at most a
    // lease renewal (a third of the lease) before the kill. Loosely: not
    // before a third of the lease.
    assert!(
        gone.duration_since(killed) >= Duration::from_millis(LEASE_MS / 3),
        "ann was gone from node-b {} ms after the kill, before a third of the lease ({LEASE_MS} ms)",
        ms(killed, gone)
    );
    assert!(
        seen.duration_since(killed) >= Duration::from_millis(LEASE_MS / 3),
        "cat's page saw ann leave {} ms after the kill, before a third of the lease ({LEASE_MS} ms)",
        ms(killed, seen)
    );

    // cat's and ann's pages end.
    cat.hold.release();
    ann.hold.release();
    let cat_dom = cat_browser.join().expect("cat's Chromium");
    let ann_dom = ann_browser.join().expect("ann's Chromium");
    let (ann_res, ben_res, cat_res) = (results(&ann_dom), results(&ben_dom), results(&cat_dom));
    eprintln!("ann's page: {ann_res}\nben's page: {ben_res}\ncat's page: {cat_res}");
    for (who, res, member) in [
        ("ann", &ann_res, "Ann"),
        ("ben", &ben_res, "Ben"),
        ("cat", &cat_res, "Cat"),
    ] {
        assert_eq!(
            strings(res, "opens"),
            ["watch", "member"],
            "{who}'s page: {res}"
        );
        assert_eq!(
            res["infos"][who],
            json!({ "name": member }),
            "{who}'s page: {res}"
        );
    }
    assert_eq!(
        strings(&ann_res, "joins"),
        ["ann", "ben", "cat"],
        "{ann_res}"
    );
    assert_eq!(strings(&ann_res, "leaves"), ["ben"], "{ann_res}");
    assert!(
        strings(&ann_res, "errors")
            .iter()
            .all(|e| e.starts_with("member: EventSource error")),
        "ann's page failed only as her node died: {ann_res}"
    );
    assert_eq!(strings(&ben_res, "joins"), ["ann", "ben"], "{ben_res}");
    assert_eq!(strings(&ben_res, "leaves"), Vec::<&str>::new(), "{ben_res}");
    assert_eq!(strings(&ben_res, "errors"), Vec::<&str>::new(), "{ben_res}");
    assert_eq!(strings(&cat_res, "joins"), ["cat"], "{cat_res}");
    assert_eq!(strings(&cat_res, "leaves"), ["ann"], "{cat_res}");
    assert_eq!(strings(&cat_res, "errors"), Vec::<&str>::new(), "{cat_res}");

    // cat's tab closed: after her grace the room is empty on node-b.
    until("the room empty on node-b", || {
        let p = presence(b, PRESENCE);
        match p["count"] == 0 {
            true => Ok(()),
            false => Err(p.to_string()),
        }
    });
    assert_eq!(metric(b, "pollbox_presence_connections"), 0);

    // The pages' presence streams came over HTTP/2: each stream a page
    // closed (its watching stream; ann's that failed) is a line of its
    // HAProxy's log, naming the protocol the browser spoke.
    drop((proxy_a, proxy_b));
    for (name, log, streams) in [("node-a's", log_a, 1), ("node-b's", log_b, 2)] {
        let said = log.lock().unwrap().join("\n");
        let lines: Vec<&str> = said
            .lines()
            .filter(|l| l.contains("/v1/boxes/cluster-room%2F~presence"))
            .collect();
        assert!(
            lines.len() >= streams,
            "{name} HAProxy logged the pages' streams: {said}"
        );
        assert!(
            lines.iter().all(|l| l.ends_with(" HTTP/2.0\"")),
            "the browsers spoke HTTP/2 to {name} HAProxy: {said}"
        );
    }

    let mut b_proc = b_proc;
    let st = Command::new("kill")
        .args(["-TERM", &b_proc.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    assert!(b_proc.wait().expect("wait").success(), "a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("the test took {} ms", started.elapsed().as_millis());
}
