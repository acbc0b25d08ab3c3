//! The run's result: [`Report`], the final table ([`print_report`]) and the files it can
//! be written to (`--json`, `--hgrm`, `--plot`).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::hgrm::write_hgrm;
use crate::mix::Op;
use crate::plot::write_plot;
use crate::stats::{latency_histogram, ErrorKind, OpStats, Stats, STATUS_SLOTS};
use crate::LoadError;

mod presence;
use presence::print_presence;
pub use presence::PresenceReport;

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |ns: u64| ns as f64 / 1e6;
        if h.is_empty() {
            return Percentiles {
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
                mean: 0.0,
            };
        }
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p90: ms(h.value_at_quantile(0.90)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            mean: h.mean() / 1e6,
        }
    }
}

/// One operation's results.
#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    /// `poll`, `ingest`, `batch`, `longpoll`, `poll_many` or `longpoll_many`.
    pub op: String,
    /// Answered requests of the measured window (whatever their status).
    pub requests: u64,
    /// Requests answered before the window closed, per second of the window.
    pub rate: f64,
    /// Messages the server accepted (ingest: one per 200; batch: its `accepted`).
    pub messages_accepted: u64,
    /// Messages accepted in answers that came before the window closed, per second of
    /// it: for `batch`, `batch_size` times its request rate when every message is
    /// accepted.
    pub messages_per_s: f64,
    /// 404 answers to polls and long-polls: the key has no box yet. For `poll_many` and
    /// `longpoll_many`, the boxes (not requests) answered `null`, for the same reason.
    /// Expected, not errors.
    pub not_found: u64,
    /// 304 answers to long-polls (nothing newer within `wait_ms`), and to `poll_many`
    /// (the boxes did not move since the ETag sent). Expected.
    pub not_modified: u64,
    /// Answered requests of the warm-up (not in any other count).
    pub warmup_requests: u64,
    /// Sent requests never answered (connection lost, or still open at the end); the
    /// server may or may not have counted them.
    pub unanswered: u64,
    /// Failed requests of the measured window, all kinds.
    pub errors: u64,
    /// Answers by status code.
    pub status: BTreeMap<String, u64>,
    pub latency_ms: Percentiles,
}

/// The `sse` operation: event streams held open while the mix ran.
#[derive(Debug, Clone, Serialize)]
pub struct SseReport {
    pub subscribers: usize,
    /// Events received in the measured window, and per second of it.
    pub events: u64,
    pub events_per_s: f64,
    /// `event: deleted` received.
    pub deleted: u64,
    /// Streams refused or broken.
    pub errors: u64,
    /// Events whose publish time was not known (a newer ingest overtook them).
    pub unmatched: u64,
    /// Publish (the ingest's send) to receive, from each event's version.
    pub latency_ms: Percentiles,
}

impl SseReport {
    pub(crate) fn of(s: &crate::sse::SseStats, window: std::time::Duration) -> SseReport {
        SseReport {
            subscribers: s.subscribers,
            events: s.events,
            events_per_s: s.events as f64 / window.as_secs_f64().max(1e-9),
            deleted: s.deleted,
            errors: s.errors,
            unmatched: s.unmatched,
            latency_ms: Percentiles::of(&s.latency),
        }
    }
}

/// The `prefix_streams` operation: event streams of prefixes held open while the mix
/// ran.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixStreamReport {
    pub streams: usize,
    /// `--prefix` (or the default it stood for), and the distinct prefixes it gave.
    pub prefix: String,
    pub prefixes: usize,
    /// Box events after each stream's listing, received in the measured window, and
    /// per second of it.
    pub events: u64,
    pub events_per_s: f64,
    /// Box events of the listings (before `event: synced`), all of the run.
    pub listed: u64,
    /// `event: synced` received (one a stream, more after resets).
    pub synced: u64,
    /// `event: reset` received.
    pub resets: u64,
    /// `event: deleted` received.
    pub deleted: u64,
    /// Streams refused (e.g. 503 past `limits.max_prefix_streams`) or broken.
    pub errors: u64,
    /// Events whose publish time was not known (a newer ingest overtook them, or the
    /// box is not one of this run's keys).
    pub unmatched: u64,
    /// Publish (the ingest's send) to receive, from each event's key and version.
    pub latency_ms: Percentiles,
}

impl PrefixStreamReport {
    pub(crate) fn of(
        s: &crate::sse::SseStats,
        template: &crate::rooms::PrefixTemplate,
        window: std::time::Duration,
    ) -> PrefixStreamReport {
        PrefixStreamReport {
            streams: s.subscribers,
            prefix: template.to_string(),
            prefixes: template.distinct(s.subscribers),
            events: s.events,
            events_per_s: s.events as f64 / window.as_secs_f64().max(1e-9),
            listed: s.listed,
            synced: s.synced,
            resets: s.resets,
            deleted: s.deleted,
            errors: s.errors,
            unmatched: s.unmatched,
            latency_ms: Percentiles::of(&s.latency),
        }
    }
}

/// Everything a run measured. `--json` writes exactly this.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub url: String,
    /// `open-loop` (with `--rate`) or `closed-loop`.
    pub mode: String,
    pub connections: usize,
    pub threads: usize,
    pub pipeline: usize,
    pub mix: String,
    pub keys: u32,
    pub key_dist: String,
    /// Size of each ingested message.
    pub message_bytes: usize,
    pub batch_size: usize,
    /// `--keys-per-request`, when the mix has `poll_many` or `longpoll_many`.
    pub keys_per_request: Option<usize>,
    /// Length of the measured window, seconds.
    pub duration_s: f64,
    pub warmup_s: f64,
    /// `--rate`, requests per second; none for closed-loop.
    pub offered_rate: Option<f64>,
    /// Requests the open-loop schedule put in the measured window.
    pub scheduled_requests: Option<u64>,
    /// Requests answered before the measured window closed, per second of it.
    pub achieved_rate: f64,
    /// Messages accepted (ingest and batch together) in answers that came before the
    /// window closed, per second of it.
    pub messages_per_s: f64,
    /// Answered requests of the measured window, all operations (including those
    /// answered after it closed, while draining).
    pub requests: u64,
    /// Failed requests (and failed reconnects) of the measured window.
    pub errors_total: u64,
    /// `errors_total / (requests + unanswered requests + failed reconnects)`, all of
    /// the measured window.
    pub error_rate: f64,
    pub max_error_rate: f64,
    /// Requests sent to pre-seed boxes (`--preseed`), before the run.
    pub preseed_requests: u64,
    /// All operations together.
    pub latency_ms: Percentiles,
    /// Open-loop: how late the generator itself woke up to send a request due on an
    /// idle connection. Latencies include it; if it is not far below them, the
    /// generator, not the server, is the bottleneck.
    pub send_lateness_ms: Option<Percentiles>,
    /// Per operation, in mix order.
    pub ops: Vec<OpReport>,
    /// The `sse` operation (`--sse N`), when asked for.
    pub sse: Option<SseReport>,
    /// The `prefix_streams` operation (`--prefix-streams N`), when asked for.
    pub prefix_streams: Option<PrefixStreamReport>,
    /// The presence mix (`--presence-*`), when asked for.
    pub presence: Option<PresenceReport>,
    /// Answers by status code, all operations.
    pub status: BTreeMap<String, u64>,
    /// Errors by kind: connect, io, closed, protocol, status, payload, version,
    /// rejected, timeout.
    pub errors: BTreeMap<String, u64>,
    /// The latency histogram of all operations itself, as `[value_ns, count]` pairs of
    /// its non-empty buckets (each value the highest of its bucket, 3 significant
    /// digits): runs with the same settings can be merged by adding counts, so a
    /// percentile over many short interleaved runs comes from all their samples.
    pub latency_buckets_ns: Vec<[u64; 2]>,
    /// Latency histograms (ns), all operations and then per operation in mix order.
    #[serde(skip)]
    histograms: Histograms,
}

#[derive(Debug, Clone)]
struct Histograms {
    all: Histogram<u64>,
    ops: Vec<(Op, Histogram<u64>)>,
}

/// What describes the run besides its counts.
pub(crate) struct RunShape {
    pub url: String,
    pub open_loop_rate: Option<f64>,
    pub connections: usize,
    pub threads: usize,
    pub pipeline: usize,
    pub mix: crate::mix::Mix,
    pub keys: u32,
    pub key_dist: String,
    pub message_bytes: usize,
    pub batch_size: usize,
    pub keys_per_request: usize,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub max_error_rate: f64,
    pub preseed_requests: u64,
}

impl Report {
    pub(crate) fn build(shape: RunShape, stats: &Stats) -> Report {
        let mut all = latency_histogram();
        let mut ops = Vec::new();
        let mut histograms = Vec::new();
        let mut status_all = vec![0u64; STATUS_SLOTS];
        let mut errors_by_kind = stats.connection_errors;
        let mut unanswered_in_window = 0u64;
        let duration = shape.duration_s.max(f64::MIN_POSITIVE);
        for &(op, _) in shape.mix.entries() {
            let s: &OpStats = &stats.ops[op.index()];
            let _ = all.add(&s.latency);
            for (a, b) in status_all.iter_mut().zip(&s.status) {
                *a += b;
            }
            for (a, b) in errors_by_kind.iter_mut().zip(s.errors) {
                *a += b;
            }
            // Unanswered requests of the window are the ones counted as lost errors.
            unanswered_in_window += s.errors[ErrorKind::Closed as usize]
                + s.errors[ErrorKind::Io as usize]
                + s.errors[ErrorKind::Timeout as usize]
                + s.errors[ErrorKind::Connect as usize]
                + s.errors[ErrorKind::Protocol as usize];
            ops.push(OpReport {
                op: op.name().to_string(),
                requests: s.requests,
                rate: s.answered_in_window as f64 / duration,
                messages_accepted: s.accepted,
                messages_per_s: s.accepted_in_window as f64 / duration,
                not_found: s.not_found,
                not_modified: s.not_modified,
                warmup_requests: s.warmup,
                unanswered: s.unanswered,
                errors: s.error_total(),
                status: status_map(&s.status),
                latency_ms: Percentiles::of(&s.latency),
            });
            histograms.push((op, s.latency.clone()));
        }
        let requests: u64 = ops.iter().map(|o| o.requests).sum();
        let answered_in_window: u64 = shape
            .mix
            .entries()
            .iter()
            .map(|&(op, _)| stats.ops[op.index()].answered_in_window)
            .sum();
        let messages_in_window: u64 = shape
            .mix
            .entries()
            .iter()
            .map(|&(op, _)| stats.ops[op.index()].accepted_in_window)
            .sum();
        let errors_total: u64 = errors_by_kind.iter().sum();
        // A failed reconnect is an attempt that failed too, so the rate stays within 1.
        let attempted =
            requests + unanswered_in_window + stats.connection_errors.iter().sum::<u64>();
        let error_rate = if attempted == 0 {
            if errors_total > 0 {
                1.0
            } else {
                0.0
            }
        } else {
            errors_total as f64 / attempted as f64
        };
        let errors = ErrorKind::ALL
            .iter()
            .filter(|k| errors_by_kind[**k as usize] > 0)
            .map(|k| (k.name().to_string(), errors_by_kind[*k as usize]))
            .collect();
        Report {
            url: shape.url,
            mode: if shape.open_loop_rate.is_some() {
                "open-loop"
            } else {
                "closed-loop"
            }
            .to_string(),
            connections: shape.connections,
            threads: shape.threads,
            pipeline: shape.pipeline,
            mix: shape.mix.to_string(),
            keys: shape.keys,
            key_dist: shape.key_dist,
            message_bytes: shape.message_bytes,
            batch_size: shape.batch_size,
            keys_per_request: shape
                .mix
                .entries()
                .iter()
                .any(|(op, _)| op.is_many())
                .then_some(shape.keys_per_request),
            duration_s: shape.duration_s,
            warmup_s: shape.warmup_s,
            offered_rate: shape.open_loop_rate,
            scheduled_requests: shape.open_loop_rate.map(|_| stats.scheduled),
            achieved_rate: answered_in_window as f64 / duration,
            messages_per_s: messages_in_window as f64 / duration,
            requests,
            errors_total,
            error_rate,
            max_error_rate: shape.max_error_rate,
            preseed_requests: shape.preseed_requests,
            latency_ms: Percentiles::of(&all),
            send_lateness_ms: shape
                .open_loop_rate
                .map(|_| Percentiles::of(&stats.wake_lateness)),
            ops,
            sse: None,
            prefix_streams: None,
            presence: None,
            status: status_map(&status_all),
            errors,
            latency_buckets_ns: buckets(&all),
            histograms: Histograms {
                all,
                ops: histograms,
            },
        }
    }

    /// Failed requests over attempted requests of the measured window.
    pub fn error_rate(&self) -> f64 {
        self.error_rate
    }

    /// Whether the error rate is within `--max-error-rate`.
    pub fn passed(&self) -> bool {
        self.error_rate <= self.max_error_rate
    }

    /// Answered requests of the measured window, all operations.
    pub fn total_requests(&self) -> u64 {
        self.requests
    }

    /// Answered requests of the measured window for operation `op` (`poll`, `ingest`,
    /// `batch`, `longpoll`, `poll_many`, `longpoll_many`); 0 for an operation not in the
    /// mix.
    pub fn count(&self, op: &str) -> u64 {
        self.op(op).map_or(0, |o| o.requests)
    }

    /// The results of operation `op`, if it was in the mix.
    pub fn op(&self, op: &str) -> Option<&OpReport> {
        self.ops.iter().find(|o| o.op == op)
    }

    /// Latencies (ns) of every operation together.
    pub fn latency_histogram(&self) -> &Histogram<u64> {
        &self.histograms.all
    }

    /// Latencies (ns) of operation `op`.
    pub fn op_latency_histogram(&self, op: &str) -> Option<&Histogram<u64>> {
        self.histograms
            .ops
            .iter()
            .find(|(o, _)| o.name() == op)
            .map(|(_, h)| h)
    }

    /// Writes the report as pretty JSON.
    pub fn write_json(&self, path: &Path) -> Result<(), LoadError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| output_error(path, io::Error::other(e)))?;
        std::fs::write(path, text + "\n").map_err(|e| output_error(path, e))
    }

    /// Writes the percentile spectrum of all operations to `path` and, when the mix has
    /// more than one operation, of each to `<stem>.<op>.hgrm` beside it. Returns the
    /// files written.
    pub fn write_hgrm(&self, path: &Path) -> Result<Vec<PathBuf>, LoadError> {
        let mut written = vec![path.to_path_buf()];
        write_hgrm_file(path, &self.histograms.all)?;
        if self.histograms.ops.len() > 1 {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "latency".to_string());
            for (op, h) in &self.histograms.ops {
                let op_path = path.with_file_name(format!("{stem}.{}.hgrm", op.name()));
                write_hgrm_file(&op_path, h)?;
                written.push(op_path);
            }
        }
        Ok(written)
    }

    /// Draws latency by percentile, one line per operation, to an SVG.
    pub fn write_plot(&self, path: &Path) -> Result<(), LoadError> {
        let series: Vec<(&str, &Histogram<u64>)> = self
            .histograms
            .ops
            .iter()
            .map(|(op, h)| (op.name(), h))
            .collect();
        write_plot(path, &self.title(), &series)
            .map_err(|e| output_error(path, io::Error::other(e)))
    }

    /// One line saying what was run and how fast.
    pub fn title(&self) -> String {
        match self.offered_rate {
            Some(rate) => format!(
                "pollbox load, open-loop: offered {rate:.0} req/s, achieved {:.0} req/s ({} conns, {})",
                self.achieved_rate, self.connections, self.mix
            ),
            None => format!(
                "pollbox load, closed-loop: achieved {:.0} req/s ({} conns, pipeline {}, {})",
                self.achieved_rate, self.connections, self.pipeline, self.mix
            ),
        }
    }
}

/// The non-empty buckets of `h` as `[highest value of the bucket, count]`.
fn buckets(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded()
        .map(|v| {
            [
                h.highest_equivalent(v.value_iterated_to()),
                v.count_at_value(),
            ]
        })
        .collect()
}

fn write_hgrm_file(path: &Path, h: &Histogram<u64>) -> Result<(), LoadError> {
    let mut out = Vec::new();
    write_hgrm(h, &mut out).map_err(|e| output_error(path, e))?;
    std::fs::write(path, out).map_err(|e| output_error(path, e))
}

fn output_error(path: &Path, source: io::Error) -> LoadError {
    LoadError::Output {
        path: path.to_path_buf(),
        source,
    }
}

fn status_map(slots: &[u64]) -> BTreeMap<String, u64> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(code, &n)| {
            let name = if code == 0 {
                "other".to_string()
            } else {
                code.to_string()
            };
            (name, n)
        })
        .collect()
}

/// Prints the final table.
pub fn print_report(report: &Report, out: &mut impl Write) -> io::Result<()> {
    print_setup(report, out)?;
    writeln!(out)?;
    print_latency_table(report, out)?;
    if let Some(p) = &report.presence {
        print_presence(p, out)?;
    }
    writeln!(out)?;
    print_rates(report, out)?;
    print_outcomes(report, out)
}

/// What ran: the target, connections, mode, duration, mix and messages.
fn print_setup(report: &Report, out: &mut impl Write) -> io::Result<()> {
    let mode = match report.offered_rate {
        Some(rate) => format!("open-loop at {rate} req/s"),
        None => "closed-loop".to_string(),
    };
    writeln!(
        out,
        "pollbox load {}: {} connections, {} thread{}, pipeline {}, {mode}, {:.1} s{}",
        report.url,
        report.connections,
        report.threads,
        if report.threads == 1 { "" } else { "s" },
        report.pipeline,
        report.duration_s,
        if report.warmup_s > 0.0 {
            format!(" after {:.1} s warm-up", report.warmup_s)
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "mix {}, {} keys {}, messages of {} bytes{}",
        report.mix,
        report.keys,
        report.key_dist,
        report.message_bytes,
        if report.ops.iter().any(|o| o.op == "batch") {
            format!(", batches of {}", report.batch_size)
        } else {
            String::new()
        }
    )?;
    if let Some(k) = report.keys_per_request {
        writeln!(out, "{k} keys per poll_many/longpoll_many request")?;
    }
    Ok(())
}

/// A row an operation (then `all`, `sse` and `prefix` with streams): requests, rate,
/// latency percentiles and errors.
fn print_latency_table(report: &Report, out: &mut impl Write) -> io::Result<()> {
    // As wide as the longest operation's name (`longpoll_many`), 9 at least.
    let w = report
        .ops
        .iter()
        .map(|o| o.op.len())
        .max()
        .unwrap_or(0)
        .max(9);
    writeln!(
        out,
        "{:<w$} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "op", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors"
    )?;
    let row = |out: &mut dyn Write,
               name: &str,
               requests: u64,
               rate: f64,
               l: &Percentiles,
               errors: u64| {
        writeln!(
            out,
            "{name:<w$} {requests:>11} {rate:>11.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {errors:>8}",
            l.p50, l.p90, l.p99, l.p999, l.max
        )
    };
    for op in &report.ops {
        row(out, &op.op, op.requests, op.rate, &op.latency_ms, op.errors)?;
    }
    if report.ops.len() > 1 {
        row(
            out,
            "all",
            report.requests,
            report.achieved_rate,
            &report.latency_ms,
            report.errors_total,
        )?;
    }
    if let Some(sse) = &report.sse {
        // Events instead of requests; latency from an ingest's send to the event.
        row(
            out,
            "sse",
            sse.events,
            sse.events_per_s,
            &sse.latency_ms,
            sse.errors,
        )?;
        writeln!(
            out,
            "sse: {} streams, {} deleted, {} events not matched to an ingest of this run",
            sse.subscribers, sse.deleted, sse.unmatched
        )?;
    }
    if let Some(p) = &report.prefix_streams {
        // Box events after the listings; latency from an ingest's send to the event.
        row(
            out,
            "prefix",
            p.events,
            p.events_per_s,
            &p.latency_ms,
            p.errors,
        )?;
        writeln!(
            out,
            "prefix streams: {} streams on {} prefixes ({:?}), {} boxes listed, {} synced, {} resets, {} deleted, {} events not matched to an ingest of this run",
            p.streams, p.prefixes, p.prefix, p.listed, p.synced, p.resets, p.deleted, p.unmatched
        )?;
    }
    Ok(())
}

/// The rate achieved (against the offered one in an open loop), in messages
/// where messages were sent, and the generator's own lateness.
fn print_rates(report: &Report, out: &mut impl Write) -> io::Result<()> {
    match (report.offered_rate, report.scheduled_requests) {
        (Some(rate), Some(scheduled)) => writeln!(
            out,
            "offered {rate:.1} req/s ({scheduled} scheduled), achieved {:.1} req/s ({:.2}%)",
            report.achieved_rate,
            100.0 * report.achieved_rate / rate
        )?,
        _ => writeln!(out, "achieved {:.1} req/s", report.achieved_rate)?,
    }
    if report
        .ops
        .iter()
        .any(|o| o.op == "batch" || o.op == "ingest")
    {
        // Batches carry many messages per request: the ingest rate is in messages.
        writeln!(out, "achieved {:.1} messages/s", report.messages_per_s)?;
    }
    if let Some(l) = &report.send_lateness_ms {
        writeln!(
            out,
            "generator's own send lateness: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            l.p50, l.p99, l.max
        )?;
    }
    Ok(())
}

/// The statuses, the answers that are not errors, the messages accepted,
/// what the table leaves out, the errors and the verdict.
fn print_outcomes(report: &Report, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "status: {}", join_counts(&report.status))?;
    let expected: Vec<String> = report
        .ops
        .iter()
        .flat_map(|o| {
            let mut parts = Vec::new();
            let many = Op::from_name(&o.op).is_some_and(Op::is_many);
            if o.not_found > 0 && many {
                parts.push(format!("{} null boxes (no box yet) {}", o.op, o.not_found));
            } else if o.not_found > 0 {
                parts.push(format!("{} 404 (no box yet) {}", o.op, o.not_found));
            }
            if o.not_modified > 0 {
                parts.push(format!("{} 304 (nothing newer) {}", o.op, o.not_modified));
            }
            parts
        })
        .collect();
    if !expected.is_empty() {
        writeln!(out, "expected, not errors: {}", expected.join(", "))?;
    }
    let accepted: Vec<String> = report
        .ops
        .iter()
        .filter(|o| o.messages_accepted > 0)
        .map(|o| {
            format!(
                "{} {} ({:.1}/s in the window)",
                o.op, o.messages_accepted, o.messages_per_s
            )
        })
        .collect();
    if !accepted.is_empty() {
        writeln!(out, "messages accepted: {}", accepted.join(", "))?;
    }
    let warmup: u64 = report.ops.iter().map(|o| o.warmup_requests).sum();
    let unanswered: u64 = report.ops.iter().map(|o| o.unanswered).sum();
    if warmup > 0 || unanswered > 0 || report.preseed_requests > 0 {
        writeln!(
            out,
            "not in the table: {warmup} warm-up, {} pre-seed, {unanswered} unanswered requests",
            report.preseed_requests
        )?;
    }
    writeln!(
        out,
        "errors: {}",
        if report.errors.is_empty() {
            "none".to_string()
        } else {
            join_counts(&report.errors)
        }
    )?;
    writeln!(
        out,
        "error rate {:.3}% (max {:.3}%){}",
        100.0 * report.error_rate,
        100.0 * report.max_error_rate,
        if report.passed() { "" } else { "  FAILED" }
    )
}

fn join_counts(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".to_string();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mix::Mix;

    fn sample() -> Report {
        let mut stats = Stats::default();
        for i in 0..900u64 {
            let poll = stats.op(Op::Poll);
            poll.requests += 1;
            poll.answered_in_window += 1;
            poll.latency.record(50_000 + i).unwrap();
            poll.count_status(if i < 10 { 404 } else { 200 });
            if i < 10 {
                poll.not_found += 1;
            }
        }
        for _ in 0..100 {
            let ingest = stats.op(Op::Ingest);
            ingest.requests += 1;
            ingest.answered_in_window += 1;
            ingest.accepted += 1;
            ingest.accepted_in_window += 1;
            ingest.latency.record(80_000).unwrap();
            ingest.count_status(200);
        }
        stats.op(Op::Ingest).errors[ErrorKind::Timeout as usize] = 1;
        stats.op(Op::Ingest).unanswered = 1;
        stats.scheduled = 1001;
        Report::build(
            RunShape {
                url: "http://127.0.0.1:1".into(),
                open_loop_rate: Some(1000.0),
                connections: 4,
                threads: 1,
                pipeline: 1,
                mix: Mix::default(),
                keys: 1000,
                key_dist: "uniform".into(),
                message_bytes: 512,
                batch_size: 10,
                keys_per_request: 20,
                duration_s: 1.0,
                warmup_s: 0.0,
                max_error_rate: 0.01,
                preseed_requests: 0,
            },
            &stats,
        )
    }

    #[test]
    fn counts_rates_and_errors() {
        let r = sample();
        assert_eq!(r.total_requests(), 1000);
        assert_eq!(r.count("poll"), 900);
        assert_eq!(r.count("ingest"), 100);
        assert_eq!(r.count("batch"), 0);
        assert_eq!(r.achieved_rate, 1000.0);
        assert_eq!(r.errors_total, 1);
        assert!((r.error_rate() - 1.0 / 1001.0).abs() < 1e-12);
        assert!(r.passed());
        assert_eq!(r.status.get("200"), Some(&990));
        assert_eq!(r.status.get("404"), Some(&10));
        assert_eq!(r.errors.get("timeout"), Some(&1));
        assert!(r.latency_ms.p50 > 0.05 && r.latency_ms.max >= 0.08);
    }

    #[test]
    fn table_and_json_say_the_same() {
        let r = sample();
        let mut out = Vec::new();
        print_report(&r, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(table.contains("open-loop at 1000 req/s"), "{table}");
        assert!(table.contains("offered 1000.0 req/s (1001 scheduled), achieved 1000.0 req/s"));
        assert!(table.contains("status: 200=990 404=10"), "{table}");
        assert!(table.contains("poll 404 (no box yet) 10"), "{table}");
        assert!(table.contains("errors: timeout=1"), "{table}");
        assert!(table.contains("achieved 100.0 messages/s"), "{table}");
        assert!(
            table.contains("messages accepted: ingest 100 (100.0/s in the window)"),
            "{table}"
        );
        assert!(table
            .lines()
            .any(|l| l.starts_with("poll ") && l.contains(" 900 ")));
        assert!(table.lines().any(|l| l.starts_with("all ")));

        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["mode"], "open-loop");
        assert_eq!(json["offered_rate"], 1000.0);
        assert_eq!(json["achieved_rate"], 1000.0);
        assert_eq!(json["ops"][0]["op"], "poll");
        assert_eq!(json["ops"][0]["requests"], 900);
        assert_eq!(json["ops"][0]["not_found"], 10);
        assert_eq!(json["ops"][0]["messages_per_s"], 0.0);
        assert_eq!(json["ops"][1]["messages_per_s"], 100.0);
        assert_eq!(json["messages_per_s"], 100.0);
        assert_eq!(json["status"]["404"], 10);
        assert_eq!(json["errors"]["timeout"], 1);
        assert!(json["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
        assert!(json.get("histograms").is_none());
    }

    #[test]
    fn many_box_operations_have_their_rows_and_counts() {
        let mut stats = Stats::default();
        for (op, n) in [(Op::PollMany, 300u64), (Op::LongPollMany, 100)] {
            let s = stats.op(op);
            for i in 0..n {
                s.requests += 1;
                s.answered_in_window += 1;
                s.latency.record(100_000 + i).unwrap();
                s.count_status(if i % 2 == 0 { 304 } else { 200 });
                s.not_modified += u64::from(i % 2 == 0);
            }
            s.not_found = 7;
        }
        let shape = |mix: &str| RunShape {
            url: "http://127.0.0.1:1".into(),
            open_loop_rate: None,
            connections: 4,
            threads: 1,
            pipeline: 1,
            mix: Mix::parse(mix).unwrap(),
            keys: 1000,
            key_dist: "uniform".into(),
            message_bytes: 512,
            batch_size: 10,
            keys_per_request: 20,
            duration_s: 1.0,
            warmup_s: 0.0,
            max_error_rate: 0.01,
            preseed_requests: 0,
        };
        let r = Report::build(shape("poll_many:3,longpoll_many:1"), &stats);
        assert_eq!((r.count("poll_many"), r.count("longpoll_many")), (300, 100));
        assert_eq!(r.keys_per_request, Some(20));
        assert_eq!(r.status.get("304"), Some(&200));
        let mut out = Vec::new();
        print_report(&r, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(
            table.contains("20 keys per poll_many/longpoll_many request"),
            "{table}"
        );
        assert!(
            table.contains("poll_many 304 (nothing newer) 150"),
            "{table}"
        );
        assert!(
            table.contains("longpoll_many null boxes (no box yet) 7"),
            "{table}"
        );
        // The columns line up under the longest name.
        let rows: Vec<&str> = table
            .lines()
            .filter(|l| {
                ["op ", "poll_many ", "longpoll_many ", "all "]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        assert_eq!(rows.len(), 4, "{table}");
        assert!(rows.iter().all(|l| l.len() == rows[0].len()), "{table}");
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["keys_per_request"], 20);
        assert_eq!(json["ops"][1]["op"], "longpoll_many");
        assert_eq!(json["ops"][1]["not_modified"], 50);

        // Without them the table is as it was.
        let r = Report::build(shape("poll"), &stats);
        assert_eq!(r.keys_per_request, None);
        let mut out = Vec::new();
        print_report(&r, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(!table.contains("keys per"), "{table}");
        let head = format!("{:<9} {:>11} ", "op", "requests");
        assert!(table.lines().any(|l| l.starts_with(&head)), "{table}");
    }

    #[test]
    fn presence_has_its_lines_and_fields() {
        use crate::presence::{PresencePlan, PresenceStats, StormStats, WatcherStats};
        let watcher = |room, bytes, count| WatcherStats {
            room,
            events: 4,
            bytes,
            last_count: Some(count),
            ..WatcherStats::default()
        };
        let stats = PresenceStats {
            joins: 30,
            leaves: 20,
            members_open: 110,
            member_errors: 1,
            refused: [("503".to_string(), 1)].into_iter().collect(),
            watchers: vec![
                watcher(0, 1000, 100),
                watcher(0, 1500, 100),
                watcher(1, 300, 10),
            ],
            rooms: vec!["room-0/".into(), "room-1/".into()],
            member_list_bytes: vec![1500, 200],
            storm: Some(StormStats {
                members: 100,
                opened_ns: 5_000_000,
                joined_ns: Some(6_000_000),
                seen_ns: None,
                errors: 0,
            }),
            ..PresenceStats::default()
        };
        let plan = PresencePlan {
            rooms: crate::rooms::PrefixTemplate::parse("room-{i%2}/").unwrap(),
            members: 20,
            churn_per_s: 10.0,
            storm: 100,
            watchers: 3,
        };
        let p = PresenceReport::of(&stats, &plan, std::time::Duration::from_secs(2));
        assert_eq!((p.joins_per_s, p.leaves_per_s), (15.0, 10.0));
        assert_eq!((p.events, p.events_per_s), (12, 6.0));
        assert_eq!(
            (p.bytes_per_watcher, p.bytes_per_watcher_max),
            (2800.0 / 3.0, 1500)
        );
        assert_eq!(p.last_count, 110);
        assert_eq!(p.last_counts.get("room-1/"), Some(&10));
        assert_eq!(p.member_list_bytes, 1500);
        assert_eq!(
            p.watcher_bytes_ratio,
            Some(1.5),
            "300 of 200, or 1500 of 1500"
        );
        let mut r = sample();
        r.presence = Some(p);
        let mut out = Vec::new();
        print_report(&r, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert!(table.contains("presence: 20 members held in 2 rooms (\"room-{i%2}/\"), churn 10.0/s: 30 joins (15.0/s), 20 leaves (10.0/s), 110 open at the end, 1 errors (503=1)"), "{table}");
        assert!(table.contains("presence watchers: 3 watching, 12 events (6.0/s), 933 bytes a watcher (max 1500), last count 110"), "{table}");
        assert!(table.contains("most a watcher got / list 1.50x"), "{table}");
        assert!(table.contains("presence storm: 100 members written in 5.0 ms, all joined in 6.0 ms, seen by every watcher in never"), "{table}");
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(json["presence"]["storm"]["joined_ms"], 6.0);
        assert!(json["presence"]["storm"]["seen_ms"].is_null());
        assert_eq!(json["presence"]["refused"]["503"], 1);
        assert!(serde_json::to_value(sample()).unwrap()["presence"].is_null());
    }

    #[test]
    fn buckets_are_the_histogram() {
        let r = sample();
        let h = r.latency_histogram();
        let total: u64 = r.latency_buckets_ns.iter().map(|b| b[1]).sum();
        assert_eq!(total, h.len());
        assert!(r.latency_buckets_ns.windows(2).all(|w| w[0][0] < w[1][0]));
        // The percentile read off the buckets is the histogram's.
        let want = h.value_at_quantile(0.99);
        let mut seen = 0;
        let at = r
            .latency_buckets_ns
            .iter()
            .find(|b| {
                seen += b[1];
                seen as f64 >= 0.99 * total as f64
            })
            .map(|b| b[0]);
        assert_eq!(at, Some(h.highest_equivalent(want)));
        // The JSON carries them.
        let json: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["latency_buckets_ns"].as_array().map(Vec::len),
            Some(r.latency_buckets_ns.len())
        );
    }
}
