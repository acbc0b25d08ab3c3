//! The request loop: frame the next request, admit it, answer it through the
//! service, and hold it when it waits (a parked long-poll, a logged ingest, a
//! stream); then the answers of held requests when they end.
//!
//! What it is not: the rules of a route ([`crate::service`]) or the reading of
//! bytes (the connection's read buffer).

use super::held::token_end_ms;
use super::*;

/// What [`admit`] decided.
#[derive(Clone, Copy)]
pub(super) enum Screen {
    Serve,
    /// Serve it; one of the client's held requests was taken for it.
    Held,
    /// A probe on a connection over its client's cap: serve it, then close.
    ProbeThenClose,
    /// Its 429 is written.
    Refused,
    /// Its 429 is written; then close.
    RefusedThenClose,
}

/// The per-client limits' step before a request of a limited connection is
/// answered, when [`Admission::admit_common`] did not let it through; a
/// refusal's 429 is written into `out`. Out of line, so `serve`'s loop is as
/// it was with the limits off (callgrind: with the whole step inline the loop
/// stopped inlining the answer, +45 instructions a poll).
#[inline(never)]
pub(super) fn admit<H: Host>(
    client: &mut Admission,
    r: &Request<'_>,
    now_ms: u64,
    out: &mut Vec<u8>,
    service: &mut Service,
    host: &mut H,
) -> Screen {
    let table = &service.node().clients;
    let now_us = now_ms.saturating_mul(1000);
    let (refusal, close) = match client.admit(r.frame, r.buf, table, now_us) {
        Admit::Serve => return Screen::Serve,
        Admit::Held => return Screen::Held,
        Admit::ProbeThenClose => return Screen::ProbeThenClose,
        Admit::Refuse { refusal, close } => (refusal, close),
    };
    let keep_alive = r.keep_alive && !close;
    match service.refuse_client(refusal, Some((r.frame, r.buf)), keep_alive, out, host) {
        Reply::KeepAlive => Screen::Refused,
        _ => Screen::RefusedThenClose,
    }
}

/// RFC 9112 §3.2: a request has at most one `Host`, and an HTTP/1.1 request
/// exactly one; HTTP/1.0 may omit it.
pub(super) fn host_error(frame: &Frame) -> Option<HttpError> {
    match frame.hosts {
        1 => None,
        0 if frame.version == Version::Http10 => None,
        0 => Some(HttpError::MissingHost),
        _ => Some(HttpError::MultipleHost),
    }
}

/// A request that could not be framed, which starts as a PROXY v2 header
/// does: a proxy the node does not trust (its operator forgot
/// `server.trusted_proxies`) is told so, not "bare LF".
#[cold]
fn untrusted_proxy_header(buf: &[u8]) -> Option<HttpError> {
    buf.starts_with(&crate::clients::proxy::SIGNATURE)
        .then_some(HttpError::UntrustedProxyHeader)
}

impl Connection {
    /// Frame and answer every complete request in the buffer, in order, until
    /// one parks or the connection closes.
    pub(super) fn serve<H: Host>(&mut self, cx: &mut Ctx<'_, H>) {
        cx.service.set_now(cx.now_ms);
        if self.client.awaits_proxy_header() && !self.take_proxy_header(cx) {
            self.update_deadline(cx);
            return;
        }
        let limited = self.client.limited();
        while self.closing.is_none() && matches!(self.wait, Wait::None) && self.rstart < self.rend {
            let progress = self.framer.advance(&mut self.rbuf[self.rstart..self.rend]);
            let Ctx {
                service,
                buffers,
                host,
                ..
            } = cx;
            // Matched by reference: moving the frame out of `progress` is a
            // `memcpy` call per request (callgrind); only a parked poll keeps it.
            match &progress {
                &Ok(Progress::Partial { send_continue }) => {
                    // The Host rule needs only the head: a request that breaks
                    // it is refused now, not once its body is in (nor told
                    // 100 Continue first).
                    if let Some(e) = self.framer.awaited_head().and_then(host_error) {
                        self.sendq
                            .append(&mut buffers.send, |out| service.refuse(e, out, *host));
                        self.linger(cx.now_ms);
                        break;
                    }
                    if send_continue {
                        self.sendq
                            .append(&mut buffers.send, |out| out.extend_from_slice(CONTINUE));
                        host.answered(RouteLabel::Other, 100);
                    }
                    break;
                }
                Ok(Progress::Complete(frame)) => {
                    if let Some(e) = host_error(frame) {
                        self.sendq
                            .append(&mut buffers.send, |out| service.refuse(e, out, *host));
                        self.linger(cx.now_ms);
                        break;
                    }
                    let keep_alive = frame.keep_alive && !host.draining();
                    self.last_was_post = frame.method == Method::Post;
                    let buf = &self.rbuf[self.rstart..self.rend];
                    let listener = self.listener;
                    let creds = &mut self.creds;
                    let client = &mut self.client;
                    let mut held = false;
                    let r = self.sendq.append(&mut buffers.send, |out| {
                        let mut keep_alive = keep_alive;
                        if limited && !client.admit_common(frame, cx.now_ms) {
                            let request = Request {
                                frame,
                                buf,
                                keep_alive,
                            };
                            match admit(client, &request, cx.now_ms, out, service, *host) {
                                Screen::Serve => {}
                                Screen::Held => held = true,
                                Screen::ProbeThenClose => keep_alive = false,
                                Screen::Refused => return Reply::KeepAlive,
                                Screen::RefusedThenClose => return Reply::Close,
                            }
                        }
                        let request = Request {
                            frame,
                            buf,
                            keep_alive,
                        };
                        service.answer(listener, request, out, *host, creds)
                    });
                    // A presence connection's hold: kept by a long-poll that
                    // waits or a stream, let go by anything answered at once.
                    let presence = service.take_joined();
                    if held && !matches!(r, Reply::Park { .. } | Reply::Stream { .. }) {
                        // Not held after all (answered at once): give it back.
                        self.client.unhold();
                    }
                    match r {
                        Reply::KeepAlive => {}
                        Reply::Close => self.closing = Some(Closing::AfterSend),
                        Reply::Park { park: p, key } => {
                            let frame = frame.clone();
                            let token_end_ms = token_end_ms(&mut self.creds, cx);
                            self.hold_request(cx.buffers);
                            self.begin_wait(Wait::Parked(Box::new(Parked {
                                frame,
                                key,
                                park: p,
                                deadline_ms: cx.now_ms + p.wait_ms,
                                token_end_ms,
                                recheck: false,
                                presence,
                            })));
                            return;
                        }
                        Reply::Page(paging) => {
                            // Built a step at a time (`Connection::page_step`),
                            // answered in order with what is pipelined behind.
                            let frame = frame.clone();
                            self.hold_request(cx.buffers);
                            self.begin_wait(Wait::Paging(Box::new(PagingWait { frame, paging })));
                            return;
                        }
                        Reply::Log(pending) => {
                            let deadline_ms = cx.now_ms + service.node().config.ingest_wait_ms();
                            let frame = frame.clone();
                            self.hold_request(cx.buffers);
                            self.begin_wait(Wait::Logging(Box::new(Logging {
                                frame,
                                pending,
                                deadline_ms,
                            })));
                            return;
                        }
                        Reply::Stream {
                            stream,
                            key,
                            watching: many,
                            room,
                        } => {
                            let heartbeat_ms =
                                cx.now_ms + service.node().config.http.sse_heartbeat_ms;
                            let token_end_ms = token_end_ms(&mut self.creds, cx);
                            // The stream's body ends with the connection: what
                            // was pipelined behind it is never answered.
                            self.give_back_rbuf(cx.buffers);
                            self.begin_wait(Wait::Streaming(Streaming {
                                key,
                                stream,
                                many,
                                room,
                                dirty: false,
                                heartbeat_ms,
                                token_end_ms,
                                presence: presence.map(Box::new),
                            }));
                            return;
                        }
                    }
                    self.next_request(frame.consumed);
                }
                &Err(e) => {
                    let e = untrusted_proxy_header(&self.rbuf[self.rstart..self.rend]).unwrap_or(e);
                    self.sendq
                        .append(&mut buffers.send, |out| service.refuse(e, out, *host));
                    self.linger(cx.now_ms);
                }
            }
        }
        if self.rstart == self.rend {
            self.give_back_rbuf(cx.buffers);
        }
        self.update_deadline(cx);
    }

    /// A trusted proxy's connection: read its PROXY v2 header, if one came,
    /// before the first request (a malformed one: 400, then close). Returns
    /// whether requests may be served now.
    #[inline(never)]
    pub(super) fn take_proxy_header<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        let buf = &self.rbuf[self.rstart..self.rend];
        match self
            .client
            .take_proxy_header(buf, &cx.service.node().clients)
        {
            Ok(None) => false,
            Ok(Some(len)) => {
                self.rstart += len;
                if self.client.over_cap() {
                    self.deadline_ms = cx.now_ms + PROBE_WAIT_MS;
                }
                true
            }
            Err(e) => {
                self.sendq.append(&mut cx.buffers.send, |out| {
                    cx.service.closing_error(400, &e.to_string(), out, cx.host)
                });
                self.linger(cx.now_ms);
                false
            }
        }
    }

    /// Answer `e` (the request cannot be read further), then linger.
    pub(super) fn refuse<H: Host>(&mut self, e: HttpError, cx: &mut Ctx<'_, H>) {
        self.sendq.append(&mut cx.buffers.send, |out| {
            cx.service.refuse(e, out, cx.host)
        });
        self.linger(cx.now_ms);
    }

    pub(super) fn linger(&mut self, now_ms: u64) {
        self.closing = Some(Closing::Linger {
            until_ms: now_ms + LINGER_MS,
            left: LINGER_BYTES,
        });
    }

    pub(super) fn next_request(&mut self, consumed: usize) {
        self.rstart += consumed;
        self.head_started_ms = None;
        self.partial_seen = 0;
    }

    /// Keep the request's bytes (and any pipelined after it) while it waits,
    /// in a buffer of their size: the read buffer goes back to the pool.
    pub(super) fn hold_request(&mut self, buffers: &mut Buffers) {
        let rest = self.rbuf[self.rstart..self.rend].to_vec();
        self.give_back_rbuf(buffers);
        self.rstart = 0;
        self.rend = rest.len();
        buffers.hold_read(rest.len());
        self.rbuf = rest;
    }

    /// Answer the logged ingest or `DELETE` (every record reported, or
    /// `timed_out`: 503), then what was pipelined behind it.
    pub(super) fn answer_logging<H: Host>(&mut self, timed_out: bool, cx: &mut Ctx<'_, H>) {
        let Wait::Logging(l) = self.take_wait(|w| matches!(w, Wait::Logging(_))) else {
            return;
        };
        let l = *l;
        self.answer_held(&l.frame, cx, |service, request, out, host| {
            service.answer_logged(request, *l.pending, timed_out, out, host)
        });
    }

    /// Answer the parked long-poll (200 with the new payload, 404 when the box
    /// is gone, or 304 when `timed_out` and nothing changed), then what was
    /// pipelined behind it.
    pub(super) fn answer_parked<H: Host>(&mut self, timed_out: bool, cx: &mut Ctx<'_, H>) {
        let Wait::Parked(p) = self.take_wait(|w| matches!(w, Wait::Parked(_))) else {
            return;
        };
        self.client.unhold();
        self.answer_held(&p.frame, cx, |service, request, out, host| {
            service.answer_parked(request, &p.key, p.park, timed_out, out, host)
        });
    }

    /// Write the answer to a request that waited (its bytes held since), then
    /// serve what was pipelined behind it.
    pub(super) fn answer_held<H: Host>(
        &mut self,
        frame: &Frame,
        cx: &mut Ctx<'_, H>,
        answer: impl FnOnce(&mut Service, Request<'_>, &mut Vec<u8>, &mut H) -> Reply,
    ) {
        let request = Request {
            frame,
            buf: &self.rbuf[self.rstart..self.rend],
            keep_alive: frame.keep_alive && !cx.host.draining(),
        };
        let Ctx {
            service,
            buffers,
            host,
            ..
        } = cx;
        let r = self
            .sendq
            .append(&mut buffers.send, |out| answer(service, request, out, host));
        if matches!(r, Reply::Close) {
            self.closing = Some(Closing::AfterSend);
        }
        self.next_request(frame.consumed);
        self.serve(cx);
    }
}
