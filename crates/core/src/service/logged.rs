//! Ingest and `DELETE` on a node of a log (docs/operations.md#the-kafka-log):
//! each accepted message is produced to the topic instead of applied, and the
//! answer waits until the log has it *and* this node applied it, so it is the
//! answer a standalone node gives (the box's new payload, the batch's counts)
//! and a poll of this node afterwards sees the update.
//!
//! The service checks the body exactly as standalone (a bad message never
//! reaches the log), hands each record to [`Host::produce`] and returns
//! [`Reply::Log`] with the [`Pending`] wait; the connection then holds it
//! like a parked long-poll, and the server reports
//! each record's fate to it ([`Report`]: applied here, refused by the apply,
//! or not taken by the log). Once every record is reported, or the wait runs
//! out (`log.ack_timeout_ms`: 503 "log unavailable"), [`Service::answer_logged`]
//! writes the answer.
//!
//! A standalone node with a write-ahead file takes the same path
//! (docs/operations.md#the-write-ahead-file): the file is a local log of one
//! partition, the host appends the records to it, and reports each once it
//! is synced and applied (or 503 with [`Host::unavailable`]'s reason: a full
//! disk, a failed sync).

use super::ingest::refuse;
use super::{Answer, Exchange, Host, IngestResult, LogRecord, Reply, Request, RouteLabel, Service};
use crate::log::Report;
use crate::plan::MessageError;
use crate::projection::{BodyFormat, KeySource, Shape};

/// What an ingest or a `DELETE` waits for on a node of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The host's id for this request's records.
    pub request: u64,
    /// Records produced; each is reported once.
    pub records: u32,
    kind: Kind,
    route: RouteLabel,
    /// Messages not produced because the log took none (counted as
    /// `log_unavailable`).
    unsent: u64,
    /// Produced messages the apply refused, by what they are counted as.
    refused_by: [u64; IngestResult::ALL.len()],
    reported: u32,
    /// Messages applied, and refused (before producing or by the apply).
    accepted: u64,
    rejected: u64,
    /// The batch answer's error entries so far, at most [`MAX_LISTED`].
    errors: Vec<u8>,
    listed: usize,
    /// A single message's or a delete's outcome.
    single: Option<Report>,
    failed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// One message for this key: answered with the box's payload.
    Single { key: Vec<u8> },
    /// An array or NDJSON: answered with counts.
    Batch,
    /// `DELETE` of this key.
    Delete { key: Vec<u8> },
}

/// At most this many errors are listed in a batch answer.
const MAX_LISTED: usize = super::ingest::MAX_LISTED_ERRORS;

impl Pending {
    fn new(kind: Kind, route: RouteLabel) -> Pending {
        Pending {
            request: 0,
            records: 0,
            kind,
            route,
            unsent: 0,
            refused_by: [0; IngestResult::ALL.len()],
            reported: 0,
            accepted: 0,
            rejected: 0,
            errors: Vec::new(),
            listed: 0,
            single: None,
            failed: false,
        }
    }

    /// Every produced record has been reported.
    pub fn complete(&self) -> bool {
        self.reported >= self.records
    }

    /// Record `index`'s fate (`index` as given to [`Host::produce`]: the
    /// message's place in the body). Returns whether every record is now
    /// reported.
    pub fn report(&mut self, index: u32, report: Report, plan: &crate::plan::Plan) -> bool {
        self.report_many(index, report, 1, plan)
    }

    /// Record the fate of `count` records that met the same one: a batch's
    /// records applied by one pass of the consuming thread are reported
    /// together, so a batch costs its connection a few reports, not one a
    /// record. Only `Applied` and `NoBox` come counted (a refusal names its
    /// record's `index` in the answer, a failure ends the wait); any other
    /// report counts once. Returns whether every record is now reported.
    pub fn report_many(
        &mut self,
        index: u32,
        report: Report,
        count: u32,
        plan: &crate::plan::Plan,
    ) -> bool {
        if self.complete() {
            return true;
        }
        let count = match report {
            Report::Applied | Report::NoBox => count.clamp(1, self.records - self.reported),
            Report::Refused(_) | Report::Failed => 1,
        };
        self.reported += count;
        match report {
            Report::Applied => self.accepted += u64::from(count),
            Report::NoBox => {}
            Report::Refused(e) => {
                self.rejected += 1;
                self.refused_by[IngestResult::of(&e) as usize] += 1;
                self.list(index as usize, |t| e.write_reason(plan, t));
            }
            Report::Failed => self.failed = true,
        }
        if !matches!(self.kind, Kind::Batch) {
            self.single = Some(report);
        }
        self.complete()
    }

    /// A message refused before it was produced.
    fn refuse(&mut self, index: usize, e: &MessageError, plan: &crate::plan::Plan) {
        self.rejected += 1;
        self.list(index, |t| e.write_reason(plan, t));
    }

    fn list(&mut self, index: usize, reason: impl FnOnce(&mut Vec<u8>)) {
        if self.listed >= MAX_LISTED {
            return;
        }
        if self.listed > 0 {
            self.errors.push(b',');
        }
        self.errors.extend_from_slice(b"{\"i\":");
        self.errors
            .extend_from_slice(itoa::Buffer::new().format(index).as_bytes());
        self.errors.extend_from_slice(b",\"error\":\"");
        reason(&mut self.errors);
        self.errors.extend_from_slice(b"\"}");
        self.listed += 1;
    }

    /// Heap bytes held while waiting.
    pub fn heap_bytes(&self) -> usize {
        self.errors.capacity()
            + match &self.kind {
                Kind::Single { key } | Kind::Delete { key } => key.capacity(),
                Kind::Batch => 0,
            }
    }
}

impl Service {
    /// `POST` on a node of a log: check the body as standalone, produce each
    /// accepted message (its key, its object's bytes), and wait.
    pub(super) fn ingest_logged<H: Host>(
        &mut self,
        x: &mut Exchange<'_, H>,
        keys: KeySource,
    ) -> Reply {
        let route = match keys {
            KeySource::Path => RouteLabel::IngestKey,
            KeySource::Body => RouteLabel::Ingest,
        };
        let format = match x.frame.field(&x.frame.content_type, x.buf) {
            Some(ct) if super::ingest::is_ndjson(ct) => BodyFormat::Ndjson,
            _ => BodyFormat::Json,
        };
        let body = &x.buf[x.frame.body.clone()];
        let Service {
            node,
            access,
            arena,
            projector,
            key: path_key,
            now_s,
            ..
        } = self;
        let scopes = super::access::write_scopes(access, &mut *x.creds, x.frame, x.buf, *now_s);
        let boxes = &node.boxes;
        let plan = boxes.plan();
        let batch = match projector.project(arena.bump(), body, format, keys) {
            Ok(b) => b,
            Err(e) => {
                x.host.ingested(IngestResult::of_body(&e), 1);
                let a = x.json(route, e.status());
                refuse(
                    &self.heads,
                    x.out,
                    x.host,
                    a,
                    e.status(),
                    &mut self.body,
                    |t| e.write_message(t),
                );
                return x.reply();
            }
        };
        let single = batch.shape == Shape::Object;
        let kind = if single {
            Kind::Single { key: Vec::new() }
        } else {
            Kind::Batch
        };
        let mut p = Pending::new(kind, route);
        p.request = x.host.log_request();
        let mut records = Vec::with_capacity(batch.items.len());
        for (i, item) in batch.items.iter().enumerate() {
            let m = match item {
                Ok(m) => m,
                Err(e) => {
                    x.host.ingested(IngestResult::of(e), 1);
                    p.refuse(i, e, plan);
                    p.single = Some(Report::Refused(*e));
                    continue;
                }
            };
            let key: &[u8] = match keys {
                KeySource::Path => path_key,
                KeySource::Body => m.key.as_bytes(),
            };
            // What the apply would refuse for any state, refused now: the
            // key's length, and a new box past max_boxes.
            let refusal = if !super::access::may_write(scopes, key) {
                x.host.auth_refused(super::AuthRefused::Forbidden);
                Some(MessageError::Forbidden)
            } else if key.is_empty() {
                Some(MessageError::EmptyKey)
            } else if key.len() > plan.max_key_bytes {
                Some(MessageError::KeyTooLong)
            } else if crate::plan::reserved_key(key) {
                Some(MessageError::ReservedKey)
            } else if boxes.len() >= plan.max_boxes && boxes.version(key).is_none() {
                Some(MessageError::TooManyBoxes)
            } else {
                None
            };
            if let Kind::Single { key: k } = &mut p.kind {
                k.extend_from_slice(key);
            }
            if let Some(e) = refusal {
                x.host.ingested(IngestResult::of(&e), 1);
                p.refuse(i, &e, plan);
                p.single = Some(Report::Refused(e));
                continue;
            }
            records.push(LogRecord {
                index: i as u32,
                key,
                value: body.get(m.span.0 as usize..m.span.1 as usize),
                values: m.values,
            });
        }
        // One batch: the log takes all of it, or (its client's queue full)
        // part or none, and the rest is not produced.
        if !records.is_empty() {
            let taken = x.host.produce(p.request, &records).min(records.len());
            p.records = taken as u32;
            let unsent = records.len() - taken;
            if unsent > 0 {
                p.failed = true;
                p.unsent += unsent as u64;
            }
        }
        drop(records);
        drop(batch);
        if p.records == 0 {
            // Nothing to wait for: every message was refused, or the log
            // took none of them.
            return self.answer_pending(x, &mut p);
        }
        Reply::Log(Box::new(p))
    }

    /// `DELETE` on a node of a log: produce a tombstone for an existing box
    /// and wait (404 at once for an unknown key).
    pub(super) fn delete_logged<H: Host>(&mut self, x: &mut Exchange<'_, H>) -> Reply {
        if self.node.boxes.version(&self.key).is_none() {
            return self.error(x, RouteLabel::Delete, 404, "no such box");
        }
        let key = self.key.clone();
        let mut p = Pending::new(Kind::Delete { key }, RouteLabel::Delete);
        p.request = x.host.log_request();
        let tombstone = LogRecord {
            index: 0,
            key: &self.key,
            value: None,
            values: &[],
        };
        if x.host.produce(p.request, &[tombstone]) == 0 {
            p.failed = true;
            return self.answer_pending(x, &mut p);
        }
        p.records = 1;
        Reply::Log(Box::new(p))
    }

    /// Answer a logged ingest or `DELETE` whose records are all reported, or
    /// whose wait ran out (`timed_out`: 503 "log unavailable").
    pub fn answer_logged<H: Host>(
        &mut self,
        request: Request<'_>,
        mut p: Pending,
        timed_out: bool,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Reply {
        let Request { frame, buf, .. } = request;
        self.heads.begin(frame.field(&frame.origin, buf));
        if timed_out && !p.complete() {
            p.failed = true;
        }
        // Its access was checked when its records were produced.
        let creds = &mut crate::auth::Credentials::default();
        let x = &mut Exchange::new(request, out, host, creds);
        self.answer_pending(x, &mut p)
    }

    fn answer_pending<H: Host>(&mut self, x: &mut Exchange<'_, H>, p: &mut Pending) -> Reply {
        let route = p.route;
        for (i, &n) in p.refused_by.iter().enumerate() {
            x.host.ingested(IngestResult::ALL[i], n);
        }
        if p.failed {
            // Produced and not known to be applied or refused, and not sent:
            // the client retries them (at least once).
            let refused: u64 = p.refused_by.iter().sum();
            let unknown = u64::from(p.records) - p.accepted - refused + p.unsent;
            x.host.ingested(IngestResult::LogUnavailable, unknown);
            x.host.ingested(IngestResult::Accepted, p.accepted);
            // The host says why: the log is away, the write-ahead file's disk
            // is full or its sync failed.
            let why = x.host.unavailable();
            return self.error(x, route, 503, why);
        }
        match std::mem::replace(&mut p.kind, Kind::Batch) {
            Kind::Delete { key } => match p.single {
                Some(Report::Applied) => {
                    // Removed by this node's apply of the tombstone, which
                    // woke the box's waiters and counted it
                    // (`pollbox_log_records_total{result="deleted"}`).
                    let _ = key;
                    let a = Answer {
                        content_type: b"",
                        ..x.json(route, 204)
                    };
                    self.heads.write(x.out, x.host, &a, b"");
                    x.reply()
                }
                _ => self.error(x, route, 404, "no such box"),
            },
            Kind::Single { key } => match p.single {
                Some(Report::Refused(MessageError::Forbidden)) => {
                    // As standalone: the key, and what the token lacks
                    // (counted when the message was refused).
                    super::access::forbidden_body(&mut self.body, &key, None);
                    let a = Answer {
                        extra: &[(b"WWW-Authenticate", super::access::INSUFFICIENT_SCOPE)],
                        ..x.json(route, 403)
                    };
                    self.heads.write(x.out, x.host, &a, &self.body);
                    x.reply()
                }
                Some(Report::Refused(e)) => {
                    let plan = self.node.boxes.plan();
                    let a = x.json(route, e.status());
                    refuse(
                        &self.heads,
                        x.out,
                        x.host,
                        a,
                        e.status(),
                        &mut self.body,
                        |t| e.write_reason(plan, t),
                    );
                    x.reply()
                }
                _ => {
                    x.host.ingested(IngestResult::Accepted, p.accepted);
                    self.body.clear();
                    // The box as this node has it now: this message applied,
                    // and whatever the log held after it.
                    if self.node.boxes.poll(&key, &mut self.body).is_none() {
                        return self.error(x, route, 404, "no such box");
                    }
                    let a = x.json(route, 200);
                    self.heads.write(x.out, x.host, &a, &self.body);
                    x.reply()
                }
            },
            Kind::Batch => {
                x.host.ingested(IngestResult::Accepted, p.accepted);
                let b = &mut self.body;
                b.clear();
                b.extend_from_slice(b"{\"accepted\":");
                b.extend_from_slice(itoa::Buffer::new().format(p.accepted).as_bytes());
                b.extend_from_slice(b",\"rejected\":");
                b.extend_from_slice(itoa::Buffer::new().format(p.rejected).as_bytes());
                b.extend_from_slice(b",\"errors\":[");
                b.extend_from_slice(&p.errors);
                b.extend_from_slice(b"]}");
                let a = x.json(route, 200);
                self.heads.write(x.out, x.host, &a, &self.body);
                x.reply()
            }
        }
    }
}
