//! What every request gets back: routing, polls and the long-poll decision,
//! ingest, `DELETE`, CORS, auth, health, and the one answer writer
//! ([`Heads::write`]); and the expiry step each worker runs once a tick. Answers
//! are written into a `&mut Vec<u8>` (a connection's send buffer); what the
//! server counts goes out through [`Host`], and so do the two things only the
//! server can do (wake the workers waiting on a box, render `/metrics`).
//!
//! One [`Service`] per worker: it owns the worker's arena (a parsed body lives
//! there only while its request is answered), the projector's slots, the
//! pre-rendered heads and scratch buffers. All workers share one [`Node`]: the
//! config, the box table and the ingest tokens.
//!
//! What it is not: a connection. Keep-alive, parking, deadlines and request
//! order live in [`crate::conn`]; this module answers one request at a time.

mod access;
use access::Target;
mod answer;
mod cors;
mod cursor;
mod ingest;
mod keys;
mod logged;
mod many;
mod pages;
mod poll;
mod presence;
mod presence_box;
pub use presence_box::{parse_presence_query, PresenceQuery};
mod refusal;
mod rooms;
// The ETag of one box, which a many-box read matches too.
use poll::{etag_matches, render_etag};
mod stream;
mod tally;

pub use crate::auth::{constant_time_eq, Tokens};
pub use crate::http::wants_event_stream;
pub use crate::log::Report;
pub use access::AuthRefused;
pub use answer::{error_body, Answer, Heads, JSON, TEXT};
pub use cors::{Cors, PREFLIGHT};
pub use cursor::parked_prefix;
pub use keys::ManyKeys;
pub use logged::Pending;
pub use many::ManyWatch;
pub use pages::{Paging, PAGE_STEP};
pub use rooms::{RoomWatch, DEFAULT_PAGE, LIST_STEP, MOVED_CAP, QUIET_LIST_STEPS};
pub use stream::{write_event, write_expired, Event, Stream, DELETED, HEARTBEAT};
pub use tally::{IngestResult, Removal, RouteLabel};

use crate::arena::{Arena, ResetStats};
use crate::auth::{Access, Credentials, LiveAccess, Need, Refusal};
pub use crate::boxes::Watchers;
use crate::boxes::{BoxTable, Removed, SweepBudget, Swept};
use crate::clients::{ClientTable, Limit, Refusal as ClientRefusal, TrustedProxies};
use crate::config::Config;
use crate::http::{
    check_key_segments, parse_poll_query, percent_decode_into, route, Frame, HttpError, Method,
    Route, Version,
};
use crate::plan::Plan;
use crate::projection::{KeySource, Projector};
use std::sync::Arc;
use std::time::SystemTime;

/// Initial (and kept) size of a worker's arena: 512 KiB holds an epoch of ~800
/// messages of 512 B per worker. Busier epochs grow it (bumpalo adds chunks; a
/// reset keeps the largest up to 4× this and replaces a bigger one), so its
/// resident pages follow the real load.
const ARENA_WORKING_BYTES: usize = 512 * 1024;

/// What all workers share.
pub struct Node {
    pub config: Config,
    pub plan: Arc<Plan>,
    pub boxes: BoxTable,
    pub tokens: Tokens,
    /// Bearer tokens for `/metrics` (none: open).
    pub metrics_tokens: Tokens,
    /// Scoped tokens: who may read and write which box. Replaced whole when
    /// the key set or a static token file is re-read; each worker's
    /// [`Service`] takes the new one at its next tick.
    pub access: LiveAccess,
    /// `server.trusted_proxies`: peers whose PROXY header or
    /// `X-Forwarded-For` names the client.
    pub trusted: TrustedProxies,
    /// Every client's connections, held requests and request bucket (the
    /// per-client limits).
    pub clients: ClientTable,
    /// Who is in each room (docs/presence.md).
    pub presence: Arc<crate::presence::Presence>,
}

impl Node {
    pub fn new(config: Config, plan: Arc<Plan>, boxes: BoxTable) -> Node {
        let tokens = Tokens::new(&config.auth.ingest_tokens);
        let metrics_tokens = Tokens::new(&config.auth.metrics_tokens);
        // The key set was checked when it joined the config (Config::add_jwks).
        let access = Access::new(&config.auth).expect("auth.jwt keys checked by Config::add_jwks");
        let trusted = TrustedProxies::new(&config.server.trusted_proxies);
        let clients =
            ClientTable::new(config.limits.client_limits(), config.limits.max_connections);
        Node {
            presence: Arc::new(if config.log.enabled() {
                crate::presence::Presence::logged(config.presence.clone())
            } else {
                crate::presence::Presence::new(config.presence.clone(), boxes.version_clock())
            }),
            access: LiveAccess::new(access),
            trusted,
            clients,
            config,
            plan,
            boxes,
            tokens,
            metrics_tokens,
        }
    }
}

/// One record a node of a log produces ([`Host::produce`]): the message at
/// `index` of its request, under `key`; `value` `None` is a tombstone.
/// `values`: the message as the projection gave it (empty for a tombstone),
/// which a write-ahead file applies without parsing `value` again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogRecord<'a> {
    pub index: u32,
    pub key: &'a [u8],
    pub value: Option<&'a [u8]>,
    pub values: &'a [Option<crate::plan::Value<'a>>],
}

/// What the service and the connections need from the server around them.
pub trait Host: Watchers {
    /// Shutting down: answers close their connection, `/readyz` says 503.
    fn draining(&self) -> bool;
    /// Listening, and the snapshot (if any) loaded.
    fn ready(&self) -> bool;
    /// `n` boxes left the table (deleted or expired).
    fn boxes_removed(&mut self, why: Removal, n: u64);
    /// Append the Prometheus exposition to `out`.
    fn render_metrics(&mut self, out: &mut Vec<u8>);
    /// One response was written (`code` 100 for an interim `100 Continue`).
    fn answered(&mut self, route: RouteLabel, code: u16);
    /// `n` messages ended with `result`.
    fn ingested(&mut self, result: IngestResult, n: u64);
    /// A node of a log: an id for the records of one request (they are
    /// reported back with it).
    fn log_request(&mut self) -> u64 {
        0
    }
    /// A node of a log: produce the `records` of `request` together (a
    /// request's records are one batch); each one's fate is reported to the
    /// waiting connection ([`crate::conn::Connection::on_log_report`]).
    /// Returns how many the log took: the rest were not produced (the log
    /// cannot take them now).
    fn produce(&mut self, request: u64, records: &[LogRecord<'_>]) -> usize {
        let _ = (request, records);
        0
    }
    /// Why records were not taken or not kept (the 503's `error`): the log
    /// is away, or the write-ahead file's disk is full or failed.
    fn unavailable(&self) -> &'static str {
        "log unavailable"
    }
    /// Why the node is not ready, when it is not and can say more than
    /// "not ready" (a failed sync of the write-ahead file).
    fn unready_reason(&self) -> Option<&str> {
        None
    }
    /// A request on a connection past `max_connections` was refused (it was
    /// not a probe).
    fn over_connection_cap(&mut self) {}
    /// An event stream sent an event; `coalesced` versions of its box were
    /// skipped since its previous event (docs/http.md#event-streams).
    fn sse_event(&mut self, coalesced: u64) {
        let _ = coalesced;
    }
    /// A request (or one message of a batch) was refused by access control.
    fn auth_refused(&mut self, why: AuthRefused) {
        let _ = why;
    }
    /// A request (or a connection) was refused by a per-client limit.
    fn limit_refused(&mut self, limit: Limit) {
        let _ = limit;
    }
    /// Event streams of a prefix open on the node (`limits.max_prefix_streams`
    /// bounds them).
    fn prefix_streams(&self) -> usize {
        0
    }
    /// Whether the server takes the cut rooms stand at itself
    /// ([`Service::take_cut`], before it takes its wake-ups). Otherwise (one
    /// thread, tests) each answer reads the cut afresh.
    fn takes_cuts(&self) -> bool {
        false
    }
}

/// Which listener a connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `server.listen`: the whole HTTP surface (`/metrics` only when there is
    /// no `metrics_listen`).
    Main,
    /// `server.metrics_listen`: `/metrics` only.
    Metrics,
    /// `server.listen`, a connection accepted past `max_connections` (within
    /// a small reserve): only `/healthz` and `/readyz` are served, so a
    /// server full of streams still answers its probes; any other request
    /// is answered 503 `too many connections` and the connection closed.
    Probes,
}

/// What the connection does after [`Service::answer`]: everything the
/// service decided travels here (a held request's key, where a stream
/// stands, what a logged request waits for), nothing is fetched afterwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answered; the connection stays open.
    KeepAlive,
    /// Answered; close once the answer is sent.
    Close,
    /// Not answered: a long-poll that waits on `key` (of many boxes: their
    /// keys, [`ManyKeys`]).
    Park { park: Park, key: Box<[u8]> },
    /// The head of an event stream was written (and the box, if there was
    /// something to send): the connection now streams `key` (docs/http.md#event-streams);
    /// of many boxes, their keys and where it stands with each (`watching`).
    Stream {
        stream: Stream,
        key: Box<[u8]>,
        watching: Option<ManyWatch>,
        /// A stream of a prefix (`key`): where its listing stands, what moved.
        room: Option<Box<RoomWatch>>,
    },
    /// Not answered: a node of a log produced the request's records and
    /// waits for them.
    Log(Box<Pending>),
    /// Not answered yet: a page of a prefix, built a step at a time between
    /// other connections' turns ([`Service::page_step`]).
    Page(Box<Paging>),
}

/// A long-poll that has to wait until the box's version passes `after`, at most
/// `wait_ms` (already capped by `max_wait_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Park {
    pub after: u64,
    pub wait_ms: u64,
    /// The box existed when the poll parked: should it be deleted or expire,
    /// the poll is answered 404 at once (an unknown key waits for its creation).
    pub existed: bool,
    /// A poll of many boxes (docs/http.md#many-boxes-at-once): `after` is their
    /// ETag's value, and the poll is answered when it changes.
    pub many: bool,
    /// A long-poll of a prefix (docs/http.md#rooms): the key holds the
    /// prefix and the watermark ([`rooms::parked_prefix`]).
    pub room: bool,
}

impl Park {
    /// Whether a parked poll is answered now that the box is at `version` (0:
    /// no such box): it moved past `after`, or it is gone.
    pub fn due(&self, version: u64) -> bool {
        version > self.after || (self.existed && version == 0)
    }
}

/// A framed request to answer: the frame, the bytes its ranges index, and
/// whether the connection stays open after it (the request's wish, unless
/// the server is draining or the client's limits close it).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub frame: &'a Frame,
    pub buf: &'a [u8],
    pub keep_alive: bool,
}

/// One request being answered: the framed request and the bytes its ranges
/// index, whether the connection stays open after it, where the answer is
/// written and the host that counts it.
pub(super) struct Exchange<'a, H> {
    frame: &'a Frame,
    buf: &'a [u8],
    keep_alive: bool,
    out: &'a mut Vec<u8>,
    host: &'a mut H,
    /// The connection's last token and what it was found to be.
    creds: &'a mut Credentials,
}

impl<'a, H> Exchange<'a, H> {
    /// `request`, answered into `out` for `host`, with the connection's
    /// credentials (a held request's were checked when it was held: then a
    /// fresh, empty `creds`).
    #[inline(always)]
    fn new(
        request: Request<'a>,
        out: &'a mut Vec<u8>,
        host: &'a mut H,
        creds: &'a mut Credentials,
    ) -> Exchange<'a, H> {
        Exchange {
            frame: request.frame,
            buf: request.buf,
            keep_alive: request.keep_alive,
            out,
            host,
            creds,
        }
    }

    /// What the connection does once this request is answered.
    fn reply(&self) -> Reply {
        if self.keep_alive {
            Reply::KeepAlive
        } else {
            Reply::Close
        }
    }

    /// A JSON answer to this request.
    fn json(&self, route: RouteLabel, code: u16) -> Answer<'static> {
        Answer::json(route, code, self.frame.version, self.keep_alive)
    }

    /// An answer of `content_type` to this request (a `HEAD` gets the head only).
    fn plain(&self, route: RouteLabel, code: u16, content_type: &'static [u8]) -> Answer<'static> {
        Answer {
            route,
            code,
            content_type,
            version: self.frame.version,
            keep_alive: self.keep_alive,
            head_only: self.frame.method == Method::Head,
            etag: None,
            extra: &[],
        }
    }
}

/// One worker's answering state.
pub struct Service {
    node: Arc<Node>,
    /// The node's access as of this worker's last tick ([`Service::follow_access`]).
    access: Arc<Access>,
    arena: Arena,
    projector: Projector,
    heads: Heads,
    /// Percent-decoded key of the current request.
    key: Vec<u8>,
    /// Rendered body of the current response.
    body: Vec<u8>,
    /// One decoded key of a many-box poll, before it joins `key`.
    scratch: Vec<u8>,
    /// The server's monotonic clock (ms) for the requests being answered: box
    /// expiry counts on it.
    now_ms: u64,
    /// The wall clock in seconds since the epoch (token `exp` and `nbf`),
    /// followed with the `Date` header ([`Service::set_time`]).
    now_s: u64,
    /// The same wall clock in milliseconds: when a held request's token
    /// ends on the worker's clock ([`Service::token_deadline_ms`]).
    wall_ms: u64,
    /// Boxes the last expiry step removed, until their long-polls are woken.
    expired: Vec<Removed>,
    /// A node of a log, or one with a write-ahead file: ingest produces
    /// instead of applying, and the answer waits for the apply.
    logged: bool,
    /// The cut rooms are answered at (docs/boxes.md#watermarks): taken by
    /// the server before it takes its wake-ups ([`Service::take_cut`]);
    /// read afresh for each answer when the host does not
    /// ([`Host::takes_cuts`]).
    cut: Vec<u64>,
    /// The cut taken before the wake-ups being taken now: rooms stand at it
    /// once they are all taken ([`Service::cut_drained`]).
    next_cut: Vec<u64>,
    /// The cut a page or a long-poll of a prefix stands at (read for each).
    walk_cut: Vec<u64>,
    /// The presence connection the request being answered opened
    /// ([`Service::take_joined`]).
    joined: Option<crate::presence::Membership>,
}

impl Service {
    /// `now`: the wall clock, for the `Date` header.
    pub fn new(node: Arc<Node>, now: SystemTime) -> Service {
        let limits = &node.config.limits;
        let working = ARENA_WORKING_BYTES.min(limits.arena_limit_bytes);
        let expiring = if node.plan.ttl_s > 0 {
            SweepBudget::PER_TICK.remove
        } else {
            0
        };
        // Whether cookies are taken is config, the same in every read.
        let access = node.access.current();
        Service {
            arena: Arena::new(working, limits.arena_limit_bytes),
            projector: Projector::new(node.plan.clone()),
            heads: Heads::new(
                now,
                Cors::with_credentials(&node.config.http.cors_origins, access.cookie_tokens()),
            ),
            access,
            key: Vec::with_capacity(node.config.boxes.max_key_bytes.max(256)),
            body: Vec::with_capacity(16 * 1024),
            scratch: Vec::with_capacity(node.config.boxes.max_key_bytes.max(256)),
            now_ms: 0,
            now_s: unix_s(now),
            wall_ms: unix_ms(now),
            expired: Vec::with_capacity(expiring),
            logged: node.config.ingest_waits(),
            cut: Vec::new(),
            next_cut: Vec::new(),
            walk_cut: Vec::new(),
            joined: None,
            node,
        }
    }

    /// Take the cut now, before the wake-ups sent to this worker are taken
    /// (docs/boxes.md#watermarks). Rooms go on standing at the cut before
    /// until they are all taken ([`Service::cut_drained`]): a stream that
    /// sends meanwhile (its socket drained) must not name a change whose
    /// wake-up is still in the inbox.
    pub fn take_cut(&mut self) {
        self.node.boxes.lanes().cut(&mut self.next_cut);
    }

    /// Every wake-up sent before the cut taken last was taken: rooms stand
    /// at that cut now.
    pub fn cut_drained(&mut self) {
        std::mem::swap(&mut self.cut, &mut self.next_cut);
    }

    /// The server's monotonic clock (ms since it started, the same on every
    /// worker) for the requests answered next.
    #[inline]
    pub fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    /// One step of box expiry at `now_ms` (each worker runs one a tick):
    /// boxes with no accepted message for `ttl_s` are removed, at most
    /// [`SweepBudget::PER_TICK`] of work; their long-polls are woken (and
    /// answered 404) and they are counted. Their memory is freed here.
    pub fn expire<H: Host>(&mut self, now_ms: u64, host: &mut H) -> Swept {
        let swept = self
            .node
            .boxes
            .expire(now_ms, SweepBudget::PER_TICK, &mut self.expired);
        for gone in self.expired.drain(..) {
            host.box_updated(gone.key());
        }
        // Every removal's watchers told: the worker's lane is through them
        // (docs/boxes.md#watermarks).
        self.node.boxes.lanes().publish();
        if swept.removed > 0 {
            host.boxes_removed(Removal::Expired, swept.removed as u64);
        }
        swept
    }

    /// Each worker's tick of presence at `now_ms` (the server's clock, ms
    /// since it started): members whose grace ran out leave, wake-ups that
    /// waited for the count interval are sent (docs/presence.md).
    pub fn presence_tick<H: Host>(&mut self, now_ms: u64, host: &mut H) {
        self.node.presence.tick(now_ms, |room| {
            host.box_updated(&crate::presence::presence_key(room))
        });
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn arena(&self) -> &Arena {
        &self.arena
    }

    /// Reset the arena (the epoch ends). Only between requests, so no parsed
    /// value is alive: the borrow checker enforces it (`&mut self`).
    pub fn reset_arena(&mut self) -> ResetStats {
        self.arena.reset()
    }

    /// Follow the wall clock (the `Date` header and the heads rendered with it).
    pub fn set_time(&mut self, now: SystemTime) {
        self.heads.refresh(now);
        self.now_s = unix_s(now);
        self.wall_ms = unix_ms(now);
    }

    /// Take the node's access if a newer read of the key set and token
    /// files was installed (once a tick: a relaxed load when nothing
    /// changed). Returns whether it was: the worker then asks its held
    /// requests whether their tokens still hold ([`crate::conn::Connection::on_access_changed`]).
    pub fn follow_access(&mut self) -> bool {
        if self.node.access.generation() == self.access.generation() {
            return false;
        }
        self.access = self.node.access.current();
        true
    }

    /// The access this worker answers with.
    pub fn access(&self) -> &Access {
        &self.access
    }

    /// Whether the request just held (parked or streaming) needed a token:
    /// then its token ends it ([`Service::held_token`]).
    pub fn held_needs_token(&self) -> bool {
        self.access.reads_need_token
    }

    /// Whether the token of a held request still holds now: `Ok` with when
    /// it ends (seconds since the epoch, `u64::MAX`: never), or why not.
    pub fn held_token(&self, creds: &mut Credentials) -> Result<u64, Refusal> {
        self.access.held(creds, self.now_s)
    }

    /// When a token that ends at `end_s` (seconds since the epoch) ends on
    /// the worker's clock, from `now_ms` on it: late by up to a tick (the
    /// wall clock is read once a tick), never early.
    pub fn token_deadline_ms(&self, end_s: u64, now_ms: u64) -> u64 {
        if end_s == u64::MAX {
            return u64::MAX;
        }
        now_ms.saturating_add(end_s.saturating_mul(1000).saturating_sub(self.wall_ms))
    }

    /// Heap bytes of the service's scratch and the projector's slots (the
    /// arena is counted on its own).
    pub fn working_bytes(&self) -> usize {
        self.key.capacity()
            + self.body.capacity()
            + self.projector.working_bytes()
            + self.expired.capacity() * std::mem::size_of::<Removed>()
    }

    /// The box's version, 0 if there is no such box.
    pub fn version(&self, key: &[u8]) -> u64 {
        match crate::presence::room_of(key) {
            Some(room) => self.node.presence.version(room),
            None => self.node.boxes.version(key).unwrap_or(0),
        }
    }

    /// Whether the long-poll `park` of `key` (its keys, for many boxes) is
    /// answered now.
    pub fn park_due(&mut self, key: &[u8], park: &Park) -> bool {
        if park.room {
            return self.room_due(key);
        }
        if park.many {
            self.many_tag(key) != park.after
        } else {
            let version = self.version(key);
            park.due(version) || crate::presence::moved(key, version, park.after)
        }
    }

    /// Answer one framed request into `out`. `creds`: the connection's last
    /// token, verified once.
    pub fn answer<H: Host>(
        &mut self,
        listener: Listener,
        request: Request<'_>,
        out: &mut Vec<u8>,
        host: &mut H,
        creds: &mut Credentials,
    ) -> Reply {
        let Request { frame, buf, .. } = request;
        let x = &mut Exchange::new(request, out, host, creds);
        let allowed = self.heads.begin(frame.field(&frame.origin, buf));
        if frame.method == Method::Options
            && listener == Listener::Main
            && self.heads.cors().enabled()
        {
            return self.preflight(x, allowed);
        }
        let metrics_apart = !self.node.config.server.metrics_listen.is_empty();
        let mut r = route(frame.method, &buf[frame.path.clone()]);
        match (listener, r) {
            (Listener::Metrics, Route::Metrics) => {}
            (Listener::Metrics, _) => r = Route::NotFound,
            (Listener::Main, Route::Metrics) if metrics_apart => r = Route::NotFound,
            (Listener::Main, _) => {}
            // One probe a connection: the reserve's slot is freed at once.
            (Listener::Probes, Route::Healthz | Route::Readyz) => x.keep_alive = false,
            (Listener::Probes, _) => {
                x.host.over_connection_cap();
                x.keep_alive = false;
                return self.error(x, RouteLabel::Other, 503, "too many connections");
            }
        }
        match r {
            Route::Poll { key } => self.poll(x, key),
            Route::PollMany => self.poll_many(x),
            Route::IngestKey { key } => {
                if !self.access.scoped && !self.authorized(x) {
                    return self.unauthorized(x, RouteLabel::IngestKey);
                }
                if let Err(what) = self.decode_key(key) {
                    return self.error(x, RouteLabel::IngestKey, 400, what);
                }
                if let Err(r) =
                    self.check_access(x, RouteLabel::IngestKey, Need::Write, Target::One)
                {
                    return r;
                }
                if self.logged {
                    return self.ingest_logged(x, KeySource::Path);
                }
                self.ingest(x, KeySource::Path)
            }
            Route::Ingest => {
                if !self.access.scoped && !self.authorized(x) {
                    return self.unauthorized(x, RouteLabel::Ingest);
                }
                // The token is checked here; its scope message by message.
                if let Err(r) = self.check_token(x, RouteLabel::Ingest) {
                    return r;
                }
                if self.logged {
                    return self.ingest_logged(x, KeySource::Body);
                }
                self.ingest(x, KeySource::Body)
            }
            Route::Delete { key } => self.delete(x, key),
            Route::Metrics => {
                let given = frame.field(&frame.authorization, buf);
                if !self.node.metrics_tokens.allow(given) {
                    return self.unauthorized(x, RouteLabel::Metrics);
                }
                self.body.clear();
                x.host.render_metrics(&mut self.body);
                let a = x.plain(RouteLabel::Metrics, 200, METRICS_CONTENT_TYPE);
                self.heads.write(x.out, x.host, &a, &self.body);
                x.reply()
            }
            Route::Healthz => {
                let a = x.plain(RouteLabel::Healthz, 200, TEXT);
                self.heads.write(x.out, x.host, &a, b"ok");
                x.reply()
            }
            Route::Readyz => {
                let (code, body): (u16, &[u8]) = if x.host.draining() {
                    (503, b"draining")
                } else if let Some(why) = x.host.unready_reason() {
                    self.body.clear();
                    self.body.extend_from_slice(b"not ready: ");
                    self.body.extend_from_slice(why.as_bytes());
                    let a = x.plain(RouteLabel::Readyz, 503, TEXT);
                    self.heads.write(x.out, x.host, &a, &self.body);
                    return x.reply();
                } else if x.host.ready() {
                    (200, b"ready")
                } else {
                    // Starting: a node of a log catching up with it.
                    (503, b"not ready")
                };
                let a = x.plain(RouteLabel::Readyz, code, TEXT);
                self.heads.write(x.out, x.host, &a, body);
                x.reply()
            }
            Route::NotFound => self.error(x, RouteLabel::Other, 404, "not found"),
            Route::MethodNotAllowed { allow } => {
                error_body(&mut self.body, "method not allowed");
                let a = Answer {
                    extra: &[(b"Allow", allow.as_bytes())],
                    ..x.plain(RouteLabel::Other, 405, JSON)
                };
                self.heads.write(x.out, x.host, &a, &self.body);
                x.reply()
            }
        }
    }

    /// `OPTIONS` with `cors_origins` set: a CORS preflight, 204 with what may
    /// be sent when the origin is allowed, 403 otherwise.
    fn preflight<H: Host>(&mut self, x: &mut Exchange<'_, H>, allowed: bool) -> Reply {
        let route = RouteLabel::Preflight;
        if !allowed {
            let what = "origin not allowed (http.cors_origins)";
            return self.error(x, route, 403, what);
        }
        let a = Answer {
            content_type: b"",
            extra: PREFLIGHT,
            ..x.json(route, 204)
        };
        self.heads.write(x.out, x.host, &a, b"");
        x.reply()
    }

    #[inline]
    fn decode_key(&mut self, raw: &[u8]) -> Result<(), &'static str> {
        if raw.first() != Some(&b'.') && crate::bytes::ascii_without_either(raw, b'%', b'/') {
            // The common key: one segment that is not a dot segment, nothing
            // to decode, and ASCII is UTF-8 (this skips the segments' check, a
            // byte-by-byte decode and a UTF-8 check on every poll).
            self.key.clear();
            self.key.extend_from_slice(raw);
            return Ok(());
        }
        check_key_segments(raw)?;
        percent_decode_into(raw, &mut self.key).map_err(|_| "bad percent-encoding in key")?;
        if std::str::from_utf8(&self.key).is_err() {
            return Err("key is not valid UTF-8");
        }
        Ok(())
    }

    fn authorized<H>(&self, x: &Exchange<'_, H>) -> bool {
        self.node
            .tokens
            .allow(x.frame.field(&x.frame.authorization, x.buf))
    }
}

/// Seconds since the epoch (0 before it).
fn unix_s(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Milliseconds since the epoch (0 before it).
fn unix_ms(now: SystemTime) -> u64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `Content-Type` of the Prometheus text exposition 0.0.4.
pub const METRICS_CONTENT_TYPE: &[u8] = b"text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
