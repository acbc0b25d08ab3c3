//! pollbox's fault suite, in Jepsen's shape: a **workload** of HTTP clients
//! whose every outcome is recorded, a **nemesis** that really kills, pauses
//! and cuts off brokers and nodes on a fixed seed's schedule, and a
//! **checker** over the recorded **history** that says whether the Kafka log's
//! promises held: nothing acknowledged lost, nothing applied that was not
//! sent, one payload per version, replicas identical (a node replaying the
//! topic from nothing included), versions never backwards, clients moving
//! between nodes ending at the final state, records of other partitioners
//! never applied; and presence's (a [`presence`] workload of members held by
//! event streams to each node): every node the same members and version per
//! room, exactly the members whose streams are open, none of a node dead for
//! a lease.
//!
//! It runs against the real thing on one machine, as root: three Kafka
//! brokers (KRaft, `scripts/kafka`'s jars), the release `pollbox` binary as
//! nodes, the repository's HAProxy config in front, each broker and node in
//! its own network namespace so that cuts drop packets ([`cluster`]).
//!
//! What it is not: a test of one feature, a benchmark, or a proof. It finds
//! what its seeds' schedules reach; a valid run says that this history kept
//! the promises, nothing more. It never fixes or mocks anything: a run that
//! finds a broken promise leaves its history and the cluster's logs in the
//! run's folder. See README.md for how to run it.

pub mod checker;
pub mod cluster;
pub mod history;
pub mod http;
pub mod nemesis;
pub mod partition;
pub mod presence;
pub mod rng;
pub mod run;
pub mod workload;
