//! One run of the suite, start to verdict: the cluster up, the workload and
//! the nemesis for the run's duration, every fault healed, the nodes caught
//! up, the final reads, the topic read back, a node started from nothing,
//! the checker. Everything lands in the run's folder:
//!
//! - `history.jsonl`: the history (written as it happens);
//! - `schedule.json`: the nemesis' schedule for the seed;
//! - `report.txt`: the figures and the checker's verdict, per property;
//! - `violations.jsonl`: each violation with the operations that show it;
//! - `cluster/`: the brokers' and nodes' logs and configs (the brokers'
//!   data is removed after a valid run).

use crate::checker::{self, Report, REPLAY_NODE};
use crate::cluster::net::Lan;
use crate::cluster::node::Node;
use crate::cluster::{Cluster, Layout, PARTITIONS, TOPIC};
use crate::history::{Event, ReadMode, Recorder};
use crate::http::Client;
use crate::nemesis::{self, Schedule};
use crate::presence::{self, Presence};
use crate::workload::{Shared, Target, Workload};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// How long the nemesis injects faults (the run takes longer: start,
    /// recovery, final reads, replay).
    pub duration: Duration,
    pub out: PathBuf,
    pub repo: PathBuf,
    pub pollbox: PathBuf,
    pub keys: usize,
}

const MARKER: &str = ".pollbox-faults";

fn say(what: &str) {
    eprintln!("pollbox-faults: {what}");
}

/// Run the suite; `Err` when the cluster could not be run (not a verdict).
pub fn run(opts: &Options) -> Result<Report, String> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let dir = opts.out.join("cluster");
    if dir.join(MARKER).exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    } else if dir.exists() {
        return Err(format!(
            "{} exists and is not a previous run's",
            dir.display()
        ));
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(MARKER), "").map_err(|e| e.to_string())?;
    let schedule = Schedule::generate(opts.seed, opts.duration);
    std::fs::write(
        opts.out.join("schedule.json"),
        serde_json::to_string_pretty(&schedule).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    let rec = Recorder::to_file(&opts.out.join("history.jsonl")).map_err(|e| e.to_string())?;
    let result = run_with(opts, &schedule, &rec, dir.clone());
    let _ = rec.flush();
    let phases = match result {
        Ok(p) => p,
        Err(e) => {
            say(&format!(
                "the run failed: {e}; history so far in {}",
                opts.out.join("history.jsonl").display()
            ));
            return Err(e);
        }
    };
    let report = checker::check(&rec.ops());
    let text = format!(
        "pollbox-faults --seed {} --duration {}\n{phases}total {:.0} s\n{report}\n",
        opts.seed,
        opts.duration.as_secs(),
        started.elapsed().as_secs_f64()
    );
    std::fs::write(opts.out.join("report.txt"), &text).map_err(|e| e.to_string())?;
    if let Ok(mut f) = std::fs::File::create(opts.out.join("violations.jsonl")) {
        let ops = rec.ops();
        for v in &report.violations {
            let shown: Vec<&crate::history::Op> =
                v.ops.iter().filter_map(|&i| ops.get(i)).collect();
            let line = serde_json::json!({
                "property": v.property.name(),
                "key": v.key,
                "what": v.what,
                "ops": shown,
            });
            let _ = writeln!(f, "{line}");
        }
    }
    if report.valid() {
        Cluster::remove_data(&dir);
    }
    Ok(report)
}

fn run_with(
    opts: &Options,
    schedule: &Schedule,
    rec: &Recorder,
    dir: PathBuf,
) -> Result<String, String> {
    let t = Instant::now();
    let mut cluster = Cluster::start(Layout {
        repo: opts.repo.clone(),
        pollbox: opts.pollbox.clone(),
        dir,
    })?;
    let mut phases = format!("cluster started in {:.0} s\n", t.elapsed().as_secs_f64());
    rec.note(
        "setup",
        Event::Topic {
            partitions: PARTITIONS,
        },
    );

    let shared = Arc::new(Shared::new(opts.keys));
    let (nodes, lb) = targets(&cluster)?;
    let mut workload = Workload::start(shared.clone(), rec, &nodes, &lb, opts.seed);
    let mut presence = Presence::start(rec, &nodes, opts.seed);
    say(&format!(
        "workload and nemesis for {} s (seed {})",
        opts.duration.as_secs(),
        opts.seed
    ));
    let t = Instant::now();
    let injected = nemesis::run(schedule, &cluster, rec, &shared, t + opts.duration);
    phases += &format!(
        "faults for {:.0} s ({injected} injected)\n",
        t.elapsed().as_secs_f64()
    );

    // Faults are over: heal what may be left, stop the writers, let what
    // the producers still hold be delivered or time out (5 s).
    let t = Instant::now();
    cluster.net.heal_all();
    workload.stop();
    say("workload stopped; recovering");
    recover(&cluster)?;
    if !presence.settle(Duration::from_secs(30)) {
        say("presence: some members did not reach their final state in 30 s");
    }
    say("cluster recovered; waiting for the producers' last records (6 s)");
    std::thread::sleep(Duration::from_secs(6));
    let (ends, finals) = read_at_the_end(&cluster, rec, &shared.keys)?;
    say("nodes a and b caught up and read; the moving clients finish");
    workload.finish();
    for (t0, process, ev) in finals {
        rec.record(t0, process, ev);
    }
    phases += &format!(
        "recovered and read in {:.0} s (log ends {ends:?})\n",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    read_topic(&cluster, rec)?;
    replay(&mut cluster, rec, &shared.keys, &ends)?;
    phases += &format!(
        "topic read and node {REPLAY_NODE} replayed it in {:.0} s\n",
        t.elapsed().as_secs_f64()
    );
    note_record_counts(&cluster, rec);

    let t = Instant::now();
    final_presence(&cluster, rec)?;
    presence.finish();
    phases += &format!(
        "presence: b paused, a cut off, read on a, b, c, then on a and c after b's kill -9, in {:.0} s\n",
        t.elapsed().as_secs_f64()
    );
    cluster.stop();
    Ok(phases)
}

/// The presence reads the checker judges: node b paused and node a cut off
/// from the brokers in turn, the brokers left alone (the readers judged by
/// presence-dead-expired); every room on every node (the one that replayed
/// from nothing included) once the cluster was quiet for two leases and
/// the grace (round 1); then node b killed with kill -9 for good, and every
/// room on a and c once two leases, the grace and 2 s passed (round 2: b's
/// members gone, a's there).
fn final_presence(cluster: &Cluster, rec: &Recorder) -> Result<(), String> {
    let quiet = Duration::from_millis(2 * presence::LEASE_MS + presence::LEAVE_GRACE_MS + 1_000);
    // With the brokers left alone (the nemesis' broker lane rarely is), a
    // node paused, then one cut off from the brokers, each for a lease and
    // 4 s: the readers of the other node see its members go (what
    // presence-dead-expired judges during the run).
    let silent = Duration::from_millis(presence::LEASE_MS + 4_000);
    let fault = |fault: &str, node: &str, phase: crate::history::Phase, t0: u64| {
        rec.record(
            t0,
            "nemesis",
            Event::Fault {
                fault: fault.into(),
                target: node.into(),
                phase,
                detail: None,
            },
        );
    };
    say("presence: node b paused, then node a cut off from the brokers, each for a lease and 4 s");
    let b = cluster.node("b");
    let t0 = rec.now();
    fault("quiet-pause-node", "b", crate::history::Phase::Start, t0);
    let paused = b.signal(libc::SIGSTOP);
    std::thread::sleep(silent);
    let _ = b.signal(libc::SIGCONT);
    fault("quiet-pause-node", "b", crate::history::Phase::End, t0);
    paused?;
    b.wait_ready(Duration::from_secs(60))?;
    // b's own view catches up (it saw itself expired and joined its
    // members anew) before its readers are judged again.
    std::thread::sleep(quiet);
    let a = cluster.node("a");
    let t0 = rec.now();
    fault("quiet-isolate-node", "a", crate::history::Phase::Start, t0);
    let cut = cluster.net.cut("a", Lan::Kafka);
    std::thread::sleep(silent);
    let _ = cluster.net.heal("a", Lan::Kafka);
    fault("quiet-isolate-node", "a", crate::history::Phase::End, t0);
    cut?;
    a.wait_ready(Duration::from_secs(60))?;
    say(&format!(
        "presence: quiet for {:.1} s, then read on every node",
        quiet.as_secs_f64()
    ));
    std::thread::sleep(quiet);
    let target = |n: &Node| Target {
        name: n.name.clone(),
        addr: n.addr,
        runs: Some(n.runs.clone()),
    };
    let read_all = |round: u32, names: &[&str]| -> Result<(), String> {
        for name in names {
            let t = target(cluster.node(name));
            let mut cl = Client::new(t.addr);
            for room in presence::ROOMS {
                presence::read_presence(rec, &mut cl, &t, room, Some(round))
                    .ok_or_else(|| format!("final presence read of {room} on {name}: no answer"))?;
            }
        }
        Ok(())
    };
    read_all(1, &["a", "b", REPLAY_NODE])?;
    say("presence: kill -9 of node b, for good");
    rec.note(
        "nemesis",
        Event::Fault {
            fault: "final-kill-node".into(),
            target: "b".into(),
            phase: crate::history::Phase::Start,
            detail: Some("not restarted: its members must go after the lease".into()),
        },
    );
    cluster.node("b").kill();
    std::thread::sleep(quiet + Duration::from_secs(1));
    read_all(2, &["a", REPLAY_NODE])
}

/// What the workload talks to: each node, and the load balancer.
fn targets(cluster: &Cluster) -> Result<(Vec<Target>, Target), String> {
    let nodes = nemesis::NODES
        .iter()
        .map(|n| {
            let node = cluster.node(n);
            Target {
                name: node.name.clone(),
                addr: node.addr,
                runs: Some(node.runs.clone()),
            }
        })
        .collect();
    let lb = Target {
        name: "lb".into(),
        addr: cluster
            .haproxy
            .as_ref()
            .map(|h| h.addr)
            .ok_or("no haproxy")?,
        runs: None,
    };
    Ok((nodes, lb))
}

/// Every broker and node running again (resumed, or restarted), the topic in
/// sync, the nodes ready.
fn recover(cluster: &Cluster) -> Result<(), String> {
    for (i, b) in cluster.brokers.list.iter().enumerate() {
        let _ = cluster.brokers.signal(i, libc::SIGCONT);
        if !cluster.brokers.running(i) {
            say(&format!("restarting {}", b.host));
            cluster.brokers.launch(&cluster.net, i)?;
            cluster.brokers.wait_started(i, Duration::from_secs(120))?;
        }
    }
    for n in &cluster.nodes {
        let _ = n.signal(libc::SIGCONT);
        if !n.running() {
            say(&format!("restarting node {}", n.name));
            n.start(&cluster.net)?;
        }
    }
    cluster
        .brokers
        .wait_in_sync(TOPIC, Duration::from_secs(120))?;
    for n in &cluster.nodes {
        n.wait_ready(Duration::from_secs(120))?;
    }
    Ok(())
}

/// The log's ends and every node's final reads, once the nodes caught up with
/// the log's end and it no longer moves (read again, up to three times, while
/// it does).
fn read_at_the_end(
    cluster: &Cluster,
    rec: &Recorder,
    keys: &[String],
) -> Result<(Vec<i64>, Vec<FinalRead>), String> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let ends = cluster.brokers.ends(TOPIC, PARTITIONS)?;
        for n in &cluster.nodes {
            n.wait_applied(&ends, Duration::from_secs(120))?;
        }
        let mut finals = Vec::new();
        for n in &cluster.nodes {
            finals.extend(final_reads(rec, n, keys)?);
        }
        let again = cluster.brokers.ends(TOPIC, PARTITIONS)?;
        if again == ends || attempt == 3 {
            return Ok((ends, finals));
        }
        say(&format!(
            "the log moved ({ends:?} -> {again:?}); reading again"
        ));
    }
}

/// The topic itself, from its start, into the history.
fn read_topic(cluster: &Cluster, rec: &Recorder) -> Result<(), String> {
    say("reading the topic back");
    let records = cluster.brokers.read_all(TOPIC, PARTITIONS)?;
    let t0 = rec.now();
    for r in records {
        rec.record(
            t0,
            "final",
            Event::Record {
                partition: r.partition,
                offset: r.offset,
                key: r.key,
                value: r.value,
            },
        );
    }
    Ok(())
}

/// A node from nothing replays it all, up to `ends`, and is read.
fn replay(
    cluster: &mut Cluster,
    rec: &Recorder,
    keys: &[String],
    ends: &[i64],
) -> Result<(), String> {
    say(&format!(
        "node {REPLAY_NODE} replays the topic from nothing"
    ));
    let node = cluster.start_replay_node()?;
    node.wait_ready(Duration::from_secs(180))?;
    node.wait_applied(ends, Duration::from_secs(180))?;
    for (t0, process, ev) in final_reads(rec, node, keys)? {
        rec.record(t0, process, ev);
    }
    Ok(())
}

/// Each node's `pollbox_log_records_total` series, into the history.
fn note_record_counts(cluster: &Cluster, rec: &Recorder) {
    for n in &cluster.nodes {
        if let Ok(m) = n.metrics() {
            for (series, value) in m {
                if series.starts_with("pollbox_log_records_total{") {
                    rec.note(
                        "final",
                        Event::Metric {
                            via: n.name.clone(),
                            name: series,
                            value,
                        },
                    );
                }
            }
        }
    }
}

/// A final read as the history records it: when, by whom, what.
type FinalRead = (u64, &'static str, Event);

/// `GET /v1/boxes/{key}` of every key on a node, as final reads (recorded by
/// the caller once the log is known not to have moved).
fn final_reads(rec: &Recorder, node: &Node, keys: &[String]) -> Result<Vec<FinalRead>, String> {
    let mut cl = Client::new(node.addr);
    let mut out = Vec::new();
    for key in keys {
        let t0 = rec.now();
        let r = cl
            .request(
                "GET",
                &format!("/v1/boxes/{key}"),
                &[],
                b"",
                Duration::from_secs(10),
            )
            .map_err(|e| format!("final read of {key} on {}: {e}", node.name))?;
        let (ver, payload) = match r.status {
            200 => (
                r.header("etag")
                    .and_then(|e| e.trim().trim_matches('"').parse().ok())
                    .unwrap_or(0),
                Some(r.text()),
            ),
            404 => (0, None),
            s => return Err(format!("final read of {key} on {}: status {s}", node.name)),
        };
        out.push((
            t0,
            "final",
            Event::Read {
                via: node.name.clone(),
                run: None,
                session: 0,
                mover: false,
                mode: ReadMode::Final,
                key: key.clone(),
                after: None,
                ver,
                payload,
            },
        ));
    }
    Ok(out)
}
