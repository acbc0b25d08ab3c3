//! A page of a prefix built a step at a time (docs/boxes.md#rooms): a page
//! of 1,000 boxes is about a millisecond of a worker, which polls should not
//! wait behind, so it reads [`PAGE_STEP`] boxes a turn of the worker and is
//! answered at its last step.
//!
//! What it is not: the route (`rooms.rs` decides a request is a page).

use super::cursor::write_next_after;
use super::{Answer, Exchange, Host, ManyKeys, Reply, RouteLabel, Service};
use crate::http::Method;

/// Boxes a page reads in one step (about 60 µs of a worker) before the
/// worker serves other connections (docs/boxes.md#rooms).
pub const PAGE_STEP: usize = 64;

/// A page of a prefix being built, a step at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paging {
    prefix: Box<[u8]>,
    /// The last key looked at (the next step goes on after it).
    after: Option<Vec<u8>>,
    /// Keys still to look at.
    left: usize,
    /// `{"boxes":[` and the boxes so far.
    body: Vec<u8>,
    first: bool,
    /// Whether keys follow the last one looked at (known once a step ends
    /// the page).
    more: bool,
    /// The watermark read before the first step.
    cut: Vec<u64>,
    done: bool,
}

impl Paging {
    /// A page of `limit` boxes under `prefix` after `after`, at watermark
    /// `cut` (read before its first step).
    pub(super) fn new(prefix: &[u8], after: Option<Vec<u8>>, limit: usize, cut: &[u64]) -> Paging {
        let mut body = Vec::with_capacity(limit.min(PAGE_STEP) * 96);
        body.extend_from_slice(b"{\"boxes\":[");
        Paging {
            prefix: prefix.into(),
            after,
            left: limit,
            body,
            first: true,
            more: false,
            cut: cut.to_vec(),
            done: false,
        }
    }
}

impl Service {
    /// One step of a page: at most [`PAGE_STEP`] keys copied out of the key
    /// order (one hold of its mutex) and their boxes read. Returns whether
    /// the page is complete.
    pub fn page_step(&mut self, p: &mut Paging) -> bool {
        if p.done {
            return true;
        }
        self.scratch.clear();
        let step = p.left.min(PAGE_STEP);
        let boxes = &self.node.boxes;
        let (n, more) = boxes
            .order()
            .page(&p.prefix, p.after.as_deref(), step, &mut self.scratch);
        let mut last = None;
        for key in ManyKeys(&self.scratch) {
            let mark = p.body.len();
            if !p.first {
                p.body.push(b',');
            }
            // Gone since the keys were copied: not in the page (a box that
            // lived through the walk is never missing).
            if boxes.poll(key, &mut p.body).is_some() {
                p.first = false;
            } else {
                p.body.truncate(mark);
            }
            last = Some(key);
        }
        if let Some(k) = last {
            p.after = Some(k.to_vec());
        }
        p.left -= n.min(p.left);
        p.more = more;
        p.done = !more || p.left == 0 || n == 0;
        p.done
    }

    /// Answer a page built by [`Service::page_step`]:
    /// `{"boxes":[...],"next":"..."|null,"after":"W"}`.
    pub fn page_answer<H: Host>(
        &mut self,
        request: super::Request<'_>,
        p: &Paging,
        out: &mut Vec<u8>,
        host: &mut H,
    ) -> Reply {
        let super::Request { frame, buf, .. } = request;
        self.heads.begin(frame.field(&frame.origin, buf));
        let creds = &mut crate::auth::Credentials::default();
        let x = &mut Exchange::new(request, out, host, creds);
        self.body.clear();
        self.body.extend_from_slice(&p.body);
        let next = p.after.as_deref().filter(|_| p.more);
        write_next_after(next, self.node.boxes.lanes().run(), &p.cut, &mut self.body);
        self.body.push(b'}');
        let a = Answer {
            head_only: x.frame.method == Method::Head,
            ..x.json(RouteLabel::Page, 200)
        };
        self.heads.write(x.out, x.host, &a, &self.body);
        x.reply()
    }
}
