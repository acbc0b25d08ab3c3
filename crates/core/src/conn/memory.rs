//! What a connection holds in memory, for the server's totals
//! ([`super::Action::Bytes`]): its buffers, and what its wait keeps.

use super::*;

impl Connection {
    /// Heap bytes of what a parked poll or an event stream keeps: its key (or
    /// keys) and, for many boxes, where the stream stands with each; a
    /// presence connection's hold on its member.
    pub fn watch_bytes(&self) -> usize {
        let held = |m: &crate::presence::Membership| {
            std::mem::size_of::<crate::presence::Membership>() + m.heap_bytes()
        };
        match &self.wait {
            Wait::Parked(p) => p.key.len() + p.presence.as_ref().map_or(0, held),
            Wait::Streaming(s) => {
                s.key.len()
                    + s.presence.as_deref().map_or(0, held)
                    + s.many.as_ref().map_or(0, ManyWatch::heap_bytes)
                    + s.room
                        .as_ref()
                        .map_or(0, |r| std::mem::size_of::<RoomWatch>() + r.heap_bytes())
            }
            _ => 0,
        }
    }

    /// Heap bytes held for this connection: (read buffer, send queue).
    pub fn buffer_bytes(&self) -> (usize, usize) {
        (self.rbuf.len(), self.sendq.capacity_bytes())
    }
}
