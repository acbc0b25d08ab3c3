//! A held request (a parked long-poll, an event stream) that needed a token
//! ends with it (docs/private-boxes.md#when-a-token-ends): its deadline is the
//! earlier of its own and the token's end, and a re-read of the key set that no
//! longer holds the token ends it at once.
//!
//! What it is not: the verification ([`crate::auth`]) or the 401 and
//! `event: expired` themselves (the service writes them).

use super::*;

/// When the token of the request just held (parked or streaming) ends on
/// the worker's clock; `None` when it needed none (reads are public).
pub(super) fn token_end_ms<H: Host>(creds: &mut Credentials, cx: &Ctx<'_, H>) -> Option<u64> {
    if !cx.service.held_needs_token() {
        return None;
    }
    Some(match cx.service.held_token(creds) {
        Ok(end_s) => cx.service.token_deadline_ms(end_s, cx.now_ms),
        // It was granted just now: not reached; ended at once if it were.
        Err(_) => cx.now_ms,
    })
}

impl Connection {
    /// The node's key set or static tokens were re-read (the worker's
    /// service took the new read): a held request whose token no longer
    /// holds ends as at its token's end. Returns whether it ended.
    pub fn on_access_changed<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        self.check_held_token(cx)
    }

    /// Whether a held request (a parked long-poll, an event stream) needed a
    /// token, so that a re-read of the key set concerns it.
    pub fn holds_token(&self) -> bool {
        self.held_token_end().is_some()
    }

    /// When the held request's token ends, if it needed one.
    pub(super) fn held_token_end(&self) -> Option<u64> {
        match (&self.wait, self.closing) {
            (Wait::Parked(p), _) => p.token_end_ms,
            (Wait::Streaming(s), None) => s.token_end_ms,
            _ => None,
        }
    }

    /// Whether the held request's token still holds; if not, end the request
    /// as that token says ([`Connection::end_held`]), else set its end again
    /// (the wall clock may have moved, or a re-read kept it). Returns whether
    /// it ended.
    pub(super) fn check_held_token<H: Host>(&mut self, cx: &mut Ctx<'_, H>) -> bool {
        if self.held_token_end().is_none() {
            return false;
        }
        match cx.service.held_token(&mut self.creds) {
            Ok(end_s) => {
                let end = Some(cx.service.token_deadline_ms(end_s, cx.now_ms));
                match &mut self.wait {
                    Wait::Parked(p) => p.token_end_ms = end,
                    Wait::Streaming(s) => s.token_end_ms = end,
                    _ => {}
                }
                false
            }
            Err(why) => {
                self.end_held(why, cx);
                true
            }
        }
    }

    /// End the held request whose token no longer holds (`why`): a parked
    /// poll is answered 401 (then what was pipelined behind it is served),
    /// a stream is sent `event: expired` and ends.
    pub(super) fn end_held<H: Host>(&mut self, why: Refusal, cx: &mut Ctx<'_, H>) {
        if let Wait::Parked(p) = self.take_wait(|w| matches!(w, Wait::Parked(_))) {
            self.answer_held(&p.frame, cx, |service, request, out, host| {
                service.refuse_parked(request, why, out, host)
            });
            return;
        }
        if matches!(self.wait, Wait::Streaming(_)) {
            let Ctx {
                service,
                buffers,
                host,
                ..
            } = cx;
            self.sendq.append(&mut buffers.send, |out| {
                service.stream_expired(why, out, *host)
            });
            self.end_stream(cx.now_ms, cx.service);
        }
    }
}
