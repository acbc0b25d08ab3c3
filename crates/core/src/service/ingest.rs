//! `POST /v1/boxes/{key}` and `POST /v1/ingest`: the body parsed into the
//! worker's arena, each message applied to the box table, the answer written.

use super::access::{may_write, write_forbidden, write_scopes, AuthRefused};
use super::{Answer, Exchange, Heads, Host, IngestResult, Reply, RouteLabel, Service};
use crate::plan::MessageError;
use crate::projection::{BodyFormat, KeySource, Shape};

/// At most this many errors are listed in a batch answer (docs/http.md#ingest).
pub(super) const MAX_LISTED_ERRORS: usize = 16;

impl Service {
    pub(super) fn ingest<H: Host>(&mut self, x: &mut Exchange<'_, H>, keys: KeySource) -> Reply {
        let route = match keys {
            KeySource::Path => RouteLabel::IngestKey,
            KeySource::Body => RouteLabel::Ingest,
        };
        let answer = x.json(route, 200);
        let (frame, buf, out, host) = (x.frame, x.buf, &mut *x.out, &mut *x.host);
        let creds = &mut *x.creds;
        let format = match frame.field(&frame.content_type, buf) {
            Some(ct) if is_ndjson(ct) => BodyFormat::Ndjson,
            _ => BodyFormat::Json,
        };
        // Split the service: the batch borrows the arena while answers are written.
        let Service {
            node,
            access,
            arena,
            projector,
            heads,
            key: path_key,
            body: text,
            now_ms,
            now_s,
            ..
        } = self;
        let now_ms = *now_ms;
        // The token passed the route's check: its write scope, message by message.
        let scopes = write_scopes(access, creds, frame, buf, *now_s);
        let boxes = &node.boxes;
        text.clear();
        let batch = match projector.project(arena.bump(), &buf[frame.body.clone()], format, keys) {
            Ok(b) => b,
            Err(e) => {
                host.ingested(IngestResult::of_body(&e), 1);
                refuse(heads, out, host, answer, e.status(), text, |t| {
                    e.write_message(t)
                });
                return x.reply();
            }
        };
        if batch.shape == Shape::Object {
            // One message: answer with the box's new payload, or 422/507.
            let (key, result) = match batch.items.first() {
                Some(Ok(m)) => {
                    let key = match keys {
                        KeySource::Path => std::str::from_utf8(path_key).unwrap_or(""),
                        KeySource::Body => m.key,
                    };
                    if !may_write(scopes, key.as_bytes()) {
                        host.ingested(IngestResult::Forbidden, 1);
                        write_forbidden(heads, out, host, answer, text, key.as_bytes());
                        return x.reply();
                    }
                    (key, boxes.apply(key, m.values, now_ms, Some(text)))
                }
                Some(Err(e)) => ("", Err(*e)),
                None => ("", Err(MessageError::NotAnObject)),
            };
            match result {
                Ok(_) => {
                    host.box_updated(key.as_bytes());
                    boxes.lanes().publish();
                    host.ingested(IngestResult::Accepted, 1);
                    heads.write(out, host, &answer, text);
                }
                Err(e) => {
                    host.ingested(IngestResult::of(&e), 1);
                    let plan = boxes.plan();
                    refuse(heads, out, host, answer, e.status(), text, |t| {
                        e.write_reason(plan, t)
                    });
                }
            }
            return x.reply();
        }
        // A batch: apply in order, list up to 16 errors.
        let mut accepted = 0u64;
        let mut rejected = 0u64;
        text.extend_from_slice(b"{\"accepted\":");
        let counts_at = text.len();
        text.extend_from_slice(b",\"errors\":[");
        for (i, item) in batch.items.iter().enumerate() {
            let res = match item {
                Ok(m) if !may_write(scopes, m.key.as_bytes()) => {
                    host.auth_refused(AuthRefused::Forbidden);
                    Err(crate::plan::MessageError::Forbidden)
                }
                Ok(m) => boxes.apply(m.key, m.values, now_ms, None).map(|_| {
                    // Told, then published: a reader at the new cut has
                    // its wake-up (docs/boxes.md#watermarks).
                    host.box_updated(m.key.as_bytes());
                    boxes.lanes().publish();
                }),
                Err(e) => Err(*e),
            };
            match res {
                Ok(()) => accepted += 1,
                Err(e) => {
                    host.ingested(IngestResult::of(&e), 1);
                    if (rejected as usize) < MAX_LISTED_ERRORS {
                        if rejected > 0 {
                            text.push(b',');
                        }
                        text.extend_from_slice(b"{\"i\":");
                        text.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
                        text.extend_from_slice(b",\"error\":\"");
                        e.write_reason(boxes.plan(), text);
                        text.extend_from_slice(b"\"}");
                    }
                    rejected += 1;
                }
            }
        }
        host.ingested(IngestResult::Accepted, accepted);
        text.extend_from_slice(b"]}");
        // The counts are known only now: splice them in before the error list.
        let mut counts = [0u8; 64];
        let mut n = 0;
        for part in [
            itoa::Buffer::new().format(accepted).as_bytes(),
            b",\"rejected\":",
            itoa::Buffer::new().format(rejected).as_bytes(),
        ] {
            counts[n..n + part.len()].copy_from_slice(part);
            n += part.len();
        }
        text.splice(counts_at..counts_at, counts[..n].iter().copied());
        heads.write(out, host, &answer, text);
        x.reply()
    }
}

/// Answer `{"error":"<reason>"}` with `code` (the reason needs no escaping).
pub(super) fn refuse<H: Host>(
    heads: &Heads,
    out: &mut Vec<u8>,
    host: &mut H,
    answer: Answer<'_>,
    code: u16,
    text: &mut Vec<u8>,
    reason: impl FnOnce(&mut Vec<u8>),
) {
    text.clear();
    text.extend_from_slice(b"{\"error\":\"");
    reason(text);
    text.extend_from_slice(b"\"}");
    heads.write(out, host, &Answer { code, ..answer }, text);
}

pub(super) fn is_ndjson(content_type: &[u8]) -> bool {
    let mime = content_type
        .split(|&b| b == b';')
        .next()
        .unwrap_or(b"")
        .trim_ascii();
    mime.eq_ignore_ascii_case(b"application/x-ndjson")
        || mime.eq_ignore_ascii_case(b"application/ndjson")
        || mime.eq_ignore_ascii_case(b"application/jsonl")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ndjson_content_types() {
        assert!(super::is_ndjson(b"application/x-ndjson; charset=utf-8"));
        assert!(super::is_ndjson(b"Application/NDJSON"));
        assert!(!super::is_ndjson(b"application/json"));
    }
}
