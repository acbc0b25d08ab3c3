//! `/metrics`: Prometheus text exposition 0.0.4 (docs/operations.md#metrics).
//!
//! Everything is summed from the per-worker stats at scrape time; jemalloc's
//! epoch is advanced here, on the scraping thread, and nowhere else.

use crate::alloc_stats;
use crate::stats::{
    IngestResult, Rejected, Removal, RouteLabel, WorkerStats, DURATION_BUCKETS, RESET_BUCKETS,
    TICK_BUCKETS,
};
use crate::Shared;
use pollbox_core::clients::Limit;
use pollbox_core::service::AuthRefused;
use std::io::Write;
use std::sync::atomic::Ordering;

/// Memory as pollbox accounts it, by part.
#[derive(Debug, Default, Clone, Copy)]
pub struct Accounted {
    pub arena: u64,
    pub boxes: u64,
    pub buffers: u64,
    pub send_queue: u64,
    pub runtime: u64,
}

impl Accounted {
    pub fn total(&self) -> u64 {
        self.arena + self.boxes + self.buffers + self.send_queue + self.runtime
    }
}

pub fn accounted(shared: &Shared) -> Accounted {
    let mut a = Accounted {
        boxes: shared.node.boxes.accounted_bytes() as u64,
        runtime: shared
            .runtime_bytes
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
        ..Default::default()
    };
    for s in &shared.stats {
        a.arena += s.arena_capacity.get();
        a.buffers += s.buffer_bytes.get();
        a.send_queue += s.send_queue_bytes.get();
    }
    a
}

fn sum(shared: &Shared, f: impl Fn(&WorkerStats) -> u64) -> u64 {
    shared.stats.iter().map(f).sum()
}

fn header(out: &mut Vec<u8>, name: &str, kind: &str, help: &str) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
}

/// One sample per worker: `name{worker="w"} value`.
fn per_worker<V: std::fmt::Display>(
    out: &mut Vec<u8>,
    shared: &Shared,
    name: &str,
    kind: &str,
    help: &str,
    value: impl Fn(usize, &WorkerStats) -> V,
) {
    header(out, name, kind, help);
    for (w, s) in shared.stats.iter().take(shared.workers).enumerate() {
        let _ = writeln!(out, "{name}{{worker=\"{w}\"}} {}", value(w, s));
    }
}

fn single(out: &mut Vec<u8>, name: &str, kind: &str, help: &str, v: u64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

fn single_f(out: &mut Vec<u8>, name: &str, kind: &str, help: &str, v: f64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

fn histogram(
    out: &mut Vec<u8>,
    name: &str,
    help: &str,
    bounds: &[f64],
    counts: &[u64],
    sum_ns: u64,
) {
    header(out, name, "histogram", help);
    let mut cum = 0;
    for (i, b) in bounds.iter().enumerate() {
        cum += counts[i];
        let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
    }
    cum += counts[bounds.len()];
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
    let _ = writeln!(out, "{name}_sum {}", sum_ns as f64 / 1e9);
    let _ = writeln!(out, "{name}_count {cum}");
}

/// Render every metric into `out`.
pub fn render(shared: &Shared, out: &mut Vec<u8>) {
    // Requests by route and code.
    header(
        out,
        "pollbox_http_requests_total",
        "counter",
        "HTTP requests answered, by route and status code.",
    );
    let mut cells: Vec<(RouteLabel, u16, u64)> = Vec::new();
    for s in &shared.stats {
        for (r, c, n) in s.requests() {
            match cells.iter_mut().find(|(r2, c2, _)| *r2 == r && *c2 == c) {
                Some(cell) => cell.2 += n,
                None => cells.push((r, c, n)),
            }
        }
    }
    cells.sort_by_key(|&(r, c, _)| (r as u8, c));
    for (r, c, n) in cells {
        let code = if c == 0 {
            "other".to_string()
        } else {
            c.to_string()
        };
        let _ = writeln!(
            out,
            "pollbox_http_requests_total{{route=\"{}\",code=\"{code}\"}} {n}",
            r.name()
        );
    }

    let mut counts = vec![0u64; DURATION_BUCKETS.len() + 1];
    let mut sum_ns = 0;
    for s in &shared.stats {
        for (i, c) in s.duration.counts().enumerate() {
            counts[i] += c;
        }
        sum_ns += s.duration.sum_ns();
    }
    histogram(
        out,
        "pollbox_http_request_duration_seconds",
        "Server-side time from the read that completed a request to its response, queued with the other answers to that read.",
        &DURATION_BUCKETS,
        &counts,
        sum_ns,
    );

    header(
        out,
        "pollbox_ingest_messages_total",
        "counter",
        "Ingested messages by result (accepted, or the rejection reason).",
    );
    for result in IngestResult::ALL {
        let n = sum(shared, |s| s.ingested_total(result));
        let label = result.name();
        let _ = writeln!(
            out,
            "pollbox_ingest_messages_total{{result=\"{label}\"}} {n}"
        );
    }

    auth_refused(out, shared);
    auth_reloads(out, shared);
    limit_refused(out, shared);

    single(
        out,
        "pollbox_connections_open",
        "gauge",
        "Connections open now.",
        shared
            .open_connections
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
    );
    single(
        out,
        "pollbox_connections_total",
        "counter",
        "Connections accepted.",
        sum(shared, |s| s.connections_total.get()),
    );
    header(
        out,
        "pollbox_connections_rejected_total",
        "counter",
        "Connections refused, by reason.",
    );
    for why in Rejected::ALL {
        let n = sum(shared, |s| s.rejected_total(why));
        let reason = why.name();
        let _ = writeln!(
            out,
            "pollbox_connections_rejected_total{{reason=\"{reason}\"}} {n}"
        );
    }
    single(
        out,
        "pollbox_bytes_received_total",
        "counter",
        "Bytes read from clients.",
        sum(shared, |s| s.bytes_received.get()),
    );
    single(
        out,
        "pollbox_bytes_sent_total",
        "counter",
        "Bytes written to clients.",
        sum(shared, |s| s.bytes_sent.get()),
    );
    single(
        out,
        "pollbox_boxes",
        "gauge",
        "Boxes in the table.",
        shared.node.boxes.len() as u64,
    );
    single(
        out,
        "pollbox_boxes_expired_total",
        "counter",
        "Boxes removed because they accepted no message for boxes.ttl_s.",
        sum(shared, |s| s.boxes_removed_total(Removal::Expired)),
    );
    single(
        out,
        "pollbox_boxes_deleted_total",
        "counter",
        "Boxes removed by DELETE /v1/boxes/{key}.",
        sum(shared, |s| s.boxes_removed_total(Removal::Deleted)),
    );
    single(
        out,
        "pollbox_io_uring_workers",
        "gauge",
        "Workers writing each loop turn's responses with one io_uring submission (the others write with send).",
        shared.uring_workers.load(Ordering::Relaxed) as u64,
    );
    single(
        out,
        "pollbox_buffered_bytes",
        "gauge",
        "Bytes of all connections' read buffers and send queues (limits.max_buffered_bytes bounds them).",
        sum(shared, |s| s.buffered_bytes.get()),
    );
    single(
        out,
        "pollbox_parked_polls",
        "gauge",
        "Long-polls waiting now.",
        sum(shared, |s| s.parked_polls.get()),
    );
    single(
        out,
        "pollbox_sse_subscribers",
        "gauge",
        "Event streams open now.",
        sum(shared, |s| s.sse_subscribers.get()),
    );
    single(
        out,
        "pollbox_sse_events_total",
        "counter",
        "Events sent on event streams (heartbeats and deletions not counted).",
        sum(shared, |s| s.sse_events.get()),
    );
    single(
        out,
        "pollbox_sse_coalesced_total",
        "counter",
        "Box versions event streams skipped because a newer one came before they were sent (a box is state).",
        sum(shared, |s| s.sse_coalesced.get()),
    );

    // Arenas and epochs.
    single(
        out,
        "pollbox_arena_resets_total",
        "counter",
        "Arena resets (one per worker per epoch).",
        sum(shared, |s| s.arena_resets.get()),
    );
    let mut rcounts = vec![0u64; RESET_BUCKETS.len() + 1];
    let mut rsum = 0;
    for s in &shared.stats {
        for (i, c) in s.arena_reset.counts().enumerate() {
            rcounts[i] += c;
        }
        rsum += s.arena_reset.sum_ns();
    }
    histogram(
        out,
        "pollbox_arena_reset_duration_seconds",
        "Duration of one arena reset.",
        &RESET_BUCKETS,
        &rcounts,
        rsum,
    );
    single(
        out,
        "pollbox_arena_bytes",
        "gauge",
        "Arena capacity held from the allocator, all workers.",
        sum(shared, |s| s.arena_capacity.get()),
    );
    single(
        out,
        "pollbox_arena_replacements_total",
        "counter",
        "Arena resets that replaced a grown arena to give its memory back.",
        sum(shared, |s| s.arena_replaced.get()),
    );
    single(
        out,
        "pollbox_arena_high_water_bytes",
        "gauge",
        "Most arena bytes used in one epoch by one worker.",
        shared
            .stats
            .iter()
            .map(|s| s.arena_high_water.get())
            .max()
            .unwrap_or(0),
    );
    single(
        out,
        "pollbox_epoch_overruns_total",
        "counter",
        "Ticks that started a whole epoch late.",
        sum(shared, |s| s.epoch_overruns.get()),
    );
    single_f(
        out,
        "pollbox_epoch_work_max_seconds",
        "gauge",
        "Longest time one tick's work took (reset, timers, date).",
        shared
            .stats
            .iter()
            .map(|s| s.epoch_work_max_ns.get())
            .max()
            .unwrap_or(0) as f64
            / 1e9,
    );
    let mut tcounts = vec![0u64; TICK_BUCKETS.len() + 1];
    let mut tsum = 0;
    for s in &shared.stats {
        for (i, c) in s.tick.counts().enumerate() {
            tcounts[i] += c;
        }
        tsum += s.tick.sum_ns();
    }
    histogram(
        out,
        "pollbox_tick_duration_seconds",
        "Work of one worker tick: arena reset, timers, expiry step.",
        &TICK_BUCKETS,
        &tcounts,
        tsum,
    );
    per_worker(
        out,
        shared,
        "pollbox_arena_capacity_bytes",
        "gauge",
        "Arena capacity per worker, after the last reset.",
        |_, s| s.arena_capacity.get(),
    );
    per_worker(
        out,
        shared,
        "pollbox_arena_used_bytes",
        "gauge",
        "Arena bytes in use per worker, sampled just before the last reset.",
        |_, s| s.arena_used_before_reset.get(),
    );

    per_worker(
        out,
        shared,
        "pollbox_worker_connections",
        "gauge",
        "Connections open per worker (placed by load when accepted).",
        |_, s| s.connections_open.get(),
    );
    per_worker(
        out,
        shared,
        "pollbox_worker_busy_ratio",
        "gauge",
        "Share of the time each worker spent not waiting for events, smoothed over ~8 epochs.",
        |w, _| f64::from(shared.placement.busy(w)) / 1000.0,
    );

    // Memory: ours, jemalloc's, the kernel's.
    let acc = accounted(shared);
    header(
        out,
        "pollbox_accounted_bytes",
        "gauge",
        "Memory as pollbox accounts it, by part.",
    );
    for (part, v) in [
        ("arena", acc.arena),
        ("boxes", acc.boxes),
        ("buffers", acc.buffers),
        ("send_queue", acc.send_queue),
        ("runtime", acc.runtime),
    ] {
        let _ = writeln!(out, "pollbox_accounted_bytes{{part=\"{part}\"}} {v}");
    }
    let je = alloc_stats::read_global();
    for (name, v, help) in [
        ("allocated", je.allocated, "Bytes in live allocations."),
        ("active", je.active, "Bytes in active pages."),
        (
            "resident",
            je.resident,
            "Bytes in resident pages jemalloc maps.",
        ),
        ("mapped", je.mapped, "Bytes in active extents mapped."),
        (
            "retained",
            je.retained,
            "Bytes retained (unmapped but reserved).",
        ),
        ("metadata", je.metadata, "Bytes of jemalloc metadata."),
        (
            "tcache",
            je.tcache,
            "Freed bytes held in thread caches (counted in allocated).",
        ),
        ("dirty", je.dirty(), "Resident − active − metadata."),
        ("fragmentation", je.fragmentation(), "Active − allocated."),
    ] {
        single(
            out,
            &format!("pollbox_jemalloc_{name}_bytes"),
            "gauge",
            help,
            v,
        );
    }
    per_worker(
        out,
        shared,
        "pollbox_worker_allocated_bytes_total",
        "counter",
        "Bytes allocated by each worker thread (jemalloc thread.allocatedp).",
        |_, s| s.thread_allocated.get(),
    );
    per_worker(
        out,
        shared,
        "pollbox_worker_deallocated_bytes_total",
        "counter",
        "Bytes freed by each worker thread (jemalloc thread.deallocatedp).",
        |_, s| s.thread_deallocated.get(),
    );
    single(
        out,
        "pollbox_snapshots_total",
        "counter",
        "Periodic snapshots written.",
        shared
            .snapshots_ok
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
    );
    single(
        out,
        "pollbox_snapshot_written_bytes_total",
        "counter",
        "Bytes of snapshot files written (bases and deltas).",
        shared
            .snapshot_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    single_f(
        out,
        "pollbox_snapshot_write_seconds_total",
        "counter",
        "Time spent writing snapshot files (walk, write, fsync, rename).",
        shared
            .snapshot_write_us
            .load(std::sync::atomic::Ordering::Relaxed) as f64
            / 1e6,
    );
    single(
        out,
        "pollbox_snapshot_bases_total",
        "counter",
        "Snapshot bases written (the first, and every compaction of a chain of deltas).",
        shared
            .snapshot_bases
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
    );
    single(
        out,
        "pollbox_snapshot_failures_total",
        "counter",
        "Periodic snapshots that failed.",
        shared
            .snapshots_failed
            .load(std::sync::atomic::Ordering::Relaxed) as u64,
    );
    if let Some(log) = &shared.log {
        render_log(out, log);
    }

    let p = process_stats();
    single(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        p.rss,
    );
    single_f(
        out,
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        p.cpu_seconds,
    );
    single(
        out,
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        p.open_fds,
    );
    single_f(
        out,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        p.start_time,
    );
}

/// Figures about this process from `/proc`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessStats {
    pub rss: u64,
    pub cpu_seconds: f64,
    pub open_fds: u64,
    pub start_time: f64,
}

/// Open file descriptors. Since Linux 6.2 `stat` on `/proc/self/fd` says how
/// many there are, at a cost that does not grow with them; before, the entries
/// are counted (a scrape then costs more with more connections).
fn open_fds() -> u64 {
    match std::fs::metadata("/proc/self/fd") {
        Ok(m) if m.len() > 0 => m.len(),
        _ => std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64),
    }
}

pub fn process_stats() -> ProcessStats {
    let mut p = ProcessStats::default();
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    // SAFETY: as above.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    if let Ok(statm) = std::fs::read_to_string("/proc/self/statm") {
        if let Some(rss) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u64>().ok())
        {
            p.rss = rss * page;
        }
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        // Fields after the parenthesised command name; utime is field 14, stime 15, starttime 22.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            p.cpu_seconds = (num(11) + num(12)) as f64 / ticks;
            let boot = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0);
            p.start_time = boot as f64 + num(19) as f64 / ticks;
        }
    }
    p.open_fds = open_fds();
    p
}

/// The log's metrics (a node built from a Kafka log only).
fn render_log(out: &mut Vec<u8>, log: &crate::log::LogState) {
    header(
        out,
        "pollbox_log_records_total",
        "counter",
        "Records read from the log, by what they did (invalid: skipped, logged once).",
    );
    for (result, n) in crate::log::RESULTS.iter().zip(&log.records) {
        let _ = writeln!(
            out,
            "pollbox_log_records_total{{result=\"{result}\"}} {}",
            n.load(Ordering::Relaxed)
        );
    }
    single(
        out,
        "pollbox_log_consume_errors_total",
        "counter",
        "Errors the Kafka client reported while consuming (it retries).",
        log.consume_errors.load(Ordering::Relaxed),
    );
    let counts: Vec<u64> = log.ack.counts().collect();
    histogram(
        out,
        "pollbox_log_ack_seconds",
        "From producing an ingested message to this node applying it (the log's acknowledgement, the fetch, the apply).",
        &crate::log::ACK_BUCKETS,
        &counts,
        log.ack.sum_ns(),
    );
    single(
        out,
        "pollbox_log_produce_errors_total",
        "counter",
        "Records produced by this node that the log did not take or acknowledge in time.",
        log.produce_errors.load(Ordering::Relaxed),
    );
    single(
        out,
        "pollbox_log_connected",
        "gauge",
        "1 when the last exchange with the log worked.",
        log.connected.load(Ordering::Relaxed) as u64,
    );
    single(
        out,
        "pollbox_log_caught_up",
        "gauge",
        "1 once the node applied the log up to its end at start (/readyz waits for it).",
        log.caught_up() as u64,
    );
    single(
        out,
        "pollbox_log_halted",
        "gauge",
        "1 when the node stopped applying the log for good (the topic's partition count changed): unready, ingest refused.",
        log.halted() as u64,
    );
    single(
        out,
        "pollbox_log_unsafe_topic",
        "gauge",
        "1 when the topic can lose acknowledged records and log.allow_unsafe_topic let it through.",
        log.unsafe_topic() as u64,
    );
    if let Some(parts) = log.partitions() {
        header(
            out,
            "pollbox_log_lag_records",
            "gauge",
            "Records in the log this node has not applied yet, by partition.",
        );
        for (p, st) in parts.iter().enumerate() {
            let lag = (st.end.load(Ordering::Relaxed) - st.next.load(Ordering::Relaxed)).max(0);
            let _ = writeln!(out, "pollbox_log_lag_records{{partition=\"{p}\"}} {lag}");
        }
        header(
            out,
            "pollbox_log_next_offset",
            "gauge",
            "The next offset this node applies, by partition.",
        );
        for (p, st) in parts.iter().enumerate() {
            let _ = writeln!(
                out,
                "pollbox_log_next_offset{{partition=\"{p}\"}} {}",
                st.next.load(Ordering::Relaxed)
            );
        }
    }
}

/// `pollbox_auth_reloads_total{result}`: reads of the key set and static
/// token files while serving (crate::auth_files), `ok` or `error` (the keys
/// and tokens in use kept).
fn auth_reloads(out: &mut Vec<u8>, shared: &Shared) {
    header(
        out,
        "pollbox_auth_reloads_total",
        "counter",
        "Reads of the key set and static token files while serving (SIGHUP, a file changed), by result; on an error the keys in use are kept.",
    );
    let files = &shared.auth_files;
    for (result, n) in [
        ("ok", files.reloads_ok.load(Ordering::Relaxed)),
        ("error", files.reloads_failed.load(Ordering::Relaxed)),
    ] {
        let _ = writeln!(out, "pollbox_auth_reloads_total{{result=\"{result}\"}} {n}");
    }
}

/// `pollbox_auth_refused_total{reason}`: requests (and batch messages)
/// refused by access control (docs/private-boxes.md), every reason listed.
fn auth_refused(out: &mut Vec<u8>, shared: &Shared) {
    header(
        out,
        "pollbox_auth_refused_total",
        "counter",
        "Requests (and batch messages, and held requests whose token ended) refused by access control, by reason.",
    );
    for why in AuthRefused::ALL {
        let n = sum(shared, |s| s.auth_refused[why.index()].get());
        let label = why.label();
        let _ = writeln!(out, "pollbox_auth_refused_total{{reason=\"{label}\"}} {n}");
    }
}

/// `pollbox_limit_refused_total{limit}`: requests and connections refused by
/// a per-client limit (docs/private-boxes.md#per-client-limits), every limit
/// listed; and `pollbox_limit_clients`, the clients the limits remember.
fn limit_refused(out: &mut Vec<u8>, shared: &Shared) {
    header(
        out,
        "pollbox_limit_refused_total",
        "counter",
        "Requests and connections refused by a per-client limit (429), by limit.",
    );
    for limit in Limit::ALL {
        let n = sum(shared, |s| s.limit_refused[limit.index()].get());
        let label = limit.label();
        let _ = writeln!(out, "pollbox_limit_refused_total{{limit=\"{label}\"}} {n}");
    }
    single(
        out,
        "pollbox_limit_clients",
        "gauge",
        "Clients the per-client limits remember (with a connection, a held request or a bucket not yet refilled).",
        shared.node.clients.len() as u64,
    );
}
