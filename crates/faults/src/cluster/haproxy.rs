//! HAProxy in front of nodes a and b, with the repository's own replicas
//! config (`deploy/haproxy/haproxy-replicas.cfg.tmpl`: least connections,
//! `/readyz` health checks, a POST never retried once sent), in the suite's
//! namespace on a free loopback port.

use super::process::Proc;
use crate::http::Client;
use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Haproxy {
    pub addr: SocketAddr,
    proc: Option<Proc>,
}

impl Haproxy {
    pub fn start(repo: &Path, dir: &Path, nodes: [SocketAddr; 2]) -> Result<Haproxy, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let cfg = repo.join("deploy/haproxy/haproxy-replicas.cfg.tmpl");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("haproxy.log"))
            .map_err(|e| e.to_string())?;
        let mut c = Command::new("haproxy");
        c.arg("-db")
            .arg("-f")
            .arg(&cfg)
            .env("FRONT_PORT", port.to_string())
            .env("NODE1", nodes[0].to_string())
            .env("NODE2", nodes[1].to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let mut proc = Proc::start("haproxy", c).map_err(|e| format!("haproxy: {e}"))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut cl = Client::new(addr);
            if matches!(cl.request("GET", "/lb-healthz", &[], b"", Duration::from_secs(1)), Ok(r) if r.status == 200)
            {
                break;
            }
            if !proc.alive() || Instant::now() > deadline {
                return Err(format!(
                    "haproxy did not start; see {}",
                    dir.join("haproxy.log").display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Haproxy {
            addr,
            proc: Some(proc),
        })
    }

    pub fn stop(&mut self) {
        if let Some(p) = self.proc.take() {
            p.terminate(Duration::from_secs(5));
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        self.stop();
    }
}
