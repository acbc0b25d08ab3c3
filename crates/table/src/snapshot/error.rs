//! Why a snapshot was not loaded: one [`SnapshotError`] for each way a file
//! can be damaged or not fit, each saying what is wrong with the file.
//!
//! What it is not: the checks themselves (`read`), or a write's failure,
//! which is the writer's `io::Error`.

use std::io;

use super::format::{FORMAT_VERSION, FORMAT_WITHOUT_LIFECYCLE};
use crate::boxes::RestoreError;

/// Why a snapshot was not loaded. Each says what is wrong with the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("not a pollbox snapshot (bad magic bytes)")]
    BadMagic,
    #[error("snapshot format version {found} is not supported (this build reads versions {FORMAT_WITHOUT_LIFECYCLE} to {FORMAT_VERSION})")]
    UnsupportedVersion { found: u32 },
    #[error("snapshot is truncated (it ends at byte {offset})")]
    Truncated { offset: u64 },
    #[error("snapshot checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupted")]
    ChecksumMismatch { stored: u32, computed: u32 },
    #[error("snapshot is corrupted at byte {offset}: {what}")]
    Corrupt { offset: u64, what: &'static str },
    #[error(
        "snapshot was written with a different field layout: snapshot has [{snapshot}], \
         config has [{config}]; restore the old [[boxes.field]] list or move the snapshot away"
    )]
    LayoutMismatch { snapshot: String, config: String },
    #[error("snapshot box {key:?} does not fit the current config: {reason}")]
    BoxRefused { key: String, reason: RestoreError },
    #[error("snapshot file does not belong where it lies: {0}")]
    OutOfChain(String),
}
