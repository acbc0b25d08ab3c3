//! `logbench batch`: the floor of batch ingest through the log (see the
//! command's line in `logbench.rs`): pollbox's Kafka clients, used as its
//! node uses them, with nothing of pollbox's own work.

use super::{assign, cpu_s, die, pollbox_consumer, producer_config, summary, watermarks, Args};
use rdkafka::message::{DeliveryResult, Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Message, Offset};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node's producer, property for property
/// (`crates/server/src/log/produce.rs`), polled by its caller.
fn pollbox_producer(brokers: &str, every_report: bool) -> (BaseProducer<Counted>, Arc<AtomicU64>) {
    let failed = Arc::new(AtomicU64::new(0));
    let mut c = producer_config(brokers, "0");
    c.set(
        "delivery.report.only.error",
        if every_report { "false" } else { "true" },
    )
    .set("message.timeout.ms", "0");
    let p = c
        .create_with_context(Counted(failed.clone()))
        .unwrap_or_else(|e| die(&format!("producer: {e}")));
    (p, failed)
}

/// [`Failures`] with an opaque value a record, as pollbox's producer has.
struct Counted(Arc<AtomicU64>);
impl ClientContext for Counted {}
impl ProducerContext for Counted {
    type DeliveryOpaque = usize;
    fn delivery(&self, r: &DeliveryResult<'_>, _: usize) {
        if r.is_err() {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub(super) fn batch(a: &Args) {
    let brokers = a.str("brokers");
    let topic = a.str("topic");
    let size: u32 = a.num::<u32>("batch", 100).max(1);
    let inflight: u32 = a.num::<u32>("inflight", 16).max(1);
    let seconds: f64 = a.num("seconds", 8.0);
    let bytes: usize = a.num::<usize>("bytes", 512).max(16);
    let keys: u32 = a.num::<u32>("keys", 10_000).max(1);
    // `batch` (pollbox's way): one rd_kafka_produce_batch a partition, a
    // batch done when read back and acknowledged (every delivery report,
    // served by a thread of its own); `record`: one producev a record with
    // a ticket header, reports for failures only, done when read back (the
    // way pollbox produced before).
    let api_batch = a.str_or("api", "batch") == "batch";
    let base = Instant::now();
    let c = pollbox_consumer(&brokers, &a.client());
    let parts = watermarks(&c, &topic).len();
    assign(&c, &topic, parts, |_| Offset::End);
    let (p, failed) = pollbox_producer(&brokers, api_batch);
    let p = Arc::new(p);
    const WARMUP: u64 = u64::MAX;
    // (batch id, its reads or its acknowledgements are all in).
    let (done_tx, done_rx) = std::sync::mpsc::channel::<u64>();
    let warm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (warm, stop, done_tx) = (warm.clone(), stop.clone(), done_tx.clone());
        std::thread::spawn(move || {
            // Records read of each batch still in flight.
            let mut read: HashMap<u64, u32> = HashMap::new();
            while !stop.load(Ordering::Acquire) {
                let Some(Ok(m)) = c.poll(Duration::from_millis(100)) else {
                    continue;
                };
                // Touched as pollbox touches a record.
                black_box((m.timestamp().to_millis(), m.key().map(<[u8]>::len)));
                if !api_batch {
                    black_box(
                        m.headers()
                            .and_then(|h| h.iter().next().map(|h| h.key.len())),
                    );
                }
                let Some(v) = m.payload().filter(|v| v.len() >= 16) else {
                    continue;
                };
                let id = u64::from_le_bytes(v[..8].try_into().unwrap_or_default());
                if id == WARMUP {
                    warm.store(true, Ordering::Release);
                    continue;
                }
                let n = read.entry(id).or_insert(0);
                *n += 1;
                if *n == size {
                    read.remove(&id);
                    let _ = done_tx.send(id);
                }
            }
        })
    };
    // The delivery reports, as pollbox's acknowledging thread reads them.
    let acker = api_batch.then(|| {
        let (p, stop, done_tx, failed) = (p.clone(), stop.clone(), done_tx.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut acked: HashMap<u64, u32> = HashMap::new();
            let mut msgs: Vec<*const rdkafka::bindings::rd_kafka_message_t> = Vec::new();
            // SAFETY: a reference to the client's main queue, released below.
            let q = unsafe { rdkafka::bindings::rd_kafka_queue_get_main(p.client().native_ptr()) };
            while !stop.load(Ordering::Acquire) {
                // SAFETY: the queue is alive; the event is read, then destroyed.
                unsafe {
                    let ev = rdkafka::bindings::rd_kafka_queue_poll(q, 100);
                    if ev.is_null() {
                        continue;
                    }
                    if rdkafka::bindings::rd_kafka_event_type(ev) == rdkafka::bindings::RD_KAFKA_EVENT_DR {
                        let n = rdkafka::bindings::rd_kafka_event_message_count(ev);
                        msgs.clear();
                        msgs.reserve(n);
                        let got = rdkafka::bindings::rd_kafka_event_message_array(ev, msgs.as_mut_ptr(), n);
                        msgs.set_len(got.min(n));
                        for &m in &msgs {
                            let m = &*m;
                            if m.err != rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                                failed.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            black_box((m.partition, m.offset, rdkafka::bindings::rd_kafka_message_latency(m)));
                            let id = (m._private as u64).wrapping_sub(1);
                            let k = acked.entry(id).or_insert(0);
                            *k += 1;
                            if *k == size {
                                acked.remove(&id);
                                let _ = done_tx.send(id);
                            }
                        }
                    }
                    rdkafka::bindings::rd_kafka_event_destroy(ev);
                }
            }
            // SAFETY: the reference taken above.
            unsafe { rdkafka::bindings::rd_kafka_queue_destroy(q) };
        })
    });
    let halves = if api_batch { 2 } else { 1 };
    let mut value = vec![b'x'; bytes];
    let key_names: Vec<String> = (0..keys).map(|k| format!("lg-{k}")).collect();
    let ctopic = std::ffi::CString::new(topic.as_str()).unwrap_or_default();
    // SAFETY: a topic handle of the producer's client, released before it.
    let rkt = unsafe {
        rdkafka::bindings::rd_kafka_topic_new(
            p.client().native_ptr(),
            ctopic.as_ptr(),
            std::ptr::null_mut(),
        )
    };
    let send_batch = |id: u64, value: &mut Vec<u8>| {
        value[..8].copy_from_slice(&id.to_le_bytes());
        let mut by_part: Vec<Vec<rdkafka::bindings::rd_kafka_message_t>> =
            (0..parts).map(|_| Vec::new()).collect();
        for i in 0..size {
            let key = &key_names
                [((id.wrapping_mul(u64::from(size)) + u64::from(i)) % u64::from(keys)) as usize];
            let part = pollbox_core::log::home_partition(key.as_bytes(), parts as u32);
            // SAFETY: a plain C struct; zeroed is its empty value.
            let mut m: rdkafka::bindings::rd_kafka_message_t = unsafe { std::mem::zeroed() };
            m.payload = value.as_ptr() as *mut _;
            m.len = value.len();
            m.key = key.as_ptr() as *mut _;
            m.key_len = key.len();
            m._private = id.wrapping_add(1) as usize as *mut _;
            by_part[part as usize].push(m);
        }
        for (part, ms) in by_part.iter_mut().enumerate() {
            let mut at = 0;
            while at < ms.len() {
                // SAFETY: the messages point at key and value, copied
                // (RD_KAFKA_MSG_F_COPY) before it returns.
                let n = unsafe {
                    rdkafka::bindings::rd_kafka_produce_batch(
                        rkt,
                        part as i32,
                        rdkafka::bindings::RD_KAFKA_MSG_F_COPY,
                        ms[at..].as_mut_ptr(),
                        (ms.len() - at) as i32,
                    )
                };
                at += n.max(0) as usize;
                if at < ms.len() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    };
    let send = |id: u64, i: u32, value: &mut Vec<u8>| {
        value[..8].copy_from_slice(&id.to_le_bytes());
        let key = &key_names
            [((id.wrapping_mul(u64::from(size)) + u64::from(i)) % u64::from(keys)) as usize];
        // A ticket's bytes, as pollbox's records carried one.
        let ticket = [0u8; 30];
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: "pollbox-ticket",
            value: Some(&ticket[..]),
        });
        let mut rec: BaseRecord<'_, str, [u8], usize> = BaseRecord::with_opaque_to(&topic, 0)
            .key(key.as_str())
            .payload(&value[..])
            .headers(headers);
        loop {
            match p.send(rec) {
                Ok(()) => return,
                Err((_, back)) => {
                    rec = back;
                    p.poll(Duration::from_millis(1));
                }
            }
        }
    };
    let send_one = |id: u64, value: &mut Vec<u8>| {
        if api_batch {
            send_batch(id, value);
        } else {
            for i in 0..size {
                send(id, i, value);
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !warm.load(Ordering::Acquire) {
        if Instant::now() > deadline {
            die("batch: the consumer saw no warm-up record in 30 s");
        }
        send(WARMUP, 0, &mut value);
        if !api_batch {
            p.poll(Duration::from_millis(200));
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // The client's whole CPU (producer, consumer and their threads) over
    // the measured batches.
    let (u0, s0) = cpu_s();
    let start = Instant::now();
    let (mut id, mut out, mut done) = (0u64, 0u32, 0u64);
    // Batches in flight: when sent, and halves (read, acknowledged) done.
    let mut flying: HashMap<u64, (u64, u32)> = HashMap::new();
    let mut lat = Vec::new();
    while start.elapsed().as_secs_f64() < seconds {
        while out < inflight {
            flying.insert(id, (base.elapsed().as_nanos() as u64, 0));
            send_one(id, &mut value);
            id += 1;
            out += 1;
        }
        if !api_batch {
            p.poll(Duration::ZERO);
        }
        let mut first = done_rx.recv_timeout(Duration::from_millis(1)).ok();
        while let Some(done_id) = first.take().or_else(|| done_rx.try_recv().ok()) {
            let Some(f) = flying.get_mut(&done_id) else {
                continue;
            };
            f.1 += 1;
            if f.1 == halves {
                let now = base.elapsed().as_nanos() as u64;
                lat.push(now.saturating_sub(f.0) as f64 / 1e3);
                flying.remove(&done_id);
                out -= 1;
                done += 1;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (u1, s1) = cpu_s();
    stop.store(true, Ordering::Release);
    let _ = reader.join();
    if let Some(h) = acker {
        let _ = h.join();
    }
    // SAFETY: the handle from rd_kafka_topic_new, released once, before
    // its client.
    unsafe { rdkafka::bindings::rd_kafka_topic_destroy(rkt) };
    let records = done * u64::from(size);
    println!(
        "{{\"cmd\":\"batch\",\"api\":\"{}\",\"batch\":{size},\"inflight\":{inflight},\"bytes\":{bytes},\"wall_s\":{wall:.3},\"records\":{records},\"records_per_s\":{:.0},\"failed\":{},\"cpu_us_per_record\":{:.3},{}}}",
        if api_batch { "batch" } else { "record" },
        records as f64 / wall,
        failed.load(Ordering::Relaxed),
        (u1 - u0 + s1 - s0) * 1e6 / records.max(1) as f64,
        summary(lat)
    );
}
