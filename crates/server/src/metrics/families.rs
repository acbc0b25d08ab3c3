//! Every family `/metrics` exposes, in exposition order: name, label names,
//! `# HELP`, `# TYPE`, and how its samples are read from the server's state.

use super::Kind::{Counter, Gauge};
use super::{Family, Samples, Scrape};
use crate::log::{ErrorKind, LogState, RecordResult, ACK_BUCKETS};
use crate::stats::{
    IngestResult, Rejected, Removal, RouteLabel, DURATION_BUCKETS, RESET_BUCKETS, TICK_BUCKETS,
};
use crate::wal::{Wal, FAULTS as WAL_FAULTS, SYNC_BUCKETS};
use pollbox_core::clients::Limit;
use pollbox_core::presence::JoinError;
use pollbox_core::service::AuthRefused;
use std::sync::atomic::Ordering::Relaxed;

/// Every family, in the order of the exposition.
pub static FAMILIES: &[Family] = &[
    // Requests and ingest.
    Family::new(
        Counter,
        "pollbox_http_requests_total",
        &["route", "code"],
        "HTTP requests answered, by route and status code.",
        requests,
    ),
    Family::histogram(
        "pollbox_http_request_duration_seconds",
        "Server-side time from the read that completed a request to its response, queued with the other answers to that read.",
        |s, o| o.merged(s, &DURATION_BUCKETS, |w| &w.duration),
    ),
    Family::new(
        Counter,
        "pollbox_ingest_messages_total",
        &["result"],
        "Ingested messages by result (accepted, or the rejection reason).",
        |s, o| {
            let count = |r| s.sum(|w| w.ingested_total(r));
            o.each(&IngestResult::ALL, IngestResult::name, count);
        },
    ),
    // Access control and per-client limits (docs/private-boxes.md).
    Family::new(
        Counter,
        "pollbox_auth_refused_total",
        &["reason"],
        "Requests (and batch messages, and held requests whose token ended) refused by access control, by reason.",
        |s, o| {
            let count = |r: AuthRefused| s.sum(|w| w.auth_refused[r.index()].get());
            o.each(&AuthRefused::ALL, AuthRefused::label, count);
        },
    ),
    Family::new(
        Counter,
        "pollbox_auth_reloads_total",
        &["result"],
        "Reads of the key set and static token files while serving (SIGHUP, a file changed), by result; on an error the keys in use are kept.",
        |s, o| {
            let files = &s.shared.auth_files();
            o.labelled(&[&"ok"], files.reloads_ok.load(Relaxed));
            o.labelled(&[&"error"], files.reloads_failed.load(Relaxed));
        },
    ),
    Family::new(
        Counter,
        "pollbox_limit_refused_total",
        &["limit"],
        "Requests and connections refused by a per-client limit (429), by limit.",
        |s, o| {
            let count = |l: Limit| s.sum(|w| w.limit_refused[l.index()].get());
            o.each(&Limit::ALL, Limit::label, count);
        },
    ),
    Family::new(
        Gauge,
        "pollbox_limit_clients",
        &[],
        "Clients the per-client limits remember (with a connection, a held request or a bucket not yet refilled).",
        |s, o| o.value(s.shared.node().clients.len()),
    ),
    // Connections, bytes, boxes.
    Family::new(
        Gauge,
        "pollbox_connections_open",
        &[],
        "Connections open now.",
        |s, o| o.value(s.shared.open_connections()),
    ),
    Family::new(
        Counter,
        "pollbox_connections_total",
        &[],
        "Connections accepted.",
        |s, o| o.value(s.sum(|w| w.connections_total.get())),
    ),
    Family::new(
        Counter,
        "pollbox_connections_rejected_total",
        &["reason"],
        "Connections refused, by reason.",
        |s, o| {
            let count = |r| s.sum(|w| w.rejected_total(r));
            o.each(&Rejected::ALL, Rejected::name, count);
        },
    ),
    Family::new(
        Counter,
        "pollbox_bytes_received_total",
        &[],
        "Bytes read from clients.",
        |s, o| o.value(s.sum(|w| w.bytes_received.get())),
    ),
    Family::new(
        Counter,
        "pollbox_bytes_sent_total",
        &[],
        "Bytes written to clients.",
        |s, o| o.value(s.sum(|w| w.bytes_sent.get())),
    ),
    Family::new(Gauge, "pollbox_boxes", &[], "Boxes in the table.", |s, o| {
        o.value(s.shared.node().boxes.len())
    }),
    Family::new(
        Counter,
        "pollbox_boxes_expired_total",
        &[],
        "Boxes removed because they accepted no message for boxes.ttl_s.",
        |s, o| o.value(s.sum(|w| w.boxes_removed_total(Removal::Expired))),
    ),
    Family::new(
        Counter,
        "pollbox_boxes_deleted_total",
        &[],
        "Boxes removed by DELETE /v1/boxes/{key}.",
        |s, o| o.value(s.sum(|w| w.boxes_removed_total(Removal::Deleted))),
    ),
    Family::new(
        Gauge,
        "pollbox_io_uring_workers",
        &[],
        "Workers writing each loop turn's responses with one io_uring submission (the others write with send).",
        |s, o| o.value(s.shared.uring_workers()),
    ),
    Family::new(
        Gauge,
        "pollbox_buffered_bytes",
        &[],
        "Bytes of all connections' read buffers and send queues (limits.max_buffered_bytes bounds them).",
        |s, o| o.value(s.sum(|w| w.buffered_bytes.get())),
    ),
    Family::new(
        Gauge,
        "pollbox_parked_polls",
        &[],
        "Long-polls waiting now.",
        |s, o| o.value(s.sum(|w| w.parked_polls.get())),
    ),
    Family::new(
        Gauge,
        "pollbox_sse_subscribers",
        &[],
        "Event streams open now.",
        |s, o| o.value(s.sum(|w| w.sse_subscribers.get())),
    ),
    Family::new(
        Gauge,
        "pollbox_prefix_streams",
        &[],
        "Event streams of a prefix open now (docs/http.md#rooms; also in pollbox_sse_subscribers).",
        |s, o| o.value(s.sum(|w| w.prefix_streams.get())),
    ),
    // Presence (docs/presence.md).
    Family::new(
        Gauge,
        "pollbox_presence_rooms",
        &[],
        "Rooms with at least one member present (docs/presence.md).",
        |s, o| o.value(s.shared.node().presence.stats().rooms),
    ),
    Family::new(
        Gauge,
        "pollbox_presence_members",
        &[],
        "Members present in all rooms (a member in two rooms counts twice; in its leave grace, still present).",
        |s, o| o.value(s.shared.node().presence.stats().members),
    ),
    Family::new(
        Gauge,
        "pollbox_presence_connections",
        &[],
        "Presence connections open now (streams and long-polls that name a member).",
        |s, o| o.value(s.shared.node().presence.stats().connections),
    ),
    Family::new(
        Counter,
        "pollbox_presence_joins_total",
        &[],
        "Members that joined a room (a member's further connections are no join).",
        |s, o| o.value(s.shared.node().presence.stats().joins),
    ),
    Family::new(
        Counter,
        "pollbox_presence_leaves_total",
        &[],
        "Members that left a room (their last connection ended, and the grace ran out).",
        |s, o| o.value(s.shared.node().presence.stats().leaves),
    ),
    Family::new(
        Counter,
        "pollbox_presence_lease_expiries_total",
        &[],
        "On a node of a log: nodes whose presence lease lapsed (their members gone on every node).",
        |s, o| o.value(s.shared.node().presence.stats().lease_expiries),
    ),
    Family::new(
        Counter,
        "pollbox_presence_refused_total",
        &["limit"],
        "Presence connections refused, by the setting that bounds them.",
        |s, o| {
            let refused = s.shared.node().presence.stats().refused;
            o.each(&JoinError::ALL, JoinError::limit, |e| refused[e as usize]);
        },
    ),
    Family::new(
        Counter,
        "pollbox_sse_events_total",
        &[],
        "Events sent on event streams (heartbeats and deletions not counted).",
        |s, o| o.value(s.sum(|w| w.sse_events.get())),
    ),
    Family::new(
        Counter,
        "pollbox_sse_coalesced_total",
        &[],
        "Box versions event streams skipped because a newer one came before they were sent (a box is state).",
        |s, o| o.value(s.sum(|w| w.sse_coalesced.get())),
    ),
    // Arenas and epochs.
    Family::new(
        Counter,
        "pollbox_arena_resets_total",
        &[],
        "Arena resets (one per worker per epoch).",
        |s, o| o.value(s.sum(|w| w.arena_resets.get())),
    ),
    Family::histogram(
        "pollbox_arena_reset_duration_seconds",
        "Duration of one arena reset.",
        |s, o| o.merged(s, &RESET_BUCKETS, |w| &w.arena_reset),
    ),
    Family::new(
        Gauge,
        "pollbox_arena_bytes",
        &[],
        "Arena capacity held from the allocator, all workers.",
        |s, o| o.value(s.sum(|w| w.arena_capacity.get())),
    ),
    Family::new(
        Counter,
        "pollbox_arena_replacements_total",
        &[],
        "Arena resets that replaced a grown arena to give its memory back.",
        |s, o| o.value(s.sum(|w| w.arena_replaced.get())),
    ),
    Family::new(
        Gauge,
        "pollbox_arena_high_water_bytes",
        &[],
        "Most arena bytes used in one epoch by one worker.",
        |s, o| o.value(s.max(|w| w.arena_high_water.get())),
    ),
    Family::new(
        Counter,
        "pollbox_epoch_overruns_total",
        &[],
        "Ticks that started a whole epoch late.",
        |s, o| o.value(s.sum(|w| w.epoch_overruns.get())),
    ),
    Family::new(
        Gauge,
        "pollbox_epoch_work_max_seconds",
        &[],
        "Longest time one tick's work took (reset, timers, date).",
        |s, o| o.value(s.max(|w| w.epoch_work_max_ns.get()) as f64 / 1e9),
    ),
    Family::histogram(
        "pollbox_tick_duration_seconds",
        "Work of one worker tick: arena reset, timers, expiry step.",
        |s, o| o.merged(s, &TICK_BUCKETS, |w| &w.tick),
    ),
    Family::new(
        Gauge,
        "pollbox_arena_capacity_bytes",
        &["worker"],
        "Arena capacity per worker, after the last reset.",
        |s, o| o.per_worker(s, |_, w| w.arena_capacity.get()),
    ),
    Family::new(
        Gauge,
        "pollbox_arena_used_bytes",
        &["worker"],
        "Arena bytes in use per worker, sampled just before the last reset.",
        |s, o| o.per_worker(s, |_, w| w.arena_used_before_reset.get()),
    ),
    // Workers.
    Family::new(
        Gauge,
        "pollbox_worker_connections",
        &["worker"],
        "Connections open per worker (placed by load when accepted).",
        |s, o| o.per_worker(s, |_, w| w.connections_open.get()),
    ),
    Family::new(
        Gauge,
        "pollbox_worker_busy_ratio",
        &["worker"],
        "Share of the time each worker spent not waiting for events, smoothed over ~8 epochs.",
        |s, o| o.per_worker(s, |i, _| f64::from(s.shared.placement().busy(i)) / 1000.0),
    ),
    // Memory: ours, jemalloc's, the kernel's.
    Family::new(
        Gauge,
        "pollbox_accounted_bytes",
        &["part"],
        "Memory as pollbox accounts it, by part.",
        |s, o| {
            let a = s.accounted();
            o.labelled(&[&"arena"], a.arena);
            o.labelled(&[&"boxes"], a.boxes);
            o.labelled(&[&"buffers"], a.buffers);
            o.labelled(&[&"send_queue"], a.send_queue);
            o.labelled(&[&"runtime"], a.runtime);
            o.labelled(&[&"tombstones"], a.tombstones);
        },
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_allocated_bytes",
        &[],
        "Bytes in live allocations.",
        |s, o| o.value(s.jemalloc().allocated),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_active_bytes",
        &[],
        "Bytes in active pages.",
        |s, o| o.value(s.jemalloc().active),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_resident_bytes",
        &[],
        "Bytes in resident pages jemalloc maps.",
        |s, o| o.value(s.jemalloc().resident),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_mapped_bytes",
        &[],
        "Bytes in active extents mapped.",
        |s, o| o.value(s.jemalloc().mapped),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_retained_bytes",
        &[],
        "Bytes retained (unmapped but reserved).",
        |s, o| o.value(s.jemalloc().retained),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_metadata_bytes",
        &[],
        "Bytes of jemalloc metadata.",
        |s, o| o.value(s.jemalloc().metadata),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_tcache_bytes",
        &[],
        "Freed bytes held in thread caches (counted in allocated).",
        |s, o| o.value(s.jemalloc().tcache),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_dirty_bytes",
        &[],
        "Resident − active − metadata.",
        |s, o| o.value(s.jemalloc().dirty()),
    ),
    Family::new(
        Gauge,
        "pollbox_jemalloc_fragmentation_bytes",
        &[],
        "Active − allocated.",
        |s, o| o.value(s.jemalloc().fragmentation()),
    ),
    Family::new(
        Counter,
        "pollbox_worker_allocated_bytes_total",
        &["worker"],
        "Bytes allocated by each worker thread (jemalloc thread.allocatedp).",
        |s, o| o.per_worker(s, |_, w| w.thread_allocated.get()),
    ),
    Family::new(
        Counter,
        "pollbox_worker_deallocated_bytes_total",
        &["worker"],
        "Bytes freed by each worker thread (jemalloc thread.deallocatedp).",
        |s, o| o.per_worker(s, |_, w| w.thread_deallocated.get()),
    ),
    // Snapshots.
    Family::new(
        Counter,
        "pollbox_snapshots_total",
        &[],
        "Periodic snapshots written.",
        |s, o| o.value(s.shared.snapshots().written()),
    ),
    Family::new(
        Counter,
        "pollbox_snapshot_written_bytes_total",
        &[],
        "Bytes of snapshot files written (bases and deltas).",
        |s, o| o.value(s.shared.snapshots().bytes()),
    ),
    Family::new(
        Counter,
        "pollbox_snapshot_write_seconds_total",
        &[],
        "Time spent writing snapshot files (walk, write, fsync, rename).",
        |s, o| o.value(s.shared.snapshots().write_seconds()),
    ),
    Family::new(
        Counter,
        "pollbox_snapshot_bases_total",
        &[],
        "Snapshot bases written (the first, and every compaction of a chain of deltas).",
        |s, o| o.value(s.shared.snapshots().bases()),
    ),
    Family::new(
        Counter,
        "pollbox_snapshot_failures_total",
        &[],
        "Periodic snapshots that failed.",
        |s, o| o.value(s.shared.snapshots().failed()),
    ),
    // The Kafka log, on a node built from one only.
    Family::new(
        Counter,
        "pollbox_log_records_total",
        &["result"],
        "Records read from the log, by what they did (invalid: skipped, logged once).",
        |s, o| {
            with_log(s, |log| {
                for r in RecordResult::ALL {
                    o.labelled(&[&r.label()], log.records(r));
                }
            })
        },
    )
    .only(has_log),
    Family::new(
        Counter,
        "pollbox_log_consume_errors_total",
        &[],
        "Errors the Kafka client reported while consuming (it retries).",
        |s, o| with_log(s, |log| o.value(log.consume_errors())),
    )
    .only(has_log),
    Family::new(
        Counter,
        "pollbox_log_client_errors_total",
        &["kind"],
        "Errors the log's Kafka clients reported, by kind (a fatal one leaves the node unready until it restarts).",
        |s, o| {
            with_log(s, |log| {
                for k in ErrorKind::ALL {
                    o.labelled(&[&k.label()], log.client_errors(k));
                }
            })
        },
    )
    .only(has_log),
    Family::histogram(
        "pollbox_log_ack_seconds",
        "From producing an ingested message to this node applying it (the log's acknowledgement, the fetch, the apply).",
        |s, o| {
            with_log(s, |log| {
                let ack = log.ack_histogram();
                let counts: Vec<u64> = ack.counts().collect();
                o.histogram(&ACK_BUCKETS, &counts, ack.sum_ns());
            })
        },
    )
    .only(has_log),
    Family::new(
        Counter,
        "pollbox_log_produce_errors_total",
        &[],
        "Records produced by this node that the log did not take or acknowledge in time.",
        |s, o| with_log(s, |log| o.value(log.produce_errors())),
    )
    .only(has_log),
    Family::new(
        Gauge,
        "pollbox_log_connected",
        &[],
        "1 when the last exchange with the log worked.",
        |s, o| with_log(s, |log| o.value(u8::from(log.connected()))),
    )
    .only(has_log),
    Family::new(
        Gauge,
        "pollbox_log_caught_up",
        &[],
        "1 once the node applied the log up to its end at start (/readyz waits for it).",
        |s, o| with_log(s, |log| o.value(u8::from(log.caught_up()))),
    )
    .only(has_log),
    Family::new(
        Gauge,
        "pollbox_log_halted",
        &[],
        "1 when the node stopped applying the log for good (the topic's partition count changed): unready, ingest refused.",
        |s, o| with_log(s, |log| o.value(u8::from(log.halted()))),
    )
    .only(has_log),
    Family::new(
        Gauge,
        "pollbox_log_unsafe_topic",
        &[],
        "1 when the topic can lose acknowledged records and log.allow_unsafe_topic let it through.",
        |s, o| with_log(s, |log| o.value(u8::from(log.unsafe_topic()))),
    )
    .only(has_log),
    Family::new(
        Gauge,
        "pollbox_log_lag_records",
        &["partition"],
        "Records in the log this node has not applied yet, by partition.",
        |s, o| {
            with_partitions(s, |p, st| o.labelled(&[&p], st.lag()))
        },
    )
    .only(has_partitions),
    Family::new(
        Gauge,
        "pollbox_log_next_offset",
        &["partition"],
        "The next offset this node applies, by partition.",
        |s, o| with_partitions(s, |p, st| o.labelled(&[&p], st.next())),
    )
    .only(has_partitions),
    // The write-ahead file, on a node with one only.
    Family::new(
        Counter,
        "pollbox_wal_syncs_total",
        &[],
        "Syncs (fdatasync) of the write-ahead file; each covers every record written since the one before (group commit).",
        |s, o| with_wal(s, |w| o.value(w.syncs.load(Relaxed))),
    )
    .only(has_wal),
    Family::histogram(
        "pollbox_wal_sync_seconds",
        "How long each sync of the write-ahead file took.",
        |s, o| {
            with_wal(s, |w| {
                let counts: Vec<u64> = w.sync_seconds.counts().collect();
                o.histogram(&SYNC_BUCKETS, &counts, w.sync_seconds.sum_ns());
            })
        },
    )
    .only(has_wal),
    Family::new(
        Counter,
        "pollbox_wal_bytes_total",
        &[],
        "Bytes written to the write-ahead file and synced.",
        |s, o| with_wal(s, |w| o.value(w.bytes.load(Relaxed))),
    )
    .only(has_wal),
    Family::new(
        Counter,
        "pollbox_wal_records_total",
        &[],
        "Records (messages and deletes) written to the write-ahead file and synced.",
        |s, o| with_wal(s, |w| o.value(w.records.load(Relaxed))),
    )
    .only(has_wal),
    Family::new(
        Counter,
        "pollbox_wal_errors_total",
        &["kind"],
        "Faults of the write-ahead file: disk_full (ingest answered 503 until space returns), sync (a failed fdatasync: unready until restarted), write (another failed write).",
        |s, o| {
            with_wal(s, |w| {
                for (kind, n) in WAL_FAULTS.iter().zip(&w.errors) {
                    o.labelled(&[kind], n.load(Relaxed));
                }
            })
        },
    )
    .only(has_wal),
    Family::new(
        Gauge,
        "pollbox_wal_segments",
        &[],
        "Segments of the write-ahead file on disk (those a snapshot covers are deleted).",
        |s, o| with_wal(s, |w| o.value(w.on_disk().0)),
    )
    .only(has_wal),
    Family::new(
        Gauge,
        "pollbox_wal_disk_bytes",
        &[],
        "Bytes of the write-ahead file's segments on disk.",
        |s, o| with_wal(s, |w| o.value(w.on_disk().1)),
    )
    .only(has_wal),
    Family::new(
        Gauge,
        "pollbox_wal_failed",
        &[],
        "1 when the write-ahead file stopped taking records (a failed sync): unready, ingest refused.",
        |s, o| with_wal(s, |w| o.value(u8::from(w.failed().is_some()))),
    )
    .only(has_wal),
    // The process, under the names Prometheus client libraries use.
    Family::new(
        Gauge,
        "process_resident_memory_bytes",
        &[],
        "Resident memory size in bytes.",
        |s, o| o.value(s.process().rss),
    ),
    Family::new(
        Gauge,
        "pollbox_process_resident_file_bytes",
        &[],
        "The part of process_resident_memory_bytes backed by files (the binary, shared libraries): clean pages the kernel may drop and read back.",
        |s, o| o.value(s.process().rss_file),
    ),
    Family::new(
        Counter,
        "process_cpu_seconds_total",
        &[],
        "Total user and system CPU time spent in seconds.",
        |s, o| o.value(s.process().cpu_seconds),
    ),
    Family::new(
        Gauge,
        "process_open_fds",
        &[],
        "Number of open file descriptors.",
        |s, o| o.value(s.process().open_fds),
    ),
    Family::new(
        Gauge,
        "process_start_time_seconds",
        &[],
        "Start time of the process since unix epoch in seconds.",
        |s, o| o.value(s.process().start_time),
    ),
];

/// `pollbox_http_requests_total`: the workers' cells summed, by route then code.
fn requests(s: &Scrape, o: &mut Samples) {
    let mut cells: Vec<(RouteLabel, u16, u64)> = Vec::new();
    for w in s.shared.stats() {
        for (r, c, n) in w.requests() {
            match cells.iter_mut().find(|(r2, c2, _)| *r2 == r && *c2 == c) {
                Some(cell) => cell.2 += n,
                None => cells.push((r, c, n)),
            }
        }
    }
    cells.sort_by_key(|&(r, c, _)| (r as u8, c));
    for (r, c, n) in cells {
        if c == 0 {
            o.labelled(&[&r.name(), &"other"], n);
        } else {
            o.labelled(&[&r.name(), &c], n);
        }
    }
}

fn has_wal(s: &Scrape) -> bool {
    s.shared.wal().is_some()
}

fn with_wal(s: &Scrape, f: impl FnOnce(&Wal)) {
    if let Some(w) = s.shared.wal() {
        f(w);
    }
}

fn has_log(s: &Scrape) -> bool {
    s.shared.log().is_some()
}

/// The partitions are known once the node has asked the broker for them.
fn has_partitions(s: &Scrape) -> bool {
    s.shared.log().is_some_and(|l| l.partitions().is_some())
}

fn with_log(s: &Scrape, f: impl FnOnce(&LogState)) {
    if let Some(log) = s.shared.log() {
        f(log);
    }
}

fn with_partitions(s: &Scrape, mut f: impl FnMut(usize, &crate::log::PartitionState)) {
    with_log(s, |log| {
        for (p, st) in log.partitions().into_iter().flatten().enumerate() {
            f(p, st);
        }
    });
}
