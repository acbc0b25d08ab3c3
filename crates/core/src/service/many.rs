//! `GET /v1/boxes?keys=a,b,c` (docs/http.md#many-boxes-at-once): many boxes in
//! one answer, a JSON array of their payloads in the order asked (`null` for a
//! box that does not exist), with one ETag for all of them; with `wait_ms` and a
//! current `If-None-Match`, a long-poll answered when any of them moves.
//!
//! The keys of a request are kept decoded in one buffer, each behind its
//! length ([`ManyKeys`]): that is also what a parked poll keeps and what the
//! server registers wake-ups for, one per key. Nothing here allocates once the
//! buffers have grown to the largest request.

use super::{Exchange, Park, Reply, RouteLabel, Service, Stream, Target};
use crate::http::{parse_many_query, percent_decode_into, Method};
use crate::render::write_json_str;
use crate::service::{Answer, Host, ManyKeys};

/// Where a stream of many boxes stands with each of them, in the order of
/// its keys: the newest version the client has (0: none), and whether the box
/// moved since the stream last looked (looked at once the stream's queue is
/// empty: coalescing, box by box). 8 bytes a box and a bit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManyWatch {
    lasts: Box<[u64]>,
    dirty: Box<[u64]>,
}

impl ManyWatch {
    fn new(n: usize) -> ManyWatch {
        ManyWatch {
            lasts: vec![0; n].into(),
            dirty: vec![0; n.div_ceil(64)].into(),
        }
    }

    /// The box `i` may have moved.
    pub fn mark(&mut self, i: usize) {
        if i >= self.lasts.len() {
            return;
        }
        if let Some(w) = self.dirty.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// The number of boxes.
    pub fn len(&self) -> usize {
        self.lasts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lasts.is_empty()
    }

    /// Whether any box is marked.
    pub fn any(&self) -> bool {
        self.dirty.iter().any(|&w| w != 0)
    }

    /// Unmark box `i`; whether it was marked.
    fn take(&mut self, i: usize) -> bool {
        let Some(w) = self.dirty.get_mut(i / 64) else {
            return false;
        };
        let bit = 1 << (i % 64);
        let was = *w & bit != 0;
        *w &= !bit;
        was
    }

    /// Heap bytes it holds.
    pub fn heap_bytes(&self) -> usize {
        (self.lasts.len() + self.dirty.len()) * 8
    }
}

/// The ETag value of boxes at `versions` (0: no such box), in the order
/// asked: FNV-1a over the versions, so any box that moves (or appears, or
/// goes) changes it, and every node of a log computes the same one.
fn tag(versions: impl Iterator<Item = u64>) -> u64 {
    versions.fold(TAG_START, tag_step)
}

/// FNV-1a's offset basis.
const TAG_START: u64 = 0xcbf2_9ce4_8422_2325;

impl Service {
    /// `GET /v1/boxes?keys=...`, with or without `wait_ms`, or a prefix
    /// ([`Service::poll_prefix`]). Kept out of [`Service::answer`], so that
    /// the one-box poll around it stays small enough to inline.
    #[inline(never)]
    pub(super) fn poll_many<H: Host>(&mut self, x: &mut Exchange<'_, H>) -> Reply {
        let (frame, buf) = (x.frame, x.buf);
        let q = match parse_many_query(&buf[frame.query.clone()]) {
            Ok(q) => q,
            Err(what) => return self.error(x, RouteLabel::Poll, 400, what),
        };
        if let Some(prefix) = q.prefix {
            return self.poll_prefix(x, &q, prefix);
        }
        if super::presence_box::names_member(&buf[frame.query.clone()]) {
            return self.error(x, RouteLabel::Poll, 400, super::presence_box::MEMBER_WHERE);
        }
        if let Err(what) = self.decode_keys(q.keys) {
            return self.error(x, RouteLabel::Poll, 400, &what);
        }
        if self.access.reads_need_token {
            let need = crate::auth::Need::Read;
            if let Err(r) = self.check_access(x, RouteLabel::Poll, need, Target::Many) {
                return r;
            }
        }
        if frame.method == Method::Get && super::wants_event_stream(frame, buf) {
            let resume = resume_id(frame, buf, q.last_event_id);
            return self.subscribe_many(x, resume.as_deref());
        }
        let Some(wait) = q.wait_ms else {
            return self.write_many(x, RouteLabel::Poll, false);
        };
        let wait = wait.min(self.node.config.limits.max_wait_ms);
        let now = self.many_tag(&self.key);
        let current = frame
            .field(&frame.if_none_match, buf)
            .is_some_and(|v| super::etag_matches(v, super::render_etag(now, &mut [0; 24])));
        if current && wait > 0 {
            return Reply::Park {
                park: Park {
                    after: now,
                    wait_ms: wait,
                    existed: false,
                    many: true,
                    room: false,
                },
                key: self.key.as_slice().into(),
            };
        }
        self.write_many(x, RouteLabel::LongPoll, false)
    }

    /// The ETag value of the boxes of `keys` ([`ManyKeys`]) as they are now.
    pub fn many_tag(&self, keys: &[u8]) -> u64 {
        tag(ManyKeys(keys).map(|k| self.version(k)))
    }

    /// Start an event stream of the boxes of `self.key`: the head, `retry:`,
    /// then every box newer than where the client resumes from (a
    /// `Last-Event-ID` of this route: [`write_many_id`]), and `event: deleted`
    /// for a box the client had that is gone. The connection then takes
    /// where it stands with each box ([`Reply::Stream`]'s `watching`).
    fn subscribe_many<H: Host>(&mut self, x: &mut Exchange<'_, H>, resume: Option<&[u8]>) -> Reply {
        let (out, host) = (&mut *x.out, &mut *x.host);
        let retry_ms = self.node.config.http.sse_retry_ms;
        self.heads
            .write_stream_head(out, host, RouteLabel::Sse, retry_ms);
        let n = ManyKeys(&self.key).count();
        let mut watching = ManyWatch::new(n);
        if let Some(lasts) = resume.and_then(|r| parse_many_id(r, n)) {
            for (w, last) in watching.lasts.iter_mut().zip(lasts) {
                *w = last;
            }
        }
        for i in 0..n {
            watching.mark(i);
        }
        let keys = std::mem::take(&mut self.key);
        self.stream_many(&keys, &mut watching, out, host);
        let key = keys.as_slice().into();
        self.key = keys;
        Reply::Stream {
            stream: Stream {
                last: 0,
                existed: false,
                many: true,
            },
            key,
            watching: Some(watching),
            room: None,
        }
    }

    /// Append an event for each box of `keys` marked in `watching` that
    /// moved past what the client has: its payload (whose `k` names it), or
    /// `event: deleted` with `{"k":...}` for a box the client had that is gone.
    /// The last event written carries the stream's id ([`write_many_id`]): an
    /// `EventSource` keeps the last id it was sent. Returns the events written.
    pub fn stream_many<H: Host>(
        &mut self,
        keys: &[u8],
        watching: &mut ManyWatch,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> usize {
        let mut sent = 0;
        for (i, key) in ManyKeys(keys).enumerate() {
            if !watching.take(i) {
                continue;
            }
            let Some(last) = watching.lasts.get_mut(i) else {
                break;
            };
            self.body.clear();
            match super::presence_box::read_box(&self.node, key, &mut self.body) {
                Some(version) if crate::presence::moved(key, version, *last) => {
                    // Versions between two events of a box were coalesced; a
                    // first event (or a new incarnation) skips nothing.
                    let skipped = match *last {
                        0 => 0,
                        last => version.saturating_sub(last + 1),
                    };
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(&self.body);
                    out.extend_from_slice(b"\n\n");
                    *last = version;
                    host.sse_event(skipped);
                    sent += 1;
                }
                Some(_) => {}
                None if *last > 0 => {
                    out.extend_from_slice(b"event: deleted\ndata: {\"k\":");
                    write_json_str(std::str::from_utf8(key).unwrap_or_default(), out);
                    out.extend_from_slice(b"}\n\n");
                    *last = 0;
                    host.sse_event(0);
                    sent += 1;
                }
                None => {}
            }
        }
        if sent > 0 {
            // The id goes on the last event: before its blank line.
            out.pop();
            write_many_id(&watching.lasts, out);
            out.push(b'\n');
        }
        sent
    }

    /// Decode the comma-separated raw `keys` into `self.key` ([`ManyKeys`]):
    /// each percent-decoded, none empty or repeated, at most
    /// `limits.max_keys_per_request`.
    fn decode_keys(&mut self, raw: &[u8]) -> Result<(), String> {
        let max = self.node.config.limits.max_keys_per_request;
        self.key.clear();
        if raw.is_empty() {
            return Err("keys is empty".into());
        }
        for (i, raw_key) in raw.split(|&b| b == b',').enumerate() {
            if i == max {
                return Err(format!(
                    "too many keys: at most {max} (limits.max_keys_per_request)"
                ));
            }
            if raw_key.is_empty() {
                return Err(format!("key {} of keys is empty", i + 1));
            }
            let at = self.key.len();
            self.key.extend_from_slice(&[0, 0]);
            percent_decode_into(raw_key, &mut self.scratch)
                .map_err(|_| format!("bad percent-encoding in key {} of keys", i + 1))?;
            if std::str::from_utf8(&self.scratch).is_err() {
                return Err(format!("key {} of keys is not valid UTF-8", i + 1));
            }
            let Ok(len) = u16::try_from(self.scratch.len()) else {
                return Err(format!("key {} of keys is too long", i + 1));
            };
            if ManyKeys(&self.key[..at]).any(|k| k == self.scratch.as_slice()) {
                return Err(format!("key {} of keys is repeated", i + 1));
            }
            self.key[at..at + 2].copy_from_slice(&len.to_le_bytes());
            self.key.extend_from_slice(&self.scratch);
        }
        Ok(())
    }

    /// Answer the boxes of `self.key` ([`ManyKeys`]): 200 with their payloads,
    /// or 304 when `not_modified` (the wait ran out) or `If-None-Match` names
    /// their ETag.
    pub(super) fn write_many<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        route: RouteLabel,
        not_modified: bool,
    ) -> Reply {
        let frame = x.frame;
        self.body.clear();
        self.body.push(b'[');
        let mut h = TAG_START;
        for (i, key) in ManyKeys(&self.key).enumerate() {
            if i > 0 {
                self.body.push(b',');
            }
            let v = match super::presence_box::read_box(&self.node, key, &mut self.body) {
                Some(v) => v,
                None => {
                    self.body.extend_from_slice(b"null");
                    0
                }
            };
            h = tag_step(h, v);
        }
        self.body.push(b']');
        let not_modified = not_modified
            || frame
                .field(&frame.if_none_match, x.buf)
                .is_some_and(|v| super::etag_matches(v, super::render_etag(h, &mut [0; 24])));
        let a = Answer {
            head_only: frame.method == Method::Head || not_modified,
            etag: Some(h),
            ..x.json(route, if not_modified { 304 } else { 200 })
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }
}

/// Where a stream of many boxes or of a prefix resumes: `Last-Event-ID`, else
/// `?last_event_id=` percent-decoded (its commas may come escaped, %2C).
pub(super) fn resume_id(
    frame: &crate::http::Frame,
    buf: &[u8],
    query: Option<&[u8]>,
) -> Option<Vec<u8>> {
    match (frame.field(&frame.last_event_id, buf), query) {
        (Some(header), _) => Some(header.to_vec()),
        (None, Some(raw)) => {
            let mut id = Vec::new();
            percent_decode_into(raw, &mut id).ok().map(|()| id)
        }
        (None, None) => None,
    }
}

/// `id: v1,v2,...\n`: the version of each box the client has, in the order
/// of the keys, in hexadecimal (empty for none): opaque to clients, and
/// cheaper to write than decimal (a stream of 64 boxes writes 64 of them an
/// event). A reconnecting `EventSource` sends it back as `Last-Event-ID`, and
/// is sent only the boxes that moved since.
fn write_many_id(lasts: &[u64], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(b"id: ");
    for (i, &last) in lasts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if last > 0 {
            let digits = (64 - last.leading_zeros()).div_ceil(4);
            for d in (0..digits).rev() {
                out.push(HEX[((last >> (d * 4)) & 0xf) as usize]);
            }
        }
    }
    out.push(b'\n');
}

/// The versions a [`write_many_id`] id names, if it is one for `n` boxes
/// (anything else is no id: every box is sent).
fn parse_many_id(id: &[u8], n: usize) -> Option<impl Iterator<Item = u64> + '_> {
    let hex = |p: &[u8]| -> Option<u64> {
        if p.is_empty() {
            return Some(0);
        }
        if p.len() > 16 || !p.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        u64::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok()
    };
    let parts = id.split(|&b| b == b',');
    if parts.clone().count() != n || !parts.clone().all(|p| hex(p).is_some()) {
        return None;
    }
    Some(parts.map(move |p| hex(p).unwrap_or(0)))
}

/// One version into [`tag`]'s hash.
#[inline]
fn tag_step(mut h: u64, v: u64) -> u64 {
    for b in v.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_changes_when_any_version_does_and_with_the_order() {
        let t = tag([5, 0, 7].into_iter());
        assert_eq!(t, tag_step(tag_step(tag_step(TAG_START, 5), 0), 7));
        assert_ne!(t, tag([5, 0, 8].into_iter()));
        assert_ne!(t, tag([5, 1, 7].into_iter()));
        assert_ne!(t, tag([7, 0, 5].into_iter()));
        assert_ne!(t, tag([5, 0].into_iter()));
    }

    #[test]
    fn ids_name_each_version_in_hex_and_read_back() {
        let mut out = Vec::new();
        write_many_id(&[0x1f, 0, 1_795_657_023_903_262, u64::MAX], &mut out);
        let want = format!("id: 1f,,{:x},ffffffffffffffff\n", 1_795_657_023_903_262u64);
        assert_eq!(out, want.as_bytes());
        let id = &out[4..out.len() - 1];
        let back: Vec<u64> = parse_many_id(id, 4).expect("an id of 4").collect();
        assert_eq!(back, [0x1f, 0, 1_795_657_023_903_262, u64::MAX]);
        assert!(parse_many_id(id, 3).is_none(), "another count");
        assert!(parse_many_id(b"1,x,3", 3).is_none());
        assert!(parse_many_id(b"1,+2,3", 3).is_none());
        assert!(
            parse_many_id(b"10000000000000000,,", 3).is_none(),
            "past u64"
        );
    }

    #[test]
    fn watching_marks_and_takes_each_box_once() {
        let mut w = ManyWatch::new(70);
        assert!(!w.any());
        w.mark(3);
        w.mark(69);
        w.mark(70); // past the end: nothing
        assert!(w.any());
        assert!(w.take(69) && !w.take(69) && !w.take(2) && w.take(3));
        assert!(!w.any());
        assert_eq!(w.heap_bytes(), 70 * 8 + 2 * 8);
    }

    #[test]
    fn keys_iterate_as_encoded() {
        let mut enc = Vec::new();
        for k in [&b"a"[..], b"", b"caf\xc3\xa9"] {
            enc.extend_from_slice(&(k.len() as u16).to_le_bytes());
            enc.extend_from_slice(k);
        }
        let keys: Vec<&[u8]> = ManyKeys(&enc).collect();
        assert_eq!(keys, vec![&b"a"[..], b"", b"caf\xc3\xa9"]);
        assert_eq!(
            ManyKeys(&enc[..enc.len() - 1]).count(),
            2,
            "a cut key ends it"
        );
    }
}
