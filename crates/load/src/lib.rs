//! pollbox's load generator (`pollbox load`,
//! docs/operations.md#load-generator-and-demo), built to measure tail latency
//! honestly and to out-drive the server.
//!
//! - `--threads` threads, each a mio event loop owning its share of `--connections`.
//! - Open-loop with `--rate`: every request has an intended send time on a fixed
//!   schedule and its latency is measured from that time, so a server stall shows in
//!   the percentiles (coordinated omission corrected, as wrk2 does). Closed-loop without
//!   it: each connection keeps `--pipeline` requests in flight.
//! - A mix of poll, ingest, batch and long-poll over keys `lg-0..lg-<keys-1>`, uniform or
//!   zipf, and their many-box forms (`poll_many`, `longpoll_many`: `GET
//!   /v1/boxes?keys=...` of `--keys-per-request` distinct keys, with the last ETag seen
//!   as `If-None-Match`); messages padded with nested cargo to `--body-bytes`.
//! - `--rooms R` names key n `room-<n % R>/lg-<n>` (docs/http.md#rooms), and
//!   `--prefix-streams N` holds N event streams of prefixes open (`--prefix
//!   room-{i%R}/`-style templates), as `--sse N` holds streams of one box each.
//! - Presence (docs/presence.md): `--presence-members N` members held present in rooms,
//!   `--presence-churn` of them replaced a second, a `--presence-storm` of joins at the
//!   start of the window, and `--presence-watchers` streams of the rooms' presence
//!   counting the events and bytes they are sent (`presence.rs`).
//! - Every answer is checked: the status the operation expects, the payload's key and
//!   version (never backwards per key on a connection), batch counts; a many-box
//!   answer's array (one element per key asked, `null` or its payload) and its ETag.
//! - HdrHistogram per operation; a progress line per second on stderr; a final table,
//!   `--json`, `--hgrm` (wrk2's percentile spectrum) and `--plot` (SVG).
//!
//! What counts as an error: a status the operation does not expect, a malformed
//! answer, a version going backwards, rejected batch messages, a lost connection with
//! requests in flight, a failed reconnect, or no answer by the end. A 404 to a poll or
//! long-poll is *not* an error: the box does not exist until a message for its key has
//! been accepted, so with a fresh server and a mostly-poll mix most early polls are
//! 404s. They are counted apart (`not_found`); `--preseed` ingests one message per key
//! before the run so polls find their box from the start.
//!
//! Not here: the `pollbox` binary's wiring (it calls [`run`], [`print_report`] and
//! checks [`Report::passed`]), and anything server-side.

mod args;
mod engine;
mod hgrm;
mod keys;
mod mix;
mod plot;
mod presence;
mod progress;
mod report;
mod request;
mod response;
mod rooms;
mod sse;
mod stats;
mod timer;

use std::io::{Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use args::{parse_duration, KeyDist, LoadArgs};
pub use hgrm::write_hgrm;
pub use keys::{KeySampler, Rng, Zipf};
pub use mix::{Mix, Op};
pub use report::{print_report, OpReport, Percentiles, Report};
pub use request::{cargo_json, KeyNames, Requests};
pub use response::{batch_counts, parse_response, payload_version, Response};
pub use rooms::PrefixTemplate;

use engine::Plan;
use progress::{Board, Printer, Tally};
use report::RunShape;
use stats::Stats;

/// Why a run could not happen or finish. Requests that fail during a run are not
/// errors of the run: they are counted in the [`Report`].
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid argument: {0}")]
    InvalidArgs(String),
    #[error("invalid --url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("load thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("pre-seeding boxes failed: {0}")]
    Preseed(String),
    #[error("cannot write {path}: {source}")]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("a load thread panicked")]
    ThreadPanicked,
}

/// Where to send requests: the resolved address and the `Host` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
}

/// Parses `http://host[:port][/]` and resolves the host.
pub fn resolve_url(url: &str) -> Result<Target, LoadError> {
    let bad = |reason: &str| LoadError::Url {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !(path.is_empty() || path == "/") {
        return Err(bad(
            "the URL must not have a path; routes are fixed (/v1/...)",
        ));
    }
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("expected host[:port]"));
    }
    let has_port = match authority.strip_prefix('[') {
        // [v6 address] or [v6 address]:port
        Some(v6) => {
            let close = v6.find(']').ok_or_else(|| bad("unclosed [ in host"))?;
            !v6[close + 1..].is_empty()
        }
        None => authority.contains(':'),
    };
    let with_port = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|source| LoadError::Resolve {
            host: with_port.clone(),
            source,
        })?
        .next()
        .ok_or_else(|| LoadError::Resolve {
            host: with_port.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
        })?;
    Ok(Target {
        addr,
        host: authority.to_string(),
    })
}

fn validate(args: &LoadArgs) -> Result<(), LoadError> {
    let bad = |m: &str| Err(LoadError::InvalidArgs(m.to_string()));
    if args.connections == 0 {
        return bad("--connections must be at least 1");
    }
    if args.threads == 0 {
        return bad("--threads must be at least 1");
    }
    if args.pipeline == 0 {
        return bad("--pipeline must be at least 1");
    }
    if args.keys == 0 {
        return bad("--keys must be at least 1");
    }
    if args.batch_size == 0 {
        return bad("--batch-size must be at least 1");
    }
    if args.mix.entries().iter().any(|(op, _)| op.is_many())
        && !(1..=args.keys as usize).contains(&args.keys_per_request)
    {
        return bad(
            "--keys-per-request must be at least 1 and at most --keys (its keys are distinct)",
        );
    }
    if args.duration.is_zero() {
        return bad("--duration must be above 0");
    }
    if let Some(rate) = args.rate {
        if !(rate.is_finite() && rate > 0.0) {
            return bad("--rate must be a positive number of requests per second");
        }
    }
    if !(args.max_error_rate.is_finite() && args.max_error_rate >= 0.0) {
        return bad("--max-error-rate must be a number >= 0");
    }
    if !(args.presence_churn.is_finite() && args.presence_churn >= 0.0) {
        return bad("--presence-churn must be a number of members per second >= 0");
    }
    if args.presence_churn > 0.0 && args.presence_members == 0 {
        return bad("--presence-churn replaces members of --presence-members: give it too");
    }
    Ok(())
}

/// Runs the load described by `args`, printing a progress line per second on stderr
/// (unless `--quiet`), and writes the `--json`, `--hgrm` and `--plot` files it names.
/// The caller prints the table ([`print_report`]) and decides the exit status
/// ([`Report::passed`]).
pub fn run(args: &LoadArgs) -> Result<Report, LoadError> {
    validate(args)?;
    let target = resolve_url(&args.url)?;
    let threads = args.threads.min(args.connections);
    let requests = Requests::new(
        &target.host,
        args.keys,
        KeyNames { rooms: args.rooms },
        args.body_bytes,
        args.batch_size,
        args.longpoll_wait.as_millis() as u64,
        args.token.as_deref(),
    );

    let preseed_requests = if args.preseed {
        preseed(&target, &requests, args.keys, args.seed)?
    } else {
        0
    };

    // Connect everything before the clock starts, so connection setup is not latency.
    let connect_error = |source| LoadError::Connect {
        addr: target.addr,
        source,
    };
    let mut subscribers = sse::subscribe(
        target.addr,
        &target.host,
        requests.names(),
        args.keys,
        args.sse,
    )
    .map_err(connect_error)?;
    let template = args.prefix_template();
    subscribers.extend(
        sse::subscribe_prefixes(target.addr, &target.host, &template, args.prefix_streams)
            .map_err(connect_error)?,
    );
    let presence_plan = presence::PresencePlan::of(args);
    let presence = if presence_plan.active() {
        let opened =
            presence::open(target.addr, &target.host, &presence_plan).map_err(connect_error)?;
        Some(Presence {
            plan: &presence_plan,
            host: &target.host,
            opened,
        })
    } else {
        None
    };
    let mut streams = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        streams.push(connect(target.addr)?);
    }

    let plan = plan(args, target.addr, requests);
    let (stats, sse_result, presence_result) =
        drive_threads(args, &plan, threads, streams, subscribers, presence)?;
    let warmup = args.warmup.unwrap_or(Duration::ZERO);
    let mut report = Report::build(
        RunShape {
            url: args.url.clone(),
            open_loop_rate: args.rate,
            connections: args.connections,
            threads,
            pipeline: args.pipeline,
            mix: args.mix.clone(),
            keys: args.keys,
            key_dist: args.key_dist.name().to_string(),
            message_bytes: plan.requests.message_len(),
            batch_size: plan.requests.batch_size(),
            keys_per_request: args.keys_per_request,
            duration_s: args.duration.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            max_error_rate: args.max_error_rate,
            preseed_requests,
        },
        &stats,
    );
    match sse_result {
        None => {}
        Some(Ok(Ok(s))) => {
            if args.sse > 0 {
                report.sse = Some(report::SseReport::of(&s.keys, args.duration));
            }
            if args.prefix_streams > 0 {
                report.prefix_streams = Some(report::PrefixStreamReport::of(
                    &s.prefixes,
                    &template,
                    args.duration,
                ));
            }
        }
        Some(Ok(Err(e))) => return Err(LoadError::Io(e)),
        Some(Err(_)) => return Err(LoadError::ThreadPanicked),
    }
    match presence_result {
        None => {}
        Some(Ok(Ok(p))) => {
            report.presence = Some(report::PresenceReport::of(
                &p,
                &presence_plan,
                args.duration,
            ));
        }
        Some(Ok(Err(e))) => return Err(LoadError::Io(e)),
        Some(Err(_)) => return Err(LoadError::ThreadPanicked),
    }
    if let Some(path) = &args.json {
        report.write_json(path)?;
    }
    if let Some(path) = &args.hgrm {
        report.write_hgrm(path)?;
    }
    if let Some(path) = &args.plot {
        report.write_plot(path)?;
    }
    Ok(report)
}

/// What every connection thread follows: the target, the requests, the mix,
/// and the clock (warm-up, end, and the drain after it).
fn plan(args: &LoadArgs, addr: SocketAddr, requests: Requests) -> Plan {
    let warmup_ns = args.warmup.unwrap_or(Duration::ZERO).as_nanos() as u64;
    let drain = Duration::from_secs(2)
        + if args.mix.entries().iter().any(|(op, _)| op.waits()) {
            args.longpoll_wait
        } else {
            Duration::ZERO
        };
    Plan {
        addr,
        requests,
        mix: args.mix.clone(),
        keys: KeySampler::new(args.key_dist, args.keys, args.zipf_exponent),
        key_count: args.keys,
        keys_per_request: args.keys_per_request,
        pipeline: args.pipeline,
        interval_ns: args.rate.map(|rate| 1e9 * args.connections as f64 / rate),
        connections: args.connections,
        warmup_ns,
        end_ns: warmup_ns + args.duration.as_nanos() as u64,
        drain_ns: drain.as_nanos() as u64,
        seed: args.seed,
        published: (args.sse > 0 || args.prefix_streams > 0)
            .then(|| std::sync::Arc::new(sse::Published::new(args.keys))),
    }
}

/// What the event-stream thread returns, when there is one.
type SseOutcome = std::thread::Result<std::io::Result<sse::StreamStats>>;

/// What the presence thread returns, when there is one.
type PresenceOutcome = std::thread::Result<std::io::Result<presence::PresenceStats>>;

/// The presence mix to run: what it does, and its streams opened before the clock.
struct Presence<'a> {
    plan: &'a presence::PresencePlan,
    host: &'a str,
    opened: presence::Opened,
}

/// Run the load: `threads` threads share `streams` (contiguous shares), one
/// more reads the event streams of `subscribers`, one more runs the presence
/// mix, and progress is printed each second unless `--quiet`. Returns the
/// threads' stats merged, and the event-stream and presence threads' outcomes.
fn drive_threads(
    args: &LoadArgs,
    plan: &Plan,
    threads: usize,
    streams: Vec<std::net::TcpStream>,
    subscribers: Vec<sse::Subscription>,
    presence: Option<Presence<'_>>,
) -> Result<(Stats, Option<SseOutcome>, Option<PresenceOutcome>), LoadError> {
    let mut shares: Vec<Vec<(usize, std::net::TcpStream)>> =
        (0..threads).map(|_| Vec::new()).collect();
    for (global, stream) in streams.into_iter().enumerate() {
        shares[global * threads / args.connections].push((global, stream));
    }

    let board = Board::new(threads);
    // A little head start so every thread is waiting when the clock starts.
    let origin = Instant::now() + Duration::from_millis(20);
    let mut sse_result = None;
    let mut presence_result = None;
    let results: Vec<std::thread::Result<std::io::Result<Stats>>> = std::thread::scope(|scope| {
        let sse_handle = plan.published.as_ref().map(|p| {
            let window = sse::Window {
                origin,
                warmup_ns: plan.warmup_ns,
                end_ns: plan.end_ns + Duration::from_millis(200).as_nanos() as u64,
            };
            let reader = sse::Reader {
                published: p,
                // Only single ingests' answers carry the version their event will have.
                timed: plan.mix.contains(Op::Ingest),
                names: plan.requests.names(),
                keys: plan.key_count,
            };
            std::thread::Builder::new()
                .name("load-sse".into())
                .spawn_scoped(scope, move || sse::drive(subscribers, reader, window))
        });
        let presence_handle = presence.map(|p| {
            let window = sse::Window {
                origin,
                warmup_ns: plan.warmup_ns,
                end_ns: plan.end_ns + Duration::from_millis(200).as_nanos() as u64,
            };
            let addr = plan.addr;
            std::thread::Builder::new()
                .name("load-presence".into())
                .spawn_scoped(scope, move || {
                    presence::drive(addr, p.host, p.plan, p.opened, window)
                })
        });
        let handles: Vec<_> = shares
            .into_iter()
            .enumerate()
            .map(|(t, share)| {
                let board = &board;
                std::thread::Builder::new()
                    .name(format!("load-{t}"))
                    .spawn_scoped(scope, move || engine::drive(plan, origin, share, board, t))
            })
            .collect();
        if !args.quiet {
            let warmup = args.warmup.unwrap_or(Duration::ZERO);
            report_progress(&board, origin, warmup, &handles);
        }
        sse_result = sse_handle.map(|h| match h {
            Ok(h) => h.join(),
            Err(e) => Ok(Err(e)),
        });
        presence_result = presence_handle.map(|h| match h {
            Ok(h) => h.join(),
            Err(e) => Ok(Err(e)),
        });
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join(),
                Err(e) => Ok(Err(e)),
            })
            .collect()
    });
    let mut stats = Stats::default();
    for result in results {
        match result {
            Ok(Ok(s)) => stats.merge(&s),
            Ok(Err(e)) => return Err(LoadError::Io(e)),
            Err(_) => return Err(LoadError::ThreadPanicked),
        }
    }
    Ok((stats, sse_result, presence_result))
}

fn connect(addr: SocketAddr) -> Result<std::net::TcpStream, LoadError> {
    let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|source| LoadError::Connect { addr, source })?;
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_nonblocking(true))
        .map_err(|source| LoadError::Connect { addr, source })?;
    Ok(stream)
}

/// Prints a line each second until every thread has finished.
fn report_progress<T>(
    board: &Board,
    origin: Instant,
    warmup: Duration,
    handles: &[std::io::Result<std::thread::ScopedJoinHandle<'_, T>>],
) {
    let mut printer = Printer::new(warmup);
    let mut second = 1u32;
    let stderr = std::io::stderr();
    loop {
        // Threads hand over right at each second; look a moment later.
        let at = origin + Duration::from_secs(u64::from(second)) + Duration::from_millis(50);
        while Instant::now() < at {
            if handles
                .iter()
                .all(|h| h.as_ref().map_or(true, |h| h.is_finished()))
            {
                // The last, partial second.
                let mut tally = Tally::new();
                board.collect(&mut tally);
                if tally.answered > 0 || tally.errors > 0 {
                    let elapsed = Instant::now().saturating_duration_since(origin);
                    printer.line(elapsed, &tally, &mut stderr.lock());
                }
                return;
            }
            let left = at.saturating_duration_since(Instant::now());
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
        let mut tally = Tally::new();
        board.collect(&mut tally);
        printer.line(
            Duration::from_secs(u64::from(second)),
            &tally,
            &mut stderr.lock(),
        );
        second += 1;
    }
}

/// Ingests one message into every key, `PRESEED_BATCH` keys per request, over one
/// blocking connection. Returns the number of requests.
fn preseed(target: &Target, requests: &Requests, keys: u32, seed: u64) -> Result<u64, LoadError> {
    const PRESEED_BATCH: u32 = 100;
    let mut stream = std::net::TcpStream::connect_timeout(&target.addr, Duration::from_secs(5))
        .map_err(|source| LoadError::Connect {
            addr: target.addr,
            source,
        })?;
    let fail = |what: String| LoadError::Preseed(what);
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| fail(e.to_string()))?;
    let mut rng = Rng::new(seed ^ 0x9e5e_ed00);
    let mut out = Vec::new();
    let mut input = vec![0u8; 64 * 1024];
    let mut sent = 0u64;
    let mut first = 0u32;
    while first < keys {
        let count = PRESEED_BATCH.min(keys - first);
        out.clear();
        requests.write_batch_for_keys(&mut out, first, count, &mut rng);
        stream.write_all(&out).map_err(|e| fail(e.to_string()))?;
        sent += 1;
        let mut filled = 0;
        let (status, accepted) = loop {
            if filled == input.len() {
                input.resize(input.len() * 2, 0);
            }
            let n = stream
                .read(&mut input[filled..])
                .map_err(|e| fail(e.to_string()))?;
            if n == 0 {
                return Err(fail("the server closed the connection".into()));
            }
            filled += n;
            match parse_response(&input[..filled]) {
                Ok(Some(r)) => break (r.status, batch_counts(r.body).ok()),
                Ok(None) => {}
                Err(e) => return Err(fail(format!("malformed answer: {e:?}"))),
            }
        };
        if status != 200 || accepted.map(|(a, _)| a) != Some(u64::from(count)) {
            return Err(fail(format!(
                "POST /v1/ingest for keys lg-{first}..lg-{} answered {status} (accepted {:?} of {count})",
                first + count - 1,
                accepted.map(|(a, _)| a)
            )));
        }
        first += count;
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = resolve_url("http://127.0.0.1:8080").unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1:8080");
        let t = resolve_url("http://127.0.0.1/").unwrap();
        assert_eq!(t.addr.port(), 80);
        assert_eq!(t.host, "127.0.0.1");
        let t = resolve_url("http://[::1]:9000").unwrap();
        assert_eq!(t.addr, "[::1]:9000".parse().unwrap());
        let t = resolve_url("http://[::1]").unwrap();
        assert_eq!(t.addr.port(), 80);
        for bad in [
            "https://x:1",
            "127.0.0.1:80",
            "http://",
            "http://h:1/v1/boxes",
            "http://u@h:1",
        ] {
            assert!(resolve_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn arguments_are_checked() {
        let ok = LoadArgs::new("http://127.0.0.1:1");
        assert!(validate(&ok).is_ok());
        // More keys per request than keys only matters to the many-box operations.
        let mut few = ok.clone();
        few.keys = 5;
        assert!(validate(&few).is_ok());
        few.mix = Mix::parse("poll_many").unwrap();
        assert!(validate(&few).is_err());
        few.keys_per_request = 5;
        assert!(validate(&few).is_ok());
        for change in [
            (|a: &mut LoadArgs| a.connections = 0) as fn(&mut LoadArgs),
            |a| a.threads = 0,
            |a| a.pipeline = 0,
            |a| a.keys = 0,
            |a| a.batch_size = 0,
            |a| {
                a.mix = Mix::parse("poll_many").unwrap();
                a.keys_per_request = 0;
            },
            |a| {
                a.mix = Mix::parse("poll:1,longpoll_many:1").unwrap();
                a.keys = 10;
                a.keys_per_request = 11;
            },
            |a| a.duration = Duration::ZERO,
            |a| a.rate = Some(0.0),
            |a| a.rate = Some(f64::NAN),
            |a| a.max_error_rate = -1.0,
            |a| a.presence_churn = 5.0,
            |a| {
                a.presence_members = 10;
                a.presence_churn = -1.0;
            },
            |a| {
                a.presence_members = 10;
                a.presence_churn = f64::INFINITY;
            },
        ] {
            let mut args = ok.clone();
            change(&mut args);
            assert!(matches!(validate(&args), Err(LoadError::InvalidArgs(_))));
        }
    }

    #[test]
    fn presence_flags_are_parsed_into_a_plan() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let parsed = Cli::parse_from(["load", "--url", "http://h:1"]).load;
        assert!(!presence::PresencePlan::of(&parsed).active());
        assert_eq!(parsed.presence_template().render(7), "room-0/");
        let parsed = Cli::parse_from([
            "load",
            "--url",
            "http://h:1",
            "--rooms",
            "4",
            "--presence-members",
            "100",
            "--presence-churn",
            "2.5",
            "--presence-watchers",
            "10",
            "--presence-storm",
            "1000",
        ])
        .load;
        assert!(validate(&parsed).is_ok());
        let plan = presence::PresencePlan::of(&parsed);
        assert!(plan.active());
        assert_eq!(
            (plan.members, plan.churn_per_s, plan.watchers, plan.storm),
            (100, 2.5, 10, 1000)
        );
        assert_eq!(plan.rooms.render(6), "room-2/", "the rooms of --rooms");
        let parsed = Cli::parse_from([
            "load",
            "--url",
            "http://h:1",
            "--rooms",
            "4",
            "--presence-watchers",
            "3",
            "--presence-room",
            "lobby:",
        ])
        .load;
        assert_eq!(
            presence::PresencePlan::of(&parsed).rooms.render(6),
            "lobby:"
        );
        for (flag, bad) in [
            ("--presence-room", "lobby"),
            ("--presence-members", "-1"),
            ("--presence-churn", "fast"),
        ] {
            assert!(
                Cli::try_parse_from(["load", "--url", "http://h:1", flag, bad]).is_err(),
                "{flag} {bad}"
            );
        }
    }

    #[test]
    fn clap_defaults_match_new() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let parsed = Cli::parse_from(["load", "--url", "http://h:1"]).load;
        assert_eq!(
            format!("{parsed:?}"),
            format!("{:?}", LoadArgs::new("http://h:1"))
        );
        let parsed = Cli::parse_from([
            "load",
            "--url",
            "http://h:1",
            "-c",
            "4",
            "-t",
            "2",
            "-d",
            "500ms",
            "-R",
            "2000",
            "--mix",
            "poll:1,longpoll:1",
            "--key-dist",
            "zipf",
            "--warmup",
            "1s",
            "--keys-per-request",
            "8",
        ])
        .load;
        assert_eq!((parsed.connections, parsed.threads), (4, 2));
        assert_eq!(parsed.duration, Duration::from_millis(500));
        assert_eq!(parsed.rate, Some(2000.0));
        assert!(parsed.mix.contains(Op::LongPoll));
        assert_eq!(parsed.key_dist, KeyDist::Zipf);
        assert_eq!(parsed.warmup, Some(Duration::from_secs(1)));
        assert_eq!(parsed.keys_per_request, 8);
        assert_eq!((parsed.rooms, parsed.prefix_streams), (0, 0));
        assert_eq!(parsed.prefix_template().render(3), "");

        let parsed = Cli::parse_from([
            "load",
            "--url",
            "http://h:1",
            "--rooms",
            "4",
            "--prefix-streams",
            "100",
        ])
        .load;
        assert_eq!((parsed.rooms, parsed.prefix_streams), (4, 100));
        assert_eq!(parsed.prefix_template().render(6), "room-2/");
        let parsed = Cli::parse_from([
            "load",
            "--url",
            "http://h:1",
            "--rooms",
            "4",
            "--prefix-streams",
            "100",
            "--prefix",
            "room-{i%2}/",
        ])
        .load;
        assert_eq!(parsed.prefix_template().render(3), "room-1/");
        for bad in ["room-{i}", "room-{k}/", "room-{i%0}/"] {
            let err = Cli::try_parse_from(["load", "--url", "http://h:1", "--prefix", bad])
                .err()
                .expect(bad)
                .to_string();
            assert!(err.contains("invalid prefix template"), "{bad}: {err}");
        }
    }
}
