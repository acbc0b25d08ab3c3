//! `[presence]` (docs/config.md#presence): its keys, defaults and checks,
//! owned here as each section is by the part that uses it.

use pollbox_table::config::{invalid, ConfigError};
use serde::{Deserialize, Serialize};

/// `[presence]`: who is in a room (docs/presence.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PresenceConfig {
    /// A member leaves this long after its last presence connection ended
    /// (a reconnect or a long-poll's next request within it is no leave).
    pub leave_grace_ms: u64,
    /// A room's presence lists its members up to this many; past it, the
    /// count only (pages still list), and a watcher is told of changes at
    /// most once per `count_interval_ms`.
    pub max_listed: usize,
    pub count_interval_ms: u64,
    /// Members a room holds at most (503 `room full` past it).
    pub max_members: usize,
    /// Presence connections a member holds at most, on this node (429).
    pub max_connections_per_member: usize,
    /// Presence connections this node holds at most (503).
    pub max_connections: usize,
    /// On a node of a log: a node whose records stop for this long (in the
    /// log's time) loses its members on every node.
    pub lease_ms: u64,
    /// On a node of a log: this node's name on the presence topic, the same
    /// across its restarts ("" = the host name and the listen port).
    pub node: String,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        Self {
            leave_grace_ms: 5000,
            max_listed: 100,
            count_interval_ms: 1000,
            max_members: 100_000,
            max_connections_per_member: 16,
            max_connections: 100_000,
            lease_ms: 6000,
            node: String::new(),
        }
    }
}

impl PresenceConfig {
    /// Each bound at least 1 and within what a node serves.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = self;
        if p.leave_grace_ms > 600_000 {
            return Err(invalid("presence.leave_grace_ms", "must be 0 to 600000"));
        }
        if !(1..=1000).contains(&p.max_listed) {
            return Err(invalid("presence.max_listed", "must be 1 to 1000"));
        }
        if !(1..=600_000).contains(&p.count_interval_ms) {
            return Err(invalid("presence.count_interval_ms", "must be 1 to 600000"));
        }
        if !(1..=10_000_000).contains(&p.max_members) {
            return Err(invalid("presence.max_members", "must be 1 to 10000000"));
        }
        if !(1..=65_535).contains(&p.max_connections_per_member) {
            return Err(invalid(
                "presence.max_connections_per_member",
                "must be 1 to 65535",
            ));
        }
        if !(300..=600_000).contains(&p.lease_ms) {
            return Err(invalid("presence.lease_ms", "must be 300 to 600000"));
        }
        if p.max_connections < 1 {
            return Err(invalid("presence.max_connections", "must be at least 1"));
        }
        Ok(())
    }
}
