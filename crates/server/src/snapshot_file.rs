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
use pollbox_core::snapshot::{read_snapshot_into, write_snapshot_at, SnapshotError, Versions};

use crate::{Shared, StartError};

/// Write `table` to `path` at `now_ms` (the table's clock, which box expiry
/// counts on), with the log `position` it reflects at least (taken before
/// this call), so that a crash leaves either the old or the new snapshot, never
/// a mix: write `path.tmp`, fsync it, rename it over `path`, fsync the
/// directory. On error the temp file is removed. Returns the snapshot's
/// checksum.
pub fn save_atomic(
    table: &BoxTable,
    now_ms: u64,
    position: Option<&Position>,
    path: &Path,
) -> io::Result<u32> {
    write_atomic(path, |w| write_snapshot_at(table, now_ms, position, w))
}

/// Write `path` through `write` as [`save_atomic`] does (temp file, fsync,
/// rename, fsync the directory).
fn write_atomic<T>(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<T>,
) -> io::Result<T> {
    let tmp = suffixed(path, ".tmp");
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 16, file);
        let done = write(&mut w)?;
        let file = w.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        File::open(parent_dir(path))?.sync_all()?;
        Ok(done)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `path` with `.tmp` appended (`boxes.snap` → `boxes.snap.tmp`).
pub fn tmp_path(path: &Path) -> PathBuf {
    suffixed(path, ".tmp")
}

/// `path` with `.sealed` appended: the seal of the snapshot at `path`.
pub fn seal_path(path: &Path) -> PathBuf {
    suffixed(path, ".sealed")
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

const SEAL_HEAD: &str = "pollbox snapshot seal, crc32 ";

/// Seal the snapshot at `path` whose checksum is `crc`, written once every
/// worker had stopped: nothing was served past its versions, so the next start
/// keeps them (and the ETags clients hold stay true). Written atomically.
pub fn seal(path: &Path, crc: u32) -> io::Result<()> {
    write_atomic(&seal_path(path), |w| {
        io::Write::write_all(w, format!("{SEAL_HEAD}{crc:08x}\n").as_bytes())
    })
}

/// Remove the seal of the snapshot at `path`, if any, durably (before
/// anything is served: a crash from then on must find the snapshot unsealed).
pub fn unseal(path: &Path) -> io::Result<()> {
    match fs::remove_file(seal_path(path)) {
        Ok(()) => File::open(parent_dir(path))?.sync_all(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The checksum the seal of the snapshot at `path` names, if it has one (a
/// seal that cannot be read or parsed counts as none: the versions are then
/// re-stamped, which is always safe).
fn sealed_crc(path: &Path) -> Option<u32> {
    let text = fs::read_to_string(seal_path(path)).ok()?;
    u32::from_str_radix(text.strip_prefix(SEAL_HEAD)?.trim_end(), 16).ok()
}

/// A table loaded from a snapshot, and the log position it holds (none: a
/// standalone node's).
pub type Loaded = (BoxTable, Option<Position>);

/// Load the snapshot at `path` into a table from `new_table` (empty, with
/// the clock the server gives new versions) at `now_ms` (the table's clock):
/// `Ok(None)` when there is no file (first start), an error for anything else
/// that keeps it from loading whole. A table with a version clock (a
/// standalone node) keeps the snapshot's versions only when its seal names
/// it; otherwise they are re-stamped past the clock
/// (docs/boxes.md#versions-and-etags). A node of a log keeps them: they are
/// log positions.
pub fn load(
    new_table: impl Fn() -> BoxTable,
    now_ms: u64,
    path: &Path,
) -> Result<Option<Loaded>, SnapshotError> {
    let table = new_table();
    let clocked = table.version_clock() != 0;
    let sealed = sealed_crc(path).filter(|_| clocked);
    let versions = match clocked && sealed.is_none() {
        true => Versions::Restamp,
        false => Versions::Keep,
    };
    let Some(mut r) = open(path)? else {
        return Ok(None);
    };
    let mut restored = read_snapshot_into(table, now_ms, versions, &mut r)?;
    if sealed.is_some_and(|crc| crc != restored.crc) {
        // The seal of another snapshot (the file was replaced by hand since):
        // read it again, re-stamped.
        let Some(mut r) = open(path)? else {
            return Ok(None);
        };
        restored = read_snapshot_into(new_table(), now_ms, Versions::Restamp, &mut r)?;
    }
    Ok(Some((restored.table, restored.position)))
}

fn open(path: &Path) -> Result<Option<BufReader<File>>, SnapshotError> {
    match File::open(path) {
        Ok(f) => Ok(Some(BufReader::with_capacity(1 << 16, f))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
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
            Ok(_) => {
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
    use pollbox_core::plan::Plan;

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
        let plan = || BoxTable::new(Arc::new(Plan::default_plan()));
        assert!(load(plan, 0, &path).expect("no file is fine").is_none());
        let position = Position {
            topic: "t".into(),
            next: [(0, 9)].into_iter().collect(),
        };
        let t = sample(20);
        save_atomic(&t, 0, Some(&position), &path).expect("saves");
        assert!(!tmp_path(&path).exists(), "temp file renamed away");
        let (back, read) = load(plan, 0, &path).expect("loads").expect("file exists");
        assert_eq!(read, Some(position));
        assert_same_boxes(&t, &back);
        // Saving again replaces the file whole.
        t.apply("new", &[], 0, None).expect("ok");
        save_atomic(&t, 0, None, &path).expect("saves");
        let (back, _) = load(plan, 0, &path).expect("loads").expect("exists");
        assert_eq!(back.len(), t.len());
        // A damaged file is an error, not an empty start.
        let mut bytes = fs::read(&path).expect("read");
        bytes.truncate(bytes.len() / 2);
        fs::write(&path, bytes).expect("write");
        assert!(matches!(
            load(plan, 0, &path),
            Err(SnapshotError::Truncated { .. })
        ));
        fs::remove_dir_all(&dir).expect("cleanup");
    }

    fn clock() -> u64 {
        1_000_000
    }

    #[test]
    fn a_clocked_table_keeps_versions_only_of_the_snapshot_its_seal_names() {
        let dir = scratch_dir("seal");
        let path = dir.join("boxes.snap");
        let clocked = || BoxTable::with_version_clock(Arc::new(Plan::default_plan()), clock);
        let version = |t: &BoxTable| t.version(b"box-0").expect("restored");
        let t = sample(3);
        let before = version(&t);
        assert!(before < clock());
        let crc = save_atomic(&t, 0, None, &path).expect("saves");

        // Unsealed (a crash, or a periodic snapshot): past the clock.
        let (back, _) = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&back), clock() + 1);
        // A table without a clock (a node of a log): as written.
        let plain = || BoxTable::new(Arc::new(Plan::default_plan()));
        let (back, _) = load(plain, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&back), before);

        // Sealed at a graceful stop: as written.
        seal(&path, crc).expect("seals");
        assert!(!tmp_path(&seal_path(&path)).exists());
        let (back, _) = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&back), before);
        // The seal of another snapshot does not count.
        seal(&path, crc ^ 1).expect("seals");
        let (back, _) = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&back), clock() + 1);

        // Unsealed at start: the next load re-stamps again.
        seal(&path, crc).expect("seals");
        unseal(&path).expect("unseals");
        assert!(!seal_path(&path).exists());
        unseal(&path).expect("no seal is fine");
        let (back, _) = load(clocked, 0, &path).expect("loads").expect("exists");
        assert_eq!(version(&back), clock() + 1);
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
