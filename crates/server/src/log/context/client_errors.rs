//! The errors the log's Kafka clients report, by kind
//! (`pollbox_log_client_errors_total{kind}`): a small fixed set of kinds
//! derived from librdkafka's error code, each counted, and said at most once
//! every [`SAY_EVERY`] with how many were not said since (a log down for an
//! hour is a few hundred lines, not one per reconnect of every client).
//!
//! What it is not: the errors of a record (a delivery report's, counted in
//! `pollbox_log_produce_errors_total`) or of the topic's check at start
//! (`topic.rs`, said in its own words).

use rdkafka::error::RDKafkaErrorCode as Code;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The least time between two lines of one kind.
pub(crate) const SAY_EVERY: Duration = Duration::from_secs(10);

/// Which client reported an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// The producer ingest goes to (its events served by `pollbox-acks`).
    Producer,
    /// A consuming thread's consumer.
    Consumer,
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Client::Producer => "producer",
            Client::Consumer => "consumer",
        })
    }
}

/// What kind of error a client reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// Every broker the client knows is unreachable.
    AllBrokersDown,
    /// A broker's connection failed, timed out or its name did not
    /// resolve (the client reconnects).
    Transport,
    /// TLS, SASL or an authorization the broker refused.
    Auth,
    /// The client failed for good (librdkafka's fatal error, e.g. an
    /// idempotent producer fenced or out of sequence): the node is unready
    /// until it restarts.
    Fatal,
    /// Anything else.
    Other,
}

impl ErrorKind {
    pub(crate) const ALL: [ErrorKind; 5] = [
        ErrorKind::AllBrokersDown,
        ErrorKind::Transport,
        ErrorKind::Auth,
        ErrorKind::Fatal,
        ErrorKind::Other,
    ];

    /// The kind of an error with librdkafka's `code` (none: the client
    /// gave none); `fatal` when librdkafka flags it so, whatever its code.
    pub(crate) fn of(code: Option<Code>, fatal: bool) -> ErrorKind {
        if fatal {
            return ErrorKind::Fatal;
        }
        match code {
            Some(Code::Fatal) => ErrorKind::Fatal,
            Some(Code::AllBrokersDown) => ErrorKind::AllBrokersDown,
            Some(
                Code::BrokerTransportFailure
                | Code::Resolve
                | Code::NetworkException
                | Code::BrokerNotAvailable
                | Code::OperationTimedOut
                | Code::RequestTimedOut,
            ) => ErrorKind::Transport,
            Some(
                Code::Authentication
                | Code::SSL
                | Code::SaslAuthenticationFailed
                | Code::UnsupportedSASLMechanism
                | Code::IllegalSASLState
                | Code::TopicAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::GroupAuthorizationFailed
                | Code::TransactionalIdAuthorizationFailed,
            ) => ErrorKind::Auth,
            _ => ErrorKind::Other,
        }
    }

    /// The label of `pollbox_log_client_errors_total{kind}`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ErrorKind::AllBrokersDown => "all_brokers_down",
            ErrorKind::Transport => "transport",
            ErrorKind::Auth => "auth",
            ErrorKind::Fatal => "fatal",
            ErrorKind::Other => "other",
        }
    }
}

/// The clients' errors: counted by kind, and when each kind was last said.
#[derive(Default)]
pub(super) struct ClientErrors {
    counts: [AtomicU64; ErrorKind::ALL.len()],
    said: Mutex<[Said; ErrorKind::ALL.len()]>,
}

/// When a kind was last said, and how many of it were not said since.
#[derive(Debug, Default, Clone, Copy)]
struct Said {
    at: Option<Instant>,
    unsaid: u64,
}

impl ClientErrors {
    /// Count an error of `kind` that `client` reported (`why`: its words) at
    /// `now`; the line to say, unless this kind was said less than
    /// [`SAY_EVERY`] ago (then it is counted among the unsaid, which the
    /// next line of the kind tells).
    pub(super) fn record(
        &self,
        kind: ErrorKind,
        client: Client,
        why: &str,
        now: Instant,
    ) -> Option<String> {
        self.counts[kind as usize].fetch_add(1, Ordering::Relaxed);
        let mut said = self.said.lock().unwrap_or_else(PoisonError::into_inner);
        let s = &mut said[kind as usize];
        if s.at
            .is_some_and(|t| now.saturating_duration_since(t) < SAY_EVERY)
        {
            s.unsaid += 1;
            return None;
        }
        let unsaid = std::mem::take(&mut s.unsaid);
        s.at = Some(now);
        let mut line = format!("{client}: {} error: {why}", kind.label());
        if unsaid > 0 {
            line += &format!(
                " ({unsaid} more {} errors since this kind was last said)",
                kind.label()
            );
        }
        Some(line)
    }

    /// Errors of `kind` so far.
    pub(super) fn count(&self, kind: ErrorKind) -> u64 {
        self.counts[kind as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_fall_into_a_few_kinds_and_a_fatal_flag_wins() {
        let kind = |c| ErrorKind::of(Some(c), false);
        assert_eq!(kind(Code::AllBrokersDown), ErrorKind::AllBrokersDown);
        assert_eq!(kind(Code::BrokerTransportFailure), ErrorKind::Transport);
        assert_eq!(kind(Code::Resolve), ErrorKind::Transport);
        assert_eq!(kind(Code::OperationTimedOut), ErrorKind::Transport);
        assert_eq!(kind(Code::SSL), ErrorKind::Auth);
        assert_eq!(kind(Code::SaslAuthenticationFailed), ErrorKind::Auth);
        assert_eq!(kind(Code::TopicAuthorizationFailed), ErrorKind::Auth);
        assert_eq!(kind(Code::Fatal), ErrorKind::Fatal);
        assert_eq!(kind(Code::UnknownTopicOrPartition), ErrorKind::Other);
        assert_eq!(ErrorKind::of(None, false), ErrorKind::Other);
        assert_eq!(
            ErrorKind::of(Some(Code::OutOfOrderSequenceNumber), true),
            ErrorKind::Fatal
        );
    }

    #[test]
    fn labels_are_distinct_metric_label_values() {
        for (i, k) in ErrorKind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "ALL is in declaration order");
            let l = k.label();
            assert!(
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{l}"
            );
            assert!(ErrorKind::ALL[..i].iter().all(|o| o.label() != l), "{l}");
        }
    }

    #[test]
    fn a_kind_is_said_once_an_interval_with_what_was_not_said() {
        let e = ClientErrors::default();
        let t0 = Instant::now();
        let say =
            |kind, at: u64| e.record(kind, Client::Producer, "x", t0 + Duration::from_secs(at));
        assert_eq!(
            say(ErrorKind::Transport, 0).as_deref(),
            Some("producer: transport error: x")
        );
        assert_eq!(say(ErrorKind::Transport, 1), None);
        assert_eq!(say(ErrorKind::Transport, 9), None);
        // Another kind has its own interval.
        assert!(say(ErrorKind::AllBrokersDown, 2).is_some());
        let line = say(ErrorKind::Transport, 10).expect("said again after the interval");
        assert!(
            line.ends_with("(2 more transport errors since this kind was last said)"),
            "{line}"
        );
        assert_eq!(
            say(ErrorKind::Transport, 25).as_deref(),
            Some("producer: transport error: x")
        );
        assert_eq!(e.count(ErrorKind::Transport), 5);
        assert_eq!(e.count(ErrorKind::AllBrokersDown), 1);
        assert_eq!(e.count(ErrorKind::Fatal), 0);
    }
}
