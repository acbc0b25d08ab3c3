//! `logbench`: the Kafka side of `benches/log/`, beside which pollbox's node of
//! a log is measured.
//!
//! - `fill`: produce N records of B bytes on K keys (`lg-0` .. `lg-<K-1>`, the
//!   keys `pollbox load` polls), batched (linger, big batches, acks=all,
//!   idempotent), as fast as the broker takes them or at `--rate`.
//! - `consume`: a bare consumer with exactly the client settings of pollbox's
//!   (`crates/server/src/log/consume.rs`): assigned every partition from
//!   offset 0, read to the end each partition had at start, the records
//!   touched (key, value, timestamp, headers) and nothing done with them.
//! - `floor`: the produce→consume latency floor: a producer set as pollbox's
//!   (acks=all, idempotent, linger 0) sends a record, a consumer set as
//!   pollbox's and assigned every partition from its end receives it.
//! - `batch`: the floor of batch ingest through the log: a producer set as
//!   pollbox's (acks=all, idempotent, linger 0, every delivery report served
//!   by a thread of its own) sends batches of `--batch` records, one
//!   `rd_kafka_produce_batch` a partition, `--inflight` batches at a time (as
//!   many connections), and a consumer set as pollbox's, assigned every
//!   partition from its end, counts each batch's records back: a batch is
//!   done when all are read and acknowledged. Records/s, the process's CPU a
//!   record, a batch's time. `--api record`: the way pollbox produced before
//!   (one call and a ticket header a record, failures' reports only).
//! - `stream`: publish on node A (`POST /v1/boxes/KEY`), receive the event on
//!   node B's event stream of KEY; the time between.
//!
//! What it is not: a load generator for pollbox's HTTP side (`pollbox load`).
//! Every result is one JSON line on stdout.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{DeliveryResult, Headers};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// `batch`: the floor of batch ingest through the log.
#[path = "logbench/batch.rs"]
mod batch;
use batch::batch;

const USAGE: &str = "\
logbench fill    --brokers B --topic T --records N [--bytes 512] [--keys 10000] [--rate R/s] [--linger-ms 5]
logbench consume --brokers B --topic T [--hold] [--client k=v,...]
    (--hold: at the end, print and sleep until killed; --client: pollbox's [log.client])
logbench floor   --brokers B --topic T [--count 3000] [--rate 500] [--bytes 512] [--keys 10000] [--client k=v,...]
logbench batch   --brokers B --topic T [--batch 100] [--inflight 16] [--seconds 8] [--bytes 512] [--keys 10000] [--client k=v,...]
logbench stream  --publish HOST:PORT --subscribe HOST:PORT [--count 2000] [--rate 200] [--key K]";

/// `--name value` pairs and bare `--flag`s.
struct Args(HashMap<String, String>);

impl Args {
    fn parse(args: &[String]) -> Args {
        let mut m = HashMap::new();
        let mut i = 0;
        while i < args.len() {
            let name = args[i].strip_prefix("--").unwrap_or_else(|| die(&args[i]));
            if i + 1 < args.len() && !args[i + 1].starts_with("--") {
                m.insert(name.to_string(), args[i + 1].clone());
                i += 2;
            } else {
                m.insert(name.to_string(), String::new());
                i += 1;
            }
        }
        Args(m)
    }
    fn str(&self, k: &str) -> String {
        self.0
            .get(k)
            .cloned()
            .unwrap_or_else(|| die(&format!("--{k} is needed")))
    }
    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> T {
        match self.0.get(k) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(&format!("--{k}: not a number: {v}"))),
        }
    }
    fn flag(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
    /// `--client k=v,k2=v2`: what pollbox's `[log.client]` would hold.
    fn client(&self) -> Vec<(String, String)> {
        self.0.get("client").map_or_else(Vec::new, |s| {
            s.split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| die(&format!("--client: not k=v: {kv}")));
                    (k.to_string(), v.to_string())
                })
                .collect()
        })
    }
}

fn die(why: &str) -> ! {
    eprintln!("logbench: {why}\n{USAGE}");
    std::process::exit(2)
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = argv.first() else {
        die("no command")
    };
    let a = Args::parse(&argv[1..]);
    match cmd.as_str() {
        "fill" => fill(&a),
        "consume" => consume(&a),
        "floor" => floor(&a),
        "batch" => batch(&a),
        "stream" => stream(&a),
        _ => die(&format!("unknown command {cmd}")),
    }
}

/// This process's CPU time (user, system) in seconds, from `/proc/self/stat`
/// (clock ticks of `USER_HZ`, 100 on Linux x86).
fn cpu_s() -> (f64, f64) {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit_once(')').map_or("", |x| x.1);
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    // Fields 14 and 15 of the line; 12 and 13 after the ")".
    (t(11), t(12))
}

/// The bare consumer's client: pollbox's `client_config` and `consumer`
/// (`crates/server/src/log/consume.rs`), property for property.
fn pollbox_consumer(brokers: &str, client: &[(String, String)]) -> BaseConsumer {
    let mut c = ClientConfig::new();
    for (k, v) in client {
        c.set(k, v);
    }
    c.set("bootstrap.servers", brokers);
    c.set("group.id", "pollbox-replica")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed");
    if !client.iter().any(|(k, _)| k == "fetch.wait.max.ms") {
        c.set("fetch.wait.max.ms", "100");
    }
    if !client.iter().any(|(k, _)| k == "fetch.queue.backoff.ms") {
        c.set("fetch.queue.backoff.ms", "10");
    }
    c.create()
        .unwrap_or_else(|e| die(&format!("consumer: {e}")))
}

/// Low and high watermark of each partition, as pollbox reads them at start.
fn watermarks(c: &BaseConsumer, topic: &str) -> Vec<(i64, i64)> {
    let t = Duration::from_secs(10);
    let md = c
        .fetch_metadata(Some(topic), t)
        .unwrap_or_else(|e| die(&format!("metadata: {e}")));
    let n = md
        .topics()
        .iter()
        .find(|x| x.name() == topic)
        .map_or(0, |x| x.partitions().len());
    if n == 0 {
        die(&format!("topic {topic} has no partitions"));
    }
    (0..n as i32)
        .map(|p| {
            c.fetch_watermarks(topic, p, t)
                .unwrap_or_else(|e| die(&format!("watermarks: {e}")))
        })
        .collect()
}

fn assign(c: &BaseConsumer, topic: &str, parts: usize, from: impl Fn(usize) -> Offset) {
    let mut tpl = TopicPartitionList::new();
    for p in 0..parts {
        tpl.add_partition_offset(topic, p as i32, from(p))
            .unwrap_or_else(|e| die(&format!("assign: {e}")));
    }
    c.assign(&tpl)
        .unwrap_or_else(|e| die(&format!("assign: {e}")));
}

/// Counts the records the log did not take.
struct Failures(Arc<AtomicU64>);
impl ClientContext for Failures {}
impl ProducerContext for Failures {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        if r.is_err() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What every producer here shares with pollbox's: `acks=all`, idempotent,
/// Kafka's default partitioner (a record in another partition than its key's
/// home is applied by no node), and `linger_ms`.
fn producer_config(brokers: &str, linger_ms: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", linger_ms);
    c
}

fn producer(
    brokers: &str,
    linger_ms: &str,
    batching: bool,
) -> (ThreadedProducer<Failures>, Arc<AtomicU64>) {
    let failed = Arc::new(AtomicU64::new(0));
    let mut c = producer_config(brokers, linger_ms);
    if batching {
        c.set("batch.size", "1000000")
            .set("batch.num.messages", "100000")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576")
            .set("compression.type", "none");
    }
    let p = c
        .create_with_context(Failures(failed.clone()))
        .unwrap_or_else(|e| die(&format!("producer: {e}")));
    (p, failed)
}

/// `{"key":"lg-N","value":V,"player":"p-NNN","cargo":{...}}` of `bytes` bytes
/// (the cargo evens out key lengths), as `pollbox load` sends.
struct Messages {
    cargo: Vec<Vec<u8>>,
}

impl Messages {
    const HEAD: usize = r#"{"key":"","value":1234567,"player":"p-123","cargo":}"#.len();
    fn new(bytes: usize, keys: u32) -> Messages {
        let widest = format!("lg-{}", keys.saturating_sub(1)).len();
        let cargo = (0..=widest)
            .map(|w| pollbox_load::cargo_json(bytes.saturating_sub(Self::HEAD + w).max(2)))
            .collect();
        Messages { cargo }
    }
    fn write(&self, out: &mut Vec<u8>, key: &str, value: u64) {
        out.clear();
        let _ = write!(
            out,
            r#"{{"key":"{key}","value":{},"player":"p-{:03}","cargo":"#,
            1_000_000 + value % 9_000_000,
            value % 1000
        );
        out.extend_from_slice(&self.cargo[key.len().min(self.cargo.len() - 1)]);
        out.push(b'}');
    }
}

fn fill(a: &Args) {
    let brokers = a.str("brokers");
    let topic = a.str("topic");
    let records: u64 = a.num("records", 1_000_000);
    let bytes: usize = a.num("bytes", 512);
    let keys: u32 = a.num("keys", 10_000);
    let rate: f64 = a.num("rate", 0.0);
    let linger = a.str_or("linger-ms", "5");
    let (p, failed) = producer(&brokers, &linger, true);
    let msgs = Messages::new(bytes, keys);
    let key_names: Vec<String> = (0..keys).map(|k| format!("lg-{k}")).collect();
    let mut value = Vec::with_capacity(bytes + 64);
    let mut full_waits = 0u64;
    let start = Instant::now();
    let cpu0 = cpu_s();
    for i in 0..records {
        if rate > 0.0 && i % 256 == 0 {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        let key = &key_names[(i % u64::from(keys)) as usize];
        msgs.write(&mut value, key, i);
        let mut rec: BaseRecord<'_, str, [u8], ()> =
            BaseRecord::to(&topic).key(key.as_str()).payload(&value[..]);
        loop {
            match p.send(rec) {
                Ok(()) => break,
                Err((_, back)) => {
                    // The client's queue is full: let it drain.
                    full_waits += 1;
                    rec = back;
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
        }
    }
    let sent = start.elapsed().as_secs_f64();
    p.flush(Duration::from_secs(300))
        .unwrap_or_else(|e| die(&format!("flush: {e}")));
    let wall = start.elapsed().as_secs_f64();
    let cpu1 = cpu_s();
    println!(
        "{{\"cmd\":\"fill\",\"records\":{records},\"bytes\":{},\"keys\":{keys},\"rate_asked\":{rate},\"wall_s\":{wall:.3},\"sent_s\":{sent:.3},\"records_per_s\":{:.0},\"failed\":{},\"queue_full_waits\":{full_waits},\"cpu_user_s\":{:.2},\"cpu_sys_s\":{:.2}}}",
        value.len(),
        records as f64 / wall,
        failed.load(Ordering::Relaxed),
        cpu1.0 - cpu0.0,
        cpu1.1 - cpu0.1
    );
}

impl Args {
    fn str_or(&self, k: &str, d: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| d.to_string())
    }
}

fn consume(a: &Args) {
    let start = Instant::now();
    let brokers = a.str("brokers");
    let topic = a.str("topic");
    let c = pollbox_consumer(&brokers, &a.client());
    let marks = watermarks(&c, &topic);
    let ends: Vec<i64> = marks.iter().map(|m| m.1).collect();
    let mut next: Vec<i64> = vec![0; ends.len()];
    assign(&c, &topic, ends.len(), |_| Offset::Offset(0));
    let total: i64 = ends.iter().sum();
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    let done = |next: &[i64]| next.iter().zip(&ends).all(|(n, e)| n >= e);
    while !done(&next) {
        match c.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => eprintln!("logbench: consume: {e}"),
            Some(Ok(m)) => {
                first.get_or_insert_with(Instant::now);
                // Touched as pollbox touches them, nothing done with them.
                let ts = m.timestamp().to_millis().unwrap_or(0);
                let k = m.key().map_or(0, <[u8]>::len);
                let v = m.payload().map_or(0, <[u8]>::len);
                let h = m.headers().map_or(0, |h| h.count());
                black_box(ts);
                bytes += black_box(k + v + h) as u64;
                records += 1;
                let p = m.partition() as usize;
                next[p] = next[p].max(m.offset() + 1);
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let reading = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    let (u, s) = cpu_s();
    println!(
        "{{\"cmd\":\"consume\",\"records\":{records},\"end_total\":{total},\"bytes\":{bytes},\"wall_s\":{wall:.3},\"reading_s\":{reading:.3},\"records_per_s\":{:.0},\"cpu_user_s\":{u:.2},\"cpu_sys_s\":{s:.2},\"cpu_us_per_record\":{:.3}}}",
        records as f64 / wall,
        (u + s) * 1e6 / records.max(1) as f64
    );
    let _ = std::io::stdout().flush();
    if a.flag("hold") {
        // The script reads /proc/PID/stat now, as it does for pollbox at
        // /readyz 200, then ends us.
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn summary(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "\"n\":{},\"p50_us\":{:.0},\"p90_us\":{:.0},\"p99_us\":{:.0},\"p999_us\":{:.0},\"max_us\":{:.0}",
        v.len(),
        pct(&v, 0.5),
        pct(&v, 0.9),
        pct(&v, 0.99),
        pct(&v, 0.999),
        v.last().copied().unwrap_or(f64::NAN)
    )
}

fn floor(a: &Args) {
    let brokers = a.str("brokers");
    let topic = a.str("topic");
    let count: u64 = a.num("count", 3000);
    let rate: f64 = a.num("rate", 500.0);
    let bytes: usize = a.num::<usize>("bytes", 512).max(16);
    let keys: u32 = a.num("keys", 10_000);
    let base = Instant::now();
    let c = pollbox_consumer(&brokers, &a.client());
    let parts = watermarks(&c, &topic).len();
    assign(&c, &topic, parts, |_| Offset::End);
    // Producer as pollbox's (crates/server/src/log/produce.rs): acks=all,
    // idempotent, linger 0.
    let (p, failed) = producer(&brokers, "0", false);
    const WARMUP: u64 = u64::MAX;
    let lat = Arc::new(Mutex::new(Vec::with_capacity(count as usize)));
    let warm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (lat, warm, stop) = (lat.clone(), warm.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                    let now = base.elapsed().as_nanos() as u64;
                    let Some(v) = m.payload().filter(|v| v.len() >= 16) else {
                        continue;
                    };
                    let seq = u64::from_le_bytes(v[..8].try_into().unwrap_or_default());
                    let sent = u64::from_le_bytes(v[8..16].try_into().unwrap_or_default());
                    if seq == WARMUP {
                        warm.store(true, Ordering::Release);
                    } else {
                        lat.lock().unwrap().push((now - sent) as f64 / 1e3);
                    }
                }
            }
        })
    };
    let mut value = vec![b'x'; bytes];
    let key_names: Vec<String> = (0..keys).map(|k| format!("lg-{k}")).collect();
    let send = |seq: u64, value: &mut Vec<u8>| {
        value[..8].copy_from_slice(&seq.to_le_bytes());
        value[8..16].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
        let key = &key_names[(seq % u64::from(keys)) as usize];
        let rec: BaseRecord<'_, str, [u8], ()> =
            BaseRecord::to(&topic).key(key.as_str()).payload(&value[..]);
        if p.send(rec).is_err() {
            eprintln!("logbench: floor: queue full");
        }
    };
    // Until the consumer's "end" is resolved, records may go unseen: warm up.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !warm.load(Ordering::Acquire) {
        if Instant::now() > deadline {
            die("floor: the consumer saw no warm-up record in 30 s");
        }
        send(WARMUP, &mut value);
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    lat.lock().unwrap().clear();
    // The client's whole CPU (producer, consumer and their threads) from the
    // first record to the last one received: the least a node of a log
    // spends on a message, beside pollbox's own.
    let (u0, s0) = cpu_s();
    let start = Instant::now();
    for seq in 0..count {
        let due = start + Duration::from_secs_f64(seq as f64 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        send(seq, &mut value);
    }
    let _ = p.flush(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(5);
    while (lat.lock().unwrap().len() as u64) < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (u1, s1) = cpu_s();
    stop.store(true, Ordering::Release);
    let _ = reader.join();
    let v = std::mem::take(&mut *lat.lock().unwrap());
    let got = v.len();
    let cpu_us = (u1 - u0 + s1 - s0) * 1e6 / count.max(1) as f64;
    println!(
        "{{\"cmd\":\"floor\",\"rate\":{rate},\"bytes\":{bytes},\"sent\":{count},\"received\":{got},\"failed\":{},\"cpu_us_per_msg\":{cpu_us:.1},{}}}",
        failed.load(Ordering::Relaxed),
        summary(v)
    );
}

/// A response's head and body read off `r`; the body's length.
fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, usize)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut len = 0usize;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((status, len))
}

fn stream(a: &Args) {
    let publish = a.str("publish");
    let subscribe = a.str("subscribe");
    let count: u64 = a.num("count", 2000);
    let rate: f64 = a.num("rate", 200.0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let key = a.str_or(
        "key",
        &format!("sse-{}-{}", std::process::id(), nanos % 1_000_000_007),
    );
    let base = Instant::now();
    // Receive times by value, from B's stream.
    let got: Arc<Mutex<HashMap<u64, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let events = Arc::new(AtomicU64::new(0));
    let sub = TcpStream::connect(&subscribe).unwrap_or_else(|e| die(&format!("{subscribe}: {e}")));
    sub.set_nodelay(true).ok();
    (&sub)
        .write_all(
            format!("GET /v1/boxes/{key} HTTP/1.1\r\nHost: b\r\nAccept: text/event-stream\r\n\r\n")
                .as_bytes(),
        )
        .unwrap_or_else(|e| die(&format!("subscribe: {e}")));
    let reader = {
        let (got, events) = (got.clone(), events.clone());
        let sub = sub.try_clone().unwrap_or_else(|e| die(&e.to_string()));
        std::thread::spawn(move || {
            let mut r = BufReader::new(sub);
            let mut line = String::new();
            loop {
                line.clear();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                let Some(data) = line.strip_prefix("data: ") else {
                    continue;
                };
                let now = base.elapsed().as_nanos() as u64;
                // `"v":N` is the value last published.
                if let Some(i) = data.find("\"v\":") {
                    let digits: String = data[i + 4..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let Ok(v) = digits.parse::<u64>() {
                        got.lock().unwrap().insert(v, now);
                        events.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let pubc = TcpStream::connect(&publish).unwrap_or_else(|e| die(&format!("{publish}: {e}")));
    pubc.set_nodelay(true).ok();
    let mut pr = BufReader::new(pubc.try_clone().unwrap_or_else(|e| die(&e.to_string())));
    let mut sent_at = Vec::with_capacity(count as usize);
    let mut answered = Vec::with_capacity(count as usize);
    let mut late = 0u64;
    let mut errors = 0u64;
    let start = Instant::now();
    for seq in 1..=count {
        let due = start + Duration::from_secs_f64(seq as f64 / rate);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_millis(1) {
            late += 1;
        }
        let body = format!("{{\"value\":{seq},\"player\":\"p-1\"}}");
        let req = format!(
            "POST /v1/boxes/{key} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let t0 = base.elapsed().as_nanos() as u64;
        (&pubc)
            .write_all(req.as_bytes())
            .unwrap_or_else(|e| die(&format!("publish: {e}")));
        match read_response(&mut pr) {
            Ok((200, _)) => {}
            Ok((s, _)) => {
                errors += 1;
                eprintln!("logbench: stream: publish answered {s}");
            }
            Err(e) => die(&format!("publish: {e}")),
        }
        answered.push((base.elapsed().as_nanos() as u64 - t0) as f64 / 1e3);
        sent_at.push((seq, t0));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.lock().unwrap().get(&count).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = sub.shutdown(std::net::Shutdown::Both);
    let _ = reader.join();
    let got = got.lock().unwrap();
    let lat: Vec<f64> = sent_at
        .iter()
        .filter_map(|(seq, t0)| got.get(seq).map(|t| (t.saturating_sub(*t0)) as f64 / 1e3))
        .collect();
    println!(
        "{{\"cmd\":\"stream\",\"rate\":{rate},\"published\":{count},\"publish_errors\":{errors},\"late_sends\":{late},\"events\":{},\"event\":{{{}}},\"publish_answered\":{{{}}}}}",
        events.load(Ordering::Relaxed),
        summary(lat),
        summary(answered)
    );
}
