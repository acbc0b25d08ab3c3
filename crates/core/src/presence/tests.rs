use super::*;

fn cfg() -> PresenceConfig {
    PresenceConfig {
        leave_grace_ms: 100,
        max_listed: 3,
        count_interval_ms: 1000,
        max_members: 5,
        max_connections_per_member: 2,
        max_connections: 8,
        ..PresenceConfig::default()
    }
}

fn read(p: &Presence, room: &str) -> (u64, String) {
    let mut out = Vec::new();
    let v = p.read(room.as_bytes(), &mut out);
    (v, String::from_utf8(out).unwrap())
}

fn ticked(p: &Presence, now: u64) -> Vec<String> {
    let mut woken = Vec::new();
    p.tick(now, |r| woken.push(String::from_utf8(r.to_vec()).unwrap()));
    woken
}

#[test]
fn a_key_names_a_rooms_presence_only_after_a_prefix() {
    assert_eq!(room_of(b"room-17/~presence"), Some(&b"room-17/"[..]));
    assert_eq!(room_of(b"~presence"), Some(&b""[..]));
    assert_eq!(room_of(b"room-17~presence"), None);
    assert_eq!(room_of(b"room-17/alice"), None);
    assert!(reserved_key(b"room-17~presence"));
}

#[test]
fn an_empty_room_reads_as_no_one_at_its_floor() {
    let p = Arc::new(Presence::new(cfg(), 0));
    assert_eq!(
        read(&p, "r/"),
        (
            1,
            r#"{"k":"r/~presence","ver":1,"count":0,"members":[]}"#.into()
        )
    );
}

#[test]
fn a_member_on_two_connections_joins_once_and_leaves_after_the_last_plus_the_grace() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let (a1, changed) = p.join(b"r/", b"alice", None, 0, 1000).unwrap();
    assert!(changed);
    let (v1, body) = read(&p, "r/");
    assert_eq!(v1, 1000);
    assert_eq!(
        body,
        r#"{"k":"r/~presence","ver":1000,"count":1,"members":[{"id":"alice"}]}"#
    );
    let (a2, changed) = p.join(b"r/", b"alice", None, 0, 2000).unwrap();
    assert!(!changed, "a second connection is no join");
    assert_eq!(p.stats().members, 1);
    assert_eq!(p.stats().connections, 2);
    drop(a1);
    assert!(ticked(&p, 500).is_empty(), "one connection still holds it");
    drop(a2);
    assert!(ticked(&p, 550).is_empty(), "within the grace");
    assert_eq!(read(&p, "r/").0, 1000);
    assert_eq!(ticked(&p, 600), ["r/"], "the grace ran out (500 + 100)");
    let (v, body) = read(&p, "r/");
    assert_eq!(v, 1001, "the leave moved the version");
    assert_eq!(
        body,
        r#"{"k":"r/~presence","ver":1001,"count":0,"members":[]}"#
    );
    let s = p.stats();
    assert_eq!(
        (s.rooms, s.members, s.connections, s.joins, s.leaves),
        (0, 0, 0, 1, 1)
    );
}

#[test]
fn coming_back_within_the_grace_is_no_leave_and_no_join() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let (a, _) = p.join(b"r/", b"alice", None, 0, 10).unwrap();
    drop(a);
    let (b, changed) = p.join(b"r/", b"alice", None, 50, 10).unwrap();
    assert!(!changed);
    assert!(ticked(&p, 1000).is_empty(), "the stale leave is skipped");
    assert_eq!(read(&p, "r/").0, 10);
    drop(b);
}

#[test]
fn a_room_that_empties_and_starts_again_goes_on_past_its_versions() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let (a, _) = p.join(b"r/", b"alice", None, 0, 10).unwrap();
    drop(a);
    ticked(&p, 1000);
    assert_eq!(read(&p, "r/").0, 11);
    // A clock behind the floor (it was stepped back): the floor wins.
    let (_b, _) = p.join(b"r/", b"bob", None, 1000, 5).unwrap();
    assert_eq!(read(&p, "r/").0, 12);
}

#[test]
fn info_rides_with_the_member_and_new_info_is_a_change() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let (_a, _) = p
        .join(b"r/", b"alice", Some(br#"{"n":"A"}"#), 0, 10)
        .unwrap();
    let (_a2, changed) = p
        .join(b"r/", b"alice", Some(br#"{"n":"B"}"#), 0, 10)
        .unwrap();
    assert!(changed);
    assert_eq!(
        read(&p, "r/"),
        (
            11,
            r#"{"k":"r/~presence","ver":11,"count":1,"members":[{"id":"alice","info":{"n":"B"}}]}"#
                .into()
        )
    );
}

#[test]
fn each_bound_refuses_with_its_own_error_and_changes_nothing() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let mut held = Vec::new();
    for m in ["a", "b", "c", "d", "e"] {
        held.push(p.join(b"r/", m.as_bytes(), None, 0, 10).unwrap().0);
    }
    assert_eq!(
        p.join(b"r/", b"f", None, 0, 10).unwrap_err(),
        JoinError::RoomFull
    );
    held.push(p.join(b"r/", b"a", None, 0, 10).unwrap().0);
    assert_eq!(
        p.join(b"r/", b"a", None, 0, 10).unwrap_err(),
        JoinError::MemberConnections
    );
    held.push(p.join(b"s/", b"a", None, 0, 10).unwrap().0);
    held.push(p.join(b"s/", b"b", None, 0, 10).unwrap().0);
    assert_eq!(
        p.join(b"t/", b"a", None, 0, 10).unwrap_err(),
        JoinError::NodeConnections
    );
    let s = p.stats();
    assert_eq!(s.refused, [1, 1, 1]);
    assert_eq!((s.rooms, s.members, s.connections), (2, 7, 8));
    assert_eq!(
        read(&p, "r/").1.matches("\"id\"").count(),
        0,
        "past max_listed: the count"
    );
    assert!(read(&p, "r/").1.contains("\"count\":5"));
}

#[test]
fn past_max_listed_watchers_are_woken_at_most_once_an_interval() {
    let p = Arc::new(Presence::new(cfg(), 0));
    let mut held = Vec::new();
    let mut woken_at_once = 0;
    for (i, m) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        let (h, wake) = p.join(b"r/", m.as_bytes(), None, i as u64, 10).unwrap();
        woken_at_once += wake as usize;
        held.push(h);
    }
    // a, b, c listed: at once; d past the list, but no wake-up yet this
    // interval? The first three woke at 0..2, so d (at 3) and e wait.
    assert_eq!(woken_at_once, 3);
    assert!(ticked(&p, 500).is_empty());
    assert_eq!(ticked(&p, 1002), ["r/"], "one wake-up for d and e");
    assert!(ticked(&p, 5000).is_empty());
}

#[test]
fn pages_list_members_by_id_past_a_cursor() {
    let p = Arc::new(Presence::new(
        PresenceConfig {
            max_members: 100,
            max_connections: 100,
            ..cfg()
        },
        0,
    ));
    let _held: Vec<_> = ["d", "b", "a", "c", "e"]
        .iter()
        .map(|m| p.join(b"r/", m.as_bytes(), None, 0, 10).unwrap().0)
        .collect();
    let next = |last: Option<&[u8]>, out: &mut Vec<u8>| match last {
        Some(id) => {
            out.push(b'"');
            out.extend_from_slice(id);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    };
    let mut out = Vec::new();
    p.page(b"r/", None, 2, &mut out, next);
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        r#"{"k":"r/~presence","ver":14,"count":5,"members":[{"id":"a"},{"id":"b"}],"next":"b"}"#
    );
    // The first page is kept: read again, the same; after a join, the new one.
    let mut again = Vec::new();
    p.page(b"r/", None, 2, &mut again, next);
    assert_eq!(again, out);
    let (_aa, _) = p.join(b"r/", b"0", None, 0, 10).unwrap();
    let mut after_join = Vec::new();
    p.page(b"r/", None, 2, &mut after_join, next);
    assert_eq!(
        String::from_utf8(after_join).unwrap(),
        r#"{"k":"r/~presence","ver":15,"count":6,"members":[{"id":"0"},{"id":"a"}],"next":"a"}"#
    );
    let mut out = Vec::new();
    p.page(b"r/", Some(b"d"), 2, &mut out, next);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"k":"r/~presence","ver":15,"count":6,"members":[{"id":"e"}],"next":null}"#
    );
}

#[test]
fn info_and_ids_are_checked() {
    assert_eq!(
        check_info(br#"{ "a" : [1, 2] }"#).unwrap(),
        br#"{"a":[1,2]}"#
    );
    assert_eq!(check_info(b"[1]"), Err("info is not a JSON object"));
    assert_eq!(check_info(b"{"), Err("info is not valid JSON"));
    let long = format!(r#"{{"a":"{}"}}"#, "x".repeat(400));
    assert_eq!(
        check_info(long.as_bytes()),
        Err("info is longer than 400 bytes")
    );
    assert!(check_member(b"alice").is_ok());
    assert!(check_member(b"").is_err());
    assert!(check_member(&[b'a'; 129]).is_err());
    assert!(check_member(&[0xff]).is_err());
}

#[test]
fn on_a_log_the_view_is_served_and_a_forgotten_room_is_news_to_its_watchers() {
    let p = Arc::new(Presence::logged(cfg()));
    assert!(p.is_logged());
    // A join here goes out as a record; nothing is served until the view says.
    let (hold, wake) = p.join(b"r/", b"ann", Some(br#"{"n":1}"#), 0, 10).unwrap();
    assert!(!wake);
    assert_eq!(
        p.take_outbound(),
        [Outbound::Join {
            room: b"r/".to_vec(),
            member: b"ann".to_vec(),
            info: Some(br#"{"n":1}"#.to_vec()),
        }]
    );
    assert_eq!(read(&p, "r/").0, log::FORGOTTEN);
    assert!(p.serve(b"r/", 50, &[("ann".into(), Some(r#"{"n":1}"#.into()))], 0));
    assert_eq!(
        read(&p, "r/"),
        (
            50,
            r#"{"k":"r/~presence","ver":50,"count":1,"members":[{"id":"ann","info":{"n":1}}]}"#
                .into()
        )
    );
    assert_eq!(p.local_holds().len(), 1);
    drop(hold);
    ticked(&p, 1000);
    assert_eq!(
        p.take_outbound(),
        [Outbound::Leave {
            room: b"r/".to_vec(),
            member: b"ann".to_vec(),
        }]
    );
    p.forget(b"r/");
    assert_eq!(read(&p, "r/").0, log::FORGOTTEN);
    // Lower than what a watcher holds, and news to it all the same.
    assert!(moved(b"r/~presence", log::FORGOTTEN, 50));
    assert!(!moved(b"r/~presence", 50, 50));
    assert!(!moved(b"r/a", 1, 50), "a box's versions only grow");
    assert!(moved(b"r/a", 51, 50));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Whatever the ids and infos hold (quotes, backslashes, control
    /// characters, any Unicode), the room's payload and its pages are JSON that
    /// give back each member's id and info as joined, in byte order, and the
    /// pages walked by their cursors give every member once.
    #[test]
    fn payloads_and_pages_are_json_that_give_back_every_id_and_info(
        members in proptest::collection::btree_map(
            "(?s).{1,12}",
            proptest::option::of("(?s).{0,8}"),
            1..40,
        ),
        limit in 1usize..8,
    ) {
        let p = Arc::new(Presence::new(
            PresenceConfig {
                max_listed: 100,
                max_members: 100,
                max_connections: 100,
                ..cfg()
            },
            0,
        ));
        let info_of = |n: &Option<String>| {
            n.as_ref()
                .map(|n| serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap())
        };
        let _held: Vec<_> = members
            .iter()
            .map(|(id, n)| {
                let info = info_of(n);
                p.join(b"r/", id.as_bytes(), info.as_deref(), 0, 10).unwrap().0
            })
            .collect();
        let expected: Vec<(String, Option<serde_json::Value>)> = members
            .iter()
            .map(|(id, n)| (id.clone(), n.as_ref().map(|n| serde_json::json!({ "n": n }))))
            .collect();
        let listed = |body: &[u8]| -> (u64, Vec<(String, Option<serde_json::Value>)>) {
            let v: serde_json::Value = serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)));
            assert_eq!(v["k"], "r/~presence");
            let list = v["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["id"].as_str().unwrap().to_string(), m.get("info").cloned()))
                .collect();
            (v["count"].as_u64().unwrap(), list)
        };
        let mut out = Vec::new();
        p.read(b"r/", &mut out);
        proptest::prop_assert_eq!(listed(&out), (members.len() as u64, expected.clone()));
        let mut walked = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let mut out = Vec::new();
            let mut next = None;
            p.page(b"r/", after.as_deref(), limit, &mut out, |last, out| {
                next = last.map(<[u8]>::to_vec);
                match last {
                    Some(id) => crate::render::write_json_str(std::str::from_utf8(id).unwrap(), out),
                    None => out.extend_from_slice(b"null"),
                }
            });
            let (count, page) = listed(&out);
            proptest::prop_assert_eq!(count, members.len() as u64);
            proptest::prop_assert!(page.len() <= limit);
            walked.extend(page);
            match next {
                Some(id) => after = Some(id),
                None => break,
            }
        }
        proptest::prop_assert_eq!(walked, expected);
    }
}
