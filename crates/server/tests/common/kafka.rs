//! A real Kafka broker for the log's tests (`scripts/kafka/start.sh`: a
//! single KRaft node on free ports, stopped when the test process ends) and a
//! plain Kafka client to create topics and produce, as any producer would.
#![allow(dead_code)]

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
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
        let script = repo_root().join("scripts/kafka/start.sh");
        let out = Command::new(&script)
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
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin client");
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let r = futures_executor::block_on(admin.create_topics([&topic], &opts))
            .expect("create_topics");
        for t in r {
            t.expect("topic created");
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
        let id = self.1.fetch_add(1, Ordering::Relaxed);
        let mut rec: BaseRecord<'_, str, str, Box<usize>> =
            BaseRecord::with_opaque_to(topic, Box::new(id));
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
}
