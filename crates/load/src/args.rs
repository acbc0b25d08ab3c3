//! The command line of `pollbox load` (docs/operations.md#load-generator-and-demo):
//! [`LoadArgs`] and the parsers for its values (durations like `10s`, key
//! distributions). The mix has its own module.

use std::path::PathBuf;
use std::time::Duration;

use crate::mix::Mix;
use crate::rooms::PrefixTemplate;

/// How keys are picked for each request.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyDist {
    /// Every key equally likely.
    Uniform,
    /// Zipf: key `lg-0` hottest, `lg-n` with weight 1/(n+1)^s (`--zipf-exponent`).
    Zipf,
}

impl KeyDist {
    /// The name used on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            KeyDist::Uniform => "uniform",
            KeyDist::Zipf => "zipf",
        }
    }
}

/// Arguments of `pollbox load`. Defaults here are the same as [`LoadArgs::new`].
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8080 (only http, no path).
    #[arg(long)]
    pub url: String,

    /// Connections in total, spread over the threads.
    #[arg(long, short = 'c', default_value_t = 16)]
    pub connections: usize,

    /// Threads; each owns its share of the connections and its own event loop.
    #[arg(long, short = 't', default_value_t = 1)]
    pub threads: usize,

    /// Length of the measured run, e.g. 10s, 500ms, 2m.
    #[arg(long, short = 'd', default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,

    /// Open-loop: requests per second over all connections, latency measured from each
    /// request's intended send time. Without it the run is closed-loop.
    #[arg(long, short = 'R')]
    pub rate: Option<f64>,

    /// Weighted mix of operations: poll, ingest, batch, longpoll, poll_many,
    /// longpoll_many.
    #[arg(long, default_value = "poll:90,ingest:10", value_parser = Mix::parse)]
    pub mix: Mix,

    /// Number of distinct keys (`lg-0` .. `lg-<keys-1>`).
    #[arg(long, default_value_t = 1000)]
    pub keys: u32,

    /// Put the keys in this many rooms (docs/http.md#rooms): key n is
    /// `room-<n % rooms>/lg-<n>`. 0: no rooms, key n is `lg-<n>`.
    #[arg(long, default_value_t = 0)]
    pub rooms: u32,

    /// Key distribution.
    #[arg(long, value_enum, default_value_t = KeyDist::Uniform)]
    pub key_dist: KeyDist,

    /// Exponent s of the zipf distribution (weight of key n is 1/(n+1)^s).
    #[arg(long, default_value_t = 0.99)]
    pub zipf_exponent: f64,

    /// Size in bytes of each ingested message; cargo fields pad it to this size.
    #[arg(long, default_value_t = 512)]
    pub body_bytes: usize,

    /// Messages per `batch` request (POST /v1/ingest with a JSON array).
    #[arg(long, default_value_t = 10)]
    pub batch_size: usize,

    /// `wait_ms` sent with each long-poll (`longpoll` and `longpoll_many`).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub longpoll_wait: Duration,

    /// Keys of each `poll_many` and `longpoll_many` request (`GET /v1/boxes?keys=...`),
    /// distinct, at most `--keys` (the server takes at most its
    /// `limits.max_keys_per_request`, 64 by default). Each connection draws 4 such key
    /// sets when it starts and asks for one of them at random each time, with the
    /// last ETag it saw for that set as `If-None-Match`.
    #[arg(long, default_value_t = 20)]
    pub keys_per_request: usize,

    /// The `sse` operation: hold this many event streams open on the keys
    /// (subscriber i on key i % keys) while the mix runs, count their events and
    /// measure publish-to-receive latency (from the ingests of this run).
    #[arg(long, default_value_t = 0)]
    pub sse: usize,

    /// The `prefix_streams` operation: hold this many event streams of prefixes open
    /// (`GET /v1/boxes?prefix=P`, stream i on the prefix `--prefix` gives for i) while
    /// the mix runs; count their listings' boxes, `event: synced`, and the events after
    /// it, and measure publish-to-receive latency (from the ingests of this run).
    #[arg(long, default_value_t = 0)]
    pub prefix_streams: usize,

    /// Prefix of each of `--prefix-streams`: text with `{i}` (the stream's index) or
    /// `{i%M}` (the index modulo M), e.g. `room-{i%100}/`, `room-0/`, `watch-{i}/`;
    /// empty or ending with `/`, `:` or `.`. Default: `room-{i%<rooms>}/` (the rooms of
    /// `--rooms`), or every box (the empty prefix) without rooms.
    #[arg(long, value_parser = PrefixTemplate::parse)]
    pub prefix: Option<PrefixTemplate>,

    /// Presence (docs/presence.md): hold this many members present while the mix runs,
    /// each an event stream of `<room>~presence?member=m-<n>` (member n in the room
    /// `--presence-room` gives for n).
    #[arg(long, default_value_t = 0)]
    pub presence_members: usize,

    /// Members a second that leave (close their stream) while as many new ones join
    /// (the next ids, in the rooms of those they replace), from the start of the run;
    /// needs `--presence-members`.
    #[arg(long, default_value_t = 0.0)]
    pub presence_churn: f64,

    /// A join storm: at the start of the measured window (after `--warmup`), this many
    /// more members open their streams as fast as one thread connects them; the report
    /// says how long until all joined and every watcher saw them.
    #[arg(long, default_value_t = 0)]
    pub presence_storm: usize,

    /// Watchers of the rooms' presence: event streams of `<room>~presence` without
    /// `member=` (watcher i in the room `--presence-room` gives for i); the report gives
    /// their events/s, the bytes each received, and the last count they saw.
    #[arg(long, default_value_t = 0)]
    pub presence_watchers: usize,

    /// Room of presence member (and watcher) i, a template as `--prefix` takes:
    /// `room-0/` (one room), `room-{i%10}/`. Default: `room-{i%<rooms>}/` (the rooms
    /// of `--rooms`), or `room-0/` without rooms.
    #[arg(long, value_parser = PrefixTemplate::parse)]
    pub presence_room: Option<PrefixTemplate>,

    /// Requests in flight per connection (HTTP/1.1 pipelining depth).
    #[arg(long, default_value_t = 1)]
    pub pipeline: usize,

    /// Bearer token sent with ingest and batch requests (for `ingest_tokens`).
    #[arg(long)]
    pub token: Option<String>,

    /// Before the run, ingest one message into every key (over one connection, with
    /// batch requests) so polls find their box; these requests are reported apart.
    #[arg(long)]
    pub preseed: bool,

    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Write the full percentile spectrum (HdrHistogram text format, as wrk2 prints it)
    /// of all operations to this file, and of each operation to `<stem>.<op>.hgrm` next
    /// to it when the mix has more than one.
    #[arg(long)]
    pub hgrm: Option<PathBuf>,

    /// Draw latency by percentile as an SVG: one line per operation.
    #[arg(long)]
    pub plot: Option<PathBuf>,

    /// Fail (non-zero exit) when errors / requests is above this.
    #[arg(long, default_value_t = 0.01)]
    pub max_error_rate: f64,

    /// No progress line on stderr.
    #[arg(long, short = 'q')]
    pub quiet: bool,

    /// Load applied before the measured run and left out of the statistics.
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,

    /// Seed of the per-connection random generators (keys, operations, values).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

impl LoadArgs {
    /// The prefixes of `--prefix-streams`: `--prefix`, or each stream's room.
    pub fn prefix_template(&self) -> PrefixTemplate {
        self.prefix
            .clone()
            .unwrap_or_else(|| PrefixTemplate::default_for(self.rooms))
    }

    /// The rooms of the presence mix: `--presence-room`, or each member's room of
    /// `--rooms` (`room-0/` without rooms).
    pub fn presence_template(&self) -> PrefixTemplate {
        self.presence_room
            .clone()
            .unwrap_or_else(|| PrefixTemplate::default_for(self.rooms.max(1)))
    }

    /// Arguments with every default, for callers that build them in code (`pollbox demo`,
    /// tests). Keep in step with the `#[arg]` defaults above (a test checks it).
    pub fn new(url: impl Into<String>) -> LoadArgs {
        LoadArgs {
            url: url.into(),
            connections: 16,
            threads: 1,
            duration: Duration::from_secs(10),
            rate: None,
            mix: Mix::default(),
            keys: 1000,
            rooms: 0,
            key_dist: KeyDist::Uniform,
            zipf_exponent: 0.99,
            body_bytes: 512,
            batch_size: 10,
            longpoll_wait: Duration::from_secs(1),
            keys_per_request: 20,
            sse: 0,
            prefix_streams: 0,
            prefix: None,
            presence_members: 0,
            presence_churn: 0.0,
            presence_storm: 0,
            presence_watchers: 0,
            presence_room: None,
            pipeline: 1,
            token: None,
            preseed: false,
            json: None,
            hgrm: None,
            plot: None,
            max_error_rate: 0.01,
            quiet: false,
            warmup: None,
            seed: 0x5eed,
        }
    }
}

/// Parses a duration: a number followed by `ns`, `us`, `ms`, `s`, `m` or `h`; a bare
/// number is seconds. Fractions are allowed (`1.5s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(format!(
            "invalid duration {text:?}: expected a number, e.g. 10s"
        ));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}: {number:?} is not a number"))?;
    let seconds_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "invalid duration {text:?}: unknown unit {other:?} (use ns, us, ms, s, m, h)"
            ))
        }
    };
    Duration::try_from_secs_f64(value * seconds_per_unit)
        .map_err(|_| format!("invalid duration {text:?}: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("7ns"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration(" 20 s "), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_are_refused_with_a_reason() {
        for bad in ["", "s", "10x", "ten", "1..2s", "-1s", "10 sec"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
    }
}
