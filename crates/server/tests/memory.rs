//! Memory accounting against jemalloc, in-process with jemalloc as the global
//! allocator (as in the shipped binary).

mod common;
use common::*;
use pollbox_memcheck::{self as memcheck, Memory};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's figures are process-wide: the tests here run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn memory(s: &pollbox_server::Server) -> Memory {
    // jemalloc's figures move on at most once per MIN_EPOCH_INTERVAL (scrapes in
    // a loop must not stall the workers): wait one out so this scrape is fresh.
    std::thread::sleep(pollbox_server::alloc_stats::MIN_EPOCH_INTERVAL);
    let text = memcheck::scrape(&format!("http://{}", s.addr())).unwrap();
    Memory::from_metrics(&text).unwrap()
}

/// Create `batches` × 100 boxes `{prefix}-N` with batch ingests on `rd`.
fn create_boxes(rd: &mut Reader, prefix: &str, batches: usize) {
    for batch in 0..batches {
        let mut body = String::from("[");
        for i in 0..100 {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&format!(
                r#"{{"key":"{prefix}-{}","value":{i},"player":"p-{i}"}}"#,
                batch * 100 + i
            ));
        }
        body.push(']');
        rd.send(
            format!(
                "POST /v1/ingest HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        let r = rd.read(false);
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["accepted"], 100);
    }
}

fn boxes_accounted(s: &pollbox_server::Server) -> f64 {
    memory(s).boxes
}

#[test]
fn accounted_box_bytes_track_jemalloc_at_100k_boxes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = start(config());
    let a = s.addr();
    let before = memory(&s);
    let mut rd = Reader::new(connect(a));
    create_boxes(&mut rd, "box", 1000);
    assert_eq!(s.node().boxes.len(), 100_000);
    let after = memory(&s);
    let rise = after.allocated - before.allocated;
    let accounted = boxes_accounted(&s) - before.boxes;
    let ratio = accounted / rise;
    eprintln!(
        "jemalloc allocated rose {:.1} MiB; accounted boxes {:.1} MiB (ratio {ratio:.3})",
        rise / 1048576.0,
        accounted / 1048576.0
    );
    assert!((0.8..=1.2).contains(&ratio), "accounted/rise = {ratio:.3}");
    s.shutdown().unwrap();
}

#[test]
fn memory_outside_the_accounting_shows_in_memcheck() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = start(config());
    let a = s.addr();
    for i in 0..100 {
        assert_eq!(
            post(a, &format!("/v1/boxes/k{i}"), r#"{"value":1}"#).status,
            200
        );
    }
    let clean = memory(&s);
    // 64 MiB that pollbox knows nothing about, touched so it is resident.
    let leak = vec![7u8; 64 << 20];
    let m = memory(&s);
    let gap = m.allocated - m.accounted;
    assert!(gap >= 60.0 * 1048576.0, "gap {gap}: {m:?} clean {clean:?}");
    assert!(m.leaking());
    assert!(m.verdict().starts_with("VERDICT"), "{}", m.verdict());
    let table = memcheck::table(&m, true);
    assert!(table.contains("alloc-acct"), "{table}");
    eprintln!(
        "{table}  {}\n(before the leak:)\n{}  {}",
        m.verdict(),
        memcheck::table(&clean, false),
        clean.verdict()
    );
    assert!(std::hint::black_box(&leak)[12345] == 7);
    drop(leak);
    s.shutdown().unwrap();
}

fn boxes_gauge(s: &pollbox_server::Server) -> f64 {
    let text = memcheck::scrape(&format!("http://{}", s.addr())).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("pollbox_boxes ")?.parse().ok())
        .expect("pollbox_boxes")
}

/// docs/boxes.md#lifecycle: boxes past `ttl_s` are removed and the memory goes back: the
/// box count, the accounted `boxes` bytes and jemalloc's allocated bytes all
/// fall back to where they were before the boxes were created.
#[test]
fn expired_boxes_give_their_memory_back() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = config();
    c.boxes.ttl_s = 1;
    let s = start(c);
    let a = s.addr();
    let before = memory(&s);
    let mut rd = Reader::new(connect(a));
    create_boxes(&mut rd, "round", 500);
    let full = memory(&s);
    let full_boxes = boxes_gauge(&s);
    // The first boxes may already be gone; most are still there.
    assert!(full_boxes > 25_000.0, "{full_boxes}");
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while boxes_gauge(&s) > 0.0 {
        assert!(std::time::Instant::now() < give_up, "boxes never expired");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let after = memory(&s);
    let rise = full.in_use() - before.in_use();
    let fall = full.in_use() - after.in_use();
    eprintln!(
        "boxes {full_boxes} -> 0; accounted boxes {:.1} -> {:.1} -> {:.1} MiB; \
         jemalloc in use {:.1} -> {:.1} -> {:.1} MiB",
        before.boxes / 1048576.0,
        full.boxes / 1048576.0,
        after.boxes / 1048576.0,
        before.in_use() / 1048576.0,
        full.in_use() / 1048576.0,
        after.in_use() / 1048576.0,
    );
    assert_eq!(
        after.boxes, before.boxes,
        "every accounted box byte is back"
    );
    assert!(
        full.boxes > before.boxes + 4.0 * 1048576.0,
        "{}",
        full.boxes
    );
    assert!(rise > 4.0 * 1048576.0, "rise {rise}");
    assert!(fall > 0.8 * rise, "jemalloc: rose {rise}, fell {fall}");
    let text = memcheck::scrape(&format!("http://{}", a)).unwrap();
    assert!(
        text.contains("pollbox_boxes_expired_total 50000"),
        "{}",
        text.lines()
            .filter(|l| l.starts_with("pollbox_boxes"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    s.shutdown().unwrap();
}

#[test]
fn a_quiet_worker_gives_its_dirty_pages_back() {
    use pollbox_server::alloc_stats::{give_back_idle_memory, this_arena_dirty_pages};
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // What a burst of ingest leaves: many small objects freed at once, their
    // pages dirty (jemalloc keeps them for dirty_decay_ms).
    let held: Vec<Vec<u8>> = (0..40_000).map(|i| vec![i as u8; 100]).collect();
    drop(held);
    assert!(this_arena_dirty_pages() > 0, "freed pages are kept dirty");
    assert!(give_back_idle_memory(), "jemalloc took both controls");
    assert_eq!(
        this_arena_dirty_pages(),
        0,
        "this thread's arena gave them back"
    );
}
