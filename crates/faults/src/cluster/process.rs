//! The suite's child processes (brokers, nodes, HAProxy, Kafka's tools):
//! started from one thread that lives as long as the suite, each with
//! `PR_SET_PDEATHSIG` = SIGKILL, so that none outlives a suite that dies
//! (the signal fires when the thread that forked exits, hence the one
//! thread). Signals go to a child by its pid, never by name.

use std::io;
use std::process::{Child, Command};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

type Request = (Command, Sender<io::Result<Child>>);

fn spawner() -> &'static Mutex<Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = channel::<Request>();
        std::thread::Builder::new()
            .name("spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawner thread");
        Mutex::new(tx)
    })
}

/// Start `cmd` as a child that dies with the suite.
pub fn spawn(mut cmd: Command) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl(2), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = channel();
    spawner()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, tx))
        .map_err(|_| io::Error::other("spawner gone"))?;
    rx.recv().map_err(|_| io::Error::other("spawner gone"))?
}

/// A running child.
pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    pub fn start(name: &str, cmd: Command) -> io::Result<Proc> {
        Ok(Proc {
            name: name.to_string(),
            child: spawn(cmd)?,
        })
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Send a signal to this child (by pid).
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: kill(2) with a pid of our own unreaped child: the pid
        // cannot have been reused while we hold the Child.
        if unsafe { libc::kill(self.pid(), sig) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL and reap.
    pub fn kill9(mut self) {
        let _ = self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, SIGKILL after `grace`, and reap.
    pub fn terminate(mut self, grace: Duration) {
        let _ = self.signal(libc::SIGCONT);
        let _ = self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run a command to its end, its output captured; an error names it and
/// carries its output's tail.
pub fn run(what: &str, cmd: Command) -> Result<String, String> {
    let child = spawn_captured(cmd).map_err(|e| format!("{what}: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{what}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        let tail: Vec<&str> = text.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("{what}: {}\n{}", out.status, tail.join("\n")))
    }
}

fn spawn_captured(mut cmd: Command) -> io::Result<Child> {
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(cmd)
}
