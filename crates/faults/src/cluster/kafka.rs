//! Three Kafka brokers (KRaft, each broker and controller in one JVM) in
//! their namespaces, started with the jars and JVM options of
//! `scripts/kafka/lib.sh`; the admin side the nemesis and the checker need
//! (the topic, its partitions' leaders and in-sync replicas, moving a
//! leader with Kafka's own tools, reading the whole topic back); and the
//! foreign producer.
//!
//! Brokers listen on three networks' addresses (see [`super::net`]):
//! `CLIENT` on the Kafka clients' network, `REPL` (replication) and
//! `CONTROLLER` on the brokers' own. Failure detection is shortened from
//! Kafka's defaults so that a fault of a few seconds has effects within a
//! short run: `broker.session.timeout.ms=6000`,
//! `broker.heartbeat.interval.ms=1000`, `replica.lag.time.max.ms=6000`.

use super::net::{Lan, Net};
use super::process::{run, Proc};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const BROKERS: usize = 3;
const CLIENT_PORT: u16 = 9092;
const CONTROLLER_PORT: u16 = 9093;
const REPL_PORT: u16 = 9094;

/// The jars and JVM options `scripts/kafka/lib.sh` gives.
pub struct Jvm {
    lib_sh: PathBuf,
    libs: PathBuf,
    common: Vec<String>,
}

impl Jvm {
    pub fn find(repo: &Path) -> Result<Jvm, String> {
        let lib_sh = repo.join("scripts/kafka/lib.sh");
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(r#"source "$1" && kafka_libs && kafka_jvm_common"#)
            .arg("_")
            .arg(&lib_sh);
        let out = run("scripts/kafka/lib.sh", c)?;
        let mut lines = out.lines().filter(|l| !l.starts_with("kafka:"));
        let libs = PathBuf::from(lines.next().ok_or("lib.sh printed no jar folder")?);
        let common = lines
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        Ok(Jvm {
            lib_sh,
            libs,
            common,
        })
    }

    fn classpath(&self) -> String {
        format!("{}/*", self.libs.display())
    }

    /// Run a Kafka tool (a main class) to its end, through lib.sh's `kafka_run`.
    pub fn tool(&self, class: &str, args: &[&str]) -> Result<String, String> {
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(r#"source "$1" && shift && kafka_run "$@""#)
            .arg("_")
            .arg(&self.lib_sh)
            .arg(class)
            .args(args);
        run(class, c)
    }
}

/// One broker.
pub struct Broker {
    pub id: usize,
    pub host: String,
    pub dir: PathBuf,
    proc: Mutex<Option<Proc>>,
    started_seen: Mutex<usize>,
}

/// The three brokers.
pub struct Brokers {
    pub list: Vec<Broker>,
    pub bootstrap: String,
    jvm: Jvm,
}

fn count_started(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("server.log"))
        .map(|s| s.matches("Kafka Server started").count())
        .unwrap_or(0)
}

impl Brokers {
    /// Host names of the brokers, as [`super::net`] knows them.
    pub fn host(i: usize) -> String {
        format!("b{}", i + 1)
    }

    pub fn octet(i: usize) -> u8 {
        11 + i as u8
    }

    /// Format three brokers' storage under `dir` and start them; returns
    /// once each said it started.
    pub fn start(net: &Net, jvm: Jvm, dir: &Path) -> Result<Brokers, String> {
        let cluster_id = cluster_id();
        let voters: Vec<String> = (0..BROKERS)
            .map(|i| {
                format!(
                    "{}@{}:{CONTROLLER_PORT}",
                    i + 1,
                    net.addr(Self::octet(i), Lan::Replication)
                )
            })
            .collect();
        let mut list = Vec::new();
        for i in 0..BROKERS {
            let bdir = dir.join(Self::host(i));
            std::fs::create_dir_all(bdir.join("data")).map_err(|e| e.to_string())?;
            let k = net.addr(Self::octet(i), Lan::Kafka);
            let r = net.addr(Self::octet(i), Lan::Replication);
            let props = format!(
                "# written by pollbox-faults\n\
                 process.roles=broker,controller\n\
                 node.id={id}\n\
                 controller.quorum.voters={voters}\n\
                 listeners=CLIENT://{k}:{CLIENT_PORT},REPL://{r}:{REPL_PORT},CONTROLLER://{r}:{CONTROLLER_PORT}\n\
                 advertised.listeners=CLIENT://{k}:{CLIENT_PORT},REPL://{r}:{REPL_PORT}\n\
                 listener.security.protocol.map=CLIENT:PLAINTEXT,REPL:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
                 controller.listener.names=CONTROLLER\n\
                 inter.broker.listener.name=REPL\n\
                 log.dirs={data}\n\
                 num.partitions=4\n\
                 default.replication.factor=3\n\
                 min.insync.replicas=2\n\
                 unclean.leader.election.enable=false\n\
                 auto.create.topics.enable=false\n\
                 offsets.topic.replication.factor=3\n\
                 offsets.topic.num.partitions=4\n\
                 transaction.state.log.replication.factor=3\n\
                 transaction.state.log.min.isr=2\n\
                 transaction.state.log.num.partitions=4\n\
                 share.coordinator.state.topic.replication.factor=3\n\
                 share.coordinator.state.topic.min.isr=2\n\
                 group.initial.rebalance.delay.ms=0\n\
                 num.network.threads=2\n\
                 num.io.threads=2\n\
                 num.recovery.threads.per.data.dir=1\n\
                 log.retention.hours=-1\n\
                 broker.heartbeat.interval.ms=1000\n\
                 broker.session.timeout.ms=6000\n\
                 replica.lag.time.max.ms=6000\n",
                id = i + 1,
                voters = voters.join(","),
                data = bdir.join("data").display(),
            );
            std::fs::write(bdir.join("server.properties"), props).map_err(|e| e.to_string())?;
            std::fs::write(
                bdir.join("log4j2.properties"),
                format!(
                    "status = error\n\
                     appender.file.type = File\n\
                     appender.file.name = FILE\n\
                     appender.file.fileName = {}\n\
                     appender.file.layout.type = PatternLayout\n\
                     appender.file.layout.pattern = [%d] %p %m (%c)%n\n\
                     rootLogger.level = info\n\
                     rootLogger.appenderRef.file.ref = FILE\n",
                    bdir.join("server.log").display()
                ),
            )
            .map_err(|e| e.to_string())?;
            list.push(Broker {
                id: i + 1,
                host: Self::host(i),
                dir: bdir,
                proc: Mutex::new(None),
                started_seen: Mutex::new(0),
            });
        }
        // Format the three storages at once (a JVM each).
        std::thread::scope(|s| {
            let handles: Vec<_> = list
                .iter()
                .map(|b| {
                    let jvm = &jvm;
                    let cluster_id = &cluster_id;
                    s.spawn(move || {
                        let mut c = Command::new("java");
                        c.args(["-Xmx256m", "-XX:TieredStopAtLevel=1"])
                            .args(&jvm.common)
                            .arg(format!(
                                "-Dlog4j2.configurationFile={}",
                                jvm.lib_sh
                                    .with_file_name("log4j2-tools.properties")
                                    .display()
                            ))
                            .args(["-cp", &jvm.classpath(), "kafka.tools.StorageTool", "format"])
                            .arg("--config")
                            .arg(b.dir.join("server.properties"))
                            .args(["--cluster-id", cluster_id]);
                        run(&format!("format {}", b.host), c).map(|_| ())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("format panicked".into())))
                .collect::<Result<Vec<()>, String>>()
        })?;
        let bootstrap = (0..BROKERS)
            .map(|i| format!("{}:{CLIENT_PORT}", net.addr(Self::octet(i), Lan::Kafka)))
            .collect::<Vec<_>>()
            .join(",");
        let brokers = Brokers {
            list,
            bootstrap,
            jvm,
        };
        for i in 0..BROKERS {
            brokers.launch(net, i)?;
        }
        for i in 0..BROKERS {
            brokers.wait_started(i, Duration::from_secs(150))?;
        }
        Ok(brokers)
    }

    pub fn jvm(&self) -> &Jvm {
        &self.jvm
    }

    /// Start broker `i`'s JVM (after a kill: on the data it left).
    pub fn launch(&self, net: &Net, i: usize) -> Result<(), String> {
        let b = &self.list[i];
        *b.started_seen.lock().unwrap_or_else(|e| e.into_inner()) = count_started(&b.dir);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(b.dir.join("kafka.out"))
            .map_err(|e| e.to_string())?;
        let mut c = net.command(&b.host, "java");
        c.args(["-Xms128m", "-Xmx384m"])
            .args(&self.jvm.common)
            .args([
                "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20",
                "-Djava.awt.headless=true",
            ])
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                b.dir.join("log4j2.properties").display()
            ))
            .args(["-cp", &self.jvm.classpath(), "kafka.Kafka"])
            .arg(b.dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| e.to_string())?)
            .stderr(out);
        let p = Proc::start(&b.host, c).map_err(|e| format!("start {}: {e}", b.host))?;
        *b.proc.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        Ok(())
    }

    /// Wait until broker `i` logged that it started (since its launch).
    pub fn wait_started(&self, i: usize, timeout: Duration) -> Result<(), String> {
        let b = &self.list[i];
        let before = *b.started_seen.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + timeout;
        loop {
            if count_started(&b.dir) > before {
                return Ok(());
            }
            {
                let mut p = b.proc.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(pr) = p.as_mut() {
                    if !pr.alive() {
                        return Err(format!(
                            "broker {} exited while starting; see {}",
                            b.host,
                            b.dir.join("server.log").display()
                        ));
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("broker {} did not start in {timeout:?}", b.host));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// kill -9 broker `i` (and reap it).
    pub fn kill(&self, i: usize) {
        if let Some(p) = self.list[i]
            .proc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            p.kill9();
        }
    }

    /// SIGSTOP / SIGCONT broker `i`.
    pub fn signal(&self, i: usize, sig: i32) -> Result<(), String> {
        match self.list[i]
            .proc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(p) => p.signal(sig).map_err(|e| e.to_string()),
            None => Err(format!("broker {} is not running", self.list[i].host)),
        }
    }

    pub fn running(&self, i: usize) -> bool {
        self.list[i]
            .proc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|p| p.alive())
    }

    /// Stop every broker (SIGTERM, then SIGKILL).
    pub fn stop_all(&self) {
        std::thread::scope(|s| {
            for b in &self.list {
                s.spawn(move || {
                    if let Some(p) = b.proc.lock().unwrap_or_else(|e| e.into_inner()).take() {
                        p.terminate(Duration::from_secs(10));
                    }
                });
            }
        });
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>, String> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()
            .map_err(|e| format!("admin client: {e}"))
    }

    /// Create `topic`: `partitions` partitions, replication factor 3,
    /// `min.insync.replicas` 2.
    pub fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), String> {
        let admin = self.admin()?;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(3))
            .set("min.insync.replicas", "2");
        let r = futures_executor::block_on(admin.create_topics([&t], &opts))
            .map_err(|e| format!("create topic: {e}"))?;
        for t in r {
            t.map_err(|(name, e)| format!("create topic {name}: {e}"))?;
        }
        Ok(())
    }

    /// Each partition's leader, replicas and in-sync replicas (broker ids).
    pub fn partitions(&self, topic: &str) -> Result<Vec<PartitionState>, String> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()
            .map_err(|e| e.to_string())?;
        let md = c
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| format!("metadata: {e}"))?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or("no such topic")?;
        Ok(t.partitions()
            .iter()
            .map(|p| PartitionState {
                id: p.id(),
                leader: p.leader(),
                replicas: p.replicas().to_vec(),
                isr: p.isr().to_vec(),
            })
            .collect())
    }

    /// Wait until every partition has a leader and all 3 replicas in sync.
    pub fn wait_in_sync(&self, topic: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.partitions(topic) {
                Ok(ps) if ps.iter().all(|p| p.leader >= 0 && p.isr.len() == BROKERS) => {
                    return Ok(())
                }
                Ok(ps) => last = format!("{ps:?}"),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(format!("partitions not in sync after {timeout:?}: {last}"))
    }

    /// Move partition `p`'s leader to another in-sync replica: its replicas
    /// reordered so that one is preferred (the reassignment tool), then a
    /// preferred-leader election (the leader election tool). Returns
    /// "from -> to".
    pub fn move_leader(&self, topic: &str, p: i32, dir: &Path) -> Result<String, String> {
        let st = self
            .partitions(topic)?
            .into_iter()
            .find(|s| s.id == p)
            .ok_or("no such partition")?;
        let to = st
            .isr
            .iter()
            .copied()
            .find(|&b| b != st.leader)
            .ok_or_else(|| format!("partition {p} has no other in-sync replica: {st:?}"))?;
        let mut order = vec![to];
        order.extend(st.replicas.iter().copied().filter(|&b| b != to));
        let json = format!(
            r#"{{"version":1,"partitions":[{{"topic":"{topic}","partition":{p},"replicas":[{}]}}]}}"#,
            order
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let file = dir.join(format!("reassign-{p}.json"));
        std::fs::write(&file, json).map_err(|e| e.to_string())?;
        let file = file.to_string_lossy().into_owned();
        self.jvm.tool(
            "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
            &[
                "--bootstrap-server",
                &self.bootstrap,
                "--reassignment-json-file",
                &file,
                "--execute",
            ],
        )?;
        let ps = p.to_string();
        self.jvm.tool(
            "org.apache.kafka.tools.LeaderElectionCommand",
            &[
                "--bootstrap-server",
                &self.bootstrap,
                "--election-type",
                "PREFERRED",
                "--topic",
                topic,
                "--partition",
                &ps,
            ],
        )?;
        Ok(format!("broker {} -> broker {to}", st.leader))
    }

    /// Each partition's end (high watermark).
    pub fn ends(&self, topic: &str, partitions: i32) -> Result<Vec<i64>, String> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3")
            .create()
            .map_err(|e| e.to_string())?;
        (0..partitions)
            .map(|p| {
                c.fetch_watermarks(topic, p, Duration::from_secs(10))
                    .map(|(_, high)| high)
                    .map_err(|e| format!("watermarks of {p}: {e}"))
            })
            .collect()
    }

    /// Every record of the topic, from its start to its end now.
    pub fn read_all(&self, topic: &str, partitions: i32) -> Result<Vec<LogRecord>, String> {
        let ends = self.ends(topic, partitions)?;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "pollbox-faults-checker")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("log_level", "3")
            .create()
            .map_err(|e| e.to_string())?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
        c.assign(&tpl).map_err(|e| e.to_string())?;
        let mut next: HashMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while (0..partitions).any(|p| next[&p] < ends[p as usize]) {
            if Instant::now() > deadline {
                return Err(format!(
                    "reading the topic: at {next:?} of {ends:?} after 120 s"
                ));
            }
            match c.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    next.insert(m.partition(), m.offset() + 1);
                    out.push(LogRecord {
                        partition: m.partition(),
                        offset: m.offset(),
                        key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                        value: m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
                    });
                }
                Some(Err(e)) => eprintln!("pollbox-faults: reading the topic: {e}"),
                None => {}
            }
        }
        Ok(out)
    }

    /// A plain producer, as a team's own would be, on librdkafka's default
    /// partitioner (`consistent_random`: CRC32 of the key), not murmur2.
    pub fn foreign_producer(&self) -> Result<BaseProducer<Deliveries>, String> {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .set("message.timeout.ms", "10000")
            .set("log_level", "3")
            .create_with_context(Deliveries::default())
            .map_err(|e| format!("producer: {e}"))
    }
}

#[derive(Debug, Clone)]
pub struct PartitionState {
    pub id: i32,
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

/// One record of the topic.
#[derive(Debug, Clone)]
pub struct LogRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub value: Option<String>,
}

/// A record's acknowledgement (partition, offset) or the error, by the id
/// sent with it.
pub type Delivery = Result<(i32, i64), String>;

#[derive(Default)]
pub struct Deliveries(pub Mutex<HashMap<u64, Delivery>>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<u64>;
    fn delivery(&self, r: &DeliveryResult<'_>, id: Box<u64>) {
        let r = match r {
            Ok(m) => Ok((m.partition(), m.offset())),
            Err((e, _)) => Err(e.to_string()),
        };
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*id, r);
    }
}

/// Send one keyed record and wait for its delivery report.
pub fn produce_one(
    p: &BaseProducer<Deliveries>,
    topic: &str,
    id: u64,
    key: &str,
    value: &str,
    timeout: Duration,
) -> Delivery {
    let rec: BaseRecord<'_, str, str, Box<u64>> = BaseRecord::with_opaque_to(topic, Box::new(id))
        .key(key)
        .payload(value);
    if let Err((e, _)) = p.send(rec) {
        return Err(format!("not sent: {e}"));
    }
    let deadline = Instant::now() + timeout;
    loop {
        p.poll(Duration::from_millis(50));
        if let Some(r) = p
            .context()
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
        {
            return r;
        }
        if Instant::now() > deadline {
            let _ = p.flush(Duration::from_secs(0));
            return Err("no delivery report in time".into());
        }
    }
}

fn cluster_id() -> String {
    // What `kafka-storage random-uuid` prints: 16 random bytes, URL-safe
    // base64 without padding, not starting with '-'.
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    bytes[0] &= 0x7f; // the first character is then never '-' or '_'
    let mut s = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    s
}
