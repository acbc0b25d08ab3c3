//! The files `[auth]` names that are read again while serving
//! (docs/private-boxes.md#key-rotation): the key set `auth.jwt.keys_file` and
//! each `[[auth.token]]`'s `token_file`.
//!
//! They are read again on SIGHUP ([`crate::Server::reload_auth`]) and when one
//! of them changes: a thread stats each of them once a second and compares its
//! modification time, size, inode and device with the last read's. A stat a
//! second per file costs nothing, sees a file replaced by a rename (what an
//! editor, `mv`, and Kubernetes' symlink swap of a mounted Secret do) and a
//! file written in place, and needs no inotify watch on directories that
//! may be replaced whole; a change is seen within about a second.
//!
//! A read is all or nothing: every file is read and checked as at start
//! (`Config::add_jwks`, `Config::add_static_token`), then the new
//! [`Access`] replaces the node's ([`pollbox_core::auth::LiveAccess`]), and
//! each worker takes it at its next tick. A file that cannot be read, does
//! not parse, or holds no key or no token leaves the access in use as it is:
//! an error line names the file and why, and
//! `pollbox_auth_reloads_total{result="error"}` counts it. The file is read
//! again when it changes again (or on SIGHUP), not every second.
//!
//! What it is not: the rules. Whether a token is valid is
//! [`pollbox_core::auth`]'s.

use pollbox_core::auth::Access;
use pollbox_core::config::{Config, ConfigError};
use pollbox_core::service::Node;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the reloading thread stats the files.
pub(crate) const WATCH_EVERY: Duration = Duration::from_secs(1);

/// What a file looked like when it was last read (`None`: it could not be
/// stat'ed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    mtime_ns: i128,
    size: u64,
    ino: u64,
    dev: u64,
}

fn stamp(path: &str) -> Option<Stamp> {
    // Follows symlinks: a Secret's file is a link into a directory that is
    // replaced whole, and the target is what changes.
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        size: m.size(),
        ino: m.ino(),
        dev: m.dev(),
    })
}

/// The files, the stamps of their last read, and the reads counted.
pub(crate) struct AuthFiles {
    /// Each file, with the config key that names it.
    files: Vec<(String, String)>,
    /// One per file, as of the last read; held while a read runs, so two
    /// reads (a SIGHUP and a change) never interleave.
    stamps: Mutex<Vec<Option<Stamp>>>,
    pub reloads_ok: AtomicU64,
    pub reloads_failed: AtomicU64,
}

impl AuthFiles {
    /// The files `config` names, as read at start.
    pub(crate) fn new(config: &Config) -> AuthFiles {
        let mut files = Vec::new();
        if !config.auth.jwt.keys_file.is_empty() {
            files.push((
                "auth.jwt.keys_file".to_string(),
                config.auth.jwt.keys_file.clone(),
            ));
        }
        for (i, t) in config.auth.token.iter().enumerate() {
            if !t.token_file.is_empty() {
                files.push((format!("auth.token[{i}].token_file"), t.token_file.clone()));
            }
        }
        // Stamped now, just after start read them: a change from here on is
        // read again.
        let stamps = files.iter().map(|(_, p)| stamp(p)).collect();
        AuthFiles {
            files,
            stamps: Mutex::new(stamps),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        }
    }

    /// Whether the config names any such file.
    pub(crate) fn any(&self) -> bool {
        !self.files.is_empty()
    }

    /// Whether a file changed since its last read.
    fn changed(&self) -> bool {
        let stamps = match self.stamps.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        self.files
            .iter()
            .zip(stamps.iter())
            .any(|((_, path), was)| stamp(path) != *was)
    }
}

/// Read every file of `files` again and install what they hold as `node`'s
/// access (`why`: what asked, for the log line). On any failure the access in
/// use stays. Returns the new generation, or why nothing changed.
pub(crate) fn reload(node: &Node, files: &AuthFiles, why: &str) -> Result<u64, String> {
    if !files.any() {
        eprintln!("pollbox: {why}: no auth file to read again (auth.jwt.keys_file, auth.token[].token_file)");
        return Err("no auth file configured".into());
    }
    let mut stamps = match files.stamps.lock() {
        Ok(s) => s,
        Err(p) => p.into_inner(),
    };
    // Stamped before the read: a write that lands during it is seen as a
    // change at the next look, and read then.
    for (s, (_, path)) in stamps.iter_mut().zip(&files.files) {
        *s = stamp(path);
    }
    match read(&node.config) {
        Ok(access) => {
            let (keys, statics) = (access.keys(), access.static_tokens());
            let generation = node.access.replace(access);
            files.reloads_ok.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "pollbox: {why}: auth files read again: {keys} keys, {statics} static tokens (generation {generation})"
            );
            Ok(generation)
        }
        Err(e) => {
            files.reloads_failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("pollbox: {why}: auth files not read again, the keys and tokens in use are kept: {e}");
            Err(e)
        }
    }
}

/// The files `config` names, read and checked as at start, as a new access.
fn read(config: &Config) -> Result<Access, String> {
    let said = |e: ConfigError| match e {
        ConfigError::Invalid { key, reason } => format!("{key}: {reason}"),
        other => other.to_string(),
    };
    let mut config = config.clone();
    if !config.auth.jwt.keys_file.is_empty() {
        let f = config.auth.jwt.keys_file.clone();
        let text = std::fs::read_to_string(&f)
            .map_err(|e| format!("auth.jwt.keys_file: cannot read {f}: {e}"))?;
        config.add_jwks(&text, &f).map_err(said)?;
    }
    for i in 0..config.auth.token.len() {
        let f = config.auth.token[i].token_file.clone();
        if f.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(&f)
            .map_err(|e| format!("auth.token[{i}].token_file: cannot read {f}: {e}"))?;
        config.add_static_token(i, &text, &f).map_err(said)?;
    }
    Access::new(&config.auth).map_err(|e| format!("auth.jwt.keys_file: {e}"))
}

/// The thread that reads the files again when they change.
pub(crate) struct Reloader {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

impl Reloader {
    /// Start watching `files`, if the config names any, installing what they
    /// hold as `node`'s access.
    pub(crate) fn spawn(
        node: Arc<Node>,
        files: Arc<AuthFiles>,
    ) -> std::io::Result<Option<Reloader>> {
        if !files.any() {
            return Ok(None);
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pollbox-auth".into())
            .spawn(move || {
                crate::thread_priority::lower_priority("auth file reloader");
                watch(&node, &files, &stopped);
            })?;
        Ok(Some(Reloader { stop, thread }))
    }

    pub(crate) fn stop(self) {
        let (lock, cv) = &*self.stop;
        if let Ok(mut stop) = lock.lock() {
            *stop = true;
        }
        cv.notify_all();
        let _ = self.thread.join();
    }
}

fn watch(node: &Node, files: &AuthFiles, stop: &(Mutex<bool>, Condvar)) {
    let (lock, cv) = stop;
    let Ok(mut stopped) = lock.lock() else {
        return;
    };
    loop {
        stopped = match cv.wait_timeout_while(stopped, WATCH_EVERY, |s| !*s) {
            Ok((s, _)) => s,
            Err(_) => return,
        };
        if *stopped {
            return;
        }
        if files.changed() {
            let _ = reload(node, files, "an auth file changed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_changes_with_a_write_in_place_and_with_a_rename_over() {
        let dir = std::env::temp_dir().join(format!("pollbox-stamp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t");
        let p = f.to_str().unwrap();
        assert_eq!(stamp(p), None);
        std::fs::write(&f, "one").unwrap();
        let a = stamp(p).unwrap();
        assert_eq!(stamp(p), Some(a));
        std::fs::write(&f, "two!").unwrap();
        let b = stamp(p).unwrap();
        assert_ne!(a, b, "size");
        let g = dir.join("t.new");
        std::fs::write(&g, "two!").unwrap();
        std::fs::rename(&g, &f).unwrap();
        assert_ne!(stamp(p), Some(b), "inode");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
