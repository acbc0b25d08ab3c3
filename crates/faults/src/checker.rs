//! The checker: what must hold of a history, whatever the nemesis did
//! (the promises of docs/operations.md#the-kafka-log, one [`Property`] each), and the figures of a run.
//!
//! From the history alone:
//! - **counts**: per key and per node, acknowledged ≤ applied ≤
//!   acknowledged + indeterminate, where applied is the final payload's `n`
//!   (the default config's `count` field) and a foreign record counts only
//!   when it landed in the key's home partition; the same bounds for `sum`;
//! - **replicas-identical**: every node, the one replaying from nothing
//!   included, holds the same bytes for every key once faults stop;
//! - **unique-version**: a (key, version) names one payload, ever, across
//!   every observation on every node;
//! - **monotonic**: versions never go backwards within a session (a
//!   connection, or a moving client's life), nor, in real time, within one
//!   run of a node (a read begun after another ended sees at least its
//!   version; an acknowledged ingest's answer counts as a read);
//! - **after-respected**: a long-poll or stream answer is newer than the
//!   `after` / `Last-Event-ID` it carried;
//! - **mover-ends-at-final**: a client moving between nodes ends at the final
//!   state of its key.
//!
//! With the topic read from its start at the end (`record` operations; the
//! `topic` operation gives the partition count, hence each key's home):
//! - **acknowledged-in-log**: every acknowledged message is in the log, in
//!   its key's home partition, and its answer includes it (`lost` counts
//!   those that are not);
//! - **refused-not-in-log**: a refused message never reaches the log;
//! - **at-most-once**: no message is in the log twice (no client retries);
//! - **wrong-partition-not-applied**: a record outside its key's home
//!   partition (the foreign producer's) shows in no payload;
//! - **observations-match-log**: every payload anyone saw is the projection
//!   of the key's home-partition records up to its version (`ver` = offset +
//!   1), and every node's final payload is that of the last one;
//! - **wrong-partition-counted**: the node that replayed from nothing
//!   counted every record outside its home partition, once.
//!
//! With the presence workload's operations (`presence-*`; see
//! `checker/presence.rs` for the exact rules): **presence-agreement** (every
//! node serves one version and one member list per room once quiet),
//! **presence-members** (the final reads list exactly the members whose
//! streams are open to live nodes), **presence-dead-expired** (during the
//! run, no healthy node lists a member of a node dead or silenced for more
//! than the lease).
//!
//! What it is not: a linearizability checker. The boxes are replicas built
//! from a log, so the log itself is the order; what is checked is that every
//! node agrees with it.
//!
//! The checker's parts, one job each: `reading` (what the checks read of the
//! history), `history_promises` and `log_promises` (the checks), `topic`
//! (the model of the log read at the end), `report` (the verdict).

mod history_promises;
mod log_promises;
mod presence;
mod reading;
mod report;
mod topic;

pub use report::{Figures, Property, Report, Violation};

use crate::history::{Event, Op};
use reading::Checker;

/// The node whose replay of the whole topic the checks read (the cluster
/// names its nodes).
pub use crate::cluster::REPLAY_NODE;

/// The metric the replaying node must count wrong-partition records in.
pub const WRONG_PARTITION_METRIC: &str = r#"pollbox_log_records_total{result="wrong_partition"}"#;

/// Check a history.
pub fn check(ops: &[Op]) -> Report {
    let mut c = Checker::new(ops);
    c.figures();
    c.counts();
    c.replicas_identical();
    c.unique_version();
    c.monotonic();
    c.after_respected();
    c.mover_ends_at_final();
    let has_log = ops.iter().any(|o| matches!(o.event, Event::Record { .. }));
    if has_log {
        c.log_checks();
    }
    let has_presence = c.has_presence();
    if has_presence {
        c.presence_checks();
    }
    let mut checked: Vec<Property> = Property::ALL[Property::HISTORY].to_vec();
    if has_log {
        checked.extend_from_slice(&Property::ALL[Property::LOG]);
    }
    if has_presence {
        checked.extend_from_slice(&Property::ALL[Property::PRESENCE]);
    }
    c.report.checked = checked;
    c.report
}

#[cfg(test)]
mod tests;
