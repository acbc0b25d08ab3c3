//! pollbox's `/metrics` render beside `prometheus-client`'s text encoder, on
//! the same content, and what a shared counter costs the workers
//! (benches/scrape/vs-prometheus-client.sh, docs/metrics-choice.md).
//!
//!     vs_prometheus_client scrape [LOAD_S] [ITERS] [REFERENCE]
//!     vs_prometheus_client callgrind [LOAD_S] [ITERS]
//!     vs_prometheus_client contention [INCREMENTS]
//!
//! `scrape` starts a two-worker server in this process, applies `pollbox load
//! --mix poll:50,ingest:50` for LOAD_S seconds, renders its exposition with
//! `pollbox_server::Server::render_metrics`, and builds a `prometheus-client`
//! Registry with the same families, label sets, series, buckets and values
//! (parsed from that render). Then ITERS scrapes of each, interleaved, timed
//! one by one (median, µs): pollbox's render (gathers everything: sums the
//! workers, jemalloc, /proc); prometheus-client's `encode` alone (its values
//! already in the registry's atomics); and `encode` after reading /proc and
//! jemalloc into the registry's gauges, as a deployment of it would at each
//! scrape. REFERENCE, a saved `/metrics` of the release binary, is compared
//! by series names and label names.
//!
//! `callgrind` does the same without timing, ITERS scrapes of each in
//! `cg_pollbox`, `cg_pc_encode`, `cg_pc_full` (toggled on one by one).
//!
//! `contention`: 1 and 2 threads each adding INCREMENTS to one shared
//! prometheus-client Counter, to one Counter each, and to a pollbox
//! per-worker counter each (`stats::Counter`: relaxed load and store); and the
//! same for a histogram observation. ns of thread CPU time per operation,
//! threads pinned to cores 0 and 1; of 7 runs, the one in which the threads
//! were most on CPU together (the machine may be busy with other work), with
//! that share.

use pollbox_core::config::Config;
use pollbox_load::{LoadArgs, Mix};
use pollbox_server::alloc_stats;
use pollbox_server::metrics::process_stats;
use pollbox_server::stats::{Counter as PbCounter, Histogram as PbHistogram, DURATION_BUCKETS};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeSet, HashMap};
use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// jemalloc, as the pollbox binary, with its allocations counted.
struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// SAFETY: every call is passed on to jemalloc unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { JEMALLOC.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { JEMALLOC.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { JEMALLOC.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { JEMALLOC.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

type Labels = Vec<(String, String)>;

/// One family of a parsed exposition.
struct Fam {
    name: String,
    help: String,
    kind: String,
    /// Sample lines: series name, labels, value text.
    samples: Vec<(String, Labels, String)>,
}

fn parse_labels(s: &str) -> Labels {
    if s.is_empty() {
        return Vec::new();
    }
    s.split("\",")
        .map(|kv| {
            let (k, v) = kv.split_once("=\"").expect("label=\"value\"");
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect()
}

/// A sample line: series name, labels, value.
fn parse_sample(line: &str) -> (String, Labels, String) {
    let (series, value) = line.rsplit_once(' ').expect("a value");
    match series.split_once('{') {
        Some((name, labels)) => (
            name.to_string(),
            parse_labels(labels.strip_suffix('}').expect("}")),
            value.to_string(),
        ),
        None => (series.to_string(), Vec::new(), value.to_string()),
    }
}

fn parse(text: &str) -> Vec<Fam> {
    let mut fams: Vec<Fam> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("help");
            fams.push(Fam {
                name: name.into(),
                help: help.into(),
                kind: String::new(),
                samples: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            fams.last_mut().expect("family").kind = rest.split_once(' ').expect("type").1.into();
        } else if !line.is_empty() && !line.starts_with('#') {
            fams.last_mut()
                .expect("family")
                .samples
                .push(parse_sample(line));
        }
    }
    fams
}

/// Series (name and label names, `le` kept as a name only) of an exposition,
/// and its sample count.
fn shape(text: &str) -> (BTreeSet<String>, usize) {
    let mut set = BTreeSet::new();
    let mut n = 0;
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        n += 1;
        let (name, labels, _) = parse_sample(line);
        let labels: Vec<String> = labels
            .into_iter()
            .map(|(k, v)| if k == "le" { k } else { format!("{k}={v}") })
            .collect();
        set.insert(format!("{name}{{{}}}", labels.join(",")));
    }
    (set, n)
}

fn is_int(v: &str) -> bool {
    v.bytes().all(|b| b.is_ascii_digit())
}

/// The gauges and counters a prometheus-client deployment would set from
/// /proc and jemalloc at each scrape.
#[derive(Default)]
struct Gathered {
    ints: HashMap<String, Gauge>,
    floats: HashMap<String, Gauge<f64, AtomicU64>>,
    cpu: Option<Counter<f64, AtomicU64>>,
    cpu_last: f64,
}

/// A Registry holding `fams`, with their values.
fn registry(fams: &[Fam]) -> (Registry, Gathered) {
    let mut reg = Registry::default();
    let mut g = Gathered::default();
    for f in fams {
        let help = f.help.strip_suffix('.').unwrap_or(&f.help);
        let labelled = f.samples.iter().any(|s| !s.1.is_empty());
        let ints = f.samples.iter().all(|s| is_int(&s.2));
        match (f.kind.as_str(), labelled, ints) {
            ("counter", _, _) => {
                let name = f.name.strip_suffix("_total").expect("_total");
                match (labelled, ints) {
                    (false, true) => {
                        let c: Counter = Counter::default();
                        c.inc_by(f.samples[0].2.parse().expect("u64"));
                        reg.register(name, help, c);
                    }
                    (false, false) => {
                        let c: Counter<f64, AtomicU64> = Counter::default();
                        c.inc_by(f.samples[0].2.parse().expect("f64"));
                        if f.name == "process_cpu_seconds_total" {
                            g.cpu = Some(c.clone());
                        }
                        reg.register(name, help, c);
                    }
                    (true, true) => {
                        let fam = Family::<Labels, Counter>::default();
                        for (_, l, v) in &f.samples {
                            fam.get_or_create(l).inc_by(v.parse().expect("u64"));
                        }
                        reg.register(name, help, fam);
                    }
                    (true, false) => unreachable!("no labelled float counter"),
                }
            }
            ("gauge", false, true) => {
                let c: Gauge = Gauge::default();
                c.set(f.samples[0].2.parse().expect("i64"));
                g.ints.insert(f.name.clone(), c.clone());
                reg.register(&f.name, help, c);
            }
            ("gauge", false, false) => {
                let c: Gauge<f64, AtomicU64> = Gauge::default();
                c.set(f.samples[0].2.parse().expect("f64"));
                g.floats.insert(f.name.clone(), c.clone());
                reg.register(&f.name, help, c);
            }
            ("gauge", true, true) => {
                let fam = Family::<Labels, Gauge>::default();
                for (_, l, v) in &f.samples {
                    fam.get_or_create(l).set(v.parse().expect("i64"));
                }
                reg.register(&f.name, help, fam);
            }
            ("gauge", true, false) => {
                let fam = Family::<Labels, Gauge<f64, AtomicU64>>::default();
                for (_, l, v) in &f.samples {
                    fam.get_or_create(l).set(v.parse().expect("f64"));
                }
                reg.register(&f.name, help, fam);
            }
            ("histogram", _, _) => {
                // Cumulative buckets back to counts; each observed at its
                // bound (+Inf at twice the last), so the _sum differs.
                let mut bounds = Vec::new();
                let mut cum = Vec::new();
                for (n, l, v) in &f.samples {
                    if n.ends_with("_bucket") {
                        let le = &l[0].1;
                        if le != "+Inf" {
                            bounds.push(le.parse::<f64>().expect("le"));
                        }
                        cum.push(v.parse::<u64>().expect("count"));
                    }
                }
                let h = Histogram::new(bounds.iter().copied());
                let mut prev = 0;
                for (i, &c) in cum.iter().enumerate() {
                    let at = bounds
                        .get(i)
                        .copied()
                        .unwrap_or(bounds[bounds.len() - 1] * 2.0);
                    for _ in prev..c {
                        h.observe(at);
                    }
                    prev = c;
                }
                reg.register(&f.name, help, h);
            }
            (k, _, _) => panic!("type {k}"),
        }
    }
    (reg, g)
}

/// What a prometheus-client scrape reads besides its atomics: /proc and
/// jemalloc, as pollbox's render does, into the registry's gauges.
fn gather(g: &mut Gathered) {
    let p = process_stats();
    let j = alloc_stats::read_global();
    let ints: [(&str, u64); 12] = [
        ("process_resident_memory_bytes", p.rss),
        ("pollbox_process_resident_file_bytes", p.rss_file),
        ("process_open_fds", p.open_fds),
        ("pollbox_jemalloc_allocated_bytes", j.allocated),
        ("pollbox_jemalloc_active_bytes", j.active),
        ("pollbox_jemalloc_resident_bytes", j.resident),
        ("pollbox_jemalloc_mapped_bytes", j.mapped),
        ("pollbox_jemalloc_retained_bytes", j.retained),
        ("pollbox_jemalloc_metadata_bytes", j.metadata),
        ("pollbox_jemalloc_tcache_bytes", j.tcache),
        ("pollbox_jemalloc_dirty_bytes", j.dirty()),
        ("pollbox_jemalloc_fragmentation_bytes", j.fragmentation()),
    ];
    for (name, v) in ints {
        if let Some(c) = g.ints.get(name) {
            c.set(v as i64);
        }
    }
    if let Some(c) = g.floats.get("process_start_time_seconds") {
        c.set(p.start_time);
    }
    if let Some(c) = &g.cpu {
        c.inc_by((p.cpu_seconds - g.cpu_last).max(0.0));
        g.cpu_last = p.cpu_seconds;
    }
}

fn pc_encode(reg: &Registry, out: &mut String) {
    out.clear();
    encode(out, reg).expect("encode");
}

fn pc_full(reg: &Registry, g: &mut Gathered, out: &mut String) {
    gather(g);
    pc_encode(reg, out);
}

fn pb_render(server: &pollbox_server::Server, out: &mut Vec<u8>) {
    out.clear();
    server.render_metrics(out);
}

#[inline(never)]
fn cg_pollbox(server: &pollbox_server::Server, out: &mut Vec<u8>, n: usize) {
    for _ in 0..n {
        pb_render(server, out);
    }
}

#[inline(never)]
fn cg_pc_encode(reg: &Registry, out: &mut String, n: usize) {
    for _ in 0..n {
        pc_encode(reg, out);
    }
}

#[inline(never)]
fn cg_pc_full(reg: &Registry, g: &mut Gathered, out: &mut String, n: usize) {
    for _ in 0..n {
        pc_full(reg, g, out);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i)
        .map(|s| s.parse().unwrap_or_else(|_| panic!("not a number: {s}")))
        .unwrap_or(default)
}

fn loaded_server(load_s: f64) -> pollbox_server::Server {
    let mut c = Config::embedded();
    c.server.listen = "127.0.0.1:0".into();
    c.server.workers = 2;
    let server = pollbox_server::Server::start(c).expect("server starts");
    let mut load = LoadArgs::new(format!("http://{}", server.addr()));
    load.mix = Mix::parse("poll:50,ingest:50").expect("mix");
    load.duration = Duration::from_secs_f64(load_s);
    load.quiet = true;
    if let Err(e) = pollbox_load::run(&load) {
        eprintln!("load: {e} (the scrape goes on)");
    }
    // As the script's reference, which waited on /healthz for the server.
    let mut c = std::net::TcpStream::connect(server.addr()).expect("connect");
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .expect("write");
    c.read_to_end(&mut Vec::new()).expect("read");
    server
}

fn scrape(args: &[String], callgrind: bool) {
    let load_s: f64 = arg(args, 2, 3.0);
    let iters: usize = arg(args, 3, if callgrind { 20 } else { 3000 });
    let server = loaded_server(load_s);
    let mut pb = Vec::with_capacity(1 << 16);
    pb_render(&server, &mut pb);
    let text = String::from_utf8(pb.clone()).expect("UTF-8");
    let fams = parse(&text);
    let (reg, mut g) = registry(&fams);
    let mut pc = String::with_capacity(1 << 16);
    pc_full(&reg, &mut g, &mut pc);

    let (pb_set, pb_n) = shape(&text);
    let (pc_set, pc_n) = shape(&pc);
    println!(
        "families {}  series: pollbox {pb_n}, prometheus-client {pc_n}, same names and labels: {}",
        fams.len(),
        pb_set == pc_set
    );
    for s in pb_set.symmetric_difference(&pc_set) {
        println!("  differs: {s}");
    }
    if let Some(path) = args.get(4) {
        let reference = std::fs::read_to_string(path).expect("reference");
        let (r_set, r_n) = shape(&reference);
        println!(
            "reference {path}: series {r_n}, same names and labels as this render: {}",
            r_set == pb_set
        );
        for s in r_set.symmetric_difference(&pb_set) {
            println!("  differs: {s}");
        }
    }
    if std::env::var_os("DUMP").is_some() {
        std::fs::write("/tmp/vs-pc-pollbox.txt", &text).expect("write");
        std::fs::write("/tmp/vs-pc-prometheus-client.txt", &pc).expect("write");
    }

    if callgrind {
        cg_pollbox(&server, &mut pb, iters);
        cg_pc_encode(&reg, &mut pc, iters);
        cg_pc_full(&reg, &mut g, &mut pc, iters);
        println!("callgrind: {iters} scrapes each");
    } else {
        let (mut t_pb, mut t_enc, mut t_full) = (Vec::new(), Vec::new(), Vec::new());
        let (mut a_pb, mut a_enc, mut a_full) = (u64::MAX, u64::MAX, u64::MAX);
        for _ in 0..iters {
            let a = ALLOCS.load(Relaxed);
            let t = Instant::now();
            pb_render(&server, &mut pb);
            t_pb.push(t.elapsed().as_secs_f64() * 1e6);
            a_pb = a_pb.min(ALLOCS.load(Relaxed) - a);

            let a = ALLOCS.load(Relaxed);
            let t = Instant::now();
            pc_encode(&reg, &mut pc);
            t_enc.push(t.elapsed().as_secs_f64() * 1e6);
            a_enc = a_enc.min(ALLOCS.load(Relaxed) - a);

            let a = ALLOCS.load(Relaxed);
            let t = Instant::now();
            pc_full(&reg, &mut g, &mut pc);
            t_full.push(t.elapsed().as_secs_f64() * 1e6);
            a_full = a_full.min(ALLOCS.load(Relaxed) - a);
        }
        let pc_bytes = pc.len();
        pc_encode(&reg, &mut pc);
        let head = format!("per scrape (median of {iters})");
        println!("{head:<40} {:>8} {:>8} {:>8}", "µs", "bytes", "allocs");
        for (what, t, bytes, allocs) in [
            ("pollbox render (all gathered)", &mut t_pb, pb.len(), a_pb),
            ("prometheus-client encode", &mut t_enc, pc.len(), a_enc),
            (
                "prometheus-client /proc+jemalloc+encode",
                &mut t_full,
                pc_bytes,
                a_full,
            ),
        ] {
            println!("{what:<40} {:>8.2} {bytes:>8} {allocs:>8}", median(t));
        }
    }
    server.shutdown().expect("shutdown");
}

/// CPU time of the calling thread, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to one core.
fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// `threads` threads, pinned to cores 0.., each doing `n` of `f(thread)`:
/// ns of thread CPU time per operation (the slowest thread's), and the least
/// share of the wall time any thread was on its CPU (near 1: the threads ran
/// side by side throughout, so they did contend).
fn per_op(threads: usize, n: u64, f: impl Fn(usize, u64) + Sync) -> (f64, f64) {
    let barrier = Barrier::new(threads);
    let runs: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, f) = (&barrier, &f);
                s.spawn(move || {
                    pin(t);
                    barrier.wait();
                    let (wall, cpu) = (Instant::now(), thread_cpu_ns());
                    f(t, n);
                    (thread_cpu_ns() - cpu, wall.elapsed().as_nanos() as u64)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let ns = runs.iter().map(|r| r.0).max().expect("a thread") as f64 / n as f64;
    let share = runs
        .iter()
        .map(|r| r.0 as f64 / r.1 as f64)
        .fold(1.0, f64::min);
    (ns, share)
}

/// Of `runs` runs, the one whose threads were most on CPU together.
fn best_overlap(
    runs: usize,
    threads: usize,
    n: u64,
    f: &(dyn Fn(usize, u64) + Sync),
) -> (f64, f64) {
    (0..runs)
        .map(|_| per_op(threads, n, f))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a run")
}

/// A worker's own stats, as `WorkerStats` is: its own allocation, its own
/// cache lines.
#[repr(align(128))]
struct Own<T>(T);

fn contention(args: &[String]) {
    let n: u64 = arg(args, 2, 20_000_000);
    let runs = 7;
    println!(
        "{:<48} {:>9} {:>9} {:>8}",
        "ns of thread CPU per operation", "1 thread", "2 threads", "on CPU"
    );
    let shared: Counter = Counter::default();
    let family = Family::<Labels, Counter>::default();
    let per_worker: Vec<Counter> = (0..2)
        .map(|w| {
            family
                .get_or_create(&vec![("worker".into(), w.to_string())])
                .clone()
        })
        .collect();
    let ours: Vec<Arc<Own<PbCounter>>> = (0..2)
        .map(|_| Arc::new(Own(PbCounter::default())))
        .collect();
    let h_shared = Histogram::new(DURATION_BUCKETS);
    let h_ours: Vec<Arc<Own<PbHistogram<16>>>> = (0..2)
        .map(|_| Arc::new(Own(PbHistogram::new(&DURATION_BUCKETS))))
        .collect();
    type Case<'a> = (&'a str, u64, Box<dyn Fn(usize, u64) + Sync + 'a>);
    let cases: Vec<Case> = vec![
        (
            "prometheus-client Counter, one shared",
            n,
            Box::new(|_, n| {
                for _ in 0..n {
                    black_box(&shared).inc();
                }
            }),
        ),
        (
            "prometheus-client Counter, one per worker",
            n,
            Box::new(|t, n| {
                for _ in 0..n {
                    black_box(&per_worker[t]).inc();
                }
            }),
        ),
        (
            "pollbox stats::Counter, one per worker",
            n,
            Box::new(|t, n| {
                for _ in 0..n {
                    black_box(&ours[t].0).inc();
                }
            }),
        ),
        (
            "prometheus-client Histogram.observe, shared",
            n / 10,
            Box::new(|_, n| {
                for i in 0..n {
                    black_box(&h_shared).observe(((i & 1023) as f64) * 1e-6);
                }
            }),
        ),
        (
            "pollbox stats::Histogram.observe_ns, per worker",
            n / 10,
            Box::new(|t, n| {
                for i in 0..n {
                    black_box(&h_ours[t].0).observe_ns((i & 1023) * 1000);
                }
            }),
        ),
    ];
    for (what, n, f) in &cases {
        let one = best_overlap(runs, 1, *n, f.as_ref());
        let two = best_overlap(runs, 2, *n, f.as_ref());
        println!(
            "{what:<48} {:>9.2} {:>9.2} {:>7.0}%",
            one.0,
            two.0,
            two.1 * 100.0
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("scrape") => scrape(&args, false),
        Some("callgrind") => scrape(&args, true),
        Some("contention") => contention(&args),
        _ => {
            eprintln!("usage: vs_prometheus_client scrape|callgrind|contention [...]");
            std::process::exit(2);
        }
    }
}
