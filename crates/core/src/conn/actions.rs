//! What a connection asks of the server around it: each [`Action`] is pushed
//! once, when the connection decides it, and applied once by the server,
//! which drains them after each call ([`super::Connection::actions`]). The
//! server keeps no copy of the connection's state to compare against; what it
//! keeps is what it made when it applied an action (a registration, a timer).
//!
//! The queue lives in the connection, inline: no allocation, ever. It holds at
//! most an undo of what the server did and one new ask, because a connection
//! waits on one thing at a time and an ask undone before the server saw it is
//! dropped with its undo (a poll parked and answered in the same call asks
//! nothing).

/// One thing the server does for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// Wake the connection ([`super::Connection::on_keys_updated`]) when a
    /// box of `keys` is updated, deleted or expires: a parked long-poll or
    /// an event stream began. Once it is registered, the server calls
    /// [`super::Connection::on_box_updated`] (an update may have landed
    /// before the registration reached it).
    Watch(Watch<'a>),
    /// The watch ended (answered, ended, dropped): wake it no more.
    Unwatch,
    /// Route the reports of the records of log request `request` here
    /// ([`super::Connection::on_log_report`]).
    Await(u64),
    /// Log request `request` was answered (or dropped): no more reports.
    Unawait(u64),
    /// Call [`super::Connection::on_timer`] at this time (ms on the worker
    /// clock), instead of at the time armed before. Asked when the deadline
    /// comes before the one armed, or when none is armed (the last one
    /// fired); a deadline that moved later leaves the armed timer, which
    /// fires early and is armed again.
    Arm(u64),
    /// Its heap bytes changed by these: its send queue's, and what its watch
    /// keeps (keys, where a stream of many boxes stands). The server's totals
    /// follow; a closed connection gives back what it had.
    Bytes { send: isize, watch: isize },
    /// Close the connection now, after writing what the socket takes (and
    /// shutting the write side down when [`super::Connection::shuts_down_write`]
    /// says so). Asked once.
    Close,
}

/// The keys a watch is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch<'a> {
    /// One key; or, for `many`, the keys of a many-box poll or stream
    /// ([`crate::service::ManyKeys`]): a wake-up of any of them concerns it,
    /// and the `i`th key's is told as `moved(i)`.
    pub keys: &'a [u8],
    pub many: bool,
    /// An event stream (else a parked long-poll).
    pub stream: bool,
    /// `keys` is a prefix: a change of any box under it concerns the watch,
    /// told with its key ([`super::Connection::on_prefix_moved`]).
    pub prefix: bool,
}

impl Watch<'static> {
    /// A watch in the queue: its keys are read from the connection when the
    /// queue is drained (they are its wait's, which is still there: a watch
    /// whose wait ended was dropped with it).
    pub(super) const QUEUED: Watch<'static> = Watch {
        keys: &[],
        many: false,
        stream: false,
        prefix: false,
    };
}

/// Room for an undo and an ask (the timer, the bytes and the close are
/// looked at as the queue is drained: [`Actions`]).
const ROOM: usize = 2;

#[derive(Debug, Clone, Copy)]
pub(super) struct Queue {
    q: [Action<'static>; ROOM],
    len: u8,
}

impl Default for Queue {
    fn default() -> Queue {
        Queue {
            q: [Action::Close; ROOM],
            len: 0,
        }
    }
}

impl Queue {
    pub(super) fn push(&mut self, a: Action<'static>) {
        debug_assert!((self.len as usize) < ROOM, "{self:?} then {a:?}");
        if let Some(slot) = self.q.get_mut(self.len as usize) {
            *slot = a;
            self.len += 1;
        }
    }

    /// Push `undo`, unless the ask it undoes is still queued: then neither
    /// reaches the server.
    pub(super) fn undo(&mut self, ask: fn(&Action<'_>) -> bool, undo: Action<'static>) {
        let n = self.len as usize;
        if n > 0 && ask(&self.q[n - 1]) {
            self.len -= 1;
        } else {
            self.push(undo);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn get(&self, i: usize) -> Option<Action<'static>> {
        self.q[..self.len as usize].get(i).copied()
    }
}

/// The actions of one drain, in the order they were decided, then the
/// close or the timer, then the bytes ([`super::Connection::actions`]). The
/// queue is empty once it is dropped, whatever was not taken.
pub struct Actions<'a> {
    pub(super) queue: &'a mut Queue,
    pub(super) next: usize,
    /// The keys of the connection's watch, if it has one now.
    pub(super) watch: Option<Watch<'a>>,
    /// [`Action::Close`] or [`Action::Arm`], then [`Action::Bytes`], if asked.
    pub(super) then: [Option<Action<'static>>; 2],
}

impl<'a> Iterator for Actions<'a> {
    type Item = Action<'a>;

    fn next(&mut self) -> Option<Action<'a>> {
        let Some(a) = self.queue.get(self.next) else {
            return self.then.iter_mut().find_map(Option::take);
        };
        self.next += 1;
        match a {
            Action::Watch(_) => self.watch.map(Action::Watch).or_else(|| self.next()),
            a => Some(a),
        }
    }
}

impl Drop for Actions<'_> {
    fn drop(&mut self) {
        self.queue.len = 0;
    }
}
