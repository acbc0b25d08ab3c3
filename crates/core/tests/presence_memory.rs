//! What presence holds in memory (docs/presence.md#what-it-costs), against the
//! issue's bounds: at most 200 bytes of node memory a member, and a presence
//! connection's hold well under 1.5 KB. Counted by a counting allocator, in
//! jemalloc's size classes, on this thread.

use pollbox_core::config::PresenceConfig;
use pollbox_core::presence::{Membership, Presence};
use std::sync::Arc;

#[global_allocator]
static ALLOC: pollbox_test_alloc::Counting =
    pollbox_test_alloc::Counting::new().size_classes(pollbox_core::boxes::size_class);

fn live() -> i64 {
    ALLOC.live_on_this_thread().classed
}

const N: usize = 100_000;

#[test]
fn a_member_costs_at_most_200_bytes_and_a_connection_its_hold() {
    let p = Arc::new(Presence::new(
        PresenceConfig {
            max_members: N,
            max_connections: N,
            ..PresenceConfig::default()
        },
        1,
    ));
    let ids: Vec<String> = (0..N).map(|i| format!("player-{i:06}")).collect();
    let mut held: Vec<Membership> = Vec::with_capacity(N);
    let before = live();
    for id in &ids {
        held.push(p.join(b"room-17/", id.as_bytes(), None, 0, 1).unwrap().0);
    }
    let after = live();
    // Each hold is 40 bytes in `held` (allocated before) plus its two names.
    let holds: i64 = held
        .iter()
        .map(|m| {
            (pollbox_core::boxes::size_class(b"room-17/".len())
                + pollbox_core::boxes::size_class(m.heap_bytes() - b"room-17/".len()))
                as i64
        })
        .sum();
    let per_member = (after - before - holds) / N as i64;
    let per_hold = (holds / N as i64) + std::mem::size_of::<Membership>() as i64;
    eprintln!("presence: {per_member} B a member (13-byte id, no info), {per_hold} B a hold");
    assert!(per_member > 0, "the counter counts");
    assert!(per_member <= 200, "{per_member} B a member");
    assert!(per_hold <= 1500, "{per_hold} B a hold");
    assert_eq!(p.stats().members, N as u64);
}
