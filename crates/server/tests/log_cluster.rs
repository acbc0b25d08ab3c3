//! A log on a cluster of three Kafka brokers (`scripts/kafka/start.sh
//! --brokers 3`: three KRaft JVMs, each broker and controller, about 1.2 GB of
//! memory more than the one-broker tests and ~10 s to start), with the topic
//! settings pollbox requires (replication factor 3, `min.insync.replicas` 2):
//! a broker lost loses no acknowledged record and stops no producer.
//!
//! Ignored in plain `cargo test` (they need Java and the broker's jars):
//! `cargo test -p pollbox-server --test log_cluster -- --ignored`.

mod common;
use common::kafka::Broker;

const TOPIC: &str = "pollbox";
const PARTITIONS: i32 = 4;

/// Acknowledge `n` records keyed `{prefix}-{i}` (acks=all, idempotent).
fn produce(broker: &Broker, prefix: &str, n: usize) -> Vec<(String, String)> {
    let records: Vec<(String, String)> = (0..n)
        .map(|i| {
            let key = format!("{prefix}-{i}");
            (key, format!(r#"{{"value":{i},"player":"{prefix}"}}"#))
        })
        .collect();
    broker.producer().send_all(TOPIC, &records);
    records
}

#[test]
#[ignore = "needs a Kafka broker (scripts/kafka)"]
fn a_broker_killed_loses_nothing_acknowledged_and_producing_goes_on() {
    let t0 = std::time::Instant::now();
    let step = |what: &str| eprintln!("{:6.1} s  {what}", t0.elapsed().as_secs_f64());
    let cluster = Broker::start_cluster(3);
    cluster.create_topic_with(TOPIC, PARTITIONS, 3, &[("min.insync.replicas", "2")]);
    step("started");
    let mut sent = produce(&cluster, "before", 200);
    step("produced");

    // kill -9 one broker: the leaders it had move once it is fenced, the ISR
    // shrinks to the two left, and min.insync.replicas=2 still takes acks=all.
    cluster.kill(2);
    step("killed");
    sent.extend(produce(&cluster, "one-down", 200));
    step("produced with one down");

    // Back with its data and ports: it catches up and rejoins every ISR.
    cluster.restart_broker(2);
    step("restarted");
    cluster.wait_isr(TOPIC);
    step("isr");
    sent.extend(produce(&cluster, "after", 100));
    cluster.wait_isr(TOPIC);

    // Another broker gone: the two left (the restarted one among them) hold
    // every acknowledged record.
    cluster.kill(3);
    step("killed another");
    let got = cluster.consume_all(TOPIC, PARTITIONS, sent.len());
    let mut got: Vec<(String, String)> = got
        .into_iter()
        .map(|(k, v)| (k.expect("a key"), v.expect("a value")))
        .collect();
    step("consumed");
    got.sort();
    sent.sort();
    assert_eq!(got.len(), sent.len(), "every acknowledged record, once");
    assert_eq!(got, sent);
}
