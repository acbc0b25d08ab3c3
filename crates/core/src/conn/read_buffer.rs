//! The connection's read buffer: taken from the worker's budget when bytes
//! come, grown for a request larger than it, given back between requests so an
//! idle connection holds none.
//!
//! What it is not: the budget itself ([`crate::buffers::Buffers`]).

use super::*;

/// The largest read buffer a request may need.
pub(super) fn max_rbuf(service: &Service) -> usize {
    let l = &service.node().config.limits;
    l.max_header_bytes + l.max_body_bytes + READ_SLACK
}

/// What [`Connection::make_room`] could do.
pub(super) enum Room {
    Made,
    /// The request is larger than any buffer allowed (413/431).
    TooLarge,
    /// Not now: the worker's buffers are at their budget.
    OverBudget,
}

impl Connection {
    /// Make space at the end of the read buffer: compact, or grow within the
    /// request limits and the worker's budget.
    pub(super) fn make_room(&mut self, service: &Service, buffers: &mut Buffers) -> Room {
        if self.rstart > 0 {
            self.rbuf.copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
            return Room::Made;
        }
        let max = max_rbuf(service);
        let len = self.rbuf.len();
        if len >= max {
            return Room::TooLarge;
        }
        let new_len = (len * 2).max(crate::buffers::READ_BUF).min(max);
        if !buffers.grow_read_buf(&mut self.rbuf, self.rend, new_len, max) {
            return Room::OverBudget;
        }
        Room::Made
    }

    /// Return the read buffer to the pool (it holds no bytes we need).
    pub(super) fn give_back_rbuf(&mut self, buffers: &mut Buffers) {
        self.rstart = 0;
        self.rend = 0;
        if !self.rbuf.is_empty() {
            self.rbuf_next = if self.rbuf_high > crate::buffers::READ_BUF {
                self.rbuf.len()
            } else {
                crate::buffers::READ_BUF
            };
            self.rbuf_high = 0;
            buffers.put_read(std::mem::take(&mut self.rbuf));
        }
    }
}
