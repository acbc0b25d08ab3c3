//! The `pollbox-acks` thread: it polls the producer client's queue and
//! handles every event on it.
//!
//! - **Delivery reports**, a produce request's records at a time: a record
//!   the log took meets its apply (`PartitionAcks::acknowledged`), one it
//!   did not take is counted and reported `Failed`; the workers learn a
//!   report's outcomes with one wake-up each.
//! - **Errors** of the client (a broker's connection lost, every broker
//!   down, authentication, librdkafka's fatal error): counted by kind and
//!   said at most once a kind every few seconds ([`LogState::client_error`]);
//!   a fatal one makes the node unready.
//! - **Log lines** of librdkafka (only its errors, at the level rdkafka sets
//!   when no `log` logger is installed) tell what the error events tell:
//!   dropped. **Statistics** (only with `statistics.interval.ms` in
//!   `[log.client]`): dropped, pollbox exports its own figures. An
//!   **OAUTHBEARER token refresh** pollbox cannot answer: an `auth` error.
//!
//! Its wait is librdkafka's (a condition variable): an idle node spends
//! nothing here but a look every [`WAIT_MS`]. When the workers have stopped
//! nobody awaits a report any more: the thread purges what the client still
//! holds, serves those last reports (counted as any other) and ends, so the
//! client's own flush when the producer is dropped finds nothing left.

use super::context::{Ack, Client, DeliveryTag, LogState, PassReports};
use super::produce::Producer;
use crate::lifecycle::Lifecycle;
use crate::wakeups::Wakeups;
use pollbox_core::service::Report;
use rdkafka::bindings as rd;
use rdkafka::error::RDKafkaErrorCode;
use std::borrow::Cow;
use std::ffi::CStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the thread waits for an event before it looks whether the
/// node stops.
const WAIT_MS: i32 = 250;
/// How long the last reports are waited for once the workers stopped.
const DRAIN: Duration = Duration::from_millis(500);

/// What the delivery thread is handed (each part owned by its module).
pub(crate) struct Delivering {
    /// The producer whose client's queue it polls.
    pub(crate) producer: Arc<Producer>,
    /// Where acknowledgements meet applies, and the counters of both.
    pub(crate) log: Arc<LogState>,
    /// The workers, each told what became of its records.
    pub(crate) wakeups: Arc<Wakeups>,
    /// The workers stopped: the thread ends.
    pub(crate) lifecycle: Arc<Lifecycle>,
}

/// Serve the producer client's events until the workers stop, then its
/// last delivery reports.
pub(crate) fn serve(d: &Delivering) {
    let queue = Queue::main(&d.producer);
    let mut served = Served::new(d);
    while !d.lifecycle.workers_stopped() {
        // Acknowledgements that came before the topic's partitions were
        // known are looked at again soon.
        let wait = if served.unmet.is_empty() { WAIT_MS } else { 1 };
        if let Some(ev) = queue.poll(wait) {
            served.event(&ev);
        }
        served.meet();
        served.pass.hand_over(&d.wakeups);
    }
    d.producer.purge();
    let until = Instant::now() + DRAIN;
    while d.producer.in_flight() > 0 && Instant::now() < until {
        if let Some(ev) = queue.poll(10) {
            served.event(&ev);
        }
    }
    served.meet();
    served.pass.hand_over(&d.wakeups);
}

/// The thread's own state between events.
struct Served<'a> {
    d: &'a Delivering,
    /// Each taken record's partition and acknowledgement, until it meets
    /// its partition's applies (the topic's partitions may be unknown yet).
    unmet: Vec<(i32, Ack)>,
    /// The reports of the events served since the last hand-over.
    pass: PassReports,
    /// The messages of a delivery report (kept for their capacity).
    msgs: Vec<*const rd::rd_kafka_message_t>,
}

impl<'a> Served<'a> {
    fn new(d: &'a Delivering) -> Served<'a> {
        Served {
            d,
            unmet: Vec::new(),
            pass: PassReports::new(d.wakeups.workers()),
            msgs: Vec::new(),
        }
    }

    /// Handle one event of the client's queue.
    fn event(&mut self, ev: &Event) {
        // SAFETY: the event is alive until `ev` drops.
        let kind = unsafe { rd::rd_kafka_event_type(ev.0) };
        match kind {
            rd::RD_KAFKA_EVENT_DR => self.delivery_report(ev),
            rd::RD_KAFKA_EVENT_ERROR => self.error(ev),
            // librdkafka's own lines, at the error level rdkafka sets: each
            // comes with an error event, handled above.
            rd::RD_KAFKA_EVENT_LOG => {}
            // Asked for with `statistics.interval.ms` only; pollbox exports
            // its own figures.
            rd::RD_KAFKA_EVENT_STATS => {}
            rd::RD_KAFKA_EVENT_OAUTHBEARER_TOKEN_REFRESH => self.d.log.client_error(
                Client::Producer,
                Some(RDKafkaErrorCode::Authentication),
                false,
                "the client asks for an OAUTHBEARER token, which pollbox does not set (sasl.oauthbearer.method=oidc has librdkafka fetch it)",
            ),
            _ => {
                let what = format!("an event pollbox does not know: {}", ev.name());
                self.d.log.client_error(Client::Producer, None, false, &what);
            }
        }
    }

    /// A delivery report: each record taken waits in `unmet` for
    /// [`Served::meet`], each not taken is reported `Failed`.
    fn delivery_report(&mut self, ev: &Event) {
        let now = Instant::now();
        // SAFETY: the event is alive until `ev` drops; the message array
        // holds `n` pointers at most, and its messages are the event's.
        unsafe {
            let n = rd::rd_kafka_event_message_count(ev.0);
            self.msgs.clear();
            self.msgs.reserve(n);
            let got = rd::rd_kafka_event_message_array(ev.0, self.msgs.as_mut_ptr(), n);
            self.msgs.set_len(got.min(n));
        }
        for &m in &self.msgs {
            // SAFETY: a message of the event (above), read before it drops.
            let m = unsafe { &*m };
            let Some(tag) = DeliveryTag::decode(m._private as usize) else {
                continue;
            };
            if m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                self.d.log.produce_failed();
                self.pass.add(tag, Report::Failed);
                continue;
            }
            // librdkafka's time from the produce call to this report: when
            // the record was produced.
            // SAFETY: as above.
            let us = u64::try_from(unsafe { rd::rd_kafka_message_latency(m) }).unwrap_or(0);
            let produced = now.checked_sub(Duration::from_micros(us)).unwrap_or(now);
            self.unmet.push((m.partition, (m.offset, tag, produced)));
        }
    }

    /// An error of the client: counted and said by kind; a fatal one fails
    /// the node, in librdkafka's words for the error underneath.
    fn error(&mut self, ev: &Event) {
        // SAFETY: the event is alive until `ev` drops; its error string is
        // its own (or NULL), read before it drops.
        let (code, fatal, said) = unsafe {
            let code = rd::rd_kafka_event_error(ev.0);
            let fatal = rd::rd_kafka_event_error_is_fatal(ev.0) != 0;
            let s = rd::rd_kafka_event_error_string(ev.0);
            let said = if s.is_null() {
                String::new()
            } else {
                CStr::from_ptr(s).to_string_lossy().trim().to_string()
            };
            (RDKafkaErrorCode::from(code), fatal, said)
        };
        let why = match fatal
            .then(|| self.d.producer.client().fatal_error())
            .flatten()
        {
            Some((code, reason)) => format!("{code:?}: {reason}"),
            None => format!("{code:?}: {said}"),
        };
        self.d
            .log
            .client_error(Client::Producer, Some(code), fatal, &why);
    }

    /// Meet the taken records with their partitions' applies, once the
    /// partitions are known: a report's records come a partition at a time,
    /// and each run is taken under one lock.
    fn meet(&mut self) {
        let log = &*self.d.log;
        let Some(parts) = log.partitions() else {
            return;
        };
        let now = Instant::now();
        let pass = &mut self.pass;
        let mut ready = |tag: DeliveryTag, r: Report, produced: Instant| {
            let waited = now.saturating_duration_since(produced);
            log.observe_ack(waited.as_nanos() as u64);
            pass.add(tag, r);
        };
        for run in self.unmet.chunk_by(|a, b| a.0 == b.0) {
            let Some(part) = usize::try_from(run[0].0).ok().and_then(|p| parts.get(p)) else {
                for &(_, (_, tag, produced)) in run {
                    ready(tag, Report::Failed, produced);
                }
                continue;
            };
            part.acks()
                .acknowledged(run.iter().map(|&(_, ack)| ack), &mut ready);
        }
        self.unmet.clear();
    }
}

/// A reference to the producer client's main queue, where its events go
/// (rdkafka routes the delivery reports, errors and log lines there).
struct Queue(*mut rd::rd_kafka_queue_t);

impl Queue {
    fn main(p: &Producer) -> Queue {
        // SAFETY: the client is alive (the thread holds the producer); the
        // reference is released once, when the Queue drops.
        Queue(unsafe { rd::rd_kafka_queue_get_main(p.client().native_ptr()) })
    }

    /// The next event, waiting up to `ms` for one.
    fn poll(&self, ms: i32) -> Option<Event> {
        // SAFETY: the queue is alive; the event returned (or NULL) is
        // destroyed once, when its Event drops.
        let ev = unsafe { rd::rd_kafka_queue_poll(self.0, ms) };
        (!ev.is_null()).then_some(Event(ev))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the reference taken in Queue::main, released once.
        unsafe { rd::rd_kafka_queue_destroy(self.0) }
    }
}

/// One event of the queue, destroyed when dropped.
struct Event(*mut rd::rd_kafka_event_t);

impl Event {
    /// librdkafka's name of the event's type.
    fn name(&self) -> Cow<'_, str> {
        // SAFETY: the event is alive; its name is a static string (or NULL).
        unsafe {
            let s = rd::rd_kafka_event_name(self.0);
            if s.is_null() {
                Cow::Borrowed("?")
            } else {
                CStr::from_ptr(s).to_string_lossy()
            }
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event came from rd_kafka_queue_poll and is destroyed
        // once, here; nothing read from it outlives it.
        unsafe { rd::rd_kafka_event_destroy(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::ErrorKind;
    use super::*;
    use pollbox_core::config::Config;

    /// A node's producer whose brokers are a port nothing listens on, served
    /// by the delivery thread: its errors are counted by kind, and a fatal
    /// error (librdkafka's own test hook) makes the node unready. No broker.
    #[test]
    fn the_producers_errors_are_counted_and_a_fatal_one_fails_the_node() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = Config::embedded().log;
        cfg.brokers = format!("127.0.0.1:{port}");
        cfg.topic = "t".into();
        let log = Arc::new(LogState::new(&cfg, None));
        let d = Arc::new(Delivering {
            producer: Arc::new(Producer::new(&cfg, log.clone()).unwrap()),
            log: log.clone(),
            wakeups: Arc::new(Wakeups::new(Vec::new())),
            lifecycle: Arc::new(Lifecycle::default()),
        });
        let thread = {
            let d = d.clone();
            std::thread::spawn(move || serve(&d))
        };
        let until = |what: &str, f: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !f() {
                assert!(Instant::now() < deadline, "timed out waiting for {what}");
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        until("a connection error counted", &|| {
            log.client_errors(ErrorKind::Transport) + log.client_errors(ErrorKind::AllBrokersDown)
                > 0
        });
        assert!(log.failed().is_none());
        let reason = c"a test of a fatal error";
        // SAFETY: the client is alive; librdkafka copies the reason.
        let raised = unsafe {
            rd::rd_kafka_test_fatal_error(
                d.producer.client().native_ptr(),
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            )
        };
        assert_eq!(raised, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        until("the fatal error served", &|| log.failed().is_some());
        assert_eq!(log.client_errors(ErrorKind::Fatal), 1);
        let why = log.failed().unwrap();
        assert!(why.contains("a test of a fatal error"), "{why}");
        assert!(why.contains("OutOfOrderSequenceNumber"), "{why}");
        assert!(!log.takes_ingest());
        d.lifecycle.stop_workers();
        thread.join().unwrap();
    }
}
