//! Why a server did not start: the error of [`crate::Server::start`] and
//! [`crate::Server::check`].
//!
//! What it is not: an error of a running server (a worker's I/O error ends
//! that worker; a request's errors are answers).

use std::io;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid config: {0}")]
    Config(#[from] pollbox_core::config::ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
    #[error("snapshot {path}: {reason}")]
    Snapshot { path: String, reason: String },
    #[error("write-ahead file {path}: {reason}")]
    Wal { path: String, reason: String },
    #[error("log: {0}")]
    Log(String),
    #[error("{0}")]
    Io(#[from] io::Error),
}
