//! pollbox nodes of the log (`pollbox serve --config ...`, `[log]` set),
//! each in its namespace, with a snapshot file, on the release binary. A
//! node's **run** counter tells the workload which process answered: it is
//! odd while a node is being killed and restarted, so a request that began
//! and ended under one even value was served by one run.

use super::net::{Lan, Net};
use super::process::Proc;
use crate::http::Client;
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The nodes' `[presence]` settings for the run (written into their
/// configs, and what the checker waits and allows for).
pub const LEASE_MS: u64 = 2_000;
pub const LEAVE_GRACE_MS: u64 = 300;

pub const HTTP_PORT: u16 = 8080;

/// The run counter of a node, shared with the workload.
#[derive(Clone, Default)]
pub struct Runs(Arc<AtomicU32>);

impl Runs {
    pub fn read(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }

    /// The run that served a request, given the counter before and after it.
    pub fn served(before: u32, after: u32) -> Option<u32> {
        (before == after && before.is_multiple_of(2)).then_some(before / 2)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    pub dir: PathBuf,
    config: PathBuf,
    binary: PathBuf,
    pub runs: Runs,
    proc: Mutex<Option<Proc>>,
}

impl Node {
    pub fn octet(name: &str) -> u8 {
        match name {
            "a" => 21,
            "b" => 22,
            _ => 23,
        }
    }

    /// Write a node's config (`[log]` on `bootstrap`, `topic`; a snapshot
    /// every second) under `dir`.
    pub fn new(
        net: &Net,
        name: &str,
        binary: &Path,
        dir: &Path,
        bootstrap: &str,
        topic: &str,
    ) -> Result<Node, String> {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let ip = net.addr(Self::octet(name), Lan::Http);
        let config = dir.join("pollbox.toml");
        std::fs::write(
            &config,
            format!(
                "# written by pollbox-faults\n\
                 [server]\nlisten = \"{ip}:{HTTP_PORT}\"\nworkers = 2\n\
                 trusted_proxies = [\"{proxy}/32\"]\n\n\
                 [http]\nsse_heartbeat_ms = 1000\n\n\
                 [snapshot]\npath = \"{snap}\"\ninterval_s = 1\n\n\
                 [log]\nbrokers = \"{bootstrap}\"\ntopic = \"{topic}\"\nack_timeout_ms = 5000\n\n\
                 [presence]\nnode = \"{name}\"\nlease_ms = {lease}\nleave_grace_ms = {grace}\n\
                 {client}",
                // Short, so that a run sees leases lapse; the node's name
                // is its slot's, so a restart clears its members at once.
                lease = LEASE_MS,
                grace = LEAVE_GRACE_MS,
                snap = dir.join("boxes.snap").display(),
                // A client setting to judge under faults (e.g. a consumer's
                // fetch wait), as `[log.client]` lines.
                client = std::env::var("FAULTS_LOG_CLIENT")
                    .map(|c| format!("\n[log.client]\n{c}\n"))
                    .unwrap_or_default(),
                // HAProxy (deploy/'s replicas config) runs in the root
                // namespace and sends a PROXY v2 header.
                proxy = net.root_addr(Lan::Http),
            ),
        )
        .map_err(|e| e.to_string())?;
        Ok(Node {
            name: name.to_string(),
            addr: SocketAddr::from((ip, HTTP_PORT)),
            dir,
            config,
            binary: binary.to_path_buf(),
            runs: Runs::default(),
            proc: Mutex::new(None),
        })
    }

    /// Start the node's process (from its snapshot, if it wrote one).
    pub fn start(&self, net: &Net) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("node.log"))
            .map_err(|e| e.to_string())?;
        let mut c = net.command(&self.name, &self.binary.to_string_lossy());
        c.arg("serve")
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let p = Proc::start(&self.name, c).map_err(|e| format!("start node {}: {e}", self.name))?;
        *self.proc.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        Ok(())
    }

    /// kill -9 the node: its run counter is odd from before the signal
    /// until it is reaped.
    pub fn kill(&self) {
        let p = self.proc.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            self.runs.bump();
            p.kill9();
            self.runs.bump();
        }
    }

    /// SIGSTOP / SIGCONT.
    pub fn signal(&self, sig: i32) -> Result<(), String> {
        match self.proc.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(p) => p.signal(sig).map_err(|e| e.to_string()),
            None => Err(format!("node {} is not running", self.name)),
        }
    }

    pub fn running(&self) -> bool {
        self.proc
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|p| p.alive())
    }

    /// SIGTERM (a snapshot is written), SIGKILL after 10 s.
    pub fn stop(&self) {
        let p = self.proc.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = p {
            self.runs.bump();
            p.terminate(Duration::from_secs(10));
            self.runs.bump();
        }
    }

    /// `GET /readyz` answers 200.
    pub fn ready(&self) -> bool {
        let mut c = Client::new(self.addr);
        matches!(c.request("GET", "/readyz", &[], b"", Duration::from_secs(2)), Ok(r) if r.status == 200)
    }

    pub fn wait_ready(&self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.ready() {
                return Ok(());
            }
            if !self.running() {
                return Err(format!(
                    "node {} exited; see {}",
                    self.name,
                    self.dir.join("node.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("node {} not ready after {timeout:?}", self.name))
    }

    /// The node's metrics: each series (name with its labels, as exposed)
    /// and its value.
    pub fn metrics(&self) -> Result<HashMap<String, f64>, String> {
        let mut c = Client::new(self.addr);
        let r = c
            .request("GET", "/metrics", &[], b"", Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("/metrics: {}", r.status));
        }
        Ok(r.text()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect())
    }

    /// Wait until the node applied every partition up to `ends`
    /// (`pollbox_log_next_offset{partition}`).
    pub fn wait_applied(&self, ends: &[i64], timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.metrics() {
                Ok(m) => {
                    let at: Vec<i64> = (0..ends.len())
                        .map(|p| {
                            m.get(&format!("pollbox_log_next_offset{{partition=\"{p}\"}}"))
                                .map_or(-1, |v| *v as i64)
                        })
                        .collect();
                    if at.iter().zip(ends).all(|(a, e)| a >= e) {
                        return Ok(());
                    }
                    last = format!("at {at:?}, log ends {ends:?}");
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(format!("node {} did not catch up: {last}", self.name))
    }
}
