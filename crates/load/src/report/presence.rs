//! The presence mix's part of the report (`--presence-*`, docs/presence.md):
//! what it measured, and its lines of the text report.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use super::join_counts;

/// The presence mix (`--presence-*`, docs/presence.md): members held, churned and
/// stormed in rooms, and the watchers of the rooms' presence.
#[derive(Debug, Clone, Serialize)]
pub struct PresenceReport {
    /// `--presence-room` (or the default it stood for), and the distinct rooms used.
    pub room: String,
    pub rooms: usize,
    /// Members held present (`--presence-members`), and replaced a second
    /// (`--presence-churn`).
    pub members: usize,
    pub churn_per_s: f64,
    /// Member streams answered 200 (joined) in the measured window, and per second.
    pub joins: u64,
    pub joins_per_s: f64,
    /// Member streams closed by the churn in the measured window, and per second
    /// (each leaves `presence.leave_grace_ms` later).
    pub leaves: u64,
    pub leaves_per_s: f64,
    /// Members joined and still open at the end.
    pub members_open: u64,
    /// Member streams refused, not connected or broken; the refused by status
    /// (`connect`: no connection, `no_answer`: closed before its head, `closed`: after).
    pub member_errors: u64,
    pub refused: BTreeMap<String, u64>,
    /// Bytes all members' streams received in the measured window.
    pub member_bytes: u64,
    /// Watchers (`--presence-watchers`), and those refused or broken.
    pub watchers: usize,
    pub watcher_errors: u64,
    /// Events all watchers received in the measured window, and per second.
    pub events: u64,
    pub events_per_s: f64,
    /// Bytes each watcher received in the measured window (after its head): the mean
    /// and the most.
    pub bytes_per_watcher: f64,
    pub bytes_per_watcher_max: u64,
    /// The `count` last seen in each watched room, and summed over them (one room: its
    /// count).
    pub last_count: u64,
    pub last_counts: BTreeMap<String, u64>,
    /// The bytes of the largest watched room's full member list at the end
    /// (`[{"id":"m-0"},...]` of the members this run holds open there, as the server
    /// would list them without `presence.max_listed`).
    pub member_list_bytes: u64,
    /// The most any watcher received over its room's full member list bytes (a join
    /// storm's acceptance: at most 1.5); none when a watched room is empty.
    pub watcher_bytes_ratio: Option<f64>,
    /// The join storm (`--presence-storm`), if there was one.
    pub storm: Option<StormReport>,
}

/// A join storm: its members opened at once at the start of the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    pub members: usize,
    /// From the storm's start until every member's request was written.
    pub opened_ms: f64,
    /// Until every member was answered 200 (joined); none when some were refused.
    pub joined_ms: Option<f64>,
    /// Until every watcher of the storm's rooms had seen a count including them all
    /// (after all joined); none if that never happened in the run, or no watcher.
    pub seen_ms: Option<f64>,
    /// Storm members refused or not connected.
    pub errors: u64,
}

impl PresenceReport {
    pub(crate) fn of(
        s: &crate::presence::PresenceStats,
        plan: &crate::presence::PresencePlan,
        window: std::time::Duration,
    ) -> PresenceReport {
        let secs = window.as_secs_f64().max(1e-9);
        let list_bytes = |room: usize| s.member_list_bytes.get(room).copied().unwrap_or(2);
        let mut last_counts = BTreeMap::new();
        for w in &s.watchers {
            if let (Some(room), Some(count)) = (s.rooms.get(w.room), w.last_count) {
                let seen = last_counts.entry(room.clone()).or_insert(0);
                *seen = count.max(*seen);
            }
        }
        let watched: Vec<usize> = {
            let mut rooms: Vec<usize> = s.watchers.iter().map(|w| w.room).collect();
            rooms.sort_unstable();
            rooms.dedup();
            rooms
        };
        // An empty list is `[]`: against it no ratio means anything.
        let watcher_bytes_ratio =
            if !s.watchers.is_empty() && s.watchers.iter().all(|w| list_bytes(w.room) > 2) {
                s.watchers
                    .iter()
                    .map(|w| w.bytes as f64 / list_bytes(w.room) as f64)
                    .reduce(f64::max)
            } else {
                None
            };
        let events: u64 = s.watchers.iter().map(|w| w.events).sum();
        let bytes: u64 = s.watchers.iter().map(|w| w.bytes).sum();
        let ms = |ns: u64| ns as f64 / 1e6;
        PresenceReport {
            room: plan.rooms.to_string(),
            rooms: s.rooms.len(),
            members: plan.members,
            churn_per_s: plan.churn_per_s,
            joins: s.joins,
            joins_per_s: s.joins as f64 / secs,
            leaves: s.leaves,
            leaves_per_s: s.leaves as f64 / secs,
            members_open: s.members_open,
            member_errors: s.member_errors,
            refused: s.refused.clone(),
            member_bytes: s.member_bytes,
            watchers: s.watchers.len(),
            watcher_errors: s.watcher_errors,
            events,
            events_per_s: events as f64 / secs,
            bytes_per_watcher: bytes as f64 / s.watchers.len().max(1) as f64,
            bytes_per_watcher_max: s.watchers.iter().map(|w| w.bytes).max().unwrap_or(0),
            last_count: last_counts.values().sum(),
            last_counts,
            member_list_bytes: watched.iter().map(|&r| list_bytes(r)).max().unwrap_or(0),
            watcher_bytes_ratio,
            storm: s.storm.as_ref().map(|st| StormReport {
                members: st.members,
                opened_ms: ms(st.opened_ns),
                joined_ms: st.joined_ns.map(ms),
                seen_ms: st.seen_ns.map(ms),
                errors: st.errors,
            }),
        }
    }
}

/// The presence mix: members, their joins and leaves, the watchers and the storm.
pub(super) fn print_presence(p: &PresenceReport, out: &mut impl Write) -> io::Result<()> {
    writeln!(
        out,
        "presence: {} members held in {} room{} ({:?}), churn {:.1}/s: {} joins ({:.1}/s), {} leaves ({:.1}/s), {} open at the end, {} errors{}",
        p.members,
        p.rooms,
        if p.rooms == 1 { "" } else { "s" },
        p.room,
        p.churn_per_s,
        p.joins,
        p.joins_per_s,
        p.leaves,
        p.leaves_per_s,
        p.members_open,
        p.member_errors,
        if p.refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", join_counts(&p.refused))
        }
    )?;
    if p.watchers > 0 {
        writeln!(
            out,
            "presence watchers: {} watching, {} events ({:.1}/s), {:.0} bytes a watcher (max {}), last count {}, {} errors; member list {} bytes, most a watcher got / list {}",
            p.watchers,
            p.events,
            p.events_per_s,
            p.bytes_per_watcher,
            p.bytes_per_watcher_max,
            p.last_count,
            p.watcher_errors,
            p.member_list_bytes,
            p.watcher_bytes_ratio
                .map_or("-".to_string(), |r| format!("{r:.2}x"))
        )?;
    }
    if let Some(s) = &p.storm {
        let ms = |v: Option<f64>| v.map_or("never".to_string(), |v| format!("{v:.1} ms"));
        writeln!(
            out,
            "presence storm: {} members written in {:.1} ms, all joined in {}, seen by every watcher in {}, {} errors",
            s.members,
            s.opened_ms,
            ms(s.joined_ms),
            ms(s.seen_ms),
            s.errors
        )?;
    }
    Ok(())
}
