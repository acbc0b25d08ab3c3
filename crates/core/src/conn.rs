//! One connection's state machine: bytes and the time in, answers and what to
//! do next out. No socket, no clock: the server reads into
//! [`Connection::read_buffer`], says how many bytes came ([`Connection::received`]),
//! when the peer closed ([`Connection::eof`]), when the timer it asked for
//! fired ([`Connection::on_timer`]), when a box it watches moved
//! ([`Connection::on_keys_updated`]) and when a record it awaits was reported
//! ([`Connection::on_log_report`]). After each call the server writes
//! [`Connection::send_queue`] (answers are appended there, in request order),
//! reads on while [`Connection::wants_read`] (not while closing, waiting, or
//! while the client does not read its answers), and applies, once each, the
//! actions the connection pushed ([`Connection::actions`], [`Action`]):
//!
//! - `Watch { keys }` when a long-poll parks or an event stream begins (one
//!   key, or the keys of many boxes): the server registers them where ingests
//!   wake it, then calls [`Connection::on_box_updated`] once (an update may
//!   have landed before the registration); `Unwatch` when it is answered or
//!   ends;
//! - `Await(request)` when an ingest or `DELETE` of a node of a log waits for
//!   its records: the server routes that request's reports here; `Unawait`
//!   once it is answered;
//! - `Arm(at)` when the deadline comes before the timer armed, or none is;
//! - `Bytes` when its heap bytes changed, for the server's totals;
//! - `Close` once, when the connection is done (after the server writes what
//!   the socket takes, shutting the write side down first when
//!   [`Connection::shuts_down_write`] says so).
//!
//! The server keeps no copy of this state: what it keeps is what it made
//! when applying an action (the registration of a watch, the timer), so it
//! knows what to undo at the close ([`Connection::release`] asks for it).
//!
//! Rules this module owns (each one is a unit test below):
//! - keep-alive: the request's (HTTP/1.1 unless `Connection: close`, 1.0 only with
//!   `keep-alive`), and never while the server drains;
//! - `100 Continue` is written once, when the head of an HTTP/1.1 request with
//!   `Expect: 100-continue` is in and its body is not;
//! - the deadline: idle (`idle_timeout_ms` from the last answer) with no request
//!   begun, header (`header_timeout_ms` from the head's first byte), body
//!   (`body_timeout_ms` from the last byte of progress), or the long-poll's;
//! - a parked long-poll holds back the requests pipelined behind it, and they are
//!   answered in order once it is answered; so does a logged ingest, until its
//!   records are reported or `log.ack_timeout_ms` passes (503);
//! - an event stream (docs/http.md#event-streams) is a state like a parked poll: it sends the
//!   box's newest version when woken, but never queues more than one event
//!   behind a client that does not read (while its queue is not empty it only
//!   remembers that the box moved, and sends the newest version once the
//!   queue drains: [`Connection::on_send_drained`]); a comment line every
//!   `sse_heartbeat_ms` with nothing else to send; `event: deleted` and the
//!   end when its box goes; the end, after what is queued, on shutdown. The
//!   stream's body ends with the connection, so nothing after its request is
//!   read;
//! - a held request (a parked long-poll, an event stream) that needed a token
//!   ends with it (docs/private-boxes.md#when-a-token-ends): its deadline is
//!   the earlier of its own and the token's end (`exp` plus leeway); then,
//!   or when a re-read of the key set no longer holds the token
//!   ([`Connection::on_access_changed`]), a parked poll is answered 401 as
//!   any request with that token would be, and a stream is sent
//!   `event: expired` and ends;
//! - the per-client limits ([`crate::clients::admission`]): a trusted proxy's
//!   PROXY v2 header is read before the first request; each request of a
//!   limited connection is admitted before it is answered (429 past a limit,
//!   and the close past `max_connections_per_ip`, probes excepted); a request
//!   that may be held takes one of its client's held requests until it ends;
//! - a framing error is answered, then the connection closes (the next request
//!   boundary is unknown); so is an HTTP/1.1 request without exactly one `Host`
//!   (as soon as its head is in, before its body), and a request that times
//!   out gets 408. Such a close lingers (docs/http.md#bad-input): the answer is sent, the
//!   write side shut down, and what the client still sends is read and dropped
//!   for up to [`LINGER_MS`] and [`LINGER_BYTES`], so the client reads the
//!   answer instead of a reset.

use crate::auth::{Credentials, Refusal};
use crate::buffers::{Buffers, SendQueue};
use crate::clients::{Admission, Admit};
use crate::http::{
    Frame, Framer, FramerState, HttpError, Limits, Method, Progress, Version, CONTINUE,
};
use crate::service::{
    parked_prefix, Event, Host, Listener, ManyWatch, Paging, Park, Pending, Reply, Report, Request,
    RoomWatch, RouteLabel, Service, Stream, DELETED, HEARTBEAT,
};

/// A connection with this many unsent bytes is not read until it drains.
pub const SEND_BACKPRESSURE: usize = 256 * 1024;
/// After an error answer, how long the unread input of a client still sending
/// is drained (from the answer on), and how much of it at most: long enough for
/// the client to read the answer instead of a reset, short enough that a client
/// that never stops sending is cut off (nginx's `lingering_close`).
pub const LINGER_MS: u64 = 2_000;
pub const LINGER_BYTES: usize = 1 << 20;
/// Room past the largest request a read buffer may have (a read fills it).
const READ_SLACK: usize = 64 * 1024;

/// What a connection needs besides itself for one step: the time, the worker's
/// service and buffers, and the server around it.
pub struct Ctx<'a, H: Host> {
    pub now_ms: u64,
    pub service: &'a mut Service,
    pub buffers: &'a mut Buffers,
    pub host: &'a mut H,
}

/// How a connection ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Once the queued answers are sent.
    AfterSend,
    /// After an error answer: once it is sent, the write side is shut down and
    /// what the client still sends is read and dropped, until it closes its side,
    /// `left` more bytes came, or `until_ms` (then [`Closing::Now`]).
    Linger { until_ms: u64, left: usize },
    /// Now: what the socket takes at once is sent, then the write side is shut
    /// down (a timeout, a client that does not read, shutdown overdue).
    Now,
}

/// What a connection waits on, if anything: one thing at a time, because a
/// request that waits holds back everything pipelined behind it.
#[derive(Debug)]
enum Wait {
    None,
    /// Boxed, as `Logging`: rare states, kept out of every connection's size.
    /// A stream is not (an event stream's memory is mostly its `Connection`:
    /// BENCHMARKS.md).
    Parked(Box<Parked>),
    Logging(Box<Logging>),
    Streaming(Streaming),
    /// A page of a prefix being built between other connections' turns.
    Paging(Box<PagingWait>),
}

/// A long-poll waiting on this connection.
#[derive(Debug)]
struct Parked {
    frame: Frame,
    key: Box<[u8]>,
    park: Park,
    deadline_ms: u64,
    /// When its token ends; `None`: it needed none.
    token_end_ms: Option<u64>,
    /// A long-poll of a prefix woken by a key whose change was not yet
    /// published: the server looks again with its next cut.
    recheck: bool,
    /// A presence connection's hold on its member (docs/presence.md),
    /// let go when the long-poll is answered.
    presence: Option<crate::presence::Membership>,
}

/// An ingest or a `DELETE` of a node of a log, waiting for its records to be
/// acknowledged and applied (docs/operations.md#the-kafka-log).
#[derive(Debug)]
struct Logging {
    frame: Frame,
    /// Boxed by the service that made it ([`Reply::Log`]).
    pending: Box<Pending>,
    deadline_ms: u64,
}

/// An event stream this connection sends (docs/http.md#event-streams).
#[derive(Debug)]
struct Streaming {
    /// The key, or the keys of a stream of many boxes ([`crate::service::ManyKeys`]).
    key: Box<[u8]>,
    stream: Stream,
    /// A stream of many boxes: where it stands with each, in the keys' order.
    many: Option<ManyWatch>,
    /// A stream of every box under a prefix (`key`): its listing, what moved.
    room: Option<Box<RoomWatch>>,
    /// The box moved while the send queue was not empty: send its newest
    /// version once the queue drains (coalescing).
    dirty: bool,
    /// When the next heartbeat is due, unless something else is sent.
    heartbeat_ms: u64,
    /// When its token ends; `None`: it needed none.
    token_end_ms: Option<u64>,
    /// A presence connection's hold on its member (docs/presence.md),
    /// let go when the stream ends.
    presence: Option<Box<crate::presence::Membership>>,
}

pub struct Connection {
    listener: Listener,
    /// What it asked of the server and the server has not yet taken
    /// ([`Connection::actions`]).
    queue: Queue,
    /// The timer it asked for ([`Action::Arm`]); `u64::MAX`: none (none was
    /// asked, or it fired).
    armed_ms: u64,
    /// Its heap bytes as last told ([`Action::Bytes`]): send queue, watch.
    told_bytes: (usize, usize),
    /// [`Action::Close`] was asked (or the connection was released): it
    /// asks nothing more.
    close_asked: bool,
    framer: Framer,
    /// Received bytes live in `rbuf[rstart..rend]`; `rbuf.len()` is its capacity.
    /// Empty (no allocation) between requests.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    /// The most bytes `rbuf` has held since it was taken.
    rbuf_high: usize,
    /// The size of read buffer to take next: the last one's, when the last one
    /// grew and was used past the standard size (batch after batch), else
    /// [`crate::buffers::READ_BUF`].
    rbuf_next: usize,
    sendq: SendQueue,
    /// When the connection times out (ms on the worker clock), by its state.
    deadline_ms: u64,
    /// When the current request's head started (header timeout runs from it).
    head_started_ms: Option<u64>,
    /// Bytes of the current partial request seen at the last check (body progress).
    partial_seen: usize,
    wait: Wait,
    /// The last request answered was a `POST` (an ingest): the server serves
    /// such connections after the others of a loop turn.
    last_was_post: bool,
    /// Apart from `wait`, because it coexists with one: a client that sends
    /// a long-poll (or an ingest of a log, or opens a stream) and then
    /// half-closes is answered, then closed (`AfterSend`); a stream that
    /// ends is closing with nothing left to wait on.
    closing: Option<Closing>,
    /// The last read wanted a buffer the worker's budget did not allow.
    starved: bool,
    /// The last token presented and what it was found to be: verified once
    /// per connection, again only when it changes.
    creds: Credentials,
    /// Its client, and what it holds of the client's limits.
    client: Admission,
}

/// How long a connection past `max_connections` ([`Listener::Probes`]) has
/// to send its probe before it is refused as any connection over the cap.
pub const PROBE_WAIT_MS: u64 = 1000;

impl Connection {
    pub fn new(now_ms: u64, listener: Listener, service: &Service) -> Connection {
        let l = &service.node().config.limits;
        Connection {
            listener,
            queue: Queue::default(),
            armed_ms: u64::MAX,
            told_bytes: (0, 0),
            close_asked: false,
            framer: Framer::new(Limits::from(l)),
            rbuf: Vec::new(),
            rstart: 0,
            rend: 0,
            rbuf_high: 0,
            rbuf_next: crate::buffers::READ_BUF,
            sendq: SendQueue::default(),
            deadline_ms: now_ms
                + match listener {
                    Listener::Probes => PROBE_WAIT_MS,
                    _ => l.idle_timeout_ms,
                },
            head_started_ms: None,
            partial_seen: 0,
            wait: Wait::None,
            last_was_post: false,
            closing: None,
            starved: false,
            creds: Credentials::default(),
            client: Admission::default(),
        }
    }

    /// A connection from `peer` (the socket's): its client is known now, or
    /// once a trusted proxy's PROXY header or first request names it. Over
    /// `max_connections_per_ip` it is served its probes only, as one past
    /// `max_connections` is, for as long.
    pub fn from_peer(
        now_ms: u64,
        listener: Listener,
        peer: std::net::IpAddr,
        service: &Service,
    ) -> Connection {
        let node = service.node();
        let limited = listener == Listener::Main && node.clients.limits().any();
        let mut c = Connection::new(now_ms, listener, service);
        c.client = Admission::new(peer, limited, &node.trusted, &node.clients);
        if c.client.over_cap() {
            c.deadline_ms = now_ms + PROBE_WAIT_MS;
        }
        c
    }

    /// The client this connection is counted against, once known (with
    /// per-client limits on).
    pub fn client(&self) -> Option<std::net::IpAddr> {
        self.client.client()
    }

    /// The answers not yet written.
    pub fn send_queue(&mut self) -> &mut SendQueue {
        &mut self.sendq
    }

    /// Whether the server should read from the socket now (lingering: to drop
    /// what the client still sends).
    pub fn wants_read(&self) -> bool {
        match self.closing {
            None => matches!(self.wait, Wait::None) && self.sendq.pending() < SEND_BACKPRESSURE,
            Some(Closing::Linger { .. }) => self.sendq.is_empty(),
            Some(_) => false,
        }
    }

    /// Where to read the next bytes into, or `None` when the connection must not
    /// read now ([`Connection::wants_read`]), or when the request in progress
    /// does not fit in any buffer allowed (it is then answered 413/431 and the
    /// connection closes).
    pub fn read_buffer<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> Option<&mut [u8]> {
        self.starved = false;
        if !self.wants_read() {
            return None;
        }
        if self.rbuf.is_empty() {
            let limit = max_rbuf(cx.service);
            match cx.buffers.take_read_sized(self.rbuf_next, limit) {
                Some(b) => self.rbuf = b,
                None => {
                    self.starved = true;
                    return None;
                }
            }
        }
        if matches!(self.closing, Some(Closing::Linger { .. })) {
            // Read to drop: the whole buffer, every time.
            self.rstart = 0;
            self.rend = 0;
            return Some(&mut self.rbuf[..]);
        }
        if self.rend == self.rbuf.len() {
            match self.make_room(cx.service, cx.buffers) {
                Room::Made => {}
                Room::OverBudget => {
                    self.starved = true;
                    return None;
                }
                Room::TooLarge => {
                    let e = match self.framer.state() {
                        FramerState::Body => HttpError::BodyTooLarge,
                        _ => HttpError::HeadTooLarge,
                    };
                    self.refuse(e, cx);
                    return None;
                }
            }
        }
        Some(&mut self.rbuf[self.rend..])
    }

    /// `n` bytes were read into the [`Connection::read_buffer`]: answer every
    /// complete request among them.
    pub fn received<H: Host>(&mut self, n: usize, cx: &mut Ctx<'_, H>) {
        if let Some(Closing::Linger { until_ms, left }) = self.closing {
            // Dropped; past the bound the client is cut off.
            let left = left.saturating_sub(n);
            self.closing = Some(if left == 0 {
                Closing::Now
            } else {
                Closing::Linger { until_ms, left }
            });
            return;
        }
        self.rend += n;
        self.rbuf_high = self.rbuf_high.max(self.rend);
        self.serve(cx);
    }

    /// The peer closed its side: answer what was received, then close.
    pub fn eof<H: Host>(&mut self, cx: &mut Ctx<'_, H>) {
        if matches!(self.closing, Some(Closing::Linger { .. })) {
            // It read the answer and went away: nothing more to wait for.
            self.closing = Some(Closing::Now);
            return;
        }
        self.serve(cx);
        self.closing.get_or_insert(Closing::AfterSend);
    }

    /// Whether the last [`Connection::read_buffer`] found no room in the worker's
    /// `max_buffered_bytes` share: the connection waits, unread, and the server
    /// tries it again later (when other connections have given buffers back).
    pub fn starved(&self) -> bool {
        self.starved
    }

    /// When the server must call [`Connection::on_timer`] (ms on the worker clock).
    pub fn deadline(&self) -> u64 {
        match (&self.wait, self.closing) {
            (Wait::Logging(l), _) => l.deadline_ms,
            (Wait::Streaming(s), None) => s.heartbeat_ms.min(s.token_end_ms.unwrap_or(u64::MAX)),
            (Wait::Parked(p), _) => p.deadline_ms.min(p.token_end_ms.unwrap_or(u64::MAX)),
            (_, Some(Closing::Linger { until_ms, .. })) => until_ms,
            _ => self.deadline_ms,
        }
    }

    /// The timer it asked for ([`Action::Arm`]) fired (the deadline may have
    /// moved since); the timer is spent, so the next [`Connection::actions`]
    /// asks for one again.
    pub fn on_timer<H: Host>(&mut self, cx: &mut Ctx<'_, H>) {
        self.armed_ms = u64::MAX;
        if cx.now_ms < self.deadline() {
            return;
        }
        if self.held_token_end().is_some_and(|end| cx.now_ms >= end) && self.check_held_token(cx) {
            return;
        }
        match &self.wait {
            Wait::Parked(p) if cx.now_ms < p.deadline_ms => {
                // Its token's end came first, and the token still holds (the
                // wall clock moved): its deadline is armed again.
                return;
            }
            Wait::Parked(_) => {
                self.answer_parked(true, cx);
                return;
            }
            Wait::Logging(_) => {
                self.answer_logging(true, cx);
                return;
            }
            _ => {}
        }
        if let (Wait::Streaming(s), None) = (&mut self.wait, self.closing) {
            if cx.now_ms < s.heartbeat_ms {
                // Its token's end came first, and the token still holds.
                return;
            }
            // Nothing sent for a while: a comment line, unless the client has
            // not read what is queued (then the stream is not idle, it is slow).
            if self.sendq.is_empty() {
                self.sendq
                    .append(&mut cx.buffers.send, |out| out.extend_from_slice(HEARTBEAT));
            }
            s.heartbeat_ms = cx.now_ms + cx.service.node().config.http.sse_heartbeat_ms;
            return;
        }
        if self.closing.is_none() && self.client.over_cap() {
            // Over its client's cap, and no probe came in time.
            let refusal = crate::clients::Refusal {
                limit: crate::clients::Limit::Connections,
                retry_after_s: crate::clients::table::RETRY_HELD_S,
            };
            self.sendq.append(&mut cx.buffers.send, |out| {
                cx.service.refuse_client(refusal, None, false, out, cx.host)
            });
            self.linger(cx.now_ms);
            return;
        }
        if self.closing.is_none() && self.listener == Listener::Probes {
            // Past max_connections, and no probe came in time: the refusal a
            // connection over the cap always got.
            cx.host.over_connection_cap();
            self.sendq.append(&mut cx.buffers.send, |out| {
                cx.service
                    .closing_error(503, "too many connections", out, cx.host)
            });
            self.linger(cx.now_ms);
            return;
        }
        if self.closing.is_none()
            && self.rend > self.rstart
            && self.framer.state() != FramerState::Idle
        {
            // A request started and did not finish in time: 408, and the client,
            // which may still be sending, gets to read it.
            self.sendq.append(&mut cx.buffers.send, |out| {
                cx.service
                    .closing_error(408, "request timeout", out, cx.host)
            });
            self.linger(cx.now_ms);
            return;
        }
        // Idle, a linger that ran out, or a client that does not read its answers.
        self.closing = Some(Closing::Now);
    }

    /// Record `index` of the awaited log request met its fate: once every
    /// record has, the request is answered (then what was pipelined behind
    /// it). Returns whether it was answered.
    pub fn on_log_report<H: Host>(
        &mut self,
        index: u32,
        report: Report,
        cx: &mut Ctx<'_, H>,
    ) -> bool {
        self.on_log_reports(index, report, 1, cx)
    }

    /// `count` records of the awaited request met the same fate (`Applied`
    /// or `NoBox`; see [`crate::service::Pending::report_many`]), `index`
    /// the first of them. Returns whether the request was answered.
    pub fn on_log_reports<H: Host>(
        &mut self,
        index: u32,
        report: Report,
        count: u32,
        cx: &mut Ctx<'_, H>,
    ) -> bool {
        let plan = &cx.service.node().plan;
        let done = match &mut self.wait {
            Wait::Logging(l) => l.pending.report_many(index, report, count, plan),
            _ => return false,
        };
        if done {
            self.answer_logging(false, cx);
        }
        done
    }

    /// Whether the last request this connection answered was a `POST` (an
    /// ingest, likely followed by more): a worker serves the polls of a loop
    /// turn before such connections (docs/operations.md#workers).
    pub fn ingesting(&self) -> bool {
        self.last_was_post
    }

    /// Whether this connection streams events (and is not closing).
    #[cfg(test)]
    pub(crate) fn streaming(&self) -> bool {
        matches!(self.wait, Wait::Streaming(_)) && self.closing.is_none()
    }

    /// A box this connection may wait on was updated, deleted or expired:
    /// answer the long-poll if its box moved past what it waits for, or is gone
    /// (then serve what was pipelined behind it); or send an event stream its
    /// box's newest version (or, with answers still queued, remember to), or
    /// `event: deleted` and end it. Returns whether something was written.
    pub fn on_box_updated<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        self.on_keys_updated(&|_| true, cx)
    }

    /// [`Connection::on_box_updated`] when the server knows which of the keys
    /// of a many-box stream may have moved (`moved(i)`: the `i`th of its keys):
    /// only those are looked at.
    pub fn on_keys_updated<H: Host>(
        &mut self,
        moved: &dyn Fn(usize) -> bool,
        cx: &mut Ctx<'_, H>,
    ) -> bool {
        if let Wait::Streaming(s) = &mut self.wait {
            if let Some(room) = s.room.as_ref() {
                // Its keys come one by one (`on_prefix_moved`): only go on.
                s.dirty = room.pending();
            }
            if let Some(watching) = s.many.as_mut() {
                for i in (0..watching.len()).filter(|&i| moved(i)) {
                    watching.mark(i);
                }
                s.dirty = watching.any();
            }
            return self.stream_update(cx);
        }
        let due = match &self.wait {
            Wait::Parked(p) => cx.service.park_due(&p.key, &p.park),
            _ => false,
        };
        if due {
            self.answer_parked(false, cx);
        }
        due
    }

    /// The peer shut down its side while this connection waits on a long-poll
    /// (EPOLLRDHUP): nobody reads the answer, so the poll is dropped now and the
    /// connection closes, instead of holding its slot until the deadline. (A
    /// client that half-closes and then waits for a parked answer loses it, as
    /// with Nchan; no HTTP client does that.)
    pub fn peer_hung_up(&mut self) {
        if !matches!(self.end_wait(), Wait::None) {
            self.client.unhold();
            self.closing = Some(Closing::Now);
        }
    }

    /// The server is shutting down: a parked long-poll is answered now with the
    /// box as it is; an idle connection closes now, a busy one after its answers
    /// (they say `Connection: close`). `overdue`: the drain took too long.
    pub fn drain<H: Host>(&mut self, overdue: bool, cx: &mut Ctx<'_, H>) {
        if overdue {
            self.closing = Some(Closing::Now);
            return;
        }
        match self.wait {
            Wait::Parked(_) => {
                self.answer_parked(true, cx);
                self.closing.get_or_insert(Closing::AfterSend);
            }
            // Its answer comes from the log (or its deadline), with
            // `Connection: close`.
            Wait::Logging(_) => {}
            // The stream ends with the connection: once what is queued is
            // sent. An EventSource reconnects (elsewhere) after `retry`.
            Wait::Streaming(_) => self.end_stream(cx.now_ms, cx.service),
            // Answered at its last step, with `Connection: close`.
            Wait::Paging(_) => {}
            Wait::None => {
                if self.sendq.is_empty() && self.rend == self.rstart {
                    self.closing = Some(Closing::Now);
                }
            }
        }
    }

    /// Whether the server should close the connection now (after writing what
    /// the socket takes).
    pub fn finished(&self) -> bool {
        match self.closing {
            Some(Closing::AfterSend) => self.sendq.is_empty(),
            Some(Closing::Now) => true,
            Some(Closing::Linger { .. }) | None => false,
        }
    }

    /// Whether the server should shut the write side down now (once): before a
    /// close for [`Closing::Now`], and once a lingering connection's answer is
    /// sent, so the client reads it and then the end of the stream.
    pub fn shuts_down_write(&self) -> bool {
        match self.closing {
            Some(Closing::Now) => true,
            Some(Closing::Linger { .. }) => self.sendq.is_empty(),
            _ => false,
        }
    }

    pub fn closing(&self) -> Option<Closing> {
        self.closing
    }

    /// Give the buffers back, and what it held of its client's limits (the
    /// connection is closed).
    pub fn release<H: Host>(&mut self, cx: &mut Ctx<'_, H>) {
        let buffers = &mut *cx.buffers;
        self.sendq.clear(&mut buffers.send);
        self.give_back_rbuf(buffers);
        self.client
            .release(&cx.service.node().clients, cx.now_ms.saturating_mul(1000));
        self.end_wait();
        // Closed: what it asks now is what the server gives back.
        self.close_asked = true;
    }

    /// What the server is to do for this connection, in the order it was
    /// decided since the last call: call it after each call into the
    /// connection (and after writing its queue), and apply each action once.
    pub fn actions(&mut self) -> Actions<'_> {
        let mut then = [None, None];
        if !self.close_asked {
            if self.finished() {
                self.close_asked = true;
                then[0] = Some(Action::Close);
            } else {
                let at = self.deadline();
                if at < self.armed_ms {
                    self.armed_ms = at;
                    then[0] = Some(Action::Arm(at));
                }
            }
        }
        let bytes = (self.sendq.capacity_bytes(), self.watch_bytes());
        if bytes != self.told_bytes {
            let (was_send, was_watch) = self.told_bytes;
            self.told_bytes = bytes;
            then[1] = Some(Action::Bytes {
                send: bytes.0 as isize - was_send as isize,
                watch: bytes.1 as isize - was_watch as isize,
            });
        }
        let watch = match &self.wait {
            Wait::Parked(p) if p.park.room => Some(Watch {
                keys: parked_prefix(&p.key),
                many: false,
                stream: false,
                prefix: true,
            }),
            Wait::Parked(p) => Some(Watch {
                keys: &p.key,
                many: p.park.many,
                stream: false,
                prefix: false,
            }),
            Wait::Streaming(s) => Some(Watch {
                keys: &s.key,
                many: s.many.is_some(),
                stream: true,
                prefix: s.room.is_some(),
            }),
            _ => None,
        };
        Actions {
            queue: &mut self.queue,
            next: 0,
            watch,
            then,
        }
    }

    /// Whether an action is queued (a watch or an awaited request, or their
    /// undoing; the timer, the bytes and the close are looked at by
    /// [`Connection::actions`] itself).
    pub fn has_actions(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Begin waiting on `wait` (it waited on nothing): the server is asked to
    /// route its wake-ups or reports here.
    fn begin_wait(&mut self, wait: Wait) {
        match &wait {
            Wait::Parked(_) | Wait::Streaming(_) => self.queue.push(Action::Watch(Watch::QUEUED)),
            Wait::Logging(l) => self.queue.push(Action::Await(l.pending.request)),
            Wait::Paging(_) | Wait::None => {}
        }
        self.wait = wait;
    }

    /// Stop waiting; returns what it waited on. The server is told to route
    /// nothing more here (unless it was never asked to).
    fn end_wait(&mut self) -> Wait {
        let old = std::mem::replace(&mut self.wait, Wait::None);
        match &old {
            Wait::Parked(_) | Wait::Streaming(_) => self
                .queue
                .undo(|q| matches!(q, Action::Watch(_)), Action::Unwatch),
            Wait::Logging(l) => self.queue.undo(
                |q| matches!(q, Action::Await(_)),
                Action::Unawait(l.pending.request),
            ),
            Wait::Paging(_) | Wait::None => {}
        }
        old
    }

    /// The wait, taken out if `is` says it is the one asked for (the
    /// connection then waits on nothing); else [`Wait::None`].
    fn take_wait(&mut self, is: fn(&Wait) -> bool) -> Wait {
        if !is(&self.wait) {
            return Wait::None;
        }
        self.end_wait()
    }

    /// Choose the deadline from the state.
    fn update_deadline<H: Host>(&mut self, cx: &Ctx<'_, H>) {
        if !matches!(self.wait, Wait::None) {
            return;
        }
        if self.listener == Listener::Probes || self.client.over_cap() {
            // Its one deadline was set when it opened (or its client was
            // found over its cap): no byte extends it.
            return;
        }
        let l = &cx.service.node().config.limits;
        let partial = self.rend - self.rstart;
        self.deadline_ms = match (partial, self.framer.state()) {
            (0, _) => cx.now_ms + l.idle_timeout_ms,
            (_, FramerState::Body) => {
                // The body timeout runs from the last byte of progress.
                if partial != self.partial_seen {
                    self.partial_seen = partial;
                    cx.now_ms + l.body_timeout_ms
                } else {
                    self.deadline_ms
                }
            }
            _ => {
                // The header timeout runs from the first byte of the head.
                *self.head_started_ms.get_or_insert(cx.now_ms) + l.header_timeout_ms
            }
        };
    }
}

mod actions;
mod held;
mod memory;
mod read_buffer;
mod room;
use room::PagingWait;
mod serve;
mod stream;
use actions::Queue;
pub use actions::{Action, Actions, Watch};
use read_buffer::{max_rbuf, Room};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod limit_tests;
