//! The verdict on one answer against its request: the status its operation expects,
//! the payload's shape and key, versions never going backwards on the connection,
//! and for the many-box operations the ETag against the `If-None-Match` sent.
//!
//! What it is not: the framing of the answer (`crate::response` parses it, the
//! driver reads it), nor the counting of verdicts into the statistics (the driver's).

use super::connection::InFlight;
use super::key_sets::{etag_id, KeySets};
use super::versions::Versions;
use super::Plan;
use crate::mix::Op;
use crate::request::{KeyNames, MAX_KEY_NAME};
use crate::response::{array_items, batch_counts, payload_version};
use crate::stats::ErrorKind;

/// The verdict on one answer: the error it counts as, if any, and the messages the
/// server says it accepted.
pub(super) struct Verdict {
    pub(super) error: Option<ErrorKind>,
    pub(super) accepted: u64,
    /// Many-box answers: the boxes that were `null` (no box yet).
    pub(super) missing: u64,
}

impl Verdict {
    const OK: Verdict = Verdict {
        error: None,
        accepted: 0,
        missing: 0,
    };

    pub(super) fn error(kind: ErrorKind) -> Verdict {
        Verdict {
            error: Some(kind),
            ..Verdict::OK
        }
    }
}

/// Checks an answer against its request: the status the operation expects, the payload's
/// shape and key, and that the box's version does not go backwards on this connection.
#[inline]
pub(super) fn check(
    plan: &Plan,
    versions: &mut Versions,
    sets: &mut KeySets,
    request: &InFlight,
    status: u16,
    body: &[u8],
    etag: Option<&[u8]>,
) -> Verdict {
    let mut name = [0u8; MAX_KEY_NAME];
    match (request.op, status) {
        (Op::PollMany | Op::LongPollMany, 200 | 304) => check_many(
            plan.requests.names(),
            versions,
            sets,
            request,
            status,
            body,
            etag,
        ),
        (Op::Poll, 200) | (Op::Ingest, 200) | (Op::LongPoll, 200) => {
            let n = plan.requests.key_name(request.key, &mut name);
            let Ok(version) = payload_version(body, &name[..n]) else {
                return Verdict::error(ErrorKind::Payload);
            };
            if request.op == Op::Ingest {
                if let Some(p) = &plan.published {
                    p.record(request.key, version, request.intended);
                }
            }
            let last = versions.get(request.key);
            let in_order = match request.op {
                // This connection's ingest made a new version.
                Op::Ingest => version > last,
                // A long-poll answers 200 only for a version newer than `after`.
                Op::LongPoll => version > request.after && version >= last,
                _ => version >= last,
            };
            if version > last {
                versions.set(request.key, version);
            }
            match (in_order, request.op) {
                (false, _) => Verdict::error(ErrorKind::Version),
                (true, Op::Ingest) => Verdict {
                    accepted: 1,
                    ..Verdict::OK
                },
                (true, _) => Verdict::OK,
            }
        }
        (Op::Poll | Op::LongPoll, 404) | (Op::LongPoll, 304) => Verdict::OK,
        (Op::Batch, 200) => match batch_counts(body) {
            Ok((accepted, rejected)) => {
                let error = if accepted + rejected != plan.requests.batch_size() as u64 {
                    Some(ErrorKind::Payload)
                } else if rejected > 0 {
                    Some(ErrorKind::Rejected)
                } else {
                    None
                };
                Verdict {
                    error,
                    accepted,
                    ..Verdict::OK
                }
            }
            Err(_) => Verdict::error(ErrorKind::Payload),
        },
        _ => Verdict::error(ErrorKind::Status),
    }
}

/// Checks a many-box answer: its ETag against the `If-None-Match` sent (a 304 names
/// it, a 200 does not), and a 200's array: one element per key asked, each `null` or
/// that key's payload, in order, no version going backwards on this connection. The
/// ETag of an answer that passes is kept for the set's next request.
pub(super) fn check_many(
    names: KeyNames,
    versions: &mut Versions,
    sets: &mut KeySets,
    request: &InFlight,
    status: u16,
    body: &[u8],
    etag: Option<&[u8]>,
) -> Verdict {
    let Some(etag) = etag else {
        return Verdict::error(ErrorKind::Payload);
    };
    let sent = request.after;
    let set = request.key;
    if status == 304 {
        // Only a request whose If-None-Match is current gets a 304, and it names it.
        if sent == 0 {
            return Verdict::error(ErrorKind::Status);
        }
        if etag_id(etag) != sent {
            return Verdict::error(ErrorKind::Payload);
        }
        sets.set_etag(set, etag);
        return Verdict::OK;
    }
    let mut name = [0u8; MAX_KEY_NAME];
    let mut items = array_items(body);
    let mut missing = 0;
    let mut in_order = true;
    for &key in sets.keys(set) {
        let Some(Ok(item)) = items.next() else {
            return Verdict::error(ErrorKind::Payload);
        };
        if item == b"null" {
            missing += 1;
            continue;
        }
        let n = names.write(key, &mut name);
        let Ok(version) = payload_version(item, &name[..n]) else {
            return Verdict::error(ErrorKind::Payload);
        };
        let last = versions.get(key);
        if version < last {
            in_order = false;
        } else if version > last {
            versions.set(key, version);
        }
    }
    if items.next().is_some() {
        // More elements than keys, or bytes after them.
        return Verdict::error(ErrorKind::Payload);
    }
    // A 200 to a current If-None-Match: the boxes did not move, yet the answer says so.
    let error = if !in_order || etag_id(etag) == sent {
        Some(ErrorKind::Version)
    } else {
        sets.set_etag(set, etag);
        None
    };
    Verdict {
        error,
        missing,
        ..Verdict::OK
    }
}
