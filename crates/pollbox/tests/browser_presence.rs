//! Presence from real browsers (docs/presence.md): two headless Chromium
//! processes at once, each loading a page from its own loopback origin, are
//! two people in one room of the `pollbox` binary (standalone, with
//! `presence.leave_grace_ms = 500` and CORS for both origins).
//!
//! Each page (tests/common/presence_page.rs, which
//! tests/browser_presence_cluster.rs loads too) follows the room's presence
//! (`/v1/boxes/browser-room%2F~presence`) with `EventSource`, as the
//! JavaScript client does with a member: it compares each state's `members`
//! with the one before (by id) and records joins and leaves in the DOM. It
//! first watches the room without being in
//! it (a stream with no `member=`: the empty room); when the test says so it
//! closes that stream and opens one with `member=ann` (or `ben`) and
//! `info={"name":...}`, going on from the last state it had. The test lets
//! ann in first, then ben: so ben's page sees ann join while it watches, and
//! ann's page sees ben join on her own stream as a member. A plain poll of the
//! room's presence box lists both, with their info.
//!
//! Then ben closes his tab: his page's load ends, Chromium dumps the DOM and
//! exits, and its connection ends. ann's page, still open, sees ben leave;
//! the test polls the presence box (and `/metrics`) meanwhile, and ben is
//! gone only after the grace: at least `leave_grace_ms` after the test let
//! his page end, and after the last `/metrics` that still counted his
//! connection open. Last, ann's page ends too, and the room is empty again
//! (two joins, two leaves in `/metrics`).
//!
//! Needs Debian's `chromium` (`.ci/run` installs it); run with
//! `cargo test -p pollbox --test browser_presence -- --ignored`.

#[path = "common/chromium.rs"]
mod chromium;
mod common;
#[path = "common/presence_page.rs"]
mod presence_page;

use chromium::{chromium_dump_dom, page_origin, results, ReleaseOnDrop};
use presence_page::{
    ann_then_ben_join, assert_ben_gone_after_the_grace, ids, metric, presence, serve_page, strings,
    until_ben_gone, Reports,
};

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The room's presence key (the room is `browser-room/`).
const PRESENCE: &str = "browser-room/~presence";
/// `presence.leave_grace_ms` of the server under test.
const GRACE_MS: u64 = 500;

#[test]
#[ignore = "needs chromium (Debian package chromium); .ci/run installs it"]
fn two_pages_see_each_other_join_and_a_closed_tab_leaves_after_the_grace() {
    let (ann_listener, ann_origin) = page_origin();
    let (ben_listener, ben_origin) = page_origin();
    let dir = common::tmpdir("browser-presence");
    let cfg = dir.join("pollbox.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 2\n\
             [http]\ncors_origins = [\"http://{ann_origin}\", \"http://{ben_origin}\"]\n\
             [presence]\nleave_grace_ms = {GRACE_MS}\n"
        ),
    )
    .expect("write the config");
    let (server, addr, _) = common::serve(
        ["serve".as_ref(), "--config".as_ref(), cfg.as_os_str()],
        &[],
    );
    assert_eq!(
        presence(addr, PRESENCE)["count"],
        0,
        "the room is empty at first"
    );

    let pollbox = format!("http://{addr}");
    let page = |member: &str, name: &str| presence_page::page(&pollbox, PRESENCE, member, name);
    let (report_tx, reports) = std::sync::mpsc::channel();
    let ann = serve_page(ann_listener, "ann", page("ann", "Ann"), report_tx.clone());
    let ben = serve_page(ben_listener, "ben", page("ben", "Ben"), report_tx);
    let _release = ReleaseOnDrop(vec![
        ann.hold.clone(),
        ann.present.clone(),
        ben.hold.clone(),
        ben.present.clone(),
    ]);
    // Two Chromium processes at once: each lives until the test answers its
    // page's `/hold`.
    let ann_browser =
        std::thread::spawn(move || chromium_dump_dom(&format!("http://{ann_origin}/"), &[]));
    let ben_browser =
        std::thread::spawn(move || chromium_dump_dom(&format!("http://{ben_origin}/"), &[]));
    let mut r = Reports::default();
    let within = Duration::from_secs(60);

    // Both pages watch the empty room; ann comes in (ben's page sees her
    // join while it watches), then ben (ann's page sees him join on her
    // stream as a member).
    ann_then_ben_join(&mut r, &reports, [&ann, &ben], within, ["", ""]);
    let both = presence(addr, PRESENCE);
    assert_eq!(both["count"], 2, "{both}");
    assert_eq!(
        both["members"],
        json!([{"id": "ann", "info": {"name": "Ann"}}, {"id": "ben", "info": {"name": "Ben"}}]),
        "the plain poll lists both, with their info"
    );
    assert_eq!(
        metric(addr, "pollbox_presence_connections"),
        2,
        "one stream each"
    );

    // ben closes his tab: his page's load ends, Chromium dumps the DOM and
    // exits. Meanwhile the test polls `/metrics` (when his connection ends)
    // and the presence box (when he is gone).
    let let_go = Instant::now();
    ben.hold.release();
    let mut ben_browser = Some(ben_browser);
    let mut ben_dom = None;
    let mut exited = None; // when ben's Chromium was seen to have exited
    let mut last_open = let_go; // the start of the last look that counted his connection open
    let mut closed = None; // when his connection was first seen ended
    let mut listed_after_close = 0; // polls that listed him after that (his grace)
    let gone = until_ben_gone(addr, PRESENCE, "", let_go, |look| {
        if ben_browser.as_ref().is_some_and(|b| b.is_finished()) {
            let b = ben_browser.take().expect("ben's Chromium");
            ben_dom = Some(b.join().expect("ben's Chromium"));
            exited = Some(look);
        }
        let open = metric(addr, "pollbox_presence_connections");
        let p = presence(addr, PRESENCE);
        let listed = ids(&p).contains(&"ben");
        if open == 2 {
            assert!(listed, "his connection is open, yet he is not listed: {p}");
            last_open = look;
        } else if closed.is_none() {
            closed = Some(look);
        }
        if listed && closed.is_some() {
            listed_after_close += 1;
        }
        listed
    });
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_millis();
    eprintln!(
        "ben's page let go at 0 ms; Chromium seen exited at {:?} ms; his connection last seen open \
         at {} ms, seen closed at {:?} ms; gone from the presence box at {} ms ({listed_after_close} \
         polls listed him in his grace)",
        exited.map(|e| ms(let_go, e)),
        ms(let_go, last_open),
        closed.map(|c| ms(let_go, c)),
        ms(let_go, gone),
    );
    // His connection cannot end before his page was let go, nor before the
    // last `/metrics` that counted it open: the grace runs from then.
    assert_ben_gone_after_the_grace("", GRACE_MS, let_go, last_open, gone);
    let p = presence(addr, PRESENCE);
    assert_eq!(p["count"], 1, "{p}");
    assert_eq!(
        p["members"],
        json!([{"id": "ann", "info": {"name": "Ann"}}]),
        "{p}"
    );
    r.wait_for(
        &reports,
        &["ann:leave=ben"],
        within,
        "ann's page sees ben leave",
    );
    let ben_dom = match ben_browser {
        Some(b) => b.join().expect("ben's Chromium"),
        None => ben_dom.expect("ben's DOM"),
    };

    // ann's page ends too.
    ann.hold.release();
    let ann_dom = ann_browser.join().expect("ann's Chromium");
    let ann_res = results(&ann_dom);
    let ben_res = results(&ben_dom);
    eprintln!("ann's page: {ann_res}\nben's page: {ben_res}");
    for (who, res, other, name) in [
        ("ann", &ann_res, "ben", "Ben"),
        ("ben", &ben_res, "ann", "Ann"),
    ] {
        assert_eq!(
            strings(res, "errors"),
            Vec::<&str>::new(),
            "{who}'s page: {res}"
        );
        assert_eq!(
            strings(res, "opens"),
            ["watch", "member"],
            "{who}'s page: {res}"
        );
        assert!(
            strings(res, "joins").contains(&other),
            "{who}'s page saw {other} join: {res}"
        );
        assert_eq!(
            res["infos"][other],
            json!({ "name": name }),
            "{who}'s page: {res}"
        );
    }
    assert_eq!(strings(&ann_res, "joins"), ["ann", "ben"], "{ann_res}");
    assert_eq!(strings(&ann_res, "leaves"), ["ben"], "{ann_res}");
    assert_eq!(strings(&ben_res, "joins"), ["ann", "ben"], "{ben_res}");
    assert_eq!(strings(&ben_res, "leaves"), Vec::<&str>::new(), "{ben_res}");
    // Where each page saw the other join: ben's while he watched, ann's on
    // her stream as a member.
    let states = |res: &Value| -> Vec<(String, Vec<String>)> {
        res["states"]
            .as_array()
            .unwrap_or_else(|| panic!("no states: {res}"))
            .iter()
            .map(|s| {
                let stream = s["stream"]
                    .as_str()
                    .unwrap_or_else(|| panic!("a state with no stream: {s}"));
                let members = strings(s, "members")
                    .into_iter()
                    .map(str::to_owned)
                    .collect();
                (stream.to_owned(), members)
            })
            .collect()
    };
    let st = |stream: &str, members: &[&str]| {
        (
            stream.to_owned(),
            members.iter().map(|m| m.to_string()).collect(),
        )
    };
    assert_eq!(
        states(&ann_res),
        [
            st("watch", &[]),
            st("member", &["ann"]),
            st("member", &["ann", "ben"]),
            st("member", &["ann"])
        ],
        "{ann_res}"
    );
    assert_eq!(
        states(&ben_res),
        [
            st("watch", &[]),
            st("watch", &["ann"]),
            st("member", &["ann", "ben"])
        ],
        "{ben_res}"
    );

    // ann's tab closed: after her grace the room is empty.
    let deadline = Instant::now() + Duration::from_secs(30);
    while presence(addr, PRESENCE)["count"] != 0 {
        assert!(
            Instant::now() < deadline,
            "ann was not gone 30 s after her page ended: {}",
            presence(addr, PRESENCE)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = presence(addr, PRESENCE);
    assert_eq!(
        (&p["k"], &p["members"]),
        (&json!(PRESENCE), &json!([])),
        "{p}"
    );
    assert_eq!(metric(addr, "pollbox_presence_joins_total"), 2);
    assert_eq!(metric(addr, "pollbox_presence_leaves_total"), 2);
    assert_eq!(metric(addr, "pollbox_presence_connections"), 0);

    let st = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    let mut server = server;
    assert!(server.wait().expect("wait").success(), "a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}
