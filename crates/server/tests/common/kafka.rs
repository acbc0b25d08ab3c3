//! A real Kafka broker for the log's tests (`scripts/kafka/start.sh`: a
//! single KRaft node on free ports, stopped when the test process ends), or a
//! cluster of several (`start.sh --brokers N`, each broker acted on through
//! `scripts/kafka/broker.sh`), and a plain Kafka client to create topics,
//! produce and consume, as any client would.
#![allow(dead_code)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::ClientContext;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The repository's root (tests run in their crate's directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub struct Broker {
    pub bootstrap: String,
    dir: String,
}

impl Broker {
    /// Start a broker (a few seconds once its jars are cached).
    pub fn start() -> Broker {
        Broker::start_with(&[])
    }

    /// Start a cluster of `n` brokers, each broker and controller (~10 s and
    /// ~1 GB for three; `start.sh --brokers N`). Its defaults are the durable
    /// ones: replication factor 3, `min.insync.replicas` 2. [`Broker::kill`]
    /// and the others act on one broker (1-based).
    pub fn start_cluster(n: usize) -> Broker {
        Broker::start_with(&["--brokers", &n.to_string()])
    }

    fn start_with(args: &[&str]) -> Broker {
        let script = repo_root().join("scripts/kafka/start.sh");
        let out = Command::new(&script)
            .args(args)
            .args(["--watch-pid", &std::process::id().to_string()])
            .output()
            .expect("run scripts/kafka/start.sh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "start.sh failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_string()
        };
        Broker {
            bootstrap: field("BOOTSTRAP="),
            dir: field("DIR="),
        }
    }

    pub fn create_topic(&self, name: &str, partitions: i32) {
        self.create_topic_with(name, partitions, 1, &[]);
    }

    /// Create a topic with this replication factor and topic configs, e.g.
    /// `&[("min.insync.replicas", "2")]`.
    pub fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        replication: i32,
        configs: &[(&str, &str)],
    ) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin client");
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
        let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
        for &(k, v) in configs {
            topic = topic.set(k, v);
        }
        let r = futures_executor::block_on(admin.create_topics([&topic], &opts))
            .expect("create_topics");
        for t in r {
            t.expect("topic created");
        }
    }

    /// Delete a topic, then create it again under the same name (a new topic
    /// to Kafka: a new topic id, offsets from 0). The name is taken again once
    /// the broker has finished deleting it: retried until then (at most 60 s).
    pub fn recreate_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin client");
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
        let r =
            futures_executor::block_on(admin.delete_topics(&[name], &opts)).expect("delete_topics");
        for t in r {
            t.expect("topic deleted");
        }
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let r = futures_executor::block_on(admin.create_topics([&topic], &opts))
                .expect("create_topics");
            match r.into_iter().next().expect("one topic") {
                Ok(_) => return,
                // Still being deleted.
                Err((_, e)) if std::time::Instant::now() < deadline => {
                    eprintln!("creating {name} again: {e:?}; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err((_, e)) => panic!("cannot create {name} again: {e:?}"),
            }
        }
    }

    /// A producer as any team's would be (acks=all, idempotent).
    pub fn producer(&self) -> Plain {
        self.producer_with(&[])
    }

    /// The same with more client properties (e.g. `compression.type`).
    pub fn producer_with(&self, props: &[(&str, &str)]) -> Plain {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "0");
        for (k, v) in props {
            c.set(*k, *v);
        }
        let p = c
            .create_with_context(Deliveries::default())
            .expect("producer");
        Plain(p, AtomicUsize::new(0))
    }
}

impl Broker {
    /// Stop the broker, keeping its data and ports (the log goes away).
    pub fn stop_keeping_data(&self) {
        let st = Command::new(repo_root().join("scripts/kafka/stop.sh"))
            .args([self.dir.as_str(), "--keep"])
            .status()
            .expect("stop.sh");
        assert!(st.success());
    }

    /// Start it again after [`Broker::stop_keeping_data`] (the log comes back).
    pub fn restart(&self) {
        let out = Command::new(repo_root().join("scripts/kafka/restart.sh"))
            .args([
                self.dir.as_str(),
                "--watch-pid",
                &std::process::id().to_string(),
            ])
            .output()
            .expect("restart.sh");
        assert!(
            out.status.success(),
            "restart.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One broker of a cluster ([`Broker::start_cluster`]), through
/// `scripts/kafka/broker.sh DIR I ACTION`; `i` is 1-based.
impl Broker {
    fn broker_sh(&self, i: usize, args: &[&str]) -> String {
        let out = Command::new(repo_root().join("scripts/kafka/broker.sh"))
            .args([self.dir.as_str(), &i.to_string()])
            .args(args)
            .output()
            .expect("broker.sh");
        assert!(
            out.status.success(),
            "broker.sh {i} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `kill -9` broker `i`; returns once it is gone.
    pub fn kill(&self, i: usize) {
        self.broker_sh(i, &["kill"]);
    }

    /// SIGSTOP broker `i` (hung: its connections stay open, nothing answers).
    /// Send `signal` (`STOP`, `CONT`) to the broker of [`Broker::start`]
    /// (one broker: its pid is in `DIR/kafka.pid`).
    pub fn signal(&self, signal: &str) {
        let pid = std::fs::read_to_string(format!("{}/kafka.pid", self.dir)).expect("kafka.pid");
        let st = Command::new("kill")
            .args([format!("-{signal}"), pid.trim().to_string()])
            .status()
            .expect("kill");
        assert!(st.success(), "kill -{signal} {pid}");
    }

    pub fn pause(&self, i: usize) {
        self.broker_sh(i, &["pause"]);
    }

    /// SIGCONT broker `i` after [`Broker::pause`].
    pub fn resume(&self, i: usize) {
        self.broker_sh(i, &["resume"]);
    }

    /// SIGTERM broker `i` (a controlled shutdown); returns once it has exited.
    pub fn term(&self, i: usize) {
        self.broker_sh(i, &["term"]);
    }

    /// Start broker `i` again (after [`Broker::kill`] or [`Broker::term`]) with
    /// its config, data and ports; returns once it serves requests. (Named so
    /// beside [`Broker::restart`], which brings back a single broker.)
    pub fn restart_broker(&self, i: usize) {
        self.broker_sh(i, &["start"]);
    }

    /// The pid of broker `i` (it must run).
    pub fn pid(&self, i: usize) -> u32 {
        self.broker_sh(i, &["pid"]).parse().expect("a pid")
    }

    /// Wait until every partition of `topic` has a leader and its full ISR.
    pub fn wait_isr(&self, topic: &str) {
        self.broker_sh(1, &["wait-isr", topic]);
    }

    /// Every record of `topic`, read from the start of each of its
    /// `partitions` until `want` records were read (at most 60 s): (key,
    /// value) in partition order, partition by partition.
    pub fn consume_all(
        &self,
        topic: &str,
        partitions: i32,
        want: usize,
    ) -> Vec<(Option<String>, Option<String>)> {
        use rdkafka::{Message, Offset, TopicPartitionList};
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "pollbox-tests")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        c.assign(&tpl).expect("assign");
        let mut by_partition = vec![Vec::new(); partitions as usize];
        let mut n = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while n < want && std::time::Instant::now() < deadline {
            // Errors (a broker gone: transport failures) are the client's to
            // retry; only records count.
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
                by_partition[m.partition() as usize].push((text(m.key()), text(m.payload())));
                n += 1;
            }
        }
        by_partition.into_iter().flatten().collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/kafka/stop.sh"))
            .arg(&self.dir)
            .status();
    }
}

/// A record's acknowledgement: its partition and offset, or the error.
type Delivery = Result<(i32, i64), String>;

/// Delivery reports, by the id passed with each record.
#[derive(Default)]
pub struct Deliveries(Mutex<Vec<(usize, Delivery)>>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<usize>;
    fn delivery(&self, r: &DeliveryResult<'_>, id: Box<usize>) {
        use rdkafka::Message;
        let r = match r {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        if let Ok(mut v) = self.0.lock() {
            v.push((*id, r));
        }
    }
}

/// A plain Kafka producer (not pollbox).
pub struct Plain(BaseProducer<Deliveries>, AtomicUsize);

impl Plain {
    /// Produce one record and wait for its acknowledgement: its partition
    /// and offset. `value` `None` is a tombstone.
    pub fn send(&self, topic: &str, key: Option<&str>, value: Option<&str>) -> (i32, i64) {
        self.send_to(topic, None, key, value)
    }

    /// [`Plain::send`] to this partition (`None`: the partitioner's choice).
    pub fn send_to(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: Option<&str>,
        value: Option<&str>,
    ) -> (i32, i64) {
        let id = self.1.fetch_add(1, Ordering::Relaxed);
        let mut rec: BaseRecord<'_, str, str, Box<usize>> =
            BaseRecord::with_opaque_to(topic, Box::new(id));
        if let Some(p) = partition {
            rec = rec.partition(p);
        }
        if let Some(k) = key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        self.0.send(rec).map_err(|(e, _)| e).expect("send");
        self.0.flush(Duration::from_secs(30)).expect("flush");
        let v = self.0.context().0.lock().unwrap();
        let (_, r) = v.iter().rev().find(|(i, _)| *i == id).expect("delivered");
        r.clone().expect("acknowledged")
    }

    /// Produce these (key, value) records at once and wait until every one
    /// is acknowledged (at most 60 s): their partitions and offsets, in order.
    pub fn send_all(&self, topic: &str, records: &[(String, String)]) -> Vec<(i32, i64)> {
        let first = self.1.fetch_add(records.len(), Ordering::Relaxed);
        for (n, (k, v)) in records.iter().enumerate() {
            let mut rec: BaseRecord<'_, str, str, Box<usize>> =
                BaseRecord::with_opaque_to(topic, Box::new(first + n))
                    .key(k.as_str())
                    .payload(v.as_str());
            loop {
                match self.0.send(rec) {
                    Ok(()) => break,
                    Err((e, r)) => {
                        assert!(
                            e.rdkafka_error_code()
                                == Some(rdkafka::types::RDKafkaErrorCode::QueueFull),
                            "send: {e}"
                        );
                        self.0.poll(Duration::from_millis(10));
                        rec = r;
                    }
                }
            }
        }
        self.0.flush(Duration::from_secs(60)).expect("flush");
        let v = self.0.context().0.lock().unwrap();
        (first..first + records.len())
            .map(|id| {
                let (_, r) = v.iter().rev().find(|(i, _)| *i == id).expect("delivered");
                r.clone().expect("acknowledged")
            })
            .collect()
    }
}
