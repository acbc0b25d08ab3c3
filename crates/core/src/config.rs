//! The configuration file (docs/config.md): TOML, every key defaulted, unknown keys
//! rejected, values validated with messages that name the key.
//!
//! The embedded default is `config/pollbox.toml` itself (`include_str!`), so the
//! file in the repository and the binary's default can never drift apart.

pub use crate::auth::{AuthConfig, JwtConfig, ReadAccess, StaticTokenConfig};
pub use crate::presence::PresenceConfig;
use pollbox_table::config::invalid;
pub use pollbox_table::config::{
    largest_payload, parse_pointer, BoxesConfig, ConfigError, FieldConfig, FieldType, Reduce,
    MAX_TTL_S,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The default configuration, byte for byte `config/pollbox.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../../config/pollbox.toml");

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub http: HttpConfig,
    pub auth: AuthConfig,
    pub boxes: BoxesConfig,
    pub snapshot: SnapshotConfig,
    pub wal: WalConfig,
    pub log: LogConfig,
    pub presence: PresenceConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    /// 0 = one per core.
    pub workers: usize,
    pub pin_workers: bool,
    /// Serve an accepted connection on the least loaded worker (docs/operations.md#workers);
    /// false: where the listeners' hash put it.
    pub place_by_load: bool,
    pub epoch_ms: u64,
    /// "" = `/metrics` on the main listener.
    pub metrics_listen: String,
    /// The io_uring loop: each loop turn's responses go out, and the wait for the
    /// next events happens, in one `io_uring_enter` instead of one `send` per
    /// connection and an `epoll_wait`. Fewer syscalls and less CPU at saturation,
    /// a few µs more latency below it (BENCHMARKS.md, "The server side by side"), so off by default. Falls
    /// back to `send` where the kernel refuses io_uring.
    pub io_uring: bool,
    /// Proxies (CIDRs, IPv4 or IPv6; a bare address is one host) whose PROXY
    /// protocol v2 header or `X-Forwarded-For` names the client the per-client
    /// limits count (docs/private-boxes.md#per-client-limits). Empty: the client
    /// is always the socket's peer.
    pub trusted_proxies: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub max_connections: usize,
    pub max_body_bytes: usize,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub max_wait_ms: u64,
    /// The most keys one `GET /v1/boxes?keys=...` may name.
    pub max_keys_per_request: usize,
    /// The most boxes one page of a prefix (`GET /v1/boxes?prefix=P`) holds.
    pub max_page_boxes: usize,
    /// Open event streams of a prefix on the node (beyond: 503).
    pub max_prefix_streams: usize,
    pub arena_limit_bytes: usize,
    /// All connections' buffers together (read buffers, send queues).
    pub max_buffered_bytes: usize,
    /// Open connections of one client (0: no cap).
    pub max_connections_per_ip: usize,
    /// Open event streams and parked long-polls of one client (0: no cap).
    pub max_streams_per_ip: usize,
    /// Requests a second of one client, a token bucket (0: no rate limit).
    pub requests_per_s_per_ip: u64,
    /// The bucket's size: requests one client may send at once (0: as many
    /// as `requests_per_s_per_ip`).
    pub requests_burst_per_ip: u64,
}

/// What browsers see (docs/http.md#event-streams, docs/http.md#cors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Origins whose pages may call pollbox (CORS): `["*"]` for any, or exact
    /// origins (`"https://game.example"`). Empty = no CORS headers, `OPTIONS`
    /// is 405.
    pub cors_origins: Vec<String>,
    /// An event stream with nothing to say sends a comment line this often, so
    /// proxies do not close it as idle.
    pub sse_heartbeat_ms: u64,
    /// The `retry:` an event stream starts with: how long an `EventSource`
    /// waits before it reconnects.
    pub sse_retry_ms: u64,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            cors_origins: Vec::new(),
            sse_heartbeat_ms: 15_000,
            sse_retry_ms: 1_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// "" = no persistence.
    pub path: String,
    pub interval_s: u64,
    /// A new base (a compaction) once the chain's deltas pass this share of
    /// the base's bytes, in percent; 0: a full snapshot every interval.
    pub compact_percent: u32,
}

/// `[wal]`: with `path` set a standalone node writes each accepted message
/// to a write-ahead file and answers once it is synced
/// (docs/operations.md#the-write-ahead-file); empty, snapshots alone keep
/// the boxes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WalConfig {
    /// The directory of the segments; "" = no write-ahead file.
    pub path: String,
    /// A segment is closed and a new one begun once it holds this many bytes
    /// (a batch is never split: a segment can pass it by one write).
    pub segment_bytes: u64,
    /// How long an ingest waits for its records to be synced and applied
    /// before it answers 503.
    pub sync_timeout_ms: u64,
}

impl WalConfig {
    /// Whether the write-ahead file is on.
    pub fn enabled(&self) -> bool {
        !self.path.is_empty()
    }
}

impl Default for WalConfig {
    fn default() -> Self {
        Self {
            path: String::new(),
            segment_bytes: 64 << 20,
            sync_timeout_ms: 5000,
        }
    }
}

/// `[log]`: with `brokers` set the node is a replica built from a Kafka topic
/// (docs/operations.md#the-kafka-log); empty, it stands alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// "" = standalone; `host:9092,host2:9092` = the log's bootstrap brokers.
    pub brokers: String,
    pub topic: String,
    /// How long an ingest waits for the log's acknowledgement and the local
    /// apply before it answers 503.
    pub ack_timeout_ms: u64,
    /// Kafka client properties passed to the producer and the consumer as
    /// they are (`security.protocol`, `sasl.*`, `ssl.*`, `compression.type`,
    /// ...), but for the few pollbox sets itself ([`RESERVED_CLIENT_KEYS`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub client: BTreeMap<String, String>,
    /// A file of more client properties, `key=value` a line (`#` comments and
    /// blank lines skipped), over `[log.client]`: SASL passwords and key
    /// files from a Secret. Read at start; "" = none.
    pub client_file: String,
    /// Accept a topic that can lose acknowledged records (replication
    /// factor below 3, `min.insync.replicas` below 2, unclean leader
    /// election, compaction): development on one broker. Logged at start
    /// and exported (`pollbox_log_unsafe_topic`).
    pub allow_unsafe_topic: bool,
    /// Consuming threads, each with its own client and the partitions
    /// `p` with `p % consumers == its number` (a key's records stay in one
    /// thread, in order). 0 = min(partitions, cores); more than the
    /// partitions are as many as the partitions.
    pub consumers: usize,
}

/// Client properties pollbox sets itself, because what it promises rests on
/// them: acknowledged by every in-sync replica, written once, records of a
/// key in one partition, every partition read by every node, every
/// record's delivery report (it brings the offset an answer waits for).
pub const RESERVED_CLIENT_KEYS: &[&str] = &[
    "bootstrap.servers",
    "acks",
    "enable.idempotence",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "partitioner",
    "isolation.level",
    "delivery.report.only.error",
];

impl LogConfig {
    /// Whether a log is configured (else the node stands alone).
    pub fn enabled(&self) -> bool {
        !self.brokers.trim().is_empty()
    }

    /// The consuming threads for a topic of `partitions` on `cores` cores:
    /// `consumers`, or min(partitions, cores) for 0; at least one, at most
    /// one a partition.
    pub fn consuming_threads(&self, partitions: usize, cores: usize) -> usize {
        let asked = match self.consumers {
            0 => cores,
            n => n,
        };
        asked.min(partitions).max(1)
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            brokers: String::new(),
            topic: "pollbox".into(),
            ack_timeout_ms: 5000,
            client: BTreeMap::new(),
            client_file: String::new(),
            allow_unsafe_topic: false,
            consumers: 0,
        }
    }
}

/// What `check-config` prints for a secret.
pub const REDACTED: &str = "<redacted>";

/// Whether a client property's value is a secret (`check-config` prints
/// `"<redacted>"` for it).
pub fn is_secret_property(key: &str) -> bool {
    key.contains("password")
        || key.contains("secret")
        || (key.starts_with("sasl.") && key.ends_with(".config"))
        || key == "ssl.key.pem"
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            workers: 0,
            pin_workers: false,
            place_by_load: true,
            epoch_ms: 16,
            metrics_listen: String::new(),
            io_uring: false,
            trusted_proxies: Vec::new(),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_body_bytes: 1_048_576,
            max_header_bytes: 8192,
            max_headers: 64,
            header_timeout_ms: 5000,
            body_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            max_wait_ms: 30_000,
            max_keys_per_request: 64,
            max_page_boxes: 1000,
            max_prefix_streams: 10_000,
            arena_limit_bytes: 67_108_864,
            max_buffered_bytes: 268_435_456,
            max_connections_per_ip: 0,
            max_streams_per_ip: 0,
            requests_per_s_per_ip: 0,
            requests_burst_per_ip: 0,
        }
    }
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            path: String::new(),
            interval_s: 10,
            compact_percent: 25,
        }
    }
}

impl Config {
    /// The embedded default (`config/pollbox.toml`).
    pub fn embedded() -> Config {
        // The embedded file is checked by a unit test; failing here is a build defect.
        Config::from_toml(DEFAULT_TOML).expect("embedded default config is valid")
    }

    /// Parse and validate a TOML document.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| {
            // toml's message names the key; say where it is, on one line.
            let at = e.span().map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let line_start = before.rfind('\n').map_or(0, |i| i + 1);
                let column = before.len() - line_start + 1;
                let source = text[line_start..].lines().next().unwrap_or("").trim();
                (
                    format!("line {line}, column {column}: "),
                    format!(" (in `{source}`)"),
                )
            });
            let (at, source) = at.unwrap_or_default();
            ConfigError::Parse(format!(
                "{at}{}{source}",
                e.message().trim().replace('\n', " ")
            ))
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Check every value that types alone cannot. The first value found wrong
    /// is the error, in the order of the sections here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_server()?;
        self.check_request_limits()?;
        self.check_http()?;
        if self.limits.max_buffered_bytes < 1 << 20 {
            return Err(invalid(
                "limits.max_buffered_bytes",
                "must be at least 1048576",
            ));
        }
        self.check_client_limits()?;
        self.auth.validate()?;
        self.boxes.validate()?;
        if self.snapshot.interval_s == 0 {
            return Err(invalid("snapshot.interval_s", "must be greater than 0"));
        }
        if self.snapshot.compact_percent > 100 {
            return Err(invalid(
                "snapshot.compact_percent",
                "must be 0 (a full snapshot every interval) to 100",
            ));
        }
        self.check_wal()?;
        self.presence.validate()?;
        self.log.validate()
    }

    /// `[wal]`: its sizes, and that it goes with a snapshot and not a log.
    fn check_wal(&self) -> Result<(), ConfigError> {
        let w = &self.wal;
        if !(4096..=1 << 30).contains(&w.segment_bytes) {
            return Err(invalid("wal.segment_bytes", "must be 4096 to 1073741824"));
        }
        if !(1..=600_000).contains(&w.sync_timeout_ms) {
            return Err(invalid("wal.sync_timeout_ms", "must be 1 to 600000"));
        }
        if w.enabled() && self.log.enabled() {
            return Err(invalid(
                "wal.path",
                "a node of a log ([log] brokers) is durable in the log: set wal.path or \
                 log.brokers, not both",
            ));
        }
        if w.enabled() && self.snapshot.path.is_empty() {
            return Err(invalid(
                "wal.path",
                "needs snapshot.path: snapshots bound the write-ahead file (the segments \
                 a snapshot covers are deleted)",
            ));
        }
        Ok(())
    }

    /// Whether HTTP ingest is written elsewhere first and answered once it
    /// is back applied: to the Kafka log, or to the write-ahead file.
    pub fn ingest_waits(&self) -> bool {
        self.log.enabled() || self.wal.enabled()
    }

    /// How long a waiting ingest waits ([`Config::ingest_waits`]).
    pub fn ingest_wait_ms(&self) -> u64 {
        if self.wal.enabled() {
            self.wal.sync_timeout_ms
        } else {
            self.log.ack_timeout_ms
        }
    }

    /// `[server]`: the listen addresses, the workers, the epoch.
    fn check_server(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if !is_host_port(&s.listen) {
            return Err(invalid(
                "server.listen",
                format!(
                    "`{}` is not an address like 127.0.0.1:8080 or localhost:8080",
                    s.listen
                ),
            ));
        }
        if !s.metrics_listen.is_empty() && !is_host_port(&s.metrics_listen) {
            return Err(invalid(
                "server.metrics_listen",
                format!(
                    "`{}` is not an address like 127.0.0.1:9090 or localhost:9090",
                    s.metrics_listen
                ),
            ));
        }
        if s.workers > 1024 {
            return Err(invalid(
                "server.workers",
                "must be 0 (one per core) to 1024",
            ));
        }
        if !(1..=1000).contains(&s.epoch_ms) {
            return Err(invalid("server.epoch_ms", "must be 1 to 1000"));
        }
        Ok(())
    }

    /// `[limits]` that bound one request and one connection.
    fn check_request_limits(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let positive = [
            ("limits.max_connections", l.max_connections as u64),
            ("limits.max_body_bytes", l.max_body_bytes as u64),
            ("limits.max_header_bytes", l.max_header_bytes as u64),
            ("limits.max_headers", l.max_headers as u64),
            ("limits.header_timeout_ms", l.header_timeout_ms),
            ("limits.body_timeout_ms", l.body_timeout_ms),
            ("limits.idle_timeout_ms", l.idle_timeout_ms),
            ("limits.max_keys_per_request", l.max_keys_per_request as u64),
            ("limits.max_page_boxes", l.max_page_boxes as u64),
            ("limits.arena_limit_bytes", l.arena_limit_bytes as u64),
        ];
        for (key, v) in positive {
            if v == 0 {
                return Err(invalid(key, "must be greater than 0"));
            }
        }
        if l.max_header_bytes < 64 {
            return Err(invalid("limits.max_header_bytes", "must be at least 64"));
        }
        if l.max_headers > 1024 {
            return Err(invalid("limits.max_headers", "must be at most 1024"));
        }
        if l.max_keys_per_request > 1024 {
            return Err(invalid(
                "limits.max_keys_per_request",
                "must be at most 1024",
            ));
        }
        if l.max_page_boxes > 10_000 {
            return Err(invalid("limits.max_page_boxes", "must be at most 10000"));
        }
        if l.arena_limit_bytes < 64 * 1024 {
            return Err(invalid(
                "limits.arena_limit_bytes",
                "must be at least 65536",
            ));
        }
        Ok(())
    }

    /// `[http]`: the heartbeat and the CORS origins.
    fn check_http(&self) -> Result<(), ConfigError> {
        if self.http.sse_heartbeat_ms == 0 {
            return Err(invalid("http.sse_heartbeat_ms", "must be greater than 0"));
        }
        for (i, o) in self.http.cors_origins.iter().enumerate() {
            if let Err(reason) = check_origin(o, self.http.cors_origins.len()) {
                return Err(invalid(format!("http.cors_origins[{i}]"), reason));
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML, in the layout of `config/pollbox.toml`.
    pub fn to_toml(&self) -> String {
        // Serialising our own plain structs cannot fail.
        toml::to_string(self).unwrap_or_else(|e| {
            let mut s = String::new();
            let _ = write!(s, "# could not render config: {e}");
            s
        })
    }

    /// The same configuration with its secrets (ingest and metrics tokens,
    /// secret Kafka client properties) replaced by `"<redacted>"`, for
    /// printing (`check-config`).
    pub fn redacted(&self) -> Config {
        let mut c = self.clone();
        let hide = |v: &mut Vec<String>| v.iter_mut().for_each(|t| *t = REDACTED.into());
        hide(&mut c.auth.ingest_tokens);
        hide(&mut c.auth.metrics_tokens);
        for t in c.auth.token.iter_mut() {
            // A token read from its file is printed as the file it came from.
            t.token = match t.token_file.is_empty() {
                true => REDACTED.into(),
                false => String::new(),
            };
        }
        for (k, v) in c.log.client.iter_mut() {
            if is_secret_property(k) {
                *v = REDACTED.into();
            }
        }
        c
    }

    /// Number of worker threads to run: `workers`, or `cores` (the caller
    /// counts them; the core does not ask the OS) when 0.
    pub fn effective_workers(&self, cores: usize) -> usize {
        if self.server.workers > 0 {
            self.server.workers
        } else {
            cores
        }
    }
}

impl Config {
    /// `server.trusted_proxies` and the per-client limits of `[limits]`.
    fn check_client_limits(&self) -> Result<(), ConfigError> {
        for (i, p) in self.server.trusted_proxies.iter().enumerate() {
            if let Err(reason) = crate::clients::Cidr::parse(p) {
                return Err(invalid(format!("server.trusted_proxies[{i}]"), reason));
            }
        }
        let l = &self.limits;
        for (key, v) in [
            (
                "limits.max_connections_per_ip",
                l.max_connections_per_ip as u64,
            ),
            ("limits.max_streams_per_ip", l.max_streams_per_ip as u64),
            ("limits.requests_per_s_per_ip", l.requests_per_s_per_ip),
            ("limits.requests_burst_per_ip", l.requests_burst_per_ip),
        ] {
            if v > MAX_PER_CLIENT {
                return Err(invalid(
                    key,
                    format!("must be 0 (no limit) to {MAX_PER_CLIENT}"),
                ));
            }
        }
        if l.requests_burst_per_ip > 0 && l.requests_per_s_per_ip == 0 {
            return Err(invalid(
                "limits.requests_burst_per_ip",
                "a bucket without a rate limits nothing: set limits.requests_per_s_per_ip too",
            ));
        }
        Ok(())
    }
}

impl LimitsConfig {
    /// The per-client limits ([`crate::clients::ClientLimits`]).
    pub fn client_limits(&self) -> crate::clients::ClientLimits {
        crate::clients::ClientLimits::new(
            self.max_connections_per_ip,
            self.max_streams_per_ip,
            self.requests_per_s_per_ip,
            self.requests_burst_per_ip,
        )
    }
}

/// What bounds one request (the framer's limits).
impl From<&LimitsConfig> for crate::http::Limits {
    fn from(l: &LimitsConfig) -> Self {
        crate::http::Limits {
            max_header_bytes: l.max_header_bytes,
            max_headers: l.max_headers,
            max_body_bytes: l.max_body_bytes,
        }
    }
}

/// The largest per-client limit: a million connections, streams or requests
/// a second of one address is already no limit.
pub const MAX_PER_CLIENT: u64 = 1_000_000;

impl LogConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.topic;
        // Kafka's own rule for topic names.
        if t.is_empty()
            || t.len() > 249
            || t == "."
            || t == ".."
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(invalid(
                "log.topic",
                format!("`{t}` is not a Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)"),
            ));
        }
        if !(1..=600_000).contains(&self.ack_timeout_ms) {
            return Err(invalid("log.ack_timeout_ms", "must be 1 to 600000"));
        }
        if self.consumers > 1024 {
            return Err(invalid("log.consumers", "must be 0 (one a core) to 1024"));
        }
        if self.enabled() {
            for b in self.brokers.split(',') {
                let b = b.trim();
                let port = b
                    .rsplit_once(':')
                    .map(|(host, port)| (host, port.parse::<u16>()));
                if !matches!(port, Some((host, Ok(p))) if !host.is_empty() && p > 0) {
                    return Err(invalid(
                        "log.brokers",
                        format!(
                            "`{b}` is not a broker like kafka-1:9092 (a list: comma-separated)"
                        ),
                    ));
                }
            }
        }
        for key in self.client.keys() {
            if RESERVED_CLIENT_KEYS.contains(&key.as_str()) {
                return Err(invalid(
                    format!("log.client.\"{key}\""),
                    "pollbox sets this itself (docs/config.md#log)",
                ));
            }
        }
        Ok(())
    }
}

/// Secrets read from files at start (`auth.*_tokens_file`, `log.client_file`)
/// join the configuration here; the caller reads the files (the core reads
/// none). `what` names the file in messages.
impl Config {
    /// Add the tokens of a tokens file (one a line, `#` comments and blank
    /// lines skipped) to `auth.ingest_tokens` (`metrics`: `metrics_tokens`).
    /// A file without a token is refused: it would leave the route open.
    pub fn add_tokens(&mut self, metrics: bool, text: &str, what: &str) -> Result<(), ConfigError> {
        let key = if metrics {
            "auth.metrics_tokens_file"
        } else {
            "auth.ingest_tokens_file"
        };
        let tokens: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect();
        if tokens.is_empty() {
            return Err(invalid(key, format!("{what} holds no token")));
        }
        let list = if metrics {
            &mut self.auth.metrics_tokens
        } else {
            &mut self.auth.ingest_tokens
        };
        list.extend(tokens);
        self.validate()
    }

    /// The JWKS `auth.jwt.keys_file` holds: checked (every key usable, each
    /// bound to its algorithm) and kept for the node.
    pub fn add_jwks(&mut self, text: &str, what: &str) -> Result<(), ConfigError> {
        crate::auth::KeySet::from_jwks(text)
            .map_err(|e| invalid("auth.jwt.keys_file", format!("{what}: {e}")))?;
        self.auth.jwt.keys = text.into();
        Ok(())
    }

    /// The token `auth.token[i].token_file` holds (its first line that is not
    /// blank or a `#` comment).
    pub fn add_static_token(
        &mut self,
        i: usize,
        text: &str,
        what: &str,
    ) -> Result<(), ConfigError> {
        let key = format!("auth.token[{i}].token_file");
        let token = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| invalid(&key, format!("{what} holds no token")))?;
        let Some(t) = self.auth.token.get_mut(i) else {
            return Err(invalid(key, "no such [[auth.token]]"));
        };
        t.token = token.into();
        t.token_file.clear();
        let checked = self.validate();
        if let Some(t) = self.auth.token.get_mut(i) {
            // Printed configs say where the token came from.
            t.token_file = what.into();
        }
        checked
    }

    /// Add the properties of a client file (`key=value` a line, `#` comments
    /// and blank lines skipped) to `[log.client]`, over what it holds.
    pub fn add_client_properties(&mut self, text: &str, what: &str) -> Result<(), ConfigError> {
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(invalid(
                    "log.client_file",
                    format!("{what} line {}: not key=value", n + 1),
                ));
            };
            self.log.client.insert(k.trim().into(), v.trim().into());
        }
        self.validate()
    }
}

/// `ip:port`, `[ipv6]:port` or `name:port` (the name is resolved when the
/// server binds, as other servers do).
fn is_host_port(a: &str) -> bool {
    if a.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = a.rsplit_once(':') else {
        return false;
    };
    port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// A `cors_origins` entry: `*` alone, or an origin as browsers send it in the
/// `Origin` header (`scheme://host[:port]`, no path, no trailing slash), so it
/// can be compared byte for byte.
fn check_origin(o: &str, entries: usize) -> Result<(), String> {
    if o == "*" {
        return if entries == 1 {
            Ok(())
        } else {
            Err("`*` allows every origin: list it alone".into())
        };
    }
    let Some((scheme, authority)) = o.split_once("://") else {
        return Err(format!(
            "`{o}` is not an origin like https://game.example (scheme://host[:port])"
        ));
    };
    if scheme != "http" && scheme != "https" {
        return Err(format!("`{o}`: the scheme must be http or https"));
    }
    let valid_byte = |b: u8| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b);
    if authority.is_empty() || !authority.bytes().all(valid_byte) {
        return Err(format!(
            "`{o}` is not an origin like https://game.example (scheme://host[:port], no path, no trailing slash)"
        ));
    }
    if o.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "`{o}`: write it in lower case, as browsers send it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consuming_threads_default_to_one_a_core_and_never_exceed_the_partitions() {
        let mut l = LogConfig::default();
        assert_eq!(l.consuming_threads(4, 2), 2);
        assert_eq!(l.consuming_threads(4, 16), 4);
        assert_eq!(l.consuming_threads(1, 16), 1);
        l.consumers = 3;
        assert_eq!(l.consuming_threads(4, 16), 3);
        assert_eq!(l.consuming_threads(2, 16), 2);
        l.consumers = 1;
        assert_eq!(l.consuming_threads(8, 16), 1);
    }

    #[test]
    fn request_limits_from_config() {
        let l = crate::http::Limits::from(&LimitsConfig::default());
        assert_eq!(l, crate::http::Limits::default());
    }

    #[test]
    fn per_client_limits_and_trusted_proxies() {
        let c = Config::embedded();
        assert!(c.server.trusted_proxies.is_empty());
        let l = &c.limits;
        assert_eq!(
            (
                l.max_connections_per_ip,
                l.max_streams_per_ip,
                l.requests_per_s_per_ip,
                l.requests_burst_per_ip
            ),
            (0, 0, 0, 0),
            "off by default"
        );
        let c = Config::from_toml(
            "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"127.0.0.1\", \"fd00::/8\"]\n\
             [limits]\nmax_connections_per_ip = 100\nmax_streams_per_ip = 20\n\
             requests_per_s_per_ip = 50\nrequests_burst_per_ip = 200\n",
        )
        .unwrap();
        assert_eq!(c.server.trusted_proxies.len(), 3);
        assert_eq!(c.limits.requests_burst_per_ip, 200);
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
        for (doc, key, says) in [
            (
                "[server]\ntrusted_proxies = [\"10.0.0.0/8\", \"10.0.0.1/8\"]\n",
                "server.trusted_proxies[1]",
                "write 10.0.0.0/8",
            ),
            (
                "[server]\ntrusted_proxies = [\"haproxy\"]\n",
                "server.trusted_proxies[0]",
                "not an address",
            ),
            (
                "[server]\ntrusted_proxies = [\"::1/200\"]\n",
                "server.trusted_proxies[0]",
                "0 to 128",
            ),
            (
                "[limits]\nrequests_burst_per_ip = 10\n",
                "limits.requests_burst_per_ip",
                "requests_per_s_per_ip",
            ),
            (
                "[limits]\nrequests_per_s_per_ip = 1000001\n",
                "limits.requests_per_s_per_ip",
                "0 (no limit) to 1000000",
            ),
            (
                "[limits]\nmax_streams_per_ip = 2000000\n",
                "limits.max_streams_per_ip",
                "to 1000000",
            ),
            (
                "[limits]\nmax_connections_per_ip = -1\n",
                "max_connections_per_ip",
                "",
            ),
        ] {
            let e = Config::from_toml(doc).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{doc:?} -> {e}");
        }
    }

    #[test]
    fn embedded_default_equals_code_default() {
        assert_eq!(Config::embedded(), Config::default());
    }

    #[test]
    fn the_durable_example_is_valid_and_keeps_what_it_acknowledges() {
        let c = Config::from_toml(include_str!("../../../config/durable.toml")).unwrap();
        assert!(c.wal.enabled() && !c.snapshot.path.is_empty());
        assert!(c.ingest_waits());
        assert!(!Config::embedded().wal.enabled(), "off by default");
    }

    #[test]
    fn a_write_ahead_file_needs_a_snapshot_and_no_log() {
        for (text, why) in [
            ("[wal]\npath = \"w\"\n", "needs snapshot.path"),
            (
                "[snapshot]\npath = \"s\"\n[wal]\npath = \"w\"\n[log]\nbrokers = \"k:9092\"\n",
                "not both",
            ),
            ("[wal]\nsegment_bytes = 100\n", "wal.segment_bytes"),
            ("[wal]\nsync_timeout_ms = 0\n", "wal.sync_timeout_ms"),
            ("[wal]\nfsync = true\n", "fsync"),
        ] {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn zero_workers_means_one_per_core_the_caller_counted() {
        let mut cfg = Config::default();
        assert_eq!(cfg.server.workers, 0);
        assert_eq!(cfg.effective_workers(6), 6);
        cfg.server.workers = 3;
        assert_eq!(cfg.effective_workers(6), 3);
    }

    #[test]
    fn effective_config_round_trips() {
        let cfg = Config::embedded();
        let again = Config::from_toml(&cfg.to_toml()).unwrap();
        assert_eq!(cfg, again);
    }

    #[test]
    fn empty_document_is_the_default() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::from_toml("[server]\nlisten = \"127.0.0.1:1\"\nlisen = 3\n").unwrap_err();
        assert!(e.to_string().contains("lisen"), "{e}");
        let e = Config::from_toml("[serverx]\n").unwrap_err();
        assert!(e.to_string().contains("serverx"), "{e}");
        let e =
            Config::from_toml("[[boxes.field]]\nname = \"a\"\nreduce = \"count\"\ncolour = 1\n")
                .unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            ("[server]\nlisten = \"nowhere\"\n", "server.listen"),
            ("[server]\nepoch_ms = 0\n", "server.epoch_ms"),
            ("[limits]\nmax_body_bytes = 0\n", "limits.max_body_bytes"),
            ("[boxes]\nmax_key_bytes = 0\n", "boxes.max_key_bytes"),
            ("[snapshot]\ninterval_s = 0\n", "snapshot.interval_s"),
            ("[snapshot]\ncompact_percent = 101\n", "snapshot.compact_percent"),
            ("[log]\ntopic = \"a/b\"\n", "log.topic"),
            ("[log]\ntopic = \"\"\n", "log.topic"),
            ("[log]\nack_timeout_ms = 0\n", "log.ack_timeout_ms"),
            ("[log]\nconsumers = 1025\n", "log.consumers"),
            ("[log]\nbrokers = \"kafka-1\"\n", "log.brokers"),
            ("[log]\nbrokers = \"a:9092,:9092\"\n", "log.brokers"),
            (
                "[log]\nbrokers = \"a:9092\"\n[log.client]\n\"acks\" = \"1\"\n",
                "log.client.\"acks\"",
            ),
            ("[boxes]\nttl_s = 2147483648\n", "boxes.ttl_s"),
            (
                "[http]\ncors_origins = [\"game.example\"]\n",
                "http.cors_origins[0]",
            ),
            (
                "[http]\ncors_origins = [\"https://a.example\", \"https://b.example/\"]\n",
                "http.cors_origins[1]",
            ),
            (
                "[http]\ncors_origins = [\"ftp://a.example\"]\n",
                "http.cors_origins[0]",
            ),
            (
                "[http]\ncors_origins = [\"https://A.example\"]\n",
                "http.cors_origins[0]",
            ),
            (
                "[http]\ncors_origins = [\"*\", \"https://a.example\"]\n",
                "http.cors_origins[0]",
            ),
            (
                "[[boxes.field]]\nname = \"a\"\npath = \"value\"\ntype = \"i64\"\nreduce = \"last\"\n",
                "boxes.field[0].path",
            ),
            (
                "[[boxes.field]]\nname = \"a\"\npath = \"/s\"\ntype = \"str\"\nreduce = \"last\"\n",
                "boxes.field[0].max_len",
            ),
            (
                "[[boxes.field]]\nname = \"a\"\npath = \"/s\"\ntype = \"bool\"\nreduce = \"sum\"\n",
                "boxes.field[0].reduce",
            ),
            (
                "[[boxes.field]]\nname = \"a\"\nreduce = \"count\"\n[[boxes.field]]\nname = \"a\"\nreduce = \"count\"\n",
                "boxes.field[1].name",
            ),
            (
                "[[boxes.field]]\nname = \"ver\"\nreduce = \"count\"\n",
                "boxes.field[0].name",
            ),
        ];
        for (doc, key) in cases {
            let e = Config::from_toml(doc).unwrap_err();
            assert!(e.to_string().contains(key), "{doc:?} -> {e}");
        }
        let e = Config::from_toml("[limits]\nmax_body_bytes = \"big\"\n").unwrap_err();
        assert!(e.to_string().contains("max_body_bytes"), "{e}");
        let e =
            Config::from_toml("[[boxes.field]]\nname = \"a\"\nreduce = \"median\"\n").unwrap_err();
        assert!(e.to_string().contains("median"), "{e}");
    }

    #[test]
    fn origins_and_ttl_that_are_accepted() {
        let c = Config::from_toml(
            "[http]\ncors_origins = [\"https://game.example\", \"http://127.0.0.1:8081\", \"http://[::1]:9\"]\n\
             [boxes]\nttl_s = 86400\n",
        )
        .unwrap();
        assert_eq!(c.http.cors_origins.len(), 3);
        assert_eq!(c.boxes.ttl_s, 86400);
        let c = Config::from_toml("[http]\ncors_origins = [\"*\"]\n").unwrap();
        assert_eq!(c.http.cors_origins, ["*"]);
    }

    #[test]
    fn pointers_unescape() {
        assert_eq!(parse_pointer("/a/b").unwrap(), vec!["a", "b"]);
        assert_eq!(parse_pointer("/a~1b/c~0d").unwrap(), vec!["a/b", "c~d"]);
        assert!(parse_pointer("/a~2").is_err());
        assert!(parse_pointer("a").is_err());
    }

    #[test]
    fn a_log_with_client_properties_is_read_and_printed_back() {
        let text = "[log]\nbrokers = \"k1:9092, k2:9092\"\ntopic = \"scores.v1\"\n\
                    [log.client]\n\"security.protocol\" = \"SASL_SSL\"\n\
                    \"sasl.password\" = \"hunter2\"\n";
        let cfg = Config::from_toml(text).unwrap();
        assert!(cfg.log.enabled());
        assert_eq!(cfg.log.topic, "scores.v1");
        assert_eq!(cfg.log.client["security.protocol"], "SASL_SSL");
        assert!(is_secret_property("sasl.password"));
        assert!(!is_secret_property("security.protocol"));
        let again = Config::from_toml(&cfg.to_toml()).unwrap();
        assert_eq!(again, cfg);
        let shown = cfg.redacted().to_toml();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("SASL_SSL"), "{shown}");
        assert!(!Config::embedded().log.enabled());
    }

    #[test]
    fn a_count_with_a_path_is_refused() {
        let text =
            "[[boxes.field]]\nname = \"hits\"\npath = \"/x\"\ntype = \"i64\"\nreduce = \"count\"\n";
        let e = Config::from_toml(text).unwrap_err().to_string();
        assert!(e.contains("boxes.field[0].path"), "{e}");
        assert!(e.contains("reads no path"), "{e}");
    }

    #[test]
    fn fields_that_cannot_fit_the_payload_limit_are_found_at_check_time() {
        let field = |n: usize| {
            format!("[[boxes.field]]\nname = \"s{n}\"\npath = \"/s{n}\"\ntype = \"str\"\nmax_len = 120\nreduce = \"last\"\n")
        };
        let three: String = (0..3).map(field).collect();
        let e = Config::from_toml(&three).unwrap_err().to_string();
        assert!(e.contains("boxes.max_payload_bytes"), "{e}");
        assert!(e.contains("419 bytes"), "{e}");
        let raised = format!("[boxes]\nmax_payload_bytes = 512\n{three}");
        assert!(Config::from_toml(&raised).is_ok());
        // The default's largest payload leaves room for a key.
        assert!(largest_payload(&Config::embedded().boxes) < 256 - 100);
    }

    #[test]
    fn tokens_and_client_properties_come_from_files_too() {
        let mut c = Config::embedded();
        c.add_tokens(false, "# ingest\n\n  tok-a  \ntok-b\n", "ingest.txt")
            .unwrap();
        assert_eq!(c.auth.ingest_tokens, ["tok-a", "tok-b"]);
        let e = c
            .add_tokens(true, "# nothing\n\n", "metrics.txt")
            .unwrap_err();
        assert!(e.to_string().contains("metrics.txt holds no token"), "{e}");
        let e = c.add_tokens(true, "has space\n", "m.txt").unwrap_err();
        assert!(e.to_string().contains("auth.metrics_tokens[0]"), "{e}");
        let mut c = Config::embedded();
        c.log.client.insert("sasl.username".into(), "u".into());
        c.add_client_properties(
            "# kafka\nsasl.password = s3cret\nsasl.username=v\n",
            "k.properties",
        )
        .unwrap();
        assert_eq!(c.log.client["sasl.password"], "s3cret");
        assert_eq!(c.log.client["sasl.username"], "v", "the file wins");
        assert!(!c.redacted().to_toml().contains("s3cret"));
        let e = c
            .add_client_properties("acks=1\n", "k.properties")
            .unwrap_err();
        assert!(e.to_string().contains("log.client.\"acks\""), "{e}");
        let e = c
            .add_client_properties("nonsense\n", "k.properties")
            .unwrap_err();
        assert!(e.to_string().contains("k.properties line 1"), "{e}");
    }

    #[test]
    fn auth_keys_with_their_defaults() {
        let c = Config::embedded();
        assert_eq!(c.auth.read, ReadAccess::Public);
        assert_eq!(c.auth.jwt, JwtConfig::default());
        assert_eq!(c.auth.jwt.leeway_s, 30);
        assert_eq!(c.auth.jwt.cookie, "pollbox_token");
        assert!(!c.auth.jwt.query_param && c.auth.token.is_empty());
        assert!(!c.auth.writes_need_token() && !c.auth.scoped_tokens());
        let text =
            "[auth]\nread = \"token\"\n[auth.jwt]\nkeys_file = \"k.json\"\nissuer = \"game\"\n\
                    audience = \"pollbox\"\nleeway_s = 5\ncookie = \"\"\nquery_param = true\n\
                    [[auth.token]]\ntoken = \"dash\"\nread = [\"*\"]\n\
                    [[auth.token]]\ntoken_file = \"t.txt\"\nwrite = [\"room-17/*\"]\n";
        let c = Config::from_toml(text).unwrap();
        assert_eq!(c.auth.read, ReadAccess::Token);
        assert_eq!(c.auth.jwt.leeway_s, 5);
        assert_eq!(c.auth.token.len(), 2);
        assert!(c.auth.writes_need_token());
        // Printed back: the static token redacted, the key set's text never.
        let shown = c.redacted().to_toml();
        assert!(!shown.contains("dash"), "{shown}");
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn auth_values_are_named() {
        let cases = [
            ("[auth]\nread = \"private\"\n", "unknown variant"),
            ("[auth]\nread = \"token\"\n", "auth.read"),
            ("[auth.jwt]\nleeway_s = 3601\n", "auth.jwt.leeway_s"),
            ("[auth.jwt]\ncookie = \"a;b\"\n", "auth.jwt.cookie"),
            ("[auth.jwt]\nkid = \"x\"\n", "unknown field"),
            ("[[auth.token]]\nread = [\"*\"]\n", "auth.token[0].token"),
            (
                "[[auth.token]]\ntoken = \"a\"\ntoken_file = \"f\"\nread = [\"*\"]\n",
                "auth.token[0].token",
            ),
            (
                "[[auth.token]]\ntoken = \"a b\"\nread = [\"*\"]\n",
                "auth.token[0].token",
            ),
            ("[[auth.token]]\ntoken = \"a\"\n", "auth.token[0].read"),
            (
                "[[auth.token]]\ntoken = \"a\"\nwrite = [\"x\", \"a*b\"]\n",
                "auth.token[0].write[1]",
            ),
            (
                "[[auth.token]]\ntoken = \"a\"\nread = [\"*\"]\nscope = 1\n",
                "unknown field",
            ),
        ];
        for (text, want) in cases {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn key_sets_and_token_files_join_the_config() {
        let mut c = Config::from_toml("[auth.jwt]\nkeys_file = \"k.json\"\n").unwrap();
        let e = c
            .add_jwks("{\"keys\":[]}", "k.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("auth.jwt.keys_file") && e.contains("no key"),
            "{e}"
        );
        c.add_jwks(include_str!("auth/testdata/jwks.json"), "k.json")
            .unwrap();
        assert!(
            !c.to_toml().contains("\"kty\""),
            "the key set is never printed"
        );
        let mut c =
            Config::from_toml("[[auth.token]]\ntoken_file = \"t\"\nread = [\"*\"]\n").unwrap();
        let e = c
            .add_static_token(0, "# none\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("auth.token[0].token_file"), "{e}");
        c.add_static_token(0, "# the dashboard\n s3cret \n", "t")
            .unwrap();
        assert_eq!(c.auth.token[0].token, "s3cret");
        assert!(!c.redacted().to_toml().contains("s3cret"));
    }
}
