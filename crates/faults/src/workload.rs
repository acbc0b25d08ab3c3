//! The workload: clients of the cluster whose every outcome goes into the
//! history.
//!
//! - **writers** ingest `{"value":<unique>,"player":"w<id>"}` into random
//!   keys with `POST /v1/boxes/{key}`, and one request in four is a batch
//!   (`POST /v1/ingest`, an array of 2 to 4 messages into distinct keys, the
//!   key in each message's `key`), two writers through each node and two
//!   through HAProxy; each answer is classified (see [`classify`]; a batch's
//!   messages by [`classify_batch`]);
//! - **pollers**, on each node: plain polls of random keys, and long-polls
//!   (`?after=V&wait_ms=500`) carrying the last version seen;
//! - **streams**, on each node: an event stream of one key, reopened with
//!   `Last-Event-ID` when it breaks;
//! - **movers**: a long-poll client that asks the other node at each
//!   request, carrying `after`, and a stream client that moves to the other
//!   node every two seconds, carrying `Last-Event-ID`. Once faults have
//!   stopped and the nodes caught up, they keep going until neither node has
//!   anything newer for them, and the checker wants them at the final state.
//!
//! Values come from one counter shared with the foreign producer, so a
//! value names one message in the whole run.

use crate::cluster::node::Runs;
use crate::history::{Event, Outcome, ReadMode, Recorder};
use crate::http::{Client, EventStream, Failure, Response};
use crate::rng::Rng;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the workload's clients (and the foreign producer) share.
pub struct Shared {
    pub keys: Vec<String>,
    seq: AtomicI64,
    sessions: AtomicU64,
    stop: AtomicBool,
    finish: AtomicBool,
}

impl Shared {
    pub fn new(keys: usize) -> Shared {
        Shared {
            keys: balanced_keys(keys),
            seq: AtomicI64::new(0),
            sessions: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            finish: AtomicBool::new(false),
        }
    }

    /// A value no other message of the run carries.
    pub fn next_value(&self) -> i64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn new_session(&self) -> u64 {
        self.sessions.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn finishing(&self) -> bool {
        self.finish.load(Ordering::Relaxed)
    }
}

/// `n` keys spread evenly over the topic's partitions (by their home
/// partition), so that every partition, and every fault of its leader, meets
/// the workload; consecutive keys have different homes.
pub fn balanced_keys(n: usize) -> Vec<String> {
    let p = crate::cluster::PARTITIONS as usize;
    let mut by_home: Vec<Vec<String>> = vec![Vec::new(); p];
    let mut i = 0;
    while by_home.iter().map(Vec::len).sum::<usize>() < n {
        let k = format!("k{i}");
        let h = crate::partition::home(&k, p as i32) as usize;
        if by_home[h].len() < n.div_ceil(p) {
            by_home[h].push(k);
        }
        i += 1;
    }
    let mut keys = Vec::with_capacity(n);
    let mut round = 0;
    while keys.len() < n {
        for bucket in &by_home {
            if let Some(k) = bucket.get(round) {
                if keys.len() < n {
                    keys.push(k.clone());
                }
            }
        }
        round += 1;
    }
    keys
}

/// Where a client sends its requests.
#[derive(Clone)]
pub struct Target {
    /// `a`, `b`, or `lb`.
    pub name: String,
    pub addr: SocketAddr,
    /// The node's run counter (none for HAProxy).
    pub runs: Option<Runs>,
}

impl Target {
    pub fn run_now(&self) -> u32 {
        self.runs.as_ref().map_or(1, Runs::read)
    }
    pub fn served(&self, before: u32) -> Option<u32> {
        self.runs
            .as_ref()
            .and_then(|r| Runs::served(before, r.read()))
    }
}

/// What an ingest's answer (or failure) says about its message.
pub fn classify(r: &Result<Response, Failure>) -> (Outcome, Option<u16>, Option<String>) {
    match r {
        Ok(resp) if (200..300).contains(&resp.status) => (Outcome::Ok, Some(resp.status), None),
        Ok(resp) => {
            let text = resp.text();
            let outcome = if (400..500).contains(&resp.status)
                // HAProxy could not connect to any node: nothing was sent.
                || (resp.status == 503 && text.contains("No server is available"))
            {
                Outcome::Refused
            } else {
                // 503 "log unavailable" (it may be in the log), a proxy's
                // 502/504 (the node may have acted on it).
                Outcome::Indeterminate
            };
            let short: String = text.chars().take(120).collect();
            (outcome, Some(resp.status), Some(short))
        }
        // Nothing, or not all of the request, reached the server.
        Err(e @ (Failure::Connect(_) | Failure::Send(_))) => {
            (Outcome::Refused, None, Some(e.to_string()))
        }
        Err(e @ Failure::Receive(_)) => (Outcome::Indeterminate, None, Some(e.to_string())),
    }
}

/// The running workload.
pub struct Workload {
    shared: Arc<Shared>,
    clients: Vec<JoinHandle<()>>,
    movers: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Start every client: `nodes` (a and b) directly, `lb` through HAProxy.
    pub fn start(
        shared: Arc<Shared>,
        rec: &Recorder,
        nodes: &[Target],
        lb: &Target,
        seed: u64,
    ) -> Workload {
        let mut clients = Vec::new();
        let mut id = 0u64;
        for t in nodes.iter().chain(std::iter::once(lb)) {
            for _ in 0..2 {
                let (sh, rec, t) = (shared.clone(), rec.clone(), t.clone());
                let s = seed ^ (id << 32);
                let name = format!("w{id}");
                clients.push(spawn(&name.clone(), move || {
                    writer(&sh, &rec, &name, &t, s)
                }));
                id += 1;
            }
        }
        for (i, t) in nodes.iter().enumerate() {
            let (sh, r, tt) = (shared.clone(), rec.clone(), t.clone());
            let name = format!("p-{}0", t.name);
            let s = seed ^ (0x100 + i as u64);
            clients.push(spawn(&name.clone(), move || {
                poller(&sh, &r, &name, &tt, s, false)
            }));
            let (sh, r, tt) = (shared.clone(), rec.clone(), t.clone());
            let name = format!("p-{}1", t.name);
            let s = seed ^ (0x200 + i as u64);
            clients.push(spawn(&name.clone(), move || {
                poller(&sh, &r, &name, &tt, s, true)
            }));
            let (sh, r, tt) = (shared.clone(), rec.clone(), t.clone());
            let name = format!("s-{}0", t.name);
            let key = shared.keys[2 + i % (shared.keys.len() - 2)].clone();
            clients.push(spawn(&name.clone(), move || {
                stream(&sh, &r, &name, &tt, &key)
            }));
        }
        let mut movers = Vec::new();
        {
            let (sh, r, ns) = (shared.clone(), rec.clone(), nodes.to_vec());
            let key = shared.keys[0].clone();
            movers.push(spawn("m0", move || {
                long_poll_mover(&sh, &r, "m0", &ns, &key)
            }));
            let (sh, r, ns) = (shared.clone(), rec.clone(), nodes.to_vec());
            let key = shared.keys[1].clone();
            movers.push(spawn("m1", move || stream_mover(&sh, &r, "m1", &ns, &key)));
        }
        Workload {
            shared,
            clients,
            movers,
        }
    }

    /// Stop the writers, pollers and streams (movers go on).
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for h in self.clients.drain(..) {
            let name = h.thread().name().unwrap_or("?").to_string();
            if h.join().is_err() {
                eprintln!("pollbox-faults: workload client {name} panicked");
            }
        }
    }

    /// Tell the movers to catch up and end; wait for them.
    pub fn finish(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.finish.store(true, Ordering::Relaxed);
        for h in self.movers.drain(..) {
            let name = h.thread().name().unwrap_or("?").to_string();
            if h.join().is_err() {
                eprintln!("pollbox-faults: workload client {name} panicked");
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop();
        self.finish();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .expect("a workload thread")
}

/// What a batch's answer (or failure) says about each of its `n` messages:
/// a 200 acknowledges every message but those its `errors` list (refused
/// by the apply once in the log, or before it: either way not known to be
/// out of the log, so indeterminate); anything else says of each what
/// [`classify`] says of a single message.
pub fn classify_batch(
    r: &Result<Response, Failure>,
    n: usize,
) -> Vec<(Outcome, Option<u16>, Option<String>)> {
    let one = classify(r);
    let Ok(resp) = r else {
        return vec![one; n];
    };
    if one.0 != Outcome::Ok {
        return vec![one; n];
    }
    let text = resp.text();
    let listed: Vec<usize> = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v["errors"].as_array().map(|errors| {
                errors
                    .iter()
                    .filter_map(|e| e["i"].as_u64().map(|i| i as usize))
                    .collect()
            })
        })
        .unwrap_or_default();
    (0..n)
        .map(|i| {
            if listed.contains(&i) {
                let short: String = text.chars().take(120).collect();
                (Outcome::Indeterminate, Some(resp.status), Some(short))
            } else {
                one.clone()
            }
        })
        .collect()
}

/// One batch of 2 to 4 messages into distinct keys through `t`, each
/// message recorded as an ingest (with no payload: a batch's answer holds
/// counts, not boxes). Returns whether every message was acknowledged.
fn write_batch(
    sh: &Shared,
    rec: &Recorder,
    process: &str,
    t: &Target,
    rng: &mut Rng,
    cl: &mut Client,
) -> bool {
    let n = 2 + rng.below(3);
    let mut keys: Vec<&String> = Vec::with_capacity(n);
    while keys.len() < n.min(sh.keys.len()) {
        let k = &sh.keys[rng.below(sh.keys.len())];
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let values: Vec<i64> = keys.iter().map(|_| sh.next_value()).collect();
    let items: Vec<String> = keys
        .iter()
        .zip(&values)
        .map(|(k, v)| format!(r#"{{"key":"{k}","value":{v},"player":"{process}"}}"#))
        .collect();
    let body = format!("[{}]", items.join(","));
    let before = t.run_now();
    let t0 = rec.now();
    let r = cl.request(
        "POST",
        "/v1/ingest",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
        Duration::from_secs(12),
    );
    let run = t.served(before);
    let outcomes = classify_batch(&r, keys.len());
    let all_ok = outcomes.iter().all(|o| o.0 == Outcome::Ok);
    for ((key, value), (outcome, status, error)) in keys.iter().zip(values).zip(outcomes) {
        rec.record(
            t0,
            process,
            Event::Ingest {
                via: t.name.clone(),
                run,
                key: (*key).clone(),
                value,
                player: process.to_string(),
                outcome,
                status,
                payload: None,
                error,
            },
        );
    }
    all_ok
}

fn writer(sh: &Shared, rec: &Recorder, process: &str, t: &Target, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut cl = Client::new(t.addr);
    while !sh.stopping() {
        if rng.below(4) == 0 {
            let ok = write_batch(sh, rec, process, t, &mut rng, &mut cl);
            std::thread::sleep(Duration::from_millis(if ok { 15 } else { 150 }));
            continue;
        }
        let key = &sh.keys[rng.below(sh.keys.len())];
        let value = sh.next_value();
        let body = format!(r#"{{"value":{value},"player":"{process}"}}"#);
        let before = t.run_now();
        let t0 = rec.now();
        let r = cl.request(
            "POST",
            &format!("/v1/boxes/{key}"),
            &[("Content-Type", "application/json")],
            body.as_bytes(),
            Duration::from_secs(12),
        );
        let run = t.served(before);
        let (outcome, status, error) = classify(&r);
        let payload = match (&r, outcome) {
            (Ok(resp), Outcome::Ok) => Some(resp.text()),
            _ => None,
        };
        rec.record(
            t0,
            process,
            Event::Ingest {
                via: t.name.clone(),
                run,
                key: key.clone(),
                value,
                player: process.to_string(),
                outcome,
                status,
                payload,
                error,
            },
        );
        std::thread::sleep(Duration::from_millis(if outcome == Outcome::Ok {
            15
        } else {
            150
        }));
    }
}

/// The version an answer names: its ETag, unquoted.
fn etag_version(resp: &Response) -> Option<u64> {
    resp.header("etag")?.trim().trim_matches('"').parse().ok()
}

/// Who reads, and from where: what every read of one client's session is
/// recorded with.
#[derive(Clone, Copy)]
struct Reader<'a> {
    rec: &'a Recorder,
    process: &'a str,
    t: &'a Target,
    session: u64,
    /// A client that moves between nodes (its 404s are not recorded).
    mover: bool,
}

/// One read by a [`Reader`]: what it asked for.
struct Read<'a> {
    by: Reader<'a>,
    mode: ReadMode,
    key: &'a str,
    after: Option<u64>,
}

impl Read<'_> {
    fn record(&self, t0: u64, run: Option<u32>, ver: u64, payload: Option<String>) {
        let by = &self.by;
        by.rec.record(
            t0,
            by.process,
            Event::Read {
                via: by.t.name.clone(),
                run,
                session: by.session,
                mover: by.mover,
                mode: self.mode,
                key: self.key.to_string(),
                after: self.after,
                ver,
                payload,
            },
        );
    }
}

/// One poll or long-poll, recorded if it answered 200 or 404. Returns the
/// status.
fn poll_once(
    rd: Reader<'_>,
    cl: &mut Client,
    key: &str,
    after: Option<u64>,
    wait_ms: u64,
) -> Option<(u16, u64)> {
    let (path, mode) = match after {
        Some(a) => (
            format!("/v1/boxes/{key}?after={a}&wait_ms={wait_ms}"),
            ReadMode::LongPoll,
        ),
        None => (format!("/v1/boxes/{key}"), ReadMode::Poll),
    };
    let before = rd.t.run_now();
    let t0 = rd.rec.now();
    let r = cl.request(
        "GET",
        &path,
        &[],
        b"",
        Duration::from_millis(wait_ms + 5_000),
    );
    let run = rd.t.served(before);
    let read = Read {
        by: rd,
        mode,
        key,
        after,
    };
    match r {
        Ok(resp) if resp.status == 200 => {
            let ver = etag_version(&resp).unwrap_or(0);
            read.record(t0, run, ver, Some(resp.text()));
            Some((200, ver))
        }
        Ok(resp) if resp.status == 404 => {
            // A node that is catching up may not hold the box yet; a client
            // moving between nodes takes that as "nothing newer" (a node's
            // own clients would see it go backwards within a run, so they
            // record it).
            if !rd.mover {
                read.record(t0, run, 0, None);
            }
            Some((404, 0))
        }
        Ok(resp) => Some((resp.status, 0)),
        Err(_) => None,
    }
}

fn poller(sh: &Shared, rec: &Recorder, process: &str, t: &Target, seed: u64, long: bool) {
    let mut rng = Rng::new(seed);
    let mut cl = Client::new(t.addr);
    let mut opened = 0;
    let mut session = 0;
    let mut seen: HashMap<String, u64> = HashMap::new();
    while !sh.stopping() {
        let key = sh.keys[rng.below(sh.keys.len())].clone();
        let after = long.then(|| seen.get(&key).copied().unwrap_or(0));
        // A new connection is a new session: versions may go back across
        // connections when the node restarted from an older snapshot.
        if cl.connect_now().is_ok() && cl.opened != opened {
            opened = cl.opened;
            session = sh.new_session();
        }
        let rd = Reader {
            rec,
            process,
            t,
            session,
            mover: false,
        };
        let r = poll_once(rd, &mut cl, &key, after, 500);
        match r {
            Some((200, ver)) => {
                seen.insert(key, ver);
                if !long {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            Some(_) => std::thread::sleep(Duration::from_millis(10)),
            None => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn stream(sh: &Shared, rec: &Recorder, process: &str, t: &Target, key: &str) {
    let mut last: Option<u64> = None;
    while !sh.stopping() {
        let rd = Reader {
            rec,
            process,
            t,
            session: sh.new_session(),
            mover: false,
        };
        if read_stream(rd, key, &mut last, || sh.stopping(), None).is_err() {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Read one connection of an event stream until `done()` or, with `idle`,
/// until nothing came for that long; each event recorded. `last` carries
/// `Last-Event-ID` in and out.
fn read_stream(
    rd: Reader<'_>,
    key: &str,
    last: &mut Option<u64>,
    done: impl Fn() -> bool,
    idle: Option<Duration>,
) -> Result<(), Failure> {
    let before = rd.t.run_now();
    let t0 = rd.rec.now();
    let mut es = match EventStream::open(
        rd.t.addr,
        &format!("/v1/boxes/{key}"),
        *last,
        Duration::from_secs(5),
    )? {
        Ok(es) => es,
        Err(resp) => return Err(Failure::Receive(format!("status {}", resp.status))),
    };
    let after = *last;
    let mut quiet_since = Instant::now();
    while !done() {
        if idle.is_some_and(|d| quiet_since.elapsed() >= d) {
            return Ok(());
        }
        let Some(ev) = es.next(Duration::from_millis(300))? else {
            continue;
        };
        quiet_since = Instant::now();
        if ev.name.as_deref().is_some_and(|n| n != "message") {
            continue;
        }
        let Some(ver) = ev.id.as_deref().and_then(|i| i.trim().parse::<u64>().ok()) else {
            continue;
        };
        let run = rd.t.served(before);
        Read {
            by: rd,
            mode: ReadMode::Stream,
            key,
            after,
        }
        .record(t0, run, ver, Some(ev.data));
        *last = Some(ver);
    }
    Ok(())
}

fn long_poll_mover(sh: &Shared, rec: &Recorder, process: &str, nodes: &[Target], key: &str) {
    let session = sh.new_session();
    let mut clients: Vec<Client> = nodes.iter().map(|t| Client::new(t.addr)).collect();
    let mut after = 0u64;
    let mut i = 0;
    let mut quiet = 0; // consecutive 304s once finishing
    let mut finish_deadline = None;
    loop {
        if sh.finishing() {
            let d =
                *finish_deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(30));
            if quiet >= nodes.len() {
                return;
            }
            if Instant::now() > d {
                eprintln!("pollbox-faults: {process}: the nodes still answer after 30 s");
                return;
            }
        }
        let t = &nodes[i % nodes.len()];
        let rd = Reader {
            rec,
            process,
            t,
            session,
            mover: true,
        };
        let r = poll_once(rd, &mut clients[i % nodes.len()], key, Some(after), 1_000);
        match r {
            Some((200, ver)) => {
                after = after.max(ver);
                quiet = 0;
            }
            Some((304, _)) => quiet += 1,
            other => {
                if sh.finishing() {
                    eprintln!("pollbox-faults: {process}: {} answered {other:?}", t.name);
                }
                quiet = 0;
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        i += 1;
    }
}

fn stream_mover(sh: &Shared, rec: &Recorder, process: &str, nodes: &[Target], key: &str) {
    let session = sh.new_session();
    let mut last: Option<u64> = None;
    let mut i = 0;
    while !sh.finishing() {
        let t = &nodes[i % nodes.len()];
        let until = Instant::now() + Duration::from_secs(2);
        let rd = Reader {
            rec,
            process,
            t,
            session,
            mover: true,
        };
        let r = read_stream(
            rd,
            key,
            &mut last,
            || Instant::now() >= until || sh.finishing(),
            None,
        );
        if r.is_err() {
            std::thread::sleep(Duration::from_millis(200));
        }
        i += 1;
    }
    // Faults are over and the nodes caught up: one more visit to each node,
    // until it has nothing newer for two seconds.
    for t in nodes {
        for _ in 0..3 {
            let rd = Reader {
                rec,
                process,
                t,
                session,
                mover: true,
            };
            let r = read_stream(rd, key, &mut last, || false, Some(Duration::from_secs(2)));
            if r.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::PARTITIONS;
    use crate::partition::home;

    #[test]
    fn a_batchs_answer_acknowledges_what_it_does_not_list() {
        let answer = |status: u16, body: &str| {
            Ok(Response {
                status,
                headers: Vec::new(),
                body: body.as_bytes().to_vec(),
            })
        };
        let outcomes =
            |r| -> Vec<Outcome> { classify_batch(&r, 3).into_iter().map(|o| o.0).collect() };
        assert_eq!(
            outcomes(answer(200, r#"{"accepted":3,"rejected":0,"errors":[]}"#)),
            [Outcome::Ok; 3]
        );
        assert_eq!(
            outcomes(answer(
                200,
                r#"{"accepted":2,"rejected":1,"errors":[{"i":1,"error":"field sum: sum overflows"}]}"#
            )),
            [Outcome::Ok, Outcome::Indeterminate, Outcome::Ok]
        );
        assert_eq!(
            outcomes(answer(503, r#"{"error":"log unavailable"}"#)),
            [Outcome::Indeterminate; 3]
        );
        assert_eq!(
            outcomes(answer(400, r#"{"error":"bad"}"#)),
            [Outcome::Refused; 3]
        );
    }

    #[test]
    fn keys_cover_every_partition_evenly() {
        let keys = balanced_keys(12);
        assert_eq!(keys.len(), 12);
        let mut per = [0; PARTITIONS as usize];
        for k in &keys {
            per[home(k, PARTITIONS) as usize] += 1;
        }
        assert_eq!(per, [3; PARTITIONS as usize]);
        // The movers' keys (the first two) live in different partitions.
        assert_ne!(home(&keys[0], PARTITIONS), home(&keys[1], PARTITIONS));
    }
}
