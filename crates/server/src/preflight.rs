//! What a start checks and loads before it binds: the config and the files it
//! names, the listen addresses, the compiled plan, the snapshot (and, on a node
//! of a log, that its position belongs to the topic read).
//!
//! What it is not: the start itself (binding, threads: [`crate::Server::start`]),
//! or the snapshot file format ([`crate::snapshot_file`]).

use crate::clock::{wall_ms, wall_us};
use crate::listener::resolve;
use crate::snapshot_file;
use crate::start_error::StartError;
use pollbox_core::boxes::BoxTable;
use pollbox_core::config::Config;
use pollbox_core::plan::Plan;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// What a start needs before it binds: the config with the secrets its files
/// hold, the compiled plan, the boxes and log position of the snapshot, the
/// address to listen on. [`crate::Server::check`] stops here (`check-config`).
pub(crate) struct Preflight {
    pub(crate) config: Config,
    pub(crate) plan: Arc<Plan>,
    pub(crate) boxes: BoxTable,
    pub(crate) position: Option<pollbox_core::log::Position>,
    /// The chain the next snapshot extends (`None`: it starts a base).
    pub(crate) chain: Option<snapshot_file::Chain>,
    pub(crate) snapshot_path: Option<PathBuf>,
    pub(crate) addr: SocketAddr,
    pub(crate) started: Instant,
    /// The write-ahead file as recovery left it (`[wal]` set).
    pub(crate) wal: Option<crate::wal::Wal>,
}

/// Read a file a config names (a token list, client properties).
fn read_named(key: &str, path: &str) -> Result<String, StartError> {
    std::fs::read_to_string(path).map_err(|e| {
        StartError::Config(pollbox_core::config::ConfigError::Invalid {
            key: key.into(),
            reason: format!("cannot read {path}: {e}"),
        })
    })
}

impl Preflight {
    /// `repair`: a start, which cuts a torn tail off the write-ahead file;
    /// `check-config` only reports it.
    pub(crate) fn run(mut config: Config, repair: bool) -> Result<Preflight, StartError> {
        config.validate()?;
        if !config.auth.ingest_tokens_file.is_empty() {
            let f = config.auth.ingest_tokens_file.clone();
            config.add_tokens(false, &read_named("auth.ingest_tokens_file", &f)?, &f)?;
        }
        if !config.auth.metrics_tokens_file.is_empty() {
            let f = config.auth.metrics_tokens_file.clone();
            config.add_tokens(true, &read_named("auth.metrics_tokens_file", &f)?, &f)?;
        }
        if !config.auth.jwt.keys_file.is_empty() {
            let f = config.auth.jwt.keys_file.clone();
            config.add_jwks(&read_named("auth.jwt.keys_file", &f)?, &f)?;
        }
        for i in 0..config.auth.token.len() {
            let f = config.auth.token[i].token_file.clone();
            if !f.is_empty() {
                let key = format!("auth.token[{i}].token_file");
                config.add_static_token(i, &read_named(&key, &f)?, &f)?;
            }
        }
        if !config.log.client_file.is_empty() {
            let f = config.log.client_file.clone();
            config.add_client_properties(&read_named("log.client_file", &f)?, &f)?;
        }
        let addr = resolve(&config.server.listen).map_err(|source| StartError::Listen {
            addr: config.server.listen.clone(),
            source,
        })?;
        if !config.server.metrics_listen.is_empty() {
            resolve(&config.server.metrics_listen).map_err(|source| StartError::Listen {
                addr: config.server.metrics_listen.clone(),
                source,
            })?;
        }
        let started = Instant::now();
        let plan = Arc::new(Plan::compile(&config.boxes)?);
        let snapshot_path =
            (!config.snapshot.path.is_empty()).then(|| PathBuf::from(&config.snapshot.path));
        let logged = config.ingest_waits();
        // A node of a log takes its versions from the log, a node with a
        // write-ahead file from the file; a standalone one starts new boxes
        // past the wall clock (docs/boxes.md#versions-and-etags).
        let new_table = || match logged {
            true => BoxTable::new(plan.clone()),
            false => BoxTable::with_version_clock(plan.clone(), wall_us),
        };
        let (boxes, position, chain) = match &snapshot_path {
            Some(p) => {
                snapshot_file::check_dir(p)?;
                let now_ms = if logged {
                    wall_ms()
                } else {
                    started.elapsed().as_millis() as u64
                };
                match snapshot_file::load(new_table, now_ms, p) {
                    Ok(Some(loaded)) => {
                        if config.log.enabled() {
                            check_position(&config, p, loaded.position.as_ref())?;
                        }
                        (loaded.table, loaded.position, loaded.chain)
                    }
                    Ok(None) => (new_table(), None, None),
                    Err(e) => {
                        return Err(StartError::Snapshot {
                            path: p.display().to_string(),
                            reason: format!(
                                "{e}; refusing to start (move the file away to start empty)"
                            ),
                        })
                    }
                }
            }
            None => (new_table(), None, None),
        };
        let wal = match config.wal.enabled() {
            true => Some(open_wal(&config, &plan, &boxes, position.as_ref(), repair)?),
            false => None,
        };
        Ok(Preflight {
            config,
            plan,
            boxes,
            position,
            chain,
            snapshot_path,
            addr,
            started,
            wal,
        })
    }
}

/// Read the write-ahead file into `boxes` (loaded from the snapshot, which
/// holds `position`): every record past the position applied again.
fn open_wal(
    config: &Config,
    plan: &Arc<Plan>,
    boxes: &BoxTable,
    position: Option<&pollbox_core::log::Position>,
    repair: bool,
) -> Result<crate::wal::Wal, StartError> {
    use crate::wal::WAL_TOPIC;
    let dir = PathBuf::from(&config.wal.path);
    let refuse = |reason: String| StartError::Wal {
        path: dir.display().to_string(),
        reason,
    };
    let from = match position {
        Some(p) if p.topic == WAL_TOPIC => p.next.get(&0).map_or(0, |&n| n.max(0) as u64),
        Some(p) => {
            return Err(refuse(format!(
                "the snapshot {} was written by a node of the log topic {:?}: move it away, \
                 or run this node on the log",
                config.snapshot.path, p.topic
            )))
        }
        None => 0,
    };
    // The file's one lane (docs/boxes.md#watermarks): a new run, so cuts of
    // an earlier process are not honored (listed again).
    let run = crate::clock::wall_us() ^ u64::from(std::process::id()).rotate_left(40);
    boxes.lanes().for_partitions(1, run);
    boxes.lanes().restored(0, from);
    let snapshot_boxes = !boxes.is_empty();
    let r = crate::wal::recover::recover(
        &dir,
        boxes,
        plan,
        config.limits.arena_limit_bytes,
        from,
        repair,
    )
    .map_err(refuse)?;
    if position.is_none() && r.last_seq > 0 && snapshot_boxes {
        return Err(refuse(format!(
            "the snapshot {} holds no write-ahead position (a node without [wal] wrote \
             it), and the directory holds records: they are older than the snapshot. Move \
             the segments away to start from the snapshot",
            config.snapshot.path
        )));
    }
    if let (Some(torn), false) = (&r.torn, repair) {
        eprintln!("pollbox: wal: {torn} (a start cuts it off)");
    }
    if r.replayed > 0 || r.torn.is_some() {
        eprintln!(
            "pollbox: wal: {} records replayed past the snapshot (from {from}), {} it held",
            r.replayed, r.covered
        );
    }
    // Past every version served: the file's records, the snapshot's boxes
    // and the boxes it no longer holds, and the wall clock in microseconds
    // (a directory and a snapshot both started afresh).
    let mut highest = boxes.version_floor().max(r.last_seq);
    boxes.for_each(wall_ms(), |_, v, _, _| highest = highest.max(v));
    let next = (highest + 1).max(from).max(wall_us());
    Ok(crate::wal::Wal::new(
        dir,
        config.wal.segment_bytes,
        r.segments,
        next,
        next,
    ))
}

/// On a node of a log, the snapshot must say where in which topic its boxes
/// stand: a standalone node's snapshot (no position) or another topic's would
/// be completed wrongly by a replay.
fn check_position(
    config: &Config,
    path: &std::path::Path,
    position: Option<&pollbox_core::log::Position>,
) -> Result<(), StartError> {
    let refuse = |reason: String| StartError::Snapshot {
        path: path.display().to_string(),
        reason,
    };
    match position {
        None => Err(refuse(
            "it holds no log position (written by a standalone node): a replay cannot \
             complete it; move it away to build this node from the log, or give it a \
             peer's snapshot"
                .into(),
        )),
        Some(p) if p.topic != config.log.topic => Err(refuse(format!(
            "it was written from topic {:?}, this node reads {:?} (log.topic); move it away",
            p.topic, config.log.topic
        ))),
        Some(_) => Ok(()),
    }
}
