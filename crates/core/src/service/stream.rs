//! Server-sent events (docs/http.md#event-streams): whether a request asks for an
//! event stream, the stream's head, and the bytes of each event. What a stream does
//! over time (coalescing, heartbeats, the end) is the connection's
//! ([`crate::conn`]); this module writes the bytes.
//!
//! An event is the box's pre-rendered payload with `id:`/`data:` framing
//! around it: `id: <version>\ndata: <payload>\n\n`. The id is the ETag's value
//! unquoted, so an `EventSource` that reconnects sends it back as
//! `Last-Event-ID` and is sent only what is newer. Payloads are JSON on one
//! line (the renderer escapes control characters), so one `data:` line holds
//! one.

use super::{Exchange, Host, Reply, RouteLabel, Service};
use crate::bytes::parse_decimal;
use crate::http::Frame;

/// The bytes an event stream sends when its box is deleted or expires, before
/// the stream ends.
pub const DELETED: &[u8] = b"event: deleted\ndata: \n\n";
/// A comment line: keeps proxies from closing a stream with nothing to say.
pub const HEARTBEAT: &[u8] = b":\n\n";

/// `event: expired`: the stream's token ended (expired, or it is no longer
/// valid after a re-read of the key set), with the reason a request with
/// that token would be told; the stream then ends, and the client comes
/// back with a fresh token (docs/private-boxes.md#when-a-token-ends).
pub fn write_expired(out: &mut Vec<u8>, why: crate::auth::Refusal) {
    out.extend_from_slice(
        b"event: expired\ndata: {\"error\":\"invalid_token\",\"error_description\":\"",
    );
    out.extend_from_slice(why.description().as_bytes());
    out.extend_from_slice(b"\"}\n\n");
}

/// An event stream, as the connection keeps it between events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    /// The newest version the client has (sent on this stream, or from
    /// `Last-Event-ID`): only newer ones are sent.
    pub last: u64,
    /// The box existed while the stream watched it: should its version read 0
    /// (deleted, expired), the stream sends `event: deleted` and ends. A stream
    /// of an unknown key waits for its creation.
    pub existed: bool,
    /// A stream of many boxes (docs/http.md#many-boxes-at-once): where it
    /// stands with each travels beside it ([`Reply::Stream`]'s `watching`).
    pub many: bool,
}

/// What [`Service::stream_event`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An event with this version was written.
    Sent(u64),
    /// Nothing newer than the stream's `last`.
    Unchanged,
    /// The box is not there (never was, or is gone).
    NoBox,
}

/// Where a stream resumes: `Last-Event-ID` (what a reconnecting `EventSource`
/// sends), else `?last_event_id=`, else 0 (send the box as it is). An id that
/// is not a version pollbox sent (not a decimal number) counts as none.
fn resume_from(frame: &Frame, buf: &[u8], query: Option<u64>) -> u64 {
    let header = frame
        .field(&frame.last_event_id, buf)
        .and_then(|v| parse_decimal(v).ok());
    header.or(query).unwrap_or(0)
}

impl Service {
    /// Start an event stream of the key in `self.key`: the head, the `retry:`
    /// line, and the box at once if it exists and is newer than where the
    /// client resumes from. The connection then keeps the [`Stream`].
    pub(super) fn subscribe<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        last_event_id: Option<u64>,
    ) -> Reply {
        let (frame, buf, out, host) = (x.frame, x.buf, &mut *x.out, &mut *x.host);
        let retry_ms = self.node.config.http.sse_retry_ms;
        self.heads
            .write_stream_head(out, host, RouteLabel::Sse, retry_ms);
        let mut stream = Stream {
            last: resume_from(frame, buf, last_event_id),
            existed: false,
            many: false,
        };
        let key = std::mem::take(&mut self.key);
        match self.stream_event(&key, &mut stream, out, host) {
            Event::Sent(_) | Event::Unchanged => stream.existed = true,
            Event::NoBox => {}
        }
        let reply = Reply::Stream {
            stream,
            key: key.as_slice().into(),
            watching: None,
            room: None,
        };
        self.key = key;
        reply
    }

    /// Append an event with the box of `key` if it is newer than what the
    /// stream sent (`stream.last` moves to it; versions skipped since the last
    /// event are counted as coalesced). No allocation: the payload is copied
    /// from the box table into the service's scratch, then framed into `out`.
    pub fn stream_event<H: Host>(
        &mut self,
        key: &[u8],
        stream: &mut Stream,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Event {
        self.body.clear();
        let Some(version) = super::presence_box::read_box(&self.node, key, &mut self.body) else {
            return Event::NoBox;
        };
        if !crate::presence::moved(key, version, stream.last) {
            return Event::Unchanged;
        }
        // Versions between two events of this stream were coalesced (a box
        // is state: only the newest is sent). The first event skips nothing.
        let skipped = if stream.existed {
            // A forgotten room's presence reads lower (presence::moved).
            version.saturating_sub(stream.last + 1)
        } else {
            0
        };
        write_event(out, version, &self.body);
        stream.last = version;
        stream.existed = true;
        host.sse_event(skipped);
        Event::Sent(version)
    }
}

/// `id: <version>\ndata: <payload>\n\n`.
pub fn write_event(out: &mut Vec<u8>, version: u64, payload: &[u8]) {
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
}
