//! Snapshot files: the file I/O around the core's snapshot format
//! (`pollbox_core::snapshot`, which only reads and writes byte streams).
//!
//! This module owns the atomic save (temp file, fsync, rename, fsync the
//! directory), the load at start, the start-up check that the directory is
//! writable, and the thread that writes a snapshot every `interval_s`.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use pollbox_core::boxes::BoxTable;
use pollbox_core::log::Position;
use pollbox_core::plan::Plan;
use pollbox_core::snapshot::{read_snapshot_at, write_snapshot_at, SnapshotError};

use crate::{Shared, StartError};

/// Write `table` to `path` at `now_ms` (the table's clock, which box expiry
/// counts on), with the log `position` it reflects at least (taken before
/// this call), so that a crash leaves either the old or the new snapshot, never
/// a mix: write `path.tmp`, fsync it, rename it over `path`, fsync the
/// directory. On error the temp file is removed.
pub fn save_atomic(
    table: &BoxTable,
    now_ms: u64,
    position: Option<&Position>,
    path: &Path,
) -> io::Result<()> {
    let tmp = tmp_path(path);
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 16, file);
        write_snapshot_at(table, now_ms, position, &mut w)?;
        let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        File::open(parent_dir(path))?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `path` with `.tmp` appended (`boxes.snap` → `boxes.snap.tmp`).
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// A table loaded from a snapshot, and the log position it holds (none: a
/// standalone node's).
pub type Loaded = (BoxTable, Option<Position>);

/// Load the snapshot at `path` at `now_ms` (the table's clock): `Ok(None)`
/// when there is no file (first start), an error for anything else that keeps
/// it from loading whole.
pub fn load(plan: Arc<Plan>, now_ms: u64, path: &Path) -> Result<Option<Loaded>, SnapshotError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut r = BufReader::with_capacity(1 << 16, file);
    read_snapshot_at(plan, now_ms, &mut r).map(Some)
}

/// The directory `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Refuse to start when the snapshot cannot be written later.
pub(crate) fn check_dir(path: &Path) -> Result<(), StartError> {
    let dir = parent_dir(path);
    let probe = dir.join(format!(".pollbox-write-test-{}", std::process::id()));
    match File::create(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(StartError::Snapshot {
            path: path.display().to_string(),
            reason: format!("directory {} is not writable: {e}", dir.display()),
        }),
    }
}

/// The snapshot thread: save every `snapshot.interval_s` until `stop` is set
/// (the final snapshot is [`crate::Server::shutdown`]'s).
pub(crate) fn writer_loop(shared: Arc<Shared>, stop: Arc<(Mutex<bool>, Condvar)>, path: PathBuf) {
    lower_priority();
    let every = Duration::from_secs(shared.node.config.snapshot.interval_s);
    let (lock, cv) = &*stop;
    let Ok(mut stopped) = lock.lock() else {
        return;
    };
    // `stop` may have been set before this thread first took the lock (a
    // quick shutdown on a busy machine): check before every wait, or the
    // notification is lost and shutdown waits a whole interval to join.
    while !*stopped {
        let (guard, _) = match cv.wait_timeout(stopped, every) {
            Ok(r) => r,
            Err(_) => return,
        };
        stopped = guard;
        if *stopped {
            return;
        }
        // The position first: the walk then sees every record before it.
        let position = shared.log.as_ref().and_then(|l| l.position());
        match save_atomic(
            &shared.node.boxes,
            shared.table_now_ms(),
            position.as_ref(),
            &path,
        ) {
            Ok(()) => {
                shared.snapshots_ok.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.snapshots_failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("pollbox: snapshot to {} failed: {e}", path.display());
            }
        }
    }
}

/// The snapshot thread runs at nice 19: on a core it shares with a worker, it
/// gets what the worker leaves. (Not SCHED_IDLE: the walk holds a shard's read
/// lock for a few copies at a time, and a thread that may never be scheduled
/// again while holding it would stall every box creation in that shard.)
fn lower_priority() {
    crate::lower_priority("snapshot");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_thread_runs_at_nice_19() {
        let nice = std::thread::spawn(|| {
            lower_priority();
            // SAFETY: as in lower_priority; getpriority only reads.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
        assert_eq!(nice, 19);
        // SAFETY: as above.
        let mine = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        assert_ne!(mine, 19, "only the snapshot thread");
    }
    use pollbox_core::plan::Value;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "pollbox-snapshot-{name}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    /// `boxes` boxes of the default plan, every field set on some.
    fn sample(boxes: usize) -> BoxTable {
        let t = BoxTable::new(Arc::new(Plan::default_plan()));
        for k in 0..boxes as i64 {
            let by = format!("p-{k}");
            let values = [
                Some(Value::I64(k)),
                Some(Value::I64(-k)),
                None,
                (k % 2 == 0).then_some(Value::Str(&by)),
            ];
            t.apply(&format!("box-{k}"), &values, 0, None)
                .expect("applies");
        }
        t
    }

    /// Every box of `a` is in `b` with the same version and payload, and
    /// nothing else is.
    fn assert_same_boxes(a: &BoxTable, b: &BoxTable) {
        assert_eq!(a.len(), b.len());
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        a.for_each(0, |key, version, _, _| {
            pa.clear();
            pb.clear();
            assert_eq!(a.poll(key.as_bytes(), &mut pa), Some(version));
            assert_eq!(b.poll(key.as_bytes(), &mut pb), Some(version), "{key}");
            assert_eq!(pa, pb, "{key}");
        });
    }

    #[test]
    fn save_atomic_then_load() {
        let dir = scratch_dir("save");
        let path = dir.join("boxes.snap");
        let plan = || Arc::new(Plan::default_plan());
        assert!(load(plan(), 0, &path).expect("no file is fine").is_none());
        let position = Position {
            topic: "t".into(),
            next: [(0, 9)].into_iter().collect(),
        };
        let t = sample(20);
        save_atomic(&t, 0, Some(&position), &path).expect("saves");
        assert!(!tmp_path(&path).exists(), "temp file renamed away");
        let (back, read) = load(plan(), 0, &path).expect("loads").expect("file exists");
        assert_eq!(read, Some(position));
        assert_same_boxes(&t, &back);
        // Saving again replaces the file whole.
        t.apply("new", &[], 0, None).expect("ok");
        save_atomic(&t, 0, None, &path).expect("saves");
        let (back, _) = load(plan(), 0, &path).expect("loads").expect("exists");
        assert_eq!(back.len(), t.len());
        // A damaged file is an error, not an empty start.
        let mut bytes = fs::read(&path).expect("read");
        bytes.truncate(bytes.len() / 2);
        fs::write(&path, bytes).expect("write");
        assert!(matches!(
            load(plan(), 0, &path),
            Err(SnapshotError::Truncated { .. })
        ));
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn save_atomic_into_a_missing_directory_fails_cleanly() {
        let dir = scratch_dir("missing");
        let path = dir.join("no/such/dir/boxes.snap");
        let t = sample(1);
        assert!(save_atomic(&t, 0, None, &path).is_err());
        assert!(!tmp_path(&path).exists());
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn unwritable_snapshot_directory_is_refused() {
        let e = check_dir(Path::new("/proc/no-such-dir/x.snap")).unwrap_err();
        assert!(e.to_string().contains("not writable"), "{e}");
        assert!(check_dir(&std::env::temp_dir().join("x.snap")).is_ok());
    }
}
