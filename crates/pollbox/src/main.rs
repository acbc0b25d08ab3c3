//! `pollbox`: the binary. Thin on purpose: argument parsing and wiring of
//! `pollbox-server` (serve), `pollbox-load` (load, demo) and `pollbox-memcheck`.

mod demo;

use clap::{Parser, Subcommand};
use pollbox_core::config::{Config, DEFAULT_TOML};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options compiled in (override at run time with the environment
/// variable `_RJEM_MALLOC_CONF`, e.g. `_RJEM_MALLOC_CONF=narenas:16`):
/// background threads purge dirty pages off the workers' path; dirty pages go
/// back to the kernel over 5 s, straight away (no MADV_FREE "muzzy" stage,
/// which would keep them in RSS until the kernel is short of memory); 8 arenas (≈ cores of a typical node: workers allocate almost
/// nothing on their hot paths, so arenas see little contention; `percpu_arena`
/// would match cores exactly but jemalloc disables it, with a warning, under
/// `taskset`).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8; 70] =
    b"background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0,narenas:8\0";

#[derive(Parser)]
#[command(
    name = "pollbox",
    version,
    about = "Low-latency HTTP/1.1 JSON ingest and polling server"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve (with no flags: the embedded default config on 127.0.0.1:8080).
    Serve {
        /// Config file (TOML, see docs/config.md). Env: POLLBOX_CONFIG.
        #[arg(long, env = "POLLBOX_CONFIG")]
        config: Option<PathBuf>,
        /// Listen address, overrides the config. Env: POLLBOX_LISTEN.
        #[arg(long, env = "POLLBOX_LISTEN")]
        listen: Option<String>,
        /// Worker threads (0 = one per core), overrides the config. Env: POLLBOX_WORKERS.
        #[arg(long, env = "POLLBOX_WORKERS")]
        workers: Option<usize>,
    },
    /// The bundled load generator.
    Load(Box<pollbox_load::LoadArgs>),
    /// Compare accounted memory with jemalloc's and the kernel's view.
    Memcheck {
        /// Base URL of a pollbox (or its metrics listener), e.g. http://127.0.0.1:8080
        #[arg(long)]
        url: String,
        /// Print a row every SECS seconds until interrupted.
        #[arg(long)]
        watch: Option<u64>,
    },
    /// Start a server on a free loopback port, show a poll, a long-poll and an
    /// event stream (with their curl commands), drive 10 s of mixed load, report, stop.
    Demo {
        /// Seconds of load.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
    },
    /// Check a config file as `serve` would before it binds (the values, the
    /// files it names, the listen addresses, the snapshot and its directory)
    /// and print the effective config, secrets redacted.
    CheckConfig {
        file: PathBuf,
        /// Check the file alone, not this machine (for a config meant for
        /// another one: no snapshot directory, token files or names checked).
        #[arg(long)]
        file_only: bool,
    },
    /// Move a stopped standalone node with a write-ahead file into a Kafka
    /// topic (new and empty) without losing a box or a version, and write
    /// the snapshot the cluster's nodes start from (docs/operations.md).
    Migrate {
        /// The standalone node's config (`[wal]` and `[snapshot]`).
        #[arg(long)]
        from: PathBuf,
        /// The cluster's config (`[log]`, and `[snapshot] path`, where the
        /// snapshot is written).
        #[arg(long)]
        to: PathBuf,
    },
}

fn load_config(path: Option<&PathBuf>) -> Result<(Config, String), String> {
    match path {
        None => Config::from_toml(DEFAULT_TOML)
            .map(|c| (c, "embedded default".to_string()))
            .map_err(|e| e.to_string()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            Config::from_toml(&text)
                .map(|c| (c, p.display().to_string()))
                .map_err(|e| format!("{}: {e}", p.display()))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pollbox: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    match cli.cmd {
        Cmd::Serve {
            config,
            listen,
            workers,
        } => {
            let (mut cfg, source) = load_config(config.as_ref())?;
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            if let Some(w) = workers {
                cfg.server.workers = w;
            }
            cfg.validate().map_err(|e| e.to_string())?;
            let signals = pollbox_server::ShutdownSignals::install()?;
            let server = pollbox_server::Server::start(cfg).map_err(|e| e.to_string())?;
            eprintln!(
                "pollbox: listening on http://{} with {} workers, {} on the io_uring loop (config: {source}; boxes loaded: {}{})",
                server.addr(),
                server.workers(),
                server.uring_workers(),
                server.node().boxes.len(),
                server
                    .metrics_addr()
                    .map(|a| format!("; metrics on http://{a}/metrics"))
                    .unwrap_or_default(),
            );
            pollbox_server::serve_until_signal(server, signals)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Load(args) => {
            let report = pollbox_load::run(&args).map_err(|e| e.to_string())?;
            let mut out = std::io::stdout().lock();
            pollbox_load::print_report(&report, &mut out).map_err(|e| e.to_string())?;
            if !report.passed() {
                eprintln!(
                    "pollbox load: error rate {:.4} is over --max-error-rate {}",
                    report.error_rate(),
                    args.max_error_rate
                );
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Memcheck { url, watch } => pollbox_memcheck::run(&url, watch),
        Cmd::Demo { seconds } => demo::run(seconds),
        Cmd::CheckConfig { file, file_only } => {
            let (cfg, _) = load_config(Some(&file))?;
            // What `serve` checks before it binds: the files the config names,
            // the listen address, the snapshot and its directory.
            let cfg = if file_only {
                cfg
            } else {
                pollbox_server::Server::check(cfg)
                    .map_err(|e| format!("{}: {e}", file.display()))?
            };
            if cfg.log.enabled() && !file_only {
                // The log as this node would find it: brokers reached, the
                // topic there and able to keep what it acknowledges.
                let info = pollbox_server::log::topic::check(&cfg.log)
                    .map_err(|e| format!("{}: log: {e}", file.display()))?;
                let found = info.settings.unsafe_settings();
                if found.is_empty() {
                    eprintln!(
                        "# log: topic {} has {} partitions, {}",
                        cfg.log.topic, info.partitions, info.settings
                    );
                } else {
                    let warn = pollbox_server::log::topic::LogProblem::Unsafe {
                        topic: cfg.log.topic.clone(),
                        found,
                    };
                    eprintln!("# log: WARNING (taken: log.allow_unsafe_topic = true): {warn}");
                }
            }
            println!(
                "# {}: valid. Effective configuration (secrets redacted):",
                file.display()
            );
            print!("{}", cfg.redacted().to_toml());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Migrate { from, to } => {
            let (from_cfg, _) = load_config(Some(&from))?;
            let (to_cfg, _) = load_config(Some(&to))?;
            // The files the cluster's config names (its client properties).
            let to_cfg = pollbox_server::Server::check(to_cfg)
                .map_err(|e| format!("{}: {e}", to.display()))?;
            let m = pollbox_server::migrate(&from_cfg, &to_cfg)?;
            eprintln!(
                "pollbox: migrate: {} boxes and {} records of the write-ahead file into {} ({} partitions); versions go on past {}; wrote {} ({}): start every node of the cluster from a copy of it",
                m.boxes,
                m.records,
                to_cfg.log.topic,
                m.partitions,
                m.next_version,
                m.snapshot.display(),
                m.position
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
